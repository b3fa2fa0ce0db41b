//! Poison input: payloads and jobs that cannot be decoded, runners and
//! hooks that panic, oversized results, effects, signals and failure
//! messages. Each ends its run `Failed` with an error naming the cause (or
//! dead-letters the hook's notification after its retries), the worker
//! keeps running, and other runs are unaffected.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::common::{Recorder, eventually};
use crate::fixtures::{ends_within, queue_with, spec};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{EnqueueOptions, JobRecord, OpenOptions, Queue, QueueConfig};
use taquba_workflow::limits::MAX_TERMINATION_ERROR_LEN;
use taquba_workflow::{
    Error, HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, NoopTerminalHook, RunOutcome, RunSpec,
    Step, StepError, StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus,
    WorkflowRuntime,
};
use taquba_workflow_suite::testing::TokioClock;

const T0: u64 = 1_700_000_000_000;
/// The runtime's default queue name.
const QUEUE: &str = "workflow-steps";

async fn queue() -> (Arc<Queue>, Arc<dyn ObjectStore>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = OpenOptions::default()
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::from_millis(10))
                .max_attempts(3),
        );
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("open queue");
    (Arc::new(queue), store)
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(600), f)
        .await
        .expect("finished in time")
}

/// The step input every run of [`Typed`] takes.
#[derive(Serialize, Deserialize)]
struct Order {
    id: u64,
    lines: Vec<String>,
}

/// A runner that decodes its payload as an [`Order`] and behaves as the
/// order says: `panic`, `big-result`, `big-effect`, anything else
/// succeeds with the order id.
struct Typed;

impl StepRunner for Typed {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let order: Order = rmp_serde::from_slice(&step.payload)
            .map_err(|e| StepError::permanent(format!("cannot decode the order payload: {e}")))?;
        match order.lines.first().map(String::as_str) {
            Some("panic") => panic!("order {} has a poisoned line", order.id),
            Some("big-result") => Ok(StepOutcome::Succeed {
                result: vec![7u8; 4 * 1024 * 1024],
            }),
            Some("big-effect") => {
                step.effects.put("app/big", vec![0u8; 300 * 1024])?;
                Ok(StepOutcome::Succeed { result: vec![] })
            }
            _ => Ok(StepOutcome::Succeed {
                result: order.id.to_string().into_bytes(),
            }),
        }
    }
}

fn order(id: u64, line: &str) -> Vec<u8> {
    rmp_serde::to_vec_named(&Order {
        id,
        lines: vec![line.to_string()],
    })
    .expect("encode order")
}

async fn submit(
    runtime: &WorkflowRuntime<impl StepRunner + 'static, impl TerminalHook + 'static>,
    input: Vec<u8>,
) -> taquba_workflow::RunId {
    runtime
        .submit(RunSpec {
            input,
            ..RunSpec::default()
        })
        .await
        .expect("submit")
        .run_id
}

#[tokio::test(start_paused = true)]
async fn undecodable_payloads_panics_and_oversized_effects_fail_only_their_runs() {
    let (queue, store) = queue().await;
    let runtime = WorkflowRuntime::builder(queue, store, Typed, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());

    let garbage = submit(&runtime, vec![0xc1, 0xff, 0x00, 0x13]).await;
    let panics = submit(&runtime, order(2, "panic")).await;
    let big_effect = submit(&runtime, order(3, "big-effect")).await;
    let good = submit(&runtime, order(4, "fine")).await;

    let end = within(runtime.wait(&garbage)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.expect("error");
    assert!(error.contains("cannot decode the order payload"), "{error}");

    let end = within(runtime.wait(&panics)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.expect("error");
    assert!(
        error.contains("panicked") && error.contains("order 2 has a poisoned line"),
        "{error}"
    );

    let end = within(runtime.wait(&big_effect)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.expect("error");
    assert!(
        error.contains("too large") && error.contains("307200"),
        "{error}"
    );

    let end = within(runtime.wait(&good)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"4"[..])
    );

    // The worker is still serving.
    let later = submit(&runtime, order(5, "fine")).await;
    let end = within(runtime.wait(&later)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.expect("worker ends cleanly");
}

/// Records each hook call; panics for runs whose result is `b"boom"`.
#[derive(Default)]
struct PanickyHook {
    calls: AtomicU32,
    seen: std::sync::Mutex<HashMap<String, Vec<u8>>>,
}

/// The hook as the runtime holds it, shared with the test.
struct SharedHook(Arc<PanickyHook>);

impl TerminalHook for SharedHook {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let this = &self.0;
        this.calls.fetch_add(1, Ordering::SeqCst);
        let result = outcome.result.clone().unwrap_or_default();
        if result == b"boom" {
            panic!("the hook cannot handle run {}", outcome.run_id);
        }
        effects.put(format!("app/hook/{}", outcome.run_id), b"1".to_vec())?;
        this.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(outcome.run_id.to_string(), result);
        Ok(())
    }
}

struct Echo;

impl StepRunner for Echo {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

async fn dead_notifications(queue: &Queue) -> Vec<JobRecord> {
    queue
        .view()
        .dead_jobs(QUEUE, None, 100)
        .await
        .expect("dead jobs")
        .into_iter()
        .filter(|job| job.headers.contains_key(HEADER_TERMINAL))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_panicking_hook_is_retried_then_dead_lettered_and_others_are_notified() {
    let (queue, store) = queue().await;
    let hook = Arc::new(PanickyHook::default());
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store, Echo, SharedHook(hook.clone())).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let boom = submit(&runtime, b"boom".to_vec()).await;
    let fine = submit(&runtime, b"fine".to_vec()).await;
    // The runs themselves succeed: the hook runs after the termination
    // committed.
    for run in [&boom, &fine] {
        let end = within(runtime.wait(run)).await.expect("wait");
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    }
    let dead = within(async {
        loop {
            let dead = dead_notifications(&queue).await;
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(dead.len(), 1);
    let error = dead[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("terminal hook panicked") && error.contains(boom.as_str()),
        "{error}"
    );
    assert_eq!(dead[0].attempts, 3, "retried to its attempt limit");
    let seen = hook.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert_eq!(
        seen.get(fine.as_str()).map(Vec::as_slice),
        Some(&b"fine"[..])
    );
    assert!(
        queue
            .view()
            .kv_get(format!("app/hook/{fine}").as_bytes())
            .await
            .expect("kv")
            .is_some()
    );
    assert!(
        queue
            .view()
            .kv_get(format!("app/hook/{boom}").as_bytes())
            .await
            .expect("kv")
            .is_none()
    );
    worker.shutdown().await.expect("worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn foreign_and_malformed_jobs_are_dead_lettered_with_their_cause() {
    let (queue, store) = queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Echo, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // A job the runtime did not enqueue, one with a bad step header, and a
    // notification whose payload is not an outcome record.
    let foreign = queue
        .enqueue(QUEUE, b"hello".to_vec())
        .await
        .expect("enqueue");
    let bad_step = queue
        .enqueue_with(
            QUEUE,
            b"x".to_vec(),
            EnqueueOptions::default()
                .header(HEADER_RUN_ID, "r-bad")
                .header(HEADER_STEP, "seven"),
        )
        .await
        .expect("enqueue");
    let bad_note = queue
        .enqueue_with(
            QUEUE,
            vec![0xc1],
            EnqueueOptions::default()
                .header(HEADER_TERMINAL, "succeeded")
                .header(HEADER_RUN_ID, "r-note"),
        )
        .await
        .expect("enqueue");
    let good = submit(&runtime, b"ok".to_vec()).await;
    let end = within(runtime.wait(&good)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let expect = [
        (foreign, "workflow.run_id"),
        (bad_step, "seven"),
        (bad_note, "malformed terminal notification"),
    ];
    for (id, cause) in expect {
        let job = within(async {
            loop {
                let job = queue
                    .view()
                    .get_job(&id)
                    .await
                    .expect("get job")
                    .expect("job kept");
                if job.status == taquba::JobStatus::Dead {
                    return job;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let error = job.last_error.unwrap_or_default();
        assert!(error.contains(cause), "job {id}: {error}");
    }
    // Still serving.
    let later = submit(&runtime, b"later".to_vec()).await;
    let end = within(runtime.wait(&later)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.expect("worker ends cleanly");
}

#[tokio::test(start_paused = true)]
async fn oversized_results_are_stored_and_oversized_signals_are_refused() {
    let (queue, store) = queue().await;
    let runtime = WorkflowRuntime::builder(queue, store, Typed, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // A result far over the queue's inline payload size is kept whole (in
    // the memo store, outside the queue's KV).
    let big = submit(&runtime, order(1, "big-result")).await;
    let end = within(runtime.wait(&big)).await.expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let result = end.outcome.and_then(|o| o.result).expect("result");
    assert_eq!(result.len(), 4 * 1024 * 1024);
    // A signal payload over the KV cap is refused, naming the sizes.
    let err = runtime
        .signal("k", vec![0u8; 300 * 1024])
        .await
        .expect_err("oversized signal refused");
    assert!(matches!(err, Error::Queue(_)), "{err:?}");
    assert!(err.to_string().contains("307200"), "{err}");
    worker.shutdown().await.expect("worker ends cleanly");
}

/// Runners failing with huge messages (1 MiB): a `Fail` verdict's reason,
/// a permanent error, a transient error on every attempt. README: "a
/// permanent error dead-letters the step and fails the run"; the error is
/// what the caller reads. Each run must end `Failed` promptly (no lease
/// expiry in between), its error starting with the runner's message, the
/// runner called once for the verdict and the permanent error, and once
/// per attempt for the transient one. The terminal record's error is cut
/// to `MAX_TERMINATION_ERROR_LEN`, the outcome's is whole.
#[tokio::test(start_paused = true)]
async fn failures_with_huge_messages_end_their_runs_with_the_message() {
    #[derive(Clone, Default)]
    struct Loud {
        calls: Arc<Mutex<Vec<String>>>,
    }
    impl StepRunner for Loud {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            self.calls.lock().unwrap().push(step.run_id.to_string());
            let message = format!("{}:{}", step.run_id, "x".repeat(1 << 20));
            match step.payload.as_slice() {
                b"verdict" => Ok(StepOutcome::Fail { reason: message }),
                b"perm" => Err(StepError::permanent(message)),
                _ => Err(StepError::transient(message)),
            }
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::from_secs(30), Duration::ZERO).await;
    let loud = Loud::default();
    let hook = Recorder::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), loud.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, calls) in [("loud-verdict", 1), ("loud-perm", 1), ("loud-trans", 3)] {
        let input = id.strip_prefix("loud-").unwrap();
        runtime.submit(spec(id, input)).await.unwrap();
        // Well inside one 30 s lease.
        let end = ends_within(&runtime, id, 10, "a huge failure").await;
        assert_eq!(end.termination.status, TerminalStatus::Failed, "{id}");
        let error = end.termination.error.clone().unwrap_or_default();
        assert!(
            error.starts_with(&format!("{id}:xxx")),
            "{id}: error {:.80}",
            error
        );
        assert!(
            error.len() <= MAX_TERMINATION_ERROR_LEN,
            "{id}: {}",
            error.len()
        );
        let whole = end.outcome.and_then(|o| o.error).unwrap_or_default();
        assert_eq!(
            whole.len(),
            id.len() + 1 + (1 << 20),
            "{id}: the outcome's error"
        );
        let made = loud
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|r| *r == id)
            .count();
        assert_eq!(made, calls, "{id}: runner calls");
        eventually("the hook call", || async {
            hook.calls().iter().any(|o| o.run_id.as_str() == id)
        })
        .await;
    }
    worker.shutdown().await.unwrap();
}
