//! Reading a run's history back: its chunks (a scan of the run's history
//! prefix, in chunk order, keeping its current execution's) and the
//! entries pending on its pointer or terminal record, merged into one
//! entry per step.

use futures_util::TryStreamExt;
use taquba::QueueView;

use crate::error::Result;
use crate::history::record::{DurableStepEntry, PendingHistory, decode_chunk, decode_entries};
use crate::history::{MAX_ATTEMPTS_PER_STEP, RunHistory, StepHistory};
use crate::store::keys::{RunId, history_kv_prefix};

/// Records read per page of the scan.
const PAGE: usize = 64;

/// The history of `run_id`'s execution `execution` with `pending` the
/// entries not in a chunk, whose current (or final) step is
/// `current_step`.
pub(crate) async fn run_history(
    view: &QueueView,
    run_id: &RunId,
    execution: Option<&str>,
    pending: Option<&PendingHistory>,
    current_step: u32,
) -> Result<RunHistory> {
    let entries = execution_entries(view, run_id, execution, pending).await?;
    let steps = merge_steps(entries);
    let steps_taken = current_step.saturating_add(1);
    let steps_dropped = steps.first().map_or(steps_taken, |first| first.step);
    Ok(RunHistory {
        run_id: run_id.clone(),
        steps,
        steps_taken,
        steps_dropped,
        version: None,
    })
}

/// The stored entries of `run_id`'s execution `execution`, oldest first:
/// those in its chunks, then `pending`.
pub(crate) async fn execution_entries(
    view: &QueueView,
    run_id: &RunId,
    execution: Option<&str>,
    pending: Option<&PendingHistory>,
) -> Result<Vec<DurableStepEntry>> {
    let prefix = history_kv_prefix(run_id);
    let mut chunks = std::pin::pin!(view.kv_entries(&prefix, .., PAGE));
    let mut entries = Vec::new();
    while let Some((_, value)) = chunks.try_next().await? {
        if let Some(chunk) = decode_chunk(&value, run_id)
            && chunk.execution.as_deref() == execution
        {
            entries.extend(decode_entries(&chunk.entries));
        }
    }
    if let Some(pending) = pending {
        entries.extend(decode_entries(&pending.entries));
    }
    Ok(entries)
}

/// Say the run started on `version`: the steps whose entries name no
/// version of their own were settled by code of that version.
pub(crate) fn with_version(mut history: RunHistory, version: Option<&str>) -> RunHistory {
    history.version = version.map(str::to_string);
    for step in &mut history.steps {
        if step.version.is_none() {
            step.version = history.version.clone();
        }
    }
    history
}

/// One [`StepHistory`] per run of consecutive entries of a step (a step
/// has several entries when it was requeued or ended from outside after
/// attempts), keeping each step's last [`MAX_ATTEMPTS_PER_STEP`] attempts.
pub(crate) fn merge_steps(entries: Vec<DurableStepEntry>) -> Vec<StepHistory> {
    let mut steps: Vec<StepHistory> = Vec::new();
    for entry in entries {
        let attempts = entry.attempts.into_iter().map(Into::into);
        match steps.last_mut() {
            Some(last) if last.step == entry.step => {
                if entry.version.is_some() {
                    last.version = entry.version;
                }
                last.attempts.extend(attempts);
                last.attempts_dropped =
                    last.attempts_dropped.saturating_add(entry.attempts_dropped);
            }
            _ => steps.push(StepHistory {
                step: entry.step,
                name: entry.name,
                attempts: attempts.collect(),
                attempts_dropped: entry.attempts_dropped,
                version: entry.version,
            }),
        }
    }
    for step in &mut steps {
        if step.attempts.len() > MAX_ATTEMPTS_PER_STEP {
            let excess = step.attempts.len() - MAX_ATTEMPTS_PER_STEP;
            step.attempts.drain(..excess);
            step.attempts_dropped = step
                .attempts_dropped
                .saturating_add(u32::try_from(excess).unwrap_or(u32::MAX));
        }
    }
    steps
}

/// The keys of every history record of `run_id` (all executions), for the
/// sweeps that remove a run.
pub(crate) async fn history_keys(view: &QueueView, run_id: &RunId) -> Result<Vec<Vec<u8>>> {
    let prefix = history_kv_prefix(run_id);
    Ok(view
        .kv_entries(&prefix, .., PAGE)
        .map_ok(|(key, _)| key)
        .try_collect()
        .await?)
}
