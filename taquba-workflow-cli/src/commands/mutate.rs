//! The commands that change a store: `runs cancel`, `runs signal`, `runs
//! requeue`, `runs fork` and `runs restart`. Each checks what it can first (the run exists and the command
//! applies to it), says what it will do, then sends an inbox command to the
//! owning process, or with `--offline` applies it itself ([`offline`]);
//! `--wait` polls the command's state until the owner applied it and prints
//! the answer. `commands describe` reads a command's state later.
//!
//! [`offline`]: crate::commands::offline

use std::io::{BufRead, IsTerminal, Write};
use std::time::Instant;

use taquba_workflow::{
    RunId, RunState, TerminalStatus, WorkflowView, inbox::Command, inbox::CommandId,
    inbox::CommandState, inbox::Inbox, view::RunDetails,
};

use crate::cli::SendArgs;
use crate::cluster::{ClusterSession, ShardSession};
use crate::commands::activity;
use crate::commands::answer::{Change, answer, command_card};
use crate::commands::offline;
use crate::error::{CliError, CliResult};
use crate::output::Output;
use crate::present::command::CommandJson;
use crate::present::run::step_text;
use crate::present::state::{CommandStateJson, RunStateJson};
use crate::session::{READER_POLL_INTERVAL, Runtime, Session};

/// The name an inbox command records as its sender: `tool` (the command
/// line, or `taquba-workflow ui`), its version, the user and the process.
pub fn sender(tool: &str) -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".to_string());
    format!(
        "{tool} {} (user {user}, pid {})",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    )
}

/// The inbox of `runtime`'s owner in `session`'s store, its commands
/// signed by `tool` (see [`sender`]).
pub fn inbox(session: &Session, runtime: &Runtime, tool: &str) -> Inbox {
    Inbox::new(session.target.store.clone(), runtime.memo_prefix.clone()).with_sender(sender(tool))
}

/// The run `id`, which must exist.
///
/// # Errors
/// [`CliError::RunNotFound`]; storage errors.
pub async fn existing_run(view: &WorkflowView, id: &RunId) -> CliResult<RunDetails> {
    view.run(id)
        .await?
        .ok_or_else(|| CliError::RunNotFound(id.clone()))
}

/// Where a run is, in one line: `Run X (workflow W) is running at step 3
/// (count), attempt 1/2.`
pub fn where_it_is(run: &RunDetails) -> String {
    let workflow = run
        .workflow
        .as_deref()
        .map(|w| format!(" (workflow {w})"))
        .unwrap_or_default();
    let step = step_text(run.current_step, run.step_name.as_deref());
    let attempts = match (run.attempts, run.max_attempts) {
        (0, _) => String::new(),
        (a, 0) => format!(", attempt {a}"),
        (a, m) => format!(", attempt {a}/{m}"),
    };
    format!(
        "Run {}{workflow} is {} at step {step}{attempts}.",
        run.run_id,
        RunStateJson::from(&run.state)
    )
}

/// What a cancellation of `run` does, in one sentence.
///
/// # Errors
/// [`CliError::Refused`] for a terminated run: there is nothing to cancel.
pub fn cancel_effect(run: &RunDetails) -> CliResult<&'static str> {
    match &run.state {
        RunState::Terminated(t) => Err(CliError::Refused(format!(
            "run {} already {} at step {}: there is nothing to cancel",
            run.run_id, t.status, t.final_step
        ))),
        RunState::Pending => Ok("Its waiting step is removed and the run ends cancelled."),
        RunState::Running => Ok(
            "The running step's cancel token fires; the run ends cancelled when the step returns (its outcome is discarded).",
        ),
        RunState::Cancelling => Ok(
            "A cancellation is already requested: this one is recorded and changes nothing else.",
        ),
    }
}

/// What a requeue does, in one sentence.
pub const REQUEUE_EFFECT: &str = "Its dead-lettered step is enqueued again with fresh attempts and the run is active again (a run failed by its runner's verdict is refused by the owner).";

/// What a signal on `key` with `len` payload bytes does, in one sentence.
pub fn signal_effect(key: &str, len: usize) -> String {
    format!(
        "Signal {key:?} ({len} bytes): wakes the run waiting on the key, or is buffered for the next waiter."
    )
}

/// Whether a requeue can apply to `run`: only a failed run has a
/// dead-lettered step to requeue.
///
/// # Errors
/// [`CliError::Refused`] naming the run's state otherwise.
pub fn check_requeue(run: &RunDetails) -> CliResult<()> {
    let id = &run.run_id;
    match &run.state {
        RunState::Terminated(t) if t.status == TerminalStatus::Failed => Ok(()),
        RunState::Terminated(t) => Err(CliError::Refused(format!(
            "run {id} {} at step {}: only a failed run's dead-lettered step can be requeued",
            t.status, t.final_step
        ))),
        other => Err(CliError::Refused(format!(
            "run {id} is {} at step {}: only a failed run's dead-lettered step can be requeued",
            RunStateJson::from(other),
            run.current_step
        ))),
    }
}

/// `runs cancel ID [--reason R] [--yes]`.
///
/// # Errors
/// [`CliError::RunNotFound`]; [`CliError::Refused`] for a terminated run
/// or when not confirmed; the sending errors.
pub async fn cancel(
    session: &Session,
    runtime: &Runtime,
    id: &RunId,
    reason: Option<&str>,
    yes: bool,
    send: &SendArgs,
    out: &Output,
) -> CliResult<()> {
    let run = existing_run(&runtime.view, id).await?;
    let effect = cancel_effect(&run)?;
    let mut plan = vec![where_it_is(&run), effect.to_string()];
    if let Some(reason) = reason {
        plan.push(format!("Reason: {reason}"));
    }
    plan.push(via(send));
    for line in &plan {
        say(line)?;
    }
    if !yes && !confirm(&format!("Cancel run {id}?"))? {
        return Err(CliError::Refused(format!(
            "cancel of run {id} not confirmed: nothing was sent (pass --yes to cancel without asking)"
        )));
    }
    let change = Change {
        command: Command::cancel(id.clone(), reason.map(str::to_string)),
        what: format!("cancel of run {id}"),
    };
    deliver(session, runtime, change, send, out).await
}

/// `runs signal KEY (--json J | --file F) [--raw]`, the payload already
/// read.
///
/// # Errors
/// The sending errors.
pub async fn signal(
    session: &Session,
    runtime: &Runtime,
    key: &str,
    payload: Vec<u8>,
    send: &SendArgs,
    out: &Output,
) -> CliResult<()> {
    say(&signal_effect(key, payload.len()))?;
    say(&via(send))?;
    let change = Change {
        command: Command::signal(key, payload),
        what: format!("signal {key:?}"),
    };
    deliver(session, runtime, change, send, out).await
}

/// `runs requeue ID`.
///
/// # Errors
/// [`CliError::RunNotFound`]; [`CliError::Refused`] for a run that did not
/// fail; the sending errors.
pub async fn requeue(
    session: &Session,
    runtime: &Runtime,
    id: &RunId,
    send: &SendArgs,
    out: &Output,
) -> CliResult<()> {
    let run = existing_run(&runtime.view, id).await?;
    check_requeue(&run)?;
    say(&where_it_is(&run))?;
    say(REQUEUE_EFFECT)?;
    say(&via(send))?;
    let change = Change {
        command: Command::requeue(id.clone()),
        what: format!("requeue of run {id}"),
    };
    deliver(session, runtime, change, send, out).await
}

/// What a fork of `run` from step `from_step` does, in one sentence.
pub fn fork_effect(from_step: u32) -> String {
    match from_step {
        0 => "A new run, linked to this one, starts again from step 0 with the run's input (as recorded); this run is left as it is.".to_string(),
        n => format!(
            "A new run, linked to this one, starts at step {n} with the payload step {n} was delivered with (as recorded); steps 0..{n} are not run again and this run is left as it is."
        ),
    }
}

/// Whether a fork of `run` from step `from_step` can be sent: the run
/// ended at or after that step, or is active and `cancel` asks to cancel
/// it first.
///
/// # Errors
/// [`CliError::Refused`] naming the run and step otherwise.
pub fn check_fork(run: &RunDetails, from_step: u32, cancel: bool) -> CliResult<()> {
    let id = &run.run_id;
    match &run.state {
        RunState::Terminated(t) if from_step > t.final_step => Err(CliError::Refused(format!(
            "step {from_step} of run {id} can no longer be forked: the run ended at step {}",
            t.final_step
        ))),
        RunState::Terminated(_) => Ok(()),
        _ if cancel => Ok(()),
        other => Err(CliError::Refused(format!(
            "run {id} is {} at step {}: cancel it first, or pass --cancel to cancel it before the fork",
            RunStateJson::from(other),
            run.current_step
        ))),
    }
}

/// `runs fork ID --from-step N` and `runs restart ID` (`from_step` 0),
/// the new run named `new_run_id` (else by the command's id): with
/// `--cancel`, an active run is cancelled first (through the same
/// route) and waited on until it ended, then the fork is sent.
///
/// # Errors
/// [`CliError::RunNotFound`]; [`CliError::Refused`] for an active run
/// without `--cancel` or a step past the run's end; [`CliError::Timeout`]
/// when the cancelled run does not end within `--wait-timeout`; the
/// sending errors.
pub async fn fork(
    session: &Session,
    runtime: &Runtime,
    id: &RunId,
    from_step: u32,
    args: &crate::cli::ForkArgs,
    new_run_id: Option<RunId>,
    out: &Output,
) -> CliResult<()> {
    let send = &args.send;
    let run = existing_run(&runtime.view, id).await?;
    check_fork(&run, from_step, args.cancel)?;
    say(&where_it_is(&run))?;
    say(&fork_effect(from_step))?;
    say(&via(send))?;
    if !matches!(run.state, RunState::Terminated(_)) {
        say("--cancel: the run is cancelled first, and the fork sent once it ended.")?;
        let cancel = Command::cancel(
            id.clone(),
            Some(format!("cancelled to fork it from step {from_step}")),
        );
        if send.offline {
            offline::apply(
                session,
                runtime,
                Change {
                    command: cancel,
                    what: format!("cancel of run {id}"),
                },
                send.force,
                out,
            )
            .await?;
        } else {
            let inbox = inbox(session, runtime, "taquba-workflow");
            let command = inbox.send(cancel).await?;
            say(&format!(
                "Sent the cancel of run {id} as command {command}; waiting for the run to end..."
            ))?;
            let started = Instant::now();
            loop {
                let now = existing_run(&runtime.view, id).await?;
                if matches!(now.state, RunState::Terminated(_)) {
                    break;
                }
                if started.elapsed() >= send.wait_timeout {
                    return Err(CliError::Timeout(format!(
                        "run {id} has not ended {} after the cancel (command {command}): is the owning process running? Nothing was forked; run the fork again once the run ended",
                        humantime::format_duration(send.wait_timeout)
                    )));
                }
                tokio::time::sleep(READER_POLL_INTERVAL).await;
            }
        }
    }
    let what = match from_step {
        0 => format!("restart of run {id}"),
        n => format!("fork of run {id} from step {n}"),
    };
    let change = Change {
        command: Command::fork(id.clone(), from_step, new_run_id),
        what,
    };
    deliver(session, runtime, change, send, out).await
}

/// `commands describe ID`.
///
/// # Errors
/// [`CliError::Usage`] for an id that is not a ULID; storage errors.
pub async fn describe_command(
    session: &Session,
    runtime: &Runtime,
    id: &str,
    out: &Output,
) -> CliResult<()> {
    let id: CommandId = id
        .parse()
        .map_err(|e: taquba_workflow::Error| CliError::Usage(e.to_string()))?;
    let inbox = Inbox::new(session.target.store.clone(), runtime.memo_prefix.clone());
    let state = runtime.view.command(&id).await?;
    let json = CommandJson::new(&id, &state, inbox.command_path(&id).to_string());
    out.one(&json, |times| command_card(&json, times))
}

/// `commands describe ID` on a cluster: the command is looked for in
/// every open shard (its record, or its object in the shard's inbox); the
/// first shard that knows it answers. A command no shard knows is shown
/// as unknown.
///
/// # Errors
/// [`CliError::Usage`] for an id that is not a ULID; storage errors
/// (naming the shard).
pub async fn describe_cluster_command(
    cluster: &ClusterSession,
    id: &str,
    out: &Output,
) -> CliResult<()> {
    let command: CommandId = id
        .parse()
        .map_err(|e: taquba_workflow::Error| CliError::Usage(e.to_string()))?;
    match find_command(cluster, &command).await? {
        Some((shard, _)) => {
            say(&format!(
                "Command {command} is in shard {} of the cluster at {} ({}); its object path is inside the shard.",
                shard.shard, cluster.location, shard.session.target.location
            ))?;
            describe_command(&shard.session, &shard.runtime, id, out).await
        }
        None => {
            let json = CommandJson::new(
                &command,
                &CommandState::Unknown,
                format!(
                    "(in no shard's inbox: the {} open shards of {} were searched)",
                    cluster.open_shards().count(),
                    cluster.location
                ),
            );
            out.one(&json, |times| command_card(&json, times))
        }
    }
}

/// The open shard that knows command `id` (its record, or its object in the
/// shard's inbox) with the command's state there; `None` when none does.
///
/// # Errors
/// Storage errors, naming the shard.
pub async fn find_command<'a>(
    cluster: &'a ClusterSession,
    id: &CommandId,
) -> CliResult<Option<(&'a ShardSession, CommandState)>> {
    use futures_util::StreamExt;
    let reads = cluster
        .open_shards()
        .map(|shard| async move {
            let state = cluster.view.command(shard.shard, id).await;
            (shard, state)
        })
        .collect::<Vec<_>>();
    let mut reads = std::pin::pin!(
        futures_util::stream::iter(reads).buffered(crate::cluster::SHARD_CONCURRENCY)
    );
    while let Some((shard, state)) = reads.next().await {
        match state? {
            CommandState::Unknown => {}
            state => return Ok(Some((shard, state))),
        }
    }
    Ok(None)
}

fn via(send: &SendArgs) -> String {
    if send.offline {
        "Via: --offline, applied directly after checking that no process owns the store."
            .to_string()
    } else {
        "Via: the owning process's inbox (it applies commands at each maintenance round)."
            .to_string()
    }
}

/// A line of the plan: on stderr, so stdout holds only the answer.
pub fn say(line: &str) -> CliResult<()> {
    let mut err = std::io::stderr().lock();
    match writeln!(err, "{line}") {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Ask `question` on stderr and read the answer from stdin: `y` or `yes`
/// confirms; anything else, or no answer (stdin closed), does not.
fn confirm(question: &str) -> CliResult<bool> {
    let stdin = std::io::stdin();
    {
        let mut err = std::io::stderr().lock();
        let hint = if stdin.is_terminal() {
            ""
        } else {
            " (reading the answer from stdin)"
        };
        write!(err, "{question} [y/N]{hint} ")?;
        err.flush()?;
    }
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    let answer = answer.trim().to_ascii_lowercase();
    Ok(answer == "y" || answer == "yes")
}

/// Send `change` to the inbox (or, `--offline`, apply it), then with
/// `--wait` follow it to its answer.
pub(crate) async fn deliver(
    session: &Session,
    runtime: &Runtime,
    change: Change,
    send: &SendArgs,
    out: &Output,
) -> CliResult<()> {
    if send.offline {
        return offline::apply(session, runtime, change, send.force, out).await;
    }
    let inbox = inbox(session, runtime, "taquba-workflow");
    let id = inbox.send(change.command).await?;
    let path = inbox.command_path(&id).to_string();
    if !send.wait {
        let json = CommandJson::new(&id, &CommandState::Pending, path);
        say(&format!(
            "Sent the {} as command {id}. Follow it: taquba-workflow commands describe {id}",
            change.what
        ))?;
        return out.one(&json, |times| command_card(&json, times));
    }
    say(&format!(
        "Sent the {} as command {id}; waiting for the owner to apply it...",
        change.what
    ))?;
    let started = Instant::now();
    let seq_before = session.reader.last_store_activity().durable_seq;
    let state = loop {
        let state = runtime.view.command(&id).await?;
        match state {
            CommandState::Applied { .. } | CommandState::Rejected { .. } => break state,
            _ if started.elapsed() >= send.wait_timeout => {
                let hint = activity::owner_hint(
                    &session.target,
                    &session.reader,
                    seq_before,
                    &out.times(),
                )
                .await?;
                return Err(CliError::Timeout(format!(
                    "command {id} ({}) is still {} after {}: is the owning process running? ({hint}.) It stays in the inbox at {path} and is applied when the owner next runs; for a store no process owns, use --offline",
                    change.what,
                    CommandStateJson::from(&state),
                    humantime::format_duration(send.wait_timeout)
                )));
            }
            _ => tokio::time::sleep(READER_POLL_INTERVAL).await,
        }
    };
    answer(&id, &state, path, out)
}
