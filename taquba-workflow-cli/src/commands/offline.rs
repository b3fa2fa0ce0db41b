//! `--offline`: apply a change to a store no process owns (a stopped
//! owner, a copied prefix). Opening a store as its writer fences whichever
//! process owns it, so [`check_no_live_writer`] first looks for one, and
//! says what it looked at:
//!
//! - the writer's liveness heartbeat, when the owner writes one
//!   (`taquba::OpenOptions::liveness_heartbeat`): a beat younger than
//!   [`HEARTBEAT_STALE_INTERVALS`] intervals that is not a clean close's
//!   proves a live owner;
//! - the store's durable sequence number, read twice [`WATCH`] apart: any
//!   advance proves a writer committing now. This involves no clock, so
//!   skew between machines cannot fool it; an owner that is alive but idle
//!   commits nothing and is not seen, which is why the heartbeat is
//!   checked too;
//! - the last flush time and the runtime's start time, shown for the
//!   operator's judgment only.
//!
//! Then it opens the store as writer (which recovers claimed steps of a
//! dead owner as a restart does: they become pending), sends the command
//! to the runtime's inbox and applies the inbox once with
//! [`WorkflowRuntime::apply_inbox`], so an offline change is validated,
//! applied and recorded exactly as the owner would (its command record
//! is the audit trail), without running any step. Commands others left in
//! the inbox are applied in the same pass, in the order they were sent.

use std::sync::Arc;
use std::time::Duration;

use taquba::{OpenOptions, Queue, QueueReader};
use taquba_workflow::{
    CommandState, Inbox, NoopTerminalHook, Step, StepError, StepOutcome, StepRunner,
    WorkflowRuntime,
};

use crate::commands::answer::{Change, answer};
use crate::error::{CliError, CliResult};
use crate::location::LocationError;
use crate::output::{Output, Times, short_duration};
use crate::session::{Runtime, Session, open_timeout};

/// How long the durable sequence number is watched for an advance.
pub const WATCH: Duration = Duration::from_secs(3);
/// A heartbeat younger than this many of its intervals proves a live owner.
pub const HEARTBEAT_STALE_INTERVALS: u64 = 3;

/// The runner of the offline runtime: never called, as no worker runs.
struct NoSteps;

impl StepRunner for NoSteps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Err(StepError::transient(format!(
            "step {} of run {} was delivered to the taquba-workflow CLI, which runs no steps",
            step.step_number, step.run_id
        )))
    }
}

/// Look for a live writer of the store; the lines say what was checked.
///
/// # Errors
/// [`CliError::Refused`] when the heartbeat or the durable sequence number
/// shows a live writer, naming what showed it; storage errors.
pub async fn check_no_live_writer(
    reader: &QueueReader,
    runtime: &Runtime,
    times: &Times,
) -> CliResult<Vec<String>> {
    let mut checked = Vec::new();
    let now_ms = times.now_ms();
    match reader.writer_heartbeat().await? {
        None => checked.push(
            "heartbeat: none recorded (the owner does not enable OpenOptions::liveness_heartbeat), so an idle owner cannot be told from a stopped one"
                .to_string(),
        ),
        Some(beat) if beat.closed => checked.push(format!(
            "heartbeat: the last one is a clean close's, {}",
            times.at(beat.at_ms)
        )),
        Some(beat) => {
            let interval_ms = u64::try_from(beat.interval.as_millis()).unwrap_or(u64::MAX);
            let age_ms = now_ms.saturating_sub(beat.at_ms);
            let stale_after = interval_ms.saturating_mul(HEARTBEAT_STALE_INTERVALS);
            if age_ms < stale_after {
                return Err(CliError::Refused(format!(
                    "a writer owns the store: its liveness heartbeat is {} old (one every {}): send the command without --offline and the owner applies it",
                    short_duration(age_ms),
                    short_duration(interval_ms)
                )));
            }
            checked.push(format!(
                "heartbeat: the last one is {} old, over {HEARTBEAT_STALE_INTERVALS} intervals of {} (not a clean close: the owner stopped without closing)",
                short_duration(age_ms),
                short_duration(interval_ms)
            ));
        }
    }
    let before = reader.last_store_activity();
    tokio::time::sleep(WATCH).await;
    let after = reader.last_store_activity();
    if after.durable_seq != before.durable_seq || after.writer_epoch != before.writer_epoch {
        return Err(CliError::Refused(format!(
            "a writer is committing to the store: its durable sequence number went from {} to {} (writer epoch {} to {}) within {}: send the command without --offline",
            before.durable_seq,
            after.durable_seq,
            before.writer_epoch,
            after.writer_epoch,
            short_duration(u64::try_from(WATCH.as_millis()).unwrap_or(u64::MAX))
        )));
    }
    checked.push(format!(
        "commits: none for {} (durable sequence number {}, writer epoch {})",
        short_duration(u64::try_from(WATCH.as_millis()).unwrap_or(u64::MAX)),
        after.durable_seq,
        after.writer_epoch
    ));
    checked.push(match after.last_flush_at_ms {
        Some(ms) => format!("last flush: {} (writer clock)", times.at(ms)),
        None => "last flush: none recorded".to_string(),
    });
    if let Some(info) = &runtime.info {
        checked.push(format!(
            "runtime {:?}: its worker last started {} (taquba-workflow {})",
            info.queue_name,
            times.at(info.started_at_ms),
            info.crate_version
        ));
    }
    Ok(checked)
}

/// Apply `change` with the store opened as its writer, after
/// [`check_no_live_writer`].
///
/// # Errors
/// [`CliError::Refused`] when a writer looks alive; the open's and the
/// command's errors.
pub async fn apply(
    session: &Session,
    runtime: &Runtime,
    change: Change,
    out: &Output,
) -> CliResult<()> {
    let checked = check_no_live_writer(&session.reader, runtime, &out.times()).await?;
    let mut lines = vec!["No live writer found. Checked:".to_string()];
    lines.extend(checked.iter().map(|line| format!("  {line}")));
    lines.push(format!(
        "Opening {} (queue {:?}) as its writer: a process that still owned it would be fenced.",
        session.target.location, session.target.db_path
    ));
    for line in &lines {
        eprintln!("{line}");
    }

    let target = &session.target;
    let after = open_timeout();
    let open = Queue::open_with_options(
        target.store.clone(),
        &target.db_path,
        OpenOptions::default(),
    );
    let queue = match tokio::time::timeout(after, open).await {
        Ok(Ok(queue)) => Arc::new(queue),
        Ok(Err(source)) => {
            return Err(CliError::Open {
                store: target.location.to_string(),
                path: target.db_path.clone(),
                source,
            });
        }
        Err(_) => {
            return Err(LocationError::Timeout {
                what: "opening the queue as writer",
                location: target.location.to_string(),
                after,
            }
            .into());
        }
    };
    let result = apply_with(&queue, session, runtime, change, out).await;
    match Arc::try_unwrap(queue) {
        Ok(queue) => {
            if let Err(e) = queue.close().await {
                eprintln!("taquba-workflow: closing the queue failed: {e}");
            }
        }
        Err(_) => eprintln!("taquba-workflow: the queue is still shared; it closes on exit"),
    }
    result
}

async fn apply_with(
    queue: &Arc<Queue>,
    session: &Session,
    runtime: &Runtime,
    change: Change,
    out: &Output,
) -> CliResult<()> {
    let store = session.target.store.clone();
    let offline = WorkflowRuntime::builder(queue.clone(), store.clone(), NoSteps, NoopTerminalHook)
        .queue_name(runtime.queue_name.clone())
        .memo_prefix(runtime.memo_prefix.clone())
        .build();
    let inbox = Inbox::new(store, runtime.memo_prefix.clone()).with_sender(format!(
        "taquba-workflow --offline {} (pid {})",
        env!("CARGO_PKG_VERSION"),
        std::process::id()
    ));
    let id = inbox.send(change.command).await?;
    // Every pass handles a bounded number of commands in id order; ours
    // is reached once those sent before it are.
    let mut handled = 0;
    loop {
        let state = offline.view().command(&id).await?;
        if !matches!(state, CommandState::Pending | CommandState::Unknown) && handled > 1 {
            eprintln!(
                "The inbox also held {} command(s) sent before this one and not applied yet: they were applied first, in the order they were sent (`commands describe ID` shows each).",
                handled - 1
            );
        }
        match state {
            CommandState::Applied { .. } | CommandState::Rejected { .. } => {
                return answer(&id, &state, inbox.command_path(&id).to_string(), out);
            }
            CommandState::Accepted => {
                // A cancellation that reached a step still claimed: with no
                // worker here it settles only when the owner runs again.
                eprintln!(
                    "The {} is recorded; the run ends when its step settles, at the owner's next start.",
                    change.what
                );
                return answer(&id, &state, inbox.command_path(&id).to_string(), out);
            }
            _ => {
                let applied = offline.apply_inbox().await?;
                handled += applied;
                if applied == 0 {
                    return Err(CliError::Refused(format!(
                        "command {id} ({}) was not applied: the inbox at {} no longer holds it",
                        change.what,
                        inbox.command_path(&id)
                    )));
                }
            }
        }
    }
}
