//! Signals that outlive their wait (issue 12, point 10). `signal` keeps
//! 0.13's buffering, so a signal sent early, after the wait timed out, or
//! twice is held and wakes the next wait on its key, whoever's it is;
//! `signal_run` is addressed to one run's current wait and refused (nothing
//! buffered) when that run is not waiting on the key.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use taquba::Queue;
use taquba_workflow::{
    Error, NoopTerminalHook, RunId, RunSpec, RunState, SignalOutcome, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};

/// The signal each run's step 1 saw.
type SeenSignals = Arc<Mutex<Vec<(RunId, Option<Vec<u8>>)>>>;

/// Step 0 waits on the key its input names (`"{key}|{timeout_ms}"`); step
/// 1 notes the signal it saw and succeeds with it (`<timeout>` without).
#[derive(Clone, Default)]
struct Waits {
    seen: SeenSignals,
}

impl Waits {
    fn seen_by(&self, run_id: &str) -> Vec<Option<Vec<u8>>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| id == run_id)
            .map(|(_, signal)| signal.clone())
            .collect()
    }
}

impl StepRunner for Waits {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        let (key, timeout_ms) = input
            .split_once('|')
            .ok_or_else(|| StepError::permanent("bad input"))?;
        let timeout_ms: u64 = timeout_ms
            .parse()
            .map_err(|_| StepError::permanent("bad timeout"))?;
        if step.step_number == 0 {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_millis(timeout_ms),
            ));
        }
        self.seen
            .lock()
            .unwrap()
            .push((step.run_id.clone(), step.signal.clone()));
        Ok(StepOutcome::Succeed {
            result: step.signal.clone().unwrap_or_else(|| b"<timeout>".to_vec()),
        })
    }
}

type Runtime = WorkflowRuntime<Waits, NoopTerminalHook>;

async fn submit(runtime: &Runtime, id: &str, key: &str, timeout_ms: u64) {
    runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: format!("{key}|{timeout_ms}").into_bytes(),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Until run `id` waits at step 1 (the settlement that moves it there
/// registers its wait).
async fn until_waiting(runtime: &Runtime, id: &str) {
    until_step("the wait", runtime, id, 1).await;
}

async fn buffered(queue: &Queue) -> usize {
    queue
        .view()
        .kv_scan(b"workflow/signals/buffered/", .., 10)
        .await
        .unwrap()
        .entries
        .len()
}

async fn ended(runtime: &Runtime, id: &str) -> Vec<u8> {
    let end = within(30, runtime.wait(&rid(id))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    end.outcome.expect("recorded").result.expect("a result")
}

const HOUR_MS: u64 = 3_600_000;

/// The hazard `signal` keeps: a signal sent twice to one wait delivers the
/// first and buffers the second, which a later, unrelated run waiting on
/// the key then consumes at once.
#[tokio::test(start_paused = true)]
async fn a_buffered_signal_wakes_a_later_unrelated_wait() {
    let (queue, store, _clock) = memory_queue().await;
    let waits = Waits::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &waits).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit(&runtime, "first", "order-7", HOUR_MS).await;
    until_waiting(&runtime, "first").await;
    let sent = |payload: &'static str| runtime.signal("order-7", payload.as_bytes().to_vec());
    assert_eq!(sent("paid").await.unwrap(), SignalOutcome::Delivered);
    assert_eq!(sent("paid again").await.unwrap(), SignalOutcome::Buffered);
    assert_eq!(ended(&runtime, "first").await, b"paid");

    submit(&runtime, "later", "order-7", HOUR_MS).await;
    assert_eq!(
        ended(&runtime, "later").await,
        b"paid again",
        "the later run consumed the signal meant for the first"
    );
    worker.shutdown().await.unwrap();
}

/// `signal_run` wakes the named run waiting on the key, with the payload.
#[tokio::test(start_paused = true)]
async fn signal_run_wakes_the_named_runs_wait() {
    let (queue, store, _clock) = memory_queue().await;
    let waits = Waits::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &waits).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit(&runtime, "approval", "approve:1", HOUR_MS).await;
    until_waiting(&runtime, "approval").await;
    runtime
        .signal_run(&rid("approval"), "approve:1", b"yes".to_vec())
        .await
        .unwrap();
    assert_eq!(ended(&runtime, "approval").await, b"yes");
    assert_eq!(buffered(&queue).await, 0);
    worker.shutdown().await.unwrap();
}

fn is_not_waiting(err: &Error, run_id: &str, key: &str) -> bool {
    matches!(
        err,
        Error::NotWaitingForSignal { run_id: r, correlation_key: k } if r == run_id && k == key
    ) && err.to_string().contains(run_id)
        && err.to_string().contains(key)
}

/// Sent before the run waits, after its wait timed out, a second time, on
/// another key, or to a run that is not the key's waiter: refused, nothing
/// buffered, and no wait (the named run's or another's) sees it.
#[tokio::test(start_paused = true)]
async fn signal_run_is_refused_unless_the_run_waits_on_the_key() {
    let (queue, store, clock) = memory_queue().await;
    let waits = Waits::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &waits).build();

    // Unknown run.
    let err = runtime
        .signal_run(&rid("nobody"), "k", b"x".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RunNotFound(ref r) if r == "nobody"),
        "{err}"
    );

    // Early: submitted, its step 0 not run yet.
    submit(&runtime, "early", "early-key", HOUR_MS).await;
    let err = runtime
        .signal_run(&rid("early"), "early-key", b"too soon".to_vec())
        .await
        .unwrap_err();
    assert!(is_not_waiting(&err, "early", "early-key"), "{err}");
    assert_eq!(buffered(&queue).await, 0, "nothing is buffered");

    let worker = runtime.spawn(std::future::pending::<()>());
    until_waiting(&runtime, "early").await;
    // On another key, and to a run that is not the key's waiter.
    let err = runtime
        .signal_run(&rid("early"), "other-key", b"x".to_vec())
        .await
        .unwrap_err();
    assert!(is_not_waiting(&err, "early", "other-key"), "{err}");
    submit(&runtime, "bystander", "bystander-key", HOUR_MS).await;
    until_step("the bystander waits", &runtime, "bystander", 1).await;
    let err = runtime
        .signal_run(&rid("bystander"), "early-key", b"x".to_vec())
        .await
        .unwrap_err();
    assert!(is_not_waiting(&err, "bystander", "early-key"), "{err}");
    assert_eq!(
        runtime
            .status(&rid("early"))
            .await
            .unwrap()
            .unwrap()
            .current_step,
        1
    );
    assert!(matches!(
        runtime.status(&rid("early")).await.unwrap().unwrap().state,
        RunState::Pending
    ));

    // Delivered once; a second one is refused.
    runtime
        .signal_run(&rid("early"), "early-key", b"once".to_vec())
        .await
        .unwrap();
    assert_eq!(ended(&runtime, "early").await, b"once");
    let err = runtime
        .signal_run(&rid("early"), "early-key", b"twice".to_vec())
        .await
        .unwrap_err();
    assert!(is_not_waiting(&err, "early", "early-key"), "{err}");

    // After the wait timed out.
    submit(&runtime, "late", "late-key", 1_000).await;
    until_waiting(&runtime, "late").await;
    clock.advance(Duration::from_secs(2));
    assert_eq!(ended(&runtime, "late").await, b"<timeout>");
    let err = runtime
        .signal_run(&rid("late"), "late-key", b"too late".to_vec())
        .await
        .unwrap_err();
    assert!(is_not_waiting(&err, "late", "late-key"), "{err}");

    // None of the refused signals was held for a later wait.
    assert_eq!(buffered(&queue).await, 0);
    for key in ["early-key", "late-key"] {
        let id = format!("after-{key}");
        submit(&runtime, &id, key, 1_000).await;
        until_step("the later wait", &runtime, &id, 1).await;
        clock.advance(Duration::from_secs(2));
        assert_eq!(ended(&runtime, &id).await, b"<timeout>", "{key}");
    }
    assert_eq!(waits.seen_by("early"), vec![Some(b"once".to_vec())]);
    worker.shutdown().await.unwrap();
}

/// The typed form encodes the value as `signal_value` does.
#[tokio::test(start_paused = true)]
async fn signal_run_value_sends_the_encoded_value() {
    let (queue, store, _clock) = memory_queue().await;
    let waits = Waits::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &waits).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit(&runtime, "typed", "typed-key", HOUR_MS).await;
    until_waiting(&runtime, "typed").await;
    runtime
        .signal_run_value(&rid("typed"), "typed-key", &("approved", 3u8))
        .await
        .unwrap();
    assert_eq!(
        ended(&runtime, "typed").await,
        rmp_serde::to_vec_named(&("approved", 3u8)).unwrap()
    );
    worker.shutdown().await.unwrap();
}

/// A signal payload over the KV value limit is refused as `signal` refuses
/// it, before anything is read.
#[tokio::test(start_paused = true)]
async fn signal_run_refuses_an_oversized_payload() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime: Runtime = workflow_builder(&queue, &store, &Waits::default()).build();
    let err = runtime
        .signal_run(&rid("any"), "k", vec![0; taquba::MAX_KV_VALUE_SIZE + 1])
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Queue(taquba::Error::KvValueTooLarge { .. })),
        "{err}"
    );
}
