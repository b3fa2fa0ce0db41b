//! Conformance of the public API to the behaviour spec (the seed documents
//! and `api-0.13.md`, `jobs.md`, from a review that saw only those and the
//! public docs): each test asserts one promised behaviour and cites the
//! sentence it relies on.

use crate::common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{Scripted, ends_within, spec};
use common::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::SettlementEffects;
use taquba_workflow::jobs::{Job, JobContext, JobError, JobRunner};
use taquba_workflow::{
    EffectsHandle, Error, MemoStore, NoopTerminalHook, RunId, RunOptions, RunOutcome, RunSpec,
    RunState, RunTermination, SignalOutcome, Step, StepError, StepErrorKind, StepOutcome,
    StepRunner, TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime, WorkflowView,
};

// ---------------------------------------------------------------------------
// Helpers.

fn terminated(state: &RunState) -> RunTermination {
    match state {
        RunState::Terminated(t) => t.clone(),
        other => panic!("expected a terminated run, found {other:?}"),
    }
}

fn hex_sha256(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// A runner that waits for `gate` in step 0, optionally staging an effect
/// first, and then returns what `then` says; later steps succeed.
#[derive(Clone)]
struct Gated {
    gate: Gate,
    calls: Arc<AtomicU32>,
    /// `succeed`, `transient`, or `cooperative` (return `Cancel` when the
    /// token fires).
    then: &'static str,
}

impl Gated {
    fn new(then: &'static str) -> Self {
        Self {
            gate: Gate::default(),
            calls: Arc::new(AtomicU32::new(0)),
            then,
        }
    }
}

impl StepRunner for Gated {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        step.effects.put("app/gated", "staged")?;
        if self.then == "cooperative" {
            tokio::select! {
                _ = self.gate.wait() => {}
                _ = step.cancel_token.cancelled() => {
                    return Ok(StepOutcome::Cancel { reason: "cooperative".into() });
                }
            }
        } else {
            self.gate.wait().await;
        }
        match self.then {
            "transient" => Err(StepError::transient("flaky after cancel")),
            _ => Ok(StepOutcome::Succeed {
                result: b"done".to_vec(),
            }),
        }
    }
}

/// A runtime over `queue` and `store` with a default [`Scripted`] runner
/// and `hook`, its poll interval 50 ms.
fn hooked<H: TerminalHook + 'static>(
    queue: &Arc<taquba::Queue>,
    store: Arc<dyn taquba::object_store::ObjectStore>,
    hook: H,
) -> WorkflowRuntime<Scripted, H> {
    WorkflowRuntime::builder(queue.clone(), store, Scripted::default(), hook)
        .poll_interval(Duration::from_millis(50))
        .build()
}

/// A fresh in-memory store (its queue, its object store, its clock at
/// [`T0`]) and a runtime over it with a default [`Scripted`] runner, its
/// worker running.
struct Running {
    queue: Arc<taquba::Queue>,
    store: Arc<dyn taquba::object_store::ObjectStore>,
    clock: taquba::MockClock,
    rt: WorkflowRuntime<Scripted, NoopTerminalHook>,
    worker: taquba_workflow::RunnerHandle,
}

async fn running() -> Running {
    let (queue, store, clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = rt.spawn(std::future::pending::<()>());
    Running {
        queue,
        store,
        clock,
        rt,
        worker,
    }
}

async fn until_running<R: StepRunner, H: TerminalHook>(rt: &WorkflowRuntime<R, H>, id: &str) {
    eventually("the step is claimed", || async {
        matches!(
            rt.status(&rid(id)).await.unwrap().map(|s| s.state),
            Some(RunState::Running)
        )
    })
    .await;
}

// ---------------------------------------------------------------------------
// Run ids and submissions.

// seed-lib.rs.txt: "an optional `run_id` (a [`RunId`], validated at
// construction to 1 to [`MAX_RUN_ID_LEN`] bytes of `[A-Za-z0-9_-]`"; and the
// Error doc: every variant names the value it rejects.
#[test]
fn run_ids_are_validated_at_their_bounds_and_errors_name_the_value() {
    assert!(RunId::new("a".repeat(128)).is_ok());
    assert!(RunId::new("Az09_-").is_ok());
    for bad in ["", "has space", "slash/inside", "dot.dot", "é"] {
        match RunId::new(bad) {
            Err(Error::InvalidRunId { run_id, reason }) => {
                assert_eq!(run_id, bad);
                assert!(!reason.is_empty());
            }
            other => panic!("{bad:?} accepted: {other:?}"),
        }
    }
    let long = "b".repeat(129);
    let err = RunId::new(long.clone()).unwrap_err();
    assert!(matches!(&err, Error::InvalidRunId { run_id, .. } if *run_id == long));
    assert!(err.to_string().contains(&long), "{err}");
    let err = "x/y".parse::<RunId>().unwrap_err();
    assert!(err.to_string().contains("x/y"), "{err}");
    assert_eq!(taquba_workflow::MAX_RUN_ID_LEN, 128);
}

// seed-lib.rs.txt: "`submit` is idempotent on `(run_id, input)`. A
// re-submission of an active run with the same input is a no-op and the
// returned [`SubmitOutcome`] has `newly_submitted = false`. A re-submission
// with a different input is rejected with [`Error::InputMismatch`]."
#[tokio::test(start_paused = true)]
async fn resubmission_of_an_active_run_is_a_noop_and_another_input_is_a_mismatch() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let first = rt.submit(spec("dup", "wait")).await.unwrap();
    assert!(first.newly_submitted);
    assert_eq!(first.run_id, "dup");
    let again = rt.submit(spec("dup", "wait")).await.unwrap();
    assert!(!again.newly_submitted);
    assert_eq!(again.job_id, first.job_id);
    let err = rt.submit(spec("dup", "other")).await.unwrap_err();
    assert!(
        matches!(&err, Error::InputMismatch(id) if id == "dup"),
        "{err:?}"
    );
    assert!(err.to_string().contains("dup"), "{err}");
}

// seed-lib.rs.txt: "A current-step pointer under `workflow/steps/` is
// written with it, rewritten in the settlement that enqueues each next step
// and identifies the queue job that [`SubmitOutcome::job_id`] reports for a
// duplicate."
#[tokio::test(start_paused = true)]
async fn a_duplicate_submission_reports_the_current_steps_job() {
    let Running {
        queue, rt, worker, ..
    } = running().await;
    let first = rt.submit(spec("ptr", "wait")).await.unwrap();
    until_step("step 1 scheduled", &rt, "ptr", 1).await;
    let again = rt.submit(spec("ptr", "wait")).await.unwrap();
    assert!(!again.newly_submitted);
    assert_ne!(again.job_id, first.job_id, "step 1 has a job of its own");
    let record = job_record(&queue, &again.job_id, "the reported job").await;
    assert_eq!(
        record
            .headers
            .get(taquba_workflow::HEADER_STEP)
            .map(String::as_str),
        Some("1")
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "Step jobs reserve the `workflow.*` header prefix
// ([`RESERVED_HEADER_PREFIX`]); submission rejects user headers starting
// with it."
#[tokio::test(start_paused = true)]
async fn a_reserved_header_is_rejected_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let mut s = spec("hdr", "ok");
    s.options
        .headers
        .insert("workflow.mine".to_string(), "x".to_string());
    let err = rt.submit(s).await.unwrap_err();
    assert!(
        matches!(&err, Error::ReservedHeaderInSubmit(h) if h == "workflow.mine"),
        "{err:?}"
    );
    assert!(err.to_string().contains("workflow.mine"), "{err}");
    assert!(rt.status(&rid("hdr")).await.unwrap().is_none());
}

// seed-lib.rs.txt: "[`RunSpec::effects`]: a [`taquba::SettlementEffects`]
// applied atomically with the step-0 enqueue. A duplicate submission drops
// its effects."
#[tokio::test(start_paused = true)]
async fn submit_effects_apply_with_step_zero_and_a_duplicate_drops_them() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let mut s = spec("fx", "wait");
    s.effects = SettlementEffects::default().kv_put("app/row", "first");
    rt.submit(s).await.unwrap();
    assert_eq!(
        queue.view().kv_get(b"app/row").await.unwrap().as_deref(),
        Some(b"first".as_slice())
    );
    let mut dup = spec("fx", "wait");
    dup.effects = SettlementEffects::default().kv_put("app/row", "second");
    assert!(!rt.submit(dup).await.unwrap().newly_submitted);
    assert_eq!(
        queue.view().kv_get(b"app/row").await.unwrap().as_deref(),
        Some(b"first".as_slice())
    );
}

// seed-lib.rs.txt: "A record belongs to the termination the run's terminal
// record describes, so a re-submission of a terminated run id does not
// report the earlier run's record." (and a terminated run releases its id)
#[tokio::test(start_paused = true)]
async fn a_resubmitted_run_id_does_not_report_the_earlier_runs_outcome() {
    let Running { rt, worker, .. } = running().await;
    rt.submit(spec("again", "ok")).await.unwrap();
    let end = ends_within(&rt, "again", 10, "first run").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(rt.outcome(&rid("again")).await.unwrap().is_some());

    // Another input: the id was released, so this is a new run.
    let second = rt.submit(spec("again", "wait")).await.unwrap();
    assert!(second.newly_submitted);
    assert!(
        rt.outcome(&rid("again")).await.unwrap().is_none(),
        "an active run has no outcome"
    );
    until_step("second run at its timer", &rt, "again", 1).await;
    assert!(rt.cancel(&rid("again")).await.unwrap());
    let end = ends_within(&rt, "again", 10, "second run").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert!(
        end.outcome.is_none(),
        "a cancelled waiting step has no record"
    );
    assert!(rt.outcome(&rid("again")).await.unwrap().is_none());
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Step outcomes: statuses, error kinds, dead letters.

// seed-worker.rs.txt: `Ok(StepOutcome::Fail { reason })` "A runner verdict:
// the step ran cleanly and is acknowledged; the run terminates as `Failed`
// without a dead-letter", with `Some(StepErrorKind::Permanent)`.
#[tokio::test(start_paused = true)]
async fn a_fail_verdict_fails_the_run_permanently_without_a_dead_letter() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    clock.advance(Duration::from_millis(1234));
    rt.submit(spec("verdict", "verdict")).await.unwrap();
    let end = ends_within(&rt, "verdict", 10, "verdict").await;
    assert_eq!(
        end.termination,
        RunTermination {
            status: TerminalStatus::Failed,
            error: Some("refused".into()),
            error_kind: Some(StepErrorKind::Permanent),
            final_step: 0,
            terminated_at_ms: T0 + 1234,
        }
    );
    let outcome = end.outcome.expect("the worker recorded the outcome");
    assert_eq!(outcome.status, TerminalStatus::Failed);
    assert_eq!(outcome.error.as_deref(), Some("refused"));
    assert!(outcome.result.is_none());
    assert!(dead_jobs(&queue).await.is_empty(), "no dead letter");
    assert_eq!(runner.calls_of("verdict"), 1);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "`Err(StepError::permanent(_))` | Dead-letter
// immediately." and "operators find it through
// [`taquba::QueueView::dead_jobs`]".
#[tokio::test(start_paused = true)]
async fn a_permanent_error_dead_letters_at_once_and_records_the_failure() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("perm", "perm")).await.unwrap();
    let end = ends_within(&rt, "perm", 10, "perm").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("permanently broken"));
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Permanent));
    assert_eq!(
        end.outcome.and_then(|o| o.error).as_deref(),
        Some("permanently broken")
    );
    assert_eq!(runner.calls_of("perm"), 1, "no retry");
    assert_eq!(dead_jobs(&queue).await.len(), 1);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "`Err(StepError::transient(_))` | Retry per backoff up
// to `max_attempts`, then dead-letter." and "[`Delivery::is_last_attempt`]
// reports whether a transient error from this attempt dead-letters the
// step"; `max_attempts_per_step` overrides the queue's default.
#[tokio::test(start_paused = true)]
async fn a_transient_error_retries_up_to_the_runs_attempt_limit() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Arc<Mutex<Vec<(u32, u32, bool)>>> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock()
                .unwrap()
                .push((step.attempts, step.max_attempts, step.is_last_attempt()));
            Err::<StepOutcome, _>(StepError::transient(format!("try {}", step.attempts)))
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("flaky", "x");
    s.options.max_attempts_per_step = Some(2);
    rt.submit(s).await.unwrap();
    let end = ends_within(&rt, "flaky", 30, "flaky").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Transient));
    assert_eq!(end.termination.error.as_deref(), Some("try 2"));
    assert_eq!(*seen.lock().unwrap(), vec![(1, 2, false), (2, 2, true)]);
    assert_eq!(dead_jobs(&queue).await.len(), 1);
    worker.shutdown().await.unwrap();
}

// seed-worker.rs.txt: "a runner-issued [`StepOutcome::Cancel`] wins and
// carries its reason on [`RunOutcome::error`]"; Cancel settles with no error
// kind (`terminate_recorded(.., None)`).
#[tokio::test(start_paused = true)]
async fn a_cancel_verdict_carries_its_reason_and_no_error_kind() {
    let Running {
        queue, rt, worker, ..
    } = running().await;
    rt.submit(spec("cv", "cancel")).await.unwrap();
    let end = ends_within(&rt, "cv", 10, "cancel verdict").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error.as_deref(), Some("the runner cancels"));
    assert_eq!(end.termination.error_kind, None);
    let outcome = rt.outcome(&rid("cv")).await.unwrap().expect("recorded");
    assert_eq!(outcome.error.as_deref(), Some("the runner cancels"));
    assert!(dead_jobs(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`WorkflowRuntime::wait`] waits until a run terminates
// ... and [`WorkflowRuntime::wait_timeout`] bounds the wait"; "It is `None`
// for a run that is unknown, still active" (outcome).
#[tokio::test(start_paused = true)]
async fn wait_timeout_is_none_for_an_active_run_whose_outcome_is_none() {
    let Running { rt, worker, .. } = running().await;
    rt.submit(spec("slow", "wait")).await.unwrap();
    assert!(
        rt.wait_timeout(&rid("slow"), Duration::from_secs(2))
            .await
            .unwrap()
            .is_none()
    );
    assert!(rt.outcome(&rid("slow")).await.unwrap().is_none());
    assert!(rt.outcome(&rid("never")).await.unwrap().is_none());
    assert!(rt.status(&rid("never")).await.unwrap().is_none());
    assert!(matches!(
        rt.wait(&rid("never")).await,
        Err(Error::RunNotFound(id)) if id == "never"
    ));
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "A process without a runtime builds a [`WorkflowView`]
// from a `taquba::QueueReader` view and a [`MemoStore`] at the runtime's
// memo prefix."
#[tokio::test(start_paused = true)]
async fn a_view_built_from_the_queue_and_memo_store_agrees_with_the_runtime() {
    let Running {
        queue,
        store,
        rt,
        worker,
        ..
    } = running().await;
    rt.submit(spec("viewed", "hello")).await.unwrap();
    ends_within(&rt, "viewed", 10, "viewed").await;
    let view = WorkflowView::new(
        queue.view().clone(),
        MemoStore::new(store.clone(), MEMO_PREFIX),
    );
    let status = view.status(&rid("viewed")).await.unwrap().expect("known");
    assert_eq!(terminated(&status.state).status, TerminalStatus::Succeeded);
    let outcome = view
        .outcome(&rid("viewed"))
        .await
        .unwrap()
        .expect("recorded");
    assert_eq!(outcome.result.as_deref(), Some(b"hello".as_slice()));
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Cancellation at each stage.

// seed-lib.rs.txt: "It returns `Ok(false)` if the run is unknown or already
// terminal."
#[tokio::test(start_paused = true)]
async fn cancel_of_an_unknown_or_terminated_run_is_false() {
    let Running { rt, worker, .. } = running().await;
    assert!(!rt.cancel(&rid("nobody")).await.unwrap());
    rt.submit(spec("done", "ok")).await.unwrap();
    ends_within(&rt, "done", 10, "done").await;
    assert!(!rt.cancel(&rid("done")).await.unwrap());
    let status = rt.status(&rid("done")).await.unwrap().unwrap();
    assert_eq!(terminated(&status.state).status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "If the current step is pending or scheduled, the queued
// step job is removed and the run's notification job is enqueued before the
// call returns." and "A run terminated without a worker (a cancellation of a
// pending step ...) has no record."; seed-group.rs.txt expects
// `RunTermination { Cancelled, error: None, error_kind: None, final_step: 0,
// terminated_at_ms: now }`.
#[tokio::test(start_paused = true)]
async fn cancelling_a_pending_step_ends_the_run_before_returning() {
    let (queue, store, clock) = memory_queue().await;
    let hook = Recorder::default();
    let rt = hooked(&queue, store, hook.clone());
    rt.submit(spec("pend", "ok")).await.unwrap();
    clock.advance(Duration::from_millis(500));
    assert!(rt.cancel(&rid("pend")).await.unwrap());
    let status = rt.status(&rid("pend")).await.unwrap().unwrap();
    assert_eq!(
        terminated(&status.state),
        RunTermination {
            status: TerminalStatus::Cancelled,
            error: None,
            error_kind: None,
            final_step: 0,
            terminated_at_ms: T0 + 500,
        }
    );
    assert!(rt.outcome(&rid("pend")).await.unwrap().is_none());
    assert!(!rt.cancel(&rid("pend")).await.unwrap(), "already terminal");
    // The notification is already enqueued: a worker started now calls the
    // hook once, with the cancellation, and never runs the step.
    let worker = rt.spawn(std::future::pending::<()>());
    eventually("the hook ran", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status, TerminalStatus::Cancelled);
    assert_eq!(calls[0].error, None);
    assert_eq!(calls[0].final_step, 0);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "If the current step is pending or scheduled, the queued
// step job is removed" — a step scheduled by `Trigger::After`.
#[tokio::test(start_paused = true)]
async fn cancelling_a_scheduled_timer_step_ends_the_run_at_that_step() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("timer", "wait")).await.unwrap();
    until_step("timer step scheduled", &rt, "timer", 1).await;
    assert_eq!(
        rt.status(&rid("timer")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    assert!(rt.cancel(&rid("timer")).await.unwrap());
    let status = rt.status(&rid("timer")).await.unwrap().unwrap();
    let t = terminated(&status.state);
    assert_eq!((t.status, t.final_step), (TerminalStatus::Cancelled, 1));
    assert_eq!(status.current_step, 1);
    assert_eq!(runner.calls_of("timer"), 1, "step 1 never ran");
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "If the current step is running, the request is
// delivered through [`Delivery::cancel_token`] ... while termination is in
// flight, `status` reports [`RunState::Cancelling`]" and "In both cases the
// runner's [`StepOutcome`] is discarded ... settles the run as
// [`TerminalStatus::Cancelled`]"; seed-worker: "an external cancellation
// overrides whatever the runner returned ... with `error: None`"; "No
// effects are applied ... when an external [`WorkflowRuntime::cancel`]
// overrides the outcome."
#[tokio::test(start_paused = true)]
async fn cancelling_a_running_step_discards_its_success_and_its_effects() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Gated::new("succeed");
    let hook = Recorder::default();
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner.clone(), hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("run", "x")).await.unwrap();
    until_running(&rt, "run").await;
    assert!(rt.cancel(&rid("run")).await.unwrap());
    assert_eq!(
        rt.status(&rid("run")).await.unwrap().unwrap().state,
        RunState::Cancelling
    );
    runner.gate.open();
    let end = ends_within(&rt, "run", 10, "cancelled run").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    let outcome = end.outcome.expect("the worker settled it");
    assert_eq!(outcome.status, TerminalStatus::Cancelled);
    assert_eq!(outcome.result, None, "the success is discarded");
    assert!(queue.view().kv_get(b"app/gated").await.unwrap().is_none());
    eventually("the hook ran", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(hook.calls().len(), 1);
    worker.shutdown().await.unwrap();
}

// seed-worker.rs.txt: "Cancellation precedence: a runner-issued
// [`StepOutcome::Cancel`] wins and carries its reason"; "A runner-issued
// Cancel keeps its effects."
#[tokio::test(start_paused = true)]
async fn a_runner_watching_the_token_cancels_with_its_reason_and_keeps_effects() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Gated::new("cooperative");
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("coop", "x")).await.unwrap();
    until_running(&rt, "coop").await;
    assert!(rt.cancel(&rid("coop")).await.unwrap());
    let end = ends_within(&rt, "coop", 10, "cooperative cancel").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error.as_deref(), Some("cooperative"));
    assert_eq!(
        queue.view().kv_get(b"app/gated").await.unwrap().as_deref(),
        Some(b"staged".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "any pending transient retry is suppressed and the
// worker settles the run as [`TerminalStatus::Cancelled`] once the step
// returns."
#[tokio::test(start_paused = true)]
async fn cancelling_a_running_step_suppresses_its_transient_retry() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Gated::new("transient");
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("tr", "x")).await.unwrap();
    until_running(&rt, "tr").await;
    assert!(rt.cancel(&rid("tr")).await.unwrap());
    runner.gate.open();
    let end = ends_within(&rt, "tr", 10, "cancel over a retry").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runner.calls.load(Ordering::SeqCst), 1, "no retry");
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Terminal hooks.

/// A hook that skips runs whose id starts with `quiet`, fails transiently
/// for runs starting with `retry`, permanently for `perm`, and stages a KV
/// write for every call.
#[derive(Clone, Default)]
struct Picky {
    calls: Arc<Mutex<Vec<RunOutcome>>>,
}

impl TerminalHook for Picky {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.calls.lock().unwrap().push(outcome.clone());
        effects.put(
            format!("app/hooked/{}", outcome.run_id),
            outcome.status.as_str(),
        )?;
        if outcome.run_id.starts_with("retry") {
            return Err(StepError::transient("hook flaky"));
        }
        if outcome.run_id.starts_with("perm") {
            return Err(StepError::permanent("hook broken"));
        }
        Ok(())
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        !outcome.run_id.starts_with("quiet")
    }
}

impl Picky {
    fn calls_of(&self, id: &str) -> Vec<RunOutcome> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.run_id == id)
            .cloned()
            .collect()
    }
}

// seed-lib.rs.txt: "Other headers on [`RunOptions::headers`] thread through
// every step and reach the terminal hook on [`RunOutcome::headers`]"; the
// hook's "effects ... applied in the same transaction as the notification's
// acknowledgement"; delivered once per committed termination.
#[tokio::test(start_paused = true)]
async fn the_hook_runs_once_with_the_submitters_headers_and_applies_its_effects() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Picky::default();
    let rt = hooked(&queue, store, hook.clone());
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("hooked", "steps:2");
    s.options
        .headers
        .insert("tenant".to_string(), "acme".to_string());
    rt.submit(s).await.unwrap();
    ends_within(&rt, "hooked", 10, "hooked").await;
    eventually("the hook ran", || async {
        !hook.calls_of("hooked").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = hook.calls_of("hooked");
    assert_eq!(calls.len(), 1);
    let o = &calls[0];
    assert_eq!(o.status, TerminalStatus::Succeeded);
    assert_eq!(o.result.as_deref(), Some(b"counted".as_slice()));
    assert_eq!(o.final_step, 2);
    assert_eq!(
        o.headers,
        HashMap::from([("tenant".to_string(), "acme".to_string())]),
        "the submitter's headers, without reserved ones"
    );
    eventually("the hook's effect", || async {
        queue
            .view()
            .kv_get(b"app/hooked/hooked")
            .await
            .unwrap()
            .as_deref()
            == Some(b"succeeded".as_slice())
    })
    .await;
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`TerminalHook::observes`] (default `true`) is
// consulted when a run terminates; returning `false` skips the notification
// job for that run."
#[tokio::test(start_paused = true)]
async fn a_hook_that_does_not_observe_a_run_is_not_called_for_it() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Picky::default();
    let rt = hooked(&queue, store, hook.clone());
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("quiet-1", "ok")).await.unwrap();
    rt.submit(spec("loud-1", "ok")).await.unwrap();
    ends_within(&rt, "quiet-1", 10, "quiet").await;
    eventually("loud hooked", || async {
        !hook.calls_of("loud-1").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(hook.calls_of("quiet-1").is_empty());
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "A transient error ([`StepError::transient`]) retries
// the notification per the queue's backoff up to the terminal step's
// `max_attempts`; a permanent error dead-letters it."
#[tokio::test(start_paused = true)]
async fn a_failing_hook_retries_up_to_the_terminal_steps_attempts() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Picky::default();
    let rt = hooked(&queue, store, hook.clone());
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("retry-hook", "ok");
    s.options.max_attempts_per_step = Some(2);
    rt.submit(s).await.unwrap();
    rt.submit(spec("perm-hook", "ok")).await.unwrap();
    eventually("retried twice", || async {
        hook.calls_of("retry-hook").len() >= 2
    })
    .await;
    eventually("perm once", || async {
        !hook.calls_of("perm-hook").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(hook.calls_of("retry-hook").len(), 2);
    assert_eq!(hook.calls_of("perm-hook").len(), 1);
    assert!(
        queue
            .view()
            .kv_get(b"app/hooked/perm-hook")
            .await
            .unwrap()
            .is_none(),
        "a failed hook's effects are not applied"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Timers and signals.

// seed-lib.rs.txt: "`MockClock::advance` moves every time-based decision
// the runtime makes: [`Trigger::After`] delays".
#[tokio::test(start_paused = true)]
async fn a_timer_step_waits_for_the_mock_clock() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("t", "timer:60000")).await.unwrap();
    until_step("timer scheduled", &rt, "t", 1).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(runner.calls_of("t"), 1, "tokio time alone does not fire it");
    clock.advance(Duration::from_millis(59_000));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(runner.calls_of("t"), 1, "not yet due");
    clock.advance(Duration::from_millis(1_001));
    let end = ends_within(&rt, "t", 10, "timer").await;
    assert_eq!(end.termination.final_step, 1);
    assert_eq!(end.termination.terminated_at_ms, T0 + 60_001);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "A signal with no registered waiter is buffered durably
// under its correlation key and consumed by the next waiter registered for
// it"; "a second signal before consumption replaces the first."
#[tokio::test(start_paused = true)]
async fn a_buffered_signal_is_replaced_by_a_later_one_and_consumed_by_the_next_waiter() {
    let Running { rt, worker, .. } = running().await;
    assert_eq!(
        rt.signal("early", b"one".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    assert_eq!(
        rt.signal("early", b"two".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    rt.submit(spec("late", "signal:early")).await.unwrap();
    let end = ends_within(&rt, "late", 10, "buffered signal").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"two".as_slice())
    );
    assert!(
        !rt.clear_signal("early").await.unwrap(),
        "the buffered signal was consumed"
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: `SignalOutcome::Delivered => { /* a waiting run was woken
// */ }`; "The next step reads [`Step::signal`]: `Some(payload)` when a
// signal arrived".
#[tokio::test(start_paused = true)]
async fn a_signal_to_a_waiting_run_is_delivered() {
    let Running { rt, worker, .. } = running().await;
    rt.submit(spec("waiter", "signal:approve")).await.unwrap();
    until_step("waiting", &rt, "waiter", 1).await;
    assert_eq!(
        rt.signal("approve", b"yes".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = ends_within(&rt, "waiter", 10, "signalled").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"yes".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "`None` when the timeout fired" and
// "[`WorkflowRuntime::clear_signal`] discards a buffered signal that is no
// longer wanted."
#[tokio::test(start_paused = true)]
async fn a_cleared_signal_is_not_delivered_and_the_wait_times_out() {
    let Running {
        clock, rt, worker, ..
    } = running().await;
    rt.signal("stale", b"old".to_vec()).await.unwrap();
    assert!(rt.clear_signal("stale").await.unwrap());
    assert!(!rt.clear_signal("stale").await.unwrap());
    rt.submit(spec("to", "signal:stale:5000")).await.unwrap();
    until_step("waiting", &rt, "to", 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        rt.outcome(&rid("to")).await.unwrap().is_none(),
        "still waiting"
    );
    clock.advance(Duration::from_millis(5_001));
    let end = ends_within(&rt, "to", 10, "timed out").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"timed out".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "One waiter is allowed per correlation key; registering
// a second one fails that run".
#[tokio::test(start_paused = true)]
async fn a_second_waiter_on_a_key_fails_its_own_run() {
    let Running { rt, worker, .. } = running().await;
    rt.submit(spec("w1", "signal:shared")).await.unwrap();
    until_step("first waiter", &rt, "w1", 1).await;
    rt.submit(spec("w2", "signal:shared")).await.unwrap();
    let end = ends_within(&rt, "w2", 10, "second waiter").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(
        rt.status(&rid("w1")).await.unwrap().unwrap().state,
        RunState::Pending,
        "the first waiter still waits"
    );
    assert_eq!(
        rt.signal("shared", b"go".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = ends_within(&rt, "w1", 10, "first waiter").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"go".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Memo and KV effects.

// seed-lib.rs.txt: "An entry that fails to decode is treated as absent and
// is overwritten by the recomputed value; an error from the computation
// stores nothing."
#[tokio::test(start_paused = true)]
async fn memoized_recomputes_undecodable_entries_and_stores_nothing_on_error() {
    let (_queue, store, _clock) = memory_queue().await;
    let memos = MemoStore::new(store, MEMO_PREFIX);
    let memo = memos.new_memo(&rid("m"), 3);
    assert_eq!(memo.step_number(), Some(3));
    assert_eq!(memo.run_id(), &rid("m"));
    let failed: Result<u32, Error> = memo
        .memoized("k", async { Err(Error::RunNotFound(rid("m"))) })
        .await;
    assert!(failed.is_err());
    assert!(memo.get("k").await.unwrap().is_none(), "nothing stored");
    memo.put("k", b"\xc1 not msgpack").await.unwrap();
    let value: u32 = memo
        .memoized("k", async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(value, 7);
    let again: u32 = memo
        .memoized("k", async { Ok::<_, Error>(99) })
        .await
        .unwrap();
    assert_eq!(again, 7, "the recomputed value was stored");
    // content keys are scoped to (run, step)
    let key = taquba_workflow::Memo::content_key(&("op", 1)).unwrap();
    memo.content_put(&("op", 1), b"v").await.unwrap();
    assert_eq!(
        memo.get(&key).await.unwrap().as_deref(),
        Some(b"v".as_slice())
    );
    assert!(
        memos
            .new_memo(&rid("m"), 4)
            .content_get(&("op", 1))
            .await
            .unwrap()
            .is_none()
    );
}

// seed-lib.rs.txt: "Operations are validated as they are staged: the
// `workflow/` prefix ([`RESERVED_KV_PREFIX`]) is reserved for the runtime,
// values are capped at [`taquba::MAX_KV_VALUE_SIZE`] and a key cannot be
// staged for both a write and a delete within one step."
#[test]
fn staged_effects_are_validated_naming_the_key() {
    let fx = EffectsHandle::detached();
    let err = fx.put("workflow/runs/x", "v").unwrap_err();
    assert!(
        matches!(&err, Error::ReservedKvKey(k) if k == "workflow/runs/x"),
        "{err:?}"
    );
    assert!(err.to_string().contains("workflow/runs/x"), "{err}");
    assert!(matches!(
        fx.delete("workflow/x"),
        Err(Error::ReservedKvKey(_))
    ));
    assert!(
        fx.put("app/big", vec![0u8; taquba::MAX_KV_VALUE_SIZE + 1])
            .is_err()
    );
    assert!(
        fx.put("app/max", vec![0u8; taquba::MAX_KV_VALUE_SIZE])
            .is_ok()
    );
    fx.put("app/both", "v").unwrap();
    let err = fx.delete("app/both").unwrap_err();
    assert!(
        matches!(&err, Error::ConflictingKvEffect(k) if k == "app/both"),
        "{err:?}"
    );
    fx.delete("app/gone").unwrap();
    assert!(matches!(
        fx.put("app/gone", "v"),
        Err(Error::ConflictingKvEffect(k)) if k == "app/gone"
    ));
    let term = TerminalEffects::detached();
    assert!(matches!(
        term.put("workflow/t", "v"),
        Err(Error::ReservedKvKey(_))
    ));
}

// seed-lib.rs.txt: "[`Delivery::kv`] (a [`KvReadHandle`] exposing `get`
// only, answering from committed state, so effects staged by the running
// step are excluded)"; "No effects are applied when the runner returns a
// [`StepError`]"; and `EffectsSealed`: "An effect was staged through a
// handle whose step already returned".
#[tokio::test(start_paused = true)]
async fn kv_reads_exclude_staged_effects_and_a_retained_handle_is_sealed() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::default();
    let kept: Arc<Mutex<Option<EffectsHandle>>> = Arc::default();
    let (seen2, kept2) = (seen.clone(), kept.clone());
    let runner = FnRunner(move |step: Step| {
        let (seen, kept) = (seen2.clone(), kept2.clone());
        async move {
            step.effects.put(format!("app/{}", step.run_id), "staged")?;
            let read = step
                .kv
                .get(format!("app/{}", step.run_id).as_bytes())
                .await?;
            seen.lock().unwrap().push(read.map(|b| b.to_vec()));
            *kept.lock().unwrap() = Some(step.effects.clone());
            if step.payload == b"fail" {
                return Err(StepError::permanent("no"));
            }
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("kv-ok", "ok")).await.unwrap();
    ends_within(&rt, "kv-ok", 10, "kv-ok").await;
    rt.submit(spec("kv-fail", "fail")).await.unwrap();
    ends_within(&rt, "kv-fail", 10, "kv-fail").await;
    assert_eq!(*seen.lock().unwrap(), vec![None, None]);
    assert_eq!(
        queue.view().kv_get(b"app/kv-ok").await.unwrap().as_deref(),
        Some(b"staged".as_slice())
    );
    assert!(queue.view().kv_get(b"app/kv-fail").await.unwrap().is_none());
    let handle = kept.lock().unwrap().clone().unwrap();
    assert!(matches!(
        handle.put("app/late", "v"),
        Err(Error::EffectsSealed)
    ));
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`Delivery::run_memo`] is the run-scoped variant: one
// namespace shared by every step of the run, for values a later step reads
// back".
#[tokio::test(start_paused = true)]
async fn the_run_memo_is_shared_by_every_step_and_the_step_memo_is_not() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 {
            step.run_memo.put("journal", b"from 0").await?;
            step.memo.put("local", b"from 0").await?;
            return Ok(StepOutcome::continue_now(vec![]));
        }
        let journal = step.run_memo.get("journal").await?.unwrap_or_default();
        let local = step.memo.get("local").await?;
        Ok(StepOutcome::Succeed {
            result: [journal, local.unwrap_or_else(|| b"|none".to_vec())].concat(),
        })
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("memo", "x")).await.unwrap();
    let end = ends_within(&rt, "memo", 10, "memo").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"from 0|none".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "Step errors ([`StepError`]) are not recorded, so a
// retry still invokes the runner." (step-output replay)
#[tokio::test(start_paused = true)]
async fn step_output_replay_does_not_record_step_errors() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let runner = FnRunner(move |step: Step| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if step.attempts == 1 {
                return Err(StepError::transient("first"));
            }
            Ok(StepOutcome::Succeed {
                result: format!("call {n}").into_bytes(),
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .step_output_replay()
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("replay", "x")).await.unwrap();
    let end = ends_within(&rt, "replay", 10, "replay").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"call 1".as_slice())
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Retention.

// seed-lib.rs.txt: "[`WorkflowRuntime::run`] sweeps the markers on startup
// and at every poll interval, removing the memo entries, the step-output
// replay entries, the terminal record and the marker of every run whose
// marker is at least a window old."
#[tokio::test(start_paused = true)]
async fn memo_retention_removes_a_runs_state_a_window_after_its_end() {
    let (queue, store, clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        step.run_memo.put("note", b"kept").await?;
        Ok(StepOutcome::Succeed {
            result: b"r".to_vec(),
        })
    });
    let rt = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .memo_retention(Duration::from_secs(60))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("kept", "x")).await.unwrap();
    ends_within(&rt, "kept", 10, "kept").await;
    let memos = MemoStore::new(store, MEMO_PREFIX);
    clock.advance(Duration::from_secs(59));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        rt.status(&rid("kept")).await.unwrap().is_some(),
        "in window"
    );
    assert!(rt.outcome(&rid("kept")).await.unwrap().is_some());
    clock.advance(Duration::from_secs(2));
    eventually("swept", || async {
        rt.status(&rid("kept")).await.unwrap().is_none()
    })
    .await;
    assert!(rt.outcome(&rid("kept")).await.unwrap().is_none());
    assert!(
        memos
            .new_run_memo(&rid("kept"))
            .get("note")
            .await
            .unwrap()
            .is_none()
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Run groups.

// seed-group.rs.txt: "The run id of the member `key` of group `group_id`:
// the hex SHA-256 digest of `{group_id}/{key}`"; results "in completion
// order" with each member's `run_id`, `termination` and `outcome`.
#[tokio::test(start_paused = true)]
async fn group_members_run_under_their_digest_run_ids() {
    let Running { rt, worker, .. } = running().await;
    let group = rt.group(rid("g1"));
    assert_eq!(group.id(), &rid("g1"));
    let members = vec![
        member("a", "ok"),
        member("key with spaces/and:colons", "verdict"),
        member("", "hello"),
    ];
    group.submit(members, &RunOptions::default()).await.unwrap();
    let results = crate::fixtures::join_all(&group).await;
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r.run_id, member_run_id("g1", &r.key), "key {:?}", r.key);
        let o = r.outcome.as_ref().expect("a worker recorded it");
        assert_eq!(o.run_id, r.run_id);
        let status = rt.status(&r.run_id).await.unwrap().expect("member run");
        assert_eq!(terminated(&status.state), r.termination);
    }
    let by_key: HashMap<_, _> = results.iter().map(|r| (r.key.as_str(), r)).collect();
    assert_eq!(
        by_key["key with spaces/and:colons"]
            .termination
            .error
            .as_deref(),
        Some("refused")
    );
    assert_eq!(
        by_key[""].outcome.as_ref().unwrap().result.as_deref(),
        Some(b"hello".as_slice())
    );
    worker.shutdown().await.unwrap();
}

// seed-group.rs.txt: "Two members with one key are rejected with
// [`Error::DuplicateMemberKey`]", "a later one with a different member set
// is rejected with [`Error::GroupMismatch`]", "Returns
// [`Error::GroupNotFound`] for a group never submitted."
#[tokio::test(start_paused = true)]
async fn group_submission_errors_name_the_key_and_the_group() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let group = rt.group(rid("g2"));
    let err = group
        .submit(
            vec![member("x", "ok"), member("x", "ok")],
            &RunOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateMemberKey(k) if k == "x"),
        "{err:?}"
    );
    assert!(err.to_string().contains('x'), "{err}");
    assert!(
        matches!(group.status().await, Err(Error::GroupNotFound(id)) if id == "g2"),
        "a rejected submission writes nothing"
    );
    assert!(matches!(group.results().await, Err(Error::GroupNotFound(id)) if id == "g2"));
    assert!(matches!(
        group.resume(&RunOptions::default()).await,
        Err(Error::GroupNotFound(id)) if id == "g2"
    ));
    group
        .submit(vec![member("x", "wait")], &RunOptions::default())
        .await
        .unwrap();
    let err = group
        .submit(vec![member("x", "other")], &RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::GroupMismatch(id) if id == "g2"),
        "{err:?}"
    );
    assert!(err.to_string().contains("g2"), "{err}");
}

// seed-group.rs.txt: `a_group_cancellation_records_the_member_cancelled`:
// cancel returns 1 then 0 ("no member is active"); the member's termination
// is `{ Cancelled, error: None, error_kind: None, final_step: 0,
// terminated_at_ms: now }` with `outcome: None`; after a re-submission, "a
// plain submission of the same run id" with the same input returns
// `newly_submitted == false`.
#[tokio::test(start_paused = true)]
async fn a_cancelled_member_is_recorded_cancelled_without_an_outcome() {
    let (queue, store, clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let group = rt.group(rid("g3"));
    group
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    clock.advance(Duration::from_millis(42));
    assert_eq!(group.cancel().await.unwrap(), 1);
    assert_eq!(group.cancel().await.unwrap(), 0);
    let results = crate::fixtures::join_all(&group).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].run_id, member_run_id("g3", "a"));
    assert_eq!(
        results[0].termination,
        RunTermination {
            status: TerminalStatus::Cancelled,
            error: None,
            error_kind: None,
            final_step: 0,
            terminated_at_ms: T0 + 42,
        }
    );
    assert!(results[0].outcome.is_none());
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending, status.cancelled), (1, 0, 1));
}

// seed-group.rs.txt: "The cancelled member is submitted again; a member is
// grouped by its key, so a plain submission of the same run id is not."
// followed by `assert!(!plain.newly_submitted)` on an `Ok` submission.
#[tokio::test(start_paused = true)]
async fn a_plain_submission_of_an_active_members_run_id_is_a_duplicate() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let group = rt.group(rid("g4"));
    group
        .submit(vec![member("a", "a")], &RunOptions::default())
        .await
        .unwrap();
    let plain = rt
        .submit(RunSpec {
            run_id: Some(member_run_id("g4", "a")),
            input: b"a".to_vec(),
            ..Default::default()
        })
        .await;
    match plain {
        Ok(outcome) => assert!(!outcome.newly_submitted),
        Err(err) => panic!("the duplicate was refused: {err}"),
    }
    // The member is still the group's; another input under its id is
    // refused, naming the group and the key.
    assert_eq!(group.status().await.unwrap().total, 1);
    let other = rt
        .submit(RunSpec {
            run_id: Some(member_run_id("g4", "a")),
            input: b"another".to_vec(),
            ..Default::default()
        })
        .await;
    assert!(
        matches!(&other, Err(Error::GroupMemberRunId { key, .. }) if key == "a"),
        "{other:?}"
    );
}

// seed-lib.rs.txt: "A second submission of the same set, or
// [`RunGroup::resume`] from the manifest alone, runs again only the members
// that did not succeed"; `GroupStatus` counts "by state".
#[tokio::test(start_paused = true)]
async fn a_group_runs_again_only_the_members_that_did_not_succeed() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("g5"));
    let members = vec![
        member("good", "ok"),
        member("bad", "verdict"),
        member("broken", "perm"),
        member("stop", "cancel"),
    ];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    crate::fixtures::join_all(&group).await;
    let status = group.status().await.unwrap();
    assert_eq!(
        status,
        taquba_workflow::GroupStatus {
            group_id: rid("g5"),
            total: 4,
            pending: 0,
            succeeded: 1,
            failed: 2,
            cancelled: 1,
        }
    );
    group.resume(&RunOptions::default()).await.unwrap();
    let again = crate::fixtures::join_all(&group).await;
    crate::fixtures::assert_each_member_once(&again, &members, "second round");
    let count = |key: &str| runner.calls_of(member_run_id("g5", key).as_str());
    assert_eq!(count("good"), 1, "a success is not run again");
    assert_eq!(count("bad"), 2);
    assert_eq!(count("broken"), 2);
    assert_eq!(count("stop"), 2);
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`WorkflowRuntimeBuilder::group_retention`] removes it a
// window after a [`RunGroup::results`] consumer observed the last
// termination ...; a group whose results are never consumed is retained
// until it is forgotten."
#[tokio::test(start_paused = true)]
async fn group_retention_removes_consumed_groups_only() {
    let (queue, store, clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default())
        .group_retention(Duration::from_secs(60))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let consumed = rt.group(rid("consumed"));
    let ignored = rt.group(rid("ignored"));
    consumed
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    ignored
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    crate::fixtures::join_all(&consumed).await;
    let member_a = member_run_id("ignored", "a");
    until_terminated("ignored member", &rt, member_a.as_str()).await;
    clock.advance(Duration::from_secs(61));
    eventually("consumed group swept", || async {
        matches!(consumed.status().await, Err(Error::GroupNotFound(_)))
    })
    .await;
    assert!(
        rt.status(&member_run_id("consumed", "a"))
            .await
            .unwrap()
            .is_none(),
        "nothing of the member remains"
    );
    assert_eq!(ignored.status().await.unwrap().succeeded, 1);
    ignored.forget().await.unwrap();
    assert!(matches!(
        ignored.status().await,
        Err(Error::GroupNotFound(_))
    ));
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Typed jobs.

#[derive(Debug, thiserror::Error)]
#[error("job failed: {0}")]
struct JobFailure(String);

#[derive(Clone, Default)]
struct JobCalls(Arc<Mutex<HashMap<String, u32>>>);

impl JobCalls {
    fn hit(&self, label: &str) {
        *self.0.lock().unwrap().entry(label.to_string()).or_default() += 1;
    }
    fn of(&self, label: &str) -> u32 {
        self.0.lock().unwrap().get(label).copied().unwrap_or(0)
    }
}

/// A job scripted by its `mode`: `ok` returns the label's length,
/// `transient` / `permanent` fail, `hold` waits an hour.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Scripty {
    label: String,
    mode: String,
    key: Option<String>,
    attempts: Option<u32>,
}

impl Scripty {
    fn new(label: &str, mode: &str) -> Self {
        Self {
            label: label.into(),
            mode: mode.into(),
            key: None,
            attempts: None,
        }
    }
}

impl Job for Scripty {
    const NAME: &'static str = "seed.scripty";
    type Output = usize;
    type Error = JobFailure;

    async fn run(&self, ctx: JobContext<'_>) -> Result<usize, JobFailure> {
        ctx.state::<JobCalls>().hit(&self.label);
        match self.mode.as_str() {
            "ok" => Ok(self.label.len()),
            "memo" => {
                ctx.run_memo
                    .put("note", self.label.as_bytes())
                    .await
                    .map_err(|e| JobFailure(e.to_string()))?;
                Ok(1)
            }
            "once" if ctx.state::<JobCalls>().of(&self.label) == 1 => {
                Err(JobFailure(format!("{} first call", self.label)))
            }
            "once" => Ok(2),
            "hold" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(0)
            }
            other => Err(JobFailure(format!(
                "{} {} #{}",
                self.label, other, ctx.attempts
            ))),
        }
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }

    fn max_attempts(&self) -> Option<u32> {
        self.attempts
    }

    fn classify(&self, _error: &JobFailure) -> StepErrorKind {
        if self.mode == "permanent" || self.mode == "once" {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        }
    }
}

async fn job_runner() -> (JobRunner, JobCalls, Arc<taquba::Queue>) {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = JobRunner::builder(queue.clone(), store)
        .register::<Scripty>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(20))
        .build();
    (runner, calls, queue)
}

// jobs.md: "With a key, the job id (its run id) is the hex SHA-256 digest of
// the key."; "Before the first submission terminates, a second one with the
// same key returns a handle to the job in flight with `newly_submitted() ==
// false`; a different payload under the same key fails with
// `Error::InputMismatch`."
#[tokio::test(start_paused = true)]
async fn a_keyed_job_runs_under_the_keys_digest_and_collapses_duplicates() {
    let (runner, _calls, _queue) = job_runner().await;
    let mut job = Scripty::new("keyed", "ok");
    job.key = Some("order:7".into());
    let first = runner.submit(job.clone()).await.unwrap();
    assert!(first.newly_submitted());
    assert_eq!(first.id().as_str(), hex_sha256("order:7"));
    let second = runner.submit(job.clone()).await.unwrap();
    assert!(!second.newly_submitted());
    assert_eq!(second.id(), first.id());
    let mut other = job.clone();
    other.label = "different".into();
    let err = runner.submit(other).await.unwrap_err();
    assert!(
        matches!(&err, Error::InputMismatch(id) if *id == *first.id()),
        "{err:?}"
    );
}

// jobs.md: "After it terminates, a re-submission with the same payload
// returns a handle to the recorded termination without running the job
// again (success, failure or cancellation alike); a different payload fails
// with `Error::InputMismatch`."
#[tokio::test(start_paused = true)]
async fn a_terminated_keyed_job_answers_from_its_record() {
    let (runner, calls, _queue) = job_runner().await;
    let worker = runner.spawn(std::future::pending::<()>());
    let mut ok = Scripty::new("k-ok", "ok");
    ok.key = Some("k-ok".into());
    let mut bad = Scripty::new("k-bad", "permanent");
    bad.key = Some("k-bad".into());
    assert_eq!(
        within(10, runner.submit(ok.clone()).await.unwrap().into_future())
            .await
            .unwrap(),
        4
    );
    let failed = within(10, runner.submit(bad.clone()).await.unwrap().join())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(failed.kind, StepErrorKind::Permanent);

    let again = runner.submit(ok.clone()).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(within(10, again.join()).await.unwrap().unwrap(), 4);
    let again_bad = runner.submit(bad.clone()).await.unwrap();
    assert!(!again_bad.newly_submitted());
    assert_eq!(
        within(10, again_bad.join())
            .await
            .unwrap()
            .unwrap_err()
            .message,
        failed.message
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!((calls.of("k-ok"), calls.of("k-bad")), (1, 1));
    ok.label = "k-ok-changed".into();
    assert!(matches!(
        runner.submit(ok).await,
        Err(Error::InputMismatch(_))
    ));
    worker.shutdown().await.unwrap();
}

// jobs.md: "`JobError { kind, message }` ...: `message` is the `Display` of
// `Job::Error`, `kind` its classification."; "`Job::classify` (default:
// transient) decides retry-with-backoff up to the attempt limit versus an
// immediate dead-letter; `Job::max_attempts` overrides the queue's attempt
// limit for that type".
#[tokio::test(start_paused = true)]
async fn job_errors_carry_display_and_classification_and_honour_attempt_limits() {
    let (runner, calls, _queue) = job_runner().await;
    let worker = runner.spawn(std::future::pending::<()>());
    let perm = runner.submit(Scripty::new("p", "permanent")).await.unwrap();
    let err: JobError = within(10, perm.join()).await.unwrap().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Permanent);
    assert_eq!(err.message, "job failed: p permanent #1");
    assert_eq!(calls.of("p"), 1);

    let default_limit = runner
        .submit(Scripty::new("t3", "transient"))
        .await
        .unwrap();
    let err = within(30, default_limit.join()).await.unwrap().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Transient);
    assert_eq!(err.message, "job failed: t3 transient #3");
    assert_eq!(calls.of("t3"), 3, "the queue's limit");

    let mut five = Scripty::new("t5", "transient");
    five.attempts = Some(5);
    let err = within(30, runner.submit(five).await.unwrap().join())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.message, "job failed: t5 transient #5");
    assert_eq!(calls.of("t5"), 5, "the job's own limit");
    worker.shutdown().await.unwrap();
}

// jobs.md: "A job cancelled or terminated outside its handler reports
// `StepErrorKind::Transient`."; "`fetch_result` ... (`Ok(None)` while the
// job runs ...)".
#[tokio::test(start_paused = true)]
async fn a_cancelled_job_reports_a_transient_job_error() {
    let (runner, _calls, _queue) = job_runner().await;
    let group = runner.group::<Scripty>(rid("jg-cancel"));
    group.submit(vec![Scripty::new("c", "ok")]).await.unwrap();
    let handle_id = member_run_id("jg-cancel", "item-0");
    assert!(
        runner.view().status(&handle_id).await.unwrap().is_some(),
        "item-0 is the positional key"
    );
    assert_eq!(group.cancel().await.unwrap(), 1);
    let results = within(10, group.join()).await.unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].key, "item-0");
    let err = results[0].result.as_ref().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Transient);
}

// jobs.md: "`fetch_result` reads the durable record and works after a
// restart (`Ok(None)` while the job runs ...)"; `JobHandle::status`.
#[tokio::test(start_paused = true)]
async fn fetch_result_is_none_while_the_job_is_pending() {
    let (runner, _calls, _queue) = job_runner().await;
    let handle = runner.submit(Scripty::new("later", "ok")).await.unwrap();
    assert!(handle.fetch_result().await.unwrap().is_none());
    let status = handle.status().await.unwrap().expect("submitted");
    assert_eq!(status.state, RunState::Pending);
    assert!(
        handle
            .join_timeout(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none()
    );
    let worker = runner.spawn(std::future::pending::<()>());
    assert_eq!(within(10, handle.join()).await.unwrap().unwrap(), 5);
    assert_eq!(handle.fetch_result().await.unwrap().unwrap().unwrap(), 5);
    worker.shutdown().await.unwrap();
}

// jobs.md: "`JobRunner` owns a `WorkflowRuntime` over one `taquba::Queue`.
// Default queue name `"jobs"`".
#[tokio::test(start_paused = true)]
async fn jobs_are_enqueued_on_the_jobs_queue_by_default() {
    let (runner, _calls, queue) = job_runner().await;
    runner.submit(Scripty::new("q", "ok")).await.unwrap();
    assert_eq!(queue.view().stats("jobs").await.unwrap().pending, 1);
    assert_eq!(queue.view().stats(STEPS).await.unwrap().pending, 0);
}

// jobs.md: "A step whose name has no registered handler fails permanently
// with an error that names the unknown type."
#[tokio::test(start_paused = true)]
async fn a_job_of_an_unregistered_type_fails_permanently_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = JobRunner::builder(queue, store)
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner.submit(Scripty::new("u", "ok")).await.unwrap();
    let err = within(10, handle.join()).await.unwrap().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Permanent);
    assert!(err.message.contains("seed.scripty"), "{}", err.message);
    worker.shutdown().await.unwrap();
}

/// A second type under `Scripty`'s name.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Impostor;

impl Job for Impostor {
    const NAME: &'static str = "seed.scripty";
    type Output = ();
    type Error = JobFailure;
    async fn run(&self, _ctx: JobContext<'_>) -> Result<(), JobFailure> {
        Ok(())
    }
}

// jobs.md: "registering two types with one `NAME` panics with a message
// naming the duplicate."
#[tokio::test(start_paused = true)]
async fn registering_two_types_under_one_name_panics_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let builder = JobRunner::builder(queue, store).register::<Scripty>();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder.register::<Impostor>()
    }))
    .expect_err("a duplicate name panics");
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(message.contains("seed.scripty"), "{message}");
}

// jobs.md: "Members are keyed by the job's idempotency key, else `item-{i}`
// by position. `join` returns every member's `GroupResult { key, result }`
// in submission order"; partial failure is per member.
#[tokio::test(start_paused = true)]
async fn a_job_group_joins_in_submission_order_with_per_member_results() {
    let (runner, _calls, _queue) = job_runner().await;
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Scripty>(rid("jg"));
    let mut keyed = Scripty::new("keyed-member", "ok");
    keyed.key = Some("my-key".into());
    group
        .submit(vec![
            Scripty::new("zzzz", "ok"),
            Scripty::new("broken", "permanent"),
            keyed,
            Scripty::new("a", "ok"),
        ])
        .await
        .unwrap();
    let results = within(30, group.join()).await.unwrap();
    let keys: Vec<&str> = results.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["item-0", "item-1", "my-key", "item-3"]);
    assert_eq!(results[0].result.as_ref().unwrap(), &4);
    assert_eq!(
        results[1].result.as_ref().unwrap_err().kind,
        StepErrorKind::Permanent
    );
    assert_eq!(results[2].result.as_ref().unwrap(), &12);
    assert_eq!(results[3].result.as_ref().unwrap(), &1);
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded, status.failed), (4, 3, 1));
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// `#[job]` and `#[workflow]`.

/// Doubles a number, once per key.
#[taquba_workflow::job(name = "seed.double", key = "double:{n}")]
async fn double(ctx: JobContext<'_>, n: u64) -> Result<u64, JobFailure> {
    ctx.state::<JobCalls>().hit("double");
    Ok(n * 2)
}

// design.md: "`#[job]` on an async fn makes a typed job from it ...
// generated: a `SendEmail { to, subject }` struct ..., `impl Job for
// SendEmail` calling the fn"; jobs.md: with a key, the run id is the hex
// SHA-256 of the key.
#[tokio::test(start_paused = true)]
async fn a_job_fn_runs_as_its_generated_struct_under_its_key() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = JobRunner::builder(queue, store)
        .register::<Double>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(20))
        .build();
    assert_eq!(<Double as Job>::NAME, "seed.double");
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner.submit(Double { n: 21 }).await.unwrap();
    assert_eq!(handle.id().as_str(), hex_sha256("double:21"));
    assert_eq!(within(10, handle.clone().into_future()).await.unwrap(), 42);
    let again = runner.submit(Double { n: 21 }).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(within(10, again.into_future()).await.unwrap(), 42);
    assert_eq!(calls.of("double"), 1);
    worker.shutdown().await.unwrap();
}

/// A two-step workflow: `count` continues to `finish`, or fails / cancels.
#[derive(Default)]
pub struct Tally2;

#[taquba_workflow::workflow(name = "seed.tally", output = u32)]
impl Tally2 {
    #[step(start)]
    async fn count(
        n: u32,
    ) -> Result<taquba_workflow::workflows::Transition<Tally2Step>, StepError> {
        use taquba_workflow::workflows::Transition;
        match n {
            0 => Ok(Transition::fail("zero")),
            1 => Ok(Transition::cancel("one")),
            _ => Ok(Transition::next(Tally2Step::Finish { total: n * 10 })),
        }
    }

    #[step]
    async fn finish(
        total: u32,
    ) -> Result<taquba_workflow::workflows::Transition<Tally2Step>, StepError> {
        Ok(taquba_workflow::workflows::Transition::done(total + 1))
    }
}

// design.md: "`#[workflow]` turns a multi-step process into an enum state
// machine: ... typed transitions (...; done with a typed output; fail;
// cancel), a typed submit and a typed result reader"; seed-worker.rs.txt: a
// `Fail` verdict is `Permanent` and a cancel carries its reason.
#[tokio::test(start_paused = true)]
async fn a_workflow_enum_runs_its_steps_and_reports_typed_results() {
    use taquba_workflow::workflows::Workflow;
    let (queue, store, _clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(queue, store, Tally2, NoopTerminalHook)
        .poll_interval(Duration::from_millis(20))
        .build();
    assert_eq!(<Tally2 as Workflow>::NAME, "seed.tally");
    assert_eq!(<Tally2 as Workflow>::STEPS, ["count", "finish"]);
    let worker = rt.spawn(std::future::pending::<()>());
    let ok = rt.start(Tally2Input { n: 4 }).await.unwrap();
    assert_eq!(within(10, ok.into_future()).await.unwrap().unwrap(), 41);
    let failed = within(
        10,
        rt.start(Tally2Input { n: 0 }).await.unwrap().into_future(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(failed.status, TerminalStatus::Failed);
    assert_eq!(failed.kind, Some(StepErrorKind::Permanent));
    assert_eq!(failed.message.as_deref(), Some("zero"));
    let cancelled = within(
        10,
        rt.start(Tally2Input { n: 1 }).await.unwrap().into_future(),
    )
    .await
    .unwrap()
    .unwrap_err();
    assert_eq!(cancelled.status, TerminalStatus::Cancelled);
    assert_eq!(cancelled.message.as_deref(), Some("one"));
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Second round: terminations outside the worker, options across steps,
// headers, signals on redelivery, jobs across cancellation and retention.

// seed-lib.rs.txt: "The worker reconciles them: whenever the queue's dead
// count changes it terminates every run whose dead step job still has a
// run record, as `Failed` with the queue record's last error, enqueueing
// the notification in the same transaction."; seed-group.rs.txt expects
// `error_kind: None` and no outcome for such a termination.
#[tokio::test(start_paused = true)]
async fn a_step_dead_lettered_outside_the_worker_is_reconciled_as_failed() {
    let (queue, store, clock) = memory_queue().await;
    let hook = Recorder::default();
    let rt = hooked(&queue, store, hook.clone());
    rt.submit(spec("hung", "ok")).await.unwrap();
    let claim = claim_step(&queue).await.expect("step 0");
    queue.dead_letter(&claim, "hung up").await.unwrap();
    clock.advance(Duration::from_secs(1));
    let worker = rt.spawn(std::future::pending::<()>());
    let end = ends_within(&rt, "hung", 10, "reconciled").await;
    assert_eq!(
        end.termination,
        RunTermination {
            status: TerminalStatus::Failed,
            error: Some("hung up".into()),
            error_kind: None,
            final_step: 0,
            terminated_at_ms: T0 + 1000,
        }
    );
    assert!(end.outcome.is_none(), "no worker recorded an outcome");
    eventually("the hook ran", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "one notification");
    assert_eq!(calls[0].status, TerminalStatus::Failed);
    assert_eq!(calls[0].error.as_deref(), Some("hung up"));
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`TerminalHook::on_termination`] processes a run's
// termination ..., receiving the submitter's headers"; "Runs terminated
// without an acknowledging settlement (an external cancellation of a
// pending step, ...) settle their notification the same way".
#[tokio::test(start_paused = true)]
async fn the_hook_of_a_run_cancelled_while_pending_receives_the_submitters_headers() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let rt = hooked(&queue, store, hook.clone());
    let mut s = spec("hdr-cancel", "ok");
    s.options
        .headers
        .insert("tenant".to_string(), "acme".to_string());
    rt.submit(s).await.unwrap();
    assert!(rt.cancel(&rid("hdr-cancel")).await.unwrap());
    let worker = rt.spawn(std::future::pending::<()>());
    eventually("the hook ran", || async { !hook.calls().is_empty() }).await;
    let calls = hook.calls();
    assert_eq!(calls[0].status, TerminalStatus::Cancelled);
    assert_eq!(
        calls[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "the [`RunOptions`] of its steps (`headers`, a
// `priority` and `max_attempts_per_step` overriding the queue's defaults for
// every step".
#[tokio::test(start_paused = true)]
async fn priority_and_attempt_limit_apply_to_every_step_of_a_run() {
    let (queue, store, clock) = memory_queue().await;
    let seen: Arc<Mutex<Vec<(u32, u32, u32)>>> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock()
                .unwrap()
                .push((step.step_number, step.attempts, step.max_attempts));
            match step.step_number {
                0 => Ok(StepOutcome::continue_after(vec![], Duration::from_secs(1))),
                _ => Err(StepError::transient("step 1 flaky")),
            }
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let mut s = spec("opts", "x");
    s.options.priority = Some(7);
    s.options.max_attempts_per_step = Some(5);
    rt.submit(s).await.unwrap();
    let worker = rt.spawn(std::future::pending::<()>());
    until_step("step 1 scheduled", &rt, "opts", 1).await;
    let current = rt.submit(spec("opts", "x")).await.unwrap();
    let record = job_record(&queue, &current.job_id, "step 1's job").await;
    assert_eq!(record.priority, 7);
    assert_eq!(record.max_attempts, 5);
    clock.advance(Duration::from_secs(1));
    let end = ends_within(&rt, "opts", 30, "step 1 exhausted").await;
    assert_eq!(end.termination.final_step, 1);
    let step1: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(step, _, _)| *step == 1)
        .copied()
        .collect();
    assert_eq!(step1.len(), 5, "{step1:?}");
    assert!(step1.iter().all(|(_, _, max)| *max == 5));
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "the woken step can be redelivered and observes the same
// [`Step::signal`] value on every attempt."
#[tokio::test(start_paused = true)]
async fn a_woken_step_sees_the_same_signal_on_every_attempt() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Arc<Mutex<Vec<Option<Vec<u8>>>>> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            if step.step_number == 0 {
                return Ok(StepOutcome::continue_on_signal(
                    vec![],
                    "redeliver",
                    Duration::from_secs(3600),
                ));
            }
            log.lock().unwrap().push(step.signal.clone());
            if step.attempts == 1 {
                return Err(StepError::transient("again"));
            }
            Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_default(),
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("redeliver", "x")).await.unwrap();
    until_step("waiting", &rt, "redeliver", 1).await;
    assert_eq!(
        rt.signal("redeliver", b"payload".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = ends_within(&rt, "redeliver", 10, "redelivered").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![Some(b"payload".to_vec()), Some(b"payload".to_vec())]
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "A signal with no registered waiter is buffered" — a wait
// that timed out is no longer a waiter.
#[tokio::test(start_paused = true)]
async fn a_signal_after_the_wait_timed_out_is_buffered() {
    let Running {
        clock, rt, worker, ..
    } = running().await;
    rt.submit(spec("late-sig", "signal:late:1000"))
        .await
        .unwrap();
    until_step("waiting", &rt, "late-sig", 1).await;
    clock.advance(Duration::from_millis(1001));
    ends_within(&rt, "late-sig", 10, "timed out").await;
    assert_eq!(
        rt.signal("late", b"x".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    assert!(rt.clear_signal("late").await.unwrap());
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "a `run_at` before which the first step is not
// claimable".
#[tokio::test(start_paused = true)]
async fn run_at_defers_the_first_step_on_the_queues_clock() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Scripted::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("later", "ok");
    s.options.run_at = Some(std::time::UNIX_EPOCH + Duration::from_millis(T0 + 10_000));
    rt.submit(s).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(runner.calls_of("later"), 0);
    assert_eq!(
        rt.status(&rid("later")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    clock.advance(Duration::from_secs(10));
    let end = ends_within(&rt, "later", 10, "deferred").await;
    assert_eq!(end.termination.terminated_at_ms, T0 + 10_000);
    worker.shutdown().await.unwrap();
}

// seed-worker.rs.txt: "Submitter-supplied headers, without the reserved
// `workflow.` keys" on the delivery and the outcome; seed-group.rs.txt: "the
// run options apply to every member".
#[tokio::test(start_paused = true)]
async fn group_members_see_only_the_submitters_headers() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Arc<Mutex<Vec<HashMap<String, String>>>> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(step.headers.clone());
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("hdr-group"));
    let options = RunOptions {
        headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
        ..Default::default()
    };
    group
        .submit(vec![member("a", "x"), member("b", "y")], &options)
        .await
        .unwrap();
    let end = within(10, rt.wait(&member_run_id("hdr-group", "a")))
        .await
        .unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let results = crate::fixtures::join_all(&group).await;
    let expected = HashMap::from([("tenant".to_string(), "acme".to_string())]);
    for r in &results {
        assert_eq!(r.outcome.as_ref().unwrap().headers, expected, "{}", r.key);
    }
    for headers in seen.lock().unwrap().iter() {
        assert_eq!(headers, &expected);
    }
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "a ULID is generated when absent"; seed-group:
// `new_group` gives a fresh group id.
#[tokio::test(start_paused = true)]
async fn generated_run_and_group_ids_are_ulids() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let a = rt
        .submit(RunSpec {
            input: b"wait".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let b = rt
        .submit(RunSpec {
            input: b"wait".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(a.newly_submitted && b.newly_submitted);
    assert_ne!(a.run_id, b.run_id);
    for id in [&a.run_id, &b.run_id, rt.new_group().id()] {
        assert!(ulid::Ulid::from_string(id.as_str()).is_ok(), "{id}");
    }
}

// seed-lib.rs.txt: the `workflow/` prefix is "reserved for the runtime"
// (for `RunSpec::effects` too: `ReservedKvKey` "An application KV effect
// names a key under the reserved prefix"); "submission rejects user headers
// starting with it" (an enqueue of the hook's effects included).
#[tokio::test(start_paused = true)]
async fn reserved_keys_and_headers_in_effects_are_refused_naming_them() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();
    let mut s = spec("evil", "ok");
    s.effects = SettlementEffects::default().kv_put("workflow/runs/evil", "x");
    let err = rt.submit(s).await.unwrap_err();
    assert!(
        matches!(&err, Error::ReservedKvKey(k) if k == "workflow/runs/evil"),
        "{err:?}"
    );
    assert!(rt.status(&rid("evil")).await.unwrap().is_none());
    let fx = TerminalEffects::detached();
    let err = fx
        .enqueue(taquba::EnqueueRequest {
            queue: "elsewhere".into(),
            payload: vec![],
            options: taquba::EnqueueOptions {
                headers: HashMap::from([("workflow.step".to_string(), "0".to_string())]),
                ..Default::default()
            },
        })
        .unwrap_err();
    assert!(
        matches!(&err, Error::ReservedHeaderInSubmit(h) if h == "workflow.step"),
        "{err:?}"
    );
}

// seed-lib.rs.txt: "When retention is set, the same transaction writes a
// terminal marker ..., so the marker exists exactly when the run's
// terminal outcome committed" — a cancelled pending step too.
#[tokio::test(start_paused = true)]
async fn memo_retention_sweeps_a_run_cancelled_while_pending() {
    let (queue, store, clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default())
        .memo_retention(Duration::from_secs(60))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("swept-cancel", "ok");
    s.options.run_at = Some(std::time::UNIX_EPOCH + Duration::from_millis(T0 + 3_600_000));
    rt.submit(s).await.unwrap();
    assert!(rt.cancel(&rid("swept-cancel")).await.unwrap());
    assert!(rt.status(&rid("swept-cancel")).await.unwrap().is_some());
    clock.advance(Duration::from_secs(61));
    eventually("swept", || async {
        rt.status(&rid("swept-cancel")).await.unwrap().is_none()
    })
    .await;
    worker.shutdown().await.unwrap();
}

// jobs.md: "After it terminates, a re-submission with the same payload
// returns a handle to the recorded termination without running the job
// again (success, failure or cancellation alike)"; "A job cancelled ...
// reports `StepErrorKind::Transient`."
#[tokio::test(start_paused = true)]
async fn a_cancelled_keyed_job_answers_its_cancellation_on_resubmission() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Scripty>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(20))
        .build();
    let mut job = Scripty::new("cancel-me", "ok");
    job.key = Some("cancel-me".into());
    let handle = runner.submit(job.clone()).await.unwrap();
    // A runtime over the jobs' queue cancels the pending job's run.
    let operator = WorkflowRuntime::builder(queue, store, Scripted::default(), NoopTerminalHook)
        .queue_name("jobs")
        .build();
    assert!(operator.cancel(handle.id()).await.unwrap());
    let worker = runner.spawn(std::future::pending::<()>());
    let err = within(10, handle.join()).await.unwrap().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Transient);
    let again = runner.submit(job).await.unwrap();
    assert!(!again.newly_submitted());
    let err = within(10, again.join()).await.unwrap().unwrap_err();
    assert_eq!(err.kind, StepErrorKind::Transient);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(calls.of("cancel-me"), 0, "never ran");
    worker.shutdown().await.unwrap();
}

// jobs.md: "Once retention has removed the terminal record, the same key
// runs the job again."; "`JobRunnerBuilder::retention(window)` is the
// runtime's memo retention".
#[tokio::test(start_paused = true)]
async fn a_keyed_job_runs_again_once_retention_removed_its_record() {
    let (queue, store, clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = JobRunner::builder(queue, store)
        .register::<Scripty>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(20))
        .retention(Duration::from_secs(60))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let mut job = Scripty::new("retained", "ok");
    job.key = Some("retained".into());
    let first = runner.submit(job.clone()).await.unwrap();
    assert_eq!(within(10, first.join()).await.unwrap().unwrap(), 8);
    clock.advance(Duration::from_secs(61));
    eventually("the record is swept", || async {
        first.fetch_result().await.unwrap().is_none()
    })
    .await;
    let second = runner.submit(job).await.unwrap();
    assert!(second.newly_submitted());
    assert_eq!(within(10, second.join()).await.unwrap().unwrap(), 8);
    assert_eq!(calls.of("retained"), 2);
    worker.shutdown().await.unwrap();
}

// jobs.md: "Default queue name `\"jobs\"`; the memo prefix defaults to
// `\"{queue_name}-memo\"` as for the runtime"; `JobContext` dereferences to
// the step's `Delivery` (run memo included).
#[tokio::test(start_paused = true)]
async fn a_jobs_memo_lives_under_the_queue_names_memo_prefix() {
    for queue_name in [None, Some("custom")] {
        let (queue, store, _clock) = memory_queue().await;
        let mut builder = JobRunner::builder(queue, store.clone())
            .register::<Scripty>()
            .state(JobCalls::default())
            .poll_interval(Duration::from_millis(20));
        if let Some(name) = queue_name {
            builder = builder.queue_name(name);
        }
        let runner = builder.build();
        let worker = runner.spawn(std::future::pending::<()>());
        let handle = runner.submit(Scripty::new("noted", "memo")).await.unwrap();
        assert_eq!(within(10, handle.join()).await.unwrap().unwrap(), 1);
        let prefix = format!("{}-memo", queue_name.unwrap_or("jobs"));
        let memo = MemoStore::new(store, prefix.clone()).new_run_memo(handle.id());
        assert_eq!(
            memo.get("note").await.unwrap().as_deref(),
            Some(b"noted".as_slice()),
            "under {prefix}"
        );
        worker.shutdown().await.unwrap();
    }
}

// jobs.md: "`submit`, `submit_with`, `resume`, ... behave as the run
// group's (a second submission of the same set runs again only the members
// that did not succeed)."
#[tokio::test(start_paused = true)]
async fn a_job_group_submitted_again_reruns_only_failed_members() {
    let (runner, calls, _queue) = job_runner().await;
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Scripty>(rid("jg-again"));
    let jobs = vec![Scripty::new("steady", "ok"), Scripty::new("shaky", "once")];
    group.submit(jobs.clone()).await.unwrap();
    let first = within(10, group.join()).await.unwrap();
    assert!(first[0].result.is_ok());
    assert_eq!(
        first[1].result.as_ref().unwrap_err().message,
        "job failed: shaky first call"
    );
    group.submit(jobs).await.unwrap();
    let second = within(10, group.join()).await.unwrap();
    assert_eq!(second[1].result.as_ref().unwrap(), &2);
    assert_eq!((calls.of("steady"), calls.of("shaky")), (1, 2));
    let streamed: Vec<_> = within(10, async {
        futures_util::TryStreamExt::try_collect::<Vec<_>>(group.results().await.unwrap()).await
    })
    .await
    .unwrap();
    assert_eq!(streamed.len(), 2);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Third round: memo sharing across runs of one id, clocks, bad input.

/// Step 0 memoizes a "paid call" (counted) and then fails with a verdict on
/// the first run of each run id and succeeds on later runs.
#[derive(Clone, Default)]
struct PaidOnce {
    paid: Arc<AtomicU32>,
    runs: Arc<Mutex<HashMap<String, u32>>>,
}

impl StepRunner for PaidOnce {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let paid = self.paid.clone();
        let receipt: String = step
            .memo
            .memoized("paid", async move {
                let n = paid.fetch_add(1, Ordering::SeqCst);
                Ok::<_, StepError>(format!("receipt {n}"))
            })
            .await?;
        let run = {
            let mut runs = self.runs.lock().unwrap();
            let n = runs.entry(step.run_id.to_string()).or_default();
            *n += 1;
            *n
        };
        if run == 1 {
            return Ok(StepOutcome::Fail {
                reason: "first run fails".into(),
            });
        }
        Ok(StepOutcome::Succeed {
            result: receipt.into_bytes(),
        })
    }
}

// seed-lib.rs.txt: "entries are addressed by run id, and a terminated run
// releases its id, so a second run submitted under that id shares the
// first run's entries".
#[tokio::test(start_paused = true)]
async fn a_second_run_under_a_released_id_shares_the_first_runs_memo() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = PaidOnce::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("paid", "x")).await.unwrap();
    let end = ends_within(&rt, "paid", 10, "first run").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert!(rt.submit(spec("paid", "x")).await.unwrap().newly_submitted);
    let end = ends_within(&rt, "paid", 10, "second run").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"receipt 0".as_slice())
    );
    assert_eq!(runner.paid.load(Ordering::SeqCst), 1, "the call ran once");
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "A second submission of the same set ... runs again only
// the members that did not succeed". The re-run keeps the member's run id
// and starts clean: it sees none of the failed run's memo entries (the
// project's issue 22 chose this over the plain-run rule that "a second run
// submitted under that id shares the first run's entries", so a member's
// re-run is the fresh attempt a fan-out retry means), and its memoized call
// runs again.
#[tokio::test(start_paused = true)]
async fn a_rerun_group_member_starts_with_a_clean_memo() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = PaidOnce::default();
    let rt = workflow_builder(&queue, &store, &runner).build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("paid-group"));
    group
        .submit(vec![member("m", "x")], &RunOptions::default())
        .await
        .unwrap();
    let first = crate::fixtures::join_all(&group).await;
    assert_eq!(first[0].termination.status, TerminalStatus::Failed);
    group
        .submit(vec![member("m", "x")], &RunOptions::default())
        .await
        .unwrap();
    let second = crate::fixtures::join_all(&group).await;
    assert_eq!(second[0].termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        second[0].run_id, first[0].run_id,
        "the member keeps its run id"
    );
    assert_eq!(
        runner.paid.load(Ordering::SeqCst),
        2,
        "the re-run did not see the failed run's memo entry"
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`WorkflowRuntimeBuilder::clock`] overrides the
// inherited default when a test or specialised setup needs the runtime on a
// different time source than the queue." — every timestamp the runtime
// writes is read through it.
#[tokio::test(start_paused = true)]
async fn a_runtime_clock_override_stamps_terminations() {
    let (queue, store, _clock) = memory_queue().await;
    let own = taquba::MockClock::new(T0 + 5_000_000);
    let rt = workflow_builder(&queue, &store, &Scripted::default())
        .clock(Arc::new(own.clone()))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("own-clock", "ok")).await.unwrap();
    let end = ends_within(&rt, "own-clock", 10, "own clock").await;
    assert_eq!(end.termination.terminated_at_ms, T0 + 5_000_000);
    // A terminated run is reported at once, even with a zero timeout.
    assert!(
        rt.wait_timeout(&rid("own-clock"), Duration::ZERO)
            .await
            .unwrap()
            .is_some()
    );
    worker.shutdown().await.unwrap();
}

// The Error doc: "Every variant names the value it rejects, so a log line
// is enough to find the bad input." (oversized or empty input at the
// public API).
#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_naming_the_value() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = workflow_builder(&queue, &store, &Scripted::default()).build();

    // An oversized correlation key.
    let key = "k".repeat(taquba_workflow::limits::MAX_CORRELATION_KEY_LEN + 1);
    let err = rt.signal(&key, vec![]).await.unwrap_err();
    assert!(
        err.to_string()
            .contains(&(taquba_workflow::limits::MAX_CORRELATION_KEY_LEN + 1).to_string()),
        "{err}"
    );
    // Too many headers.
    let mut s = spec("many-headers", "ok");
    for i in 0..=taquba_workflow::MAX_HEADERS {
        s.options.headers.insert(format!("h{i}"), "v".into());
    }
    let err = rt.submit(s).await.unwrap_err();
    assert!(matches!(err, Error::InvalidRunOptions(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains(&(taquba_workflow::MAX_HEADERS + 1).to_string()),
        "{err}"
    );
    // A member key over the limit.
    let long = "m".repeat(taquba_workflow::limits::MAX_MEMBER_KEY_LEN + 1);
    let err = rt
        .group(rid("long-keys"))
        .submit(vec![member(&long, "ok")], &RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains(&(taquba_workflow::limits::MAX_MEMBER_KEY_LEN + 1).to_string()),
        "{err}"
    );
    // The run memo's reserved key.
    let memo = MemoStore::new(store.clone(), MEMO_PREFIX).new_run_memo(&rid("m"));
    let err = memo.put("workflow.outcome", b"forged").await.unwrap_err();
    assert!(err.to_string().contains("workflow.outcome"), "{err}");
    // Nothing was submitted by the refused calls.
    assert!(rt.status(&rid("many-headers")).await.unwrap().is_none());
}

// ---------------------------------------------------------------------------
// Fourth round: detached steps, content keys, job state, waits cancelled.

// seed-lib.rs.txt: "[`Delivery::detached`] and [`Step::detached`] build
// instances bound to no queue, for tests."
#[tokio::test(start_paused = true)]
async fn a_detached_step_runs_a_runner_without_a_queue() {
    let step = Step::detached(b"ok".to_vec());
    assert_eq!(step.step_number, 0);
    assert!(step.signal.is_none());
    assert!(!step.is_last_attempt() || step.max_attempts <= 1);
    step.effects.put("app/x", "v").unwrap();
    assert!(step.kv.get(b"app/x").await.unwrap().is_none());
    step.memo.put("k", b"v").await.unwrap();
    assert_eq!(
        step.memo.get("k").await.unwrap().as_deref(),
        Some(b"v".as_slice())
    );
    let outcome = Scripted::default().run_step(&step).await.unwrap();
    assert!(matches!(outcome, StepOutcome::Succeed { result } if result == b"ok"));
}

#[derive(Serialize)]
struct DraftInput<'a> {
    operation: &'static str,
    payload: &'a [u8],
}

// seed-lib.rs.txt: "[`Memo::memoized_by_content`] ... serializes that input
// as MessagePack, hashes it with SHA-256 and uses the digest as the memo
// key. The entry remains scoped to `(run_id, step_number)`"; "[`Memo::content_key`]
// returns the derived key, for use with [`Memo::get`] and [`Memo::put`]".
#[tokio::test(start_paused = true)]
async fn content_keys_are_the_sha256_of_the_named_msgpack_encoding() {
    let input = DraftInput {
        operation: "draft",
        payload: b"abc",
    };
    let key = taquba_workflow::Memo::content_key(&input).unwrap();
    let digest = hex::encode(Sha256::digest(rmp_serde::to_vec_named(&input).unwrap()));
    assert!(key.contains(&digest), "{key} does not hold {digest}");
    let step = Step::detached(b"x".to_vec());
    let value: String = step
        .memo
        .memoized_by_content(&input, async { Ok::<_, Error>("drafted".to_string()) })
        .await
        .unwrap();
    assert_eq!(value, "drafted");
    assert!(step.memo.get(&key).await.unwrap().is_some());
    assert!(
        step.run_memo.get(&key).await.unwrap().is_none(),
        "scoped to the step"
    );
}

struct Missing;

/// Reports what `try_state` and `state` do for a type never registered.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateProbe;

impl Job for StateProbe {
    const NAME: &'static str = "seed.state-probe";
    type Output = (bool, String);
    type Error = JobFailure;

    async fn run(&self, ctx: JobContext<'_>) -> Result<(bool, String), JobFailure> {
        let absent = ctx.try_state::<Missing>().is_none();
        let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = ctx.state::<Missing>();
        }))
        .expect_err("state of an absent type panics");
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Ok((absent, message))
    }
}

// jobs.md: "`JobContext::state::<T>()` returns it (panics with the type
// name when absent) and `try_state` returns an `Option`."
#[tokio::test(start_paused = true)]
async fn job_state_of_an_absent_type_is_none_or_a_panic_naming_the_type() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = JobRunner::builder(queue, store)
        .register::<StateProbe>()
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let (absent, message) = within(10, runner.submit(StateProbe).await.unwrap().join())
        .await
        .unwrap()
        .unwrap();
    assert!(absent);
    assert!(message.contains("Missing"), "{message}");
    worker.shutdown().await.unwrap();
}

// jobs.md: "`payload_idempotency_key(&job)` is a key derived from the
// serialized payload, for \"same input, same job\"."
#[tokio::test(start_paused = true)]
async fn payload_keys_collapse_equal_jobs_only() {
    use taquba_workflow::jobs::payload_idempotency_key;
    let a = Scripty::new("same", "ok");
    let b = Scripty::new("same", "ok");
    let c = Scripty::new("other", "ok");
    let ka = payload_idempotency_key(&a).unwrap();
    assert_eq!(ka, payload_idempotency_key(&b).unwrap());
    assert_ne!(ka, payload_idempotency_key(&c).unwrap());

    let (runner, _calls, _queue) = job_runner().await;
    let mut keyed = a.clone();
    keyed.key = Some(ka.clone());
    let first = runner.submit(keyed.clone()).await.unwrap();
    let second = runner.submit(keyed).await.unwrap();
    assert!(first.newly_submitted() && !second.newly_submitted());
    assert_eq!(first.id().as_str(), hex_sha256(&ka));
}

// seed-lib.rs.txt: a cancelled signal-waiting run no longer waits: "A signal
// with no registered waiter is buffered durably"; `TerminalHook::observes`
// "is consulted when a run terminates" (a pending cancellation included).
#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_is_no_longer_signalled_and_observes_is_consulted() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Picky::default();
    let rt = hooked(&queue, store, hook.clone());
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("quiet-waiter", "signal:gone"))
        .await
        .unwrap();
    until_step("waiting", &rt, "quiet-waiter", 1).await;
    assert!(rt.cancel(&rid("quiet-waiter")).await.unwrap());
    let status = rt.status(&rid("quiet-waiter")).await.unwrap().unwrap();
    assert_eq!(terminated(&status.state).status, TerminalStatus::Cancelled);
    assert_eq!(
        rt.signal("gone", b"late".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(hook.calls_of("quiet-waiter").is_empty());
    worker.shutdown().await.unwrap();
}

// jobs.md: "Members are keyed by the job's idempotency key"; seed-group:
// "Two members with one key are rejected with [`Error::DuplicateMemberKey`]".
#[tokio::test(start_paused = true)]
async fn a_job_group_with_two_jobs_of_one_key_is_refused_naming_it() {
    let (runner, _calls, _queue) = job_runner().await;
    let mut a = Scripty::new("a", "ok");
    a.key = Some("same-key".into());
    let mut b = Scripty::new("b", "ok");
    b.key = Some("same-key".into());
    let group = runner.group::<Scripty>(rid("jg-dup"));
    let err = group.submit(vec![a, b]).await.unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateMemberKey(k) if k == "same-key"),
        "{err:?}"
    );
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
}
