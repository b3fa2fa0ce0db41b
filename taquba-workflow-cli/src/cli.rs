//! The command line: global flags ([`Global`]) and every command, as clap
//! derives. Values are validated here (run ids, durations, limits), so a
//! bad value is a usage error (exit code 2) naming it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use taquba_workflow::RunId;

/// See and steer the runs of a taquba-workflow store (a directory or a
/// bucket prefix) from any process.
///
/// Reads never take the store over: they go through a read-only
/// `taquba::QueueReader`, which sees what the owning process flushed.
/// Changes (cancel, signal, requeue, fork, restart) are sent to the owning process as
/// commands in the store's inbox; `--offline` applies them directly to a
/// store no process owns.
///
/// Exit codes: 0 success, 1 the command failed, 2 usage error.
#[derive(Debug, Parser)]
#[command(name = "taquba-workflow", version, propagate_version = true)]
pub struct Cli {
    /// The global flags.
    #[command(flatten)]
    pub global: Global,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub struct Global {
    /// The store: a directory, `file:///dir` or `s3://bucket/prefix`
    /// (`s3://` needs a build with `--features aws` and takes the
    /// standard AWS_* environment). A cluster's root (a location holding
    /// a `cluster` record) works across every shard.
    #[arg(
        long,
        global = true,
        env = "TAQUBA_WORKFLOW_STORE",
        value_name = "DIR|URL"
    )]
    pub store: Option<String>,
    /// The queue's path inside the store (default: the only top-level
    /// prefix holding a queue; in each shard of a cluster, `db`).
    #[arg(long, global = true, value_name = "PATH")]
    pub db: Option<String>,
    /// The runtime's queue name (default: the only runtime recorded in the
    /// store, else `workflow-steps`).
    #[arg(long, global = true, value_name = "NAME")]
    pub queue: Option<String>,
    /// The runtime's memo prefix (default: the one the runtime recorded,
    /// else `{queue}-memo`).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub memo_prefix: Option<String>,
    /// The output format: `text` (tables and cards), `json` (one
    /// document), `jsonl` (one JSON object per line).
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value_t = Format::Text
    )]
    pub output: Format,
    /// How text output shows times: `relative` ("3m ago") or `iso`
    /// (RFC 3339, UTC).
    #[arg(long, global = true, value_enum, default_value_t = TimeFormat::Relative)]
    pub time_format: TimeFormat,
}

/// The output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tables and key/value cards.
    Text,
    /// One JSON document (an array for listings).
    Json,
    /// One JSON object per line.
    Jsonl,
}

/// How text output shows a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TimeFormat {
    /// Relative to now: `3m 12s ago`, `in 40s`.
    Relative,
    /// RFC 3339 in UTC with milliseconds.
    Iso,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List, inspect and steer runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// List and inspect run groups.
    #[command(subcommand)]
    Groups(GroupsCommand),
    /// The store as a whole.
    #[command(subcommand)]
    Store(StoreCommand),
    /// Commands sent to the owner's inbox.
    #[command(subcommand)]
    Commands(CommandsCommand),
    /// List, inspect, pause and resume schedules.
    #[command(subcommand)]
    Schedules(SchedulesCommand),
    /// Concurrency keys: their active and waiting runs.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Serve a web dashboard of the store: runs, their steps, groups,
    /// dead letters and the store, with cancel, signal and requeue sent
    /// through the inbox. Loopback only unless `--allow-remote`.
    #[cfg(feature = "ui")]
    Ui(UiArgs),
}

/// `ui`.
#[cfg(feature = "ui")]
#[derive(Debug, Args)]
pub struct UiArgs {
    /// The address to serve on: `IP:PORT` or `localhost:PORT` (port 0
    /// picks a free one; the URL is printed). A loopback address unless
    /// `--allow-remote`.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8233", value_parser = parse_listen)]
    pub listen: std::net::SocketAddr,
    /// Serve on an address other machines can reach. Needs a login token
    /// (the environment variable TAQUBA_WORKFLOW_UI_TOKEN, or
    /// --token-file): every request must then carry it, or the session
    /// cookie of a login at /login. Whoever holds it reads every run
    /// (inputs, results, errors, headers) and, unless --read-only, can
    /// cancel, signal and requeue runs.
    #[arg(long)]
    pub allow_remote: bool,
    /// Show no actions and refuse them: a dashboard that only reads.
    #[arg(long)]
    pub read_only: bool,
    /// A file holding the login token (at least 16 visible ASCII
    /// characters; a final newline is ignored), instead of the environment variable
    /// TAQUBA_WORKFLOW_UI_TOKEN. On Unix it must be readable by its owner
    /// only (chmod 600). The token is never taken on the command line.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<std::path::PathBuf>,
}

/// `commands ...`
#[derive(Debug, Subcommand)]
pub enum CommandsCommand {
    /// Where a sent command is: pending in the inbox, applied (with its
    /// answer) or rejected (with the error).
    Describe {
        /// The command id `runs cancel|signal|requeue` printed.
        id: String,
    },
}

/// `runs ...`
#[derive(Debug, Subcommand)]
pub enum RunsCommand {
    /// A table of runs, in run-id order (oldest first for generated ids).
    // `--version` filters by the runs' code version here (`taquba-workflow
    // --version` still prints the tool's).
    #[command(disable_version_flag = true)]
    List(ListArgs),
    /// One run as a key/value card: state, current step, attempts,
    /// schedule, waited signal, last error, headers, times.
    Describe {
        /// The run id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
    },
    /// The run's step history: one line per step attempt.
    Steps {
        /// The run id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
    },
    /// The run's committed result (or error). Exit code 1 when the run
    /// failed or was cancelled.
    Result {
        /// The run id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
        /// Wait until the run terminates.
        #[arg(long)]
        wait: bool,
        /// With `--wait`: give up after this long (`30s`, `5m`; default:
        /// wait without end).
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "wait")]
        timeout: Option<Duration>,
    },
    /// Cancel a run: shows what it will do and asks, unless `--yes`.
    Cancel {
        /// The run id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
        /// Why, recorded with the cancellation.
        #[arg(long)]
        reason: Option<String>,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
        /// How the command reaches the store.
        #[command(flatten)]
        send: SendArgs,
    },
    /// Deliver a signal to the run waiting on KEY (or buffer it for the
    /// next waiter).
    #[command(group(clap::ArgGroup::new("payload").required(true)))]
    Signal {
        /// The signal's correlation key.
        key: String,
        /// The payload as JSON, MessagePack-encoded as
        /// `WorkflowRuntime::signal_value` does.
        #[arg(long, value_name = "JSON", group = "payload")]
        json: Option<String>,
        /// The payload as a JSON file (`-` for stdin).
        #[arg(long, value_name = "FILE", group = "payload")]
        file: Option<PathBuf>,
        /// Send the bytes as given instead of MessagePack-encoding the
        /// JSON (for a hand-written runner reading `Step::signal`).
        #[arg(long)]
        raw: bool,
        /// How the command reaches the store.
        #[command(flatten)]
        send: SendArgs,
    },
    /// Requeue the dead-lettered step of a run, with fresh attempts.
    Requeue {
        /// The run id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
        /// How the command reaches the store.
        #[command(flatten)]
        send: SendArgs,
    },
    /// Start a new run (a new id, linked to this one) from a recorded step
    /// of an ended run, with the payload that step was delivered with; the
    /// steps before it are not run again.
    Fork {
        /// The ended run.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
        /// The step the new run starts from.
        #[arg(long, value_name = "N")]
        from_step: u32,
        #[command(flatten)]
        fork: ForkArgs,
    },
    /// Start an ended run again from step 0 under a new id (the fork from
    /// step 0).
    Restart {
        /// The ended run.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
        #[command(flatten)]
        fork: ForkArgs,
    },
}

/// The options of `runs fork` and `runs restart`.
#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The new run's id (default: the command's id, a ULID). Sending the
    /// same fork again under the same id makes no second run.
    #[arg(long, value_name = "ID", value_parser = parse_run_id)]
    pub run_id: Option<RunId>,
    /// Cancel the run first when it is still active, and wait for it to
    /// end (within --wait-timeout); without it an active run is refused.
    #[arg(long)]
    pub cancel: bool,
    /// How the command reaches the store.
    #[command(flatten)]
    pub send: SendArgs,
}

/// `runs list` filters.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Which runs.
    #[arg(long, value_enum, default_value_t = StatusFilter::Active)]
    pub status: StatusFilter,
    /// Only runs of this workflow (the `#[workflow]` name or job NAME).
    #[arg(long, value_name = "NAME")]
    pub workflow: Option<String>,
    /// Only members of this group.
    #[arg(long, value_name = "ID", value_parser = parse_run_id)]
    pub group: Option<RunId>,
    /// Only runs submitted within this long (`1h`, `30m`, `2d`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// The most runs to show.
    #[arg(long, short = 'n', default_value_t = 50, value_parser = parse_limit)]
    pub limit: usize,
    /// Start after this run id (the page cursor the previous page printed).
    #[arg(long, value_name = "ID", value_parser = parse_run_id)]
    pub after: Option<RunId>,
    /// Only runs submitted on code of this version (`#[workflow(version)]`,
    /// by default its crate's version).
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Only runs that started without this patch (they answer `false` to
    /// `patched(ID)`): with `--status active`, the runs that still need the
    /// patch's old branch; none means the patch can be retired.
    #[arg(long, value_name = "ID")]
    pub lacks_patch: Option<String>,
}

/// `runs list --status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    /// Pending, running or cancelling runs.
    Active,
    /// Runs that ended (succeeded, failed, cancelled).
    Terminated,
    /// Both.
    All,
}

/// How a mutation reaches the store.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Wait until the owning process applied the command and print its
    /// answer.
    #[arg(long)]
    pub wait: bool,
    /// With `--wait`: give up waiting after this long (the command stays
    /// in the inbox).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    pub wait_timeout: Duration,
    /// No process owns the store (a stopped or copied store): open it as
    /// its writer and apply the command directly, after checking that no
    /// process owns it (its heartbeat, its commits, claimed steps' leases,
    /// the runtimes' recorded starts and clean stops). Refused when a check
    /// says an owner may be alive.
    #[arg(long, conflicts_with = "wait")]
    pub offline: bool,
    /// With `--offline`: open the store even when a check refused. A
    /// process that still owns it is fenced (it stops with "detected newer
    /// DB client") and its running steps run again.
    #[arg(long, requires = "offline")]
    pub force: bool,
}

/// `schedules ...`
#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// A table of the store's schedules: timer, state, next tick, last run.
    List,
    /// One schedule as a key/value card: timer and zone, catch-up policy,
    /// next tick in UTC and in its zone, last tick and run.
    Describe {
        /// The schedule's name.
        name: String,
    },
    /// Pause a schedule: no tick fires until it is resumed.
    Pause {
        /// The schedule's name.
        name: String,
        /// How the command reaches the store.
        #[command(flatten)]
        send: SendArgs,
    },
    /// Resume a paused schedule: it fires next at its first tick after now.
    Resume {
        /// The schedule's name.
        name: String,
        /// How the command reaches the store.
        #[command(flatten)]
        send: SendArgs,
    },
}

/// `keys ...`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// A table of the concurrency keys in use: runs holding a slot and
    /// runs waiting for one.
    List,
    /// One key: the runs holding its slots and those waiting, in the order
    /// they are admitted.
    Describe {
        /// The concurrency key.
        key: String,
    },
}

/// `groups ...`
#[derive(Debug, Subcommand)]
pub enum GroupsCommand {
    /// A table of groups with their member counts by state.
    List {
        /// The most groups to show.
        #[arg(long, short = 'n', default_value_t = 50, value_parser = parse_limit)]
        limit: usize,
    },
    /// One group: its counts and its members.
    Describe {
        /// The group id.
        #[arg(value_parser = parse_run_id)]
        id: RunId,
    },
}

/// `store ...`
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Queue counts, dead letters, size, and the owning writer's last
    /// activity.
    Info,
}

fn parse_run_id(value: &str) -> Result<RunId, String> {
    RunId::new(value).map_err(|e| e.to_string())
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|e| format!("{e} (durations look like `90s`, `5m`, `1h 30m`, `2d`)"))
}

#[cfg(feature = "ui")]
fn parse_listen(value: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(addr) = value.parse() {
        return Ok(addr);
    }
    match value.strip_prefix("localhost:").map(str::parse::<u16>) {
        Some(Ok(port)) => Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        _ => Err(format!(
            "{value:?} is not an address to listen on (give IP:PORT, [IPv6]:PORT or localhost:PORT, e.g. 127.0.0.1:8233)"
        )),
    }
}

fn parse_limit(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("the limit must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_values_are_usage_errors_naming_them() {
        let err = Cli::try_parse_from(["taquba-workflow", "runs", "describe", "a/b"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("a/b"), "{err}");
        let err = Cli::try_parse_from(["taquba-workflow", "runs", "list", "--since", "soon"])
            .unwrap_err();
        assert!(err.to_string().contains("soon"), "{err}");
        let err = Cli::try_parse_from(["taquba-workflow", "runs", "signal", "k"]).unwrap_err();
        assert!(err.to_string().contains("--json"), "{err}");
        let err = Cli::try_parse_from([
            "taquba-workflow",
            "runs",
            "signal",
            "k",
            "--json",
            "1",
            "--file",
            "f",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("cannot be used with"), "{err}");
    }

    #[cfg(feature = "ui")]
    #[test]
    fn listen_addresses_take_ips_and_localhost() {
        assert_eq!(
            parse_listen("localhost:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:8233").unwrap(),
            "[::1]:8233".parse().unwrap()
        );
        let err = parse_listen("example.com:80").unwrap_err();
        assert!(err.contains("example.com:80"), "{err}");
        assert!(parse_listen("localhost").is_err());
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from([
            "taquba-workflow",
            "runs",
            "list",
            "--store",
            "/s",
            "-o",
            "jsonl",
        ])
        .unwrap();
        assert_eq!(cli.global.store.as_deref(), Some("/s"));
        assert_eq!(cli.global.output, Format::Jsonl);
    }
}
