//! Terminal hooks (and runners) that misbehave the way application code
//! does by mistake: `observes` panics, `on_termination` panics before its
//! future exists, never returns, or outlives the queue's lease. Every run
//! still terminates with its outcome committed, no caller's call panics,
//! and the notification follows the hook's retry rules. A shutdown with a
//! hung hook, a step and a timer in flight returns, and a restart ends
//! every run and retries the hung notification.

use crate::common;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::common::until_step;
use crate::fixtures::{Scripted, ends_within, queue_with, spec};
use common::{T0, dead_jobs, eventually, memory_queue, rid, within};
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue};
use taquba_workflow::{
    HEADER_RUN_ID, HEADER_TERMINAL, RunId, RunOptions, RunOutcome, RunSpec, RunState, Step,
    StepError, StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus,
    WorkflowRuntime,
};

/// The header that tells [`Hook`] how to behave for a run.
const BEHAVIOUR: &str = "hook";

/// A queue on tokio's (paused) time, so leases, the reaper, backoff and
/// hook timeouts all follow the test's clock. Step jobs are leased for
/// `lease`, retried after 10 ms, three attempts.
async fn tokio_time_queue(lease: Duration) -> (Arc<Queue>, Arc<dyn ObjectStore>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = crate::fixtures::queue_over_tokio_clock(
        store.clone(),
        OpenOptions::default(),
        lease,
        Duration::from_millis(10),
    )
    .await;
    (queue, store)
}

/// What the hook saw, shared with the test.
#[derive(Default)]
struct Seen {
    /// The run id of every `on_termination` call, in call order.
    calls: Mutex<Vec<String>>,
    /// `hangs` and `slow` calls in progress, and the most seen at once.
    running: AtomicUsize,
    most_running: AtomicUsize,
}

impl Seen {
    fn calls_for(&self, run_id: &RunId) -> usize {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|id| id.as_str() == run_id.as_str())
            .count()
    }
}

/// A hook that behaves as the run's `hook` header says: `observes-panics`
/// (its `observes` panics), `observes-panics-always` (also through
/// [`Hook::always_panicking`]), `panics-early` (`on_termination` panics
/// before returning its future), `hangs` (never returns), `slow` (returns
/// after 20 s); anything else succeeds at once.
#[derive(Clone, Default)]
struct Hook {
    seen: Arc<Seen>,
    observes_always_panics: bool,
}

impl Hook {
    fn always_panicking() -> Self {
        Self {
            observes_always_panics: true,
            ..Self::default()
        }
    }
}

/// Decrements the running count when a hook call ends, however it ends.
struct Running<'a>(&'a Seen);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TerminalHook for Hook {
    fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> impl Future<Output = Result<(), StepError>> + Send {
        let behaviour = outcome.headers.get(BEHAVIOUR).cloned().unwrap_or_default();
        self.seen
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(outcome.run_id.to_string());
        if behaviour == "panics-early" {
            panic!("the hook has no future for run {}", outcome.run_id);
        }
        let seen = self.seen.clone();
        async move {
            if behaviour != "hangs" && behaviour != "slow" {
                return Ok(());
            }
            let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
            seen.most_running.fetch_max(now, Ordering::SeqCst);
            let _running = Running(&seen);
            if behaviour == "hangs" {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(20)).await;
            Ok(())
        }
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        if self.observes_always_panics
            || outcome.headers.get(BEHAVIOUR).map(String::as_str) == Some("observes-panics")
        {
            panic!("observes cannot judge run {}", outcome.run_id);
        }
        true
    }
}

/// A runner that succeeds with its payload; `work` takes 2 s first,
/// `panics-early` panics before returning its future.
struct Runner;

impl StepRunner for Runner {
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send {
        if step.payload == b"panics-early" {
            panic!("the runner has no future for run {}", step.run_id);
        }
        let payload = step.payload.clone();
        async move {
            if payload == b"work" {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Ok(StepOutcome::Succeed { result: payload })
        }
    }
}

fn behaviour_spec(id: &str, input: &str, behaviour: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        options: RunOptions {
            headers: HashMap::from([(BEHAVIOUR.to_string(), behaviour.to_string())]),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The dead notification jobs of `run_id`.
async fn dead_notifications(queue: &Queue, run_id: &RunId) -> Vec<taquba::JobRecord> {
    dead_jobs(queue)
        .await
        .into_iter()
        .filter(|job| {
            job.headers.contains_key(HEADER_TERMINAL)
                && job.headers.get(HEADER_RUN_ID).map(String::as_str) == Some(run_id.as_str())
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_observes_still_terminates_the_run_and_the_hook_is_notified() {
    let (queue, store) = tokio_time_queue(Duration::from_secs(30)).await;
    let hook = Hook::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Runner, hook.clone()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(behaviour_spec("judged", "x", "observes-panics"))
        .await
        .unwrap();
    runtime
        .submit(behaviour_spec("plain", "y", ""))
        .await
        .unwrap();

    for (id, result) in [("judged", b"x"), ("plain", b"y")] {
        let end = within(60, runtime.wait(&rid(id))).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
        let outcome = end.outcome.expect("the outcome is committed");
        assert_eq!(outcome.result.as_deref(), Some(&result[..]));
        let status = runtime.status(&rid(id)).await.unwrap().unwrap();
        assert!(
            matches!(status.state, RunState::Terminated(_)),
            "{status:?}"
        );
        assert_eq!(
            runtime.outcome(&rid(id)).await.unwrap(),
            Some(outcome),
            "{id}"
        );
    }
    // A panicking `observes` counts as observing: the hook is called once.
    eventually("the judged run's notification", || async {
        hook.seen.calls_for(&rid("judged")) == 1
    })
    .await;
    eventually("the plain run's notification", || async {
        hook.seen.calls_for(&rid("plain")) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(hook.seen.calls_for(&rid("judged")), 1, "the step ran once");
    assert!(dead_jobs(&queue).await.is_empty());
    worker.shutdown().await.expect("the worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_panic_in_observes_reaches_neither_cancel_nor_wait() {
    let (queue, store, clock) = memory_queue().await;
    let hook = Hook::always_panicking();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Runner, hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build();

    // A step the reaper dead-lettered: the termination is built by the
    // reconciliation inside the caller's `wait`.
    let reaped = RunSpec {
        options: RunOptions {
            max_attempts_per_step: Some(1),
            ..Default::default()
        },
        ..behaviour_spec("reaped", "x", "")
    };
    runtime.submit(reaped).await.unwrap();
    let claim = queue
        .claim(common::STEPS, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the reaped run's step");
    clock.advance(Duration::from_secs(2));
    queue.reap_now().await.unwrap();
    drop(claim);
    let end = within(30, runtime.wait(&rid("reaped"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);

    // A pending step cancelled by the caller: the termination is built in
    // the caller's `cancel`.
    let scheduled = RunSpec {
        options: RunOptions {
            run_at: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(T0 + 3_600_000)),
            ..Default::default()
        },
        ..behaviour_spec("scheduled", "x", "")
    };
    runtime.submit(scheduled).await.unwrap();
    assert!(runtime.cancel(&rid("scheduled")).await.unwrap());
    let status = runtime.status(&rid("scheduled")).await.unwrap().unwrap();
    match status.state {
        RunState::Terminated(t) => assert_eq!(t.status, TerminalStatus::Cancelled),
        other => panic!("expected a cancelled run, got {other:?}"),
    }

    // Both notifications were enqueued and reach the hook.
    let worker = runtime.spawn(std::future::pending::<()>());
    for id in ["scheduled", "reaped"] {
        eventually("the notification", || async {
            hook.seen.calls_for(&rid(id)) == 1
        })
        .await;
    }
    worker.shutdown().await.expect("the worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_hook_or_runner_that_panics_before_its_future_exists_is_caught() {
    let (queue, store) = tokio_time_queue(Duration::from_secs(30)).await;
    let hook = Hook::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Runner, hook.clone()).build();
    let worker = runtime.spawn(std::future::pending::<()>());

    // The runner's panic is a transient step error, retried, then the end.
    runtime
        .submit(behaviour_spec("runner", "panics-early", ""))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("runner"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.unwrap_or_default();
    assert!(
        error.contains("step runner panicked") && error.contains("has no future"),
        "{error}"
    );

    // The hook's panic retries the notification to its attempt limit.
    runtime
        .submit(behaviour_spec("hooked", "x", "panics-early"))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("hooked"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the dead notification", || async {
        !dead_notifications(&queue, &rid("hooked")).await.is_empty()
    })
    .await;
    let dead = dead_notifications(&queue, &rid("hooked")).await;
    assert_eq!(dead[0].attempts, 3);
    let error = dead[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("terminal hook panicked") && error.contains("has no future"),
        "{error}"
    );
    assert_eq!(hook.seen.calls_for(&rid("hooked")), 3);
    worker.shutdown().await.expect("the worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_never_returns_is_timed_out_and_every_other_run_ends() {
    // taquba's default lease (30 s): the default hook timeout is 25 s.
    let (queue, store) = tokio_time_queue(Duration::from_secs(30)).await;
    let hook = Hook::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Runner, hook.clone())
        .max_concurrent_steps(2)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(behaviour_spec("hung", "x", "hangs"))
        .await
        .unwrap();
    let mut others = Vec::new();
    for i in 0..40 {
        let id = format!("work-{i}");
        runtime
            .submit(behaviour_spec(&id, "work", ""))
            .await
            .unwrap();
        others.push(rid(&id));
    }
    // Each run takes 2 s of a runner slot: 80 s of work on the one slot
    // the hung hook leaves free, more on two once it is timed out.
    for id in others.iter().chain([&rid("hung")]) {
        let end = within(600, runtime.wait(id)).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
    }
    for id in &others {
        eventually("every other notification", || async {
            hook.seen.calls_for(id) == 1
        })
        .await;
    }
    eventually("the hung notification to be dead-lettered", || async {
        !dead_notifications(&queue, &rid("hung")).await.is_empty()
    })
    .await;
    let dead = dead_notifications(&queue, &rid("hung")).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3, "retried to its attempt limit");
    let error = dead[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("terminal hook did not return within 25s"),
        "{error}"
    );
    assert_eq!(hook.seen.calls_for(&rid("hung")), 3, "one call per attempt");
    assert_eq!(
        hook.seen.most_running.load(Ordering::SeqCst),
        1,
        "a hung notification is never delivered to a second slot while it runs"
    );
    assert_eq!(hook.seen.running.load(Ordering::SeqCst), 0);
    worker.shutdown().await.expect("the worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn a_hook_timeout_longer_than_the_lease_keeps_the_notification_here() {
    let (queue, store) = tokio_time_queue(Duration::from_secs(2)).await;
    let hook = Hook::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Runner, hook.clone())
        .hook_timeout(Duration::from_secs(60))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(behaviour_spec("slow", "x", "slow"))
        .await
        .unwrap();
    within(60, runtime.wait(&rid("slow"))).await.unwrap();
    // The hook takes 20 s, ten leases: the lease is extended to cover the
    // call, so the reaper never hands the notification to another slot.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(hook.seen.calls_for(&rid("slow")), 1);
    assert_eq!(hook.seen.most_running.load(Ordering::SeqCst), 1);
    assert!(dead_jobs(&queue).await.is_empty());
    let stats = queue.view().stats(common::STEPS).await.unwrap();
    assert_eq!(stats.pending + stats.claimed, 0, "{stats:?}");
    worker.shutdown().await.expect("the worker ends cleanly");
}

/// A hook that never returns (default hook timeout), a runner call in
/// flight and a timer pending when `shutdown` is called: the README says
/// "`shutdown` lets the steps in flight finish". It must return within
/// the hook timeout plus a margin; a new runtime over the queue then ends
/// every run, and the hung notification is retried there.
#[tokio::test(start_paused = true)]
async fn a_shutdown_with_a_hung_hook_a_step_and_a_timer_in_flight_returns_and_a_restart_finishes() {
    #[derive(Clone, Default)]
    struct Hangs {
        calls: Arc<AtomicUsize>,
        hang: Arc<std::sync::atomic::AtomicBool>,
    }
    impl TerminalHook for Hangs {
        async fn on_termination(
            &self,
            _outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> Result<(), StepError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::from_secs(30), Duration::ZERO).await;
    let hook = Hangs::default();
    hook.hang.store(true, Ordering::SeqCst);
    let script = Scripted::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("hooked", "ok")).await.unwrap();
    ends_within(&runtime, "hooked", 30, "hooked").await;
    eventually("the hung hook call", || async {
        hook.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    runtime.submit(spec("timed", "timer:60000")).await.unwrap();
    runtime
        .submit(spec("sleeping", "sleep:10000"))
        .await
        .unwrap();
    eventually("the sleeping step to run", || async {
        script.calls_of("sleeping") == 1
    })
    .await;
    until_step("the timer", &runtime, "timed", 1).await;
    match tokio::time::timeout(Duration::from_secs(60), worker.shutdown()).await {
        Err(_) => panic!("shutdown hangs on a hung hook"),
        Ok(result) => result.unwrap(),
    }
    // The sleeping step finished and committed during the drain.
    assert_eq!(
        ends_within(&runtime, "sleeping", 1, "drained")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    drop(runtime);
    hook.hang.store(false, Ordering::SeqCst);
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        ends_within(&runtime, "timed", 120, "after the restart")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    // hooked: hung once, then retried; sleeping and timed: once each.
    eventually("every notification", || async {
        hook.calls.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(hook.calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        script.calls_of("sleeping"),
        1,
        "a drained step is not run again"
    );
    worker.shutdown().await.unwrap();
}
