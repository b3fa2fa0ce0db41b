//! Reading a run's history back: a scan of the run's history prefix in
//! step order, keeping the records of its current execution.

use futures_util::TryStreamExt;
use taquba::QueueView;

use crate::error::Result;
use crate::history::RunHistory;
use crate::history::record::DurableStepHistory;
use crate::store::durable;
use crate::store::keys::{RunId, history_kv_key, history_kv_prefix};

/// Records read per page of the scan.
const PAGE: usize = 256;

/// The history of `run_id`'s execution `execution`, whose current (or
/// final) step is `current_step`.
pub(crate) async fn run_history(
    view: &QueueView,
    run_id: &RunId,
    execution: Option<&str>,
    current_step: u32,
) -> Result<RunHistory> {
    let prefix = history_kv_prefix(run_id);
    // Records past the current step belong to an earlier execution.
    let end = history_kv_key(run_id, current_step.saturating_add(1));
    let range = (
        std::ops::Bound::Unbounded,
        std::ops::Bound::Excluded(end.as_slice()),
    );
    let mut entries = std::pin::pin!(view.kv_entries(&prefix, range, PAGE));
    let mut steps = Vec::new();
    while let Some((_, value)) = entries.try_next().await? {
        let Some(record) =
            durable::decode_or_absent::<DurableStepHistory>(&value, "step history record", run_id)
        else {
            continue;
        };
        if record.execution.as_deref() == execution {
            steps.push(record.into());
        }
    }
    let steps_taken = current_step.saturating_add(1);
    let steps_dropped = steps
        .first()
        .map_or(steps_taken, |first: &crate::history::StepHistory| {
            first.step
        });
    Ok(RunHistory {
        run_id: run_id.clone(),
        steps,
        steps_taken,
        steps_dropped,
    })
}

/// The stored record of step `step` of `run_id`'s execution `execution`.
pub(crate) async fn step_record(
    view: &QueueView,
    run_id: &RunId,
    step: u32,
    execution: Option<&str>,
) -> Result<Option<DurableStepHistory>> {
    Ok(view
        .kv_get(&history_kv_key(run_id, step))
        .await?
        .and_then(|bytes| {
            durable::decode_or_absent::<DurableStepHistory>(&bytes, "step history record", run_id)
        })
        .filter(|record| record.execution.as_deref() == execution))
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
