//! Typed jobs: one typed async function run as a single-step run whose
//! result an awaiting caller receives.
//!
//! Define a [`Job`] (a serde type with an `Output`, an `Error` and a
//! `NAME`), register it on a [`JobRunner`], submit values and await the
//! [`JobHandle`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use taquba::{Queue, object_store::memory::InMemory};
//! use taquba_workflow::jobs::{Job, JobContext, JobRunner};
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Add { a: i64, b: i64 }
//!
//! impl Job for Add {
//!     const NAME: &'static str = "math.add";
//!     type Output = i64;
//!     type Error = std::convert::Infallible;
//!     async fn run(&self, _ctx: JobContext<'_>) -> Result<i64, Self::Error> {
//!         Ok(self.a + self.b)
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(InMemory::new());
//! let queue = Arc::new(Queue::open(store.clone(), "jobs-demo").await?);
//! let runner = JobRunner::builder(queue, store).register::<Add>().build();
//! let worker = runner.spawn(std::future::pending::<()>());
//! assert_eq!(runner.submit(Add { a: 2, b: 3 }).await?.await?, 5);
//! worker.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! # Model
//! A job run's input is the type's [`Job::NAME`] and the job value as
//! MessagePack with named fields; its single step looks the name up among
//! the registered types and runs [`Job::run`]. The output is the run's
//! result; an error is classified by [`Job::classify`] (transient errors
//! retry with backoff up to the attempt limit, permanent ones end the job
//! at once).
//!
//! # Idempotent submission
//! With [`Job::idempotency_key`] the job's run id is the hex SHA-256 of the
//! key: a second submission while the job runs returns a handle to it
//! (`newly_submitted() == false`), and one after it terminated returns the
//! recorded result without running again, until retention removes the
//! record. A different payload under the same key is
//! [`Error::InputMismatch`]; payloads are compared by their canonical
//! encoding (see [`payload_idempotency_key`]), so equal jobs whose maps or
//! sets iterate in another order are the same payload. The payload is
//! stored as given.

pub(crate) mod registry;

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{Stream, StreamExt, TryStreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use taquba::object_store::ObjectStore;
use taquba::{Clock, Queue};

use crate::coordination::group::RunGroup;
use crate::coordination::members::HashedMember;
use crate::coordination::members::{GroupMember, GroupStatus, MemberResult};
use crate::engine::{OnTerminated, RuntimeCore};
use crate::error::{Error, Result};
use crate::hooks::terminal::NoopTerminalHook;
use crate::model::{RunEnd, RunOptions, RunSpec, RunStatus, RunTermination};
use crate::model::{RunOutcome, TerminalStatus};
use crate::model::{StepError, StepErrorKind, StepOutcome};
use crate::run::commit::detached_unless_handed_over;
use crate::run::context::failure;
use crate::run::watch::RunWatch;
use crate::runner::{Delivery, Step, StepRunner};
use crate::runtime::{RunnerHandle, WorkflowRuntime};
use crate::store::canonical;
use crate::store::durable::{self, DurableJobInput};
use crate::store::keys::{RunId, sha256};

/// The default queue name of a [`JobRunner`].
pub const DEFAULT_JOB_QUEUE: &str = "jobs";

/// A typed job: its fields are its input, [`run`](Self::run) its work.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a job",
    label = "implement `taquba_workflow::jobs::Job` for `{Self}` (or annotate an async fn with `#[job]`)",
    note = "a job is `Serialize + DeserializeOwned + Send + Sync + 'static` with `NAME`, `Output`, `Error` and `run`"
)]
pub trait Job: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The success value, stored as MessagePack with named fields.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// The failure; its `Display` is the job's error message, and
    /// [`classify`](Self::classify) decides whether it is retried.
    ///
    /// Any `std::error::Error + Send + Sync + 'static` type qualifies, and
    /// so do the error types services use that are not `std::error::Error`:
    /// `anyhow::Error`, `Box<dyn std::error::Error + Send + Sync>` and
    /// `String`. (The 0.13 bound was `std::error::Error + Send + Sync +
    /// 'static`; every type it accepted is still accepted.)
    type Error: fmt::Debug + fmt::Display + Send + Sync + 'static;
    /// The registered name, unique in a runner; stored in every submission,
    /// so keep it stable across releases.
    const NAME: &'static str;

    /// Do the work. `ctx` gives the delivery (memo, effects, lease, cancel
    /// token) and the runner's registered state.
    fn run(
        &self,
        ctx: JobContext<'_>,
    ) -> impl Future<Output = std::result::Result<Self::Output, Self::Error>> + Send;

    /// The idempotency key: submissions with equal keys are one job.
    /// Default `None`: every submission is a new job.
    fn idempotency_key(&self) -> Option<String> {
        None
    }

    /// The attempt limit of this job; `None` is the queue's.
    fn max_attempts(&self) -> Option<u32> {
        None
    }

    /// The concurrency key of this job: at most
    /// [`concurrency_limit`](Self::concurrency_limit) jobs with equal keys
    /// run at a time, the others wait (holding no worker slot) and start in
    /// submission order (see
    /// [`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key),
    /// which takes precedence when set). Default `None`: no limit.
    /// `#[job(concurrency_key = "{customer}", limit = 1)]` writes it.
    fn concurrency_key(&self) -> Option<String> {
        None
    }

    /// The most jobs with this job's
    /// [`concurrency_key`](Self::concurrency_key) running at a time, at
    /// least 1. Default 1.
    fn concurrency_limit(&self) -> u32 {
        1
    }

    /// Whether `error` may be retried. Default: transient.
    fn classify(&self, _error: &Self::Error) -> StepErrorKind {
        StepErrorKind::Transient
    }
}

/// A key derived from the job's type name and payload: the lowercase hex
/// SHA-256 (64 characters) of [`Job::NAME`], a zero byte and the job's
/// canonical MessagePack encoding, "same input, same job".
///
/// The canonical encoding is the stored one (named fields) with the
/// entries of every map sorted by their encoded key bytes, at every depth,
/// and the elements of every `HashSet` sorted by their encoded bytes, so
/// equal jobs get one key whatever order their maps and sets iterate in.
/// A job without maps and sets is digested from exactly its stored bytes,
/// as in 0.13, so its key is unchanged; one with a map or a set may get a
/// key other than 0.13's (whose key depended on iteration order), so a
/// submission made before the upgrade is not recognised by one after it.
/// A struct's fields keep their declaration order (a
/// `#[serde(flatten)]` struct is a map, and sorted). Other collections
/// whose iteration order is not a function of their value (a custom set
/// type) need a deterministic `Serialize` for a stable key.
///
/// # Errors
/// [`Error::Serialization`] when the job cannot be encoded.
pub fn payload_idempotency_key<J: Job>(job: &J) -> Result<String> {
    let payload = canonical::to_vec(job)?;
    let mut bytes = Vec::with_capacity(J::NAME.len() + 1 + payload.len());
    bytes.extend_from_slice(J::NAME.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(&payload);
    Ok(hex::encode(sha256(&bytes)))
}

/// Application state registered on a runner, by type (shared by the
/// clones of a builder, as the test kit rebuilds a runner after a crash).
#[derive(Default, Clone)]
pub(crate) struct StateMap(HashMap<TypeId, Arc<dyn Any + Send + Sync>>);

/// What a job's [`Job::run`] receives: the delivery (through `Deref`) and
/// the runner's state.
pub struct JobContext<'a> {
    delivery: &'a Delivery,
    state: &'a StateMap,
}

impl fmt::Debug for JobContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobContext")
            .field("delivery", self.delivery)
            .finish_non_exhaustive()
    }
}

impl<'a> JobContext<'a> {
    /// The state of type `T` registered with [`JobRunnerBuilder::state`].
    ///
    /// # Panics
    /// When no `T` was registered; the message names the type.
    pub fn state<T: Any + Send + Sync>(&self) -> &T {
        self.try_state::<T>().unwrap_or_else(|| {
            panic!(
                "no state of type `{}` is registered on this JobRunner; add it with JobRunnerBuilder::state",
                type_name::<T>()
            )
        })
    }

    /// The state of type `T`, or `None`.
    pub fn try_state<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.state
            .0
            .get(&TypeId::of::<T>())
            .and_then(|value| (**value).downcast_ref())
    }

    /// Whether a transient error now ends the job.
    pub fn is_last_attempt(&self) -> bool {
        self.delivery.is_last_attempt()
    }
}

impl Deref for JobContext<'_> {
    type Target = Delivery;
    fn deref(&self) -> &Delivery {
        self.delivery
    }
}

/// A job that terminated without success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct JobError {
    /// Its classification; `Transient` for a job cancelled or ended
    /// outside its handler.
    pub kind: StepErrorKind,
    /// The `Display` of the job's error (or what ended it).
    pub message: String,
}

/// Why awaiting a job gave no output.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Submission, storage or decoding failed.
    #[error(transparent)]
    Infra(#[from] Error),
    /// The job terminated without success.
    #[error("job failed: {0}")]
    Job(#[from] JobError),
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A registered job type, erased.
pub(crate) trait Handler: Send + Sync {
    fn run<'a>(
        &'a self,
        payload: &'a [u8],
        step: &'a Step,
        state: &'a StateMap,
    ) -> BoxFuture<'a, std::result::Result<StepOutcome, StepError>>;
}

struct TypedHandler<J>(PhantomData<fn() -> J>);

impl<J: Job> Handler for TypedHandler<J> {
    fn run<'a>(
        &'a self,
        payload: &'a [u8],
        step: &'a Step,
        state: &'a StateMap,
    ) -> BoxFuture<'a, std::result::Result<StepOutcome, StepError>> {
        Box::pin(async move {
            let job: J = rmp_serde::from_slice(payload).map_err(|err| {
                failure(format_args!(
                    "job `{}`: payload does not decode as `{}`: {err}",
                    J::NAME,
                    type_name::<J>()
                ))
            })?;
            let ctx = JobContext {
                delivery: &step.delivery,
                state,
            };
            match job.run(ctx).await {
                Ok(output) => {
                    let result = durable::try_encode(&output).map_err(|err| {
                        failure(format_args!(
                            "job `{}`: output does not encode: {err}",
                            J::NAME
                        ))
                    })?;
                    Ok(StepOutcome::Succeed { result })
                }
                Err(err) => Err(StepError {
                    message: err.to_string(),
                    kind: job.classify(&err),
                }),
            }
        })
    }
}

/// The step runner of a job runner: decode the input, dispatch by name.
pub(crate) struct JobDispatch {
    handlers: HashMap<&'static str, Arc<dyn Handler>>,
    state: StateMap,
}

impl StepRunner for JobDispatch {
    /// Every registered job type.
    fn hosted(&self) -> crate::runner::Hosted {
        crate::runner::Hosted::Jobs(self.handlers.keys().map(|name| name.to_string()).collect())
    }

    async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
        let input: DurableJobInput = durable::decode(&step.payload)
            .map_err(|err| failure(format_args!("job input does not decode: {err}")))?;
        let Some(handler) = self.handlers.get(input.name.as_str()) else {
            return Err(failure(format_args!(
                "no job type named {:?} is registered on this JobRunner",
                input.name
            )));
        };
        handler.run(&input.payload, step, &self.state).await
    }
}

pub(crate) type JobRuntime = WorkflowRuntime<JobDispatch, NoopTerminalHook>;

/// Runs typed jobs over one [`taquba::Queue`] (queue name `"jobs"` by
/// default): submit, await, fetch results, group. Cheap to clone.
#[derive(Clone)]
pub struct JobRunner {
    pub(crate) runtime: JobRuntime,
}

impl fmt::Debug for JobRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRunner").finish_non_exhaustive()
    }
}

/// Configures a [`JobRunner`]; from [`JobRunner::builder`].
#[derive(Clone)]
pub struct JobRunnerBuilder {
    queue: Arc<Queue>,
    object_store: Arc<dyn ObjectStore>,
    handlers: HashMap<&'static str, (&'static str, Arc<dyn Handler>)>,
    state: StateMap,
    queue_name: String,
    memo_prefix: Option<String>,
    max_concurrent_jobs: Option<usize>,
    poll_interval: Option<Duration>,
    retention: Option<Duration>,
    group_retention: Option<Duration>,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for JobRunnerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<_> = self.handlers.keys().collect();
        names.sort();
        f.debug_struct("JobRunnerBuilder")
            .field("jobs", &names)
            .field("queue_name", &self.queue_name)
            .finish_non_exhaustive()
    }
}

impl JobRunnerBuilder {
    /// Register job type `J`.
    ///
    /// # Panics
    /// When another type is registered under `J::NAME`; the message names
    /// both types.
    pub fn register<J: Job>(mut self) -> Self {
        if let Some((other, _)) = self.handlers.get(J::NAME) {
            if *other != type_name::<J>() {
                panic!(
                    "job name {:?} is registered twice: by `{other}` and by `{}`",
                    J::NAME,
                    type_name::<J>()
                );
            }
            return self;
        }
        self.handlers.insert(
            J::NAME,
            (type_name::<J>(), Arc::new(TypedHandler::<J>(PhantomData))),
        );
        self
    }

    /// Whether a job type is registered under `name`.
    pub fn is_registered(&self, name: &str) -> bool {
        self.handlers.contains_key(name)
    }

    /// The queue of the job runs (default `"jobs"`).
    pub fn queue_name(mut self, name: impl Into<String>) -> Self {
        self.queue_name = name.into();
        self
    }

    /// The memo prefix (default `"{queue_name}-memo"`).
    pub fn memo_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.memo_prefix = Some(prefix.into());
        self
    }

    /// Register application state, read in jobs with
    /// [`JobContext::state`]; one value per type (a later one replaces).
    pub fn state<T: Any + Send + Sync>(mut self, value: T) -> Self {
        self.state.0.insert(TypeId::of::<T>(), Arc::new(value));
        self
    }

    /// The most jobs running at once (the runtime's
    /// [`max_concurrent_steps`](crate::WorkflowRuntimeBuilder::max_concurrent_steps)).
    pub fn max_concurrent_jobs(mut self, max: usize) -> Self {
        self.max_concurrent_jobs = Some(max);
        self
    }

    /// The worker's poll interval (the runtime's).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = Some(interval);
        self
    }

    /// Remove each job's records this long after it terminated (the
    /// runtime's [`memo_retention`](crate::WorkflowRuntimeBuilder::memo_retention));
    /// afterwards its idempotency key runs the job again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// The runtime's [`group_retention`](crate::WorkflowRuntimeBuilder::group_retention).
    pub fn group_retention(mut self, retention: Duration) -> Self {
        self.group_retention = Some(retention);
        self
    }

    /// The clock (default: the queue's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// This builder over `queue` and `object_store` instead (the test kit
    /// rebuilds its runner on a reopened queue).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn on_queue(
        mut self,
        queue: Arc<Queue>,
        object_store: Arc<dyn ObjectStore>,
    ) -> Self {
        self.queue = queue;
        self.object_store = object_store;
        self
    }

    /// Replace each registered handler with `wrap(name, handler)` (the
    /// test kit's failure injection).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn wrap_handlers(
        mut self,
        wrap: impl Fn(&'static str, Arc<dyn Handler>) -> Arc<dyn Handler>,
    ) -> Self {
        for (name, (_, handler)) in self.handlers.iter_mut() {
            *handler = wrap(name, handler.clone());
        }
        self
    }

    /// Build the runner.
    pub fn build(self) -> JobRunner {
        let dispatch = JobDispatch {
            handlers: self
                .handlers
                .into_iter()
                .map(|(name, (_, handler))| (name, handler))
                .collect(),
            state: self.state,
        };
        let mut builder =
            WorkflowRuntime::builder(self.queue, self.object_store, dispatch, NoopTerminalHook)
                .queue_name(self.queue_name)
                .naming(crate::history::naming::Naming::Jobs);
        if let Some(prefix) = self.memo_prefix {
            builder = builder.memo_prefix(prefix);
        }
        if let Some(max) = self.max_concurrent_jobs {
            builder = builder.max_concurrent_steps(max);
        }
        if let Some(interval) = self.poll_interval {
            builder = builder.poll_interval(interval);
        }
        if let Some(retention) = self.retention {
            builder = builder.memo_retention(retention);
        }
        if let Some(retention) = self.group_retention {
            builder = builder.group_retention(retention);
        }
        if let Some(clock) = self.clock {
            builder = builder.clock(clock);
        }
        JobRunner {
            runtime: builder.build(),
        }
    }
}

/// The encoded run input of `job`.
fn job_input<J: Job>(job: &J) -> Result<Vec<u8>> {
    let payload = durable::try_encode(job)?;
    Ok(durable::encode(&DurableJobInput {
        name: J::NAME.to_string(),
        payload,
    }))
}

/// The hash a job run's input is recorded and compared under: that of the
/// input with the job's canonical encoding as its payload, so equal jobs
/// compare equal whatever order their maps and sets iterate in. For a job
/// without maps and sets it is the SHA-256 of [`job_input`]'s bytes.
fn job_input_hash<J: Job>(job: &J) -> Result<Vec<u8>> {
    input_hash_as(J::NAME, job)
}

/// [`job_input_hash`] of `job` stored under the type name `name`.
fn input_hash_as<J: Job>(name: &str, job: &J) -> Result<Vec<u8>> {
    let canonical = durable::encode(&DurableJobInput {
        name: name.to_string(),
        payload: canonical::to_vec(job)?,
    });
    Ok(sha256(&canonical).to_vec())
}

/// The [`job_input_hash`] of a stored job input (a job group's manifest
/// member): decoded as a `J` and hashed canonically, so a manifest written
/// with one map order matches a submission with another.
///
/// # Errors
/// [`Error::Deserialization`] when the input is not a `J`.
fn stored_job_input_hash<J: Job>(input: &[u8]) -> Result<Vec<u8>> {
    let stored: DurableJobInput = durable::decode(input)?;
    let job: J = durable::decode(&stored.payload)?;
    input_hash_as(&stored.name, &job)
}

/// The [`Job::max_attempts`] of the job a stored job input (a job group's
/// manifest member) holds.
///
/// # Errors
/// [`Error::Deserialization`] when the input is not a `J`.
fn stored_job_attempts<J: Job>(input: &[u8]) -> Result<Option<u32>> {
    let stored: DurableJobInput = durable::decode(input)?;
    Ok(durable::decode::<J>(&stored.payload)?.max_attempts())
}

/// Job `id`'s result from its termination and recorded outcome; `None`
/// when a success has no recorded output (removed by retention).
///
/// # Errors
/// [`Error::Deserialization`] naming the job, its type and the output type
/// when the recorded output does not decode as `J::Output` (a deploy that
/// changed the output type while the job ran).
fn job_result<J: Job>(
    id: &RunId,
    termination: &RunTermination,
    outcome: Option<&RunOutcome>,
) -> Result<Option<std::result::Result<J::Output, JobError>>> {
    match termination.status {
        TerminalStatus::Succeeded => match outcome.and_then(|o| o.result.as_deref()) {
            Some(bytes) => match rmp_serde::from_slice(bytes) {
                Ok(output) => Ok(Some(Ok(output))),
                Err(err) => Err(Error::Deserialization(rmp_serde::decode::Error::Syntax(
                    format!(
                        "the recorded output of job `{id}` ({}) is not a `{}`: {err}",
                        J::NAME,
                        std::any::type_name::<J::Output>()
                    ),
                ))),
            },
            None => Ok(None),
        },
        TerminalStatus::Failed | TerminalStatus::Cancelled => Ok(Some(Err(JobError {
            kind: termination.error_kind.unwrap_or(StepErrorKind::Transient),
            message: termination
                .error
                .clone()
                .unwrap_or_else(|| format!("job {}", termination.status)),
        }))),
    }
}

impl JobRunner {
    /// Start building a runner over `queue`, with memos and results in
    /// `object_store`.
    pub fn builder(
        queue: impl Into<Arc<Queue>>,
        object_store: Arc<dyn ObjectStore>,
    ) -> JobRunnerBuilder {
        JobRunnerBuilder {
            queue: queue.into(),
            object_store,
            handlers: HashMap::new(),
            state: StateMap::default(),
            queue_name: DEFAULT_JOB_QUEUE.to_string(),
            memo_prefix: None,
            max_concurrent_jobs: None,
            poll_interval: None,
            retention: None,
            group_retention: None,
            clock: None,
        }
    }

    /// Submit `job` with default options.
    ///
    /// # Cancel safety
    ///
    /// As [`submit_with`](Self::submit_with).
    ///
    /// # Errors
    /// As [`submit_with`](Self::submit_with).
    pub async fn submit<J: Job>(&self, job: J) -> Result<JobHandle<J>> {
        self.submit_with(job, RunOptions::default()).await
    }

    /// Submit `job` with `options` (headers, priority, attempts, start
    /// time). [`Job::max_attempts`] applies when `options` sets none.
    ///
    /// # Cancel safety
    ///
    /// The commit runs on a task of its own
    /// ([cancel safety](crate#cancel-safety)): an unkeyed job without a
    /// concurrency key joins the group commit of fresh submissions, whose
    /// task has it before the first await; any other submission runs on a
    /// task of its own. Dropped at any await, the job was never committed,
    /// or it is committed and runs as if awaited; submitting a keyed job
    /// again answers with the job the dropped call committed (an unkeyed
    /// one has no id to find it by).
    ///
    /// # Errors
    /// [`Error::InputMismatch`] when the job's idempotency key names a job
    /// (running or recorded) with a different payload;
    /// [`Error::Serialization`]; the errors of
    /// [`WorkflowRuntime::submit`].
    pub async fn submit_with<J: Job>(
        &self,
        job: J,
        mut options: RunOptions,
    ) -> Result<JobHandle<J>> {
        let input = job_input(&job)?;
        let input_hash = job_input_hash(&job)?;
        options.max_attempts_per_step = options.max_attempts_per_step.or(job.max_attempts());
        if options.concurrency_key.is_none()
            && let Some(key) = job.concurrency_key()
        {
            options.concurrency_key = Some(key);
            options.concurrency_limit = options.concurrency_limit.or(Some(job.concurrency_limit()));
        }
        let key = job.idempotency_key();
        let run_id = key.as_ref().map(|key| RunId::digest(&[key.as_bytes()]));
        // A keyed job that terminated is answered by its record; the check
        // shares the submission's retry loop, so a job terminating while it
        // is submitted again does not run twice.
        let on_terminated = match key {
            Some(key) => OnTerminated::Keep(key),
            None => OnTerminated::Restart,
        };
        let spec = RunSpec {
            run_id,
            input,
            options,
            ..Default::default()
        };
        let core = self.runtime.inner.core.clone();
        // The job's run id, known before its submission: the key's digest,
        // else drawn here (before the first await, so ids follow the order
        // of the calls).
        let drawn = spec.run_id.is_none().then(|| core.new_run_id());
        let watched = spec.run_id.clone().or_else(|| drawn.clone());
        // Watched from before the submission commits: a handle awaited
        // after its job ended takes the end the terminating commit reported
        // (the outcome with it) without reading the job's records and its
        // result record back, and a handle awaited before that, of a job
        // this submission started, waits for that report without a first
        // read (see `JobHandle::join`).
        let watch = watched.as_ref().map(|id| core.run_watchers.watch(id));
        let span = crate::telemetry::spans::submit(&core.queue_name, spec.run_id.as_deref());
        let recorded = span.clone();
        let handed_over = RuntimeCore::joins_group_commit(&spec);
        let outcome = detached_unless_handed_over(
            handed_over,
            crate::telemetry::spans::within(span, async move {
                let submitted = core
                    .submit_hashed(spec, input_hash, on_terminated, drawn)
                    .await;
                crate::telemetry::spans::submitted(&recorded, &submitted);
                submitted
            }),
        )
        .await?;
        let handle = self.handle(outcome.run_id, outcome.newly_submitted);
        if watched.as_ref() == Some(&handle.id) {
            *handle.lock_early() = watch;
        }
        Ok(handle)
    }

    pub(crate) fn handle<J: Job>(&self, id: RunId, newly_submitted: bool) -> JobHandle<J> {
        JobHandle {
            runtime: self.runtime.clone(),
            id,
            newly_submitted,
            early: Arc::default(),
            job: PhantomData,
        }
    }

    /// The job group `id` of jobs of type `J`.
    pub fn group<J: Job>(&self, id: RunId) -> JobGroup<J> {
        JobGroup {
            group: self.runtime.group(id),
            job: PhantomData,
        }
    }

    /// A job group with a fresh ULID id.
    pub fn new_group<J: Job>(&self) -> JobGroup<J> {
        JobGroup {
            group: self.runtime.new_group(),
            job: PhantomData,
        }
    }

    /// The read-only view of the runner's jobs (each job is a run of one
    /// step): status, outcomes, listings, history; see
    /// [`WorkflowView`](crate::WorkflowView).
    pub fn view(&self) -> &crate::view::WorkflowView {
        self.runtime.view()
    }

    /// Spawn the worker loop; see [`WorkflowRuntime::spawn`].
    pub fn spawn<F>(&self, shutdown: F) -> RunnerHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.runtime.spawn(shutdown)
    }
}

/// A submitted job. Await it (`handle.await`) for its output, or use
/// [`join`](Self::join) / [`fetch_result`](Self::fetch_result). Cheap to
/// clone.
pub struct JobHandle<J: Job> {
    runtime: JobRuntime,
    id: RunId,
    newly_submitted: bool,
    /// The job's termination watched since before its submission
    /// committed (the first join of the handle or a clone takes it);
    /// dropped with the last clone.
    early: Arc<std::sync::Mutex<Option<RunWatch>>>,
    job: PhantomData<fn() -> J>,
}

impl<J: Job> Clone for JobHandle<J> {
    fn clone(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            id: self.id.clone(),
            newly_submitted: self.newly_submitted,
            early: self.early.clone(),
            job: PhantomData,
        }
    }
}

impl<J: Job> fmt::Debug for JobHandle<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobHandle")
            .field("job", &J::NAME)
            .field("id", &self.id)
            .field("newly_submitted", &self.newly_submitted)
            .finish()
    }
}

impl<J: Job> JobHandle<J> {
    /// The job's id (its run id).
    pub fn id(&self) -> &RunId {
        &self.id
    }

    /// `false` when the submission matched a job already running or
    /// recorded under the same idempotency key.
    pub fn newly_submitted(&self) -> bool {
        self.newly_submitted
    }

    /// The job's run status, as [`WorkflowRuntime::status`] reports it:
    /// a termination whose commit this process still waits to flush is
    /// reported once that commit did.
    ///
    /// # Errors
    /// Storage errors; the store-closed error once another process opened
    /// the store.
    pub async fn status(&self) -> Result<Option<RunStatus>> {
        self.runtime.status(&self.id).await
    }

    /// The recorded result, read from the store (works after a restart);
    /// `Ok(None)` while the job runs, for an unknown job and after
    /// retention removed the record.
    ///
    /// Reports only durable ends, as [`WorkflowRuntime::outcome`] does:
    /// while this process's commit that ends the job waits for its WAL
    /// flush (a crash would lose it, and the job would run again), the
    /// read is held until that commit reports, at most a flush later on a
    /// healthy store. Read-only: dropping the future at any await is safe.
    ///
    /// # Errors
    /// Storage errors; [`Error::Deserialization`] when the output does not
    /// decode as `J::Output`; the store-closed error once another process
    /// opened the store.
    pub async fn fetch_result(&self) -> Result<Option<std::result::Result<J::Output, JobError>>> {
        let core = &self.runtime.inner.core;
        let view = &core.view;
        let read = || async {
            if view.current_step_if_active(&self.id).await?.is_some() {
                return Ok(None);
            }
            let Some(termination) = view.terminal_record(&self.id).await? else {
                return Ok(None);
            };
            let outcome = view.run_result_of(&self.id, &termination).await?;
            Ok(Some((termination, outcome)))
        };
        match core.durable_read(&self.id, read, Option::is_some).await? {
            Some((termination, outcome)) => {
                job_result::<J>(&self.id, &termination.into(), outcome.as_ref())
            }
            None => Ok(None),
        }
    }

    /// Wait in-process until the job terminates; its output or failure.
    ///
    /// # Errors
    /// [`Error::RunNotFound`] for a job whose records are gone; storage and
    /// decoding errors.
    pub async fn join(&self) -> Result<std::result::Result<J::Output, JobError>> {
        let early = self.lock_early().take();
        let end = match early {
            Some(mut watch) => match watch.try_ended() {
                // An end the watch already holds is taken with two key
                // reads (that it is still the job's end) instead of the
                // result record's.
                Some(end) => self.still_the_end(end).await?,
                // Watched since before the submission that started the job
                // committed, and not ended here since: the wait takes the
                // end this watch is told, looking at the job's records
                // only after a poll interval (for an end committed by
                // another process, or a dead letter to reconcile).
                None if self.newly_submitted => {
                    return Self::from_end(
                        &self.id,
                        self.runtime
                            .inner
                            .core
                            .wait_run_watched(&self.id, watch)
                            .await?,
                    );
                }
                None => None,
            },
            None => None,
        };
        let end = match end {
            Some(end) => end,
            // The wait watches the job from before its one read of the
            // pointer, and takes the end its own watch is told without
            // reading again.
            None => self.runtime.wait(&self.id).await?,
        };
        Self::from_end(&self.id, end)
    }

    /// `end`, watched earlier, if it is still the job's end: it is not
    /// active again (a requeue), its terminal record describes that
    /// termination (status, error, final step, time: not a later one's,
    /// nor gone to retention), and its outcome is still what this process
    /// keeps of its lately ended runs (`None` once
    /// [`MemoStore::clear_memos_for_run`](crate::MemoStore::clear_memos_for_run)
    /// removed its result record, or once it is no longer kept: the caller
    /// then reads the store).
    async fn still_the_end(&self, end: RunEnd) -> Result<Option<RunEnd>> {
        let view = self.runtime.view();
        if view.current_step_if_active(&self.id).await?.is_some() {
            return Ok(None);
        }
        let Some(recorded) = view.terminal_record(&self.id).await? else {
            return Ok(None);
        };
        if RunTermination::from(recorded.clone()) != end.termination {
            return Ok(None);
        }
        if end.outcome.is_none() {
            return Ok(Some(end));
        }
        let kept = self
            .runtime
            .inner
            .core
            .recent_ends
            .outcome_of(&self.id, &recorded);
        Ok(kept.map(|outcome| RunEnd {
            termination: end.termination,
            outcome: Some(outcome),
        }))
    }

    /// The watch taken by the first join (a poisoned lock only guards an
    /// `Option` swap, never left half-done).
    fn lock_early(&self) -> std::sync::MutexGuard<'_, Option<RunWatch>> {
        self.early
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn from_end(id: &RunId, end: RunEnd) -> Result<std::result::Result<J::Output, JobError>> {
        job_result::<J>(id, &end.termination, end.outcome.as_ref())?
            .ok_or_else(|| Error::RunNotFound(id.clone()))
    }

    /// [`join`](Self::join) bounded by `timeout`; `Ok(None)` when the job
    /// has not terminated by then (the timeout bounds the waiting, as
    /// [`WorkflowRuntime::wait_timeout`](crate::WorkflowRuntime::wait_timeout)'s
    /// does: an ended job is reported even with a zero timeout).
    ///
    /// # Errors
    /// As [`join`](Self::join).
    pub async fn join_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<std::result::Result<J::Output, JobError>>> {
        match self.runtime.wait_timeout(&self.id, timeout).await? {
            Some(end) => Self::from_end(&self.id, end).map(Some),
            None => Ok(None),
        }
    }
}

impl<J: Job> IntoFuture for JobHandle<J> {
    type Output = std::result::Result<J::Output, JoinError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            match self.join().await {
                Ok(Ok(output)) => Ok(output),
                Ok(Err(failure)) => Err(JoinError::Job(failure)),
                Err(err) => Err(JoinError::Infra(err)),
            }
        })
    }
}

/// One member's result in a [`JobGroup`].
pub struct GroupResult<J: Job> {
    /// The member's key (its idempotency key, or `item-{i}`).
    pub key: String,
    /// Its output or failure.
    pub result: std::result::Result<J::Output, JobError>,
}

impl<J: Job + fmt::Debug> fmt::Debug for GroupResult<J>
where
    J::Output: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupResult")
            .field("key", &self.key)
            .field("result", &self.result)
            .finish()
    }
}

/// A [`RunGroup`] of jobs of one type, from [`JobRunner::group`]. Members
/// are keyed by their idempotency key, else `item-{i}` by position.
pub struct JobGroup<J: Job> {
    group: RunGroup,
    job: PhantomData<fn() -> J>,
}

impl<J: Job> Clone for JobGroup<J> {
    fn clone(&self) -> Self {
        Self {
            group: self.group.clone(),
            job: PhantomData,
        }
    }
}

impl<J: Job> fmt::Debug for JobGroup<J> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobGroup")
            .field("job", &J::NAME)
            .field("id", self.group.id())
            .finish()
    }
}

impl<J: Job> JobGroup<J> {
    /// The group id.
    pub fn id(&self) -> &RunId {
        self.group.id()
    }

    /// Submit `jobs` as the group's members; see [`RunGroup::submit`]. A
    /// job's input is compared by its canonical encoding (as
    /// [`JobRunner::submit`] compares it), so the same jobs submitted again
    /// are the same set, and a member's active or recorded run the same
    /// input, whatever order their maps and sets iterate in.
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::submit`]: dropped, it submitted
    /// nothing or submits every member.
    ///
    /// # Errors
    /// As [`RunGroup::submit`], plus encoding errors.
    pub async fn submit(&self, jobs: impl IntoIterator<Item = J>) -> Result<()> {
        self.submit_with(jobs, RunOptions::default()).await
    }

    /// [`submit`](Self::submit) with `options` for every member (the first
    /// job's [`Job::max_attempts`] applies when `options` sets none).
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::submit`].
    ///
    /// # Errors
    /// As [`RunGroup::submit`], plus encoding errors;
    /// [`Error::InvalidRunOptions`] for a job with a
    /// [`concurrency_key`](Job::concurrency_key).
    pub async fn submit_with(
        &self,
        jobs: impl IntoIterator<Item = J>,
        mut options: RunOptions,
    ) -> Result<()> {
        let mut members = Vec::new();
        for (i, job) in jobs.into_iter().enumerate() {
            if i == 0 {
                options.max_attempts_per_step =
                    options.max_attempts_per_step.or(job.max_attempts());
            }
            if let Some(key) = job.concurrency_key() {
                return Err(Error::InvalidRunOptions(format!(
                    "job {i} of the group has concurrency key {key:?}: group members do not take concurrency keys; submit it alone"
                )));
            }
            members.push(HashedMember {
                member: GroupMember {
                    key: job.idempotency_key().unwrap_or_else(|| format!("item-{i}")),
                    input: job_input(&job)?,
                },
                input_hash: job_input_hash(&job)?,
            });
        }
        self.group
            .submit_hashed(members, &options, stored_job_input_hash::<J>)
            .await
    }

    /// Run again the members that did not succeed; see [`RunGroup::resume`].
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::resume`].
    ///
    /// # Errors
    /// As [`RunGroup::resume`]; [`Error::Deserialization`] when a stored
    /// member is not a `J` (its input hash is that of the decoded job).
    pub async fn resume(&self) -> Result<()> {
        self.resume_with(RunOptions::default()).await
    }

    /// [`resume`](Self::resume) with `options` for every member run again
    /// (the first member's [`Job::max_attempts`] applies when `options`
    /// sets none, as at [`submit_with`](Self::submit_with)).
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::resume`].
    ///
    /// # Errors
    /// As [`resume`](Self::resume).
    pub async fn resume_with(&self, options: RunOptions) -> Result<()> {
        self.group
            .resume_hashed(
                &options,
                stored_job_input_hash::<J>,
                Some(stored_job_attempts::<J>),
            )
            .await
    }

    /// Each member's typed result as it terminates; see
    /// [`RunGroup::results`].
    ///
    /// # Errors
    /// As [`RunGroup::results`]; in the stream, decoding errors of outputs.
    pub async fn results(&self) -> Result<impl Stream<Item = Result<GroupResult<J>>> + use<J>> {
        let results = self.group.results().await?;
        Ok(results.map(|member| member.and_then(typed_member::<J>)))
    }

    /// Every member's result, in submission order, once all terminated.
    ///
    /// # Errors
    /// As [`results`](Self::results).
    pub async fn join(&self) -> Result<Vec<GroupResult<J>>> {
        let order: HashMap<String, usize> = self
            .group
            .manifest()
            .await?
            .members
            .into_iter()
            .enumerate()
            .map(|(i, member)| (member.key, i))
            .collect();
        let mut results: Vec<GroupResult<J>> = self.results().await?.try_collect().await?;
        results.sort_by_key(|result| order.get(&result.key).copied().unwrap_or(usize::MAX));
        Ok(results)
    }

    /// Member counts; see [`RunGroup::status`].
    ///
    /// # Errors
    /// As [`RunGroup::status`].
    pub async fn status(&self) -> Result<GroupStatus> {
        self.group.status().await
    }

    /// Cancel the active members; see [`RunGroup::cancel`].
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::cancel`].
    ///
    /// # Errors
    /// As [`RunGroup::cancel`].
    pub async fn cancel(&self) -> Result<usize> {
        self.group.cancel().await
    }

    /// Remove the group's state; see [`RunGroup::forget`].
    ///
    /// # Cancel safety
    ///
    /// As [`RunGroup::forget`].
    ///
    /// # Errors
    /// As [`RunGroup::forget`].
    pub async fn forget(&self) -> Result<()> {
        self.group.forget().await
    }
}

fn typed_member<J: Job>(member: MemberResult) -> Result<GroupResult<J>> {
    let result = job_result::<J>(&member.run_id, &member.termination, member.outcome.as_ref())?
        .ok_or_else(|| Error::RunNotFound(member.run_id.clone()))?;
    Ok(GroupResult {
        key: member.key,
        result,
    })
}
