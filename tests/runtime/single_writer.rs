//! A store has one writer: a process whose store another process opened
//! (and so fenced) stops its worker with a clear error, and its waits fail,
//! instead of running on without being able to commit anything.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use taquba::{OpenOptions, Queue};
use taquba_workflow::{
    NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner, WorkflowRuntime,
};

/// A run that never ends: each step sleeps a little and continues.
struct Forever;

impl StepRunner for Forever {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

fn options() -> OpenOptions {
    OpenOptions::default().flush_interval(Duration::from_millis(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_store_is_taken_over_stops_and_its_waits_fail() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = common::dir_store(dir.path());
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options())
            .await
            .expect("open"),
    );
    let runtime = WorkflowRuntime::builder(queue, store.clone(), Forever, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let run = runtime.submit(RunSpec::default()).await.expect("submit");
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Another writer opens the same store: this process is fenced.
    let second = Queue::open_with_options(store, "db", options())
        .await
        .expect("the second writer opens the store");

    let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the fenced worker stopped by itself");
    let err = stopped.expect_err("the worker reports why it stopped");
    assert!(err.is_store_closed(), "{err}");
    assert!(
        err.to_string().contains("another process opened it"),
        "{err}"
    );

    let waited = tokio::time::timeout(Duration::from_secs(30), runtime.wait(&run.run_id))
        .await
        .expect("the wait ended instead of hanging");
    let err = waited.expect_err("no termination can be observed any more");
    assert!(err.is_store_closed(), "{err}");
    second.close().await.expect("close");
}
