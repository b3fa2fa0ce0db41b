//! A typed job's reads of its own end report only durable terminations:
//! while the commit that ends the job is applied in this process but still
//! waits for its WAL flush (a crash then loses it, and the job runs again),
//! `JobHandle::fetch_result` and `JobHandle::status` do not report it, as
//! `WorkflowRuntime::outcome` and `status` do not; nor does a job group's
//! `status` count such a member as ended.

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

/// What a takeover of the dying process's store found: the job's reads
/// during the flush, by `read`, and the end the new process committed.
async fn read_during_a_lost_end<T, F, Fut>(submit_as_group: bool, read: F) -> (Option<T>, String)
where
    F: FnOnce(JobRunner, taquba_workflow::RunId) -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
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
    let group_id = taquba_workflow::RunId::new("the-group").unwrap();
    let submit = |runner: JobRunner| {
        let group_id = group_id.clone();
        async move {
            if submit_as_group {
                let group = runner.group::<FirstThenSecond>(group_id.clone());
                group.submit([FirstThenSecond]).await.unwrap();
                group_id
            } else {
                runner.submit(FirstThenSecond).await.unwrap().id().clone()
            }
        }
    };
    let queue = slow_queue(&queue_store).await;
    let first = build(&queue);
    let id = submit(first.clone()).await;
    let _worker = first.spawn(std::future::pending::<()>());
    eventually("the job to run", || async {
        hang.calls.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Most of the 300 ms flush: several poll intervals of the worker.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let before = read(first.clone(), id.clone()).await;
    // The process is taken over before the flush: the new queue opened on
    // the store below fences this one, so the settlement's commit fails.
    drop(first);
    drop(queue);
    faulty.set_config(FaultConfig::default());

    let queue = slow_queue(&queue_store).await;
    let second = build(&queue);
    let worker = second.spawn(std::future::pending::<()>());
    let again = submit(second.clone()).await;
    assert_eq!(again, id);
    let committed = if submit_as_group {
        let results = within(120, second.group::<FirstThenSecond>(id).join())
            .await
            .unwrap();
        results[0].result.as_ref().unwrap().clone()
    } else {
        let handle = second.submit(FirstThenSecond).await.unwrap();
        within(120, handle.join()).await.unwrap().unwrap()
    };
    worker.shutdown().await.unwrap();
    assert_eq!(
        hang.calls.load(Ordering::SeqCst),
        2,
        "the job ran again after the crash"
    );
    (before, committed)
}

async fn slow_queue(store: &Arc<dyn ObjectStore>) -> Arc<Queue> {
    crate::fixtures::queue_with(store.clone(), Duration::from_secs(2), Duration::ZERO).await
}

/// Bounded: a read held back until the flush answers nothing before the
/// takeover.
const HELD: Duration = Duration::from_millis(20);

/// The job ends `first` in a settlement that is applied but waits for its
/// WAL flush when its process is taken over; the job's reads in that
/// process, made during the flush, must not report `first`, which the new
/// process replaces with `second`.
#[tokio::test(start_paused = true)]
async fn fetch_result_and_status_report_only_durable_job_ends() {
    let (before, committed) = read_during_a_lost_end(false, |runner, _| async move {
        let handle = runner.submit(FirstThenSecond).await.unwrap();
        let fetched = tokio::time::timeout(HELD, handle.fetch_result())
            .await
            .map(|fetched| fetched.unwrap().map(|result| result.unwrap()))
            .unwrap_or(None);
        let status = tokio::time::timeout(HELD, handle.status())
            .await
            .map(|status| status.unwrap().map(|status| status.state))
            .unwrap_or(None);
        Some((fetched, status))
    })
    .await;
    let (fetched, status) = before.unwrap();
    assert_eq!(committed, "second");
    if let Some(fetched) = &fetched {
        assert_eq!(
            fetched, &committed,
            "fetch_result in the dying process reported an end the takeover lost"
        );
    }
    assert!(
        !matches!(status, Some(RunState::Terminated(_))),
        "status in the dying process reported {status:?}, an end the takeover lost"
    );
}

/// A job group's member counts in the dying process do not count the
/// member whose end the takeover then lost: it stays pending there.
#[tokio::test(start_paused = true)]
async fn group_status_counts_only_durable_member_ends() {
    let (before, committed) = read_during_a_lost_end(true, |runner, id| async move {
        let group = runner.group::<FirstThenSecond>(id);
        tokio::time::timeout(HELD, group.status())
            .await
            .ok()
            .map(|status| status.unwrap())
    })
    .await;
    assert_eq!(committed, "second");
    if let Some(status) = before {
        assert_eq!(status.total, 1);
        assert_eq!(
            (status.pending, status.succeeded),
            (1, 0),
            "the group counted an end the takeover lost: {status:?}"
        );
    }
}
