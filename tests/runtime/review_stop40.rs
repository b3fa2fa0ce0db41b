//! Typed jobs, job groups and the cluster layer attacked at the public API,
//! as a user relying on them would: a job group resumed after its jobs
//! spent their attempt limit, empty groups, bad members and bad single jobs
//! (duplicate and oversized keys, concurrency keys, payloads that do not
//! encode), a group read back as another job type, a deploy that changed a
//! job's output type, a job reading state never registered, a group cancel
//! racing every way a member ends, group calls dropped at every await,
//! result records unreadable for a whole call, and a store taken over
//! (fenced) under a keyed job in flight and under a group mid-run. On a
//! cluster: a static process fenced out of one shard by a second writer
//! (and a wait through it on that shard), a static process that dies with a
//! group in flight and is restarted under its ordinal, and corrupt or
//! foreign cluster records and bad ownership input.
//!
//! Findings, each fixed since and its test kept: `JobGroup::resume` ran the
//! members again without their job's `Job::max_attempts`;
//! `ClusterRuntime::wait_timeout` busy-spun on a hosted shard that another
//! writer fenced, starving its runtime, and missed the run's end; a fenced
//! worker ran its steps in flight to their end; a static process owning no
//! shard of the cluster started, hosting nothing.

use crate::common::*;
use crate::fixtures::{Scripted, join_all, spec, switchable_store};

use std::collections::{BTreeSet, HashMap};
use std::future::IntoFuture;
use std::marker::PhantomData;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};
use taquba::object_store::memory::InMemory;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba::{MockClock, OpenOptions, Queue, QueueConfig};
use taquba_workflow::cluster::{
    CLUSTER_FORMAT, ClusterError, ClusterRecord, ClusterRuntime, HASH_NAME, Ownership, Routed,
    SHARD_QUEUE_PATH, StaticOwnership, cluster_record_path, shard_of, shard_store,
};
use taquba_workflow::jobs::{
    GroupResult, Job, JobContext, JobError, JobGroup, JobRunner, JobRunnerBuilder, JoinError,
};
use taquba_workflow::limits::{MAX_CONCURRENCY_KEY_LEN, MAX_MEMBER_KEY_LEN};
use taquba_workflow::view::RunFilter;
use taquba_workflow::{
    Error, NoopTerminalHook, RunId, RunOptions, RunState, RunnerHandle, StepErrorKind,
    TerminalStatus, WorkflowRuntime, WorkflowView,
};
use taquba_workflow_suite::testing::{FaultConfig, TokioClock};

const SECOND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// The jobs.

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Boom(String);

/// Runner calls of each job, by label (registered as runner state).
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<String, usize>>>);

impl Calls {
    fn record(&self, label: &str) {
        *self.0.lock().unwrap().entry(label.to_string()).or_default() += 1;
    }

    fn of(&self, label: &str) -> usize {
        self.0.lock().unwrap().get(label).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

/// State no runner registers.
struct Unregistered;

/// A field that refuses to encode when set (a payload serde cannot write).
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
struct Poison(bool);

impl Serialize for Poison {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.0 {
            Err(serde::ser::Error::custom(
                "the poisoned field refuses to encode",
            ))
        } else {
            serializer.serialize_bool(false)
        }
    }
}

/// What a [`Work`] job does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Mode {
    /// Succeed at once.
    Ok,
    /// Sleep this many ms (or until cancelled), then succeed.
    Sleep(u64),
    /// Wait at the runner's gate (or until cancelled), then succeed.
    Hold,
    /// Fail permanently.
    Fail,
    /// Fail transiently on every attempt.
    Flaky,
    /// Read state no runner registers (which panics).
    NeedsState,
}

/// The job of these tests: records its call, acts by its mode, and
/// returns `{label}@{attempt}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Work {
    label: String,
    mode: Mode,
    key: Option<String>,
    max: Option<u32>,
    concurrency: Option<(String, u32)>,
    poison: Poison,
}

fn work(label: &str, mode: Mode) -> Work {
    Work {
        label: label.into(),
        mode,
        key: None,
        max: None,
        concurrency: None,
        poison: Poison(false),
    }
}

fn keyed(label: &str, mode: Mode, key: &str) -> Work {
    Work {
        key: Some(key.into()),
        ..work(label, mode)
    }
}

impl Job for Work {
    const NAME: &'static str = "review40.work";
    type Output = String;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, Boom> {
        ctx.state::<Calls>().record(&self.label);
        let cancelled = || Boom(format!("{} saw its cancel", self.label));
        match self.mode {
            Mode::Ok => {}
            Mode::Sleep(ms) => tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                () = ctx.cancel_token.cancelled() => return Err(cancelled()),
            },
            Mode::Hold => tokio::select! {
                () = ctx.state::<Gate>().wait() => {}
                () = ctx.cancel_token.cancelled() => return Err(cancelled()),
            },
            Mode::Fail => return Err(Boom(format!("{} failed", self.label))),
            Mode::Flaky => {
                return Err(Boom(format!("{} attempt {}", self.label, ctx.attempts)));
            }
            Mode::NeedsState => {
                let _ = ctx.state::<Unregistered>();
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
        self.concurrency.as_ref().map(|(key, _)| key.clone())
    }

    fn concurrency_limit(&self) -> u32 {
        self.concurrency.as_ref().map_or(1, |(_, limit)| *limit)
    }

    fn classify(&self, _error: &Boom) -> StepErrorKind {
        if self.mode == Mode::Fail {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        }
    }
}

/// Another job type, with other fields and another output.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Count {
    n: u64,
}

impl Job for Count {
    const NAME: &'static str = "review40.count";
    type Output = u64;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u64, Boom> {
        ctx.state::<Calls>().record(&format!("count {}", self.n));
        Ok(self.n)
    }
}

/// A deploy of [`Report`]: the type its output has in that deploy, and
/// how the deploy's runner labels its calls and answers.
trait Deploy: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The deploy's label of a call, recorded as `{LABEL} {name}`.
    const LABEL: &'static str;

    /// The output of the report of `name`.
    fn output(name: &str) -> Self;
}

/// The first deploy: the output is text.
impl Deploy for String {
    const LABEL: &'static str = "v1";

    fn output(name: &str) -> Self {
        format!("report of {name}")
    }
}

/// A later deploy: the output became a number.
impl Deploy for u64 {
    const LABEL: &'static str = "v2";

    fn output(_name: &str) -> Self {
        7
    }
}

/// A report job as the deploy whose output is `O` has it: the same name,
/// fields (its payload is `{name}` alone) and key in every deploy.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Report<O> {
    name: String,
    #[serde(skip)]
    deploy: PhantomData<O>,
}

/// A report job as deployed first: its output is text.
type ReportV1 = Report<String>;

/// The same job (name, fields, key) in a later deploy whose output became
/// a number.
type ReportV2 = Report<u64>;

impl<O> Report<O> {
    fn of(name: &str) -> Self {
        Self {
            name: name.into(),
            deploy: PhantomData,
        }
    }
}

impl<O: Deploy> Job for Report<O> {
    const NAME: &'static str = "review40.report";
    type Output = O;
    type Error = Boom;

    async fn run(&self, ctx: JobContext<'_>) -> Result<O, Boom> {
        ctx.state::<Calls>()
            .record(&format!("{} {}", O::LABEL, self.name));
        Ok(O::output(&self.name))
    }

    fn idempotency_key(&self) -> Option<String> {
        Some(format!("report:{}", self.name))
    }
}

// ---------------------------------------------------------------------------
// Set-up.

/// A queue and store with the test doubles a runner over them shares.
struct Fx {
    queue: Arc<Queue>,
    store: Arc<dyn ObjectStore>,
    clock: MockClock,
    calls: Calls,
    gate: Gate,
}

impl Fx {
    async fn new() -> Self {
        let (queue, store, clock) = memory_queue().await;
        Self::over(queue, store, clock)
    }

    fn over(queue: Arc<Queue>, store: Arc<dyn ObjectStore>, clock: MockClock) -> Self {
        Self {
            queue,
            store,
            clock,
            calls: Calls::default(),
            gate: Gate::default(),
        }
    }

    /// A builder over `queue` registering every job, with the doubles as
    /// state, polling every 50 ms.
    fn builder_on(&self, queue: &Arc<Queue>) -> JobRunnerBuilder {
        JobRunner::builder(queue.clone(), self.store.clone())
            .register::<Work>()
            .register::<Count>()
            .register::<ReportV1>()
            .state(self.calls.clone())
            .state(self.gate.clone())
            .poll_interval(Duration::from_millis(50))
    }

    fn runner(&self) -> JobRunner {
        self.builder_on(&self.queue).build()
    }

    /// A fixture over a fresh in-memory queue, its runner, and that
    /// runner's worker running.
    async fn running() -> (Self, JobRunner, RunnerHandle) {
        let fx = Self::new().await;
        let runner = fx.runner();
        let worker = run_worker(&runner);
        (fx, runner, worker)
    }

    /// Another process opens the store (fencing this fixture's queue): its
    /// queue.
    async fn take_over(&self) -> Arc<Queue> {
        open(&self.store, &self.clock).await
    }
}

fn run_worker(runner: &JobRunner) -> RunnerHandle {
    runner.spawn(std::future::pending::<()>())
}

/// Job group `id` of `runner`, with `jobs` submitted to it.
async fn submitted<J: Job>(
    runner: &JobRunner,
    id: &str,
    jobs: impl IntoIterator<Item = J>,
) -> JobGroup<J> {
    let group = runner.group::<J>(rid(id));
    group.submit(jobs).await.unwrap();
    group
}

/// A result as compared in these tests: the output, or the error's kind
/// and message.
type Plain = Result<String, (StepErrorKind, String)>;

fn plain(result: &Result<String, JobError>) -> Plain {
    result.clone().map_err(|e| (e.kind, e.message))
}

fn plain_all(results: &[GroupResult<Work>]) -> Vec<(String, Plain)> {
    results
        .iter()
        .map(|r| (r.key.clone(), plain(&r.result)))
        .collect()
}

/// The ids of the runs `view` lists.
async fn listed(view: &WorkflowView) -> Vec<RunId> {
    view.runs(&RunFilter::new().limit(100))
        .await
        .unwrap()
        .runs
        .into_iter()
        .map(|r| r.run_id)
        .collect()
}

/// A worker runs for a second of (paused) time: nothing refused may run.
async fn nothing_runs(fx: &Fx, runner: &JobRunner, what: &str) {
    let worker = run_worker(runner);
    tokio::time::sleep(SECOND).await;
    worker.shutdown().await.unwrap();
    assert_eq!(fx.calls.total(), 0, "{what}: a refused job ran");
    assert!(listed(runner.view()).await.is_empty(), "{what}: runs left");
}

fn hex_sha256(text: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(text.as_bytes()))
}

// ---------------------------------------------------------------------------
// Job groups.

/// Found by this review (failed before `JobGroup::resume_with` applied
/// the job's limit). jobs.md: "`Job::max_attempts` overrides the queue's attempt
/// limit for that type", and a group's "`resume` ... behave[s] as the run
/// group's (a second submission of the same set runs again only the
/// members that did not succeed)"; `RunGroup::resume`: "Submit the
/// manifest's members whose last termination is not a success, as a
/// re-submit would". A job that may run once (`max_attempts` 1: a charge)
/// fails; submitting the set again runs it once more, as promised, but
/// `resume` runs it three times (the queue's limit).
#[tokio::test(start_paused = true)]
async fn a_resumed_job_group_keeps_its_jobs_attempt_limit() {
    let (fx, runner, worker) = Fx::running().await;
    let group = runner.group::<Work>(rid("charges"));
    let jobs = || {
        (0..2).map(|i| Work {
            max: Some(1),
            ..work(&format!("charge-{i}"), Mode::Flaky)
        })
    };
    let failed_once = |results: &[GroupResult<Work>]| {
        for (i, result) in results.iter().enumerate() {
            let error = result.result.as_ref().unwrap_err();
            assert_eq!(error.kind, StepErrorKind::Transient);
            assert_eq!(error.message, format!("charge-{i} attempt 1"));
        }
    };

    group.submit(jobs()).await.unwrap();
    failed_once(&within(30, group.join()).await.unwrap());
    assert_eq!(fx.calls.of("charge-0"), 1);
    // The same set submitted again: one more attempt each.
    group.submit(jobs()).await.unwrap();
    failed_once(&within(30, group.join()).await.unwrap());
    assert_eq!(fx.calls.of("charge-0"), 2);
    // Resumed: again one attempt each, as a re-submission.
    group.resume().await.unwrap();
    failed_once(&within(30, group.join()).await.unwrap());
    assert_eq!(
        (fx.calls.of("charge-0"), fx.calls.of("charge-1")),
        (3, 3),
        "resume ran jobs whose max_attempts is 1 more than once"
    );
    worker.shutdown().await.unwrap();
}

/// A group of no jobs is a group (RunGroup: "The first submission writes
/// the manifest; a later one must name the same members"): its status
/// counts nothing, `join` and `results` end at once with nothing, a later
/// submission of another set is `GroupMismatch` naming the group, and after
/// `forget` the id takes a new set.
#[tokio::test(start_paused = true)]
async fn an_empty_job_group_is_a_group_of_no_members() {
    let (fx, runner, worker) = Fx::running().await;
    let group = runner.group::<Work>(rid("empty"));
    within(5, group.submit(Vec::new())).await.unwrap();
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.pending,
            status.succeeded,
            status.failed,
            status.cancelled
        ),
        (0, 0, 0, 0, 0)
    );
    assert!(within(5, group.join()).await.unwrap().is_empty());
    let streamed: Vec<GroupResult<Work>> =
        within(5, async { group.results().await?.try_collect().await })
            .await
            .unwrap();
    assert!(streamed.is_empty());
    within(5, group.submit(Vec::new())).await.unwrap();
    within(5, group.resume()).await.unwrap();
    match group.submit([work("late", Mode::Ok)]).await {
        Err(Error::GroupMismatch(id)) => assert_eq!(id.as_str(), "empty"),
        other => panic!("expected GroupMismatch, got {other:?}"),
    }
    assert_eq!(fx.calls.total(), 0);

    within(5, group.forget()).await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    group.submit([work("late", Mode::Ok)]).await.unwrap();
    let joined = within(30, group.join()).await.unwrap();
    assert_eq!(
        plain_all(&joined),
        [("item-0".to_string(), Ok("late@1".to_string()))]
    );
    worker.shutdown().await.unwrap();
}

/// Bad member sets are refused naming the bad value, and write nothing
/// (RunGroup::submit: `DuplicateMemberKey` "for two members with one key",
/// `MemberKeyTooLong` "for a key over MAX_MEMBER_KEY_LEN bytes";
/// JobGroup::submit_with: "`InvalidRunOptions` for a job with a
/// concurrency_key", "plus encoding errors"): the group is not found
/// afterwards, no job runs, and the id still takes a good set.
#[tokio::test(start_paused = true)]
async fn bad_job_groups_are_refused_naming_the_value_and_write_nothing() {
    let fx = Fx::new().await;
    let runner = fx.runner();
    let long_key = format!("{}-tail", "k".repeat(MAX_MEMBER_KEY_LEN));
    let cases: Vec<(&str, Vec<Work>)> = vec![
        (
            "duplicate keys",
            vec![
                keyed("a", Mode::Ok, "dup"),
                work("b", Mode::Ok),
                keyed("c", Mode::Ok, "dup"),
            ],
        ),
        (
            "a key past the limit",
            vec![work("a", Mode::Ok), keyed("b", Mode::Ok, &long_key)],
        ),
        ("a concurrency key", {
            let mut tenant = work("c", Mode::Ok);
            tenant.concurrency = Some(("tenant-9".into(), 1));
            vec![work("a", Mode::Ok), work("b", Mode::Ok), tenant]
        }),
        ("a payload that does not encode", {
            let mut poisoned = work("b", Mode::Ok);
            poisoned.poison = Poison(true);
            vec![work("a", Mode::Ok), poisoned, work("c", Mode::Ok)]
        }),
    ];
    for (i, (what, jobs)) in cases.into_iter().enumerate() {
        let group = runner.group::<Work>(rid(&format!("bad-{i}")));
        let err = within(5, group.submit(jobs)).await.expect_err(what);
        match (i, &err) {
            (0, Error::DuplicateMemberKey(key)) => assert_eq!(key, "dup"),
            (1, Error::MemberKeyTooLong { len, max, start }) => {
                assert_eq!((*len, *max), (long_key.len(), MAX_MEMBER_KEY_LEN));
                assert!(long_key.starts_with(start.as_str()) && !start.is_empty());
            }
            (2, Error::InvalidRunOptions(message)) => {
                assert!(
                    message.contains("job 2") && message.contains("tenant-9"),
                    "{message}"
                );
            }
            (3, Error::Serialization(_)) => {
                assert!(err.to_string().contains("refuses to encode"), "{err}");
            }
            _ => panic!("{what}: unexpected error {err:?}"),
        }
        assert!(
            matches!(group.status().await, Err(Error::GroupNotFound(_))),
            "{what}: the group exists after a refused submission"
        );
    }
    nothing_runs(&fx, &runner, "refused groups").await;

    // Each id still takes a good set.
    let worker = run_worker(&runner);
    for i in 0..4 {
        let group = submitted(
            &runner,
            &format!("bad-{i}"),
            [work(&format!("good-{i}"), Mode::Ok)],
        )
        .await;
        let joined = within(30, group.join()).await.unwrap();
        assert_eq!(plain(&joined[0].result), Ok(format!("good-{i}@1")));
    }
    worker.shutdown().await.unwrap();
}

/// A group read through another job type errs instead of misreporting:
/// `join` fails decoding the outputs, `resume` is `Error::Deserialization`
/// (JobGroup::resume: "`Error::Deserialization` when a stored member is not
/// a `J`"), a submission of the other type's jobs is `GroupMismatch`; no
/// member runs again and the group reads back whole as its own type.
#[tokio::test(start_paused = true)]
async fn a_job_group_read_as_another_job_type_errs_and_runs_nothing_again() {
    let (fx, runner, worker) = Fx::running().await;
    let jobs = [work("a", Mode::Ok), work("b", Mode::Fail)];
    let group = submitted(&runner, "typed", jobs).await;
    let id = group.id().clone();
    let before = plain_all(&within(30, group.join()).await.unwrap());

    let other = runner.group::<Count>(id.clone());
    assert!(matches!(
        within(10, other.join()).await,
        Err(Error::Deserialization(_))
    ));
    match within(10, other.resume()).await {
        Err(Error::Deserialization(_)) => {}
        got => panic!("resume as another type: {got:?}"),
    }
    match within(10, other.submit([Count { n: 1 }, Count { n: 2 }])).await {
        Err(Error::GroupMismatch(got)) => assert_eq!(got, id),
        got => panic!("submit as another type: {got:?}"),
    }
    tokio::time::sleep(SECOND).await;
    assert_eq!((fx.calls.of("a"), fx.calls.of("b")), (1, 1));
    assert_eq!(fx.calls.of("count 1") + fx.calls.of("count 2"), 0);
    assert_eq!(plain_all(&within(10, group.join()).await.unwrap()), before);
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded, status.failed), (2, 1, 1));
    worker.shutdown().await.unwrap();
}

/// A group cancel racing every way its members end (succeeded before it,
/// failed before it, running and ending at the very moment, running on,
/// queued behind the concurrency limit): RunGroup::cancel "returns how many
/// of those cancellations answered `true` (the requests this call recorded
/// that end their member `Cancelled`)", so the count is exactly the
/// members ended `Cancelled`; a cancelled job reports `Transient` (jobs.md);
/// the others keep their own results, and `resume` runs again only the
/// members that did not succeed.
#[tokio::test(start_paused = true)]
async fn a_job_group_cancel_racing_every_ending_counts_exactly_what_it_cancelled() {
    let fx = Fx::new().await;
    let runner = fx.builder_on(&fx.queue).max_concurrent_jobs(4).build();
    let worker = run_worker(&runner);
    for round in 0..6u64 {
        let mut jobs = vec![
            work(&format!("r{round}-done"), Mode::Ok),
            work(&format!("r{round}-failed"), Mode::Fail),
        ];
        jobs.extend((0..10).map(|i| {
            work(
                &format!("r{round}-sleep-{i}"),
                Mode::Sleep(40 + 7 * i + round * 3),
            )
        }));
        let labels: Vec<String> = jobs.iter().map(|j| j.label.clone()).collect();
        let group = submitted(&runner, &format!("race-{round}"), jobs).await;
        tokio::time::sleep(Duration::from_millis(90)).await;
        let cancelled = within(30, group.cancel()).await.unwrap();

        let joined = within(30, group.join()).await.unwrap();
        assert_eq!(joined.len(), labels.len());
        let status = group.status().await.unwrap();
        assert_eq!(status.pending, 0, "round {round}: {status:?}");
        assert_eq!(
            status.succeeded + status.failed + status.cancelled,
            status.total
        );
        assert_eq!(
            status.cancelled, cancelled,
            "round {round}: the count is not the members cancelled: {status:?}"
        );
        let mut not_succeeded = Vec::new();
        for (result, label) in joined.iter().zip(&labels) {
            match &result.result {
                Ok(output) => assert_eq!(output, &format!("{label}@1")),
                Err(error) if label.ends_with("-failed") => {
                    assert_eq!(error.kind, StepErrorKind::Permanent);
                    assert_eq!(error.message, format!("{label} failed"));
                    not_succeeded.push(label.clone());
                }
                Err(error) => {
                    assert_eq!(error.kind, StepErrorKind::Transient, "{label}: {error:?}");
                    not_succeeded.push(label.clone());
                }
            }
        }
        assert_eq!(status.failed, 1, "round {round}: {status:?}");
        assert_eq!(fx.calls.of(&format!("r{round}-done")), 1);

        // Resumed: only the members that did not succeed run again.
        let calls_before: Vec<usize> = labels.iter().map(|l| fx.calls.of(l)).collect();
        group.resume().await.unwrap();
        let rejoined = within(30, group.join()).await.unwrap();
        for ((result, label), before) in rejoined.iter().zip(&labels).zip(calls_before) {
            let again = not_succeeded.contains(label);
            assert_eq!(
                fx.calls.of(label),
                before + usize::from(again),
                "round {round}: {label}"
            );
            if label.ends_with("-failed") {
                assert!(result.result.is_err());
            } else {
                assert_eq!(plain(&result.result), Ok(format!("{label}@1")));
            }
        }
    }
    worker.shutdown().await.unwrap();
}

/// A process's store is taken over (another opened it: SlateDB fences the
/// first) while a job group runs: members ended before keep their results
/// and never run again, members in flight are delivered again to the new
/// writer (cluster.md: "taquba 0.14 re-queues every claimed job when a
/// queue is opened"), and `join` on the new writer returns every member in
/// submission order exactly as committed (`fetch_result` of a member's
/// keyed resubmission agrees); `join` on the fenced process ends instead of
/// hanging.
#[tokio::test(start_paused = true)]
async fn a_job_group_survives_a_takeover_mid_run_with_every_committed_result() {
    let (fx, runner, worker) = Fx::running().await;
    let jobs = vec![
        work("quick-0", Mode::Ok),
        keyed("held-0", Mode::Hold, "held-key"),
        work("quick-1", Mode::Ok),
        work("held-1", Mode::Hold),
        work("failed", Mode::Fail),
    ];
    let group = submitted(&runner, "takeover", jobs.clone()).await;
    eventually(
        "the quick members to end and the held ones to run",
        || async {
            let status = group.status().await.unwrap();
            status.succeeded == 2
                && status.failed == 1
                && fx.calls.of("held-0") == 1
                && fx.calls.of("held-1") == 1
        },
    )
    .await;
    let old_join = tokio::spawn({
        let group = group.clone();
        async move { group.join().await }
    });

    let queue = fx.take_over().await;
    let new_runner = fx.builder_on(&queue).build();
    let new_worker = run_worker(&new_runner);
    fx.gate.open();
    // The fenced worker stops once its steps in flight returned.
    let stopped = within(60, worker.wait()).await;
    assert!(stopped.unwrap_err().is_store_closed());
    let new_group = new_runner.group::<Work>(group.id().clone());
    let joined = within(60, new_group.join()).await.unwrap();
    let keys: Vec<&str> = joined.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["item-0", "held-key", "item-2", "item-3", "item-4"]);
    assert_eq!(plain(&joined[0].result), Ok("quick-0@1".into()));
    assert_eq!(plain(&joined[2].result), Ok("quick-1@1".into()));
    for i in [1, 3] {
        let output = joined[i].result.as_ref().unwrap();
        assert!(
            output.starts_with(&format!("{}@", jobs[i].label)),
            "{output}"
        );
    }
    assert_eq!(
        plain(&joined[4].result),
        Err((StepErrorKind::Permanent, "failed failed".into()))
    );
    assert_eq!(
        (
            fx.calls.of("quick-0"),
            fx.calls.of("quick-1"),
            fx.calls.of("failed")
        ),
        (1, 1, 1)
    );
    assert!(fx.calls.of("held-0") <= 2 && fx.calls.of("held-1") <= 2);
    // Read again, the same results.
    assert_eq!(
        plain_all(&within(10, new_group.join()).await.unwrap()),
        plain_all(&joined)
    );
    let status = new_group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded, status.failed), (5, 4, 1));

    // The fenced process's join ends: an error, or exactly the results.
    match within(120, old_join).await.unwrap() {
        Ok(results) => assert_eq!(plain_all(&results), plain_all(&joined)),
        Err(err) => assert!(err.is_store_closed(), "{err}"),
    }
    new_worker.shutdown().await.unwrap();
}

/// Group calls dropped at every await (a request handler's future cut by
/// its client's timeout) leave the group whole: reads (`join`, `results`,
/// `status`) are reads, and a dropped `resume` "submitted nothing or
/// submits every member" (RunGroup::submit's cancel safety, which
/// JobGroup::resume takes): no member that succeeded runs again, every
/// member ends, and the final `join` is exactly what was committed.
#[tokio::test(start_paused = true)]
async fn job_group_calls_dropped_at_every_await_leave_the_group_whole() {
    let (fx, runner, worker) = Fx::running().await;
    let mut jobs: Vec<Work> = (0..4)
        .map(|i| work(&format!("slow-{i}"), Mode::Sleep(30 + 20 * i)))
        .collect();
    jobs.extend((0..2).map(|i| work(&format!("bad-{i}"), Mode::Fail)));
    let group = submitted(&runner, "dropped", jobs).await;
    let cut = |n: u64| Duration::from_micros(250 * n);
    for n in 0..40 {
        let _ = tokio::time::timeout(cut(n), group.join()).await;
        let _ = tokio::time::timeout(cut(n), async {
            group.results().await?.try_collect::<Vec<_>>().await
        })
        .await;
        let _ = tokio::time::timeout(cut(n), group.status()).await;
    }
    let expected: Vec<(String, Plain)> = (0..6)
        .map(|i| {
            let result = if i < 4 {
                Ok(format!("slow-{i}@1"))
            } else {
                Err((StepErrorKind::Permanent, format!("bad-{} failed", i - 4)))
            };
            (format!("item-{i}"), result)
        })
        .collect();
    assert_eq!(
        plain_all(&within(30, group.join()).await.unwrap()),
        expected
    );

    for n in 0..20 {
        let _ = tokio::time::timeout(cut(n), group.resume()).await;
        eventually("the resumed members to end", || async {
            group.status().await.unwrap().pending == 0
        })
        .await;
    }
    assert_eq!(
        plain_all(&within(30, group.join()).await.unwrap()),
        expected
    );
    for i in 0..4 {
        assert_eq!(fx.calls.of(&format!("slow-{i}")), 1, "slow-{i} ran again");
    }
    for i in 0..2 {
        let calls = fx.calls.of(&format!("bad-{i}"));
        assert!((1..=21).contains(&calls), "bad-{i}: {calls}");
    }
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.succeeded,
            status.failed,
            status.pending
        ),
        (6, 4, 2, 0)
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Single jobs.

/// Bad jobs are refused naming the value, before anything is committed
/// (JobRunner::submit_with: "`Error::Serialization`"; RunOptions: a
/// concurrency key is "1 to MAX_CONCURRENCY_KEY_LEN bytes, no `/` and no
/// control characters; anything else is refused with
/// `Error::InvalidRunOptions`", the limit "at least 1 ... 0, it is
/// refused"): nothing runs or is listed, and a refused keyed job leaves its
/// key free for the good payload.
#[tokio::test(start_paused = true)]
async fn bad_single_jobs_are_refused_naming_the_value_and_commit_nothing() {
    let fx = Fx::new().await;
    let runner = fx.runner();
    let with_concurrency = |key: &str, limit: u32| Work {
        concurrency: Some((key.into(), limit)),
        ..work("bad", Mode::Ok)
    };
    let long = "c".repeat(MAX_CONCURRENCY_KEY_LEN + 1);
    let cases = [
        (with_concurrency("tenants/7", 1), "tenants/7"),
        (with_concurrency("", 1), "empty"),
        (with_concurrency("tenant\n", 1), "control"),
        (with_concurrency(&long, 1), "bytes"),
        (with_concurrency("tenant", 0), "concurrency_limit is 0"),
    ];
    for (job, named) in cases {
        match within(5, runner.submit(job.clone())).await {
            Err(Error::InvalidRunOptions(message)) => {
                assert!(message.contains(named), "{named}: {message}");
            }
            other => panic!("{job:?}: expected InvalidRunOptions, got {other:?}"),
        }
    }
    let mut poisoned = keyed("poisoned", Mode::Ok, "poison-key");
    poisoned.poison = Poison(true);
    match within(5, runner.submit(poisoned.clone())).await {
        Err(err @ Error::Serialization(_)) => {
            assert!(err.to_string().contains("refuses to encode"), "{err}");
        }
        other => panic!("expected Serialization, got {other:?}"),
    }
    nothing_runs(&fx, &runner, "refused jobs").await;

    // The key of the refused job is free.
    let worker = run_worker(&runner);
    poisoned.poison = Poison(false);
    let handle = runner.submit(poisoned).await.unwrap();
    assert!(handle.newly_submitted());
    assert_eq!(handle.id().as_str(), hex_sha256("poison-key"));
    assert_eq!(
        within(10, handle.join()).await.unwrap(),
        Ok("poisoned@1".into())
    );
    worker.shutdown().await.unwrap();
}

/// A job reading state nobody registered fails naming the type
/// (JobContext::state "panics with the type name when absent"; README: "A
/// panicking step is treated as a transient error naming the panic"): the
/// job ends after its attempts with a `Transient` error that names
/// `Unregistered`, and the worker goes on running other jobs.
#[tokio::test(start_paused = true)]
async fn a_job_reading_unregistered_state_fails_naming_the_type_and_others_run() {
    let (fx, runner, worker) = Fx::running().await;
    let stateless = runner
        .submit(Work {
            max: Some(2),
            ..work("stateless", Mode::NeedsState)
        })
        .await
        .unwrap();
    let bystander = runner.submit(work("bystander", Mode::Ok)).await.unwrap();
    let error = within(30, stateless.join()).await.unwrap().unwrap_err();
    assert_eq!(error.kind, StepErrorKind::Transient, "{error:?}");
    assert!(
        error.message.contains("Unregistered") && error.message.contains("JobRunnerBuilder::state"),
        "{}",
        error.message
    );
    assert_eq!(fx.calls.of("stateless"), 2);
    assert_eq!(
        stateless
            .fetch_result()
            .await
            .unwrap()
            .unwrap()
            .unwrap_err(),
        error
    );
    assert_eq!(
        within(10, bystander.into_future()).await.unwrap(),
        "bystander@1"
    );
    let after = runner.submit(work("after", Mode::Ok)).await.unwrap();
    assert_eq!(within(10, after.into_future()).await.unwrap(), "after@1");
    worker.shutdown().await.unwrap();
}

/// The store is taken over while a keyed job runs: on the new writer the
/// key still names that job (jobs.md: "a different payload under the same
/// key fails with `Error::InputMismatch`. This holds across restarts"), the
/// same payload answers with it (`newly_submitted() == false`), its join
/// gets the output the new writer committed, which `fetch_result` and a
/// later resubmission read back; the old process's join ends.
#[tokio::test(start_paused = true)]
async fn a_keyed_job_in_flight_across_a_takeover_is_one_job_on_the_new_writer() {
    let (fx, runner, worker) = Fx::running().await;
    let job = keyed("invoice-7", Mode::Hold, "invoice:7");
    let handle = runner.submit(job.clone()).await.unwrap();
    eventually("the job to start", || async {
        fx.calls.of("invoice-7") == 1
    })
    .await;
    let old_join = tokio::spawn(handle.clone().into_future());

    let queue = fx.take_over().await;
    let new_runner = fx.builder_on(&queue).build();
    match new_runner
        .submit(keyed("invoice-7b", Mode::Hold, "invoice:7"))
        .await
    {
        Err(Error::InputMismatch(id)) => assert_eq!(&id, handle.id()),
        other => panic!("expected InputMismatch, got {other:?}"),
    }
    let again = new_runner.submit(job.clone()).await.unwrap();
    assert!(!again.newly_submitted());
    assert_eq!(again.id(), handle.id());
    let new_worker = run_worker(&new_runner);
    fx.gate.open();
    let stopped = within(60, worker.wait()).await;
    assert!(stopped.unwrap_err().is_store_closed());
    let output = within(60, again.join()).await.unwrap().unwrap();
    assert!(output.starts_with("invoice-7@"), "{output}");
    assert_eq!(
        again.fetch_result().await.unwrap(),
        Some(Ok(output.clone()))
    );
    let later = new_runner.submit(job).await.unwrap();
    assert!(!later.newly_submitted());
    assert_eq!(within(10, later.join()).await.unwrap(), Ok(output.clone()));
    assert!(fx.calls.of("invoice-7") <= 2);
    assert_eq!(fx.calls.of("invoice-7b"), 0);
    match within(120, old_join).await.unwrap() {
        Ok(got) => assert_eq!(got, output),
        Err(JoinError::Infra(err)) => assert!(err.is_store_closed(), "{err}"),
        Err(other) => panic!("the job did not fail: {other:?}"),
    }
    new_worker.shutdown().await.unwrap();
}

/// A deploy changed a job's output type under the same name and key: a
/// resubmission answers with the job recorded by the old deploy, and its
/// join, `fetch_result` and the group's `join` report
/// `Error::Deserialization` (JobHandle::fetch_result: "`Error::Deserialization`
/// when the output does not decode as `J::Output`"), never a wrong value or
/// a panic, and nothing runs again.
#[tokio::test(start_paused = true)]
async fn a_deploy_that_changed_the_output_type_gets_decoding_errors_not_wrong_values() {
    let (fx, runner, worker) = Fx::running().await;
    let first = runner.submit(ReportV1::of("march")).await.unwrap();
    assert_eq!(
        within(10, first.join()).await.unwrap(),
        Ok("report of march".into())
    );
    let group = submitted(&runner, "reports", ["april", "may"].map(ReportV1::of)).await;
    assert_eq!(within(10, group.join()).await.unwrap().len(), 2);
    worker.shutdown().await.unwrap();

    // The next deploy: another process, the job's output now a number.
    let queue = fx.take_over().await;
    let deployed = JobRunner::builder(queue, fx.store.clone())
        .register::<ReportV2>()
        .state(fx.calls.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = run_worker(&deployed);
    let handle = deployed.submit(ReportV2::of("march")).await.unwrap();
    assert!(!handle.newly_submitted());
    assert_eq!(handle.id(), first.id());
    // The error names the job and the type its output is not.
    match handle.fetch_result().await {
        Err(err @ Error::Deserialization(_)) => {
            let message = err.to_string();
            assert!(
                message.contains(handle.id().as_str()) && message.contains("u64"),
                "{message}"
            );
        }
        other => panic!("expected a decoding error, got {other:?}"),
    }
    assert!(matches!(
        within(10, handle.join()).await,
        Err(Error::Deserialization(_))
    ));
    match within(10, handle.clone().into_future()).await {
        Err(JoinError::Infra(Error::Deserialization(_))) => {}
        other => panic!("expected a decoding error, got {other:?}"),
    }
    let group = deployed.group::<ReportV2>(rid("reports"));
    assert!(matches!(
        within(10, group.join()).await,
        Err(Error::Deserialization(_))
    ));
    assert_eq!(group.status().await.unwrap().succeeded, 2);
    tokio::time::sleep(SECOND).await;
    for name in ["march", "april", "may"] {
        assert_eq!(fx.calls.of(&format!("v1 {name}")), 1);
        assert_eq!(fx.calls.of(&format!("v2 {name}")), 0);
    }
    worker.shutdown().await.unwrap();
}

/// Result records that cannot be read for a whole call (every get and
/// list under the memo prefix fails): `fetch_result` errs (never
/// `Ok(None)`, which means "running or removed by retention", nor another
/// value), a join and a group `join` end with the output or an error (never
/// `RunNotFound`, a wrong value or a hang), and once the store answers every
/// read gives exactly what was committed.
#[tokio::test(start_paused = true)]
async fn result_reads_while_result_records_are_unreadable_err_and_never_misreport() {
    let clock = MockClock::new(T0);
    let (faulty, store) = switchable_store();
    let queue = open(&store, &clock).await;
    let fx = Fx::over(queue.clone(), store, clock);
    let runner = fx.runner();
    let worker = run_worker(&runner);
    let job = keyed("kept", Mode::Ok, "kept-key");
    let handle = runner.submit(job.clone()).await.unwrap();
    assert_eq!(
        within(10, handle.join()).await.unwrap(),
        Ok("kept@1".into())
    );
    let jobs = [work("g0", Mode::Ok), work("g1", Mode::Fail)];
    let group = submitted(&runner, "unreadable", jobs).await;
    let expected = plain_all(&within(10, group.join()).await.unwrap());

    // A second runtime over the queue (no outcome of its own in memory).
    let client = fx.runner();
    let outage = FaultConfig {
        rates: [0.0, 1.0, 1.0, 0.0],
        only_under: vec!["jobs-memo/".into()],
        ..FaultConfig::default()
    };
    faulty.set_config(outage);
    faulty.set_enabled(true);
    match within(10, handle.fetch_result()).await {
        Err(err) => assert!(!matches!(err, Error::RunNotFound(_)), "{err}"),
        Ok(got) => panic!("fetch_result under failing reads answered {got:?}"),
    }
    let resubmitted = client.submit(job.clone()).await.unwrap();
    assert!(!resubmitted.newly_submitted());
    match within(10, resubmitted.fetch_result()).await {
        Err(_) => {}
        Ok(got) => panic!("fetch_result under failing reads answered {got:?}"),
    }
    match within(30, resubmitted.join()).await {
        Ok(got) => assert_eq!(got, Ok("kept@1".into())),
        Err(err) => assert!(!matches!(err, Error::RunNotFound(_)), "{err}"),
    }
    match within(30, client.group::<Work>(rid("unreadable")).join()).await {
        Ok(got) => assert_eq!(plain_all(&got), expected),
        Err(err) => assert!(!matches!(err, Error::RunNotFound(_)), "{err}"),
    }
    assert!(faulty.injected_total() > 0);

    faulty.set_enabled(false);
    assert_eq!(
        resubmitted.fetch_result().await.unwrap(),
        Some(Ok("kept@1".into()))
    );
    assert_eq!(
        within(10, resubmitted.join()).await.unwrap(),
        Ok("kept@1".into())
    );
    assert_eq!(
        plain_all(
            &within(10, client.group::<Work>(rid("unreadable")).join())
                .await
                .unwrap()
        ),
        expected
    );
    assert_eq!(fx.calls.of("kept"), 1);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// The cluster.

type Node = ClusterRuntime<Scripted, NoopTerminalHook>;

const SHARDS: u32 = 8;
const ROOT: &str = "prod/wf";

/// A shard's queue options: Tokio's (paused) clock, 1 ms flushes.
fn shard_options() -> OpenOptions {
    OpenOptions::default()
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .lease_duration(Duration::from_secs(5))
                .max_attempts(3),
        )
}

fn owning(ordinal: u32, replicas: u32) -> Ownership {
    Ownership::Static(StaticOwnership::ordinal(ordinal, replicas).unwrap())
}

async fn node(
    store: Arc<dyn ObjectStore>,
    name: &str,
    ownership: Ownership,
    runner: &Scripted,
) -> Node {
    within(
        60,
        ClusterRuntime::builder(store, ROOT, runner.clone(), NoopTerminalHook)
            .shards(SHARDS)
            .node_id(name)
            .ownership(ownership)
            .open_options(|_| shard_options())
            .configure(|builder| builder.poll_interval(Duration::from_millis(20)))
            .reader_poll_interval(Duration::from_millis(20))
            .start(),
    )
    .await
    .expect("start the cluster process")
}

/// The first `{prefix}-{i}` routing to `shard`.
fn id_on(shard: u32, prefix: &str) -> RunId {
    let shards = NonZeroU32::new(SHARDS).unwrap();
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|id| shard_of(id, shards) == shard)
        .map(|id| rid(&id))
        .unwrap()
}

/// The end of `run_id` read through `node`, within `secs`.
async fn end_of(node: &Node, run_id: &RunId, secs: u64) -> taquba_workflow::RunEnd {
    within(
        secs + 30,
        node.wait_timeout(run_id, Duration::from_secs(secs)),
    )
    .await
    .unwrap()
    .unwrap_or_else(|| panic!("run {run_id} did not end"))
}

fn result_of(end: &taquba_workflow::RunEnd) -> Option<Vec<u8>> {
    end.outcome.as_ref().and_then(|o| o.result.clone())
}

/// Until `run_id` waits for a signal (read through `view`).
async fn until_waiting(view: &WorkflowView, run_id: &RunId) {
    eventually("the run to wait for its signal", || async {
        view.run(run_id)
            .await
            .unwrap()
            .is_some_and(|d| d.waiting_for_signal.is_some())
    })
    .await;
}

/// Attempt numbers never repeat in a step's history: no attempt settled
/// twice.
async fn settled_once(view: &WorkflowView, run_id: &RunId) {
    let history = view.steps(run_id).await.unwrap().expect("a history");
    for step in &history.steps {
        let attempts: Vec<u32> = step.attempts.iter().map(|a| a.attempt).collect();
        let distinct: BTreeSet<u32> = attempts.iter().copied().collect();
        assert_eq!(attempts.len(), distinct.len(), "{run_id}: {attempts:?}");
    }
}

/// A second writer of shard 3 (a force-deleted pod's replacement): a plain
/// runtime over the shard's own store, which fences the process hosting
/// it; with its running worker, once it has woken `parked` (waiting on
/// `k-parked`) with `woken` and the run has ended.
async fn second_writer_ending(
    bucket: &Arc<dyn ObjectStore>,
    runner: &Scripted,
    parked: &RunId,
) -> (WorkflowRuntime<Scripted, NoopTerminalHook>, RunnerHandle) {
    let store = shard_store(bucket.clone(), ROOT, 3).unwrap();
    let queue = Queue::open_with_options(store.clone(), SHARD_QUEUE_PATH, shard_options())
        .await
        .unwrap();
    let writer = WorkflowRuntime::builder(Arc::new(queue), store, runner.clone(), NoopTerminalHook)
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = writer.spawn(std::future::pending::<()>());
    writer
        .signal_run(parked, "k-parked", b"woken".to_vec())
        .await
        .unwrap();
    within(30, writer.wait(parked)).await.unwrap();
    (writer, worker)
}

/// A static process (a StatefulSet pod) that finds another writer on one
/// of its shards (a force-deleted pod's replacement) drops that shard and
/// goes on with the others (cluster.md: "SlateDB's fencing stops the older
/// one at its next write, and it drops the shard without reopening it";
/// "a process fenced out of a shard commits nothing more there ... and its
/// other shards go on"): the new writer redelivers and ends the runs in
/// flight exactly once, a submission through the old process is sent to
/// the new writer's inbox (it cannot commit there), the old process drops
/// the shard at its next round and then reads the runs' ends. (A wait
/// through it before that drop is the next test's.)
#[tokio::test(start_paused = true)]
async fn a_static_process_fenced_out_of_one_shard_drops_it_and_goes_on_with_the_others() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let runner = Scripted::default();
    let a = node(bucket.clone(), "pod-0", owning(0, 1), &runner).await;
    assert_eq!(a.hosted_shards(), (0..SHARDS).collect::<Vec<_>>());
    let done = id_on(3, "done");
    let parked = id_on(3, "parked");
    let elsewhere = id_on(5, "elsewhere");
    for (id, input) in [
        (&done, "ok"),
        (&parked, "signal:k-parked"),
        (&elsewhere, "signal:k-else"),
    ] {
        let routed = a.submit(spec(id.as_str(), input)).await.unwrap();
        assert!(matches!(routed, Routed::Applied(_)));
    }
    assert_eq!(
        end_of(&a, &done, 10).await.termination.status,
        TerminalStatus::Succeeded
    );
    for id in [&parked, &elsewhere] {
        until_waiting(&a.view(a.shard_of(id)).await.unwrap().unwrap(), id).await;
    }

    // A second writer of shard 3 (a replacement pod), which ends the
    // parked run.
    let (writer3, worker3) = second_writer_ending(&bucket, &runner, &parked).await;

    // A call through the old process reaches the new writer; the old
    // process drops the shard.
    let late = id_on(3, "late");
    let routed = a.submit(spec(late.as_str(), "ok")).await.unwrap();
    assert!(matches!(routed, Routed::Sent(_)), "{routed:?}");
    // Found fenced, and maybe not dropped yet: its reads go to the store
    // the new writer writes, not to the closed local runtime.
    let status = a.status(&parked).await.unwrap().map(|status| status.state);
    assert!(
        matches!(status, Some(RunState::Terminated(_))),
        "the status through the fenced process: {status:?}"
    );
    let outcome = a.outcome(&parked).await.unwrap();
    assert_eq!(
        outcome.and_then(|outcome| outcome.result),
        Some(b"woken".to_vec())
    );
    eventually("the old process to drop shard 3", || async {
        !a.hosted_shards().contains(&3)
    })
    .await;
    let mut others: Vec<u32> = (0..SHARDS).collect();
    others.retain(|&s| s != 3);
    assert_eq!(a.hosted_shards(), others);
    for (id, result) in [(&parked, b"woken".to_vec()), (&late, b"ok".to_vec())] {
        let end = end_of(&a, id, 30).await;
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        assert_eq!(result_of(&end), Some(result));
    }

    // Its other shards go on.
    let routed = a
        .signal_run(&elsewhere, "k-else", b"still here".to_vec())
        .await
        .unwrap();
    assert!(matches!(routed, Routed::Applied(())));
    let end = end_of(&a, &elsewhere, 10).await;
    assert_eq!(result_of(&end), Some(b"still here".to_vec()));

    assert_eq!(runner.calls_of(done.as_str()), 1);
    assert_eq!(runner.calls_of(late.as_str()), 1);
    for id in [&done, &parked, &late] {
        settled_once(writer3.view(), id).await;
    }
    worker3.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A wait through a static process on a run of a shard another writer
/// just opened ends with the run's end, not a spin:
/// `ClusterRuntime::wait_timeout` is "[`wait`], giving up after `timeout`",
/// and a fenced process "drops the shard ... and its other shards go on"
/// (cluster.md). Found by this review: the wait's loop asked the fenced
/// local shard again without any pause while its local wait failed with
/// the store-closed error, so the ownership round that would drop the
/// shard never ran (every other task starved) and the wait answered
/// `Ok(None)` for a run that ended (under paused time it never returned).
#[tokio::test(start_paused = true)]
async fn a_wait_through_a_process_fenced_out_of_the_runs_shard_ends_instead_of_spinning() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let runner = Scripted::default();
    let a = node(bucket.clone(), "pod-0", owning(0, 1), &runner).await;
    let parked = id_on(3, "parked");
    let routed = a
        .submit(spec(parked.as_str(), "signal:k-parked"))
        .await
        .unwrap();
    assert!(matches!(routed, Routed::Applied(_)));
    until_waiting(&a.view(3).await.unwrap().unwrap(), &parked).await;
    let (_writer3, worker3) = second_writer_ending(&bucket, &runner, &parked).await;

    // The static round drops a fenced shard within its 1 s interval; the
    // wait then reads the shard's end through a reader (20 ms polls).
    let started = std::time::Instant::now();
    let waited = a
        .wait_timeout(&parked, Duration::from_millis(2500))
        .await
        .unwrap();
    let hosted = a.hosted_shards();
    let end = waited.unwrap_or_else(|| {
        panic!(
            "wait_timeout gave up after {:?} on a run that ended, shard 3 still hosted: {hosted:?}",
            started.elapsed()
        )
    });
    assert_eq!(result_of(&end), Some(b"woken".to_vec()));
    worker3.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A static process dies (its store answers nothing more) with a group in
/// flight, and Kubernetes restarts it under the same ordinal (cluster.md:
/// "Kubernetes restarts a dead pod under the same identity"; "a group and
/// all its members live in the group id's shard"): the restarted process
/// finds the group, every member's run in the group's shard, redelivers
/// the steps in flight, and the group's results are every member once, as
/// committed; members that ended before the crash do not run again.
#[tokio::test(start_paused = true)]
async fn a_static_process_restarted_after_dying_mid_group_completes_the_group() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let cut =
        taquba_workflow_suite::testing::FaultyStore::new(bucket.clone(), FaultConfig::default());
    cut.set_enabled(false);
    let runner = Scripted::default();
    let a = node(Arc::new(cut.clone()), "pod-0", owning(0, 1), &runner).await;
    let group_id = "batch-1";
    let shard = a.record().shard_of_group(group_id);
    let group = a.group(rid(group_id)).unwrap();
    let members = [
        ("ok-0", "ok"),
        ("ok-1", "ok"),
        ("slow-0", "sleep:400"),
        ("slow-1", "sleep:400"),
        ("waits", "signal:batch-1-go"),
    ];
    group
        .submit(
            members.iter().map(|(k, input)| member(k, input)).collect(),
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let view = a.view(shard).await.unwrap().unwrap();
    let waits = member_run_id(group_id, "waits");
    until_waiting(&view, &waits).await;
    eventually("the quick members to end, the slow ones to run", || async {
        group.status().await.unwrap().succeeded == 2
            && ["slow-0", "slow-1"]
                .iter()
                .all(|k| runner.calls_of(member_run_id(group_id, k).as_str()) == 1)
    })
    .await;

    // The process dies: nothing it does reaches the store any more.
    cut.set_config(FaultConfig::uniform(1, 1.0));
    cut.set_enabled(true);
    drop((group, view));

    let a2 = node(bucket.clone(), "pod-0-again", owning(0, 1), &runner).await;
    let group = a2.group(rid(group_id)).unwrap();
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded), (5, 2), "{status:?}");
    let routed = a2
        .signal_run(&waits, "batch-1-go", b"go".to_vec())
        .await
        .unwrap();
    assert!(matches!(routed, Routed::Applied(())));
    let results = join_all(&group).await;
    let mut got: Vec<(String, TerminalStatus, Option<Vec<u8>>)> = results
        .iter()
        .map(|r| {
            (
                r.key.clone(),
                r.termination.status,
                r.outcome.as_ref().and_then(|o| o.result.clone()),
            )
        })
        .collect();
    got.sort_by(|a, b| a.0.cmp(&b.0));
    let ok = TerminalStatus::Succeeded;
    assert_eq!(
        got,
        [
            ("ok-0".to_string(), ok, Some(b"ok".to_vec())),
            ("ok-1".to_string(), ok, Some(b"ok".to_vec())),
            ("slow-0".to_string(), ok, Some(b"slept".to_vec())),
            ("slow-1".to_string(), ok, Some(b"slept".to_vec())),
            ("waits".to_string(), ok, Some(b"go".to_vec())),
        ]
    );
    let view = a2.view(shard).await.unwrap().unwrap();
    for (key, _) in members {
        let run_id = member_run_id(group_id, key);
        assert!(
            matches!(
                view.status(&run_id).await.unwrap().map(|s| s.state),
                Some(RunState::Terminated(_))
            ),
            "{key} is not in the group's shard"
        );
        settled_once(&view, &run_id).await;
    }
    for key in ["ok-0", "ok-1"] {
        assert_eq!(runner.calls_of(member_run_id(group_id, key).as_str()), 1);
    }
    for key in ["slow-0", "slow-1"] {
        assert!(runner.calls_of(member_run_id(group_id, key).as_str()) <= 2);
    }
    a2.shutdown().await.unwrap();
}

/// Bad layout and ownership input is refused naming the bad value: a
/// cluster record that does not decode is `Corrupt` naming its path, one of
/// a later format or another hash is `Unsupported` naming them, a shard
/// count of 0 in it is `Corrupt` (ClusterRecord::open: "`Unsupported` and
/// `Corrupt` for a record this build cannot use"); ordinals past the
/// replica count and host names without an ordinal are `InvalidOwnership`
/// naming them (StaticOwnership); a shard past the count is `NoSuchShard`
/// and a group on another process's shard is `NotHosted` naming both.
#[tokio::test(start_paused = true)]
async fn bad_cluster_records_and_ownership_are_refused_naming_the_value() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let runner = Scripted::default();
    let record = |format: u32, shards: u32, hash: &str| {
        rmp_serde::to_vec_named(&ClusterRecord {
            format,
            shards,
            hash: hash.to_string(),
            created_at_ms: 0,
        })
        .unwrap()
    };
    let roots: [(&str, Vec<u8>); 4] = [
        ("bad/garbage", b"{\"not\": \"msgpack\"".to_vec()),
        ("bad/later", record(CLUSTER_FORMAT + 1, 8, HASH_NAME)),
        ("bad/hash", record(CLUSTER_FORMAT, 8, "md5-mod")),
        ("bad/zero", record(CLUSTER_FORMAT, 0, HASH_NAME)),
    ];
    for (root, bytes) in roots {
        let path = cluster_record_path(root);
        store.put(&path, PutPayload::from(bytes)).await.unwrap();
        for shards in [None, Some(8)] {
            let mut builder =
                ClusterRuntime::builder(store.clone(), root, runner.clone(), NoopTerminalHook)
                    .node_id("n")
                    .ownership(Ownership::Client);
            if let Some(shards) = shards {
                builder = builder.shards(shards);
            }
            let err = within(10, builder.start()).await.expect_err(root);
            let shown = err.to_string();
            assert!(shown.contains(path.as_ref()), "{root}: {shown}");
            match (root, &err) {
                ("bad/garbage", ClusterError::Corrupt { .. }) => {}
                ("bad/later", ClusterError::Unsupported { format, .. }) => {
                    assert_eq!(*format, CLUSTER_FORMAT + 1);
                }
                ("bad/hash", ClusterError::Unsupported { hash, .. }) => {
                    assert_eq!(hash, "md5-mod");
                }
                ("bad/zero", ClusterError::Corrupt { reason, .. }) => {
                    assert!(reason.contains('0'), "{reason}");
                }
                _ => panic!("{root} ({shards:?}): {err:?}"),
            }
        }
    }

    for (ordinal, replicas) in [(3, 3), (0, 0), (9, 4)] {
        let err = StaticOwnership::ordinal(ordinal, replicas).unwrap_err();
        assert!(
            matches!(&err, ClusterError::InvalidOwnership(m) if m.contains(&format!("ordinal {ordinal} of {replicas}"))),
            "{err:?}"
        );
    }
    for host in ["workflows", "workflows-", "workflows-abc", "workflows-1.5"] {
        let err = StaticOwnership::from_hostname(host, 4).unwrap_err();
        assert!(
            matches!(&err, ClusterError::InvalidOwnership(m) if m.contains(&format!("{host:?}"))),
            "{host}: {err:?}"
        );
    }
    let err = StaticOwnership::from_hostname("workflows-7", 4).unwrap_err();
    assert!(err.to_string().contains("ordinal 7 of 4"), "{err}");
    assert_eq!(
        StaticOwnership::from_hostname("my-workflows-2", 4).unwrap(),
        StaticOwnership::Ordinal {
            ordinal: 2,
            replicas: 4
        }
    );

    let even = node(store.clone(), "even", owning(0, 2), &runner).await;
    match even.view(SHARDS).await {
        Err(ClusterError::NoSuchShard { shard, shards }) => {
            assert_eq!((shard, shards), (SHARDS, SHARDS))
        }
        other => panic!("view past the count: {other:?}"),
    }
    let odd_group = id_on(1, "group");
    match even.group(odd_group.clone()) {
        Err(err @ ClusterError::NotHosted { shard: 1, .. }) => {
            assert!(err.to_string().contains(odd_group.as_str()), "{err}");
        }
        other => panic!("a group on another's shard: {other:?}"),
    }
    let even_group = id_on(2, "group");
    let group = even.group(even_group.clone()).unwrap();
    assert_eq!(group.id(), &even_group);
    even.shutdown().await.unwrap();
}

/// A static process whose ownership names a shard the cluster does not
/// have, or owns none of its shards (a StatefulSet of more replicas than
/// shards: docs/cluster.md, "replicas: at most the cluster's shard count"),
/// is refused at start naming the value, rather than silently hosting
/// nothing. Found by this review (it started, hosting nothing).
#[tokio::test(start_paused = true)]
async fn a_static_process_owning_no_shard_of_the_cluster_is_refused_at_start() {
    let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let runner = Scripted::default();
    let start = |ownership: StaticOwnership| {
        ClusterRuntime::builder(bucket.clone(), ROOT, runner.clone(), NoopTerminalHook)
            .shards(SHARDS)
            .node_id("n")
            .ownership(Ownership::Static(ownership))
            .open_options(|_| shard_options())
            .start()
    };
    match within(60, start(StaticOwnership::Shards([1, 99].into()))).await {
        Err(ClusterError::NoSuchShard { shard, shards }) => {
            assert_eq!((shard, shards), (99, SHARDS))
        }
        other => panic!("a shard past the count: {:?}", other.map(|_| ())),
    }
    let replicas = SHARDS + 2;
    let idle = StaticOwnership::ordinal(SHARDS + 1, replicas).unwrap();
    match within(60, start(idle)).await {
        Err(ClusterError::InvalidOwnership(message)) => {
            assert!(
                message.contains(&format!("ordinal {} of {replicas}", SHARDS + 1)),
                "{message}"
            )
        }
        other => panic!("an ordinal owning no shard: {:?}", other.map(|_| ())),
    }
    let owning_one = within(60, start(StaticOwnership::Shards([1].into())))
        .await
        .expect("a process owning shard 1 starts");
    assert_eq!(owning_one.hosted_shards(), vec![1]);
    owning_one.shutdown().await.unwrap();
}

/// A worker whose store another process opened stops with the store-closed
/// error without waiting for the steps it was running (docs/storage.md:
/// "fenced, its worker stops with an error"): none of them can commit its
/// settlement any more, and the new writer delivers each again. Found by
/// this review: the fenced worker ran a held step until it returned, so it
/// kept the process busy alongside the new writer's redelivery.
#[tokio::test(start_paused = true)]
async fn a_fenced_worker_stops_without_waiting_for_its_running_steps() {
    let (fx, runner, worker) = Fx::running().await;
    let job = keyed("held", Mode::Hold, "held-key");
    runner.submit(job.clone()).await.unwrap();
    eventually("the job to start", || async { fx.calls.of("held") == 1 }).await;

    let queue = fx.take_over().await;
    // The gate stays shut: the held step never returns on its own.
    let stopped = within(60, worker.wait()).await;
    assert!(
        stopped.as_ref().is_err_and(|err| err.is_store_closed()),
        "{stopped:?}"
    );
    // The new writer runs the job again, once, to its end.
    let new_runner = fx.builder_on(&queue).build();
    let new_worker = run_worker(&new_runner);
    fx.gate.open();
    let again = new_runner.submit(job).await.unwrap();
    assert!(!again.newly_submitted());
    let output = within(60, again.join()).await.unwrap().unwrap();
    assert!(output.starts_with("held@"), "{output}");
    assert_eq!(fx.calls.of("held"), 2);
    new_worker.shutdown().await.unwrap();
}
