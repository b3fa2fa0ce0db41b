//! A cancel answered `Ok(true)` for a step running in this process, whose
//! step then outlives its lease on its last attempt and is dead-lettered by
//! the reaper (issue 12, the cancel edge): the run ends `Cancelled`, as the
//! answer promised, wherever the dead letter is reconciled. A dead letter
//! that came before the cancel still fails the run (issue 11's rule, see
//! `durable_paths`).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use taquba::object_store::ObjectStore;
use taquba::{MockClock, Queue, QueueConfig};
use taquba_workflow::{
    NoopTerminalHook, RunOptions, RunSpec, RunState, Step, StepOutcome, TerminalStatus,
    WorkflowRuntime,
};

const LEASE: Duration = Duration::from_secs(10);

/// An in-memory queue whose step jobs are leased for [`LEASE`].
async fn short_lease_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>, MockClock) {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(taquba::object_store::memory::InMemory::new());
    let queue = Queue::open_with_options(
        store.clone(),
        "db",
        options(&clock).queue_config(
            STEPS,
            QueueConfig::default()
                .lease_duration(LEASE)
                .retry_backoff_base(Duration::ZERO)
                .max_attempts(3),
        ),
    )
    .await
    .unwrap();
    (Arc::new(queue), store, clock)
}

/// A step that ignores its cancel token and returns once `gate` opens.
fn stubborn(gate: Gate) -> impl taquba_workflow::StepRunner {
    FnRunner(move |_step: Step| {
        let gate = gate.clone();
        async move {
            gate.wait().await;
            Ok(StepOutcome::Succeed {
                result: b"finished anyway".to_vec(),
            })
        }
    })
}

fn one_attempt(id: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        options: RunOptions {
            max_attempts_per_step: Some(1),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The cancel of a running step answers `true`; the step ignores its token,
/// outlives its lease on its only attempt and the reaper dead-letters it.
/// The run ends `Cancelled` (not `Failed` with the reaper's error), for the
/// worker's reconciliation and for a wait on another runtime over the
/// queue, which reads the request from the store.
#[tokio::test(start_paused = true)]
async fn a_cancelled_step_dead_lettered_after_the_answer_ends_cancelled() {
    let (queue, store, clock) = short_lease_queue().await;
    let gate = Gate::default();
    let hook = Recorder::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        stubborn(gate.clone()),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(50))
    .build();
    let observer = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        stubborn(gate.clone()),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(one_attempt("stubborn")).await.unwrap();
    eventually("the step runs", || async {
        matches!(
            runtime
                .status(&rid("stubborn"))
                .await
                .unwrap()
                .map(|s| s.state),
            Some(RunState::Running)
        )
    })
    .await;
    assert!(
        runtime.cancel(&rid("stubborn")).await.unwrap(),
        "this call's request ends the run cancelled"
    );

    clock.advance(LEASE + Duration::from_secs(1));
    queue.reap_now().await.unwrap();
    assert_eq!(dead_jobs(&queue).await.len(), 1, "the reaper took the step");
    let end = within(30, observer.wait(&rid("stubborn"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);

    // The step returns at last; its settlement finds the claim lost.
    gate.open();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let Some(RunState::Terminated(t)) = runtime
        .status(&rid("stubborn"))
        .await
        .unwrap()
        .map(|s| s.state)
    else {
        panic!("not terminated");
    };
    assert_eq!(t.status, TerminalStatus::Cancelled);
    eventually("the hook hears of it", || async {
        !hook.calls().is_empty()
    })
    .await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
}

/// The same with the worker's own reconciliation of the dead letter (no
/// other runtime looking).
#[tokio::test(start_paused = true)]
async fn the_worker_reconciles_a_cancelled_step_the_reaper_took_as_cancelled() {
    let (queue, store, clock) = short_lease_queue().await;
    let gate = Gate::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store,
        stubborn(gate.clone()),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(one_attempt("reaped")).await.unwrap();
    eventually("the step runs", || async {
        matches!(
            runtime
                .status(&rid("reaped"))
                .await
                .unwrap()
                .map(|s| s.state),
            Some(RunState::Running)
        )
    })
    .await;
    assert!(runtime.cancel(&rid("reaped")).await.unwrap());
    clock.advance(LEASE + Duration::from_secs(1));
    queue.reap_now().await.unwrap();
    until_terminated("reconciled", &runtime, "reaped").await;
    let Some(RunState::Terminated(t)) = runtime
        .status(&rid("reaped"))
        .await
        .unwrap()
        .map(|s| s.state)
    else {
        unreachable!()
    };
    assert_eq!(t.status, TerminalStatus::Cancelled);
    gate.open();
    worker.shutdown().await.unwrap();
}
