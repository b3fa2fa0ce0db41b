//! Run ids: a given id is 1 to `MAX_RUN_ID_LEN` bytes of `[A-Za-z0-9_-]`
//! (the longest group id still derives valid member run ids), and
//! generated ids (runs without an id, `new_group`, jobs without an
//! idempotency key) are ULIDs on the runtime's clock, monotonic within a
//! millisecond: listed by id, runs come in the order they were submitted.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::fixtures::Scripted;
use common::*;
use serde::{Deserialize, Serialize};
use taquba::MockClock;
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::{Error, MAX_RUN_ID_LEN, RunOptions};
use taquba_workflow::{RunId, RunSpec, Step, StepError, StepOutcome, StepRunner, WorkflowRuntime};
use ulid::Ulid;

#[derive(Clone)]
struct Idle;

impl StepRunner for Idle {
    async fn run_step(&self, _: &Step) -> Result<StepOutcome, StepError> {
        Err(StepError::permanent("no worker runs in these tests"))
    }
}

fn ulid_of(id: &RunId) -> Ulid {
    Ulid::from_string(id).unwrap_or_else(|e| panic!("{id} is not a ULID: {e}"))
}

async fn submit_fresh<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
) -> RunId {
    runtime
        .submit(RunSpec::default())
        .await
        .expect("submit")
        .run_id
}

#[tokio::test(start_paused = true)]
async fn runs_submitted_in_one_millisecond_list_in_submission_order() {
    let (queue, store, clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Idle).build();
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids.push(submit_fresh(&runtime).await);
    }
    for id in &ids {
        assert_eq!(ulid_of(id).timestamp_ms(), T0, "{id} is on the mock clock");
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids, "ids sort in submission order");

    // Later on the clock, later ids.
    clock.advance(Duration::from_millis(5));
    let later = submit_fresh(&runtime).await;
    assert_eq!(ulid_of(&later).timestamp_ms(), T0 + 5);
    assert!(later > ids[ids.len() - 1]);

    // Concurrent submissions are ordered as they were issued, too.
    let concurrent: Vec<RunId> =
        futures_util::future::try_join_all((0..50).map(|_| runtime.submit(RunSpec::default())))
            .await
            .expect("submit")
            .into_iter()
            .map(|outcome| outcome.run_id)
            .collect();
    let mut sorted = concurrent.clone();
    sorted.sort();
    assert_eq!(sorted, concurrent);
    assert!(concurrent[0] > later);
}

#[tokio::test(start_paused = true)]
async fn ids_follow_the_clock_the_builder_was_given() {
    let (queue, store, _queue_clock) = memory_queue().await;
    let own = MockClock::new(T0 + 86_400_000);
    let runtime = workflow_builder(&queue, &store, &Idle)
        .clock(Arc::new(own.clone()))
        .build();
    let id = submit_fresh(&runtime).await;
    assert_eq!(ulid_of(&id).timestamp_ms(), T0 + 86_400_000);
    let group = runtime.new_group();
    assert_eq!(ulid_of(group.id()).timestamp_ms(), T0 + 86_400_000);
    assert!(*group.id() > id, "a group id made later sorts later");
}

#[tokio::test(start_paused = true)]
async fn runtimes_over_one_queue_share_the_order() {
    let (queue, store, _clock) = memory_queue().await;
    let a = workflow_builder(&queue, &store, &Idle).build();
    let b = workflow_builder(&queue, &store, &Idle).build();
    let mut ids = Vec::new();
    for i in 0..40 {
        let runtime = if i % 2 == 0 { &a } else { &b };
        ids.push(submit_fresh(runtime).await);
        ids.push(runtime.new_group().id().clone());
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids);
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ping(u32);

impl Job for Ping {
    const NAME: &'static str = "ids.ping";
    type Output = u32;
    type Error = std::convert::Infallible;

    async fn run(&self, _ctx: JobContext<'_>) -> Result<u32, std::convert::Infallible> {
        Ok(self.0)
    }
}

#[tokio::test(start_paused = true)]
async fn jobs_without_a_key_get_ordered_ids_on_the_runners_clock() {
    let (queue, store, clock) = memory_queue().await;
    let runner = JobRunner::builder(queue, store)
        .register::<Ping>()
        .clock(Arc::new(clock.clone()))
        .build();
    let mut ids = Vec::new();
    for n in 0..50 {
        ids.push(runner.submit(Ping(n)).await.expect("submit").id().clone());
    }
    assert!(ids.iter().all(|id| ulid_of(id).timestamp_ms() == T0));
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids);
}

/// `RunId`: 1..=128 bytes of `[A-Za-z0-9_-]`, refused with `InvalidRunId`.
#[test]
fn run_ids_are_validated_at_their_bounds() {
    assert!(RunId::new("a".repeat(MAX_RUN_ID_LEN)).is_ok());
    for bad in [
        String::new(),
        "a".repeat(MAX_RUN_ID_LEN + 1),
        "a/b".into(),
        "a.b".into(),
        "..".into(),
        "é".into(),
        "a b".into(),
        "a\0".into(),
    ] {
        match RunId::new(bad.clone()) {
            Err(Error::InvalidRunId { run_id, .. }) => assert_eq!(run_id, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // Deserializing validates too.
    let bytes = rmp_serde::to_vec(&"../etc").unwrap();
    assert!(rmp_serde::from_slice::<RunId>(&bytes).is_err());
}

/// A group over a 128-byte id, its members and a re-run of a failed member
/// (`{digest}-{n}`) stay valid.
#[tokio::test(start_paused = true)]
async fn a_group_with_the_longest_id_runs_and_reruns_its_members() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid(&"g".repeat(MAX_RUN_ID_LEN)));
    within(
        60,
        group.submit(
            vec![member("a", "ok"), member("b", "verdict")],
            &RunOptions::default(),
        ),
    )
    .await
    .unwrap();
    eventually("members end", || async {
        let s = group.status().await.unwrap();
        s.succeeded + s.failed + s.cancelled == 2
    })
    .await;
    within(60, group.resume(&RunOptions::default()))
        .await
        .unwrap();
    eventually("re-run ends", || async {
        let s = group.status().await.unwrap();
        s.succeeded + s.failed + s.cancelled == 2 && s.pending == 0
    })
    .await;
    worker.shutdown().await.unwrap();
}
