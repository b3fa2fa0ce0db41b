//! The commands: [`run`] opens the store and dispatches to each command's
//! module (`ui` to [`crate::ui`], which keeps its session while it
//! serves).

pub mod activity;
pub mod answer;
pub mod cluster_info;
pub mod groups;
pub mod keys;
pub mod mutate;
pub mod offline;
pub mod runs;
pub mod schedules;
pub mod store_info;

use std::io::Read;
use std::path::Path;

use crate::cli::{
    Cli, Command, CommandsCommand, GroupsCommand, KeysCommand, RunsCommand, SchedulesCommand,
    StoreCommand,
};
use crate::cluster::{self, ClusterSession, Reads, ShardSession};
use crate::error::{CliError, CliResult};
use crate::output::Output;
use crate::payload::encode_json;
use crate::session::{self, Session};

/// Run the parsed command line.
///
/// # Errors
/// The command's error.
pub async fn run(cli: Cli) -> CliResult<()> {
    let global = &cli.global;
    // The dashboard owns its session for as long as it serves.
    #[cfg(feature = "ui")]
    if let Command::Ui(args) = &cli.command {
        return crate::ui::run(global, args).await;
    }
    let out = Output::new(global.output, global.time_format);
    // Read a signal's payload before touching the store: a bad file or
    // JSON is a usage error.
    let payload = match &cli.command {
        Command::Runs(RunsCommand::Signal {
            json, file, raw, ..
        }) => Some(signal_payload(json.as_deref(), file.as_deref(), *raw)?),
        _ => None,
    };
    let (location, store) = session::open_location(global).await?;
    if let Some(record) = cluster::detect(&location, &store).await? {
        let cluster = ClusterSession::open(global, location, record).await?;
        let result = dispatch_cluster(&cli, &cluster, payload, &out).await;
        cluster.close().await;
        return result;
    }
    let session = Session::open_in(global, location, store).await?;
    let result = dispatch(&cli, &session, payload, &out).await;
    session.close().await;
    result
}

/// Run a command on a cluster root: listings over every shard, a run's
/// reads and commands in the shard holding it, a key-only signal in the
/// key's home shard.
async fn dispatch_cluster(
    cli: &Cli,
    cluster: &ClusterSession,
    payload: Option<Vec<u8>>,
    out: &Output,
) -> CliResult<()> {
    let reads = Reads::Cluster(&cluster.view);
    match &cli.command {
        Command::Store(StoreCommand::Info) => cluster_info::info(cluster, out).await,
        Command::Runs(RunsCommand::List(args)) => runs::list(reads, args, out).await,
        Command::Runs(RunsCommand::Describe { id }) => {
            let shard = cluster.run_shard(id).await?;
            runs::describe(&shard.runtime.view, id, out).await
        }
        Command::Runs(RunsCommand::Steps { id }) => {
            let shard = cluster.run_shard(id).await?;
            runs::steps(&shard.runtime.view, id, out).await
        }
        Command::Runs(RunsCommand::Result { id, wait, timeout }) => {
            let shard = cluster.run_shard(id).await?;
            runs::result(&shard.runtime.view, id, *wait, *timeout, out).await
        }
        Command::Runs(RunsCommand::Cancel {
            id,
            reason,
            yes,
            send,
        }) => {
            let shard = cluster.run_shard(id).await?;
            mutate::say(&in_shard(cluster, shard, &format!("Run {id}")))?;
            mutate::cancel(
                &shard.session,
                &shard.runtime,
                id,
                reason.as_deref(),
                *yes,
                send,
                out,
            )
            .await
        }
        Command::Runs(RunsCommand::Signal { key, send, .. }) => {
            let shard = cluster.signal_shard(key).await?;
            mutate::say(&in_shard(
                cluster,
                shard,
                &format!("Signal {key:?} goes to its key's home shard: it"),
            ))?;
            let payload = payload.unwrap_or_default();
            mutate::signal(&shard.session, &shard.runtime, key, payload, send, out).await
        }
        Command::Runs(RunsCommand::Requeue { id, send }) => {
            let shard = cluster.run_shard(id).await?;
            mutate::say(&in_shard(cluster, shard, &format!("Run {id}")))?;
            mutate::requeue(&shard.session, &shard.runtime, id, send, out).await
        }
        Command::Runs(RunsCommand::Fork {
            id,
            from_step,
            fork,
        }) => fork_in_cluster(cluster, id, *from_step, fork, out).await,
        Command::Runs(RunsCommand::Restart { id, fork }) => {
            fork_in_cluster(cluster, id, 0, fork, out).await
        }
        Command::Groups(GroupsCommand::List { limit }) => groups::list(reads, *limit, out).await,
        Command::Groups(GroupsCommand::Describe { id }) => {
            let k = cluster.view.shard_of_group(id);
            match cluster.shard(k) {
                Some(shard) => groups::describe(&shard.runtime.view, id, out).await,
                None => Err(CliError::Refused(format!(
                    "group {id} not found in the cluster: its shard {k} has no queue yet"
                ))),
            }
        }
        Command::Commands(CommandsCommand::Describe { id }) => {
            mutate::describe_cluster_command(cluster, id, out).await
        }
        Command::Schedules(_) => Err(CliError::Refused(format!(
            "the store at {} is a cluster: schedules belong to each shard's store; name one shard's location with --store",
            cluster.location
        ))),
        Command::Keys(_) => Err(CliError::Refused(format!(
            "the store at {} is a cluster: concurrency keys belong to each shard's store; name one shard's location with --store",
            cluster.location
        ))),
        // `run` serves the dashboard before opening a session here.
        #[cfg(feature = "ui")]
        Command::Ui(_) => unreachable!("`ui` is dispatched by `commands::run`"),
    }
}

/// `{what} is in shard K of the cluster at LOCATION (DIR).`, the line a
/// command on a cluster says first.
fn in_shard(cluster: &ClusterSession, shard: &ShardSession, what: &str) -> String {
    format!(
        "{what} is in shard {} of the cluster at {} ({}).",
        shard.shard, cluster.location, shard.session.target.location
    )
}

async fn dispatch(
    cli: &Cli,
    session: &Session,
    payload: Option<Vec<u8>>,
    out: &Output,
) -> CliResult<()> {
    let global = &cli.global;
    if let Command::Store(StoreCommand::Info) = &cli.command {
        return store_info::info(session, out).await;
    }
    let runtime = session.runtime(global).await?;
    let view = &runtime.view;
    match &cli.command {
        Command::Store(StoreCommand::Info) => store_info::info(session, out).await,
        Command::Runs(RunsCommand::List(args)) => runs::list(Reads::Store(view), args, out).await,
        Command::Runs(RunsCommand::Describe { id }) => runs::describe(view, id, out).await,
        Command::Runs(RunsCommand::Steps { id }) => runs::steps(view, id, out).await,
        Command::Runs(RunsCommand::Result { id, wait, timeout }) => {
            runs::result(view, id, *wait, *timeout, out).await
        }
        Command::Runs(RunsCommand::Cancel {
            id,
            reason,
            yes,
            send,
        }) => mutate::cancel(session, &runtime, id, reason.as_deref(), *yes, send, out).await,
        Command::Runs(RunsCommand::Signal { key, send, .. }) => {
            let payload = payload.unwrap_or_default();
            mutate::signal(session, &runtime, key, payload, send, out).await
        }
        Command::Runs(RunsCommand::Requeue { id, send }) => {
            mutate::requeue(session, &runtime, id, send, out).await
        }
        Command::Runs(RunsCommand::Fork {
            id,
            from_step,
            fork,
        }) => {
            let new_id = fork.run_id.clone();
            mutate::fork(session, &runtime, id, *from_step, fork, new_id, out).await
        }
        Command::Runs(RunsCommand::Restart { id, fork }) => {
            let new_id = fork.run_id.clone();
            mutate::fork(session, &runtime, id, 0, fork, new_id, out).await
        }
        Command::Groups(GroupsCommand::List { limit }) => {
            groups::list(Reads::Store(view), *limit, out).await
        }
        Command::Groups(GroupsCommand::Describe { id }) => groups::describe(view, id, out).await,
        Command::Commands(CommandsCommand::Describe { id }) => {
            mutate::describe_command(session, &runtime, id, out).await
        }
        Command::Keys(KeysCommand::List) => keys::list(view, out).await,
        Command::Keys(KeysCommand::Describe { key }) => keys::describe(view, key, out).await,
        Command::Schedules(SchedulesCommand::List) => schedules::list(view, out).await,
        Command::Schedules(SchedulesCommand::Describe { name }) => {
            schedules::describe(view, name, out).await
        }
        Command::Schedules(SchedulesCommand::Pause { name, send }) => {
            schedules::set_paused(session, &runtime, name, true, send, out).await
        }
        Command::Schedules(SchedulesCommand::Resume { name, send }) => {
            schedules::set_paused(session, &runtime, name, false, send, out).await
        }
        // `run` serves the dashboard before opening a session here.
        #[cfg(feature = "ui")]
        Command::Ui(_) => unreachable!("`ui` is dispatched by `commands::run`"),
    }
}

/// The payload of `runs signal`: the `--json` text or the `--file`
/// contents (`-`: stdin), MessagePack-encoded unless `--raw`.
fn signal_payload(json: Option<&str>, file: Option<&Path>, raw: bool) -> CliResult<Vec<u8>> {
    let (bytes, source) = match (json, file) {
        (Some(text), _) => (text.as_bytes().to_vec(), "--json".to_string()),
        (None, Some(path)) if path == Path::new("-") => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| CliError::Usage(format!("cannot read the payload from stdin: {e}")))?;
            (bytes, "stdin".to_string())
        }
        (None, Some(path)) => {
            let bytes = std::fs::read(path).map_err(|e| {
                CliError::Usage(format!(
                    "cannot read the payload file {}: {e}",
                    path.display()
                ))
            })?;
            (bytes, format!("the payload file {}", path.display()))
        }
        (None, None) => {
            return Err(CliError::Usage(
                "runs signal needs a payload: --json JSON or --file FILE".to_string(),
            ));
        }
    };
    if raw {
        return Ok(bytes);
    }
    let text = String::from_utf8(bytes).map_err(|_| {
        CliError::Usage(format!(
            "{source} is not UTF-8 JSON (pass --raw to send bytes as they are)"
        ))
    })?;
    encode_json(&text, &source)
}

/// `runs fork` (`runs restart`: from step 0) on a cluster root: sent to the
/// run's shard, the fork named for that shard ([`fork_id_on`]).
///
/// # Errors
/// As [`mutate::fork`]; [`CliError::Refused`] for a `--run-id` of another
/// shard.
async fn fork_in_cluster(
    cluster: &crate::cluster::ClusterSession,
    id: &taquba_workflow::RunId,
    from_step: u32,
    fork: &crate::cli::ForkArgs,
    out: &Output,
) -> CliResult<()> {
    let shard = cluster.run_shard(id).await?;
    mutate::say(&in_shard(cluster, shard, &format!("Run {id}")))?;
    let new_id = fork_id_on(cluster, shard.shard, fork)?;
    mutate::fork(
        &shard.session,
        &shard.runtime,
        id,
        from_step,
        fork,
        Some(new_id),
        out,
    )
    .await
}

/// The id a fork made in shard `shard` of `cluster` takes: `--run-id` when
/// it routes there, else a fresh ULID drawn to route there (a fork lives in
/// its original's shard, and the cluster finds a run by its id's shard).
///
/// # Errors
/// [`CliError::Refused`] for a `--run-id` of another shard.
fn fork_id_on(
    cluster: &crate::cluster::ClusterSession,
    shard: u32,
    fork: &crate::cli::ForkArgs,
) -> CliResult<taquba_workflow::RunId> {
    match &fork.run_id {
        Some(given) => {
            let routes_to = cluster.record.shard_of(given.as_str());
            if routes_to == shard {
                Ok(given.clone())
            } else {
                Err(CliError::Refused(format!(
                    "--run-id {given} routes to shard {routes_to}, not to shard {shard} of the run it forks; omit it to draw one, or pick one of that shard"
                )))
            }
        }
        None => Ok(cluster.record.new_run_id_on(shard)),
    }
}
