//! Typed jobs' submit/join/wait attacked at the public API (review of the
//! handle watching its job from before its submission commits, the
//! terminal record encoded once with its history entries and the run
//! result record written by reference): joins before, during and long
//! after a job, clones joined at once, zero and short timeouts, submit
//! futures dropped at every poll, keyed jobs racing and resubmitted,
//! cancels, requeues, failures, retries and lost leases with the worker's
//! maintenance an hour away, two runners in one process, a worker shut
//! down and restarted, a queue taken over, and results and history read
//! back after reopening the store.

use crate::common;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, UNIX_EPOCH};

use common::*;
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::{MockClock, Queue};
use taquba_workflow::history::AttemptOutcome;
use taquba_workflow::jobs::{
    Job, JobContext, JobError, JobHandle, JobRunner, JobRunnerBuilder, JoinError,
};
use taquba_workflow::{
    Error, NoopTerminalHook, RunId, RunOptions, RunState, RunnerHandle, Step, StepError,
    StepErrorKind, StepOutcome, StepRunner, TerminalStatus, WorkflowRuntime,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const HOUR: Duration = Duration::from_secs(3600);
const JOBS: &str = "jobs";

#[derive(Debug, thiserror::Error)]
#[error("boom: {0}")]
struct Boom(String);

/// Calls of each job, by label; registered as runner state.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

impl Calls {
    fn record(&self, label: &str) {
        *self
            .0
            .lock()
            .expect("calls")
            .entry(label.to_string())
            .or_default() += 1;
    }

    fn of(&self, label: &str) -> usize {
        self.0
            .lock()
            .expect("calls")
            .get(label)
            .copied()
            .unwrap_or(0)
    }
}

/// While set, `Shaky` jobs fail whatever their attempt.
#[derive(Clone, Default)]
struct Broken(Arc<AtomicBool>);

impl Broken {
    fn set(&self, broken: bool) {
        self.0.store(broken, Ordering::SeqCst);
    }
}

/// Returns its label (padded with `pad` bytes); keyed when `key` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Echo {
    label: String,
    key: Option<String>,
    pad: usize,
}

fn echo(label: &str) -> Echo {
    Echo {
        label: label.into(),
        key: None,
        pad: 0,
    }
}

fn keyed_echo(label: &str, key: &str) -> Echo {
    Echo {
        label: label.into(),
        key: Some(key.into()),
        pad: 0,
    }
}

impl Job for Echo {
    const NAME: &'static str = "review.echo";
    type Output = String;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, Boom> {
        ctx.state::<Calls>().record(&self.label);
        Ok(format!("{}{}", self.label, "x".repeat(self.pad)))
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

/// Waits at the runner's gate (or for its cancel token) on its attempts up
/// to `hang_attempts`, then returns `{label}@{attempt}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Held {
    label: String,
    hang_attempts: u32,
    max: Option<u32>,
    key: Option<String>,
    concurrency: Option<String>,
}

fn held(label: &str) -> Held {
    Held {
        label: label.into(),
        hang_attempts: u32::MAX,
        max: None,
        key: None,
        concurrency: None,
    }
}

impl Job for Held {
    const NAME: &'static str = "review.held";
    type Output = String;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, Boom> {
        ctx.state::<Calls>().record(&self.label);
        if ctx.attempts <= self.hang_attempts {
            tokio::select! {
                () = ctx.state::<Gate>().wait() => {}
                () = ctx.cancel_token.cancelled() => {
                    return Err(Boom(format!("{} saw its cancel", self.label)));
                }
            }
        }
        Ok(format!("{}@{}", self.label, ctx.attempts))
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }

    fn max_attempts(&self) -> Option<u32> {
        self.max
    }

    fn concurrency_key(&self) -> Option<String> {
        self.concurrency.clone()
    }
}

/// Fails its first `failures` attempts (and every attempt while `Broken`
/// is set), then returns the attempt number.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shaky {
    label: String,
    failures: u32,
    permanent: bool,
    max: Option<u32>,
    key: Option<String>,
}

fn shaky(label: &str, failures: u32, permanent: bool, max: Option<u32>) -> Shaky {
    Shaky {
        label: label.into(),
        failures,
        permanent,
        max,
        key: None,
    }
}

impl Job for Shaky {
    const NAME: &'static str = "review.shaky";
    type Output = u32;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, Boom> {
        ctx.state::<Calls>().record(&self.label);
        if ctx.attempts <= self.failures || ctx.state::<Broken>().0.load(Ordering::SeqCst) {
            return Err(Boom(format!("{} attempt {}", self.label, ctx.attempts)));
        }
        Ok(ctx.attempts)
    }

    fn classify(&self, _: &Boom) -> StepErrorKind {
        if self.permanent {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        }
    }

    fn max_attempts(&self) -> Option<u32> {
        self.max
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

/// A step runner that is never called (for a runtime used to cancel and
/// requeue job runs, never spawned).
#[derive(Clone)]
struct Idle;

impl StepRunner for Idle {
    async fn run_step(&self, _step: &Step) -> Result<StepOutcome, StepError> {
        panic!("the operator runtime runs no steps")
    }
}

struct Fx {
    queue: Arc<Queue>,
    store: Arc<dyn ObjectStore>,
    clock: MockClock,
    calls: Calls,
    gate: Gate,
    broken: Broken,
}

impl Fx {
    async fn new() -> Self {
        let (queue, store, clock) = memory_queue().await;
        Self::over(queue, store, clock)
    }

    /// Over a queue whose `jobs` queue leases for 10 s.
    async fn short_leases() -> Self {
        let clock = MockClock::new(T0);
        let (queue, store) =
            crate::fixtures::memory_queue_with_lease(&clock, JOBS, Duration::from_secs(10)).await;
        Self::over(queue, store, clock)
    }

    fn over(queue: Arc<Queue>, store: Arc<dyn ObjectStore>, clock: MockClock) -> Self {
        Self {
            queue,
            store,
            clock,
            calls: Calls::default(),
            gate: Gate::default(),
            broken: Broken::default(),
        }
    }

    fn builder(&self, poll: Duration) -> JobRunnerBuilder {
        builder_with(
            &self.queue,
            &self.store,
            poll,
            &self.calls,
            &self.gate,
            &self.broken,
        )
    }

    /// The runner whose worker runs (50 ms poll interval).
    fn worker(&self) -> JobRunner {
        self.builder(Duration::from_millis(50)).build()
    }

    /// A runner that only submits and joins, polling every hour: its joins
    /// end only by the worker's commits waking them.
    fn client(&self) -> JobRunner {
        self.builder(HOUR).build()
    }

    /// Until `label` has run `n` times.
    async fn until_runs(&self, what: &str, label: &str, n: usize) {
        eventually(what, || async { self.calls.of(label) == n }).await;
    }

    /// A client runner and a running worker (see [`Self::client`] and
    /// [`Self::worker`]).
    fn client_and_worker(&self) -> (JobRunner, Worker) {
        let client = self.client();
        let runner = self.worker();
        let handle = run_worker(&runner);
        let worker = Worker {
            _runner: runner,
            handle,
        };
        (client, worker)
    }

    /// A workflow runtime over the queue, to cancel and requeue job runs.
    fn operator(&self) -> WorkflowRuntime<Idle, NoopTerminalHook> {
        WorkflowRuntime::builder(
            self.queue.clone(),
            self.store.clone(),
            Idle,
            NoopTerminalHook,
        )
        .queue_name(JOBS)
        .memo_prefix("jobs-memo")
        .poll_interval(Duration::from_millis(50))
        .build()
    }
}

fn builder_over(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    poll: Duration,
) -> JobRunnerBuilder {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Echo>()
        .register::<Held>()
        .register::<Shaky>()
        .poll_interval(poll)
}

/// A runner over `queue` (registering every job, polling every `poll`)
/// with the test doubles as its state.
fn builder_with(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    poll: Duration,
    calls: &Calls,
    gate: &Gate,
    broken: &Broken,
) -> JobRunnerBuilder {
    builder_over(queue, store, poll)
        .state(calls.clone())
        .state(gate.clone())
        .state(broken.clone())
}

/// A runner over `queue` polling every 50 ms (see [`builder_with`]).
fn runner_over(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    calls: &Calls,
    gate: &Gate,
    broken: &Broken,
) -> JobRunner {
    builder_with(queue, store, Duration::from_millis(50), calls, gate, broken).build()
}

/// A worker runner and its worker, running until shut down.
struct Worker {
    _runner: JobRunner,
    handle: RunnerHandle,
}

impl Worker {
    async fn shutdown(self) -> taquba_workflow::Result<()> {
        self.handle.shutdown().await
    }
}

/// Spawns `runner`'s worker, running until it is shut down.
fn run_worker(runner: &JobRunner) -> RunnerHandle {
    runner.spawn(std::future::pending::<()>())
}

/// `job` submitted on `client` to run at `T0 + ms` (of the queue's clock).
async fn submit_at<J: Job>(client: &JobRunner, job: J, ms: u64) -> JobHandle<J> {
    client
        .submit_with(
            job,
            RunOptions {
                run_at: Some(UNIX_EPOCH + Duration::from_millis(T0 + ms)),
                ..Default::default()
            },
        )
        .await
        .unwrap()
}

/// `n` tasks awaiting clones of `handle`.
fn spawn_joins<J: Job>(
    handle: &JobHandle<J>,
    n: usize,
) -> Vec<JoinHandle<Result<J::Output, JoinError>>> {
    (0..n)
        .map(|_| tokio::spawn(handle.clone().into_future()))
        .collect()
}

/// A task calling `join` on a clone of `handle`.
fn spawn_join<J: Job>(
    handle: &JobHandle<J>,
) -> JoinHandle<taquba_workflow::Result<Result<J::Output, JobError>>> {
    let handle = handle.clone();
    tokio::spawn(async move { handle.join().await })
}

/// The history of a job whose one step had the attempts `outcomes`.
fn one_step(name: &str, outcomes: Vec<AttemptOutcome>) -> Vec<(u32, String, Vec<AttemptOutcome>)> {
    vec![(0, name.to_string(), outcomes)]
}

/// The attempts of each retained step of `run_id`, with the step names.
async fn history(runner: &JobRunner, run_id: &RunId) -> Vec<(u32, String, Vec<AttemptOutcome>)> {
    runner
        .view()
        .steps(run_id)
        .await
        .unwrap()
        .expect("the job's history")
        .steps
        .into_iter()
        .map(|step| {
            (
                step.step,
                step.name,
                step.attempts.into_iter().map(|a| a.outcome).collect(),
            )
        })
        .collect()
}

async fn terminated_status(runner: &JobRunner, run_id: &RunId) -> Option<TerminalStatus> {
    match runner.view().status(run_id).await.unwrap()?.state {
        RunState::Terminated(t) => Some(t.status),
        _ => None,
    }
}

/// Poll `fut` `n` times by hand (yielding to the runtime between polls),
/// then drop it; its output when it finished first.
async fn poll_n_then_drop<F: Future>(fut: F, n: usize) -> Option<F::Output> {
    let mut fut = Box::pin(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..n {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        tokio::task::yield_now().await;
    }
    None
}

// ---------------------------------------------------------------------------

/// Joins of one job through a client runner polling hourly: before the job
/// was claimed (zero and short timeouts, then clones joined at once),
/// while it runs, and long after it ended; every join gives the output,
/// promptly, and the status, the result and the history agree.
#[tokio::test(start_paused = true)]
async fn joins_before_during_and_long_after_a_job_all_get_its_output() {
    let fx = Fx::new().await;
    let client = fx.client();
    let handle = client.submit(held("one")).await.unwrap();
    assert!(handle.newly_submitted());
    // No worker yet: nothing ends.
    assert!(handle.join_timeout(Duration::ZERO).await.unwrap().is_none());
    assert!(
        handle
            .join_timeout(Duration::from_millis(30))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        handle.status().await.unwrap().unwrap().state,
        RunState::Pending
    );
    assert!(handle.fetch_result().await.unwrap().is_none());

    let early = spawn_joins(&handle, 6);
    let early_join = spawn_join(&handle);
    let worker_runner = fx.worker();
    let worker = run_worker(&worker_runner);
    fx.until_runs("the job to start", "one", 1).await;
    assert_eq!(
        handle.status().await.unwrap().unwrap().state,
        RunState::Running
    );
    let during = spawn_join(&handle);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(early.iter().all(|j| !j.is_finished()) && !during.is_finished());
    assert!(handle.fetch_result().await.unwrap().is_none());

    let opened = Instant::now();
    fx.gate.open();
    for join in early {
        assert_eq!(within(5, join).await.unwrap().unwrap(), "one@1");
    }
    assert_eq!(
        within(5, early_join).await.unwrap().unwrap().unwrap(),
        "one@1"
    );
    assert_eq!(within(5, during).await.unwrap().unwrap().unwrap(), "one@1");
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "woken by the worker's commit, not the client's hourly look ({:?})",
        opened.elapsed()
    );

    // Long after.
    fx.clock.advance(Duration::from_secs(600));
    tokio::time::sleep(Duration::from_secs(600)).await;
    let late = Instant::now();
    assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), "one@1");
    assert_eq!(
        handle
            .join_timeout(Duration::ZERO)
            .await
            .unwrap()
            .expect("an ended job is reported with a zero timeout")
            .unwrap(),
        "one@1"
    );
    assert_eq!(
        within(5, handle.clone().into_future()).await.unwrap(),
        "one@1"
    );
    assert!(late.elapsed() < Duration::from_secs(1));
    assert_eq!(
        handle.fetch_result().await.unwrap().unwrap().unwrap(),
        "one@1"
    );
    assert_eq!(
        terminated_status(&client, handle.id()).await,
        Some(TerminalStatus::Succeeded)
    );
    assert_eq!(
        history(&client, handle.id()).await,
        one_step(Held::NAME, vec![AttemptOutcome::Succeeded])
    );
    assert_eq!(fx.calls.of("one"), 1);
    worker.shutdown().await.unwrap();
}

/// The first join takes the watch the submission registered; a join that
/// took it and was dropped (a timeout around it) must not leave later
/// joins, of the handle or of clones, waiting for the hourly look.
#[tokio::test(start_paused = true)]
async fn a_dropped_first_join_leaves_later_joins_woken_by_the_end() {
    let fx = Fx::new().await;
    let (client, worker) = fx.client_and_worker();
    let handle = client.submit(held("dropped-join")).await.unwrap();
    let clone = handle.clone();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), clone.join())
            .await
            .is_err(),
        "the job is held"
    );
    drop(clone);
    let again = spawn_join(&handle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!again.is_finished());
    let opened = Instant::now();
    fx.gate.open();
    assert_eq!(
        within(5, again).await.unwrap().unwrap().unwrap(),
        "dropped-join@1"
    );
    assert_eq!(
        within(5, handle.join()).await.unwrap().unwrap(),
        "dropped-join@1"
    );
    assert!(opened.elapsed() < Duration::from_secs(5));
    worker.shutdown().await.unwrap();
}

/// `submit` dropped after 0..30 polls, unkeyed and keyed: each job runs at
/// most once; a keyed resubmission finds the job the dropped call
/// committed (and then it is not run again), or starts it.
#[tokio::test(start_paused = true)]
async fn submit_dropped_at_every_poll_runs_each_job_at_most_once() {
    let fx = Fx::new().await;
    let runner = fx.worker();
    let worker = run_worker(&runner);
    let mut unkeyed_done = Vec::new();
    for n in 0..30 {
        let label = format!("plain-{n}");
        if let Some(result) = poll_n_then_drop(runner.submit(echo(&label)), n).await {
            let handle = result.unwrap();
            unkeyed_done.push((label.clone(), handle));
        }

        let keyed = format!("keyed-{n}");
        let finished = poll_n_then_drop(runner.submit(keyed_echo(&keyed, &keyed)), n).await;
        if let Some(result) = &finished {
            assert!(result.as_ref().unwrap().newly_submitted());
        }
        // Let a detached submission commit.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let again = runner.submit(keyed_echo(&keyed, &keyed)).await.unwrap();
        if finished.is_some() {
            assert!(!again.newly_submitted(), "{keyed}: submitted twice");
        }
        assert_eq!(within(5, again.join()).await.unwrap().unwrap(), keyed);
        if let Some(Ok(first)) = finished {
            assert_eq!(within(5, first.join()).await.unwrap().unwrap(), keyed);
        }
    }
    for (label, handle) in unkeyed_done {
        assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), label);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in 0..30 {
        let plain = fx.calls.of(&format!("plain-{n}"));
        assert!(plain <= 1, "plain-{n} ran {plain} times");
        if n == 0 {
            assert_eq!(plain, 0, "a submit never polled commits nothing");
        } else {
            // Documented: the group commit's task has the job before the
            // first await.
            assert_eq!(plain, 1, "plain-{n} polled {n} times was not committed");
        }
        assert_eq!(fx.calls.of(&format!("keyed-{n}")), 1, "keyed-{n}");
    }
    worker.shutdown().await.unwrap();
}

/// A keyed job submitted 8 times at once is one job; again after its end
/// it is answered from its record (same output, not run again); another
/// payload under the key is refused before and after the end.
#[tokio::test(start_paused = true)]
async fn keyed_submissions_racing_and_after_the_end_are_one_job() {
    let fx = Fx::new().await;
    let client = fx.client();
    let worker_runner = fx.worker();
    let submissions: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.submit(keyed_echo("race", "k-race")).await })
        })
        .collect();
    let mut handles = Vec::new();
    for submission in submissions {
        handles.push(within(5, submission).await.unwrap().unwrap());
    }
    assert_eq!(handles.iter().filter(|h| h.newly_submitted()).count(), 1);
    assert!(handles.iter().all(|h| h.id() == handles[0].id()));
    assert!(matches!(
        client.submit(keyed_echo("other", "k-race")).await,
        Err(Error::InputMismatch(id)) if &id == handles[0].id()
    ));
    let joins: Vec<_> = handles
        .iter()
        .map(|h| tokio::spawn(h.clone().into_future()))
        .collect();
    let worker = run_worker(&worker_runner);
    for join in joins {
        assert_eq!(within(5, join).await.unwrap().unwrap(), "race");
    }
    assert_eq!(fx.calls.of("race"), 1);

    let after = client.submit(keyed_echo("race", "k-race")).await.unwrap();
    assert!(!after.newly_submitted());
    assert_eq!(
        after.fetch_result().await.unwrap().unwrap().unwrap(),
        "race"
    );
    assert_eq!(within(5, after.join()).await.unwrap().unwrap(), "race");
    assert!(matches!(
        client.submit(keyed_echo("other", "k-race")).await,
        Err(Error::InputMismatch(_))
    ));
    // Racing resubmissions after the end: none runs it again.
    let again: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.submit(keyed_echo("race", "k-race")).await })
        })
        .collect();
    for submission in again {
        let handle = within(5, submission).await.unwrap().unwrap();
        assert!(!handle.newly_submitted());
        assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), "race");
    }
    assert_eq!(fx.calls.of("race"), 1);
    worker.shutdown().await.unwrap();
}

/// A permanent failure ends at once, a transient one is retried to
/// success: each join gives the failure or the output, the keyed failure
/// resubmitted is answered from its record, and the history holds every
/// attempt with the job's name.
#[tokio::test(start_paused = true)]
async fn failures_and_retries_are_joined_with_every_attempt_in_the_history() {
    let fx = Fx::new().await;
    let (client, worker) = fx.client_and_worker();

    let mut permanent = shaky("perm", 5, true, Some(5));
    permanent.key = Some("k-perm".into());
    let failed = client.submit(permanent.clone()).await.unwrap();
    let retried = client
        .submit(shaky("retry", 2, false, Some(3)))
        .await
        .unwrap();
    let exhausted = client
        .submit(shaky("exhausted", 9, false, Some(2)))
        .await
        .unwrap();

    let error = within(5, failed.join()).await.unwrap().unwrap_err();
    assert_eq!(
        error,
        JobError {
            kind: StepErrorKind::Permanent,
            message: "boom: perm attempt 1".into()
        }
    );
    assert_eq!(within(5, retried.join()).await.unwrap().unwrap(), 3);
    match within(5, exhausted.clone().into_future()).await {
        Err(JoinError::Job(error)) => {
            assert_eq!(error.kind, StepErrorKind::Transient);
            assert_eq!(error.message, "boom: exhausted attempt 2");
        }
        other => panic!("expected the exhausted job's failure, got {other:?}"),
    }
    assert_eq!(
        failed.fetch_result().await.unwrap().unwrap().unwrap_err(),
        error
    );
    assert_eq!(retried.fetch_result().await.unwrap().unwrap().unwrap(), 3);

    let again = client.submit(permanent).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(within(5, again.join()).await.unwrap().unwrap_err(), error);
    assert_eq!(fx.calls.of("perm"), 1);
    assert_eq!(fx.calls.of("retry"), 3);
    assert_eq!(fx.calls.of("exhausted"), 2);

    assert_eq!(
        history(&client, failed.id()).await,
        one_step(
            Shaky::NAME,
            vec![AttemptOutcome::Failed {
                kind: StepErrorKind::Permanent,
                error: "boom: perm attempt 1".into()
            }]
        )
    );
    assert_eq!(
        history(&client, retried.id()).await,
        one_step(
            Shaky::NAME,
            vec![
                AttemptOutcome::Retried {
                    error: "boom: retry attempt 1".into()
                },
                AttemptOutcome::Retried {
                    error: "boom: retry attempt 2".into()
                },
                AttemptOutcome::Succeeded,
            ]
        )
    );
    let steps = history(&client, exhausted.id()).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(
        steps[0].2,
        vec![
            AttemptOutcome::Retried {
                error: "boom: exhausted attempt 1".into()
            },
            AttemptOutcome::Failed {
                kind: StepErrorKind::Transient,
                error: "boom: exhausted attempt 2".into()
            },
        ]
    );
    worker.shutdown().await.unwrap();
}

/// A running job cancelled from a workflow runtime over the queue: every
/// handle (joined before, during, after) ends with the cancellation,
/// promptly on a client polling hourly; the history records it.
#[tokio::test(start_paused = true)]
async fn a_running_job_cancelled_from_outside_ends_every_join() {
    let fx = Fx::new().await;
    let (client, worker) = fx.client_and_worker();
    let handle = client.submit(held("to-cancel")).await.unwrap();
    let before = tokio::spawn(handle.clone().into_future());
    fx.until_runs("the job to start", "to-cancel", 1).await;
    let during = tokio::spawn(handle.clone().into_future());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled_at = Instant::now();
    assert!(fx.operator().cancel(handle.id()).await.unwrap());
    for join in [before, during] {
        match within(5, join).await.unwrap() {
            Err(JoinError::Job(error)) => {
                assert_eq!(error.kind, StepErrorKind::Transient, "{error:?}");
            }
            other => panic!("expected the cancellation, got {other:?}"),
        }
    }
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    let after = within(5, handle.join()).await.unwrap().unwrap_err();
    assert_eq!(
        handle.fetch_result().await.unwrap().unwrap().unwrap_err(),
        after
    );
    assert_eq!(
        terminated_status(&client, handle.id()).await,
        Some(TerminalStatus::Cancelled)
    );
    let steps = history(&client, handle.id()).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].1, Held::NAME);
    assert!(
        matches!(steps[0].2.as_slice(), [AttemptOutcome::Cancelled { .. }]),
        "{steps:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A job parked behind its concurrency key (limit 1) and a job scheduled
/// for tomorrow, cancelled while their handles wait on a client polling
/// hourly: the joins end with the cancellation at once; the job holding
/// the key still ends with its output.
#[tokio::test(start_paused = true)]
async fn waiting_jobs_cancelled_end_their_joins_at_once() {
    let fx = Fx::new().await;
    let (client, worker) = fx.client_and_worker();
    let mut first = held("holder");
    first.concurrency = Some("tenant".into());
    let mut second = held("parked");
    second.concurrency = Some("tenant".into());
    let holder = client.submit(first).await.unwrap();
    fx.until_runs("the holder to start", "holder", 1).await;
    let parked = client.submit(second).await.unwrap();
    let tomorrow = submit_at(&client, echo("tomorrow"), 86_400_000).await;
    let joins = [
        tokio::spawn(parked.clone().into_future()),
        tokio::spawn(tomorrow.clone().into_future()),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(joins.iter().all(|j| !j.is_finished()));
    let operator = fx.operator();
    let cancelled_at = Instant::now();
    assert!(operator.cancel(parked.id()).await.unwrap());
    assert!(operator.cancel(tomorrow.id()).await.unwrap());
    for join in joins {
        assert!(matches!(
            within(5, join).await.unwrap(),
            Err(JoinError::Job(_))
        ));
    }
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert_eq!(fx.calls.of("parked"), 0);
    assert_eq!(fx.calls.of("tomorrow"), 0);
    fx.gate.open();
    assert_eq!(within(5, holder.join()).await.unwrap().unwrap(), "holder@1");
    for id in [parked.id(), tomorrow.id()] {
        let steps = history(&client, id).await;
        assert!(
            steps
                .last()
                .is_some_and(|s| matches!(s.2.last(), Some(AttemptOutcome::Cancelled { .. }))),
            "{steps:?}"
        );
    }
    worker.shutdown().await.unwrap();
}

/// A job that failed (its last attempt's transient error dead-lettered
/// it) requeued: a handle whose watch holds the first end and that was
/// not joined meanwhile, and clones joined while the job runs again, all
/// report the second end (success); the history has both executions.
#[tokio::test(start_paused = true)]
async fn a_requeued_job_is_joined_to_its_second_end() {
    let fx = Fx::new().await;
    fx.broken.set(true);
    let (client, worker) = fx.client_and_worker();
    let mut job = shaky("requeued", 0, false, Some(1));
    job.key = Some("k-requeued".into());
    let handle = client.submit(job.clone()).await.unwrap();
    let watched_early = handle.clone();
    let first = within(5, handle.join()).await.unwrap().unwrap_err();
    assert_eq!(first.message, "boom: requeued attempt 1");
    assert_eq!(fx.calls.of("requeued"), 1);

    // `handle` took the watch the clones share; a keyed resubmission
    // (not new) watches from before the requeue.
    fx.broken.set(false);
    let resubmitted = client.submit(job.clone()).await.unwrap();
    assert!(!resubmitted.newly_submitted());
    let outcome = fx.operator().requeue(handle.id()).await.unwrap();
    assert_eq!(&outcome.run_id, handle.id());
    let during = tokio::spawn(resubmitted.clone().into_future());
    assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), 1);
    assert_eq!(within(5, watched_early.join()).await.unwrap().unwrap(), 1);
    assert_eq!(within(5, during).await.unwrap().unwrap(), 1);
    assert_eq!(
        resubmitted.fetch_result().await.unwrap().unwrap().unwrap(),
        1
    );
    assert_eq!(fx.calls.of("requeued"), 2);
    let steps = history(&client, handle.id()).await;
    let outcomes: Vec<&AttemptOutcome> = steps.iter().flat_map(|s| s.2.iter()).collect();
    assert!(
        outcomes
            .first()
            .is_some_and(|o| matches!(o, AttemptOutcome::Failed { .. }))
            && outcomes.contains(&&AttemptOutcome::Requeued)
            && outcomes.last() == Some(&&AttemptOutcome::Succeeded),
        "{steps:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A fresh submission's handle not joined until after its job failed and
/// was requeued and succeeded: its watch holds the first end (Failed); the
/// join must report what the job's records now hold (Succeeded), not the
/// stale end.
#[tokio::test(start_paused = true)]
async fn a_handle_joined_only_after_a_requeue_reports_the_latest_end() {
    let fx = Fx::new().await;
    fx.broken.set(true);
    let (client, worker) = fx.client_and_worker();
    let handle = client
        .submit(shaky("stale", 0, false, Some(1)))
        .await
        .unwrap();
    eventually("the first end", || async {
        terminated_status(&client, handle.id()).await == Some(TerminalStatus::Failed)
    })
    .await;
    fx.broken.set(false);
    fx.operator().requeue(handle.id()).await.unwrap();
    eventually("the second end", || async {
        terminated_status(&client, handle.id()).await == Some(TerminalStatus::Succeeded)
    })
    .await;
    assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), 1);
    assert_eq!(
        handle
            .join_timeout(Duration::ZERO)
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
        1
    );
    worker.shutdown().await.unwrap();
}

/// The job's lease expires on its last attempt while the worker's runner
/// polls (and maintains) hourly: a client runner polling every 50 ms joins
/// it, and its join ends Failed through its own look; the handler
/// returning late changes nothing; the history records the attempt; a
/// keyed resubmission answers with the failure without running it again.
#[tokio::test(start_paused = true)]
async fn a_lease_lost_on_the_last_attempt_ends_the_client_join() {
    let fx = Fx::short_leases().await;
    let worker_runner = fx.builder(HOUR).build();
    let client = fx.builder(Duration::from_millis(50)).build();
    let worker = run_worker(&worker_runner);
    let mut job = held("lost");
    job.max = Some(1);
    job.key = Some("k-lost".into());
    let handle = client.submit(job.clone()).await.unwrap();
    fx.until_runs("the job to start", "lost", 1).await;
    let joins = spawn_joins(&handle, 3);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(joins.iter().all(|j| !j.is_finished()));

    fx.clock.advance(Duration::from_secs(11));
    let expired = Instant::now();
    let mut errors = Vec::new();
    for join in joins {
        match within(60, join).await.unwrap() {
            Err(JoinError::Job(error)) => errors.push(error),
            other => panic!("expected the lost lease's failure, got {other:?}"),
        }
    }
    assert!(
        expired.elapsed() < Duration::from_secs(15),
        "{:?}",
        expired.elapsed()
    );
    assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
    assert_eq!(
        terminated_status(&client, handle.id()).await,
        Some(TerminalStatus::Failed)
    );
    // The handler returns late: its settlement finds its claim lost.
    fx.gate.open();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        within(5, handle.join()).await.unwrap().unwrap_err(),
        errors[0]
    );
    assert_eq!(
        handle.fetch_result().await.unwrap().unwrap().unwrap_err(),
        errors[0]
    );
    let again = client.submit(job).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(
        within(5, again.join()).await.unwrap().unwrap_err(),
        errors[0]
    );
    assert_eq!(fx.calls.of("lost"), 1);
    let steps = history(&client, handle.id()).await;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert!(
        matches!(
            steps[0].2.as_slice(),
            [AttemptOutcome::DeadLettered { .. }] | [AttemptOutcome::LeaseExpired]
        ),
        "{steps:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A job whose first attempt hangs past its 10 s lease (the reaper
/// delivers it again; the second attempt succeeds), joined on a client
/// runner; the first attempt is left hanging. Returns the fixture, the
/// handle and the worker.
async fn lost_lease_then_retried() -> (
    Fx,
    JobRunner,
    taquba_workflow::jobs::JobHandle<Held>,
    Worker,
) {
    let fx = Fx::short_leases().await;
    let (client, worker) = fx.client_and_worker();
    let mut job = held("retried-lease");
    job.hang_attempts = 1;
    let handle = client.submit(job).await.unwrap();
    fx.until_runs("the first attempt", "retried-lease", 1).await;
    let join = tokio::spawn(handle.clone().into_future());
    fx.clock.advance(Duration::from_secs(11));
    assert_eq!(within(60, join).await.unwrap().unwrap(), "retried-lease@2");
    (fx, client, handle, worker)
}

/// The first attempt's lease expires, the second succeeds: every join
/// gets the second attempt's output; the history has the lost attempt and
/// the success.
#[tokio::test(start_paused = true)]
async fn a_job_whose_first_lease_expires_is_joined_to_its_retry() {
    let (fx, client, handle, worker) = lost_lease_then_retried().await;
    assert_eq!(
        within(5, handle.join()).await.unwrap().unwrap(),
        "retried-lease@2"
    );
    assert_eq!(
        handle.fetch_result().await.unwrap().unwrap().unwrap(),
        "retried-lease@2"
    );
    assert_eq!(
        history(&client, handle.id()).await,
        one_step(
            Held::NAME,
            vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded]
        )
    );
    assert_eq!(fx.calls.of("retried-lease"), 2);
    // The hanging first attempt returns so that the worker can stop.
    fx.gate.open();
    worker.shutdown().await.unwrap();
}

/// The lost first attempt then returns (a second later): its settlement
/// finds its claim lost and commits nothing, but it must not touch what
/// the committed second attempt recorded: `fetch_result` and the view's
/// outcome still give the second attempt's output.
#[tokio::test(start_paused = true)]
async fn a_late_attempt_after_a_lost_lease_leaves_the_committed_result_readable() {
    let (fx, client, handle, worker) = lost_lease_then_retried().await;
    fx.clock.advance(Duration::from_secs(1));
    fx.gate.open();
    fx.until_runs("the late attempt to return", "retried-lease", 2)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        terminated_status(&client, handle.id()).await,
        Some(TerminalStatus::Succeeded)
    );
    let outcome = client.view().outcome(handle.id()).await.unwrap();
    assert!(
        outcome.is_some(),
        "the succeeded job's committed outcome is gone from the store"
    );
    assert_eq!(
        handle.fetch_result().await.unwrap().map(|r| r.unwrap()),
        Some("retried-lease@2".to_string()),
        "fetch_result of a succeeded job"
    );
    assert_eq!(
        within(5, handle.join()).await.unwrap().unwrap(),
        "retried-lease@2"
    );
    worker.shutdown().await.unwrap();
}

/// As above, the late attempt returning in the same millisecond (of the
/// queue's clock) as the committed end: a join must still report the
/// committed output, not the late attempt's, which never committed.
#[tokio::test(start_paused = true)]
async fn a_late_attempt_in_the_same_millisecond_does_not_change_the_output() {
    let (fx, client, handle, worker) = lost_lease_then_retried().await;
    fx.gate.open();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        terminated_status(&client, handle.id()).await,
        Some(TerminalStatus::Succeeded)
    );
    assert_eq!(
        within(5, handle.join()).await.unwrap().unwrap(),
        "retried-lease@2",
        "join"
    );
    assert_eq!(
        handle.fetch_result().await.unwrap().unwrap().unwrap(),
        "retried-lease@2",
        "fetch_result"
    );
    worker.shutdown().await.unwrap();
}

/// Joins pending on a client runner while the worker's runner is shut down
/// and dropped; a new worker runner over the same `Arc<Queue>` (an
/// in-process restart) ends the job and the joins report it.
#[tokio::test(start_paused = true)]
async fn joins_pending_across_a_worker_shutdown_and_restart_get_the_end() {
    let fx = Fx::new().await;
    let client = fx.client();
    let handle = submit_at(&client, echo("restart"), 20_000).await;
    let first_runner = fx.worker();
    let worker = run_worker(&first_runner);
    let joins = spawn_joins(&handle, 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    worker.shutdown().await.unwrap();
    drop(first_runner);
    fx.clock.advance(Duration::from_secs(30));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        joins.iter().all(|j| !j.is_finished()),
        "ended without a worker"
    );
    assert_eq!(fx.calls.of("restart"), 0);
    let second_runner = fx.worker();
    let worker = run_worker(&second_runner);
    let restarted = Instant::now();
    for join in joins {
        assert_eq!(within(10, join).await.unwrap().unwrap(), "restart");
    }
    assert!(restarted.elapsed() < Duration::from_secs(10));
    assert_eq!(fx.calls.of("restart"), 1);
    worker.shutdown().await.unwrap();
}

/// Another writer opens the store under a worker runner and a client
/// runner: joins pending on the client (submitted there, watched since
/// before the commit) end with the store-closed error instead of hanging.
#[tokio::test(start_paused = true)]
async fn joins_on_a_queue_taken_over_end_with_an_error() {
    let fx = Fx::new().await;
    let client = fx.client();
    let worker_runner = fx.worker();
    let worker = run_worker(&worker_runner);
    let handle = submit_at(&client, echo("fenced"), 86_400_000).await;
    let joins = spawn_joins(&handle, 2);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(joins.iter().all(|j| !j.is_finished()));

    let second = open(&fx.store, &fx.clock).await;
    let stopped = within(60, worker.wait()).await;
    assert!(stopped.expect_err("fenced").is_store_closed());
    for join in joins {
        match within(60, join).await.unwrap() {
            Err(JoinError::Infra(err)) => assert!(err.is_store_closed(), "{err}"),
            other => panic!("expected the store-closed error, got {other:?}"),
        }
    }
    // A fresh join on the old runner does not hang either.
    assert!(within(60, handle.join()).await.is_err());
    drop((client, worker_runner));
    close(second).await;
}

/// Another writer opens the store under a client-only runner (no worker,
/// no maintenance in this process over the old queue) while a join waits;
/// the new writer's worker runs the job. The old join must end (with the
/// output or an error), not wait forever.
#[tokio::test(start_paused = true)]
async fn a_client_join_on_a_queue_taken_over_does_not_hang() {
    let fx = Fx::new().await;
    let client = fx.builder(Duration::from_millis(50)).build();
    let handle = client.submit(echo("client-only")).await.unwrap();
    let join = tokio::spawn(handle.clone().into_future());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!join.is_finished());

    let second = open(&fx.store, &fx.clock).await;
    let new_runner = runner_over(&second, &fx.store, &fx.calls, &fx.gate, &fx.broken);
    let worker = run_worker(&new_runner);
    fx.until_runs("the new writer to run the job", "client-only", 1)
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(120), join).await;
    worker.shutdown().await.unwrap();
    match ended {
        Ok(joined) => match joined.unwrap() {
            Ok(output) => assert_eq!(output, "client-only"),
            Err(JoinError::Infra(_)) => {}
            Err(other) => panic!("the job did not fail: {other:?}"),
        },
        Err(_) => panic!("the join on the taken-over queue still waits after 120 s"),
    }
}

/// Keyed jobs (a 200 KiB output, a retried success, a permanent failure, a
/// cancelled one) ended over a directory store: after closing and
/// reopening the store their results are read back by `fetch_result` and
/// joins of keyed resubmissions, and their history is intact.
#[tokio::test(start_paused = true)]
async fn results_and_history_are_read_back_after_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = MockClock::new(T0);
    let calls = Calls::default();
    let gate = Gate::default();
    let broken = Broken::default();
    let big = Echo {
        label: "big".into(),
        key: Some("k-big".into()),
        pad: 200 << 10,
    };
    let mut retry = shaky("retry", 1, false, Some(3));
    retry.key = Some("k-retry".into());
    let mut perm = shaky("perm", 9, true, None);
    perm.key = Some("k-perm".into());
    let mut cancelled = held("cancelled");
    cancelled.key = Some("k-cancelled".into());
    let expected_big = format!("big{}", "x".repeat(200 << 10));

    let mut before = Vec::new();
    let (perm_message, cancel_message);
    {
        let queue = open(&store, &clock).await;
        let runner = runner_over(&queue, &store, &calls, &gate, &broken);
        let worker = run_worker(&runner);
        let big_handle = runner.submit(big.clone()).await.unwrap();
        let retry_handle = runner.submit(retry.clone()).await.unwrap();
        let perm_handle = runner.submit(perm.clone()).await.unwrap();
        let cancelled_handle = runner.submit(cancelled.clone()).await.unwrap();
        // Joined after their ends (the big output is not kept in memory).
        eventually("the ends", || async {
            terminated_status(&runner, big_handle.id()).await.is_some()
                && terminated_status(&runner, retry_handle.id())
                    .await
                    .is_some()
                && terminated_status(&runner, perm_handle.id()).await.is_some()
                && calls.of("cancelled") == 1
        })
        .await;
        assert_eq!(
            within(5, big_handle.join()).await.unwrap().unwrap(),
            expected_big
        );
        assert_eq!(
            big_handle.fetch_result().await.unwrap().unwrap().unwrap(),
            expected_big
        );
        assert_eq!(within(5, retry_handle.join()).await.unwrap().unwrap(), 2);
        let perm_error = within(5, perm_handle.join()).await.unwrap().unwrap_err();
        let operator =
            WorkflowRuntime::builder(queue.clone(), store.clone(), Idle, NoopTerminalHook)
                .queue_name(JOBS)
                .memo_prefix("jobs-memo")
                .build();
        assert!(operator.cancel(cancelled_handle.id()).await.unwrap());
        let cancel_error = within(5, cancelled_handle.join())
            .await
            .unwrap()
            .unwrap_err();
        for id in [
            big_handle.id(),
            retry_handle.id(),
            perm_handle.id(),
            cancelled_handle.id(),
        ] {
            before.push((id.clone(), history(&runner, id).await));
        }
        perm_message = perm_error.message;
        cancel_message = cancel_error.message;
        worker.shutdown().await.unwrap();
        drop((
            runner,
            operator,
            big_handle,
            retry_handle,
            perm_handle,
            cancelled_handle,
        ));
        close(queue).await;
    }

    let queue = open(&store, &clock).await;
    // No worker: everything is read from the store.
    let runner = runner_over(&queue, &store, &calls, &gate, &broken);
    let big_handle = runner.submit(big).await.unwrap();
    assert!(!big_handle.newly_submitted());
    assert_eq!(
        big_handle.fetch_result().await.unwrap().unwrap().unwrap(),
        expected_big
    );
    assert_eq!(
        within(5, big_handle.join()).await.unwrap().unwrap(),
        expected_big
    );
    let retry_handle = runner.submit(retry).await.unwrap();
    assert_eq!(
        retry_handle.fetch_result().await.unwrap().unwrap().unwrap(),
        2
    );
    assert_eq!(within(5, retry_handle.join()).await.unwrap().unwrap(), 2);
    let perm_handle = runner.submit(perm).await.unwrap();
    let perm_error = perm_handle
        .fetch_result()
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(perm_error.kind, StepErrorKind::Permanent);
    assert_eq!(perm_error.message, perm_message);
    let cancelled_handle = runner.submit(cancelled).await.unwrap();
    let cancel_error = within(5, cancelled_handle.join())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(cancel_error.message, cancel_message);
    for (id, steps) in &before {
        assert_eq!(&history(&runner, id).await, steps, "{id}");
    }
    assert_eq!(
        before[1].1,
        one_step(
            Shaky::NAME,
            vec![
                AttemptOutcome::Retried {
                    error: "boom: retry attempt 1".into()
                },
                AttemptOutcome::Succeeded
            ]
        )
    );
    assert_eq!(calls.of("big"), 1);
    assert_eq!(calls.of("retry"), 2);
    assert_eq!(calls.of("perm"), 1);
    drop((
        big_handle,
        retry_handle,
        perm_handle,
        cancelled_handle,
        runner,
    ));
    close(queue).await;
}

/// Many jobs submitted on a client runner polling hourly and joined at
/// once, through handles and clones, while a worker runner over the same
/// queue runs them: each join gets its own job's output, promptly.
#[tokio::test(start_paused = true)]
async fn many_client_handles_end_with_their_own_outputs() {
    let fx = Fx::new().await;
    let client = fx.client();
    let worker_runner = fx
        .builder(Duration::from_millis(50))
        .max_concurrent_jobs(8)
        .build();
    let mut joins = Vec::new();
    for n in 0..60 {
        let handle = client.submit(echo(&format!("many-{n}"))).await.unwrap();
        joins.push((n, tokio::spawn(handle.clone().into_future())));
        if n % 3 == 0 {
            joins.push((n, tokio::spawn(handle.into_future())));
        }
    }
    let started = Instant::now();
    let worker = run_worker(&worker_runner);
    for (n, join) in joins {
        assert_eq!(
            within(30, join).await.unwrap().unwrap(),
            format!("many-{n}")
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    for n in 0..60 {
        assert_eq!(fx.calls.of(&format!("many-{n}")), 1);
    }
    worker.shutdown().await.unwrap();
}
