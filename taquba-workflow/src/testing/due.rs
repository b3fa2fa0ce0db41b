//! What falls due next on the environment's clock, read from the queue and
//! the runtime's records, never guessed: the earliest `run_at` of the
//! runtime's scheduled jobs (durable timers, signal timeouts, retry
//! backoffs of steps and of terminal notifications, delayed starts), the
//! earliest lease expiry of its claimed jobs, and (for a window of time
//! that passes) the earliest retention expiry of its run, group and
//! command records, and the next ticks of its schedules. The time-skipping loop ([`super::skip`]) steps the
//! clock from one to the next.

use std::time::Duration;

use futures_util::TryStreamExt;
use taquba::{ExpiryIndex, JobStatus};

use crate::engine::RuntimeCore;
use crate::error::Result;
use crate::store::keys::{
    COMMAND_EXPIRY_PREFIX, GROUP_TERMINALS_PREFIX, HEADER_RUN_ID, RunId, TERMINALS_PREFIX,
};

/// Jobs read per page of the scheduled and claimed listings.
const PAGE: usize = 64;

/// One instant something falls due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    /// When, ms since the UNIX epoch (the mock clock).
    pub(crate) at_ms: u64,
    /// The run whose step (or notification) falls due; `None` for a
    /// retention expiry.
    pub(crate) run_id: Option<RunId>,
}

/// What [`next_due`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counted {
    /// Steps only: scheduled jobs and leases (running until runs end: a
    /// retention sweep is no work a run waits for).
    Steps,
    /// Steps and the retention expiries (a window of time passing).
    StepsAndRetention,
}

/// The earliest instant strictly after `after_ms` at which something of
/// `core`'s falls due; `None` when nothing ever does. What is due at or
/// before `after_ms` is not counted: running until idle ran it.
///
/// # Errors
/// Storage errors of the reads.
pub(crate) async fn next_due(
    core: &RuntimeCore,
    after_ms: u64,
    counted: Counted,
) -> Result<Option<Due>> {
    let mut next = earliest(
        next_scheduled(core, after_ms).await?,
        next_lease(core, after_ms).await?,
    );
    if counted == Counted::StepsAndRetention {
        for (prefix, window) in retention_windows(core) {
            next = earliest(next, next_expiry(core, prefix, window, after_ms).await?);
        }
        next = earliest(next, next_tick(core, after_ms).await?);
    }
    Ok(next)
}

/// Whether jobs of `core`'s queue are claimed by someone other than its
/// worker (the caller knows the worker loop is stopped, so none of its
/// steps is running): a test that claimed a job itself. Running until
/// idle waits for them, so they wait for their leases to expire.
///
/// # Errors
/// Storage errors.
pub(crate) async fn held_claims(core: &RuntimeCore) -> Result<bool> {
    Ok(core.inflight.is_empty() && core.queue.view().stats(&core.queue_name).await?.claimed > 0)
}

fn earliest(a: Option<Due>, b: Option<Due>) -> Option<Due> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.at_ms < a.at_ms { b } else { a }),
        (a, b) => a.or(b),
    }
}

fn run_of(headers: &std::collections::HashMap<String, String>) -> Option<RunId> {
    headers
        .get(HEADER_RUN_ID)
        .and_then(|id| RunId::new(id.as_str()).ok())
}

/// The first scheduled job of the runtime's queue whose `run_at` is after
/// `after_ms` (the listing is in `run_at` order).
async fn next_scheduled(core: &RuntimeCore, after_ms: u64) -> Result<Option<Due>> {
    let view = core.queue.view();
    let mut jobs = std::pin::pin!(view.jobs(&core.queue_name, JobStatus::Scheduled, PAGE));
    while let Some(job) = jobs.try_next().await? {
        if let Some(at_ms) = job.run_at.filter(|at| *at > after_ms) {
            return Ok(Some(Due {
                at_ms,
                run_id: run_of(&job.headers),
            }));
        }
    }
    Ok(None)
}

/// The earliest lease expiry after `after_ms` of the runtime's claimed
/// jobs (the leases this process holds).
async fn next_lease(core: &RuntimeCore, after_ms: u64) -> Result<Option<Due>> {
    let view = core.queue.view();
    let mut jobs = std::pin::pin!(view.jobs(&core.queue_name, JobStatus::Claimed, PAGE));
    let mut next = None;
    while let Some(job) = jobs.try_next().await? {
        let expiry = core
            .queue
            .lease_expiry(&core.queue_name, &job.id)
            .filter(|at| *at > after_ms);
        if let Some(at_ms) = expiry {
            next = earliest(
                next,
                Some(Due {
                    at_ms,
                    run_id: run_of(&job.headers),
                }),
            );
        }
    }
    Ok(next)
}

/// The earliest next tick after `after_ms` of the runtime's schedules that
/// are not paused (the maintenance round fires it).
async fn next_tick(core: &RuntimeCore, after_ms: u64) -> Result<Option<Due>> {
    let at_ms = core
        .view
        .schedules()
        .await?
        .into_iter()
        .filter(|schedule| schedule.queue_name == core.queue_name)
        .filter_map(|schedule| schedule.next_fire_ms)
        .filter(|at| *at > after_ms)
        .min();
    Ok(at_ms.map(|at_ms| Due {
        at_ms,
        run_id: None,
    }))
}

/// The runtime's expiry indexes with their retention windows: an entry
/// at `t` is due at `t + window` (as `ExpiryIndex::pass` reads it).
fn retention_windows(core: &RuntimeCore) -> Vec<(&'static str, Duration)> {
    let mut windows = vec![(COMMAND_EXPIRY_PREFIX, core.ops.command_retention)];
    if let Some(retention) = core.memo_retention {
        windows.push((TERMINALS_PREFIX, retention));
    }
    if let Some(retention) = core.group_retention {
        // The group sweep's window is a millisecond longer (`sweep_once`).
        windows.push((
            GROUP_TERMINALS_PREFIX,
            retention.saturating_add(Duration::from_millis(1)),
        ));
    }
    windows
}

/// The first entry of the expiry index at `prefix` that falls due (its
/// time plus `window`) after `after_ms`.
async fn next_expiry(
    core: &RuntimeCore,
    prefix: &str,
    window: Duration,
    after_ms: u64,
) -> Result<Option<Due>> {
    let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
    let index = ExpiryIndex::new(prefix.as_bytes().to_vec());
    // Due after `after_ms`: written at `after_ms - window + 1` or later.
    let from = after_ms.saturating_add(1).saturating_sub(window_ms);
    let page = core
        .queue
        .view()
        .kv_scan(prefix.as_bytes(), index.entry_key(from, &[]).., 1)
        .await?;
    Ok(page.entries.first().and_then(|(key, _)| {
        let (at_ms, _) = index.parse(key)?;
        Some(Due {
            at_ms: at_ms.saturating_add(window_ms),
            run_id: None,
        })
    }))
}
