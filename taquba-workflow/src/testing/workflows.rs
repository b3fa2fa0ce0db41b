//! [`TestRuntime`]: a [`WorkflowRuntime`] of a `#[workflow]` (or any
//! [`StepRunner`]) in the test environment, with typed starts and signals,
//! and [`TestRun`], the handle of one run.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use taquba::object_store::memory::InMemory;
use taquba::{MockClock, Queue, QueueConfig};

use super::error::TestError;
use super::harness::Until;
use super::harness::{Harness, QueueSettings};
use super::waiting::CurrentView;
use super::waiting::ended_or_waiting;
use super::wrap::{Probe, TestHook, TestRunner};
use crate::coordination::signal::SignalOutcome;
use crate::history::RunHistory;
use crate::history::naming::runner_label;
use crate::hooks::terminal::{NoopTerminalHook, TerminalHook};
use crate::model::{RunEnd, RunOptions, RunSpec, RunState, RunStatus, StepError, SubmitOutcome};
use crate::runner::StepRunner;
use crate::runtime::{WorkflowRuntime, WorkflowRuntimeBuilder};
use crate::store::keys::RunId;
use crate::workflows::{Workflow, WorkflowInput, WorkflowOf, WorkflowResult, from_end};

/// The runtime a [`TestRuntime`] runs: the application's runner and hook
/// in the kit's wrappers.
pub type TestWorkflowRuntime<R, H> = WorkflowRuntime<TestRunner<R>, TestHook<H>>;

/// Changes a [`WorkflowRuntimeBuilder`] before each (re)build.
type Configure<R, H> = Arc<
    dyn Fn(
            WorkflowRuntimeBuilder<TestRunner<R>, TestHook<H>>,
        ) -> WorkflowRuntimeBuilder<TestRunner<R>, TestHook<H>>
        + Send
        + Sync,
>;

/// A workflow runtime in a test environment: an in-memory store, a queue on
/// a [`MockClock`] (starting at [`TEST_EPOCH_MS`](super::TEST_EPOCH_MS)),
/// the runtime and its worker, ready under
/// `#[tokio::test(start_paused = true)]` (or any Tokio runtime).
///
/// Steps run when the test says so: [`run_until_idle`](Self::run_until_idle)
/// runs every step that is due, [`advance`](Self::advance) lets time pass,
/// running everything that falls due at its own time, and
/// [`run_until_ended`](Self::run_until_ended) skips time until a run ends.
/// [`crash`](Self::crash) drops the process's runtime as a `kill -9` would
/// and reopens the store. See the [module doc](super) for a complete test.
pub struct TestRuntime<R, H = NoopTerminalHook> {
    harness: Arc<Harness<TestRunner<R>, TestHook<H>>>,
    runner: Arc<R>,
    hook: Arc<H>,
    probe: Probe,
}

impl<R, H> fmt::Debug for TestRuntime<R, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRuntime")
            .field("runner", &std::any::type_name::<R>())
            .finish_non_exhaustive()
    }
}

impl<R: StepRunner + 'static> TestRuntime<R, NoopTerminalHook> {
    /// An environment running `runner` (a `#[workflow]` type, a
    /// [`Workflows`](crate::workflows::Workflows) router or any
    /// [`StepRunner`]) with no terminal hook and the defaults of
    /// [`builder`](Self::builder).
    ///
    /// # Errors
    /// When the queue does not open (it is in memory: in practice never).
    pub async fn new(runner: R) -> Result<Self, TestError> {
        Self::builder(runner).build().await
    }

    /// Configure an environment running `runner`: its queue's attempts,
    /// backoff and lease, any [`WorkflowRuntimeBuilder`] setting, a
    /// terminal hook.
    pub fn builder(runner: R) -> TestRuntimeBuilder<R, NoopTerminalHook> {
        TestRuntimeBuilder {
            runner,
            hook: NoopTerminalHook,
            settings: QueueSettings::default(),
            configure: None,
        }
    }
}

impl<R: StepRunner + 'static, H: TerminalHook + 'static> TestRuntime<R, H> {
    /// An environment running `runner`, with `hook` told of every
    /// termination.
    ///
    /// # Errors
    /// As [`new`](TestRuntime::new).
    pub async fn with_hook(runner: R, hook: H) -> Result<Self, TestError> {
        TestRuntime::builder(runner).hook(hook).build().await
    }

    /// The runtime of the current process lifetime (a new one after each
    /// [`crash`](Self::crash)): groups, cancellation, status, views. A
    /// clone kept across a crash refers to the crashed queue; ask again.
    ///
    /// # Errors
    /// [`TestError::NotReopened`] after a crash that could not reopen.
    pub fn runtime(&self) -> Result<TestWorkflowRuntime<R, H>, TestError> {
        self.harness.runtime()
    }

    /// The application's runner (shared by every runtime of the
    /// environment, so what it records survives crashes).
    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// The application's terminal hook.
    pub fn hook(&self) -> &H {
        &self.hook
    }

    /// The clock of the queue and runtime. Move it with
    /// [`advance`](Self::advance), which also runs what fell due.
    pub fn clock(&self) -> &MockClock {
        self.harness.clock()
    }

    /// The clock's time, ms since the UNIX epoch.
    pub fn now_ms(&self) -> u64 {
        taquba::Clock::now_ms(self.harness.clock())
    }

    /// The store every runtime of the environment is opened on.
    pub fn store(&self) -> Arc<InMemory> {
        self.harness.store()
    }

    /// The queue of the current process lifetime (see
    /// [`runtime`](Self::runtime)).
    ///
    /// # Errors
    /// [`TestError::NotReopened`] after a crash that could not reopen.
    pub fn queue(&self) -> Result<Arc<Queue>, TestError> {
        self.harness.queue()
    }

    /// Start a run of the workflow `input` belongs to (a generated
    /// `{Type}Input`) under a fresh run id. Nothing runs until
    /// [`run_until_idle`](Self::run_until_idle) or
    /// [`advance`](Self::advance).
    ///
    /// # Errors
    /// As [`WorkflowRuntime::start`].
    pub async fn start<I: WorkflowInput>(
        &self,
        input: I,
    ) -> Result<TestRun<WorkflowOf<I>>, TestError> {
        let run = self.runtime()?.start(input).await?;
        Ok(self.handle(run.id().clone(), run.newly_submitted()))
    }

    /// [`start`](Self::start) under `run_id`, with `options`.
    ///
    /// # Errors
    /// As [`WorkflowRuntime::start_as`].
    pub async fn start_as<I: WorkflowInput>(
        &self,
        run_id: RunId,
        input: I,
        options: RunOptions,
    ) -> Result<TestRun<WorkflowOf<I>>, TestError> {
        let run = self.runtime()?.start_as(run_id, input, options).await?;
        Ok(self.handle(run.id().clone(), run.newly_submitted()))
    }

    /// Submit a run of a hand-written runner ([`WorkflowRuntime::submit`]).
    ///
    /// # Errors
    /// As [`WorkflowRuntime::submit`].
    pub async fn submit(&self, spec: RunSpec) -> Result<SubmitOutcome, TestError> {
        Ok(self.runtime()?.submit(spec).await?)
    }

    /// The typed handle of run `run_id` of workflow `W`.
    pub fn run<W: Workflow>(&self, run_id: RunId) -> TestRun<W> {
        self.handle(run_id, false)
    }

    fn handle<W: Workflow>(&self, run_id: RunId, newly_submitted: bool) -> TestRun<W> {
        TestRun {
            env: self.harness.clone(),
            run_id,
            newly_submitted,
            workflow: PhantomData,
        }
    }

    /// Run every step that is due now, and what they make due now, until no
    /// step is due, running or settling; then apply what the worker's
    /// maintenance would (dead-letter reconciliation, inbox commands,
    /// retention sweeps) and go on if that made work. When it returns,
    /// everything committed is durable (a [`crash`](Self::crash) loses
    /// none of it). Steps waiting on the clock (timers, signal timeouts,
    /// retry backoffs) stay waiting: see [`advance`](Self::advance).
    /// Returns the number of runner calls made (one per delivered attempt,
    /// failures injected with [`fail_next`](Self::fail_next) included).
    ///
    /// It reads the queue's counts and the runtime's in-flight steps, with
    /// a pause of Tokio time between two looks (1 ms, doubling up to
    /// 256 ms while nothing changes), so under paused time it takes no wall
    /// time beyond the work itself.
    ///
    /// # Errors
    /// [`TestError::NotIdle`] when steps are still due or running after the
    /// builder's [`idle_timeout`](TestRuntimeBuilder::idle_timeout) of Tokio
    /// time (a step that never returns); storage errors.
    pub async fn run_until_idle(&self) -> Result<usize, TestError> {
        self.harness.run_until_idle().await
    }

    /// Let `by` pass on the clock, running everything that falls due
    /// meanwhile at its own time, in time order, including what the window
    /// itself schedules; the clock ends at exactly now + `by`.
    ///
    /// It runs what is due now ([`run_until_idle`](Self::run_until_idle)),
    /// then moves the clock to the next instant something falls due within
    /// the window (a timer ([`Trigger::After`](crate::Trigger::After)), a
    /// signal wait's timeout, a retry backoff, a terminal notification's
    /// retry, a delayed start, an expired lease, a retention expiry), runs
    /// until idle there, and so on; so a step's recorded claim time is its
    /// own due time, and a step that fails and retries after a backoff
    /// within the window runs again inside it. `advance(Duration::ZERO)`
    /// runs what is due now. Returns the runner calls made.
    ///
    /// Jobs claimed outside the worker (by the test itself) keep their
    /// claims until their leases expire, and nothing runs meanwhile. Tokio's
    /// time is not moved: the runtime's durable times are all on the clock
    /// (a `tokio::time::sleep` in a test does not move it).
    ///
    /// # Cancel safety
    ///
    /// Dropped midway (a test that `select!`s it against a
    /// step's signal, to crash while the step runs), it leaves the clock
    /// where it got to and the worker running until the next call or the
    /// crash, as a dropped `run_until_idle` does; what committed stays.
    /// So do [`run_until_ended`](Self::run_until_ended) and
    /// [`run_to_completion`](Self::run_to_completion).
    ///
    /// # Errors
    /// [`TestError::TooManyHops`] when the clock was stepped
    /// [`max_hops`](TestRuntimeBuilder::max_hops) times and something is
    /// still due within the window (a run that keeps rescheduling itself);
    /// as [`run_until_idle`](Self::run_until_idle).
    pub async fn advance(&self, by: Duration) -> Result<usize, TestError> {
        self.harness.advance(by).await
    }

    /// Skip time until the run `run_id` ends: as [`advance`](Self::advance),
    /// stepping the clock from one due instant to the next with no end
    /// time, until the run has terminated (however it ended: read it with
    /// [`TestRun::outcome`]). A signal wait's timeout fires too: send the
    /// signal first for a run that should get it. The clock stays at the
    /// last instant something fell due. Returns the runner calls made.
    ///
    /// # Errors
    /// [`TestError::NotEnded`], saying what the run waits for, when nothing
    /// is due at any future time and it has not ended;
    /// [`TestError::UnknownRun`]; as [`advance`](Self::advance) (the hop
    /// cap bounds it).
    pub async fn run_until_ended(&self, run_id: &RunId) -> Result<usize, TestError> {
        self.harness.skip(Until::Ended(run_id)).await
    }

    /// Skip time until no step is due at any future time: every run has
    /// ended, or waits for something no time brings (a claim held without
    /// a lease). As [`run_until_ended`](Self::run_until_ended) for every
    /// run at once; retention expiries are not waited for.
    ///
    /// # Errors
    /// As [`advance`](Self::advance) (the hop cap bounds it).
    pub async fn run_to_completion(&self) -> Result<usize, TestError> {
        self.harness.skip(Until::Quiet).await
    }

    /// Send a signal under `correlation_key`, `value` encoded as
    /// [`WorkflowRuntime::signal_value`] does (MessagePack, as
    /// [`StepContext::signal_value`](crate::workflows::StepContext::signal_value)
    /// reads it). The woken step runs at the next
    /// [`run_until_idle`](Self::run_until_idle).
    ///
    /// # Errors
    /// As [`WorkflowRuntime::signal_value`].
    pub async fn signal<T: Serialize + ?Sized>(
        &self,
        correlation_key: &str,
        value: &T,
    ) -> Result<SignalOutcome, TestError> {
        Ok(self.runtime()?.signal_value(correlation_key, value).await?)
    }

    /// [`signal`](Self::signal) with the payload's bytes as given
    /// ([`WorkflowRuntime::signal`]), for a hand-written runner.
    ///
    /// # Errors
    /// As [`WorkflowRuntime::signal`].
    pub async fn signal_raw(
        &self,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<SignalOutcome, TestError> {
        Ok(self.runtime()?.signal(correlation_key, payload).await?)
    }

    /// Drop the process's runtime as a `kill -9` would, and reopen the store
    /// in a new one: runner calls in flight (a `run_until_idle` the test
    /// dropped while a step ran, as with `tokio::select!`) are dropped and
    /// their steps are delivered again (the reopened queue requeues them at
    /// once, an attempt spent, so a last attempt is dead-lettered and its
    /// run failed by reconciliation); settlements already committing
    /// finish first; what was committed stays. The crash happens once the
    /// WAL caught up (the queue's claims are not awaited durable), so it is
    /// the same crash on every run of the test. The runner and hook are the
    /// same values (see [`runner`](Self::runner)). Run handles
    /// ([`TestRun`]) follow; clones of [`runtime`](Self::runtime) and
    /// [`queue`](Self::queue) do not.
    ///
    /// # Errors
    /// When the queue does not reopen ([`TestError::NotReopened`] from
    /// then on).
    pub async fn crash(&self) -> Result<(), TestError> {
        self.harness.crash().await
    }

    /// The recorded history of `run_id` ([`WorkflowView::steps`](crate::WorkflowView::steps)):
    /// its steps' names, attempts, outcomes and (clock) times.
    ///
    /// # Errors
    /// [`TestError::UnknownRun`] for a run never submitted; storage errors.
    pub async fn history(&self, run_id: &RunId) -> Result<RunHistory, TestError> {
        history(&*self.harness, run_id).await
    }

    /// Make the next delivery of the step named `step` (its `#[step]` fn's
    /// name, or what the runner's [`StepRunner::step_name`] or payload
    /// names, else the runner's type name: the name its history records)
    /// return `error` instead of calling the runner. Queued failures are
    /// used in order, one per delivery, in any run;
    /// [`unused_failures`](Self::unused_failures) lists those never used.
    ///
    /// # Errors
    /// [`TestError::UnknownStep`], listing the names the runner runs, when
    /// the runner says which steps it runs ([`StepRunner::hosted`]: a
    /// `#[workflow]`, a [`Workflows`](crate::workflows::Workflows) router)
    /// and `step` is none of them (`"AwaitApproval"` for the step
    /// `await_approval`). A hand-written runner that does not say takes any
    /// name.
    pub fn fail_next(&self, step: &str, error: StepError) -> Result<(), TestError> {
        self.probe.faults.push(step, error)
    }

    /// The failures queued with [`fail_next`](Self::fail_next) that no
    /// delivery used yet, in the order queued, each with its step name:
    /// `assert!(env.unused_failures().is_empty())` at the end of a test
    /// checks that every injected failure happened.
    pub fn unused_failures(&self) -> Vec<(String, StepError)> {
        self.probe.faults.unused()
    }
}

/// Configures a [`TestRuntime`]; from [`TestRuntime::builder`].
pub struct TestRuntimeBuilder<R, H> {
    runner: R,
    hook: H,
    settings: QueueSettings,
    configure: Option<Configure<R, H>>,
}

impl<R, H> fmt::Debug for TestRuntimeBuilder<R, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRuntimeBuilder")
            .field("queue", &self.settings.config)
            .field("idle_timeout", &self.settings.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl<R: StepRunner + 'static, H: TerminalHook + 'static> TestRuntimeBuilder<R, H> {
    /// Tell `hook` of every termination (replacing the hook given before).
    /// Call it before [`configure`](Self::configure), whose closure names
    /// the hook's type: a hook set after drops it.
    pub fn hook<H2: TerminalHook + 'static>(self, hook: H2) -> TestRuntimeBuilder<R, H2> {
        TestRuntimeBuilder {
            runner: self.runner,
            hook,
            settings: self.settings,
            configure: None,
        }
    }

    /// The attempt limit of a step (default 3, taquba's).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.config = self.settings.config.max_attempts(attempts);
        self
    }

    /// The retry backoff: the delay after attempt `n` fails is
    /// `base * 2^(n-1)`, at most `max` (default 1 s and 300 s, taquba's);
    /// [`advance`](TestRuntime::advance) past it to run the retry. A zero
    /// `base` retries at once.
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.config = self
            .settings
            .config
            .retry_backoff_base(base)
            .retry_backoff_max(max);
        self
    }

    /// The lease of a claimed step (default 30 s).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.config = self.settings.config.lease_duration(lease);
        self
    }

    /// Every queue's whole configuration (replacing
    /// [`max_attempts`](Self::max_attempts), [`retry_backoff`](Self::retry_backoff)
    /// and [`lease`](Self::lease)).
    pub fn queue_config(mut self, config: QueueConfig) -> Self {
        self.settings.config = config;
        self
    }

    /// How long one [`run_until_idle`](TestRuntime::run_until_idle) may
    /// wait for the steps in flight, in Tokio time (default 60 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.settings.idle_timeout = timeout;
        self
    }

    /// How many times one [`advance`](TestRuntime::advance),
    /// [`run_until_ended`](TestRuntime::run_until_ended) or
    /// [`run_to_completion`](TestRuntime::run_to_completion) may step the
    /// clock to a due instant before it gives up with
    /// [`TestError::TooManyHops`] (default [`DEFAULT_MAX_HOPS`](super::DEFAULT_MAX_HOPS),
    /// 200; at least 1). Each step of the clock runs the queue until idle,
    /// a few ms of wall time that grow with what the store holds (a few
    /// hundred steps in one test take seconds), so a test of a long loop
    /// raises it knowingly.
    pub fn max_hops(mut self, hops: u32) -> Self {
        self.settings.max_hops = hops.max(1);
        self
    }

    /// Apply `configure` to the runtime's builder each time the environment
    /// builds it (at the start and after each crash): any
    /// [`WorkflowRuntimeBuilder`] setting, such as
    /// [`history_limit`](WorkflowRuntimeBuilder::history_limit) or
    /// [`step_output_replay`](WorkflowRuntimeBuilder::step_output_replay).
    /// The poll interval matters little: the kit runs the maintenance
    /// itself.
    pub fn configure(
        mut self,
        configure: impl Fn(
            WorkflowRuntimeBuilder<TestRunner<R>, TestHook<H>>,
        ) -> WorkflowRuntimeBuilder<TestRunner<R>, TestHook<H>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.configure = Some(Arc::new(configure));
        self
    }

    /// Open the environment.
    ///
    /// # Errors
    /// When the queue does not open (it is in memory: in practice never).
    pub async fn build(self) -> Result<TestRuntime<R, H>, TestError> {
        let runner = Arc::new(self.runner);
        let hook = Arc::new(self.hook);
        let probe = Probe::default();
        let label: Arc<str> = runner_label::<R>().into();
        let build = {
            let (runner, hook, probe) = (runner.clone(), hook.clone(), probe.clone());
            let configure = self.configure;
            Box::new(move |queue, store| {
                let wrapped = TestRunner::new(runner.clone(), probe.clone(), label.clone());
                let builder =
                    WorkflowRuntime::builder(queue, store, wrapped, TestHook::new(hook.clone()))
                        .runner_label(label.to_string());
                match &configure {
                    Some(configure) => configure(builder),
                    None => builder,
                }
                .build()
            })
        };
        probe.faults.know(runner.hosted().step_names());
        let harness = Harness::start(self.settings, probe.calls.clone(), build).await?;
        Ok(TestRuntime {
            harness: Arc::new(harness),
            runner,
            hook,
            probe,
        })
    }
}

/// The history of `run_id` in the environment's current view.
pub(crate) async fn history(
    env: &dyn CurrentView,
    run_id: &RunId,
) -> Result<RunHistory, TestError> {
    env.view()?
        .steps(run_id)
        .await?
        .ok_or_else(|| TestError::UnknownRun(run_id.clone()))
}

/// One run of workflow `W` in a [`TestRuntime`]; from
/// [`TestRuntime::start`]. It reads the environment's current runtime, so
/// it stays usable across [`crash`](TestRuntime::crash)es. Cheap to clone.
pub struct TestRun<W> {
    env: Arc<dyn CurrentView>,
    run_id: RunId,
    newly_submitted: bool,
    workflow: PhantomData<fn() -> W>,
}

impl<W> Clone for TestRun<W> {
    fn clone(&self) -> Self {
        Self {
            env: self.env.clone(),
            run_id: self.run_id.clone(),
            newly_submitted: self.newly_submitted,
            workflow: PhantomData,
        }
    }
}

impl<W: Workflow> fmt::Debug for TestRun<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestRun")
            .field("workflow", &W::NAME)
            .field("run_id", &self.run_id)
            .finish()
    }
}

impl<W: Workflow> TestRun<W> {
    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.run_id
    }

    /// `false` when the start found the run already active with the same
    /// input.
    pub fn newly_submitted(&self) -> bool {
        self.newly_submitted
    }

    /// The run's status ([`WorkflowView::status`](crate::WorkflowView::status)).
    ///
    /// # Errors
    /// [`TestError::UnknownRun`]; storage errors.
    pub async fn status(&self) -> Result<RunStatus, TestError> {
        self.env
            .view()?
            .status(&self.run_id)
            .await?
            .ok_or_else(|| TestError::UnknownRun(self.run_id.clone()))
    }

    /// The typed result once the run ended (`None` while it runs or
    /// waits).
    ///
    /// # Errors
    /// Storage errors; [`Error::Deserialization`](crate::Error::Deserialization)
    /// when the result is not a `W::Output`.
    pub async fn outcome(&self) -> Result<Option<WorkflowResult<W>>, TestError> {
        let view = self.env.view()?;
        let Some(RunStatus {
            state: RunState::Terminated(termination),
            ..
        }) = view.status(&self.run_id).await?
        else {
            return Ok(None);
        };
        let outcome = view.outcome(&self.run_id).await?;
        let end = RunEnd {
            termination,
            outcome,
        };
        Ok(Some(from_end::<W>(&self.run_id, end)?))
    }

    /// The output of the run, which must have succeeded.
    ///
    /// # Errors
    /// [`TestError::NotEnded`] while it runs or waits (saying what it waits
    /// for), [`TestError::RunFailed`] when it failed or was cancelled; as
    /// [`outcome`](Self::outcome).
    pub async fn output(&self) -> Result<W::Output, TestError> {
        let outcome = ended_or_waiting(&*self.env, &self.run_id, || self.outcome()).await?;
        outcome.map_err(TestError::RunFailed)
    }

    /// The run's recorded history ([`TestRuntime::history`]).
    ///
    /// # Errors
    /// As [`TestRuntime::history`].
    pub async fn history(&self) -> Result<RunHistory, TestError> {
        history(&*self.env, &self.run_id).await
    }
}
