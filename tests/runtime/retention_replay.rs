//! Step-output replay after a lease expiry, and memo retention.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use futures_util::TryStreamExt;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba::{MockClock, Queue, QueueConfig};
use taquba_workflow::{
    Error, MemoStore, NoopTerminalHook, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime, WorkflowRuntimeBuilder,
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

/// Every object under `prefix`.
async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<Path> {
    store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
        .unwrap()
}

fn spec(id: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: b"input".to_vec(),
        ..Default::default()
    }
}

/// Step 0's first call stages `app/effect`, reports it started and waits
/// for the gate, then returns `first`; later calls return `Succeed`. Every
/// call of step 0 is counted.
fn blocks_once(
    calls: Arc<AtomicU32>,
    gate: Gate,
    started: tokio::sync::mpsc::UnboundedSender<()>,
    first: StepOutcome,
) -> impl StepRunner {
    FnRunner(move |step: Step| {
        let (calls, gate, started, first) =
            (calls.clone(), gate.clone(), started.clone(), first.clone());
        async move {
            if step.step_number > 0 {
                return Ok(StepOutcome::Succeed {
                    result: b"later step".to_vec(),
                });
            }
            let call = calls.fetch_add(1, Ordering::SeqCst);
            step.effects.put("app/effect", format!("call {call}"))?;
            if call == 0 {
                started.send(()).ok();
                gate.wait().await;
                return Ok(first);
            }
            Ok(StepOutcome::Succeed {
                result: b"ran again".to_vec(),
            })
        }
    })
}

/// A runtime with step-output replay over a [`short_lease_queue`], whose
/// runner is [`blocks_once`] returning `first`. Runs the first delivery of
/// run `id` until its runner blocks, lets its lease expire and the reaper
/// re-queue the step, then stops the worker and releases the runner, whose
/// outcome is recorded but whose settlement finds the claim lost. Returns
/// when that worker has drained, with the queue, the store, the clock, the
/// runner's call count and the runtime.
async fn outlive_the_lease(
    id: &str,
    first: StepOutcome,
) -> (
    Arc<Queue>,
    Arc<dyn ObjectStore>,
    MockClock,
    Arc<AtomicU32>,
    WorkflowRuntime<impl StepRunner + use<>, NoopTerminalHook>,
) {
    let (queue, store, clock) = short_lease_queue().await;
    let (calls, gate) = (Arc::new(AtomicU32::new(0)), Gate::default());
    let (started, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runner = blocks_once(calls.clone(), gate.clone(), started, first);
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
        .step_output_replay()
        .max_concurrent_steps(1)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec(id)).await.unwrap();
    within(10, seen.recv()).await.expect("the first call");
    clock.advance(LEASE + Duration::from_secs(1));
    queue.reap_now().await.unwrap();
    assert_eq!(
        queue.view().stats(STEPS).await.unwrap().pending,
        1,
        "re-queued"
    );
    let stopping = tokio::spawn(worker.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    gate.open();
    within(10, stopping).await.unwrap().unwrap();
    let status = runtime.status(&rid(id)).await.unwrap().unwrap();
    assert_eq!(
        status.state,
        RunState::Pending,
        "the lost settlement did not commit"
    );
    assert!(queue.view().kv_get(b"app/effect").await.unwrap().is_none());
    (queue, store, clock, calls, runtime)
}

#[tokio::test(start_paused = true)]
async fn a_step_redelivered_after_its_lease_expired_replays_its_outcome() {
    let (queue, _store, _clock, calls, runtime) = outlive_the_lease(
        "replayed",
        StepOutcome::Succeed {
            result: b"once".to_vec(),
        },
    )
    .await;

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(30, runtime.wait(&rid("replayed"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"once".as_slice()),
        "the recorded outcome, not a second call's"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the runner ran once");
    assert_eq!(
        queue.view().kv_get(b"app/effect").await.unwrap().as_deref(),
        Some(b"call 0".as_slice()),
        "the recorded effects applied with the replay"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_replayed_delay_keeps_its_original_schedule() {
    let (queue, _store, clock, calls, runtime) = outlive_the_lease(
        "delayed",
        StepOutcome::continue_after(b"next".to_vec(), Duration::from_secs(100)),
    )
    .await;
    // The outcome was recorded at T0 + 11 s; the redelivery runs 30 s later.
    let recorded_at = T0 + 11_000;
    clock.advance(Duration::from_secs(30));

    let worker = runtime.spawn(std::future::pending::<()>());
    until_step("the replayed step 0 to commit", &runtime, "delayed", 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let current = runtime.submit(spec("delayed")).await.unwrap();
    let job = job_record(&queue, &current.job_id, "step 1").await;
    assert_eq!(
        job.run_at,
        Some(recorded_at + 100_000),
        "the delay counts from the recorded outcome"
    );
    clock.advance(Duration::from_secs(70));
    queue.promote_scheduled_now().await.unwrap();
    let end = within(30, runtime.wait(&rid("delayed"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_replay_record_is_ignored_and_the_step_runs_again() {
    let (queue, store, _clock, calls, runtime) = outlive_the_lease(
        "corrupt",
        StepOutcome::Succeed {
            result: b"once".to_vec(),
        },
    )
    .await;
    let records = objects_under(&store, &format!("{MEMO_PREFIX}/runs/corrupt/replay")).await;
    assert_eq!(records.len(), 1, "{records:?}");
    store
        .put(&records[0], PutPayload::from_static(b"\xc1 garbage"))
        .await
        .unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(30, runtime.wait(&rid("corrupt"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"ran again".as_slice())
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        queue.view().kv_get(b"app/effect").await.unwrap().as_deref(),
        Some(b"call 1".as_slice())
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn step_errors_are_not_replayed() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let runner = {
        let calls = calls.clone();
        FnRunner(move |_step: Step| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if call == 0 {
                    Err(StepError::transient("flaky"))
                } else {
                    Ok(StepOutcome::Succeed {
                        result: format!("call {call}").into_bytes(),
                    })
                }
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("flaky")).await.unwrap();
    let end = within(30, runtime.wait(&rid("flaky"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"call 1".as_slice())
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the retry called the runner"
    );
    let records = objects_under(&store, &format!("{MEMO_PREFIX}/runs/flaky/replay")).await;
    assert_eq!(
        records.len(),
        1,
        "only the outcome was recorded: {records:?}"
    );
    worker.shutdown().await.unwrap();
}

/// Writes a step memo and a run memo entry, then succeeds, unless the run
/// is `active`, whose step 0 waits ten hours for step 1.
fn memo_writer() -> impl StepRunner {
    FnRunner(|step: Step| async move {
        step.memo.put("k", b"step").await?;
        step.run_memo.put("r", b"run").await?;
        step.effects.put(format!("app/ran/{}", step.run_id), "1")?;
        if step.run_id == "active" && step.step_number == 0 {
            return Ok(StepOutcome::continue_after(
                vec![],
                Duration::from_secs(36_000),
            ));
        }
        Ok(StepOutcome::Succeed { result: vec![] })
    })
}

/// A [`memo_writer`] runtime keeping memos for `retention`, polling every
/// 100 ms.
fn memo_runtime(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    retention: Duration,
) -> WorkflowRuntimeBuilder<impl StepRunner + use<>, NoopTerminalHook> {
    WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        memo_writer(),
        NoopTerminalHook,
    )
    .memo_retention(retention)
    .poll_interval(Duration::from_millis(100))
}

#[tokio::test(start_paused = true)]
async fn memo_retention_removes_an_expired_runs_state_and_keeps_active_runs() {
    let (queue, store, clock) = memory_queue().await;
    let runtime = memo_runtime(&queue, &store, Duration::from_secs(3600))
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("done")).await.unwrap();
    runtime.submit(spec("active")).await.unwrap();
    let end = within(30, runtime.wait(&rid("done"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    until_step("the active run to reach step 1", &runtime, "active", 1).await;
    let done_dir = format!("{MEMO_PREFIX}/runs/done");
    let active_dir = format!("{MEMO_PREFIX}/runs/active");
    // Step memo, run memo, run result record and replay record.
    assert_eq!(objects_under(&store, &done_dir).await.len(), 4);
    let active_before = objects_under(&store, &active_dir).await;
    assert_eq!(active_before.len(), 3, "{active_before:?}");

    // Just inside the window nothing is removed.
    clock.advance(Duration::from_millis(3_599_999));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.outcome(&rid("done")).await.unwrap().is_some());
    assert_eq!(objects_under(&store, &done_dir).await.len(), 4);

    clock.advance(Duration::from_millis(1));
    eventually("the sweep", || async {
        runtime.status(&rid("done")).await.unwrap().is_none()
    })
    .await;
    assert!(objects_under(&store, &done_dir).await.is_empty());
    assert!(runtime.outcome(&rid("done")).await.unwrap().is_none());
    assert!(matches!(
        runtime.wait(&rid("done")).await,
        Err(Error::RunNotFound(_))
    ));
    let markers = queue
        .view()
        .kv_scan(b"workflow/terminals/", .., 100)
        .await
        .unwrap();
    assert!(markers.entries.is_empty(), "the marker went with the run");
    assert_eq!(
        queue
            .view()
            .kv_get(b"app/ran/done")
            .await
            .unwrap()
            .as_deref(),
        Some(b"1".as_slice()),
        "application state is the application's"
    );

    // The active run's entries stay.
    assert_eq!(objects_under(&store, &active_dir).await, active_before);
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    assert_eq!(
        memos
            .new_memo(&rid("active"), 0)
            .get("k")
            .await
            .unwrap()
            .as_deref(),
        Some(b"step".as_slice())
    );
    assert_eq!(
        runtime.status(&rid("active")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_zero_retention_window_removes_the_state_at_the_next_pass() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        memo_writer(),
        NoopTerminalHook,
    )
    .memo_retention(Duration::ZERO)
    .poll_interval(Duration::from_millis(100))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("brief")).await.unwrap();
    eventually("the run to end and be swept", || async {
        queue
            .view()
            .kv_get(b"app/ran/brief")
            .await
            .unwrap()
            .is_some()
            && runtime.status(&rid("brief")).await.unwrap().is_none()
    })
    .await;
    assert!(
        objects_under(&store, &format!("{MEMO_PREFIX}/runs/brief"))
            .await
            .is_empty()
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn runs_terminated_without_a_worker_settlement_are_swept_too() {
    let (queue, store, clock) = memory_queue().await;
    let runtime = memo_runtime(&queue, &store, Duration::from_secs(60)).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // Let the sweeps find nothing to expire first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = RunSpec {
        options: taquba_workflow::RunOptions {
            run_at: Some(std::time::UNIX_EPOCH + Duration::from_millis(T0 + 3_600_000)),
            ..Default::default()
        },
        ..spec("x")
    };
    // A cancellation of a waiting step, and a dead letter outside the
    // worker reconciled by it.
    runtime
        .submit(RunSpec {
            run_id: Some(rid("cancelled")),
            ..later.clone()
        })
        .await
        .unwrap();
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    memos
        .new_run_memo(&rid("cancelled"))
        .put("k", b"v")
        .await
        .unwrap();
    assert!(runtime.cancel(&rid("cancelled")).await.unwrap());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("dead")),
            ..later
        })
        .await
        .unwrap();
    clock.advance(Duration::from_secs(3600));
    queue.promote_scheduled_now().await.unwrap();
    let claim = claim_step(&queue).await.expect("the step of `dead`");
    queue.dead_letter(&claim, "hung").await.unwrap();
    until_terminated("the reconciliation", &runtime, "dead").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(runtime.status(&rid("dead")).await.unwrap().is_some());

    clock.advance(Duration::from_secs(60));
    eventually("both runs to be swept", || async {
        runtime.status(&rid("cancelled")).await.unwrap().is_none()
            && runtime.status(&rid("dead")).await.unwrap().is_none()
    })
    .await;
    assert!(
        objects_under(&store, &format!("{MEMO_PREFIX}/runs/cancelled"))
            .await
            .is_empty()
    );
    worker.shutdown().await.unwrap();
}
