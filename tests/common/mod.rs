//! Shared set-up of the integration tests: queues over an in-memory store
//! or a temporary directory, driven by a `MockClock`.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::memory::InMemory;
use taquba::object_store::{ObjectStore, ObjectStoreExt};
use taquba::{MockClock, OpenOptions, Queue, QueueConfig};
use taquba_workflow::{GroupMember, RunId};

/// The epoch of every mock clock: 2023-11-14.
pub const T0: u64 = 1_700_000_000_000;

pub fn rid(id: &str) -> RunId {
    RunId::new(id).expect("valid test run id")
}

/// Open options with `clock`, a fast flush and no retry backoff.
pub fn options(clock: &MockClock) -> OpenOptions {
    OpenOptions::default()
        .clock(Arc::new(clock.clone()))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .max_attempts(3),
        )
}

/// An in-memory queue at `path` with a mock clock.
pub async fn memory_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>, MockClock) {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Queue::open_with_options(store.clone(), "db", options(&clock))
        .await
        .expect("open queue");
    (Arc::new(queue), store, clock)
}

/// A store in a directory (for restart tests).
pub fn dir_store(dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir).expect("local store"))
}

/// Open (or reopen) the queue in `store` with `clock`.
pub async fn open(store: &Arc<dyn ObjectStore>, clock: &MockClock) -> Arc<Queue> {
    Arc::new(
        Queue::open_with_options(store.clone(), "db", options(clock))
            .await
            .expect("open queue"),
    )
}

/// Run `f` to completion within `secs` seconds of (paused) time.
pub async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("finished in time")
}

use std::future::Future;
use std::sync::Mutex;

use taquba::Claim;
use taquba_workflow::{
    NoopTerminalHook, RunOutcome, RunSpec, RunState, Step, StepError, StepOutcome, StepRunner,
    SubmitOutcome, TerminalEffects, TerminalHook, WorkflowRuntime, WorkflowRuntimeBuilder,
};

/// The runtime's default queue name.
pub const STEPS: &str = "workflow-steps";
/// The runtime's default memo prefix.
pub const MEMO_PREFIX: &str = "workflow-steps-memo";

/// A step runner from a closure over an owned copy of the step.
pub struct FnRunner<F>(pub F);

impl<F, Fut> StepRunner for FnRunner<F>
where
    F: Fn(Step) -> Fut + Send + Sync,
    Fut: Future<Output = Result<StepOutcome, StepError>> + Send,
{
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send {
        (self.0)(step.clone())
    }
}

/// A terminal hook that records every outcome it is called with.
#[derive(Clone, Default)]
pub struct Recorder {
    pub outcomes: Arc<Mutex<Vec<RunOutcome>>>,
}

impl Recorder {
    pub fn calls(&self) -> Vec<RunOutcome> {
        self.outcomes.lock().expect("recorder lock").clone()
    }
}

impl TerminalHook for Recorder {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.outcomes
            .lock()
            .expect("recorder lock")
            .push(outcome.clone());
        Ok(())
    }
}

/// A gate a runner waits on until the test opens it.
#[derive(Clone)]
pub struct Gate {
    tx: Arc<tokio::sync::watch::Sender<bool>>,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            tx: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

impl Gate {
    pub fn open(&self) {
        self.tx.send_replace(true);
    }

    /// Close the gate again.
    pub fn close(&self) {
        self.tx.send_replace(false);
    }

    pub async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// Poll `check` every 10 ms of (paused) time until it holds; panics after
/// 60 s naming `what`.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..6_000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// An in-memory queue on the real clock (for multi-threaded races).
pub async fn real_clock_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default().flush_interval(Duration::from_millis(1)),
        )
        .await
        .unwrap(),
    );
    (queue, store)
}

/// Take sole ownership of the queue back from the dropped runtime's tasks
/// and close it.
pub async fn close(mut queue: Arc<Queue>) {
    for _ in 0..1_000 {
        match Arc::try_unwrap(queue) {
            Ok(queue) => {
                queue.close().await.expect("close");
                return;
            }
            Err(shared) => {
                queue = shared;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    panic!("the queue is still shared");
}

/// A runtime builder over clones of `queue`, `store` and `runner`, with no
/// terminal hook and a 50 ms poll interval.
pub fn workflow_builder<R: StepRunner + Clone>(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: &R,
) -> WorkflowRuntimeBuilder<R, NoopTerminalHook> {
    WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
}

/// The record of job `job_id`, which must exist (`what` names it).
pub async fn job_record(queue: &Queue, job_id: &str, what: &str) -> taquba::JobRecord {
    queue.view().job_record(job_id).await.unwrap().expect(what)
}

/// Submit run `id` with an otherwise default spec.
pub async fn submit_run<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> SubmitOutcome {
    runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Poll until run `id` is at step `step` (see [`eventually`]).
pub async fn until_step<R: StepRunner, H: TerminalHook>(
    what: &str,
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    step: u32,
) {
    eventually(what, || async {
        runtime
            .status(&rid(id))
            .await
            .unwrap()
            .unwrap()
            .current_step
            == step
    })
    .await;
}

/// Poll until run `id` is terminated (see [`eventually`]).
pub async fn until_terminated<R: StepRunner, H: TerminalHook>(
    what: &str,
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) {
    eventually(what, || async {
        matches!(
            runtime.status(&rid(id)).await.unwrap().map(|s| s.state),
            Some(RunState::Terminated(_))
        )
    })
    .await;
}

/// Claim the next job of the runtime's queue directly (no worker).
pub async fn claim_step(queue: &Queue) -> Option<Claim> {
    queue
        .claim(STEPS, Duration::from_secs(60))
        .await
        .expect("claim")
}

/// The dead jobs of the runtime's queue.
pub async fn dead_jobs(queue: &Queue) -> Vec<taquba::JobRecord> {
    queue
        .view()
        .dead_jobs(STEPS, None, 100)
        .await
        .expect("dead jobs")
}

/// A group member with a text input.
pub fn member(key: &str, input: &str) -> GroupMember {
    GroupMember {
        key: key.to_string(),
        input: input.as_bytes().to_vec(),
    }
}

/// The run id of member `key` of `group_id`, as documented: hex SHA-256 of
/// `{group_id}/{key}`.
pub fn member_run_id(group_id: &str, key: &str) -> RunId {
    rid(&hex::encode(Sha256::digest(format!("{group_id}/{key}"))))
}

/// Remove group `group_id`'s member records, submission counter, manifest
/// claim and manifest (under `memo_prefix`) and nothing else, cancelling
/// nothing: what `forget` did to a group with running members before it
/// ended them first, so a store that release left behind can be set up.
pub async fn forget_leaving_members_running(
    queue: &Queue,
    store: &Arc<dyn ObjectStore>,
    memo_prefix: &str,
    group_id: &str,
) {
    let records = queue
        .view()
        .kv_scan(
            format!("workflow/groups/{group_id}/").as_bytes(),
            ..,
            10_000,
        )
        .await
        .expect("scan")
        .entries;
    for (key, _) in records {
        queue.kv_delete(&key).await.expect("delete");
    }
    for key in [
        format!("workflow/group-submissions/{group_id}"),
        format!("workflow/group-manifests/{group_id}"),
    ] {
        queue.kv_delete(key.as_bytes()).await.expect("delete");
    }
    store
        .delete(&taquba::object_store::path::Path::from(format!(
            "{memo_prefix}/groups/{group_id}/manifest"
        )))
        .await
        .expect("delete the manifest");
}
