//! Typed workflows: the surface `#[workflow]` implements.
//!
//! A workflow is a state machine whose states are its steps. With the
//! `macros` feature (on by default) one annotation on an impl block makes
//! each `#[step]` async fn a step:
//!
//! ```ignore
//! use std::time::Duration;
//! use taquba_workflow::workflows::{StepContext, Transition};
//! use taquba_workflow::{StepError, workflow};
//!
//! #[derive(Default)]
//! pub struct Order;
//!
//! #[workflow(name = "order", output = String, vis = pub)]
//! impl Order {
//!     /// Charges the card once, even if the step is retried.
//!     #[step(start)]
//!     async fn charge(ctx: StepContext<'_>, order_id: String, cents: u64) -> Result<Transition<OrderStep>, StepError> {
//!         let receipt: String = ctx.memo.memoized("charge", async { Ok::<_, StepError>(format!("paid {cents}")) }).await?;
//!         // Wait up to a day for the warehouse to confirm.
//!         Ok(Transition::on_signal(
//!             OrderStep::Ship { order_id: order_id.clone(), receipt },
//!             format!("shipped:{order_id}"),
//!             Duration::from_secs(24 * 3600),
//!         ))
//!     }
//!
//!     #[step]
//!     async fn ship(ctx: StepContext<'_>, order_id: String, receipt: String) -> Result<Transition<OrderStep>, StepError> {
//!         match ctx.signal_value::<String>()? {
//!             Some(tracking) => Ok(Transition::done(format!("{order_id}: {receipt}, {tracking}"))),
//!             None => Ok(Transition::fail("the warehouse never confirmed")),
//!         }
//!     }
//! }
//!
//! // One runtime for this workflow (`Order` is the runner) ...
//! let runtime = WorkflowRuntime::builder(queue, store, Order, NoopTerminalHook).build();
//! // ... or for every `#[workflow]` in the binary.
//! let runtime = WorkflowRuntime::builder(queue, store, Workflows::registered(), NoopTerminalHook).build();
//!
//! let run = runtime.start(OrderInput { order_id: "o-1".into(), cents: 500 }).await?;
//! runtime.signal_value("shipped:o-1", &"track-9").await?;
//! let summary: String = run.wait().await??;
//! ```
//!
//! `#[workflow]` generates:
//!
//! - the step enum (`OrderStep`, or `step_enum = Name`): one variant per
//!   step whose fields are the step's parameters (a reference parameter
//!   such as `&str` is stored owned and lent back), serialized as
//!   MessagePack under the step's stable name (the fn name, or
//!   `#[step(name = "...")]`), so adding, removing or reordering steps
//!   never misreads a run in flight; a renamed step takes the runs parked
//!   under its old name with `#[step(alias = "old")]`, and a run parked in
//!   a step that no longer exists fails once with a permanent error naming
//!   the workflow, the step and the run;
//! - the input struct (`OrderInput`, or `input = Name`): the parameters
//!   of the `#[step(start)]` step, submitted with
//!   [`WorkflowRuntime::start`];
//! - `impl` [`Workflow`] and `impl` [`StepRunner`]: decode the payload,
//!   dispatch to the step fn, encode the [`Transition`] it returns; say the
//!   code's version and patches ([`Workflow::VERSION`],
//!   [`Workflow::PATCHES`], from `#[workflow(version = "...", patches =
//!   [...])]`, the crate's version by default) through
//!   [`StepRunner::code`], so a run records the version it started on and
//!   each step the version it ran on, and `ctx.patched("id")?` branches on
//!   whether the run started on code declaring the patch
//!   ([`versioning`](crate::versioning));
//! - a registration entry, so [`Workflows::registered`] hosts every
//!   workflow linked into the binary.
//!
//! A step fn takes `&self` or no receiver, an optional [`StepContext`] in
//! any position, by value or by reference (the [`Step`] and its
//! [`Delivery`](crate::Delivery), with a
//! [`StepContext::memo`] namespaced by step name) and its fields, and
//! returns `Result<Transition<OrderStep>, E>` (the generated step enum;
//! any name of `Result` works, such as `anyhow::Result<Transition<_>>`):
//! an `Err` is a step error (transient: retried; permanent:
//! dead-lettered), converted with `Into<StepError>` when `E` has it (so a
//! [`StepError`] keeps its kind), else from its `Display` as a transient
//! error; a [`Transition`] moves the run on.
//!
//! A payload names its workflow and its step. A step whose name the
//! workflow does not know (a run written by another version of the code)
//! fails the run permanently with an error naming the workflow and the
//! step, as does a step of another workflow reaching a runtime that does
//! not host it.

use std::collections::BTreeMap;
use std::fmt;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

mod children;
pub(crate) mod envelope;
pub(crate) mod registry;

use crate::run::context::failure;
use crate::{
    Error, Memo, Result, RunEnd, RunId, RunOptions, RunOutcome, RunSpec, RunState, RunStatus,
    SignalOutcome, Step, StepError, StepErrorKind, StepOutcome, StepRunner, TerminalHook,
    TerminalStatus, Trigger, WorkflowRuntime,
};
pub use children::ChildRun;
use envelope::{EnvelopeHead, EnvelopeIn, EnvelopeOut};
use registry::ErasedWorkflow;

#[cfg(feature = "macros")]
pub use taquba_workflow_macros::step;

/// A typed workflow: its stable name, its steps' names and its output.
/// `#[workflow]` implements it and [`StepRunner`] (decode the payload,
/// call the step fn, encode its [`Transition`]) on the annotated type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a workflow",
    label = "`{Self}` has no `#[workflow]` impl block",
    note = "put `#[workflow]` on an `impl {Self} {{ ... }}` block whose `#[step]` async fns are the steps"
)]
pub trait Workflow: StepRunner + Sized + 'static {
    /// The workflow's stable name, stored in every payload.
    const NAME: &'static str;
    /// The name of the step runs begin with.
    const START: &'static str;
    /// The names of every step, in declaration order.
    const STEPS: &'static [&'static str];
    /// Earlier names of steps (`#[step(alias = "...")]`), as `(alias,
    /// step name)`: a run parked under an alias resumes in the step. None
    /// by default.
    const ALIASES: &'static [(&'static str, &'static str)] = &[];
    /// The code's version (`#[workflow(version = "...")]`, by default the
    /// crate's `CARGO_PKG_VERSION`), recorded with every run it submits and
    /// every step it settles (see [`versioning`](crate::versioning)).
    /// `None` by default.
    const VERSION: Option<&'static str> = None;
    /// The patches the code declares (`#[workflow(patches = ["..."])]`),
    /// recorded with every run it submits: what
    /// [`Delivery::patched`](crate::Delivery::patched) answers from (see
    /// [`versioning`](crate::versioning)). None by default.
    const PATCHES: &'static [&'static str] = &[];
    /// What a run that succeeds returns ([`Transition::done`]): any
    /// `Serialize + DeserializeOwned + Send + 'static` type (see
    /// [`WorkflowOutput`]).
    type Output: WorkflowOutput;
}

/// What the output of a workflow must be: every `Serialize +
/// DeserializeOwned + Send + 'static` type is one (a blanket impl), as the
/// output is stored as MessagePack for whoever waits on the run.
///
/// [`Workflow::Output`] is bounded by this one trait, which names serde
/// only in its impl, so an output type that is not serializable is one
/// error, with the message below, at `#[workflow(output = ...)]` (serde
/// bounds on the associated type would each be checked, and reported,
/// apart). Generic code that serializes a `W::Output` some other way
/// states `W::Output: Serialize` itself.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the output of a `#[workflow]`",
    label = "a workflow's output must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "the output is stored as MessagePack for the caller: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait WorkflowOutput: Sized + Send + 'static {
    /// The output as MessagePack (named fields): the result a run that
    /// succeeds records.
    ///
    /// # Errors
    /// The encoder's, when the value's `Serialize` impl fails.
    fn to_msgpack(&self) -> std::result::Result<Vec<u8>, rmp_serde::encode::Error>;

    /// The output from the result a run recorded.
    ///
    /// # Errors
    /// The decoder's, when `bytes` are not this type's MessagePack.
    fn from_msgpack(bytes: &[u8]) -> std::result::Result<Self, rmp_serde::decode::Error>;
}

#[diagnostic::do_not_recommend]
impl<T: Serialize + DeserializeOwned + Send + 'static> WorkflowOutput for T {
    fn to_msgpack(&self) -> std::result::Result<Vec<u8>, rmp_serde::encode::Error> {
        rmp_serde::to_vec_named(self)
    }

    fn from_msgpack(bytes: &[u8]) -> std::result::Result<Self, rmp_serde::decode::Error> {
        rmp_serde::from_slice(bytes)
    }
}

/// The step enum of a workflow (the generated `{Type}Step`): one variant
/// per step, stored under the step's name.
///
/// The enum names its workflow (and not the other way round), so the
/// generated types may be less visible than the workflow type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the step enum of a workflow",
    label = "expected the step enum `#[workflow]` generates (such as `OrderStep`)",
    note = "a step fn returns `Result<Transition<OrderStep>, E>`, where `OrderStep` is the step enum of the workflow `Order`"
)]
pub trait WorkflowStep: Serialize + DeserializeOwned + Send + 'static {
    /// The workflow.
    type Workflow: Workflow;

    /// The stable name of this step.
    fn name(&self) -> &'static str;
}

/// The output of the workflow of step enum `S`.
pub type OutputOf<S> = <<S as WorkflowStep>::Workflow as Workflow>::Output;

/// The input of a workflow's start step (the generated `{Type}Input`
/// struct), which names its workflow so [`WorkflowRuntime::start`] needs
/// no type annotation.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the input of a workflow",
    label = "expected the input struct `#[workflow]` generates (such as `OrderInput`)",
    note = "`#[workflow]` generates `{{Type}}Input` with the fields of the `#[step(start)]` fn"
)]
pub trait WorkflowInput: Into<Self::Step> + Send + 'static {
    /// The step enum of the workflow this input starts.
    type Step: WorkflowStep;
}

/// The workflow input `I` starts.
pub type WorkflowOf<I> = <<I as WorkflowInput>::Step as WorkflowStep>::Workflow;

/// What a step decides: the next step (now, after a delay, or on a
/// signal), or the end of the run (done with the output, failed,
/// cancelled).
///
/// `S` is the step enum of the workflow (`Transition<OrderStep>`). The
/// type itself puts no bound on `S`, nor do the constructors that take no
/// output: [`done`](Self::done) and [`into_outcome`](Self::into_outcome)
/// need the step enum, and the generated dispatch checks that a step fn
/// returns its own workflow's. (So a type of yours that shadows the
/// generated step enum's name is reported once, by `#[workflow]`, not
/// again at every `Transition<...>` of the step fns.)
#[must_use = "a transition does nothing until the step returns it"]
pub struct Transition<S> {
    kind: TransitionKind<S>,
}

enum TransitionKind<S> {
    Continue {
        step: S,
        when: Trigger,
    },
    /// The output as MessagePack, encoded by [`Transition::done`]: the
    /// result a run records is these bytes anyway, and holding them
    /// (rather than the value) keeps the type free of a bound on `S`.
    Done(std::result::Result<Vec<u8>, rmp_serde::encode::Error>),
    Fail(String),
    Cancel(String),
}

impl<S> Transition<S> {
    /// Run `step` next, as soon as a worker claims it.
    pub fn next(step: S) -> Self {
        Self::continue_with(step, Trigger::Immediate)
    }

    /// Run `step` next, once `delay` has passed (a durable timer: no worker
    /// is held while it runs, and it survives restarts).
    pub fn after(step: S, delay: Duration) -> Self {
        Self::continue_with(step, Trigger::After(delay))
    }

    /// Run `step` next when a signal arrives under `correlation_key`
    /// ([`WorkflowRuntime::signal`], [`WorkflowRuntime::signal_value`]), or
    /// when `timeout` passes without one. The step reads the signal through
    /// [`StepContext::signal_value`] (`None` after a timeout).
    pub fn on_signal(step: S, correlation_key: impl Into<String>, timeout: Duration) -> Self {
        Self::continue_with(
            step,
            Trigger::OnSignal {
                correlation_key: correlation_key.into(),
                timeout,
            },
        )
    }

    /// Run `step` next with an explicit [`Trigger`].
    pub fn continue_with(step: S, when: Trigger) -> Self {
        Self {
            kind: TransitionKind::Continue { step, when },
        }
    }

    /// End the run as failed (a verdict: nothing is retried or
    /// dead-lettered).
    pub fn fail(reason: impl Into<String>) -> Self {
        Self {
            kind: TransitionKind::Fail(reason.into()),
        }
    }

    /// End the run as cancelled.
    pub fn cancel(reason: impl Into<String>) -> Self {
        Self {
            kind: TransitionKind::Cancel(reason.into()),
        }
    }
}

impl<S: WorkflowStep> Transition<S> {
    /// End the run successfully with `output` (the workflow's
    /// `output = Type`), encoded as MessagePack (named fields) here; an
    /// output that cannot be encoded is reported by
    /// [`into_outcome`](Self::into_outcome).
    pub fn done(output: OutputOf<S>) -> Self {
        Self {
            kind: TransitionKind::Done(output.to_msgpack()),
        }
    }

    /// The untyped outcome: the next step's payload encoded, or the output
    /// encoded.
    ///
    /// # Errors
    /// A permanent [`StepError`] when the next step or the output cannot be
    /// encoded as MessagePack.
    pub fn into_outcome(self) -> std::result::Result<StepOutcome, StepError> {
        match self.kind {
            TransitionKind::Continue { step, when } => {
                let name = step.name();
                let payload = encode_step(&step).map_err(|e| {
                    failure(format_args!(
                        "workflow `{}`: cannot encode the parameters of step `{name}`: {e}",
                        S::Workflow::NAME
                    ))
                })?;
                Ok(StepOutcome::Continue { payload, when })
            }
            TransitionKind::Done(encoded) => {
                let result = encoded.map_err(|e| {
                    failure(format_args!(
                        "workflow `{}`: cannot encode the output: {e}",
                        S::Workflow::NAME
                    ))
                })?;
                Ok(StepOutcome::Succeed { result })
            }
            TransitionKind::Fail(reason) => Ok(StepOutcome::Fail { reason }),
            TransitionKind::Cancel(reason) => Ok(StepOutcome::Cancel { reason }),
        }
    }
}

/// The output of a `done` transition shows as its encoded size (it is
/// held encoded).
impl<S: fmt::Debug> fmt::Debug for Transition<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            TransitionKind::Continue { step, when } => f
                .debug_struct("Continue")
                .field("step", step)
                .field("when", when)
                .finish(),
            TransitionKind::Done(Ok(bytes)) => f
                .debug_tuple("Done")
                .field(&format_args!("<MessagePack, len {}>", bytes.len()))
                .finish(),
            TransitionKind::Done(Err(e)) => f
                .debug_tuple("Done")
                .field(&format_args!("<cannot be encoded: {e}>"))
                .finish(),
            TransitionKind::Fail(reason) => f.debug_tuple("Fail").field(reason).finish(),
            TransitionKind::Cancel(reason) => f.debug_tuple("Cancel").field(reason).finish(),
        }
    }
}

/// What a step fn sees of its delivery: dereferences to the [`Step`] (and
/// through it to the [`Delivery`](crate::Delivery): run id, headers,
/// attempts, cancel token, lease, run memo, effects, KV reads, signal),
/// with a [`memo`](Self::memo) namespaced by step name.
pub struct StepContext<'a> {
    /// The step's memo, with keys namespaced by the step's name: a value
    /// memoized by one step is never read by another, even where step
    /// numbers shift. The run-wide memo is `ctx.run_memo`, the raw per-step
    /// memo `ctx.step().memo`.
    pub memo: StepMemo<'a>,
    step: &'a Step,
    workflow: &'static str,
    name: &'static str,
}

impl<'a> StepContext<'a> {
    /// The context of `step`, run as step `name` of `workflow`. Generated
    /// code builds it; tests can too (with [`Step::detached`]).
    pub fn new(step: &'a Step, workflow: &'static str, name: &'static str) -> Self {
        Self {
            memo: StepMemo {
                memo: &step.delivery.memo,
                namespace: name,
            },
            step,
            workflow,
            name,
        }
    }

    /// The raw step.
    pub fn step(&self) -> &'a Step {
        self.step
    }

    /// The stable name of the running step.
    pub fn step_name(&self) -> &'static str {
        self.name
    }

    /// The name of the running workflow.
    pub fn workflow_name(&self) -> &'static str {
        self.workflow
    }

    /// The signal this step was woken by, decoded from MessagePack (as
    /// [`WorkflowRuntime::signal_value`] encodes it): `Ok(None)` when the
    /// previous step's [`Transition::on_signal`] timed out, or when the
    /// step did not follow a signal wait.
    ///
    /// # Errors
    /// A permanent [`StepError`] when the signal does not decode as `T`.
    pub fn signal_value<T: DeserializeOwned>(&self) -> std::result::Result<Option<T>, StepError> {
        let Some(bytes) = &self.step.signal else {
            return Ok(None);
        };
        rmp_serde::from_slice(bytes).map(Some).map_err(|e| {
            failure(format_args!(
                "step `{}` of workflow `{}`: the signal does not decode as `{}`: {e}",
                self.name,
                self.workflow,
                std::any::type_name::<T>()
            ))
        })
    }
}

impl Deref for StepContext<'_> {
    type Target = Step;
    fn deref(&self) -> &Step {
        self.step
    }
}

impl fmt::Debug for StepContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepContext")
            .field("workflow", &self.workflow)
            .field("step", &self.name)
            .field("run_id", &self.step.run_id)
            .field("step_number", &self.step.step_number)
            .finish()
    }
}

/// A step's [`Memo`] with every key prefixed by the step's name
/// (`"{step}/{key}"`).
#[derive(Clone, Copy)]
pub struct StepMemo<'a> {
    memo: &'a Memo,
    namespace: &'static str,
}

impl<'a> StepMemo<'a> {
    /// The key `key` is stored under.
    pub fn key(&self, key: &str) -> String {
        format!("{}/{key}", self.namespace)
    }

    /// The memo without the namespace.
    pub fn raw(&self) -> &'a Memo {
        self.memo
    }

    /// See [`Memo::get`].
    ///
    /// # Errors
    /// As [`Memo::get`].
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.memo.get(&self.key(key)).await
    }

    /// See [`Memo::put`] (and its cancel safety).
    ///
    /// # Errors
    /// As [`Memo::put`].
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.memo.put(&self.key(key), value).await
    }

    /// See [`Memo::memoized`]: the value recorded under `key` by this step,
    /// or else `compute`'s, recorded. Cancel safety: as [`Memo::memoized`].
    ///
    /// # Errors
    /// As [`Memo::memoized`].
    pub async fn memoized<R, F, E>(&self, key: &str, compute: F) -> std::result::Result<R, E>
    where
        R: Serialize + DeserializeOwned,
        F: Future<Output = std::result::Result<R, E>>,
        E: From<Error>,
    {
        self.memo.memoized(&self.key(key), compute).await
    }

    /// See [`Memo::memoized_by_content`], under this step's namespace.
    ///
    /// # Errors
    /// As [`Memo::memoized_by_content`].
    pub async fn memoized_by_content<K, R, F, E>(
        &self,
        input: &K,
        compute: F,
    ) -> std::result::Result<R, E>
    where
        K: Serialize + ?Sized,
        R: Serialize + DeserializeOwned,
        F: Future<Output = std::result::Result<R, E>>,
        E: From<Error>,
    {
        let key = Memo::content_key(input)?;
        self.memoized(&key, compute).await
    }
}

impl fmt::Debug for StepMemo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepMemo")
            .field("namespace", &self.namespace)
            .field("memo", self.memo)
            .finish()
    }
}

/// The payload of `step`: MessagePack (named fields) of
/// `{ workflow: "<workflow name>", step: { "<step name>": { <fields> } } }`.
/// Use it to submit a run through [`WorkflowRuntime::submit`] or a
/// [`RunGroup`](crate::RunGroup) directly.
///
/// # Errors
/// [`Error::Serialization`] when a field cannot be encoded.
pub fn encode_step<S: WorkflowStep>(step: &S) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec_named(&EnvelopeOut {
        workflow: S::Workflow::NAME,
        step,
    })?)
}

/// The payload of a run started with `input`: [`encode_step`] of the start
/// step, with the entries of every map and the elements of every `HashSet`
/// written sorted (the canonical encoding), so equal inputs give equal
/// payloads whatever order their maps iterate in, and a submission of the
/// same input again is the same input (idempotent on `(run_id, input)`).
/// An input without maps or sets encodes exactly as [`encode_step`] does.
///
/// # Errors
/// [`Error::Serialization`] when a field cannot be encoded.
pub fn encode_input<I: WorkflowInput>(input: I) -> Result<Vec<u8>> {
    let step: I::Step = input.into();
    Ok(crate::store::canonical::to_vec(&EnvelopeOut {
        workflow: <I::Step as WorkflowStep>::Workflow::NAME,
        step: &step,
    })?)
}

/// Decodes a step payload of the workflow of step enum `S`.
///
/// # Errors
/// A permanent [`StepError`] naming the workflow and the step when the
/// payload is not a step of that workflow, names a step it does not have,
/// or its fields do not decode.
pub fn decode_step<S: WorkflowStep>(payload: &[u8]) -> std::result::Result<S, StepError> {
    decode_step_of::<S::Workflow, S>(payload)
}

fn decode_step_of<W: Workflow, S: DeserializeOwned>(
    payload: &[u8],
) -> std::result::Result<S, StepError> {
    let head: EnvelopeHead = rmp_serde::from_slice(payload).map_err(|e| {
        failure(format_args!(
            "workflow `{}`: the step payload is not a `#[workflow]` step: {e}",
            W::NAME
        ))
    })?;
    if head.workflow != W::NAME {
        return Err(failure(format_args!(
            "workflow `{}` received a step of workflow `{}`: host both in one `Workflows` router",
            W::NAME,
            head.workflow
        )));
    }
    let name = head.step.0;
    let known = W::STEPS.contains(&name.as_str())
        || W::ALIASES.iter().any(|(alias, _)| *alias == name.as_str());
    if !known {
        return Err(failure(format_args!(
            "workflow `{}` has no step named `{name}` (its steps are {}): the run was written by another version of the workflow",
            W::NAME,
            list(W::STEPS.iter().copied())
        )));
    }
    let mut decoder = rmp_serde::Deserializer::from_read_ref(payload);
    let envelope: EnvelopeIn<S> =
        serde_path_to_error::deserialize(&mut decoder).map_err(|e| {
            // The path inside the envelope: `step.{variant}.{field}`.
            let field = e
                .path()
                .iter()
                .skip(2)
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(".");
            let what = match field.is_empty() {
                true => String::new(),
                false => format!(" (field `{field}`)"),
            };
            failure(format_args!(
                "workflow `{}`: the parameters of step `{name}` do not decode{what}: {}: the run was written by another version of the workflow",
                W::NAME,
                e.inner()
            ))
        })?;
    Ok(envelope.step)
}

/// Decodes the result of a run of `W` that succeeded.
///
/// # Errors
/// [`Error::Deserialization`] when the bytes are not a `W::Output`.
pub fn decode_output<W: Workflow>(result: &[u8]) -> Result<W::Output> {
    Ok(W::Output::from_msgpack(result)?)
}

fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A run of a workflow that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowError {
    /// The run.
    pub run_id: RunId,
    /// [`TerminalStatus::Failed`] or [`TerminalStatus::Cancelled`].
    pub status: TerminalStatus,
    /// For a failure from a step error or a [`Transition::fail`], its
    /// kind, when recorded.
    pub kind: Option<StepErrorKind>,
    /// The error, the reason of a [`Transition::fail`] or
    /// [`Transition::cancel`]; `None` for an external cancellation.
    pub message: Option<String>,
}

impl fmt::Display for WorkflowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run `{}` {}", self.run_id, self.status)?;
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        Ok(())
    }
}

impl std::error::Error for WorkflowError {}

/// The typed result of a run: the output, or how it did not succeed.
pub type WorkflowResult<W> = std::result::Result<<W as Workflow>::Output, WorkflowError>;

fn missing_result(run_id: &RunId) -> Error {
    Error::Deserialization(rmp_serde::decode::Error::Uncategorized(format!(
        "run `{run_id}` succeeded but its result record is gone (removed by retention?)"
    )))
}

fn from_outcome<W: Workflow>(
    outcome: RunOutcome,
    kind: Option<StepErrorKind>,
) -> Result<WorkflowResult<W>> {
    match outcome.status {
        TerminalStatus::Succeeded => match &outcome.result {
            Some(bytes) => Ok(Ok(decode_output::<W>(bytes)?)),
            None => Err(missing_result(&outcome.run_id)),
        },
        status => Ok(Err(WorkflowError {
            run_id: outcome.run_id,
            status,
            kind,
            message: outcome.error,
        })),
    }
}

pub(crate) fn from_end<W: Workflow>(run_id: &RunId, end: RunEnd) -> Result<WorkflowResult<W>> {
    let kind = end.termination.error_kind;
    match end.outcome {
        Some(outcome) => from_outcome::<W>(outcome, kind),
        None => match end.termination.status {
            TerminalStatus::Succeeded => Err(missing_result(run_id)),
            status => Ok(Err(WorkflowError {
                run_id: run_id.clone(),
                status,
                kind,
                message: end.termination.error,
            })),
        },
    }
}

/// A typed handle on one run of workflow `W` on a runtime; from
/// [`WorkflowRuntime::start`] or [`WorkflowRuntime::workflow_run`]. Awaiting
/// it is [`wait`](Self::wait).
pub struct WorkflowRun<W: Workflow, R, H> {
    runtime: WorkflowRuntime<R, H>,
    run_id: RunId,
    newly_submitted: bool,
    workflow: PhantomData<fn() -> W>,
}

impl<W: Workflow, R, H> Clone for WorkflowRun<W, R, H> {
    fn clone(&self) -> Self {
        Self {
            runtime: self.runtime.clone(),
            run_id: self.run_id.clone(),
            newly_submitted: self.newly_submitted,
            workflow: PhantomData,
        }
    }
}

impl<W: Workflow, R, H> fmt::Debug for WorkflowRun<W, R, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkflowRun")
            .field("workflow", &W::NAME)
            .field("run_id", &self.run_id)
            .field("newly_submitted", &self.newly_submitted)
            .finish()
    }
}

impl<W: Workflow, R: StepRunner, H: TerminalHook> WorkflowRun<W, R, H> {
    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.run_id
    }

    /// `false` when the submission found the run already active with the
    /// same input (nothing was written).
    pub fn newly_submitted(&self) -> bool {
        self.newly_submitted
    }

    /// The run's status ([`WorkflowRuntime::status`]).
    ///
    /// # Errors
    /// As [`WorkflowRuntime::status`].
    pub async fn status(&self) -> Result<Option<RunStatus>> {
        self.runtime.status(&self.run_id).await
    }

    /// The run's typed result from its durable record: `Ok(None)` while it
    /// runs (or when it terminated without a worker, or retention removed
    /// the record). Works from any process over the same store.
    ///
    /// # Errors
    /// Storage errors; [`Error::Deserialization`] when the result is not a
    /// `W::Output`.
    pub async fn outcome(&self) -> Result<Option<WorkflowResult<W>>> {
        let Some(outcome) = self.runtime.outcome(&self.run_id).await? else {
            return Ok(None);
        };
        let kind = if outcome.status == TerminalStatus::Succeeded {
            None
        } else {
            match self.runtime.status(&self.run_id).await? {
                Some(RunStatus {
                    state: RunState::Terminated(termination),
                    ..
                }) => termination.error_kind,
                _ => None,
            }
        };
        from_outcome::<W>(outcome, kind).map(Some)
    }

    /// Waits until the run terminates ([`WorkflowRuntime::wait`]) and
    /// returns its typed result.
    ///
    /// # Errors
    /// As [`WorkflowRuntime::wait`]; [`Error::Deserialization`] when the
    /// result is not a `W::Output`.
    pub async fn wait(&self) -> Result<WorkflowResult<W>> {
        let end = self.runtime.wait(&self.run_id).await?;
        from_end::<W>(&self.run_id, end)
    }

    /// [`wait`](Self::wait) bounded by `timeout`: `Ok(None)` when the run
    /// has not terminated by then (the timeout bounds the waiting, as
    /// [`WorkflowRuntime::wait_timeout`](crate::WorkflowRuntime::wait_timeout)'s
    /// does: an ended run is reported even with a zero timeout).
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub async fn wait_timeout(&self, timeout: Duration) -> Result<Option<WorkflowResult<W>>> {
        match self.runtime.wait_timeout(&self.run_id, timeout).await? {
            Some(end) => from_end::<W>(&self.run_id, end).map(Some),
            None => Ok(None),
        }
    }

    /// Cancels the run ([`WorkflowRuntime::cancel`]).
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::cancel`].
    ///
    /// # Errors
    /// As [`WorkflowRuntime::cancel`].
    pub async fn cancel(&self) -> Result<bool> {
        self.runtime.cancel(&self.run_id).await
    }
}

impl<W, R, H> IntoFuture for WorkflowRun<W, R, H>
where
    W: Workflow,
    R: StepRunner + 'static,
    H: TerminalHook + 'static,
{
    type Output = Result<WorkflowResult<W>>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.wait().await })
    }
}

/// Typed submission of workflow runs.
impl<R: StepRunner, H: TerminalHook> WorkflowRuntime<R, H> {
    /// Starts a run of the workflow `input` belongs to (a generated
    /// `{Type}Input`) under a fresh run id.
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::submit`]: dropped at any
    /// await, the run was never committed, or it is and runs.
    ///
    /// # Errors
    /// As [`WorkflowRuntime::submit`]; [`Error::Serialization`] when a
    /// field cannot be encoded.
    pub async fn start<I: WorkflowInput>(
        &self,
        input: I,
    ) -> Result<WorkflowRun<WorkflowOf<I>, R, H>> {
        self.start_spec(input, RunSpec::default()).await
    }

    /// [`start`](Self::start) with [`RunOptions`].
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::submit`].
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_with<I: WorkflowInput>(
        &self,
        input: I,
        options: RunOptions,
    ) -> Result<WorkflowRun<WorkflowOf<I>, R, H>> {
        self.start_spec(
            input,
            RunSpec {
                options,
                ..RunSpec::default()
            },
        )
        .await
    }

    /// [`start_with`](Self::start_with) under `run_id`: idempotent on
    /// `(run_id, input)` as [`WorkflowRuntime::submit`] is, the input
    /// compared by its canonical encoding (maps and sets sorted, as a job's
    /// is), so an equal input whose maps or sets iterate in another order is
    /// the same input.
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::submit`]: dropped at any
    /// await, the run was never committed, or it is and runs; starting the
    /// same id and input again answers for it.
    ///
    /// # Errors
    /// As [`start`](Self::start); [`Error::InputMismatch`] when the run is
    /// active with another input.
    pub async fn start_as<I: WorkflowInput>(
        &self,
        run_id: RunId,
        input: I,
        options: RunOptions,
    ) -> Result<WorkflowRun<WorkflowOf<I>, R, H>> {
        self.start_spec(
            input,
            RunSpec {
                run_id: Some(run_id),
                options,
                ..RunSpec::default()
            },
        )
        .await
    }

    /// Starts a run with every field of `spec` (run id, options, effects)
    /// but its `input`, which is `input` encoded.
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::submit`].
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub async fn start_spec<I: WorkflowInput>(
        &self,
        input: I,
        spec: RunSpec,
    ) -> Result<WorkflowRun<WorkflowOf<I>, R, H>> {
        let spec = RunSpec {
            input: encode_input(input)?,
            ..spec
        };
        let submitted = self.submit(spec).await?;
        Ok(WorkflowRun {
            runtime: self.clone(),
            run_id: submitted.run_id,
            newly_submitted: submitted.newly_submitted,
            workflow: PhantomData,
        })
    }

    /// A typed handle on the run `run_id` of workflow `W`, for instance
    /// after a restart.
    pub fn workflow_run<W: Workflow>(&self, run_id: RunId) -> WorkflowRun<W, R, H> {
        WorkflowRun {
            runtime: self.clone(),
            run_id,
            newly_submitted: false,
            workflow: PhantomData,
        }
    }

    /// [`signal`](Self::signal) with `value` encoded as MessagePack (named
    /// fields), as [`StepContext::signal_value`] decodes it.
    ///
    /// # Cancel safety
    ///
    /// As [`signal`](Self::signal).
    ///
    /// # Errors
    /// As [`signal`](Self::signal); [`Error::Serialization`] when `value`
    /// cannot be encoded.
    pub async fn signal_value<T: Serialize + ?Sized>(
        &self,
        correlation_key: &str,
        value: &T,
    ) -> Result<SignalOutcome> {
        let payload = rmp_serde::to_vec_named(value)?;
        self.signal(correlation_key, payload).await
    }

    /// [`signal_run`](Self::signal_run) with `value` encoded as MessagePack
    /// (named fields), as [`StepContext::signal_value`] decodes it: reaches
    /// only `run_id`'s current wait on `correlation_key`, buffers nothing.
    ///
    /// # Cancel safety
    ///
    /// As [`signal_run`](Self::signal_run).
    ///
    /// # Errors
    /// As [`signal_run`](Self::signal_run); [`Error::Serialization`] when
    /// `value` cannot be encoded.
    pub async fn signal_run_value<T: Serialize + ?Sized>(
        &self,
        run_id: &RunId,
        correlation_key: &str,
        value: &T,
    ) -> Result<()> {
        let payload = rmp_serde::to_vec_named(value)?;
        self.signal_run(run_id, correlation_key, payload).await
    }
}

/// A [`StepRunner`] hosting several workflows, routing each step to its
/// workflow by the name in the payload, so they share one runtime.
///
/// ```ignore
/// // Every #[workflow] in the binary (each must implement `Default`,
/// // unless added by hand first):
/// let router = Workflows::registered();
/// // Or by hand, for workflows that hold state:
/// let router = Workflows::builder().register(Order::new(client)).register_all().build();
/// let runtime = WorkflowRuntime::builder(queue, store, router, NoopTerminalHook).build();
/// ```
#[derive(Clone)]
pub struct Workflows {
    entries: Arc<BTreeMap<&'static str, Arc<dyn ErasedWorkflow>>>,
}

impl Workflows {
    /// An empty builder.
    pub fn builder() -> WorkflowsBuilder {
        WorkflowsBuilder::default()
    }

    /// A router of every `#[workflow]` linked into the binary, each built
    /// with `Default`.
    ///
    /// # Panics
    /// As [`WorkflowsBuilder::register_all`].
    pub fn registered() -> Self {
        Self::builder().register_all().build()
    }

    /// The names of the hosted workflows, sorted.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries.keys().copied()
    }

    /// Whether the workflow `name` is hosted.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }
}

impl fmt::Debug for Workflows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.entries.keys()).finish()
    }
}

impl StepRunner for Workflows {
    /// Every hosted workflow with its steps.
    fn hosted(&self) -> crate::runner::Hosted {
        crate::runner::Hosted::Workflows(
            self.entries
                .iter()
                .map(|(name, workflow)| {
                    (
                        name.to_string(),
                        workflow.steps().iter().map(|s| s.to_string()).collect(),
                    )
                })
                .collect(),
        )
    }

    /// Every hosted workflow's code.
    fn code(&self) -> crate::versioning::HostedCode {
        self.entries
            .values()
            .fold(crate::versioning::HostedCode::default(), |all, workflow| {
                all.merge(workflow.code())
            })
    }

    async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
        let head: EnvelopeHead = rmp_serde::from_slice(&step.payload).map_err(|e| {
            failure(format_args!(
                "the step payload is not a `#[workflow]` step: {e}"
            ))
        })?;
        match self.entries.get(head.workflow.as_str()) {
            Some(workflow) => workflow.run_erased(step).await,
            None => Err(failure(format_args!(
                "no workflow named `{}` is hosted by this runtime (it hosts {}): step `{}` cannot run",
                head.workflow,
                list(self.names()),
                head.step.0
            ))),
        }
    }
}

/// Builds a [`Workflows`] router.
#[derive(Default)]
pub struct WorkflowsBuilder {
    entries: BTreeMap<&'static str, Arc<dyn ErasedWorkflow>>,
}

impl fmt::Debug for WorkflowsBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.entries.keys()).finish()
    }
}

impl WorkflowsBuilder {
    /// Hosts `workflow`.
    ///
    /// # Panics
    /// When a workflow with the same [`Workflow::NAME`] is already hosted.
    pub fn register<W: Workflow>(mut self, workflow: W) -> Self {
        if let Some(existing) = self.entries.get(W::NAME) {
            panic!(
                "two workflows are named `{}`: `{}` and `{}`; give one another `#[workflow(name = \"...\")]`",
                W::NAME,
                existing.type_name(),
                std::any::type_name::<W>()
            );
        }
        self.entries.insert(W::NAME, Arc::new(workflow));
        self
    }

    /// Hosts every `#[workflow]` linked into the binary that is not hosted
    /// yet, built with `Default`. Add the workflows that hold state with
    /// [`register`](Self::register) first.
    ///
    /// # Panics
    /// When two `#[workflow]`s share a name (both source locations are
    /// given), or one that is not hosted yet does not implement `Default`.
    pub fn register_all(mut self) -> Self {
        let registrations = registry::workflow_registrations();
        if let Some(message) = crate::jobs::registry::duplicate_names(
            "#[workflow]",
            registrations
                .iter()
                .map(|r| (r.name, r.type_name, r.module_path, r.file, r.line)),
        ) {
            panic!("{message}");
        }
        for registration in registrations {
            if let Some(existing) = self.entries.get(registration.name) {
                let full = format!("{}::{}", registration.module_path, registration.type_name);
                if existing.type_name() != full {
                    panic!(
                        "two workflows are named `{}`: `{}` (registered by hand) and `{full}` ({}:{}); give one another `#[workflow(name = \"...\")]`",
                        registration.name,
                        existing.type_name(),
                        registration.file,
                        registration.line
                    );
                }
                continue;
            }
            match (registration.make)() {
                Some(workflow) => {
                    self.entries.insert(registration.name, Arc::from(workflow));
                }
                None => panic!(
                    "workflow `{}` (`{}` at {}:{}) does not implement `Default`, so `register_all` cannot build it: add it with `.register({} {{ .. }})` before `.register_all()`",
                    registration.name,
                    registration.type_name,
                    registration.file,
                    registration.line,
                    registration.type_name
                ),
            }
        }
        self
    }

    /// The router.
    pub fn build(self) -> Workflows {
        Workflows {
            entries: Arc::new(self.entries),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// A workflow defined with the macro inside this crate.
    #[derive(Default)]
    struct Counter;

    #[taquba_workflow_macros::workflow(crate = crate, name = "counter", output = u32, derive(Debug))]
    impl Counter {
        #[step(start)]
        async fn count(
            n: u32,
            label: &str,
        ) -> std::result::Result<Transition<CounterStep>, StepError> {
            if n >= 3 {
                return Ok(Transition::done(n));
            }
            Ok(Transition::next(CounterStep::Count {
                n: n + 1,
                label: label.to_string(),
            }))
        }

        #[step]
        async fn stop(
            ctx: StepContext<'_>,
        ) -> std::result::Result<Transition<CounterStep>, StepError> {
            Ok(Transition::cancel(ctx.step_name()))
        }
    }

    fn outcome(transition: Transition<CounterStep>) -> StepOutcome {
        transition.into_outcome().expect("encodes")
    }

    #[tokio::test]
    async fn steps_round_trip_through_their_payload() {
        let payload = encode_input(CounterInput {
            n: 1,
            label: "x".into(),
        })
        .expect("encodes");
        let step = Step::detached(payload);
        match Counter.run_step(&step).await.expect("runs") {
            StepOutcome::Continue { payload, when } => {
                assert!(matches!(when, Trigger::Immediate));
                match decode_step::<CounterStep>(&payload).expect("decodes") {
                    CounterStep::Count { n, label } => assert_eq!((n, label.as_str()), (2, "x")),
                    CounterStep::Stop {} => panic!("wrong step"),
                }
            }
            other => panic!("{other:?}"),
        }
        match outcome(Transition::done(7)) {
            StepOutcome::Succeed { result } => {
                assert_eq!(decode_output::<Counter>(&result).expect("decodes"), 7)
            }
            other => panic!("{other:?}"),
        }
        let stop = Step::detached(encode_step(&CounterStep::Stop {}).expect("encodes"));
        assert!(matches!(
            Counter.run_step(&stop).await,
            Ok(StepOutcome::Cancel { reason }) if reason == "stop"
        ));
    }

    #[test]
    fn a_done_transition_holds_its_output_encoded() {
        let done = Transition::<CounterStep>::done(7);
        assert_eq!(format!("{done:?}"), "Done(<MessagePack, len 1>)");
        let next = Transition::next(CounterStep::Stop {});
        assert_eq!(
            format!("{next:?}"),
            "Continue { step: Stop, when: Immediate }"
        );
    }

    /// An output whose `Serialize` fails.
    struct Unencodable;

    impl Serialize for Unencodable {
        fn serialize<S: serde::Serializer>(&self, _: S) -> std::result::Result<S::Ok, S::Error> {
            Err(serde::ser::Error::custom("refused"))
        }
    }

    impl<'de> Deserialize<'de> for Unencodable {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Unencodable)
        }
    }

    #[derive(Default)]
    struct Refuser;

    #[taquba_workflow_macros::workflow(crate = crate, name = "refuser", output = Unencodable)]
    impl Refuser {
        #[step(start)]
        async fn only() -> std::result::Result<Transition<RefuserStep>, StepError> {
            Ok(Transition::done(Unencodable))
        }
    }

    #[tokio::test]
    async fn an_output_that_cannot_be_encoded_fails_the_step_permanently() {
        let step = Step::detached(encode_input(RefuserInput).expect("encodes"));
        let error = Refuser.run_step(&step).await.expect_err("not encodable");
        assert_eq!(error.kind, StepErrorKind::Permanent);
        assert!(
            error
                .message
                .contains("workflow `refuser`: cannot encode the output: refused"),
            "{}",
            error.message
        );
    }

    /// The dispatch's conversion (`__private::step_outcome`): the step
    /// enum's transition is encoded, the fn's error converted, and a
    /// transition of another type (only in a build that fails) refused.
    #[test]
    fn step_outcomes_follow_what_the_step_fn_returned() {
        use crate::generated::step::step_outcome;
        type Returned<S, E> = std::result::Result<Transition<S>, E>;
        match step_outcome::<CounterStep, CounterStep, Returned<CounterStep, StepError>>(
            Ok(Transition::done(3)),
            |e| e,
        ) {
            Ok(StepOutcome::Succeed { result }) => {
                assert_eq!(decode_output::<Counter>(&result).expect("decodes"), 3)
            }
            other => panic!("{other:?}"),
        }
        let error = step_outcome::<CounterStep, CounterStep, Returned<CounterStep, &str>>(
            Err("boom"),
            StepError::transient,
        )
        .expect_err("the fn's error");
        assert_eq!(
            (error.kind, error.message.as_str()),
            (StepErrorKind::Transient, "boom")
        );
        let error = step_outcome::<CounterStep, String, Returned<String, StepError>>(
            Ok(Transition::next("elsewhere".to_string())),
            |e| e,
        )
        .expect_err("not the step enum");
        assert_eq!(error.kind, StepErrorKind::Permanent);
        assert!(
            error.message.contains(
                "workflow `counter`: a step returned a `Transition<alloc::string::String>`"
            ),
            "{}",
            error.message
        );
    }

    #[test]
    fn payloads_name_the_workflow_and_the_step() {
        let payload = encode_step(&CounterStep::Stop {}).expect("encodes");
        let head: EnvelopeHead = rmp_serde::from_slice(&payload).expect("decodes");
        assert_eq!(
            (head.workflow.as_str(), head.step.0.as_str()),
            ("counter", "stop")
        );
    }

    #[derive(Serialize)]
    struct Raw<'a> {
        workflow: &'a str,
        step: BTreeMap<&'a str, BTreeMap<&'a str, u32>>,
    }

    fn raw(workflow: &str, step: &str, fields: &[(&str, u32)]) -> Vec<u8> {
        rmp_serde::to_vec_named(&Raw {
            workflow,
            step: [(step, fields.iter().copied().collect())]
                .into_iter()
                .collect(),
        })
        .expect("encodes")
    }

    #[test]
    fn bad_payloads_fail_permanently_naming_what_is_wrong() {
        let cases = [
            (
                raw("counter", "refund", &[]),
                "workflow `counter` has no step named `refund` (its steps are `count`, `stop`)",
            ),
            (
                raw("billing", "count", &[]),
                "workflow `counter` received a step of workflow `billing`",
            ),
            (
                raw("counter", "count", &[("n", 1)]),
                "the parameters of step `count` do not decode",
            ),
            (b"\x01".to_vec(), "not a `#[workflow]` step"),
        ];
        for (payload, needle) in cases {
            let error = decode_step::<CounterStep>(&payload).expect_err("rejected");
            assert_eq!(error.kind, StepErrorKind::Permanent);
            assert!(error.message.contains(needle), "{}", error.message);
        }
    }

    #[tokio::test]
    async fn the_memo_is_namespaced_by_step_name() {
        let step = Step::detached(Vec::new());
        let a = StepContext::new(&step, "counter", "a");
        let b = StepContext::new(&step, "counter", "b");
        a.memo.put("k", b"1").await.expect("puts");
        assert_eq!(a.memo.get("k").await.expect("gets"), Some(b"1".to_vec()));
        assert_eq!(b.memo.get("k").await.expect("gets"), None);
        assert_eq!(
            step.memo.get("a/k").await.expect("gets"),
            Some(b"1".to_vec())
        );
        let computed: u32 = b
            .memo
            .memoized_by_content("input", async { Ok::<_, Error>(5) })
            .await
            .expect("computes");
        let cached: u32 = b
            .memo
            .memoized_by_content("input", async { Ok::<_, Error>(6) })
            .await
            .expect("reads");
        assert_eq!((computed, cached), (5, 5));
        let other: u32 = a
            .memo
            .memoized_by_content("input", async { Ok::<_, Error>(9) })
            .await
            .expect("computes");
        assert_eq!(other, 9);
    }

    #[test]
    fn signals_decode_as_the_step_asks() {
        let mut step = Step::detached(Vec::new());
        let ctx = StepContext::new(&step, "counter", "count");
        assert_eq!(ctx.signal_value::<String>().expect("none"), None);
        step.signal = Some(rmp_serde::to_vec_named("approved").expect("encodes"));
        let ctx = StepContext::new(&step, "counter", "count");
        assert_eq!(
            ctx.signal_value::<String>().expect("decodes").as_deref(),
            Some("approved")
        );
        let error = ctx.signal_value::<u64>().expect_err("not a number");
        assert!(
            error.message.contains("step `count` of workflow `counter`"),
            "{}",
            error.message
        );
    }

    #[test]
    #[should_panic(expected = "two workflows are named `counter`")]
    fn registering_a_name_twice_panics() {
        let _ = Workflows::builder().register(Counter).register(Counter);
    }
}
