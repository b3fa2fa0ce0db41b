//! Typed jobs at the public API: submit and await, joins, status, results
//! after a restart, idempotent submission, failures and retries, runner
//! state, job groups and registration; a job whose type changed between
//! deploys fails once naming the field; job groups submitted and resumed
//! from two runners at once, of 1000 jobs, and with colliding keys.

use crate::common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::tokio_clock_queue;
use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
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

// ---------------------------------------------------------------------------
// A job type changed between deploys.

mod drift {
    use serde::{Deserialize, Serialize};
    use taquba_workflow::jobs::{Job, JobContext};

    /// The job as the old deploy submitted it.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SendV1 {
        pub to: String,
    }

    impl Job for SendV1 {
        const NAME: &'static str = "drift.send";
        type Output = String;
        type Error = String;
        fn idempotency_key(&self) -> Option<String> {
            Some(format!("send:{}", self.to))
        }
        async fn run(&self, _ctx: JobContext<'_>) -> Result<String, String> {
            Ok(format!("sent to {}", self.to))
        }
    }

    /// The same job after a deploy added a required field and changed the
    /// output's type.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SendV2 {
        pub to: String,
        pub template: String,
    }

    impl Job for SendV2 {
        const NAME: &'static str = "drift.send";
        type Output = u64;
        type Error = String;
        async fn run(&self, _ctx: JobContext<'_>) -> Result<u64, String> {
            Ok(self.template.len() as u64)
        }
    }
}

/// A job submitted by one deploy and run by the next, whose job type gained
/// a required field: the job must fail permanently (one attempt, not
/// three) with an error naming the job, the missing field, the run and the
/// job's key.
#[tokio::test(start_paused = true)]
async fn a_job_whose_type_changed_between_deploys_fails_once_naming_the_field() {
    use taquba_workflow::jobs::JobRunner;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let old = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::SendV1>()
        .poll_interval(Duration::from_millis(20))
        .build();
    // Ran under the old deploy.
    let worker = old.spawn(std::future::pending::<()>());
    let done = old
        .submit(drift::SendV1 { to: "a@b".into() })
        .await
        .unwrap();
    assert_eq!(
        within(30, done.join()).await.unwrap().unwrap(),
        "sent to a@b"
    );
    worker.shutdown().await.unwrap();
    // Submitted by the old deploy, not yet run.
    let waiting = old
        .submit(drift::SendV1 { to: "c@d".into() })
        .await
        .unwrap();
    let new = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::SendV2>()
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = new.spawn(std::future::pending::<()>());
    let waiting_end = within(60, async {
        loop {
            if let Some(status) = new.view().status(waiting.id()).await.unwrap()
                && let RunState::Terminated(t) = status.state
            {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(waiting_end.status, TerminalStatus::Failed);
    let error = waiting_end.error.unwrap_or_default();
    assert!(
        error.contains("drift.send") && error.contains("template"),
        "unclear: {error}"
    );
    // An operator finds the run from the error alone: it names the run id
    // and the job's key (issue 22).
    assert!(
        error.contains(&format!("run `{}`", waiting.id())) && error.contains("\"send:c@d\""),
        "the error names neither the run nor the key: {error}"
    );
    let history = new.view().steps(waiting.id()).await.unwrap().unwrap();
    let attempts: usize = history.steps.iter().map(|s| s.attempts.len()).sum();
    assert_eq!(
        attempts, 1,
        "a payload that cannot decode is retried: {history:?}"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Job groups under concurrency and at size.

/// Executions by label, and the labels that already failed once.
type Executions = (HashMap<String, usize>, HashSet<String>);

/// Job executions by label, and the labels that already failed once.
#[derive(Clone, Default)]
struct JobBook(Arc<Mutex<Executions>>, Arc<Mutex<Vec<String>>>);

impl JobBook {
    fn runs(&self, label: &str) -> usize {
        self.0.lock().unwrap().0.get(label).copied().unwrap_or(0)
    }

    /// The recorded executions of `label`.
    fn log_of(&self, label: &str) -> Vec<String> {
        let prefix = format!("{label}:");
        self.1
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("chunk error: {0}")]
struct ChunkError(String);

/// Doubles `n`; `flaky` chunks fail permanently on their first execution.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chunk {
    n: u32,
    flaky: bool,
    key: Option<String>,
}

impl Chunk {
    fn label(&self) -> String {
        format!("chunk {}", self.n)
    }
}

impl Job for Chunk {
    const NAME: &'static str = "attack.chunk";
    type Output = u32;
    type Error = ChunkError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, ChunkError> {
        let fail = {
            let mut book = ctx.state::<JobBook>().0.lock().unwrap();
            *book.0.entry(self.label()).or_default() += 1;
            self.flaky && book.1.insert(self.label())
        };
        ctx.state::<JobBook>().1.lock().unwrap().push(format!(
            "{}: run {} job {} attempt {} fails {fail} at {:?}",
            self.label(),
            ctx.run_id,
            ctx.job_id,
            ctx.attempts,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros()
                % 100_000_000
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
        if fail {
            return Err(ChunkError(format!("first run of {}", self.n)));
        }
        Ok(self.n * 2)
    }

    fn classify(&self, _: &ChunkError) -> StepErrorKind {
        StepErrorKind::Permanent
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

fn job_runner(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>, book: &JobBook) -> JobRunner {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Chunk>()
        .state(book.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_jobs(32)
        .build()
}

/// An idempotency key equal to another job's positional key is a duplicate
/// member key, and nothing is written.
#[tokio::test(start_paused = true)]
async fn job_group_idempotency_key_colliding_with_a_positional_key_is_a_duplicate() {
    let (queue, store, _clock) = memory_queue().await;
    let book = JobBook::default();
    let runner = job_runner(&queue, &store, &book);
    let group = runner.group::<Chunk>(rid("collide"));
    let jobs = vec![
        Chunk {
            n: 0,
            flaky: false,
            key: None,
        },
        Chunk {
            n: 1,
            flaky: false,
            key: Some("item-0".into()),
        },
    ];
    let submitted = group.submit(jobs).await;
    assert!(
        matches!(&submitted, Err(Error::DuplicateMemberKey(k)) if k == "item-0"),
        "{submitted:?}"
    );
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
}

/// A job group of 1000 jobs joins in submission order; a resume re-runs
/// only the failures.
#[tokio::test(start_paused = true)]
async fn a_job_group_of_1000_joins_in_order_and_resumes_only_failures() {
    let (queue, store, _clock) = memory_queue().await;
    let book = JobBook::default();
    let runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Chunk>()
        .state(book.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_jobs(64)
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let jobs: Vec<Chunk> = (0..1000)
        .map(|n| Chunk {
            n,
            flaky: n % 50 == 7,
            key: None,
        })
        .collect();
    let group = runner.group::<Chunk>(rid("thousand"));
    group.submit(jobs.clone()).await.unwrap();
    let joined = within(300, group.join()).await.unwrap();
    assert_eq!(joined.len(), 1000);
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(r.key, format!("item-{i}"));
        assert_eq!(r.result.is_ok(), !jobs[i].flaky, "{}", r.key);
    }
    group.resume().await.unwrap();
    let joined = within(300, group.join()).await.unwrap();
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(r.key, format!("item-{i}"));
        assert_eq!(r.result.as_ref().ok(), Some(&(i as u32 * 2)));
    }
    group.submit(jobs.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for j in &jobs {
        assert_eq!(
            book.runs(&j.label()),
            if j.flaky { 2 } else { 1 },
            "{}",
            j.label()
        );
    }
    worker.shutdown().await.unwrap();
}

/// Concurrent `submit`/`resume` of one job group from two runners over one
/// queue (a real clock): `join` returns every job in submission order under
/// its key (idempotency key, else `item-{i}`), and each job runs once, or
/// twice when its first run failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_group_concurrent_submits_and_resumes_from_two_runners() {
    let (queue, store) = real_clock_queue().await;
    let book = JobBook::default();
    let r1 = job_runner(&queue, &store, &book);
    let r2 = job_runner(&queue, &store, &book);
    let w1 = r1.spawn(std::future::pending::<()>());
    let w2 = r2.spawn(std::future::pending::<()>());
    const N: u32 = 280;
    let jobs: Vec<Chunk> = (0..N)
        .map(|n| Chunk {
            n,
            flaky: n % 6 == 1,
            key: (n % 7 == 3).then(|| format!("ключ/{n}/🔑")),
        })
        .collect();
    let keys: Vec<String> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| j.key.clone().unwrap_or_else(|| format!("item-{i}")))
        .collect();
    let id = rid("job-storm");
    let mut done = false;
    for round in 0..6 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, runner) in [&r1, &r2, &r1, &r2].into_iter().enumerate() {
            let group = runner.group::<Chunk>(id.clone());
            let jobs = jobs.clone();
            let resume = round > 0 && i >= 2;
            tasks.spawn(async move {
                if resume {
                    group.resume().await
                } else {
                    group.submit(jobs).await
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        }
        let group = r1.group::<Chunk>(id.clone());
        let joined = tokio::time::timeout(Duration::from_secs(20), group.join())
            .await
            .expect("join in time")
            .expect("join");
        let got: Vec<&str> = joined.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(got, keys, "round {round}: join order or keys");
        for (r, job) in joined.iter().zip(&jobs) {
            if let Ok(v) = &r.result {
                assert_eq!(*v, job.n * 2);
            } else {
                assert!(job.flaky, "round {round}: {} failed", r.key);
            }
        }
        if joined.iter().all(|r| r.result.is_ok()) {
            done = true;
            break;
        }
    }
    assert!(done, "the job group never completed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wrong: Vec<String> = jobs
        .iter()
        .filter_map(|j| {
            let runs = book.runs(&j.label());
            let expected = if j.flaky { 2 } else { 1 };
            (runs != expected).then(|| {
                format!(
                    "{}: ran {runs} times, expected {expected}: {:#?}",
                    j.label(),
                    book.log_of(&j.label())
                )
            })
        })
        .collect();
    w1.shutdown().await.unwrap();
    w2.shutdown().await.unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A handle joined after its job ended takes the end the job's
/// termination reported, and it is still the job's end: after a requeue
/// ran the job again, the same handle answers the second end, not the
/// first it saw.
#[tokio::test(start_paused = true)]
async fn a_handle_joined_after_a_requeue_answers_the_jobs_new_end() {
    let fx = Fixture::new().await;
    fx.failing.0.store(true, Ordering::SeqCst);
    let runner = fx.runner();
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner.submit(Toggle { n: 1 }).await.unwrap();
    let terminal = |status: Option<taquba_workflow::RunStatus>| match status.map(|s| s.state) {
        Some(RunState::Terminated(t)) => Some(t.status),
        _ => None,
    };
    within(10, async {
        while terminal(handle.status().await.unwrap()) != Some(TerminalStatus::Failed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    fx.failing.0.store(false, Ordering::SeqCst);
    let inbox = taquba_workflow::inbox::Inbox::new(fx.store.clone(), "jobs-memo");
    inbox
        .send(taquba_workflow::inbox::Command::requeue(
            handle.id().clone(),
        ))
        .await
        .unwrap();
    within(10, async {
        while terminal(handle.status().await.unwrap()) != Some(TerminalStatus::Succeeded) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), 10);
    assert_eq!(fx.calls.of("toggle 1"), 2);
    worker.shutdown().await.unwrap();
}

/// A handle joined while its job runs (on a runner other than the worker's,
/// its maintenance an hour away) ends when the job's step is dead-lettered
/// outside the worker (its lease expired on its last attempt): the join's
/// own look at the job reconciles it within a few poll intervals, as a
/// run's wait does. A handle that waits on its submission's watch alone,
/// with no look, would hang here.
#[tokio::test(start_paused = true)]
async fn a_handle_joined_before_its_jobs_lease_expires_ends_failed_without_maintenance() {
    let clock = MockClock::new(T0);
    let (queue, store) = crate::fixtures::memory_queue_with_lease(
        &clock,
        taquba_workflow::jobs::DEFAULT_JOB_QUEUE,
        Duration::from_secs(10),
    )
    .await;
    let gate = Gate::default();
    let worker_runner = builder(&queue, &store)
        .state(gate.clone())
        .poll_interval(Duration::from_secs(3600))
        .build();
    let client = builder(&queue, &store)
        .poll_interval(Duration::from_millis(50))
        .build();
    let handle = client
        .submit_with(
            Gated {
                label: "stuck".into(),
            },
            taquba_workflow::RunOptions {
                max_attempts_per_step: Some(1),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(handle.newly_submitted());
    let joined = tokio::spawn(handle.clone().into_future());
    let worker = worker_runner.spawn(std::future::pending::<()>());
    eventually("the job to start", || async {
        handle.status().await.unwrap().unwrap().state == RunState::Running
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!joined.is_finished(), "the job still runs");

    clock.advance(Duration::from_secs(11));
    let expired = tokio::time::Instant::now();
    let result = within(30, joined).await.unwrap();
    assert!(expired.elapsed() < Duration::from_secs(10));
    match result {
        Err(JoinError::Job(failure)) => assert_eq!(failure.message, "lease expired"),
        other => panic!("expected the job to fail, got {other:?}"),
    }
    gate.open();
    worker.shutdown().await.unwrap();
}
