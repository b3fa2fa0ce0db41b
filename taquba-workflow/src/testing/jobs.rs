//! [`TestJobs`]: a [`JobRunner`] of `#[job]` types (or any [`Job`]) in the
//! test environment, and [`TestJob`], the handle of one submitted job.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::memory::InMemory;
use taquba::{MockClock, Queue, QueueConfig};

use super::error::TestError;
use super::harness::Until;
use super::harness::{Harness, QueueSettings};
use super::waiting::ended_or_waiting;
use super::workflows::history;
use super::wrap::{Probe, TestHandler};
use crate::history::RunHistory;
use crate::hooks::terminal::NoopTerminalHook;
use crate::jobs::{Job, JobDispatch, JobError, JobRunner, JobRunnerBuilder};
use crate::model::{RunOptions, RunStatus, StepError};
use crate::runner::StepRunner;
use crate::store::keys::RunId;

/// A step of the builder's registrations.
type Registration = Box<dyn FnOnce(JobRunnerBuilder) -> JobRunnerBuilder + Send>;

/// A job runner in a test environment (see
/// [`TestRuntime`](super::TestRuntime), whose verbs it shares): register
/// the job types, submit jobs, run them until idle, move the clock past
/// retry backoffs, crash and reopen, inject failures by job name.
pub struct TestJobs {
    harness: Arc<Harness<JobDispatch, NoopTerminalHook>>,
    probe: Probe,
}

impl fmt::Debug for TestJobs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestJobs").finish_non_exhaustive()
    }
}

impl TestJobs {
    /// Configure an environment: register job types (and their state) on
    /// the returned builder, then [`build`](TestJobsBuilder::build) it.
    pub fn builder() -> TestJobsBuilder {
        TestJobsBuilder {
            registrations: Vec::new(),
            settings: QueueSettings::default(),
        }
    }

    /// The runner of the current process lifetime (a new one after each
    /// [`crash`](Self::crash)); a clone kept across a crash refers to the
    /// crashed queue.
    ///
    /// # Errors
    /// [`TestError::NotReopened`] after a crash that could not reopen.
    pub fn runner(&self) -> Result<JobRunner, TestError> {
        Ok(JobRunner {
            runtime: self.harness.runtime()?,
        })
    }

    /// The clock of the queue and runner.
    pub fn clock(&self) -> &MockClock {
        self.harness.clock()
    }

    /// The clock's time, ms since the UNIX epoch.
    pub fn now_ms(&self) -> u64 {
        taquba::Clock::now_ms(self.harness.clock())
    }

    /// The store every runner of the environment is opened on.
    pub fn store(&self) -> Arc<InMemory> {
        self.harness.store()
    }

    /// The queue of the current process lifetime.
    ///
    /// # Errors
    /// [`TestError::NotReopened`] after a crash that could not reopen.
    pub fn queue(&self) -> Result<Arc<Queue>, TestError> {
        self.harness.queue()
    }

    /// Submit `job` ([`JobRunner::submit`]); it runs at the next
    /// [`run_until_idle`](Self::run_until_idle).
    ///
    /// # Errors
    /// As [`JobRunner::submit`].
    pub async fn submit<J: Job>(&self, job: J) -> Result<TestJob<J>, TestError> {
        self.submit_with(job, RunOptions::default()).await
    }

    /// [`submit`](Self::submit) with `options` ([`JobRunner::submit_with`]).
    ///
    /// # Errors
    /// As [`JobRunner::submit_with`].
    pub async fn submit_with<J: Job>(
        &self,
        job: J,
        options: RunOptions,
    ) -> Result<TestJob<J>, TestError> {
        let handle = self.runner()?.submit_with(job, options).await?;
        Ok(TestJob {
            harness: self.harness.clone(),
            id: handle.id().clone(),
            newly_submitted: handle.newly_submitted(),
            job: PhantomData,
        })
    }

    /// Run every job that is due until none is due or running; the handler
    /// calls made. See [`TestRuntime::run_until_idle`](super::TestRuntime::run_until_idle).
    ///
    /// # Errors
    /// As [`TestRuntime::run_until_idle`](super::TestRuntime::run_until_idle).
    pub async fn run_until_idle(&self) -> Result<usize, TestError> {
        self.harness.run_until_idle().await
    }

    /// Let `by` pass on the clock, running every retry backoff and delayed
    /// start that falls due meanwhile at its own time, in time order, the
    /// retries the window itself schedules included; the clock ends at
    /// exactly now + `by`. See
    /// [`TestRuntime::advance`](super::TestRuntime::advance).
    ///
    /// # Errors
    /// As [`TestRuntime::advance`](super::TestRuntime::advance).
    pub async fn advance(&self, by: Duration) -> Result<usize, TestError> {
        self.harness.advance(by).await
    }

    /// Skip time until job `id` ends (succeeded, or failed for good); see
    /// [`TestRuntime::run_until_ended`](super::TestRuntime::run_until_ended).
    ///
    /// # Errors
    /// As [`TestRuntime::run_until_ended`](super::TestRuntime::run_until_ended).
    pub async fn run_until_ended(&self, id: &RunId) -> Result<usize, TestError> {
        self.harness.skip(Until::Ended(id)).await
    }

    /// Skip time until no job is due at any future time; see
    /// [`TestRuntime::run_to_completion`](super::TestRuntime::run_to_completion).
    ///
    /// # Errors
    /// As [`TestRuntime::advance`](super::TestRuntime::advance).
    pub async fn run_to_completion(&self) -> Result<usize, TestError> {
        self.harness.skip(Until::Quiet).await
    }

    /// Drop the runner as a `kill -9` would and reopen the store; see
    /// [`TestRuntime::crash`](super::TestRuntime::crash). Registered state
    /// is shared by every runner of the environment.
    ///
    /// # Errors
    /// As [`TestRuntime::crash`](super::TestRuntime::crash).
    pub async fn crash(&self) -> Result<(), TestError> {
        self.harness.crash().await
    }

    /// The recorded history of job `id`: one step named by the job's
    /// [`Job::NAME`], with its attempts.
    ///
    /// # Errors
    /// [`TestError::UnknownRun`] for a job never submitted; storage errors.
    pub async fn history(&self, id: &RunId) -> Result<RunHistory, TestError> {
        history(&*self.harness, id).await
    }

    /// Make the next delivery of a job named `job` (its [`Job::NAME`])
    /// return `error` instead of running it (transient errors retry after
    /// the backoff, permanent ones end the job). Queued failures are used
    /// in order, one per delivery;
    /// [`unused_failures`](Self::unused_failures) lists those never used.
    ///
    /// # Errors
    /// [`TestError::UnknownStep`], listing the registered job names, when
    /// no registered job is named `job`.
    pub fn fail_next(&self, job: &str, error: StepError) -> Result<(), TestError> {
        self.probe.faults.push(job, error)
    }

    /// The failures queued with [`fail_next`](Self::fail_next) that no
    /// delivery used yet, in the order queued, each with its job name.
    pub fn unused_failures(&self) -> Vec<(String, StepError)> {
        self.probe.faults.unused()
    }
}

/// Configures a [`TestJobs`]; from [`TestJobs::builder`].
pub struct TestJobsBuilder {
    registrations: Vec<Registration>,
    settings: QueueSettings,
}

impl fmt::Debug for TestJobsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestJobsBuilder")
            .field("registrations", &self.registrations.len())
            .field("queue", &self.settings.config)
            .finish_non_exhaustive()
    }
}

impl TestJobsBuilder {
    /// Register job type `J` ([`JobRunnerBuilder::register`]).
    ///
    /// # Panics
    /// At [`build`](Self::build), as [`JobRunnerBuilder::register`].
    pub fn register<J: Job>(mut self) -> Self {
        self.registrations
            .push(Box::new(|builder| builder.register::<J>()));
        self
    }

    /// Register state for the jobs ([`JobRunnerBuilder::state`]); one value
    /// shared by every runner of the environment.
    pub fn state<T: std::any::Any + Send + Sync>(mut self, value: T) -> Self {
        self.registrations
            .push(Box::new(move |builder| builder.state(value)));
        self
    }

    /// Apply `configure` to the runner's builder (queue name, retention,
    /// concurrency).
    pub fn configure(
        mut self,
        configure: impl FnOnce(JobRunnerBuilder) -> JobRunnerBuilder + Send + 'static,
    ) -> Self {
        self.registrations.push(Box::new(configure));
        self
    }

    /// The attempt limit of a job (default 3; a job's own
    /// [`Job::max_attempts`] wins).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.settings.config = self.settings.config.max_attempts(attempts);
        self
    }

    /// The retry backoff (default 1 s doubling to 300 s); see
    /// [`TestRuntimeBuilder::retry_backoff`](super::TestRuntimeBuilder::retry_backoff).
    pub fn retry_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.settings.config = self
            .settings
            .config
            .retry_backoff_base(base)
            .retry_backoff_max(max);
        self
    }

    /// Every queue's whole configuration.
    pub fn queue_config(mut self, config: QueueConfig) -> Self {
        self.settings.config = config;
        self
    }

    /// How long one [`run_until_idle`](TestJobs::run_until_idle) may wait,
    /// in Tokio time (default 60 s).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.settings.idle_timeout = timeout;
        self
    }

    /// The bound on the clock's steps of one call; see
    /// [`TestRuntimeBuilder::max_hops`](super::TestRuntimeBuilder::max_hops).
    pub fn max_hops(mut self, hops: u32) -> Self {
        self.settings.max_hops = hops.max(1);
        self
    }

    /// Open the environment.
    ///
    /// # Errors
    /// When the queue does not open (in practice never).
    ///
    /// # Panics
    /// When two registered job types share a name.
    pub async fn build(self) -> Result<TestJobs, TestError> {
        let probe = Probe::default();
        let registrations = std::sync::Mutex::new(Some(self.registrations));
        let template = std::sync::Mutex::new(None::<JobRunnerBuilder>);
        let wrap_probe = probe.clone();
        // The template is made from the first queue, then rebuilt on each
        // reopened one, sharing its handlers and state.
        let build = Box::new(move |queue: Arc<Queue>, store| {
            let mut template = template
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let builder = match template.take() {
                Some(builder) => builder.on_queue(queue, store),
                None => {
                    let registrations = registrations
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take()
                        .unwrap_or_default();
                    registrations
                        .into_iter()
                        .fold(JobRunner::builder(queue, store), |builder, step| {
                            step(builder)
                        })
                        .wrap_handlers(|name, handler| {
                            TestHandler::wrap(name, handler, wrap_probe.clone())
                        })
                }
            };
            *template = Some(builder.clone());
            builder.build().runtime
        });
        let harness = Harness::start(self.settings, probe.calls.clone(), build).await?;
        // The registered jobs, as the runner built on the first queue has them.
        probe
            .faults
            .know(harness.runtime()?.inner.runner.hosted().step_names());
        Ok(TestJobs {
            harness: Arc::new(harness),
            probe,
        })
    }
}

/// One submitted job of a [`TestJobs`]; it reads the environment's current
/// runner, so it stays usable across crashes. Cheap to clone.
pub struct TestJob<J> {
    harness: Arc<Harness<JobDispatch, NoopTerminalHook>>,
    id: RunId,
    newly_submitted: bool,
    job: PhantomData<fn() -> J>,
}

impl<J> Clone for TestJob<J> {
    fn clone(&self) -> Self {
        Self {
            harness: self.harness.clone(),
            id: self.id.clone(),
            newly_submitted: self.newly_submitted,
            job: PhantomData,
        }
    }
}

impl<J: Job> fmt::Debug for TestJob<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestJob")
            .field("job", &J::NAME)
            .field("id", &self.id)
            .finish()
    }
}

impl<J: Job> TestJob<J> {
    /// The job's id.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// `false` when the submission matched a job already running or
    /// recorded under the same idempotency key.
    pub fn newly_submitted(&self) -> bool {
        self.newly_submitted
    }

    /// The job's status.
    ///
    /// # Errors
    /// [`TestError::UnknownRun`]; storage errors.
    pub async fn status(&self) -> Result<RunStatus, TestError> {
        self.harness
            .runtime()?
            .status(&self.id)
            .await?
            .ok_or_else(|| TestError::UnknownRun(self.id.clone()))
    }

    /// The recorded result once the job ended (`None` while it runs or
    /// waits for a retry); see [`JobHandle::fetch_result`](crate::jobs::JobHandle::fetch_result).
    ///
    /// # Errors
    /// As [`JobHandle::fetch_result`](crate::jobs::JobHandle::fetch_result).
    pub async fn result(&self) -> Result<Option<Result<J::Output, JobError>>, TestError> {
        let runner = JobRunner {
            runtime: self.harness.runtime()?,
        };
        Ok(runner
            .handle::<J>(self.id.clone(), self.newly_submitted)
            .fetch_result()
            .await?)
    }

    /// The output of the job, which must have succeeded.
    ///
    /// # Errors
    /// [`TestError::NotEnded`] while it runs or waits (saying what it waits
    /// for: a retry backoff, a delayed start), [`TestError::JobFailed`] when
    /// it failed; as [`result`](Self::result).
    pub async fn output(&self) -> Result<J::Output, TestError> {
        let result = ended_or_waiting(&*self.harness, &self.id, || self.result()).await?;
        result.map_err(|error| TestError::JobFailed {
            id: self.id.clone(),
            error,
        })
    }

    /// The job's recorded history ([`TestJobs::history`]).
    ///
    /// # Errors
    /// As [`TestJobs::history`].
    pub async fn history(&self) -> Result<RunHistory, TestError> {
        history(&*self.harness, &self.id).await
    }
}
