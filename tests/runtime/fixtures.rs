//! Fixtures shared by several test files (each imports what it uses by
//! name): the runner scripted by the run's input ([`Scripted`]), the hook
//! counting terminations ([`Counting`]), run specs and the waits on a run's
//! end; queues whose clock follows Tokio's (paused) time, over a slow store
//! or a store whose faults can be switched on; and the group members that
//! keep a book of every execution ([`TrackedMembers`], [`Tally`]).

use crate::common::*;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::TryStreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::{
    GroupMember, MemberResult, RunGroup, RunId, RunOutcome, RunSpec, RunState, Step, StepError,
    StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, TokioClock};

/// The most polls any call of the cancel-safety tests takes to complete on
/// its own (see `drop_at_each_poll`).
pub(crate) const MAX_POLLS: usize = 400;
/// Long enough never to pass in a test (timers and signal timeouts run on
/// the queue's mock clock, which only the test advances).
pub(crate) const HOUR: Duration = Duration::from_secs(3600);

// ---------------------------------------------------------------------------
// Runs scripted by their input.

/// A runner driven by the run's input (step 0):
/// * `"ok"` succeeds with `ok`; `"perm"` fails permanently; `"trans"`
///   fails transiently on every attempt; `"verdict"` returns a `Fail`
///   verdict; `"cancel"` returns a `Cancel` verdict; `"panic"` panics on
///   every attempt;
/// * `"timer:<ms>"` continues after a delay; `"wait"` continues after an
///   hour;
/// * `"signal:<key>:<ms>"` waits for a signal on `key` for `ms`,
///   `"signal:<key>"` (a key without `:`) for an hour;
/// * `"sleep:<ms>"` sleeps that long in the runner, then succeeds with
///   `slept`;
/// * `"steps:<n>"` counts down n more steps, then succeeds with `counted`;
/// * anything else is echoed.
///
/// A later step (but for `steps:`) succeeds with the signal's payload, or
/// `timed out` when it woke without one.
#[derive(Clone, Default)]
pub(crate) struct Scripted {
    /// Every runner call's `(run_id, step_number)`.
    pub(crate) calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Scripted {
    /// The runner calls of run `run_id`.
    pub(crate) fn calls_of(&self, run_id: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == run_id)
            .count()
    }
}

impl StepRunner for Scripted {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((step.run_id.to_string(), step.step_number));
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(n) = input.strip_prefix("steps:") {
            let n: u32 = n.parse().map_err(|_| StepError::permanent("bad count"))?;
            return Ok(if n == 0 {
                StepOutcome::Succeed {
                    result: b"counted".to_vec(),
                }
            } else {
                StepOutcome::continue_now(format!("steps:{}", n - 1).into_bytes())
            });
        }
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"timed out".to_vec()),
            });
        }
        if let Some(ms) = input.strip_prefix("timer:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_after(
                b"fired".to_vec(),
                Duration::from_millis(ms),
            ));
        }
        if let Some(ms) = input.strip_prefix("sleep:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(StepOutcome::Succeed {
                result: b"slept".to_vec(),
            });
        }
        if let Some(rest) = input.strip_prefix("signal:") {
            let (key, ms) = rest.rsplit_once(':').unwrap_or((rest, "3600000"));
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_on_signal(
                b"woken".to_vec(),
                key.to_string(),
                Duration::from_millis(ms),
            ));
        }
        match input.as_str() {
            "ok" => Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            }),
            "perm" => Err(StepError::permanent("permanently broken")),
            "trans" => Err(StepError::transient("always flaky")),
            "verdict" => Ok(StepOutcome::Fail {
                reason: "refused".into(),
            }),
            "cancel" => Ok(StepOutcome::Cancel {
                reason: "the runner cancels".into(),
            }),
            "wait" => Ok(StepOutcome::continue_after(b"done".to_vec(), HOUR)),
            "panic" => panic!("the runner panics on purpose"),
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }
}

/// A terminal hook counting its calls per run.
#[derive(Clone, Default)]
pub(crate) struct Counting {
    pub(crate) calls: Arc<Mutex<Vec<(String, TerminalStatus)>>>,
}

impl Counting {
    /// The statuses of run `run_id`'s calls, in call order.
    pub(crate) fn calls_of(&self, run_id: &str) -> Vec<TerminalStatus> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == run_id)
            .map(|(_, s)| *s)
            .collect()
    }
}

impl TerminalHook for Counting {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((outcome.run_id.to_string(), outcome.status));
        Ok(())
    }
}

/// Run `id` with `input`, and otherwise default options.
pub(crate) fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// The state of run `id`, `None` when there is no such run.
pub(crate) async fn state<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> Option<RunState> {
    runtime.status(&rid(id)).await.unwrap().map(|s| s.state)
}

/// The end of run `id` within `secs` s of (paused) time; panics naming
/// `what` and the state it is stuck in otherwise.
pub(crate) async fn ends_within<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    secs: u64,
    what: &str,
) -> taquba_workflow::RunEnd {
    match runtime
        .wait_timeout(&rid(id), Duration::from_secs(secs))
        .await
        .unwrap()
    {
        Some(end) => end,
        None => panic!(
            "{what}: run {id} did not end within {secs}s ({:?})",
            state(runtime, id).await
        ),
    }
}

/// Every member result of `group`, within a minute of (paused) time.
pub(crate) async fn join_all(group: &RunGroup) -> Vec<MemberResult> {
    within(60, async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap()
}

// ---------------------------------------------------------------------------
// Queues on Tokio's clock, slow stores and failing stores.

/// An in-memory queue (and memo store) with a mock clock, each object-store
/// call taking 0.2 to 2 ms of paused time: every store access is an await
/// of its own that a drop can cut, as over a remote bucket.
pub(crate) async fn slow_store_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>, taquba::MockClock) {
    let clock = taquba::MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            latency: Some(Duration::from_micros(200)..Duration::from_millis(2)),
            ..FaultConfig::default()
        },
    ));
    let queue = Queue::open_with_options(store.clone(), "db", options(&clock))
        .await
        .expect("open queue");
    (Arc::new(queue), store, clock)
}

/// A queue over `store` whose timers and leases follow paused tokio time.
pub(crate) async fn tokio_clock_queue(
    store: Arc<dyn ObjectStore>,
    options: OpenOptions,
) -> Arc<Queue> {
    queue_over_tokio_clock(store, options, Duration::from_secs(5), Duration::ZERO).await
}

/// A queue over `store` whose clock follows Tokio's (paused) time, with a
/// 1 ms flush interval, three attempts, `lease` and retry backoff
/// `backoff`.
pub(crate) async fn queue_over_tokio_clock(
    store: Arc<dyn ObjectStore>,
    options: OpenOptions,
    lease: Duration,
    backoff: Duration,
) -> Arc<Queue> {
    let options = options
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(backoff)
                .lease_duration(lease)
                .max_attempts(3),
        );
    Arc::new(
        Queue::open_with_options(store, "db", options)
            .await
            .expect("open queue"),
    )
}

/// An in-memory queue on `clock` (the common options) whose queue `name`
/// has a lease of `lease` and no retry backoff, with its store.
pub(crate) async fn memory_queue_with_lease(
    clock: &taquba::MockClock,
    name: &str,
    lease: Duration,
) -> (Arc<Queue>, Arc<dyn ObjectStore>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = options(clock).queue_config(
        name,
        QueueConfig::default()
            .lease_duration(lease)
            .retry_backoff_base(Duration::ZERO),
    );
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("open queue");
    (Arc::new(queue), store)
}

/// A queue over `store` on a Tokio clock, with `lease` and retry backoff
/// `backoff` (see [`queue_over_tokio_clock`]).
pub(crate) async fn queue_with(
    store: Arc<dyn ObjectStore>,
    lease: Duration,
    backoff: Duration,
) -> Arc<Queue> {
    queue_over_tokio_clock(store, OpenOptions::default(), lease, backoff).await
}

/// A store with its faults off (`faulty` turns them on), and the store as
/// the runtime takes it.
pub(crate) fn switchable_store() -> (FaultyStore, Arc<dyn ObjectStore>) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    faulty.set_enabled(false);
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    (faulty, store)
}

// ---------------------------------------------------------------------------
// Group members that keep a book of every execution.

/// What the members' runner observed.
#[derive(Default)]
struct Book {
    /// Executions of step 0, by member (over all its runs).
    starts: HashMap<RunId, usize>,
    /// Members whose first step 0 already failed (`flaky` members).
    failed_once: HashSet<RunId>,
    /// Runs executing step 0 right now.
    active: HashSet<RunId>,
    /// Runs seen executing step 0 twice at the same time.
    overlaps: Vec<RunId>,
}

/// Every member runs two steps. Step 0 records its execution, sleeps the
/// runner's delay, then by its input: `flaky` fails (a `Fail` verdict) the
/// first time a member executes it and continues afterwards (in its next
/// run), `gate` waits
/// for the runner's gate (its step stays claimed), `ok-1` and `flaky-1`
/// succeed at step 0 (one-step runs; `flaky-1` after its first failure),
/// `wait:{key}` continues on the signal `key`, anything else continues at
/// once. Step 1 succeeds with `{input}@1`.
#[derive(Clone, Default)]
pub(crate) struct TrackedMembers {
    book: Arc<Mutex<Book>>,
    delay_ms: Arc<AtomicU64>,
    /// Step 0 of a `gate` member waits for this gate.
    pub(crate) gate: Gate,
}

impl TrackedMembers {
    pub(crate) fn with_delay(ms: u64) -> Self {
        let members = Self::default();
        members.delay_ms.store(ms, Ordering::SeqCst);
        members
    }

    /// Executions of step 0 by the member whose run id is `run_id`, over
    /// all its runs.
    pub(crate) fn starts(&self, run_id: &RunId) -> usize {
        self.book
            .lock()
            .unwrap()
            .starts
            .get(run_id)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn overlaps(&self) -> Vec<RunId> {
        self.book.lock().unwrap().overlaps.clone()
    }
}

impl StepRunner for TrackedMembers {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: format!("{input}@{}", step.step_number).into_bytes(),
            });
        }
        let fail_now = {
            let mut book = self.book.lock().unwrap();
            let member = step.run_id.clone();
            *book.starts.entry(member.clone()).or_default() += 1;
            if !book.active.insert(step.run_id.clone()) {
                book.overlaps.push(step.run_id.clone());
            }
            (input == "flaky" || input == "flaky-1") && book.failed_once.insert(member)
        };
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.book.lock().unwrap().active.remove(&step.run_id);
        if input == "gate" {
            self.gate.wait().await;
        }
        if fail_now {
            return Ok(StepOutcome::Fail {
                reason: format!("first run of {}", step.run_id),
            });
        }
        if input == "ok-1" || input == "flaky-1" {
            // One-step members: succeed at step 0.
            return Ok(StepOutcome::Succeed {
                result: format!("{input}@0").into_bytes(),
            });
        }
        if let Some(key) = input.strip_prefix("wait:") {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_secs(3600),
            ));
        }
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

/// A terminal hook counting each member's committed terminations (over all
/// its runs) by status.
#[derive(Clone, Default)]
pub(crate) struct Tally(Arc<Mutex<HashMap<RunId, Vec<TerminalStatus>>>>);

impl Tally {
    /// The terminations with `status` of the member whose run id is
    /// `run_id`.
    pub(crate) fn count(&self, run_id: &RunId, status: TerminalStatus) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(run_id)
            .map(|all| all.iter().filter(|s| **s == status).count())
            .unwrap_or(0)
    }
}

impl TerminalHook for Tally {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.0
            .lock()
            .unwrap()
            .entry(outcome.run_id.clone())
            .or_default()
            .push(outcome.status);
        Ok(())
    }
}

/// A runtime of [`TrackedMembers`] reporting to a [`Tally`].
pub(crate) type TrackedRuntime = WorkflowRuntime<TrackedMembers, Tally>;

/// A runtime over clones of `queue`, `store`, `runner` and `tally`, polling
/// every 10 ms with 32 runner calls at once.
pub(crate) fn tracked_runtime(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: &TrackedMembers,
    tally: &Tally,
) -> TrackedRuntime {
    WorkflowRuntime::builder(queue.clone(), store.clone(), runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(32)
        .build()
}

/// Every key of `members` is in `results` exactly once, and nothing else.
pub(crate) fn assert_each_member_once(
    results: &[MemberResult],
    members: &[GroupMember],
    what: &str,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for result in results {
        *seen.entry(result.key.as_str()).or_default() += 1;
    }
    let expected: HashSet<&str> = members.iter().map(|m| m.key.as_str()).collect();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{what}: keys yielded twice: {twice:?}");
    let extra: Vec<_> = seen.keys().filter(|k| !expected.contains(*k)).collect();
    assert!(
        extra.is_empty(),
        "{what}: keys not in the manifest: {extra:?}"
    );
    let missing: Vec<_> = expected.iter().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "{what}: keys never yielded: {missing:?}"
    );
    assert_eq!(results.len(), members.len(), "{what}");
}

/// What step 0 of a run saw: its run id and the memo entries (step memo,
/// run memo) an earlier call of the run id left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) run_id: RunId,
    pub(crate) step_memo: Option<Vec<u8>>,
    pub(crate) run_memo: Option<Vec<u8>>,
}
