//! Submission, the step loop, status and waits at the public API: racing
//! re-submissions of an ended run id start one run, and a runner that
//! always panics fails its run while the worker goes on.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::fixtures::{Counting, Scripted, ends_within, spec, tokio_clock_queue};
use common::*;
use std::time::Duration;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::{
    Error, NoopTerminalHook, RunOptions, RunSpec, RunState, Step, StepError, StepErrorKind,
    StepOutcome, StepRunner, TerminalStatus, WorkflowRuntime,
};

/// Counts down: a payload `n` continues with `n - 1`, and `0` succeeds with
/// the step number.
#[derive(Default)]
struct Countdown {
    calls: AtomicU32,
}

impl StepRunner for Countdown {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n: u32 = std::str::from_utf8(&step.payload)
            .map_err(|e| StepError::permanent(e.to_string()))?
            .parse()
            .map_err(|e: std::num::ParseIntError| StepError::permanent(e.to_string()))?;
        if n == 0 {
            Ok(StepOutcome::Succeed {
                result: step.step_number.to_string().into_bytes(),
            })
        } else {
            Ok(StepOutcome::continue_now((n - 1).to_string().into_bytes()))
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_goes_through_its_steps_and_reports_its_outcome() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Arc::new(Countdown::default());
    let runtime =
        WorkflowRuntime::builder(queue, store, Countdown::default(), NoopTerminalHook).build();
    let _ = runner;
    let submitted = runtime
        .submit(RunSpec {
            run_id: Some(rid("count-3")),
            input: b"3".to_vec(),
            options: RunOptions {
                headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(submitted.newly_submitted);
    let status = runtime.status(&rid("count-3")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Pending);
    assert_eq!(status.current_step, 0);

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(30, runtime.wait(&rid("count-3"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 3);
    let outcome = end.outcome.expect("the worker recorded the outcome");
    assert_eq!(outcome.result.as_deref(), Some(b"3".as_slice()));
    assert_eq!(
        outcome.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(
        runtime
            .outcome(&rid("count-3"))
            .await
            .unwrap()
            .unwrap()
            .final_step,
        3
    );
    let status = runtime.status(&rid("count-3")).await.unwrap().unwrap();
    assert!(
        matches!(status.state, RunState::Terminated(ref t) if t.status == TerminalStatus::Succeeded)
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn submission_is_idempotent_on_run_id_and_input() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime =
        WorkflowRuntime::builder(queue, store, Countdown::default(), NoopTerminalHook).build();
    let spec = RunSpec {
        run_id: Some(rid("r")),
        input: b"1".to_vec(),
        ..Default::default()
    };
    let first = runtime.submit(spec.clone()).await.unwrap();
    let again = runtime.submit(spec.clone()).await.unwrap();
    assert!(first.newly_submitted);
    assert!(!again.newly_submitted);
    assert_eq!(first.job_id, again.job_id);
    let other = runtime
        .submit(RunSpec {
            input: b"2".to_vec(),
            ..spec.clone()
        })
        .await;
    assert!(matches!(other, Err(Error::InputMismatch(id)) if id == "r"));

    let reserved = runtime
        .submit(RunSpec {
            options: RunOptions {
                headers: HashMap::from([("workflow.step".to_string(), "9".to_string())]),
                ..Default::default()
            },
            ..Default::default()
        })
        .await;
    assert!(matches!(reserved, Err(Error::ReservedHeaderInSubmit(h)) if h == "workflow.step"));
}

/// Fails transiently `failures` times, then succeeds.
struct Flaky {
    failures: u32,
    calls: AtomicU32,
}

impl StepRunner for Flaky {
    async fn run_step(&self, _step: &Step) -> Result<StepOutcome, StepError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.failures {
            Err(StepError::transient(format!("flake {call}")))
        } else {
            Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            })
        }
    }
}

#[tokio::test(start_paused = true)]
async fn transient_errors_retry_and_exhaustion_fails_the_run() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Flaky {
            failures: 2,
            calls: AtomicU32::new(0),
        },
        NoopTerminalHook,
    )
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = runtime.submit(RunSpec::default()).await.unwrap();
    let end = within(30, runtime.wait(&run.run_id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();

    let runtime = WorkflowRuntime::builder(
        queue,
        store,
        Flaky {
            failures: 100,
            calls: AtomicU32::new(0),
        },
        NoopTerminalHook,
    )
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = runtime.submit(RunSpec::default()).await.unwrap();
    let end = within(30, runtime.wait(&run.run_id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("flake 2"));
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Transient));
    worker.shutdown().await.unwrap();
}

struct Panics;

impl StepRunner for Panics {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.payload == b"panic" {
            panic!("the runner fell over");
        }
        Ok(StepOutcome::Succeed { result: vec![] })
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_runner_fails_its_run_and_the_worker_serves_others() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue, store, Panics, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let bad = runtime
        .submit(RunSpec {
            input: b"panic".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let good = runtime.submit(RunSpec::default()).await.unwrap();
    let end = within(30, runtime.wait(&bad.run_id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.unwrap();
    assert!(error.contains("the runner fell over"), "{error}");
    let end = within(30, runtime.wait(&good.run_id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

/// A runtime that only submits and waits, beside another over the same
/// queue that runs the worker: the wait is woken by the worker's commit,
/// not by its periodic look at the run (an hour here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_one_runtime_is_woken_by_the_worker_of_another_over_the_same_queue() {
    let (queue, store) = real_clock_queue().await;
    let hour = std::time::Duration::from_secs(3600);
    let submitter = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Countdown::default(),
        NoopTerminalHook,
    )
    .poll_interval(hour)
    .build();
    let worker_runtime =
        WorkflowRuntime::builder(queue.clone(), store, Countdown::default(), NoopTerminalHook)
            .poll_interval(hour)
            .build();
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    let mut waits = Vec::new();
    for i in 0..20 {
        let id = rid(&format!("shared-{i}"));
        submitter
            .submit(RunSpec {
                run_id: Some(id.clone()),
                input: b"4".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        let submitter = submitter.clone();
        waits.push(tokio::spawn(async move { submitter.wait(&id).await }));
    }
    for wait in waits {
        let end = within(20, wait).await.unwrap().unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        assert_eq!(end.termination.final_step, 4);
        assert_eq!(
            end.outcome.and_then(|o| o.result).as_deref(),
            Some(b"4".as_slice())
        );
    }
    worker.shutdown().await.unwrap();
}

/// Two submissions of one run id with different inputs at once, after the
/// id's earlier run ended (so each may start a new run: "A run id whose
/// run terminated starts a new run (with any input)"): exactly one starts
/// a run, the other is refused with `InputMismatch` or answers for that
/// same run; the id has one run, which ends once, and its hook fires once.
#[tokio::test(start_paused = true)]
async fn racing_resubmissions_with_different_inputs_start_one_run() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Counting::default();
    let script = Scripted::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for k in 0..20usize {
        let id = format!("again-{k}");
        runtime.submit(spec(&id, "ok")).await.unwrap();
        ends_within(&runtime, &id, 30, "the first run").await;
        let (a, b) = {
            let (r1, r2) = (runtime.clone(), runtime.clone());
            let (i1, i2) = (id.clone(), id.clone());
            let a = tokio::spawn(async move { r1.submit(spec(&i1, "timer:50")).await });
            for _ in 0..k % 5 {
                tokio::task::yield_now().await;
            }
            let b = tokio::spawn(async move { r2.submit(spec(&i2, "sleep:50")).await });
            (a.await.unwrap(), b.await.unwrap())
        };
        let started = [&a, &b]
            .iter()
            .filter(|r| matches!(r, Ok(o) if o.newly_submitted))
            .count();
        assert_eq!(started, 1, "{id}: {a:?} {b:?}");
        for answer in [&a, &b] {
            if let Err(err) = answer {
                assert!(
                    matches!(err, taquba_workflow::Error::InputMismatch(_)),
                    "{id}: {err}"
                );
            }
        }
        let end = ends_within(&runtime, &id, 30, "the second run").await;
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        // The first run's step 0 and the second run's steps.
        assert!(
            script.calls_of(&id) <= 3,
            "{id}: {} runner calls",
            script.calls_of(&id)
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for k in 0..20usize {
        let id = format!("again-{k}");
        assert_eq!(hook.calls_of(&id).len(), 2, "{id}: one hook call per run");
    }
    worker.shutdown().await.unwrap();
}

/// README: "A panicking step is treated as a transient error naming the
/// panic." A step that panics on every attempt ends the run `Failed` after
/// the attempts, with an error naming the panic, and the worker goes on.
#[tokio::test(start_paused = true)]
async fn a_runner_that_always_panics_fails_the_run_and_the_worker_goes_on() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runner = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("panics", "panic")).await.unwrap();
    let end = within(120, runtime.wait(&rid("panics"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.outcome.and_then(|o| o.error).unwrap_or_default();
    assert!(
        error.contains("on purpose"),
        "error does not name the panic: {error:?}"
    );
    let attempts = runner
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| r == "panics")
        .count();
    assert_eq!(attempts, 3, "attempts of a panicking step");
    runtime.submit(spec("after-panic", "ok")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "after-panic", 30, "after a panic")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    worker.shutdown().await.unwrap();
}
