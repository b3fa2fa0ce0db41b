//! Typed jobs at the public API: submit and await, joins, status, results
//! after a restart, idempotent submission, failures and retries, runner
//! state, job groups and registration.

use crate::common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::object_store::ObjectStore;
use taquba::{MockClock, Queue};
use taquba_workflow::jobs::{
    GroupResult, Job, JobContext, JobError, JobRunner, JobRunnerBuilder, JoinError,
    payload_idempotency_key,
};
use taquba_workflow::testing::{TestError, TestJobs};
use taquba_workflow::{Error, RunState, StepErrorKind, TerminalStatus};

#[derive(Debug, thiserror::Error)]
#[error("math error: {0}")]
struct MathError(String);

/// Calls of each job, by a label; registered as runner state.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

impl Calls {
    fn record(&self, label: impl Into<String>) {
        *self
            .0
            .lock()
            .expect("calls lock")
            .entry(label.into())
            .or_default() += 1;
    }

    fn of(&self, label: &str) -> usize {
        self.0
            .lock()
            .expect("calls lock")
            .get(label)
            .copied()
            .unwrap_or(0)
    }
}

/// Adds two numbers; keyed when `key` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Add {
    a: i64,
    b: i64,
    key: Option<String>,
}

impl Add {
    fn new(a: i64, b: i64) -> Self {
        Self { a, b, key: None }
    }

    fn keyed(a: i64, b: i64, key: &str) -> Self {
        Self {
            a,
            b,
            key: Some(key.to_string()),
        }
    }
}

impl Job for Add {
    const NAME: &'static str = "math.add";
    type Output = i64;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<i64, MathError> {
        ctx.state::<Calls>()
            .record(format!("add {} {}", self.a, self.b));
        Ok(self.a + self.b)
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

/// Fails every attempt; permanently when `permanent`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Fails {
    label: String,
    permanent: bool,
    attempts: Option<u32>,
}

impl Job for Fails {
    const NAME: &'static str = "test.fails";
    type Output = ();
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<(), MathError> {
        ctx.state::<Calls>().record(self.label.clone());
        Err(MathError(format!(
            "{} gave up on attempt {} of {} (last: {})",
            self.label,
            ctx.attempts,
            ctx.max_attempts,
            ctx.is_last_attempt()
        )))
    }

    fn classify(&self, _error: &MathError) -> StepErrorKind {
        if self.permanent {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        self.attempts
    }

    fn idempotency_key(&self) -> Option<String> {
        self.label.starts_with("keyed").then(|| self.label.clone())
    }
}

/// Succeeds with the attempt number once `failures` attempts failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Flaky {
    failures: u32,
}

impl Job for Flaky {
    const NAME: &'static str = "test.flaky";
    type Output = u32;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, MathError> {
        if ctx.attempts <= self.failures {
            return Err(MathError(format!("flake {}", ctx.attempts)));
        }
        Ok(ctx.attempts)
    }
}

/// Blocks until the gate in the runner's state opens.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gated {
    label: String,
}

#[derive(Clone)]
struct Gate(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for Gate {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl Gate {
    fn open(&self) {
        self.0.send_replace(true);
    }
}

impl Job for Gated {
    const NAME: &'static str = "test.gated";
    type Output = String;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, MathError> {
        let mut rx = ctx.state::<Gate>().0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
        Ok(format!("{} passed", self.label))
    }
}

/// Reads the runner's state: a registered prefix, an absent type.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Greet {
    name: String,
}

struct Prefix(&'static str);
struct NeverRegistered;

impl Job for Greet {
    const NAME: &'static str = "text.greet";
    type Output = String;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, MathError> {
        assert!(ctx.try_state::<NeverRegistered>().is_none());
        let prefix = ctx.try_state::<Prefix>().map(|p| p.0).unwrap_or("?");
        Ok(format!("{prefix} {} (run {})", self.name, ctx.run_id))
    }
}

/// Fails permanently while the runner's `Failing` flag is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Toggle {
    n: u32,
}

#[derive(Clone, Default)]
struct Failing(Arc<AtomicBool>);

impl Job for Toggle {
    const NAME: &'static str = "test.toggle";
    type Output = u32;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, MathError> {
        ctx.state::<Calls>().record(format!("toggle {}", self.n));
        if self.n % 2 == 1 && ctx.state::<Failing>().0.load(Ordering::SeqCst) {
            return Err(MathError(format!("odd {} rejected", self.n)));
        }
        Ok(self.n * 10)
    }

    fn classify(&self, _: &MathError) -> StepErrorKind {
        StepErrorKind::Permanent
    }
}

fn builder(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>) -> JobRunnerBuilder {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Add>()
        .register::<Fails>()
        .register::<Flaky>()
        .register::<Gated>()
        .register::<Greet>()
        .register::<Toggle>()
        .poll_interval(Duration::from_millis(50))
}

struct Fixture {
    queue: Arc<Queue>,
    store: Arc<dyn ObjectStore>,
    clock: MockClock,
    calls: Calls,
    gate: Gate,
    failing: Failing,
}

impl Fixture {
    async fn new() -> Self {
        let (queue, store, clock) = memory_queue().await;
        Self {
            queue,
            store,
            clock,
            calls: Calls::default(),
            gate: Gate::default(),
            failing: Failing::default(),
        }
    }

    fn runner(&self) -> JobRunner {
        self.builder().build()
    }

    fn builder(&self) -> JobRunnerBuilder {
        builder(&self.queue, &self.store)
            .state(self.calls.clone())
            .state(self.gate.clone())
            .state(self.failing.clone())
            .state(Prefix("hello"))
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_is_submitted_awaited_and_reported() {
    let fx = Fixture::new().await;
    let runner = fx.runner();
    let handle = runner.submit(Add::new(2, 3)).await.unwrap();
    assert!(handle.newly_submitted());
    let status = handle.status().await.unwrap().expect("a submitted job");
    assert_eq!(status.state, RunState::Pending);
    assert_eq!(
        handle.fetch_result().await.unwrap().map(|r| r.ok()),
        None,
        "still running"
    );

    let worker = runner.spawn(std::future::pending::<()>());
    assert_eq!(within(5, handle.clone().into_future()).await.unwrap(), 5);
    assert_eq!(handle.join().await.unwrap().unwrap(), 5);
    assert_eq!(
        handle
            .join_timeout(Duration::from_secs(1))
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        5
    );
    assert_eq!(handle.fetch_result().await.unwrap().unwrap().unwrap(), 5);
    let status = handle.status().await.unwrap().unwrap();
    assert!(
        matches!(status.state, RunState::Terminated(t) if t.status == TerminalStatus::Succeeded)
    );

    // Without a key every submission is a new job.
    let again = runner.submit(Add::new(2, 3)).await.unwrap();
    assert!(again.newly_submitted());
    assert_ne!(again.id(), handle.id());
    assert_eq!(within(5, again.into_future()).await.unwrap(), 5);
    assert_eq!(fx.calls.of("add 2 3"), 2);

    // State: registered, and absent.
    let greeting = within(
        5,
        runner
            .submit(Greet { name: "ada".into() })
            .await
            .unwrap()
            .into_future(),
    )
    .await
    .unwrap();
    assert!(greeting.starts_with("hello ada (run "), "{greeting}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn join_timeout_gives_up_while_the_job_runs() {
    let fx = Fixture::new().await;
    let runner = fx.runner();
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner
        .submit(Gated {
            label: "slow".into(),
        })
        .await
        .unwrap();
    assert!(
        handle
            .join_timeout(Duration::from_secs(2))
            .await
            .unwrap()
            .is_none()
    );
    let status = handle.status().await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Running);
    assert!(handle.fetch_result().await.unwrap().is_none());
    fx.gate.open();
    let done = handle.join_timeout(Duration::from_secs(5)).await.unwrap();
    assert_eq!(done.unwrap().unwrap(), "slow passed");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn idempotent_submission_before_and_after_completion() {
    let fx = Fixture::new().await;
    let runner = fx.runner();

    // Before completion (no worker yet): one job.
    let first = runner.submit(Add::keyed(1, 2, "sum-1-2")).await.unwrap();
    let second = runner.submit(Add::keyed(1, 2, "sum-1-2")).await.unwrap();
    assert!(first.newly_submitted());
    assert!(!second.newly_submitted());
    assert_eq!(first.id(), second.id());
    let digest = hex::encode(Sha256::digest(b"sum-1-2"));
    assert_eq!(
        first.id().as_str(),
        digest,
        "the job id is the key's hex SHA-256"
    );
    assert!(matches!(
        runner.submit(Add::keyed(1, 3, "sum-1-2")).await,
        Err(Error::InputMismatch(id)) if id.as_str() == digest
    ));

    let worker = runner.spawn(std::future::pending::<()>());
    assert_eq!(within(5, first.into_future()).await.unwrap(), 3);
    assert_eq!(within(5, second.into_future()).await.unwrap(), 3);
    assert_eq!(fx.calls.of("add 1 2"), 1);

    // After completion: the recorded result, no second run.
    let after = runner.submit(Add::keyed(1, 2, "sum-1-2")).await.unwrap();
    assert!(!after.newly_submitted());
    assert_eq!(within(5, after.into_future()).await.unwrap(), 3);
    assert_eq!(fx.calls.of("add 1 2"), 1);
    assert!(matches!(
        runner.submit(Add::keyed(1, 3, "sum-1-2")).await,
        Err(Error::InputMismatch(_))
    ));

    // A recorded failure is returned as well, without a second run.
    let keyed_failure = Fails {
        label: "keyed failure".into(),
        permanent: true,
        attempts: None,
    };
    let failed = runner.submit(keyed_failure.clone()).await.unwrap();
    let error = within(5, failed.join()).await.unwrap().unwrap_err();
    let again = runner.submit(keyed_failure).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(within(5, again.join()).await.unwrap().unwrap_err(), error);
    assert_eq!(fx.calls.of("keyed failure"), 1);

    let failing = Fails {
        label: "keyed failure".into(),
        permanent: true,
        attempts: None,
    };
    let key = payload_idempotency_key(&failing).unwrap();
    assert_eq!(key.len(), 64);
    assert_eq!(key, payload_idempotency_key(&failing.clone()).unwrap());
    assert_ne!(
        key,
        payload_idempotency_key(&Fails {
            permanent: false,
            ..failing.clone()
        })
        .unwrap()
    );
    worker.shutdown().await.unwrap();
}

/// Keyed by its payload: "same input, same job".
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Square {
    n: i64,
}

impl Job for Square {
    const NAME: &'static str = "math.square";
    type Output = i64;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<i64, MathError> {
        ctx.state::<Calls>().record(format!("square {}", self.n));
        Ok(self.n * self.n)
    }

    fn idempotency_key(&self) -> Option<String> {
        payload_idempotency_key(self).ok()
    }
}

#[tokio::test(start_paused = true)]
async fn retention_forgets_a_keyed_job_which_then_runs_again() {
    let fx = Fixture::new().await;
    let runner = fx
        .builder()
        .register::<Square>()
        .retention(Duration::from_secs(10))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let first = runner.submit(Square { n: 7 }).await.unwrap();
    assert_eq!(within(5, first.clone().into_future()).await.unwrap(), 49);
    let same = runner.submit(Square { n: 7 }).await.unwrap();
    assert!(!same.newly_submitted());
    assert_eq!(same.id(), first.id());
    assert_eq!(fx.calls.of("square 7"), 1);

    fx.clock.advance(Duration::from_secs(11));
    within(30, async {
        while first.status().await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        first.fetch_result().await.unwrap().is_none(),
        "the record is gone"
    );
    let rerun = runner.submit(Square { n: 7 }).await.unwrap();
    assert!(rerun.newly_submitted());
    assert_eq!(within(5, rerun.into_future()).await.unwrap(), 49);
    assert_eq!(fx.calls.of("square 7"), 2);
    worker.shutdown().await.unwrap();
}

/// On the test kit: the retries run at their backoff's end, each counted.
#[tokio::test(start_paused = true)]
async fn failures_are_classified_and_retried_up_to_the_attempt_limit() {
    let calls = Calls::default();
    let env = TestJobs::builder()
        .register::<Fails>()
        .register::<Flaky>()
        .state(calls.clone())
        .retry_backoff(Duration::from_secs(1), Duration::from_secs(60))
        .build()
        .await
        .unwrap();

    let permanent = env
        .submit(Fails {
            label: "permanent".into(),
            permanent: true,
            attempts: Some(5),
        })
        .await
        .unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1, "no retry");
    match permanent.output().await {
        Err(TestError::JobFailed {
            error: JobError { kind, message },
            ..
        }) => {
            assert_eq!(kind, StepErrorKind::Permanent);
            assert_eq!(
                message,
                "math error: permanent gave up on attempt 1 of 5 (last: false)"
            );
        }
        other => panic!("expected a permanent job error, got {other:?}"),
    }
    assert_eq!(calls.of("permanent"), 1);

    let transient = env
        .submit(Fails {
            label: "transient".into(),
            permanent: false,
            attempts: Some(4),
        })
        .await
        .unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    // Backoffs of 1, 2 and 4 s; the fourth attempt is the last.
    for (wait, attempt) in [(1, 2), (2, 3), (4, 4)] {
        assert_eq!(
            env.advance(Duration::from_secs(wait - 1)).await.unwrap(),
            0,
            "attempt {attempt} waits {wait} s"
        );
        assert_eq!(env.advance(Duration::from_secs(1)).await.unwrap(), 1);
    }
    let Err(TestError::JobFailed { error, .. }) = transient.output().await else {
        panic!("the transient job failed");
    };
    assert_eq!(error.kind, StepErrorKind::Transient);
    assert_eq!(
        error.message,
        "math error: transient gave up on attempt 4 of 4 (last: true)"
    );
    assert_eq!(
        calls.of("transient"),
        4,
        "Job::max_attempts overrides the queue's 3"
    );

    let flaky = env.submit(Flaky { failures: 2 }).await.unwrap();
    env.run_until_idle().await.unwrap();
    env.advance(Duration::from_secs(1)).await.unwrap();
    env.advance(Duration::from_secs(2)).await.unwrap();
    assert_eq!(flaky.output().await.unwrap(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_unregistered_job_fails_permanently_naming_it() {
    let fx = Fixture::new().await;
    let submitter = fx.runner();
    // The worker's runner knows only `Flaky`.
    let worker_runner = JobRunner::builder(fx.queue.clone(), fx.store.clone())
        .register::<Flaky>()
        .build();
    let worker = worker_runner.spawn(std::future::pending::<()>());
    let handle = submitter.submit(Add::new(1, 1)).await.unwrap();
    match within(5, handle.into_future()).await {
        Err(JoinError::Job(error)) => {
            assert_eq!(error.kind, StepErrorKind::Permanent);
            assert!(error.message.contains("\"math.add\""), "{}", error.message);
        }
        other => panic!("expected a job error, got {other:?}"),
    }
    assert_eq!(fx.calls.of("add 1 1"), 0);
    worker.shutdown().await.unwrap();
}

#[derive(Debug, Serialize, Deserialize)]
struct Impostor;

impl Job for Impostor {
    const NAME: &'static str = "math.add";
    type Output = ();
    type Error = MathError;

    async fn run(&self, _ctx: JobContext<'_>) -> Result<(), MathError> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn registering_two_types_under_one_name_panics_naming_both() {
    let fx = Fixture::new().await;
    let builder = JobRunner::builder(fx.queue.clone(), fx.store.clone())
        .register::<Add>()
        .register::<Add>();
    assert!(builder.is_registered("math.add"));
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        builder.register::<Impostor>()
    }))
    .expect_err("a second type under one name panics");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("math.add")
            && message.contains("jobs::Add")
            && message.contains("jobs::Impostor"),
        "{message}"
    );
}

#[tokio::test(start_paused = true)]
async fn results_are_read_from_the_store_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new(T0);
    let store = dir_store(dir.path());
    let calls = Calls::default();
    {
        let queue = open(&store, &clock).await;
        let runner = builder(&queue, &store).state(calls.clone()).build();
        let worker = runner.spawn(std::future::pending::<()>());
        let handle = runner.submit(Add::keyed(20, 22, "answer")).await.unwrap();
        assert_eq!(within(5, handle.into_future()).await.unwrap(), 42);
        worker.shutdown().await.unwrap();
        drop(runner);
        match Arc::try_unwrap(queue) {
            Ok(queue) => queue.close().await.unwrap(),
            Err(_) => panic!("the queue is still shared at close"),
        }
    }
    let queue = open(&store, &clock).await;
    // No worker: everything below is read from the store.
    let runner = builder(&queue, &store).state(calls.clone()).build();
    let handle = runner.submit(Add::keyed(20, 22, "answer")).await.unwrap();
    assert!(!handle.newly_submitted());
    assert_eq!(handle.fetch_result().await.unwrap().unwrap().unwrap(), 42);
    assert_eq!(within(5, handle.into_future()).await.unwrap(), 42);
    assert_eq!(calls.of("add 20 22"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_job_group_joins_in_submission_order_and_resumes_failures() {
    let fx = Fixture::new().await;
    fx.failing.0.store(true, Ordering::SeqCst);
    let runner = fx.runner();
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Toggle>(rid("toggles"));
    assert_eq!(group.id().as_str(), "toggles");
    group.submit((0..4).map(|n| Toggle { n })).await.unwrap();

    let joined = within(30, group.join()).await.unwrap();
    let keys: Vec<&str> = joined.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["item-0", "item-1", "item-2", "item-3"]);
    assert_eq!(joined[0].result.as_ref().ok(), Some(&0));
    assert_eq!(joined[2].result.as_ref().ok(), Some(&20));
    let error = joined[1].result.as_ref().unwrap_err();
    assert_eq!(error.kind, StepErrorKind::Permanent);
    assert_eq!(error.message, "math error: odd 1 rejected");
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded, status.failed), (4, 2, 2));

    fx.failing.0.store(false, Ordering::SeqCst);
    group.resume().await.unwrap();
    let streamed: Vec<GroupResult<Toggle>> = within(30, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap();
    let mut values: Vec<u32> = streamed
        .iter()
        .map(|r| *r.result.as_ref().unwrap())
        .collect();
    values.sort();
    assert_eq!(values, [0, 10, 20, 30]);
    assert_eq!(
        fx.calls.of("toggle 0"),
        1,
        "a succeeded member is not run again"
    );
    assert_eq!(fx.calls.of("toggle 1"), 2);

    group.forget().await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn job_group_members_are_keyed_by_idempotency_key_and_can_be_cancelled() {
    let fx = Fixture::new().await;
    let runner = fx.runner();
    let group = runner.new_group::<Add>();
    group
        .submit([Add::new(1, 2), Add::keyed(3, 4, "seven"), Add::new(5, 6)])
        .await
        .unwrap();
    let keyed = runner.group::<Add>(group.id().clone());
    assert_eq!(keyed.status().await.unwrap().pending, 3);
    assert_eq!(keyed.cancel().await.unwrap(), 3);
    let joined = within(5, keyed.join()).await.unwrap();
    let keys: Vec<&str> = joined.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["item-0", "seven", "item-2"]);
    for result in &joined {
        let error = result.result.as_ref().unwrap_err();
        assert_eq!(error.kind, StepErrorKind::Transient);
        assert!(error.message.contains("cancelled"), "{}", error.message);
    }
    assert_eq!(keyed.status().await.unwrap().cancelled, 3);

    // Resumed, every member runs.
    let worker = runner.spawn(std::future::pending::<()>());
    group.resume().await.unwrap();
    let joined = within(30, group.join()).await.unwrap();
    let sums: Vec<i64> = joined.iter().map(|r| *r.result.as_ref().unwrap()).collect();
    assert_eq!(sums, [3, 7, 11]);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn submit_with_options_override_the_job_and_retention_ends_joins() {
    let fx = Fixture::new().await;
    let runner = fx.builder().retention(Duration::from_secs(5)).build();
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner
        .submit_with(
            Fails {
                label: "two attempts".into(),
                permanent: false,
                attempts: Some(9),
            },
            taquba_workflow::RunOptions {
                max_attempts_per_step: Some(2),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let error = within(30, handle.join()).await.unwrap().unwrap_err();
    assert_eq!(
        error.message,
        "math error: two attempts gave up on attempt 2 of 2 (last: true)"
    );
    assert_eq!(
        fx.calls.of("two attempts"),
        2,
        "the options' limit wins over Job::max_attempts"
    );

    // Once retention removed the records, the handle knows nothing more.
    fx.clock.advance(Duration::from_secs(6));
    within(30, async {
        while handle.status().await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(handle.fetch_result().await.unwrap().is_none());
    assert!(matches!(handle.join().await, Err(Error::RunNotFound(id)) if id == *handle.id()));
    assert!(matches!(
        handle.clone().into_future().await,
        Err(JoinError::Infra(Error::RunNotFound(_)))
    ));
    worker.shutdown().await.unwrap();
}

/// Counts its runs in the runner's state; keyed by `key`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Once {
    key: String,
}

impl Job for Once {
    const NAME: &'static str = "test.once";
    type Output = u32;
    type Error = MathError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, MathError> {
        ctx.state::<Calls>().record(self.key.clone());
        Ok(1)
    }

    fn idempotency_key(&self) -> Option<String> {
        Some(self.key.clone())
    }
}

/// Re-submissions racing with the job's termination (a real clock, two
/// threads) must find the job running or recorded, never start it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_job_re_submitted_while_it_terminates_runs_once() {
    let (queue, store) = real_clock_queue().await;
    let calls = Calls::default();
    let runner = JobRunner::builder(queue, store)
        .register::<Once>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    for i in 0..60 {
        let key = format!("once-{i}");
        let mut handles = Vec::new();
        for _ in 0..20 {
            handles.push(runner.submit(Once { key: key.clone() }).await.unwrap());
        }
        for handle in handles {
            assert_eq!(within(30, handle.into_future()).await.unwrap(), 1);
        }
        assert_eq!(calls.of(&key), 1, "{key} ran more than once");
    }
    worker.shutdown().await.unwrap();
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> usize {
    use futures_util::StreamExt;
    store
        .list(Some(&taquba::object_store::path::Path::from(prefix)))
        .count()
        .await
}

#[tokio::test(start_paused = true)]
async fn the_queue_name_and_memo_prefix_place_the_jobs_state() {
    let fx = Fixture::new().await;
    let billing = fx.builder().queue_name("billing").build();
    let worker = billing.spawn(std::future::pending::<()>());
    assert_eq!(
        within(
            5,
            billing.submit(Add::new(1, 1)).await.unwrap().into_future()
        )
        .await
        .unwrap(),
        2
    );
    worker.shutdown().await.unwrap();
    assert_eq!(fx.queue.view().stats("billing").await.unwrap().done, 1);
    assert_eq!(fx.queue.view().stats("jobs").await.unwrap().done, 0);
    assert!(
        objects_under(&fx.store, "billing-memo").await > 0,
        "the memo prefix follows the queue name"
    );

    let custom = fx.builder().memo_prefix("elsewhere").build();
    let worker = custom.spawn(std::future::pending::<()>());
    let handle = custom.submit(Add::new(2, 2)).await.unwrap();
    assert_eq!(within(5, handle.into_future()).await.unwrap(), 4);
    worker.shutdown().await.unwrap();
    assert_eq!(fx.queue.view().stats("jobs").await.unwrap().done, 1);
    assert!(objects_under(&fx.store, "elsewhere").await > 0);
    assert_eq!(objects_under(&fx.store, "jobs-memo").await, 0);
}
