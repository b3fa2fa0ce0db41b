//! Metrics through the [`metrics`] facade (feature `metrics`): the
//! application installs a recorder (a Prometheus exporter, a statsd
//! bridge); with none, every call is a no-op of the facade.
//!
//! The names and labels (also the table in the README):
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `taquba_workflow_runs_submitted_total` | counter | `queue`, `workflow` | runs submitted (a duplicate submission of an active run is not counted) |
//! | `taquba_workflow_transitions_total` | counter | `queue`, `outcome` | committed step settlements that moved a run: `continued`, `succeeded`, `failed`, `cancelled` |
//! | `taquba_workflow_step_errors_total` | counter | `queue`, `workflow`, `kind` | errors returned by step runners (a panic counts as `transient`) |
//! | `taquba_workflow_step_retries_total` | counter | `queue` | committed retries of a step (a transient error with attempts left) |
//! | `taquba_workflow_dead_letters_total` | counter | `queue`, `origin` | step jobs dead-lettered: by the worker (`worker`), or found dead and reconciled (`reconciled`: a lease expired past the last attempt, an interrupted last attempt) |
//! | `taquba_workflow_runs_ended_total` | counter | `queue`, `workflow`, `status` | runs ended in this process: `succeeded`, `failed`, `cancelled` |
//! | `taquba_workflow_step_duration_seconds` | histogram | `queue`, `workflow` | wall time of one runner call |
//! | `taquba_workflow_run_duration_seconds` | histogram | `queue`, `workflow`, `status` | submission to end of a run, on the runtime's clock |
//! | `taquba_workflow_steps_in_flight` | gauge | `queue` | step (and notification) jobs claimed by this process's worker and not yet settled |
//! | `taquba_workflow_steps_due` | gauge | `queue` | jobs of the runtime's queue due and waiting for a worker, sampled with the queue's counts: every maintenance round while reading them is cheap, up to 16 rounds apart on a busy store |
//! | `taquba_workflow_cluster_shards_hosted` | gauge | `node` | shards of a cluster this process hosts |
//! | `taquba_workflow_cluster_shard_changes_total` | counter | `node`, `change` | shards this process `opened`, `handed_over` or was `fenced` out of |
//!
//! `workflow` is the workflow (or job) name the run's input names, empty
//! for a hand-written runner's payload.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::model::{RunEnd, StepErrorKind};

/// `taquba_workflow_runs_submitted_total`.
pub(crate) const RUNS_SUBMITTED: &str = "taquba_workflow_runs_submitted_total";
/// `taquba_workflow_transitions_total`.
pub(crate) const TRANSITIONS: &str = "taquba_workflow_transitions_total";
/// `taquba_workflow_step_errors_total`.
pub(crate) const STEP_ERRORS: &str = "taquba_workflow_step_errors_total";
/// `taquba_workflow_step_retries_total`.
pub(crate) const STEP_RETRIES: &str = "taquba_workflow_step_retries_total";
/// `taquba_workflow_dead_letters_total`.
pub(crate) const DEAD_LETTERS: &str = "taquba_workflow_dead_letters_total";
/// `taquba_workflow_runs_ended_total`.
pub(crate) const RUNS_ENDED: &str = "taquba_workflow_runs_ended_total";
/// `taquba_workflow_step_duration_seconds`.
pub(crate) const STEP_DURATION: &str = "taquba_workflow_step_duration_seconds";
/// `taquba_workflow_run_duration_seconds`.
pub(crate) const RUN_DURATION: &str = "taquba_workflow_run_duration_seconds";
/// `taquba_workflow_steps_in_flight`.
pub(crate) const STEPS_IN_FLIGHT: &str = "taquba_workflow_steps_in_flight";
/// `taquba_workflow_steps_due`.
pub(crate) const STEPS_DUE: &str = "taquba_workflow_steps_due";

/// `taquba_workflow_cluster_shards_hosted`.
pub(crate) const CLUSTER_SHARDS_HOSTED: &str = "taquba_workflow_cluster_shards_hosted";
/// `taquba_workflow_cluster_shard_changes_total`.
pub(crate) const CLUSTER_SHARD_CHANGES: &str = "taquba_workflow_cluster_shard_changes_total";

/// The shards node `node` hosts, and one change (`opened`, `handed_over`,
/// `fenced`) when there was one.
pub(crate) fn cluster_shards(node: &str, hosted: usize, change: Option<&'static str>) {
    gauge!(CLUSTER_SHARDS_HOSTED, "node" => node.to_string()).set(hosted as f64);
    if let Some(change) = change {
        counter!(CLUSTER_SHARD_CHANGES, "node" => node.to_string(), "change" => change)
            .increment(1);
    }
}

/// The label value of an unnamed workflow.
fn workflow_label(workflow: Option<&str>) -> String {
    workflow.unwrap_or_default().to_string()
}

/// A run of `workflow` submitted to `queue`.
pub(crate) fn run_submitted(queue: &str, workflow: Option<&str>) {
    counter!(RUNS_SUBMITTED, "queue" => queue.to_string(), "workflow" => workflow_label(workflow))
        .increment(1);
}

/// A committed settlement that moved a run (`outcome`: `continued` or the
/// terminal status).
pub(crate) fn transition(queue: &str, outcome: &'static str) {
    counter!(TRANSITIONS, "queue" => queue.to_string(), "outcome" => outcome).increment(1);
}

/// A runner call of a step of `workflow` that returned an error of `kind`,
/// after `took`; [`step_ran`] for one that did not.
pub(crate) fn step_ran(
    queue: &str,
    workflow: Option<&str>,
    took: Duration,
    error: Option<StepErrorKind>,
) {
    let workflow = workflow_label(workflow);
    histogram!(STEP_DURATION, "queue" => queue.to_string(), "workflow" => workflow.clone())
        .record(took.as_secs_f64());
    if let Some(kind) = error {
        let kind = match kind {
            StepErrorKind::Transient => "transient",
            StepErrorKind::Permanent => "permanent",
        };
        counter!(STEP_ERRORS, "queue" => queue.to_string(), "workflow" => workflow, "kind" => kind)
            .increment(1);
    }
}

/// A committed retry.
pub(crate) fn retried(queue: &str) {
    counter!(STEP_RETRIES, "queue" => queue.to_string()).increment(1);
}

/// A committed dead letter (`origin`: `worker` or `reconciled`).
pub(crate) fn dead_lettered(queue: &str, origin: &'static str) {
    counter!(DEAD_LETTERS, "queue" => queue.to_string(), "origin" => origin).increment(1);
}

/// The committed end of a run of `workflow` submitted at `submitted_at_ms`
/// (when recorded).
pub(crate) fn run_ended(
    queue: &str,
    workflow: Option<&str>,
    submitted_at_ms: Option<u64>,
    end: &RunEnd,
) {
    let status = end.termination.status.as_str();
    let workflow = workflow_label(workflow);
    counter!(RUNS_ENDED, "queue" => queue.to_string(), "workflow" => workflow.clone(), "status" => status)
        .increment(1);
    if let Some(submitted) = submitted_at_ms {
        let took = end.termination.terminated_at_ms.saturating_sub(submitted);
        histogram!(RUN_DURATION, "queue" => queue.to_string(), "workflow" => workflow, "status" => status)
            .record(Duration::from_millis(took).as_secs_f64());
    }
}

/// The committed end of `run_id` (`end`), on `queue`'s runtime named
/// `queue_name`: its workflow and submission time are read from the
/// terminal record the commit wrote (a read of the writer's memtable).
pub(crate) async fn run_ended_on(
    queue: &taquba::Queue,
    queue_name: &str,
    run_id: &crate::store::keys::RunId,
    end: &RunEnd,
) {
    let termination =
        crate::store::durable::kv_record::<crate::store::durable::DurableTermination>(
            queue.view(),
            &crate::store::keys::outcome_kv_key(run_id),
        )
        .await
        .ok()
        .flatten();
    run_ended(
        queue_name,
        termination.as_ref().and_then(|t| t.workflow.as_deref()),
        termination.as_ref().and_then(|t| t.submitted_at_ms),
        end,
    );
}

/// The jobs of `queue` due and waiting.
pub(crate) fn steps_due(queue: &str, due: i64) {
    #[allow(clippy::cast_precision_loss)]
    gauge!(STEPS_DUE, "queue" => queue.to_string()).set(due.max(0) as f64);
}

/// A claimed job of `queue` in flight in this process until dropped.
pub(crate) struct InFlight(metrics::Gauge);

impl InFlight {
    pub(crate) fn begin(queue: &str) -> Self {
        let gauge = gauge!(STEPS_IN_FLIGHT, "queue" => queue.to_string());
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
