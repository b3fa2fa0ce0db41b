//! What the code `#[job]` and `#[workflow]` generate reaches: the
//! dependencies it needs (re-exported, so the user's crate needs none of
//! its own), the registration entries, and the bound checks whose
//! `#[diagnostic::on_unimplemented]` messages point at the offending
//! parameter. Not a public API: names here change without notice.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

pub use ::inventory;
pub use ::rmp_serde;
pub use ::serde;

use crate::jobs::{Job, JobRunnerBuilder};
use crate::workflows::{Transition, Workflow, WorkflowStep};
use crate::{Step, StepError, StepOutcome, StepRunner};

// ---------------------------------------------------------------------------
// Jobs

/// One `#[job]` linked into the binary.
#[derive(Debug)]
pub struct JobRegistration {
    /// `Job::NAME`.
    pub name: &'static str,
    /// The generated struct's name.
    pub type_name: &'static str,
    /// `module_path!()` where the fn is.
    pub module_path: &'static str,
    /// `file!()` of the `#[job]` attribute.
    pub file: &'static str,
    /// `line!()` of the `#[job]` attribute.
    pub line: u32,
    /// Registers the type on a builder.
    pub register: fn(JobRunnerBuilder) -> JobRunnerBuilder,
}

inventory::collect!(JobRegistration);

/// `builder.register::<J>()`, as a fn pointer for [`JobRegistration`].
pub fn register_job<J: Job>(builder: JobRunnerBuilder) -> JobRunnerBuilder {
    builder.register::<J>()
}

fn job_registrations() -> Vec<&'static JobRegistration> {
    let mut all: Vec<_> = inventory::iter::<JobRegistration>.into_iter().collect();
    all.sort_by_key(|r| (r.name, r.file, r.line));
    all
}

/// Registration of every `#[job]`.
impl JobRunnerBuilder {
    /// Registers every `#[job]` linked into the binary (as
    /// [`register`](Self::register) does for one type); types registered
    /// by hand before are kept.
    ///
    /// # Panics
    /// When two `#[job]`s share a name (the message gives both source
    /// locations), or a type registered by hand has the name of a
    /// `#[job]`.
    pub fn register_all(self) -> Self {
        let registrations = job_registrations();
        if let Some(message) = duplicate_names(
            "#[job]",
            registrations
                .iter()
                .map(|r| (r.name, r.type_name, r.module_path, r.file, r.line)),
        ) {
            panic!("{message}");
        }
        registrations
            .into_iter()
            .fold(self, |builder, registration| {
                (registration.register)(builder)
            })
    }
}

/// The message for names registered twice, listing every location, or
/// `None`. `entries` is `(name, type, module, file, line)`.
pub(crate) fn duplicate_names<'a>(
    what: &str,
    entries: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a str, u32)>,
) -> Option<String> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for (name, type_name, module, file, line) in entries {
        by_name
            .entry(name)
            .or_default()
            .push(format!("`{module}::{type_name}` at {file}:{line}"));
    }
    let clashes: Vec<String> = by_name
        .into_iter()
        .filter(|(_, sites)| sites.len() > 1)
        .map(|(name, sites)| format!("`{name}` is the name of {}", sites.join(" and of ")))
        .collect();
    if clashes.is_empty() {
        None
    } else {
        Some(format!(
            "two {what}s share a name: {}; names must be unique, so give one of them another with `name = \"...\"`",
            clashes.join("; ")
        ))
    }
}

// Every check below is a marker trait with one blanket impl marked
// `#[diagnostic::do_not_recommend]`: when a type misses any of the bounds,
// rustc reports the marker trait itself, with its
// `#[diagnostic::on_unimplemented]` message, once per missing capability
// (the generated code names each check at one span, the user's token, so
// the repeated uses render identically and are shown once).

/// A job fn's return type: `Result<T, E>` under any name (`anyhow::Result<T>`,
/// `std::io::Result<T>`, a local alias), resolved by the type system. The
/// generated `impl Job` names `Output` and `Error` through it (and
/// [`JobOutputOf`], [`JobErrorOf`]), so a wrong `T` or `E` is reported
/// once, at the return type.
#[diagnostic::on_unimplemented(
    message = "a `#[job]` fn must return `Result<T, E>`, not `{Self}`",
    label = "not a `Result`",
    note = "write `-> Result<T, E>`; any name of `core::result::Result` works (`anyhow::Result<T>`, `std::io::Result<T>`, a local `type Result<T> = ...`)"
)]
pub trait JobReturn {
    /// `T`.
    type Output;
    /// `E`.
    type Error;
    /// `self` as the `Result` it is.
    ///
    /// # Errors
    /// `E`, when `self` is `Err`.
    fn into_result(self) -> Result<Self::Output, Self::Error>;
}

impl<T, E> JobReturn for Result<T, E> {
    type Output = T;
    type Error = E;
    fn into_result(self) -> Result<T, E> {
        self
    }
}

pin_project_lite::pin_project! {
    /// The future `run` of a `#[job]` returns: the job fn's future, whose
    /// output (the fn's return type, `Result<T, E>` under any name) is
    /// split by [`JobReturn`].
    ///
    /// A named type rather than `impl Future<Output = Result<T, E>>`: the
    /// generated `impl Job` then names the split only in plain types (its
    /// associated types and this type's parameter), all at the return
    /// type, so a return type that is not a `Result` is one error there (an
    /// `impl Trait` return type would check it once more, in its own
    /// desugaring, which rustc reports apart). Polling it is polling the
    /// fn's future.
    pub struct JobRun<F> {
        #[pin]
        future: F,
    }
}

/// Wraps a job fn's future.
pub fn job_run<F: Future>(future: F) -> JobRun<F> {
    JobRun { future }
}

impl<F: Future> Future for JobRun<F>
where
    F::Output: JobReturn,
{
    type Output = Result<<F::Output as JobReturn>::Output, <F::Output as JobReturn>::Error>;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project().future.poll(cx).map(JobReturn::into_result)
    }
}

/// `Job::Output` of a `#[job]`: `<<R as JobReturn>::Output as JobOutputOf>::Type`,
/// whose impl requires [`JobOutput`], so a wrong `T` is reported once.
pub trait JobOutputOf {
    /// `Self`.
    type Type;
}
impl<T: JobOutput> JobOutputOf for T {
    type Type = T;
}

/// `Job::Error` of a `#[job]`, as [`JobOutputOf`], requiring [`JobFnError`].
pub trait JobErrorOf {
    /// `Self`.
    type Type;
}
impl<E: JobFnError> JobErrorOf for E {
    type Type = E;
}

/// What a job's output must be ([`Job::Output`]'s bounds).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the output of a `#[job]`",
    label = "a job's output must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "the output is stored as MessagePack for the caller: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait JobOutput: serde::Serialize + serde::de::DeserializeOwned + Send + 'static {}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> JobOutput for T {}

/// What a job's error must be ([`Job::Error`]'s bounds).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of a `#[job]`",
    label = "a job's error must be `Debug + Display + Send + Sync + 'static`",
    note = "any `std::error::Error + Send + Sync + 'static` type works, and so do `anyhow::Error`, `Box<dyn std::error::Error + Send + Sync>` and `String`; its `Display` is the job's error message"
)]
pub trait JobFnError: std::fmt::Debug + std::fmt::Display + Send + Sync + 'static {}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Debug + std::fmt::Display + Send + Sync + 'static> JobFnError for T {}

/// A field of a job struct taken by reference: the generated struct
/// serializes it through these fns (`#[serde(serialize_with, deserialize_with)]`),
/// so a missing bound is reported once, at the parameter's type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[job]` parameter",
    label = "job parameters must be `Serialize + DeserializeOwned + Send + Sync + 'static`",
    note = "a job's parameters are its fields, stored as MessagePack until a worker runs it: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`; application state (a pool, a client) is not a parameter: register it with `JobRunnerBuilder::state` and read it with `ctx.state::<T>()`"
)]
pub trait JobField: Sized {
    /// Serializes the field.
    ///
    /// # Errors
    /// The serializer's.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Deserializes the field.
    ///
    /// # Errors
    /// The deserializer's.
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static> JobField for T {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(self, serializer)
    }
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <T as serde::Deserialize<'de>>::deserialize(deserializer)
    }
}

/// A field of a job struct taken by value: as [`JobField`], and cloned out
/// of the stored job for each attempt.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[job]` parameter taken by value",
    label = "a by-value job parameter must be `Clone + Serialize + DeserializeOwned + Send + Sync + 'static`",
    note = "a job's parameters are its fields, stored as MessagePack, and one taken by value is cloned for each attempt: derive `Clone`, `serde::Serialize` and `serde::Deserialize` for `{Self}`, or take it by reference (`&{Self}`); application state (a pool, a client) is not a parameter: register it with `JobRunnerBuilder::state` and read it with `ctx.state::<T>()`"
)]
pub trait JobFieldOwned: Sized {
    /// Serializes the field.
    ///
    /// # Errors
    /// The serializer's.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Deserializes the field.
    ///
    /// # Errors
    /// The deserializer's.
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
    /// The value passed to the job fn.
    fn clone_param(&self) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T: Clone + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static>
    JobFieldOwned for T
{
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(self, serializer)
    }
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <T as serde::Deserialize<'de>>::deserialize(deserializer)
    }
    fn clone_param(&self) -> Self {
        self.clone()
    }
}

/// A field named in `#[job(key = "...")]` without a format spec: the key
/// is formatted with its `Display`, and a type without one is reported
/// once, at the template.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be formatted into the job's key",
    label = "a field named in the key template is formatted with `Display`",
    note = "implement `std::fmt::Display` for `{Self}`, or format it with `Debug`: `{{field:?}}` in the template"
)]
pub trait KeyPart: std::fmt::Display {}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display> KeyPart for T {}

/// `value`, checked to be a [`KeyPart`], as the `Display` the key's
/// `format!` takes (whatever `T`, so a `T` without one is reported only
/// here).
pub fn key_part<T: KeyPart>(value: &T) -> &dyn std::fmt::Display {
    value
}

/// The signature of `#[job(classify = f)]`: the generated code coerces `f`
/// to this fn pointer, so a wrong signature is reported at `f`.
pub type Classify<E> = fn(&E) -> crate::StepErrorKind;

/// Implemented by the struct `#[job]` generates only: the generated code
/// names the struct by its plain name in the user's module and checks it is
/// this one, so a user item of the same name (which shadows the generated
/// struct) is reported once, with the option that renames the struct.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the struct `#[job]` generates",
    label = "`#[job]` generates a struct of this name, and another item of this module has it",
    note = "rename your item, or give the generated struct another name with `#[job(struct_name = ...)]`"
)]
pub trait GeneratedJobStruct {}

/// As [`GeneratedJobStruct`], for the step enum of `#[workflow]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the step enum `#[workflow]` generates",
    label = "`#[workflow]` generates an enum of this name, and another item of this module has it",
    note = "rename your item, or give the generated enum another name with `#[workflow(step_enum = ...)]`"
)]
pub trait GeneratedStepEnum {}

/// As [`GeneratedJobStruct`], for the input struct of `#[workflow]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the input struct `#[workflow]` generates",
    label = "`#[workflow]` generates a struct of this name, and another item of this module has it",
    note = "rename your item, or give the generated struct another name with `#[workflow(input = ...)]`"
)]
pub trait GeneratedInput {}

/// Compiles when `T` is a generated job struct.
pub const fn generated_job_struct<T: GeneratedJobStruct>() {}
/// Compiles when `T` is a generated step enum.
pub const fn generated_step_enum<T: GeneratedStepEnum>() {}
/// Compiles when `T` is a generated input struct.
pub const fn generated_input<T: GeneratedInput>() {}

// ---------------------------------------------------------------------------
// Workflows

/// One `#[workflow]` linked into the binary.
#[derive(Debug)]
pub struct WorkflowRegistration {
    /// `Workflow::NAME`.
    pub name: &'static str,
    /// The workflow type's name.
    pub type_name: &'static str,
    /// `module_path!()` where the impl block is.
    pub module_path: &'static str,
    /// `file!()` of the `#[workflow]` attribute.
    pub file: &'static str,
    /// `line!()` of the `#[workflow]` attribute.
    pub line: u32,
    /// Builds the workflow with `Default`; `None` when it has no `Default`.
    pub make: fn() -> Option<Box<dyn ErasedWorkflow>>,
}

inventory::collect!(WorkflowRegistration);

pub(crate) fn workflow_registrations() -> Vec<&'static WorkflowRegistration> {
    let mut all: Vec<_> = inventory::iter::<WorkflowRegistration>
        .into_iter()
        .collect();
    all.sort_by_key(|r| (r.name, r.file, r.line));
    all
}

/// What the `StepRunner` impl `#[workflow]` writes answers to
/// `StepRunner::hosted`: the workflow `W` with its steps.
pub fn hosted_workflow<W: Workflow>() -> crate::runner::Hosted {
    crate::runner::Hosted::workflow(W::NAME, W::STEPS)
}

/// A boxed step future.
pub type BoxStepFuture<'a> =
    Pin<Box<dyn Future<Output = Result<StepOutcome, StepError>> + Send + 'a>>;

/// A workflow behind a pointer, for the [`Workflows`](crate::workflows::Workflows) router.
pub trait ErasedWorkflow: Send + Sync + 'static {
    /// `std::any::type_name` of the workflow.
    fn type_name(&self) -> &'static str;
    /// `StepRunner::run_step`, boxed.
    fn run_erased<'a>(&'a self, step: &'a Step) -> BoxStepFuture<'a>;
    /// `Workflow::STEPS`.
    fn steps(&self) -> &'static [&'static str];
}

impl<W: Workflow> ErasedWorkflow for W {
    fn type_name(&self) -> &'static str {
        std::any::type_name::<W>()
    }

    fn steps(&self) -> &'static [&'static str] {
        W::STEPS
    }

    fn run_erased<'a>(&'a self, step: &'a Step) -> BoxStepFuture<'a> {
        Box::pin(StepRunner::run_step(self, step))
    }
}

/// Builds a `W` for [`WorkflowRegistration::make`] when `W: Default`
/// (autoref specialization: `(&Maker::<W>::new()).make()` picks
/// [`MakeWithDefault`] when it applies, else [`MakeWithoutDefault`]).
pub struct Maker<W>(PhantomData<fn() -> W>);

impl<W> Maker<W> {
    /// A probe.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<W> Default for Maker<W> {
    fn default() -> Self {
        Self::new()
    }
}

/// The `W: Default` case of [`Maker`].
pub trait MakeWithDefault {
    /// `Some(W::default())`.
    fn make(&self) -> Option<Box<dyn ErasedWorkflow>>;
}

impl<W: Workflow + Default> MakeWithDefault for Maker<W> {
    fn make(&self) -> Option<Box<dyn ErasedWorkflow>> {
        Some(Box::new(W::default()))
    }
}

/// The fallback case of [`Maker`].
pub trait MakeWithoutDefault {
    /// `None`.
    fn make(&self) -> Option<Box<dyn ErasedWorkflow>>;
}

impl<W: Workflow> MakeWithoutDefault for &Maker<W> {
    fn make(&self) -> Option<Box<dyn ErasedWorkflow>> {
        None
    }
}

/// The generated `StepRunner::run_step` decodes the payload with this.
pub fn decode_step<S: WorkflowStep>(step: &Step) -> Result<S, StepError> {
    crate::workflows::decode_step::<S>(&step.payload)
}

/// What a step fn returns: `Result<Transition<S>, E>` under any name,
/// resolved by the type system. The generated dispatch names `S` as the
/// step fn's module sees the step enum's name, so a step fn of another
/// workflow's enum (or returning something else) is one error, at its
/// return type.
#[diagnostic::on_unimplemented(
    message = "a `#[step]` fn must return `Result<Transition<Step>, E>` with its workflow's step enum as `Step`, not `{Self}`",
    label = "expected `Result<Transition<Step>, E>`, where `Step` is the step enum `#[workflow]` generates (`OrderStep` for `impl Order`)",
    note = "return `Ok(Transition::next(...))`, `Ok(Transition::done(...))`, ...; `E` is `StepError`, a type with `impl From<E> for StepError`, or any `Display` type (`anyhow::Error`, `Box<dyn Error + Send + Sync>`), which becomes a transient `StepError`"
)]
pub trait StepReturn<S> {
    /// `E`.
    type Error;
    /// `self` as the `Result` it is.
    ///
    /// # Errors
    /// `E`, when `self` is `Err`.
    fn into_result(self) -> Result<Transition<S>, Self::Error>;
}

impl<S, E> StepReturn<S> for Result<Transition<S>, E> {
    type Error = E;
    fn into_result(self) -> Self {
        self
    }
}

/// The outcome of a step from what its fn returned: the transition encoded
/// (as a transition of `G`, see below), or the fn's error through
/// `convert`.
///
/// `G` is the step enum `#[workflow]` generated; `S` is the type the step
/// enum's name means in the workflow's module; `R`, the step fn's return
/// type, is written out at its span so a wrong one is one error there.
/// Generic over all three so that, once `R: StepReturn<S>` fails, nothing
/// else in the generated arm names `R`'s parts (`convert`'s argument type
/// comes from here).
///
/// # Errors
/// The step fn's error through `convert`; a permanent [`StepError`] when
/// the transition cannot be encoded, or when `S` is not `G` (never, once
/// the program compiles: see `generated_transition`).
pub fn step_outcome<G: WorkflowStep, S: 'static, R: StepReturn<S>>(
    returned: R,
    convert: impl FnOnce(R::Error) -> StepError,
) -> Result<StepOutcome, StepError> {
    match returned.into_result() {
        Ok(transition) => generated_transition::<G, S>(transition)?.into_outcome(),
        Err(error) => Err(convert(error)),
    }
}

/// `transition` as a transition of `G`, the step enum `#[workflow]`
/// generated, from `S`, the type the step enum's name means in the
/// workflow's module (which [`step_outcome`] checked the step fn returns).
///
/// The two are the same type in every program that compiles: when an item
/// of the user's shadows the generated enum's name, the name check
/// (`generated_step_enum`) fails the build. The dispatch still has to
/// type-check in that build, where `S: WorkflowStep` does not hold (and
/// `S == G` is not expressible as a bound), so the conversion goes through
/// `Any`: an `Option` on the stack downcast in place, which is a comparison
/// of two constant `TypeId`s that the optimizer folds away, with no
/// allocation. The mismatch arm is unreachable in a compiled program; it
/// fails the step permanently rather than panicking.
fn generated_transition<G: WorkflowStep, S: 'static>(
    transition: Transition<S>,
) -> Result<Transition<G>, StepError> {
    let mut slot = Some(transition);
    (&mut slot as &mut dyn std::any::Any)
        .downcast_mut::<Option<Transition<G>>>()
        .and_then(Option::take)
        .ok_or_else(|| {
            crate::run::context::failure(format_args!(
                "workflow `{}`: a step returned a `Transition<{}>`, not a transition of its step enum `{}`",
                G::Workflow::NAME,
                std::any::type_name::<S>(),
                std::any::type_name::<G>()
            ))
        })
}

/// The future of a step fn, which the runtime moves between threads.
pub fn step_future<F: Future + Send>(future: F) -> F {
    future
}

/// Picks how a step fn's error becomes a [`StepError`] (autoref
/// specialization, resolved on the concrete error type in the generated
/// code): through `Into<StepError>` when the type has it, so `StepError`
/// keeps its kind and a `From` impl decides; otherwise through `Display`,
/// as a transient error.
pub struct StepErrorProbe<E>(PhantomData<fn() -> E>);

/// A probe for the type of `error`.
pub fn step_error_probe<E>(_error: &E) -> StepErrorProbe<E> {
    StepErrorProbe(PhantomData)
}

/// The `Into<StepError>` case of [`StepErrorProbe`].
pub trait StepErrorViaInto {
    /// The conversion.
    fn step_error_kind(&self) -> ViaInto {
        ViaInto
    }
}
impl<E: Into<StepError>> StepErrorViaInto for StepErrorProbe<E> {}

/// The fallback case of [`StepErrorProbe`].
pub trait StepErrorViaDisplay {
    /// The conversion.
    fn step_error_kind(&self) -> ViaDisplay {
        ViaDisplay
    }
}
impl<E> StepErrorViaDisplay for &StepErrorProbe<E> {}

/// Converts with `Into<StepError>`.
pub struct ViaInto;
impl ViaInto {
    /// `error.into()`.
    pub fn convert<E: Into<StepError>>(self, error: E) -> StepError {
        error.into()
    }
}

/// Converts with `Display`, as a transient error.
pub struct ViaDisplay;
impl ViaDisplay {
    /// `StepError::transient(error.to_string())`.
    pub fn convert<E: StepFnError>(self, error: E) -> StepError {
        StepError::transient(error.to_string())
    }
}

/// What a step's error must be when it has no `Into<StepError>`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of a `#[step]`",
    label = "a step's error must be `Into<StepError>` or `Display`",
    note = "return `StepError` (`StepError::permanent(...)` / `StepError::transient(...)`), a type with `impl From<E> for StepError`, or any `Display` type, which becomes a transient `StepError` with its message"
)]
pub trait StepFnError: std::fmt::Display {}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Display> StepFnError for T {}

/// A field of a step enum variant: the generated enum serializes it
/// through these fns (`#[serde(serialize_with, deserialize_with)]`), so a
/// missing bound is reported once, at the parameter's type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[step]` parameter",
    label = "step parameters must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "a step's parameters are stored in the run's payload as MessagePack: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`; application state (a pool, a client) is not a parameter: keep it in the workflow value and read it through `&self`"
)]
pub trait StepField: Sized {
    /// Serializes the field.
    ///
    /// # Errors
    /// The serializer's.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error>;
    /// Deserializes the field.
    ///
    /// # Errors
    /// The deserializer's.
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error>;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> StepField for T {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(self, serializer)
    }
    fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <T as serde::Deserialize<'de>>::deserialize(deserializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_name_every_location() {
        let message = duplicate_names(
            "#[job]",
            [
                ("a", "A", "m", "src/a.rs", 1),
                ("b", "B", "m", "src/b.rs", 2),
                ("a", "C", "n", "src/c.rs", 3),
            ]
            .into_iter(),
        )
        .expect("a clash");
        assert!(
            message.contains("`m::A` at src/a.rs:1 and of `n::C` at src/c.rs:3"),
            "{message}"
        );
        assert!(!message.contains("src/b.rs"));
        assert!(duplicate_names("#[job]", std::iter::empty()).is_none());
    }
}
