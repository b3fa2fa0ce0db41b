//! A done or dead step record whose offloaded payload object is gone (a
//! crash inside the queue's own retention sweep can leave one: the sweep's
//! record removal is not yet durable when it deletes the object) is read
//! as a record without its payload by every read of the runtime: status,
//! outcome, a view over a `QueueReader`, waits, cancellation, dead-letter
//! reconciliation and step-output replay. None of them fails on it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use taquba::object_store::memory::InMemory;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt};
use taquba::{JobStatus, MockClock, Queue, QueueConfig, QueueReader, ReaderOptions};
use taquba_workflow::{
    MemoStore, RunSpec, RunState, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
    WorkflowView,
};

/// Payloads over this many bytes are offloaded to objects.
const OFFLOAD_OVER: usize = 64;

fn large(tag: u8) -> Vec<u8> {
    vec![tag; 4 * OFFLOAD_OVER]
}

/// A queue that offloads every payload over [`OFFLOAD_OVER`] bytes and
/// keeps done and dead step records.
async fn offloading_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>, MockClock) {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = options(&clock)
        .payload_offload_threshold(Some(OFFLOAD_OVER))
        .queue_config(
            STEPS,
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .max_attempts(3)
                .keep_done_jobs(Duration::from_secs(86_400))
                .dead_retention(Duration::from_secs(86_400)),
        );
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("open queue");
    (Arc::new(queue), store, clock)
}

/// Delete the payload object of job `job_id`, which must be offloaded.
async fn lose_payload(queue: &Queue, store: &Arc<dyn ObjectStore>, job_id: &str) {
    let job = job_record(queue, job_id, "the step job").await;
    let payload_ref = job.payload_ref.expect("the payload is offloaded");
    store
        .delete(&Path::from(format!("db-payloads/{payload_ref}")))
        .await
        .expect("delete the payload object");
    assert!(
        matches!(
            queue.view().get_job(job_id).await,
            Err(taquba::Error::PayloadMissing { .. })
        ),
        "a payload-reading lookup of the record now fails"
    );
}

/// Each step continues with a large payload until step 2, which succeeds.
#[derive(Clone)]
struct ThreeLargeSteps;

impl StepRunner for ThreeLargeSteps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number == 2 {
            Ok(StepOutcome::Succeed {
                result: b"done".to_vec(),
            })
        } else {
            Ok(StepOutcome::continue_now(large(step.step_number as u8 + 1)))
        }
    }
}

/// Submit run `id` with a large input and dead-letter its step 0 outside
/// the worker (as the reaper does); then lose the step's payload object.
async fn dead_step_without_payload(
    runtime: &taquba_workflow::WorkflowRuntime<ThreeLargeSteps, taquba_workflow::NoopTerminalHook>,
    queue: &Queue,
    store: &Arc<dyn ObjectStore>,
    id: &str,
) -> String {
    let job_id = runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: large(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .job_id;
    let claim = claim_step(queue).await.expect("the step job");
    assert_eq!(claim.job().id, job_id);
    queue
        .dead_letter(&claim, "hung")
        .await
        .expect("dead letter");
    lose_payload(queue, store, &job_id).await;
    job_id
}

#[tokio::test(start_paused = true)]
async fn a_dead_current_step_without_its_payload_is_read_and_reconciled() {
    let (queue, store, _clock) = offloading_queue().await;
    let runtime = workflow_builder(&queue, &store, &ThreeLargeSteps)
        .step_output_replay()
        .build();
    dead_step_without_payload(&runtime, &queue, &store, "waited").await;
    dead_step_without_payload(&runtime, &queue, &store, "cancelled").await;
    dead_step_without_payload(&runtime, &queue, &store, "swept").await;

    // The view reads the dead record (status), the outcome is not there yet.
    let status = runtime.status(&rid("waited")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Pending);
    assert_eq!(status.current_step, 0);
    assert!(runtime.outcome(&rid("waited")).await.unwrap().is_none());

    // From another process, too.
    let reader = QueueReader::open_with_options(
        store.clone(),
        "db",
        ReaderOptions::default().manifest_poll_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let view = WorkflowView::new(
        reader.view().clone(),
        MemoStore::new(store.clone(), MEMO_PREFIX),
    );
    eventually("the reader to see the run", || async {
        view.status(&rid("waited")).await.unwrap().is_some()
    })
    .await;

    // A wait reconciles the dead step: the run fails with its error.
    let end = within(30, runtime.wait(&rid("waited"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("hung"));

    // A cancellation of a run whose dead step lost its payload is refused
    // (the run failed when its step died) and reconciles the run: it ends
    // failed with the step's error.
    assert!(!within(30, runtime.cancel(&rid("cancelled"))).await.unwrap());
    let end = within(30, runtime.wait(&rid("cancelled"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("hung"));

    // The worker's reconciliation pass terminates the last one.
    let worker = runtime.spawn(std::future::pending::<()>());
    until_terminated("the reconciliation", &runtime, "swept").await;
    let status = runtime.status(&rid("swept")).await.unwrap().unwrap();
    assert!(
        matches!(&status.state, RunState::Terminated(t) if t.error.as_deref() == Some("hung")),
        "{status:?}"
    );
    // The view over the reader follows the terminations.
    eventually("the reader to see the termination", || async {
        matches!(
            view.status(&rid("swept")).await.unwrap().map(|s| s.state),
            Some(RunState::Terminated(_))
        )
    })
    .await;
    worker.shutdown().await.unwrap();
    reader.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn done_steps_without_their_payloads_leave_runs_readable_and_running() {
    let (queue, store, _clock) = offloading_queue().await;
    let runtime = workflow_builder(&queue, &store, &ThreeLargeSteps)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("first")),
            input: large(0),
            ..Default::default()
        })
        .await
        .unwrap();
    let end = within(30, runtime.wait(&rid("first"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let done = queue
        .view()
        .list_jobs(STEPS, JobStatus::Done, None, 100)
        .await
        .unwrap()
        .jobs;
    assert_eq!(done.len(), 3, "the done step records are kept");
    for job in &done {
        lose_payload(&queue, &store, &job.id).await;
    }

    let status = runtime.status(&rid("first")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Terminated(end.termination.clone()));
    let outcome = runtime.outcome(&rid("first")).await.unwrap().unwrap();
    assert_eq!(outcome.result.as_deref(), Some(b"done".as_slice()));
    assert_eq!(within(30, runtime.wait(&rid("first"))).await.unwrap(), end);

    // The run id runs again, its replayed and new steps unaffected, and the
    // worker's maintenance does not trip over the records.
    runtime
        .submit(RunSpec {
            run_id: Some(rid("first")),
            input: large(0),
            ..Default::default()
        })
        .await
        .unwrap();
    let again = within(30, runtime.wait(&rid("first"))).await.unwrap();
    assert_eq!(again.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancellation_waiting_on_a_step_whose_payload_is_gone_does_not_fail() {
    let (queue, store, _clock) = offloading_queue().await;
    let runtime = workflow_builder(&queue, &store, &ThreeLargeSteps).build();
    let job_id = runtime
        .submit(RunSpec {
            run_id: Some(rid("held")),
            input: large(0),
            ..Default::default()
        })
        .await
        .unwrap()
        .job_id;
    // Claimed by a holder outside this runtime, which must settle it before
    // the cancellation can judge it; its payload object is gone meanwhile.
    let claim = claim_step(&queue).await.expect("the step job");
    lose_payload(&queue, &store, &job_id).await;
    let cancel = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.cancel(&rid("held")).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!cancel.is_finished(), "{:?}", cancel.await);
    // The holder gives the step back (a retry): the cancellation removes it.
    queue.nack(&claim, "gave up").await.expect("nack");
    let cancelled = within(30, cancel).await.expect("task");
    assert!(cancelled.expect("the cancellation succeeds"));
    let end = within(30, runtime.wait(&rid("held"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
}
