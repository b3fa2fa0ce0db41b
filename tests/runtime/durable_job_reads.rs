//! A typed job's reads of its own end report only durable terminations:
//! while the commit that ends the job is applied in this process but still
//! waits for its WAL flush (a crash then loses it, and the job runs again),
//! `JobHandle::fetch_result` and `JobHandle::status` do not report it, as
//! `WorkflowRuntime::outcome` and `status` do not.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use serde::{Deserialize, Serialize};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::RunState;
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore};

/// Its first call makes the queue's store hang (every call 300 ms) and
/// answers `first`; later calls answer `second`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FirstThenSecond;

/// The state [`FirstThenSecond`] reads: its calls and the store it hangs.
#[derive(Clone)]
struct Hang {
    calls: Arc<AtomicUsize>,
    store: FaultyStore,
}

impl Job for FirstThenSecond {
    const NAME: &'static str = "test.first-then-second";
    type Output = String;
    type Error = std::io::Error;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, std::io::Error> {
        let hang = ctx.state::<Hang>();
        if hang.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            hang.store.set_config(FaultConfig {
                latency: Some(Duration::from_millis(300)..Duration::from_millis(301)),
                ..FaultConfig::default()
            });
            return Ok("first".into());
        }
        Ok("second".into())
    }

    /// Keyed, so the restarted process finds the job by submitting it again.
    fn idempotency_key(&self) -> Option<String> {
        Some("the-job".into())
    }
}

async fn slow_queue(store: &Arc<dyn ObjectStore>) -> Arc<Queue> {
    crate::fixtures::queue_with(store.clone(), Duration::from_secs(2), Duration::ZERO).await
}

/// The job ends `first` in a settlement that is applied but waits for its
/// WAL flush when the process dies; the job's reads in that process, made
/// during the flush, must not report `first`, which the restarted process
/// replaces with `second`.
#[tokio::test(start_paused = true)]
async fn fetch_result_and_status_report_only_durable_job_ends() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    let queue_store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let memo_store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let hang = Hang {
        calls: Arc::default(),
        store: faulty.clone(),
    };
    let build = |queue: &Arc<Queue>| {
        JobRunner::builder(queue.clone(), memo_store.clone())
            .register::<FirstThenSecond>()
            .state(hang.clone())
            .poll_interval(Duration::from_millis(50))
            .build()
    };
    let queue = slow_queue(&queue_store).await;
    let first = build(&queue);
    let handle = first.submit(FirstThenSecond).await.unwrap();
    let worker = first.spawn(std::future::pending::<()>());
    eventually("the job to run", || async {
        hang.calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Most of the 300 ms flush: several poll intervals of the worker.
    tokio::time::sleep(Duration::from_millis(250)).await;
    // Bounded: a read held back until the flush answers nothing before
    // the crash.
    let held = Duration::from_millis(20);
    let fetched_before = tokio::time::timeout(held, handle.fetch_result())
        .await
        .map(|fetched| fetched.unwrap().map(|result| result.unwrap()))
        .unwrap_or(None);
    let status_before = tokio::time::timeout(held, handle.status())
        .await
        .map(|status| status.unwrap().map(|status| status.state))
        .unwrap_or(None);
    // The process is taken over before the flush: the new queue opened on
    // the store below fences this one, so the settlement's commit fails.
    drop(worker);
    drop(first);
    drop(queue);
    faulty.set_config(FaultConfig::default());

    let queue = slow_queue(&queue_store).await;
    let second = build(&queue);
    let worker = second.spawn(std::future::pending::<()>());
    let again = second.submit(FirstThenSecond).await.unwrap();
    assert_eq!(again.id(), handle.id());
    let committed = within(120, again.join()).await.unwrap().unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(
        hang.calls.load(Ordering::SeqCst),
        2,
        "the job ran again after the crash"
    );
    assert_eq!(committed, "second");
    if let Some(fetched) = &fetched_before {
        assert_eq!(
            fetched, &committed,
            "fetch_result in the dying process reported an end the crash lost"
        );
    }
    assert!(
        !matches!(status_before, Some(RunState::Terminated(_))),
        "status in the dying process reported {status_before:?}, an end the crash lost"
    );
}
