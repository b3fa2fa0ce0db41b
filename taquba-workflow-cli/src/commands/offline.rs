//! `--offline`: apply a change to a store no process owns (a stopped
//! owner, a copied prefix). Opening a store as its writer fences whichever
//! process owns it, so [`check_no_live_writer`] first looks for one with
//! every check the store allows, and says what each found:
//!
//! - **heartbeat**: the writer's liveness heartbeat, when the owner writes
//!   one (`taquba::OpenOptions::liveness_heartbeat`). A beat of the
//!   current writer younger than [`HEARTBEAT_STALE_INTERVALS`] intervals
//!   proves a live owner (refused); an older one, or a clean close's,
//!   proves the writer gone. A beat of an older writer epoch, or none,
//!   tells nothing;
//! - **runtime**: each runtime's worker records its start and, when its
//!   loop returns, its clean stop. A start with no clean stop is refused
//!   unless the heartbeat proves the writer gone: the owner may be idle
//!   or busy in a long step (committing nothing), or have crashed;
//! - **lease**: a step claimed less than its lease ago may be running in
//!   a worker (refused, unless the heartbeat proves the writer gone). The
//!   lease is the one the runtime recorded (taquba's default for a
//!   runtime that recorded none); the claim time is the writer's clock;
//! - **cannot tell**: no heartbeat and no runtime recorded in the store:
//!   nothing tells a live owner from a stopped one (refused);
//! - **commits**: the store's durable sequence number, read twice [`WATCH`]
//!   apart: any advance proves a writer committing now (refused). No
//!   clock is involved, so skew between machines cannot fool it;
//! - the last commit (the newest write-ahead log object) and the last
//!   flush, shown for the operator's judgment only.
//!
//! `--force` opens the store although a check refused, naming the risk.
//! Then it opens the store as writer (with a heartbeat, so that its clean
//! close tells the next `--offline` that no writer is left; the open
//! recovers claimed steps of a dead owner as a restart does: they become
//! pending), sends the command to the runtime's inbox and applies the
//! inbox once with [`WorkflowRuntime::apply_inbox`], so an offline change
//! is validated, applied and recorded exactly as the owner would (its
//! command record is the audit trail), without running any step. Commands
//! others left in the inbox are applied in the same pass, in the order
//! they were sent.

use std::sync::Arc;
use std::time::Duration;

use taquba::{JobStatus, OpenOptions, Queue, QueueConfig, QueueReader};
use taquba_workflow::{
    NoopTerminalHook, Step, StepError, StepOutcome, StepRunner, WorkflowRuntime, WorkflowView,
    inbox::CommandState, inbox::Inbox, view::RuntimeInfo,
};

use crate::commands::activity::newest_wal;
use crate::commands::answer::{Change, answer};
use crate::error::{CliError, CliResult};
use crate::location::LocationError;
use crate::output::{Output, Times, short_duration};
use crate::session::{Runtime, Session, Target, open_timeout};

/// How long the durable sequence number is watched for an advance.
pub const WATCH: Duration = Duration::from_secs(3);
/// A heartbeat younger than this many of its intervals proves a live owner.
pub const HEARTBEAT_STALE_INTERVALS: u64 = 3;
/// The heartbeat of the offline writer itself: its clean close, at the
/// store's newest writer epoch, tells the next `--offline` that no writer
/// is left.
pub const OFFLINE_HEARTBEAT: Duration = Duration::from_secs(1);
/// Claimed steps looked at per queue.
pub const CLAIMED_STEPS_CHECKED: usize = 100;
/// What `--force` risks, as the refusal says it.
pub const FORCE_RISK: &str = "--force opens the store anyway: a process that still owns it is fenced (it stops with \"detected newer DB client\") and the steps it was running run again";

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

/// What [`check_no_live_writer`] found: a line per check, and the checks
/// that refuse (each naming itself).
#[derive(Debug, Default)]
pub struct Checks {
    /// What each check found (`heartbeat: ...`).
    pub lines: Vec<String>,
    /// The checks that say an owner may be alive (`lease: ...`).
    pub refusals: Vec<String>,
}

/// What the heartbeat says of the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Beat {
    /// It is alive.
    Alive,
    /// It is gone (a stale beat, or a clean close's, of the current epoch).
    Gone,
    /// Nothing (no beat, or an older writer's).
    Unknown,
}

/// Look for a live writer of the store `reader` reads (in `target`), with
/// every check (see the [module documentation](self)): each is run, so a
/// refusal names every check that refused.
///
/// # Errors
/// Storage errors.
pub async fn check_no_live_writer(
    target: &Target,
    reader: &QueueReader,
    times: &Times,
) -> CliResult<Checks> {
    let mut checks = Checks::default();
    let now_ms = times.now_ms();
    let epoch = reader.last_store_activity().writer_epoch;
    let beat = match reader.writer_heartbeat().await? {
        None => {
            checks.lines.push(
                "heartbeat: none recorded (the owner does not enable OpenOptions::liveness_heartbeat)"
                    .to_string(),
            );
            Beat::Unknown
        }
        Some(beat) if beat.writer_epoch < epoch => {
            checks.lines.push(format!(
                "heartbeat: the last one is writer epoch {}'s and the store's writer is epoch {epoch} (a writer without a heartbeat opened it since), so it tells nothing",
                beat.writer_epoch
            ));
            Beat::Unknown
        }
        Some(beat) if beat.closed => {
            checks.lines.push(format!(
                "heartbeat: the last one is a clean close's, {} (writer epoch {})",
                times.at(beat.at_ms),
                beat.writer_epoch
            ));
            Beat::Gone
        }
        Some(beat) => {
            let interval_ms = u64::try_from(beat.interval.as_millis()).unwrap_or(u64::MAX);
            let age_ms = now_ms.saturating_sub(beat.at_ms);
            let stale_after = interval_ms.saturating_mul(HEARTBEAT_STALE_INTERVALS);
            if age_ms < stale_after {
                checks.refusals.push(format!(
                    "heartbeat: a writer owns the store: its liveness heartbeat is {} old (one every {})",
                    short_duration(age_ms),
                    short_duration(interval_ms)
                ));
                Beat::Alive
            } else {
                checks.lines.push(format!(
                    "heartbeat: the last one is {} old, over {HEARTBEAT_STALE_INTERVALS} intervals of {} (not a clean close: the owner stopped without closing)",
                    short_duration(age_ms),
                    short_duration(interval_ms)
                ));
                Beat::Gone
            }
        }
    };

    let runtimes = WorkflowView::runtimes(reader.view()).await?;
    for info in &runtimes {
        let started = format!(
            "runtime {:?}: its worker started {} (taquba-workflow {})",
            info.queue_name,
            times.at(info.started_at_ms),
            info.crate_version
        );
        match (info.stopped_at_ms, beat) {
            (Some(stopped), _) => checks
                .lines
                .push(format!("{started} and stopped cleanly {}", times.at(stopped))),
            (None, Beat::Gone) => checks.lines.push(format!(
                "{started} and recorded no clean stop; the heartbeat shows its writer gone"
            )),
            (None, _) => checks.refusals.push(format!(
                "{started} and recorded no clean stop: it may be running (idle, or busy in a long step, committing nothing) or have crashed"
            )),
        }
    }
    if runtimes.is_empty() && beat == Beat::Unknown {
        checks.refusals.push(
            "cannot tell: no heartbeat and no runtime recorded in the store, so nothing tells a live owner from a stopped one"
                .to_string(),
        );
    }

    let view = reader.view();
    let mut claimed = 0;
    for queue in view.list_queues().await? {
        let lease_ms = lease_of(&runtimes, &queue);
        let page = view
            .list_jobs(&queue, JobStatus::Claimed, None, CLAIMED_STEPS_CHECKED)
            .await?;
        for job in page.jobs {
            claimed += 1;
            let Some(claimed_at) = job.claimed_at else {
                continue;
            };
            let (lease_ms, whose) = lease_ms;
            let age_ms = now_ms.saturating_sub(claimed_at);
            if age_ms >= lease_ms {
                continue;
            }
            let line = format!(
                "lease: job {} on queue {queue:?}{} was claimed {} ago under a lease of {} ({whose}): a worker may be running it",
                job.id,
                job.headers
                    .get(taquba_workflow::HEADER_RUN_ID)
                    .map(|run| format!(" (run {run})"))
                    .unwrap_or_default(),
                short_duration(age_ms),
                short_duration(lease_ms)
            );
            if beat == Beat::Gone {
                checks
                    .lines
                    .push(format!("{line}; the heartbeat shows its writer gone"));
            } else {
                checks.refusals.push(line);
            }
        }
    }
    if claimed == 0 {
        checks.lines.push("lease: no step is claimed".to_string());
    }

    {
        let before = reader.last_store_activity();
        tokio::time::sleep(WATCH).await;
        let after = reader.last_store_activity();
        let watched = short_duration(u64::try_from(WATCH.as_millis()).unwrap_or(u64::MAX));
        if after.durable_seq != before.durable_seq || after.writer_epoch != before.writer_epoch {
            checks.refusals.push(format!(
                "commits: a writer is committing to the store: its durable sequence number went from {} to {} (writer epoch {} to {}) within {watched}",
                before.durable_seq, after.durable_seq, before.writer_epoch, after.writer_epoch,
            ));
        } else {
            checks.lines.push(format!(
                "commits: none for {watched} (durable sequence number {}, writer epoch {})",
                after.durable_seq, after.writer_epoch
            ));
        }
    }
    checks.lines.push(match newest_wal(target).await? {
        Some(wal) => format!(
            "last commit: {} (the newest write-ahead log object, store clock)",
            times.at(wal.at_ms)
        ),
        None => "last commit: none in the write-ahead log".to_string(),
    });
    checks
        .lines
        .push(match reader.last_store_activity().last_flush_at_ms {
            Some(ms) => format!("last flush: {} (writer clock)", times.at(ms)),
            None => "last flush: none recorded".to_string(),
        });
    Ok(checks)
}

/// The claim lease of `queue`'s runtime and where it comes from.
fn lease_of(runtimes: &[RuntimeInfo], queue: &str) -> (u64, &'static str) {
    match runtimes
        .iter()
        .find(|r| r.queue_name == queue)
        .and_then(|r| r.claim_lease_ms)
    {
        Some(ms) => (ms, "its runtime's"),
        None => (
            u64::try_from(QueueConfig::default().lease_duration.as_millis()).unwrap_or(u64::MAX),
            "taquba's default: the runtime recorded none",
        ),
    }
}

/// Apply `change` with the store opened as its writer, after
/// [`check_no_live_writer`]; with `force` even when a check refused.
///
/// # Errors
/// [`CliError::Refused`] naming every check that refused, and how to
/// override it; the open's and the command's errors.
pub async fn apply(
    session: &Session,
    runtime: &Runtime,
    change: Change,
    force: bool,
    out: &Output,
) -> CliResult<()> {
    let checks = check_no_live_writer(&session.target, &session.reader, &out.times()).await?;
    let target = &session.target;
    if !checks.refusals.is_empty() && !force {
        let mut message = format!(
            "not opening {} (queue {:?}) as its writer: {} check(s) say a process may own it:",
            target.location,
            target.db_path,
            checks.refusals.len()
        );
        for refusal in &checks.refusals {
            message.push_str(&format!("\n  - {refusal}"));
        }
        message.push_str(&format!(
            "\nSend the command without --offline (the owner applies it), or stop the owner first. {FORCE_RISK}."
        ));
        return Err(CliError::Refused(message));
    }
    let mut lines = if checks.refusals.is_empty() {
        vec!["No live writer found. Checked:".to_string()]
    } else {
        let mut lines = vec![format!(
            "--force: opening the store although {} check(s) refused:",
            checks.refusals.len()
        )];
        lines.extend(checks.refusals.iter().map(|line| format!("  {line}")));
        lines.push("Also checked:".to_string());
        lines
    };
    lines.extend(checks.lines.iter().map(|line| format!("  {line}")));
    lines.push(format!(
        "Opening {} (queue {:?}) as its writer: a process that still owned it would be fenced.",
        target.location, target.db_path
    ));
    for line in &lines {
        eprintln!("{line}");
    }

    let after = open_timeout();
    let open = Queue::open_with_options(
        target.store.clone(),
        &target.db_path,
        OpenOptions::default().liveness_heartbeat(OFFLINE_HEARTBEAT),
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
