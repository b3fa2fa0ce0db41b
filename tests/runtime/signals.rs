//! Durable signals at the public API: delivery to a waiting run, buffering
//! for the next waiter, timeouts, one waiter per key, redelivery of a woken
//! step, cleanup of the signal state, restarts and cancellation. Signals
//! racing each other, their waiter's start or its wait's timeout answer
//! what happened and are never lost; a signal answered before a crash is
//! delivered after it; a key over `MAX_CORRELATION_KEY_LEN` is refused.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{Scripted, ends_within, spec, state, tokio_clock_queue};
use common::*;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{MockClock, Queue};
use taquba_workflow::RunState;
use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{
    NoopTerminalHook, RunId, RunSpec, SignalOutcome, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus, WorkflowRuntime,
};

/// What step 1 of a run observed on one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    run_id: String,
    attempts: u32,
    signal: Option<Vec<u8>>,
}

/// Step 0 waits on the key and timeout named by its input
/// (`"{key}|{timeout_ms}"`, or `"{key}|{timeout_ms}|flaky"` for a step 1
/// whose first attempt fails transiently); step 1 records what it saw and
/// succeeds with the signal (or `<timeout>`).
#[derive(Clone, Default)]
struct Waiter {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Step 0 of a `gate0` run holds until this opens (and reports that it
    /// started through `started`).
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    started: Arc<tokio::sync::Notify>,
}

impl Waiter {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log lock").clone()
    }
}

impl StepRunner for Waiter {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = std::str::from_utf8(&step.payload)
            .map_err(|e| StepError::permanent(e.to_string()))?
            .to_string();
        let mut parts = input.split('|');
        let key = parts.next().unwrap_or_default().to_string();
        let timeout_ms: u64 = parts
            .next()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| StepError::permanent(format!("bad input {input:?}")))?;
        let mode = parts.next();
        let flaky = mode == Some("flaky");
        match step.step_number {
            0 => {
                if mode == Some("gate0") {
                    self.started.notify_one();
                    let _ = self.gate.subscribe().wait_for(|open| *open).await;
                }
                Ok(StepOutcome::continue_on_signal(
                    step.payload.clone(),
                    key,
                    Duration::from_millis(timeout_ms),
                ))
            }
            _ => {
                self.seen.lock().expect("log lock").push(Seen {
                    run_id: step.run_id.to_string(),
                    attempts: step.attempts,
                    signal: step.signal.clone(),
                });
                if flaky && step.attempts == 1 {
                    return Err(StepError::transient("first attempt falls over"));
                }
                if mode == Some("fail") {
                    return Err(StepError::permanent("step 1 rejects every signal"));
                }
                Ok(StepOutcome::Succeed {
                    result: step.signal.clone().unwrap_or_else(|| b"<timeout>".to_vec()),
                })
            }
        }
    }
}

const HOUR_MS: u64 = 3_600_000;

fn runtime(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: &Waiter,
) -> WorkflowRuntime<Waiter, NoopTerminalHook> {
    workflow_builder(queue, store, runner).build()
}

async fn submit(
    runtime: &WorkflowRuntime<Waiter, NoopTerminalHook>,
    id: &str,
    input: &str,
) -> RunId {
    runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: input.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .expect("submit")
        .run_id
}

/// Wait until `run_id`'s current step is `step` (the run is waiting there).
async fn reach_step(
    runtime: &WorkflowRuntime<Waiter, NoopTerminalHook>,
    run_id: &RunId,
    step: u32,
) {
    within(30, async {
        loop {
            let status = runtime
                .status(run_id)
                .await
                .expect("status")
                .expect("known run");
            if status.current_step == step {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The keys under `workflow/signals/`.
async fn signal_keys(queue: &Queue) -> Vec<String> {
    queue
        .view()
        .kv_scan(b"workflow/signals/", .., 100)
        .await
        .expect("scan")
        .entries
        .into_iter()
        .map(|(key, _)| String::from_utf8_lossy(&key).into_owned())
        .collect()
}

/// Close `queue` once every other handle to it is gone.
async fn close(queue: Arc<Queue>) {
    match Arc::try_unwrap(queue) {
        Ok(queue) => queue.close().await.expect("close queue"),
        Err(_) => panic!("the queue is still shared at close"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_signal_wakes_the_waiting_run_at_once() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = submit(&runtime, "approve-1", &format!("approval:1|{HOUR_MS}")).await;
    reach_step(&runtime, &run, 1).await;
    let keys = signal_keys(&queue).await;
    assert_eq!(
        keys,
        vec!["workflow/signals/waiters/approval:1".to_string()]
    );

    let outcome = runtime.signal("approval:1", b"yes".to_vec()).await.unwrap();
    assert_eq!(outcome, SignalOutcome::Delivered);
    // The mock clock never moves: only an immediately claimable step can
    // finish the run.
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"yes".as_slice())
    );
    assert_eq!(
        runner.seen(),
        vec![Seen {
            run_id: "approve-1".into(),
            attempts: 1,
            signal: Some(b"yes".to_vec())
        }]
    );
    assert!(
        signal_keys(&queue).await.is_empty(),
        "the waiter is consumed"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_signal_without_a_waiter_is_buffered_for_the_next_one() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    assert_eq!(
        runtime.signal("early", b"first".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    assert_eq!(
        runtime.signal("early", b"second".to_vec()).await.unwrap(),
        SignalOutcome::Buffered,
        "a second signal before consumption replaces the first"
    );
    assert_eq!(
        signal_keys(&queue).await,
        vec!["workflow/signals/buffered/early".to_string()]
    );

    let worker = runtime.spawn(std::future::pending::<()>());
    let run = submit(&runtime, "late-waiter", &format!("early|{HOUR_MS}")).await;
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"second".as_slice())
    );
    assert_eq!(
        runner.seen()[0].signal.as_deref(),
        Some(b"second".as_slice())
    );
    assert!(
        signal_keys(&queue).await.is_empty(),
        "the buffer is consumed"
    );

    // Consumed means gone: the next waiter on the key waits.
    let next = submit(&runtime, "next-waiter", &format!("early|{HOUR_MS}")).await;
    reach_step(&runtime, &next, 1).await;
    assert!(
        runtime
            .wait_timeout(&next, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        runtime.signal("early", b"third".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = within(5, runtime.wait(&next)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"third".as_slice())
    );
    worker.shutdown().await.unwrap();
}

/// On the test kit: the timeout fires at its millisecond, not one before.
#[tokio::test(start_paused = true)]
async fn a_timeout_runs_the_next_step_without_a_signal() {
    let env = TestRuntime::new(Waiter::default()).await.unwrap();
    let run = env
        .submit(RunSpec {
            run_id: Some(rid("slow-approval")),
            input: b"approval:slow|10000".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    assert_eq!(env.run_until_idle().await.unwrap(), 1, "step 0 waits");
    assert_eq!(
        env.advance(Duration::from_millis(9_999)).await.unwrap(),
        0,
        "the timeout has not elapsed yet"
    );
    assert_eq!(env.advance(Duration::from_millis(1)).await.unwrap(), 1);
    let runtime = env.runtime().unwrap();
    let outcome = runtime.outcome(&run).await.unwrap().expect("ended");
    assert_eq!(outcome.result.as_deref(), Some(b"<timeout>".as_slice()));
    assert_eq!(env.runner().seen()[0].signal, None);
    let queue = env.queue().unwrap();
    assert!(
        signal_keys(&queue).await.is_empty(),
        "the timed-out waiter is removed"
    );

    // A signal after the timeout finds no waiter and is buffered;
    // clear_signal discards it once.
    assert_eq!(
        env.signal_raw("approval:slow", b"too late".to_vec())
            .await
            .unwrap(),
        SignalOutcome::Buffered
    );
    assert!(runtime.clear_signal("approval:slow").await.unwrap());
    assert!(!runtime.clear_signal("approval:slow").await.unwrap());
    assert!(!runtime.clear_signal("never-signalled").await.unwrap());
    assert!(signal_keys(&queue).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_second_waiter_on_a_key_fails_its_run() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let first = submit(&runtime, "first", &format!("shared|{HOUR_MS}")).await;
    reach_step(&runtime, &first, 1).await;
    let second = submit(&runtime, "second", &format!("shared|{HOUR_MS}")).await;
    let end = within(5, runtime.wait(&second)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.unwrap();
    assert!(
        error.contains("\"shared\"") && error.contains("first"),
        "the error names the key and the waiting run: {error}"
    );

    // The first waiter still owns the key.
    assert_eq!(
        runtime.signal("shared", b"go".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = within(5, runtime.wait(&first)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"go".as_slice())
    );
    assert!(signal_keys(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_woken_step_sees_the_same_signal_on_every_delivery() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());

    // Woken while waiting.
    let woken = submit(&runtime, "woken", &format!("redeliver:a|{HOUR_MS}|flaky")).await;
    reach_step(&runtime, &woken, 1).await;
    assert_eq!(
        runtime.signal("redeliver:a", b"A".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = within(5, runtime.wait(&woken)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"A".as_slice())
    );

    // Consumed from the buffer.
    runtime.signal("redeliver:b", b"B".to_vec()).await.unwrap();
    let buffered = submit(
        &runtime,
        "buffered",
        &format!("redeliver:b|{HOUR_MS}|flaky"),
    )
    .await;
    let end = within(5, runtime.wait(&buffered)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"B".as_slice())
    );

    let seen = runner.seen();
    let attempts = |run: &str| -> Vec<(u32, Option<Vec<u8>>)> {
        seen.iter()
            .filter(|s| s.run_id == run)
            .map(|s| (s.attempts, s.signal.clone()))
            .collect()
    };
    assert_eq!(
        attempts("woken"),
        vec![(1, Some(b"A".to_vec())), (2, Some(b"A".to_vec()))]
    );
    assert_eq!(
        attempts("buffered"),
        vec![(1, Some(b"B".to_vec())), (2, Some(b"B".to_vec()))]
    );
    assert!(
        signal_keys(&queue).await.is_empty(),
        "no delivered-signal record outlives its step"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_waiting_run_removes_its_waiter() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = submit(&runtime, "abandoned", &format!("cancelled-key|{HOUR_MS}")).await;
    reach_step(&runtime, &run, 1).await;
    assert!(runtime.cancel(&run).await.unwrap());
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.final_step, 1);
    assert!(
        signal_keys(&queue).await.is_empty(),
        "the waiter went with the run"
    );
    assert_eq!(
        runtime
            .signal("cancelled-key", b"x".to_vec())
            .await
            .unwrap(),
        SignalOutcome::Buffered,
        "nobody waits any more"
    );
    assert!(runner.seen().is_empty(), "step 1 never ran");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waits_and_buffered_signals_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new(T0);
    let store = dir_store(dir.path());

    // Before the restart: one run waits, one signal is buffered.
    {
        let queue = open(&store, &clock).await;
        let runner = Waiter::default();
        let runtime = runtime(&queue, &store, &runner);
        let worker = runtime.spawn(std::future::pending::<()>());
        let run = submit(&runtime, "waits-across", &format!("restart:wait|{HOUR_MS}")).await;
        reach_step(&runtime, &run, 1).await;
        assert_eq!(
            runtime
                .signal("restart:buffer", b"kept".to_vec())
                .await
                .unwrap(),
            SignalOutcome::Buffered
        );
        worker.shutdown().await.unwrap();
        drop(runtime);
        close(queue).await;
    }

    // After it: a fresh queue and runtime over the same directory.
    let queue = open(&store, &clock).await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        runtime
            .signal("restart:wait", b"after".to_vec())
            .await
            .unwrap(),
        SignalOutcome::Delivered
    );
    let end = within(5, runtime.wait(&rid("waits-across"))).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"after".as_slice())
    );

    let run = submit(
        &runtime,
        "consumes-after",
        &format!("restart:buffer|{HOUR_MS}"),
    )
    .await;
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"kept".as_slice())
    );
    assert!(signal_keys(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

/// Waits on the key `"loop"` three times and succeeds with the signals it
/// received, joined by `+`.
struct Rewaits;

impl StepRunner for Rewaits {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let mut got = step.payload.clone();
        if let Some(signal) = &step.signal {
            if !got.is_empty() {
                got.push(b'+');
            }
            got.extend_from_slice(signal);
        }
        if step.step_number < 3 {
            Ok(StepOutcome::continue_on_signal(
                got,
                "loop",
                Duration::from_secs(3600),
            ))
        } else {
            Ok(StepOutcome::Succeed { result: got })
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_woken_run_may_wait_on_the_same_key_again() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Rewaits, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // The first signal is buffered before the run exists.
    runtime.signal("loop", b"1".to_vec()).await.unwrap();
    let run = runtime
        .submit(RunSpec {
            run_id: Some(rid("loops")),
            ..Default::default()
        })
        .await
        .unwrap()
        .run_id;
    for (step, payload) in [(2, "2"), (3, "3")] {
        within(30, async {
            loop {
                let status = runtime.status(&run).await.unwrap().unwrap();
                if status.current_step == step && !signal_keys(&queue).await.is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert_eq!(
            runtime
                .signal("loop", payload.as_bytes().to_vec())
                .await
                .unwrap(),
            SignalOutcome::Delivered,
            "signal {payload}"
        );
    }
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"1+2+3".as_slice())
    );
    assert!(signal_keys(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_signal_after_the_timeout_fired_is_buffered_and_the_step_sees_none() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = submit(&runtime, "late", "late-key|1000|flaky").await;
    reach_step(&runtime, &run, 1).await;
    worker.shutdown().await.unwrap();

    // The timeout fired (the step is claimable) but no worker ran it yet.
    clock.advance(Duration::from_secs(1));
    queue.promote_scheduled_now().await.unwrap();
    assert_eq!(
        runtime
            .signal("late-key", b"too late".to_vec())
            .await
            .unwrap(),
        SignalOutcome::Buffered
    );
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(5, runtime.wait(&run)).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"<timeout>".as_slice())
    );
    let seen: Vec<_> = runner
        .seen()
        .into_iter()
        .map(|s| (s.attempts, s.signal))
        .collect();
    assert_eq!(
        seen,
        vec![(1, None), (2, None)],
        "every delivery observes the timeout"
    );
    assert_eq!(
        signal_keys(&queue).await,
        vec!["workflow/signals/buffered/late-key".to_string()],
        "the late signal waits for the next waiter"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_signal_payload_over_the_kv_limit_is_rejected() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = runtime(&queue, &store, &Waiter::default());
    let big = vec![0u8; taquba::MAX_KV_VALUE_SIZE + 1];
    let err = runtime.signal("big", big).await.unwrap_err();
    assert!(
        matches!(
            err,
            taquba_workflow::Error::Queue(taquba::Error::KvValueTooLarge { .. })
        ),
        "{err}"
    );
    assert!(signal_keys(&queue).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn no_signal_state_outlives_a_woken_step_that_is_cancelled_or_fails() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Waiter::default();
    let runtime = runtime(&queue, &store, &runner);

    // Woken by a signal, cancelled before a worker claims the woken step.
    let worker = runtime.spawn(std::future::pending::<()>());
    let woken = submit(&runtime, "woken-then-cancelled", &format!("wc|{HOUR_MS}")).await;
    reach_step(&runtime, &woken, 1).await;
    worker.shutdown().await.unwrap();
    assert_eq!(
        runtime.signal("wc", b"x".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    assert!(runtime.cancel(&woken).await.unwrap());
    assert_eq!(
        within(5, runtime.wait(&woken))
            .await
            .unwrap()
            .termination
            .status,
        TerminalStatus::Cancelled
    );
    assert!(
        signal_keys(&queue).await.is_empty(),
        "{:?}",
        signal_keys(&queue).await
    );

    // Consumed a buffered signal, cancelled before its next step ran: the
    // worker is shut down while step 0 is in flight, so it drains step 0
    // and claims nothing more.
    runtime.signal("bc", b"y".to_vec()).await.unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    let started = runner.started.notified();
    let buffered = submit(
        &runtime,
        "buffered-then-cancelled",
        &format!("bc|{HOUR_MS}|gate0"),
    )
    .await;
    within(5, started).await;
    let shutdown = tokio::spawn(worker.shutdown());
    tokio::time::sleep(Duration::from_millis(10)).await;
    runner.gate.send_replace(true);
    within(5, shutdown).await.unwrap().unwrap();
    let status = runtime.status(&buffered).await.unwrap().unwrap();
    assert_eq!(status.current_step, 1);
    assert_eq!(
        signal_keys(&queue).await,
        vec!["workflow/signals/delivered/buffered-then-cancelled/1".to_string()],
        "the consumed signal is held for the step it woke"
    );
    assert!(runtime.cancel(&buffered).await.unwrap());
    let end = within(5, runtime.wait(&buffered)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert!(
        signal_keys(&queue).await.is_empty(),
        "{:?}",
        signal_keys(&queue).await
    );
    assert!(
        runner
            .seen()
            .iter()
            .all(|s| s.run_id != "buffered-then-cancelled"),
        "its step 1 never ran"
    );

    // Consumed a buffered signal and failed permanently on it.
    runtime.signal("bf", b"z".to_vec()).await.unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    let failed = submit(
        &runtime,
        "buffered-then-failed",
        &format!("bf|{HOUR_MS}|fail"),
    )
    .await;
    let end = within(5, runtime.wait(&failed)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(
        end.termination.error.as_deref(),
        Some("step 1 rejects every signal")
    );
    assert!(
        signal_keys(&queue).await.is_empty(),
        "{:?}",
        signal_keys(&queue).await
    );

    // Woken while waiting and failed permanently on it.
    let failed = submit(&runtime, "woken-then-failed", &format!("wf|{HOUR_MS}|fail")).await;
    reach_step(&runtime, &failed, 1).await;
    runtime.signal("wf", b"w".to_vec()).await.unwrap();
    let end = within(5, runtime.wait(&failed)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert!(
        signal_keys(&queue).await.is_empty(),
        "{:?}",
        signal_keys(&queue).await
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Signals racing each other, their waiter and its timeout.

/// Two signals sent at once on the key one run waits on: one is
/// delivered, the other buffered ("With no waiter the signal is held
/// durably"); the run ends with one payload and the other is what the
/// next wait on the key gets. Neither may be lost, neither delivered
/// twice.
#[tokio::test(start_paused = true)]
async fn two_signals_at_once_on_one_key_deliver_one_and_buffer_the_other() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for round in 0..20 {
        let key = format!("twice-{round}");
        let first = format!("first-{round}");
        runtime
            .submit(spec(&first, &format!("signal:{key}:3600000")))
            .await
            .unwrap();
        until_step("the wait", &runtime, &first, 1).await;
        let (a, b) = {
            let (r1, r2) = (runtime.clone(), runtime.clone());
            let (k1, k2) = (key.clone(), key.clone());
            let a = tokio::spawn(async move { r1.signal(&k1, b"A".to_vec()).await });
            for _ in 0..round % 4 {
                tokio::task::yield_now().await;
            }
            let b = tokio::spawn(async move { r2.signal(&k2, b"B".to_vec()).await });
            (a.await.unwrap().unwrap(), b.await.unwrap().unwrap())
        };
        let mut outcomes = vec![a, b];
        outcomes.sort_by_key(|o| matches!(o, SignalOutcome::Buffered));
        assert_eq!(
            outcomes,
            vec![SignalOutcome::Delivered, SignalOutcome::Buffered],
            "round {round}"
        );
        let got = ends_within(&runtime, &first, 30, "the woken run")
            .await
            .outcome
            .and_then(|o| o.result)
            .unwrap();
        let expected_other: &[u8] = if got == b"A" { b"B" } else { b"A" };
        let expected_delivered: &[u8] = if a == SignalOutcome::Delivered {
            b"A"
        } else {
            b"B"
        };
        assert_eq!(got, expected_delivered, "round {round}");
        let second = format!("second-{round}");
        runtime
            .submit(spec(&second, &format!("signal:{key}:3600000")))
            .await
            .unwrap();
        let got = ends_within(&runtime, &second, 30, "the buffered one")
            .await
            .outcome
            .and_then(|o| o.result)
            .unwrap();
        assert_eq!(got, expected_other, "round {round}");
    }
    worker.shutdown().await.unwrap();
}

/// A signal sent while the run that will wait on its key is being
/// submitted and runs its first step: delivered or buffered, the run must
/// end with the payload, never time out without it.
#[tokio::test(start_paused = true)]
async fn a_signal_racing_the_start_of_its_waiter_is_never_lost() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default())
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for k in 0..40usize {
        let id = format!("early-{k}");
        let key = format!("early-key-{k}");
        let submitted = {
            let runtime = runtime.clone();
            let input = format!("signal:{key}:60000");
            let id = id.clone();
            tokio::spawn(async move { runtime.submit(spec(&id, &input)).await })
        };
        for _ in 0..k {
            tokio::task::yield_now().await;
        }
        if k % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(k as u64 / 5)).await;
        }
        runtime.signal(&key, b"payload".to_vec()).await.unwrap();
        submitted.await.unwrap().unwrap();
        let end = ends_within(&runtime, &id, 120, "racing signal").await;
        assert_eq!(
            end.outcome.and_then(|o| o.result).as_deref(),
            Some(&b"payload"[..]),
            "{id}: the signal was lost"
        );
    }
    worker.shutdown().await.unwrap();
}

/// Signals racing the timeout of the wait they are meant for, sent at
/// moments around it. `signal`'s answer must say what happened: a run
/// whose signal was answered `Delivered` ends with its payload, and one
/// answered `Buffered` timed out (its payload then waits for the next
/// waiter). `signal_run` answered `Ok` must have reached the run, and a
/// refusal (`NotWaitingForSignal`) means the run timed out.
#[tokio::test(start_paused = true)]
async fn signals_racing_the_timeout_of_their_wait_answer_what_happened() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default())
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for targeted in [false, true] {
        let mut seen = (0, 0);
        for k in 0..30u64 {
            let id = format!("late-{targeted}-{k}");
            let key = format!("late-key-{targeted}-{k}");
            runtime
                .submit(spec(&id, &format!("signal:{key}:20")))
                .await
                .unwrap();
            until_step("the wait", &runtime, &id, 1).await;
            // Around the moment the 20 ms timeout is acted on (the queue's
            // scheduler promotes due jobs at its own interval).
            tokio::time::sleep(Duration::from_millis(37 * k)).await;
            let delivered = if targeted {
                match runtime.signal_run(&rid(&id), &key, b"sig".to_vec()).await {
                    Ok(()) => true,
                    Err(taquba_workflow::Error::NotWaitingForSignal { .. }) => false,
                    Err(err) => panic!("{id}: {err}"),
                }
            } else {
                runtime.signal(&key, b"sig".to_vec()).await.unwrap() == SignalOutcome::Delivered
            };
            let result = ends_within(&runtime, &id, 30, "raced timeout")
                .await
                .outcome
                .and_then(|o| o.result)
                .unwrap();
            if delivered {
                seen.0 += 1;
                assert_eq!(
                    result, b"sig",
                    "{id}: answered delivered, the run timed out"
                );
            } else {
                seen.1 += 1;
                assert_eq!(
                    result, b"timed out",
                    "{id}: answered not delivered, the run got it"
                );
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "both sides of the race: {seen:?}");
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// A crash after a signal, and oversized keys.

/// `signal` answered `Delivered`/`Buffered` before a crash is not lost.
#[tokio::test(start_paused = true)]
async fn a_signal_answered_before_a_crash_is_delivered_after_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let outcome = runtime.signal("early", b"first".to_vec()).await.unwrap();
    assert!(matches!(outcome, SignalOutcome::Buffered), "{outcome:?}");
    drop(runtime);
    drop(queue);
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("late", "signal:early")).await.unwrap();
    let end = within(60, runtime.wait(&rid("late"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"first"[..])
    );
    worker.shutdown().await.unwrap();
}

/// A step that waits on a correlation key far larger than a KV key can be
/// (70 000 bytes; keys are stored as `workflow/signals/waiters/{key}`) must
/// not leave the run `Running` forever or the worker spinning: the run
/// fails with an error, or waits and is woken by the same key.
#[tokio::test(start_paused = true)]
async fn a_step_waiting_on_an_oversized_signal_key_fails_or_waits() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runner = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let key = "k".repeat(70_000);
    runtime
        .submit(spec("huge-key", &format!("signal:{key}")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let now = state(&runtime, "huge-key").await;
    match now {
        Some(RunState::Terminated(t)) => {
            assert_eq!(t.status, TerminalStatus::Failed);
        }
        Some(RunState::Pending) => {
            let outcome = within(30, runtime.signal(&key, b"x".to_vec())).await;
            match outcome {
                Ok(_) => {
                    ends_within(&runtime, "huge-key", 30, "woken").await;
                }
                Err(err) => panic!("the run waits on a key no signal can reach: {err}"),
            }
        }
        other => panic!(
            "run on a 70 KB key is {other:?} after 30 s ({} attempts)",
            runner.calls.lock().unwrap().len()
        ),
    }
    // The worker still serves other runs.
    runtime.submit(spec("after-huge", "ok")).await.unwrap();
    ends_within(&runtime, "after-huge", 30, "after the huge key").await;
    worker.shutdown().await.unwrap();
}

/// A signal sent on an oversized key answers a clear error (or works);
/// it must not hang.
#[tokio::test(start_paused = true)]
async fn a_signal_on_an_oversized_key_errs_or_is_buffered() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let key = "k".repeat(70_000);
    let refused = |result: taquba_workflow::Result<_>| match result {
        Err(taquba_workflow::Error::InvalidCorrelationKey { len, max, start }) => {
            assert_eq!(
                (len, max),
                (70_000, taquba_workflow::limits::MAX_CORRELATION_KEY_LEN)
            );
            assert_eq!(start, "k".repeat(64));
        }
        other => panic!("expected InvalidCorrelationKey, got {other:?}"),
    };
    refused(runtime.signal(&key, b"x".to_vec()).await.map(|_| ()));
    refused(runtime.clear_signal(&key).await.map(|_| ()));
    refused(
        runtime
            .signal_run(&rid("after-sig"), &key, b"x".to_vec())
            .await,
    );
    // The runtime still works, and a step continuing on such a key fails
    // its run with the error instead of waiting on a key no signal can
    // reach.
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("after-sig", "ok")).await.unwrap();
    ends_within(&runtime, "after-sig", 30, "after the huge signal").await;
    runtime
        .submit(spec("huge-wait", &format!("signal:{key}")))
        .await
        .unwrap();
    assert_eq!(
        ends_within(&runtime, "huge-wait", 30, "waiting on a huge key")
            .await
            .termination
            .status,
        TerminalStatus::Failed
    );
    let error = runtime
        .outcome(&rid("huge-wait"))
        .await
        .unwrap()
        .and_then(|o| o.error)
        .unwrap_or_default();
    assert!(error.contains("70000 bytes long"), "{error}");
    worker.shutdown().await.unwrap();
}
