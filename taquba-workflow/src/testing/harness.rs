//! The engine of the test kit, shared by [`TestRuntime`](super::TestRuntime)
//! and [`TestJobs`](super::TestJobs): an `InMemory` store, a queue on a
//! [`MockClock`], the runtime built over it and its worker loop; running
//! until the queue is idle, and crashing and reopening. Moving the clock
//! from due time to due time is [`super::skip`]'s.
//!
//! The worker loop runs only while the test asks for steps to run (inside
//! `run_until_idle`, and so `advance`): it is started there and stopped
//! once the queue is idle, so a test decides when steps run and every
//! count it reads is exact. A `run_until_idle` dropped midway (a test that
//! `select!`s it against a step's signal, to crash while the step runs)
//! leaves the loop running until the next call or the crash.
//!
//! Idle is read from the queue and the runtime, never guessed: no job of
//! the runtime's queue is pending (after the jobs due on the mock clock are
//! promoted) or claimed, no step registered in the runtime's in-flight
//! registry (a step stays registered until its settlement's commit is
//! durable), and a maintenance round (dead-letter reconciliation, inbox,
//! retention sweeps) found nothing more to do. Between two looks the kit
//! yields a millisecond of Tokio time (the queue's WAL flush interval), more
//! while nothing changes: a look never waits for a guessed duration.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{MockClock, OpenOptions, Queue, QueueConfig, QueueStats};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::error::TestError;
use super::waiting::CurrentView;
use crate::engine::RuntimeCore;
use crate::error::Result;
use crate::hooks::terminal::TerminalHook;
use crate::runner::StepRunner;
use crate::runtime::WorkflowRuntime;
use crate::store::keys::RunId;
use crate::view::WorkflowView;
use crate::worker::driver::{self, Maintenance};

/// The default bound on the clock's steps in one call
/// ([`TestRuntimeBuilder::max_hops`](super::TestRuntimeBuilder::max_hops)):
/// far more than a test's timers and retries need, few enough that a run
/// that keeps rescheduling itself is reported within seconds.
pub const DEFAULT_MAX_HOPS: u32 = 200;

/// Where a [`Harness::skip`] (in `skip`) stops.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until<'a> {
    /// At this time (ms since the UNIX epoch), after everything due up to
    /// it ran.
    Time(u64),
    /// Once this run ended.
    Ended(&'a RunId),
    /// Once no step is due at any future time.
    Quiet,
}

/// The mock clock's start: 2023-11-14T22:13:20Z, in ms since the UNIX epoch.
pub const TEST_EPOCH_MS: u64 = 1_700_000_000_000;
/// The queue's path in the store.
pub(crate) const QUEUE_PATH: &str = "test";
/// The default bound on one [`Harness::run_until_idle`].
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The WAL flush interval, and the first pause between two looks.
const TICK: Duration = Duration::from_millis(1);
/// The longest pause between two looks while nothing changes.
const MAX_TICK: Duration = Duration::from_millis(256);
/// The key the durability barrier deletes: a key nothing writes, so the
/// delete changes nothing a reader sees.
const BARRIER_KEY: &[u8] = b"workflow/testing/barrier";

/// Builds the runtime over a (re)opened queue.
pub(crate) type BuildRuntime<R, H> =
    Box<dyn Fn(Arc<Queue>, Arc<dyn ObjectStore>) -> WorkflowRuntime<R, H> + Send + Sync>;

/// How the queue is opened, and the bounds of the calls that run it.
#[derive(Debug, Clone)]
pub(crate) struct QueueSettings {
    /// Every queue's configuration (attempts, lease, backoff).
    pub(crate) config: QueueConfig,
    /// How long one `run_until_idle` may take, in Tokio time.
    pub(crate) idle_timeout: Duration,
    /// How many times one call may step the clock.
    pub(crate) max_hops: u32,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            config: QueueConfig::default(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_hops: DEFAULT_MAX_HOPS,
        }
    }
}

/// The runtime of one process lifetime of the environment.
struct Current<R, H> {
    queue: Arc<Queue>,
    runtime: WorkflowRuntime<R, H>,
    /// The worker loop, while steps are being run.
    worker: Option<Worker>,
    /// When its queue was opened, on Tokio's clock and on the machine's.
    opened: (tokio::time::Instant, std::time::Instant),
}

/// How far the store's own clock of a queue opened at `opened` has run
/// ahead of the machine's by now. SlateDB's clock is the wall time at
/// open plus Tokio's time since: under paused Tokio time (the kit's way)
/// it runs ahead of the wall clock by every sleep the test skipped, and a
/// store reopened from the wall clock would be behind the ticks the last
/// one wrote (SlateDB refuses writes past 10 s of that: "invalid clock
/// tick, must be monotonic"). Zero when Tokio's time is not paused.
fn store_clock_lead(opened: (tokio::time::Instant, std::time::Instant)) -> Duration {
    let (tokio_then, machine_then) = opened;
    tokio_then.elapsed().saturating_sub(machine_then.elapsed())
}

/// A lead past which a reopened store's clock is first moved on: SlateDB
/// takes a clock up to 10 s behind its last tick.
const TOLERATED_LEAD: Duration = Duration::from_secs(1);

/// A running worker loop.
struct Worker {
    stop: CancellationToken,
    handle: JoinHandle<Result<()>>,
}

/// The environment: the store and clock outlive crashes, the queue and
/// runtime are those of the current process lifetime.
pub(crate) struct Harness<R, H> {
    store: Arc<InMemory>,
    clock: MockClock,
    settings: QueueSettings,
    build: BuildRuntime<R, H>,
    /// `None` only while a crash reopens the queue (or after it failed to).
    current: Mutex<Option<Current<R, H>>>,
    /// Runner (or job handler) calls so far, counted by the kit's wrapper.
    calls: Arc<AtomicUsize>,
}

impl<R: StepRunner + 'static, H: TerminalHook + 'static> CurrentView for Harness<R, H> {
    fn view(&self) -> std::result::Result<WorkflowView, TestError> {
        Ok(self.runtime()?.view().clone())
    }

    fn now_ms(&self) -> u64 {
        Harness::now_ms(self)
    }
}

impl<R: StepRunner + 'static, H: TerminalHook + 'static> Harness<R, H> {
    /// Open the queue on a fresh store and build the runtime.
    ///
    /// # Errors
    /// When the queue does not open.
    pub(crate) async fn start(
        settings: QueueSettings,
        calls: Arc<AtomicUsize>,
        build: BuildRuntime<R, H>,
    ) -> std::result::Result<Self, TestError> {
        let harness = Self {
            store: Arc::new(InMemory::new()),
            clock: MockClock::new(TEST_EPOCH_MS),
            settings,
            build,
            current: Mutex::new(None),
            calls,
        };
        let current = harness.open().await?;
        *harness.lock() = Some(current);
        Ok(harness)
    }

    fn lock(&self) -> MutexGuard<'_, Option<Current<R, H>>> {
        // The guarded value is replaced whole; a panic cannot leave it torn.
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn open(&self) -> std::result::Result<Current<R, H>, TestError> {
        let options = OpenOptions::default()
            .clock(Arc::new(self.clock.clone()))
            .flush_interval(TICK)
            .default_queue_config(self.settings.config.clone());
        let store: Arc<dyn ObjectStore> = self.store.clone();
        let opened = (tokio::time::Instant::now(), std::time::Instant::now());
        let queue = Arc::new(
            Queue::open_with_options(store.clone(), QUEUE_PATH, options)
                .await
                .map_err(crate::error::Error::from)?,
        );
        let runtime = (self.build)(queue.clone(), store);
        Ok(Current {
            queue,
            runtime,
            worker: None,
            opened,
        })
    }

    /// Start the worker loop unless it runs; the runtime's engine.
    fn start_worker(&self) -> std::result::Result<Arc<RuntimeCore>, TestError> {
        let mut current = self.lock();
        let current = current.as_mut().ok_or(TestError::NotReopened)?;
        if current
            .worker
            .as_ref()
            .is_none_or(|worker| worker.handle.is_finished())
        {
            let inner = current.runtime.inner.clone();
            let stop = CancellationToken::new();
            let stopped = stop.clone().cancelled_owned();
            let handle = tokio::spawn(async move {
                driver::run_loop(inner, stopped, Maintenance::ByCaller).await
            });
            current.worker = Some(Worker { stop, handle });
        }
        Ok(current.runtime.inner.core.clone())
    }

    /// Stop the worker loop (it drains the steps in flight: none, once the
    /// queue is idle).
    async fn stop_worker(&self) -> std::result::Result<(), TestError> {
        let worker = self
            .lock()
            .as_mut()
            .and_then(|current| current.worker.take());
        if let Some(worker) = worker {
            worker.stop.cancel();
            match worker.handle.await {
                Ok(ended) => ended?,
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// The environment's settings.
    pub(crate) fn settings(&self) -> &QueueSettings {
        &self.settings
    }

    /// The clock's time, ms since the UNIX epoch.
    pub(crate) fn now_ms(&self) -> u64 {
        taquba::Clock::now_ms(&self.clock)
    }

    /// The engine of the current runtime.
    pub(crate) fn core(&self) -> std::result::Result<Arc<RuntimeCore>, TestError> {
        Ok(self.runtime()?.inner.core.clone())
    }

    /// Whether the worker loop runs (a `run_until_idle` was dropped midway).
    pub(crate) fn worker_running(&self) -> bool {
        self.lock()
            .as_ref()
            .and_then(|current| current.worker.as_ref())
            .is_some_and(|worker| !worker.handle.is_finished())
    }

    /// The store (it outlives crashes).
    pub(crate) fn store(&self) -> Arc<InMemory> {
        self.store.clone()
    }

    /// The clock of the queue and the runtime.
    pub(crate) fn clock(&self) -> &MockClock {
        &self.clock
    }

    /// The runtime of the current process lifetime.
    pub(crate) fn runtime(&self) -> std::result::Result<WorkflowRuntime<R, H>, TestError> {
        self.lock()
            .as_ref()
            .map(|current| current.runtime.clone())
            .ok_or(TestError::NotReopened)
    }

    /// The queue of the current process lifetime.
    pub(crate) fn queue(&self) -> std::result::Result<Arc<Queue>, TestError> {
        self.lock()
            .as_ref()
            .map(|current| current.queue.clone())
            .ok_or(TestError::NotReopened)
    }

    /// Runner calls so far.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Run every step that is due until the queue is idle; the runner calls
    /// made meanwhile.
    pub(crate) async fn run_until_idle(&self) -> std::result::Result<usize, TestError> {
        let before = self.calls();
        let started = tokio::time::Instant::now();
        let mut tick = TICK;
        let mut last = None;
        let mut maintained = false;
        let core = self.start_worker()?;
        loop {
            core.queue
                .promote_scheduled_now()
                .await
                .map_err(crate::error::Error::from)?;
            let look = Look::of(&core, self.calls()).await?;
            if look.busy() {
                maintained = false;
            } else if !maintained {
                // Reconciliation, the inbox and the retention sweeps, once
                // the steps are done: what they commit may make more work.
                core.maintain().await;
                maintained = true;
                continue;
            } else {
                self.stop_worker().await?;
                barrier(&core.queue).await?;
                return Ok(self.calls() - before);
            }
            if started.elapsed() >= self.settings.idle_timeout {
                return Err(TestError::NotIdle {
                    waited: started.elapsed(),
                    pending: look.stats.pending,
                    claimed: look.stats.claimed,
                });
            }
            // Back to the first pause as soon as anything moved.
            tick = if last.as_ref() == Some(&look) {
                (tick * 2).min(MAX_TICK)
            } else {
                TICK
            };
            last = Some(look);
            tokio::time::sleep(tick).await;
        }
    }

    /// Let `by` pass on the clock: everything that falls due meanwhile
    /// runs at its own time, in time order (see [`Harness::skip`]); the
    /// clock ends at now + `by`.
    pub(crate) async fn advance(&self, by: Duration) -> std::result::Result<usize, TestError> {
        let by_ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let target = self.now_ms().saturating_add(by_ms);
        self.skip(Until::Time(target)).await
    }

    /// Drop the runtime as a `kill -9` would and reopen it on the same store.
    pub(crate) async fn crash(&self) -> std::result::Result<(), TestError> {
        let old = self.lock().take();
        let mut lead = Duration::ZERO;
        if let Some(Current {
            queue,
            runtime,
            worker,
            opened,
        }) = old
        {
            // Runner calls in flight are dropped with the loop; settlements
            // already committing run on tasks of their own and finish.
            if let Some(worker) = worker {
                worker.handle.abort();
                let _ = worker.handle.await;
            }
            let core = runtime.inner.core.clone();
            let started = tokio::time::Instant::now();
            while !core.inflight.is_empty() && started.elapsed() < self.settings.idle_timeout {
                tokio::time::sleep(TICK).await;
            }
            // The crash happens once the WAL has caught up with what the
            // process did (its claims are not awaited durable), so a test
            // crashes at the point it chose: the claims of the steps in
            // flight stand, and those steps are delivered again with an
            // attempt spent.
            barrier(&queue).await?;
            lead = store_clock_lead(opened);
            drop(core);
            // Not closed: the next writer fences this one.
            drop(runtime);
            drop(queue);
        }
        let current = self.open().await?;
        if lead > TOLERATED_LEAD {
            // The old store's clock ran ahead of the machine's by `lead`,
            // which only paused Tokio time does: move the new store's clock
            // (Tokio's, from the same wall time) as far on, so its first
            // write is not behind the last one's tick.
            tokio::time::advance(lead).await;
        }
        *self.lock() = Some(current);
        Ok(())
    }
}

impl<R, H> Drop for Harness<R, H> {
    fn drop(&mut self) {
        let current = self
            .current
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(worker) = current.as_ref().and_then(|current| current.worker.as_ref()) {
            worker.handle.abort();
        }
    }
}

/// One look at the queue and the runtime.
#[derive(Debug, PartialEq)]
struct Look {
    stats: QueueStats,
    in_flight: bool,
    calls: usize,
}

impl Look {
    async fn of(core: &RuntimeCore, calls: usize) -> Result<Self> {
        Ok(Self {
            stats: core.queue.view().stats(&core.queue_name).await?,
            // A step settling, or a concurrency key's waiters being
            // admitted after a termination freed a slot.
            in_flight: !core.inflight.is_empty()
                || core.keys.busy()
                || core.commits.child_wakes().busy(),
            calls,
        })
    }

    /// Whether a step is due, running or settling.
    fn busy(&self) -> bool {
        self.stats.pending > 0 || self.stats.claimed > 0 || self.in_flight
    }
}

/// Wait until every commit made so far is durable: a durable write after
/// them (the WAL is written in order). The write is a delete of a key
/// nothing writes, so it changes nothing, and it has none of the post-commit
/// notices the runtime's `Committer` exists for.
async fn barrier(queue: &Queue) -> Result<()> {
    Ok(queue.kv_delete(BARRIER_KEY).await?)
}
