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
// `#[diagnostic::on_unimplemented]` message. The generated code names each
// check once, at the user's token (the return type, a parameter's type),
// and nothing else it writes states the bound again: a mistake is one
// error.

/// A job fn's return type: `Result<T, E>` under any name (`anyhow::Result<T>`,
/// `std::io::Result<T>`, a local alias), resolved by the type system. The
/// generated code names it once, as [`GeneratedJob::Return`], whose bounds
/// check it is a `Result` with a [`JobOutput`] and a [`JobFnError`]: each
/// wrong part is one error, at the return type.
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

/// What `#[job]` implements for the struct it generates; [`Job`] follows
/// from it (the blanket impl below).
///
/// The job fn's return type is named once, as [`Return`](Self::Return),
/// and nothing else the generated impl writes names its parts: `Job`'s
/// `Output` and `Error` (whose bounds, and `run`'s signature, would check
/// them again, one error each time) are worked out here, generically, from
/// the bounds of `Return`. So a return type that is not a `Result`, or one
/// whose `T` or `E` misses a bound, is one error, at the return type, and
/// the job struct still implements `Job` (the user's code that submits it
/// is not reported on top).
pub trait GeneratedJob:
    serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static
{
    /// The job fn's return type as written.
    type Return: JobReturn<Output: JobOutput, Error: JobFnError>;
    /// [`Job::NAME`].
    const NAME: &'static str;
    /// Calls the job fn with the struct's fields.
    fn call(&self, ctx: crate::jobs::JobContext<'_>) -> impl Future<Output = Self::Return> + Send;
    /// [`Job::idempotency_key`].
    fn idempotency_key(&self) -> Option<String> {
        None
    }
    /// [`Job::max_attempts`].
    fn max_attempts(&self) -> Option<u32> {
        None
    }
    /// [`Job::classify`], given the job's error (see [`ClassifyProbe`]).
    fn classify(&self, _error: &dyn std::any::Any) -> crate::StepErrorKind {
        crate::StepErrorKind::Transient
    }
}

/// Every `#[job]` struct is a job.
impl<G: GeneratedJob> Job for G {
    type Output = <<G::Return as JobReturn>::Output as JobOutput>::Checked;
    type Error = <<G::Return as JobReturn>::Error as JobFnError>::Checked;
    const NAME: &'static str = G::NAME;

    fn run(
        &self,
        ctx: crate::jobs::JobContext<'_>,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send {
        JobRun {
            future: self.call(ctx),
        }
    }

    fn idempotency_key(&self) -> Option<String> {
        GeneratedJob::idempotency_key(self)
    }

    fn max_attempts(&self) -> Option<u32> {
        GeneratedJob::max_attempts(self)
    }

    fn classify(&self, error: &Self::Error) -> crate::StepErrorKind {
        GeneratedJob::classify(self, error)
    }
}

pin_project_lite::pin_project! {
    /// The future `run` of a `#[job]` returns: the job fn's future, whose
    /// output (the fn's return type, `Result<T, E>` under any name) is
    /// split by [`JobReturn`]. Polling it is polling the fn's future.
    pub struct JobRun<F> {
        #[pin]
        future: F,
    }
}

impl<F: Future> Future for JobRun<F>
where
    F::Output: JobReturn<Output: JobOutput, Error: JobFnError>,
{
    type Output = Result<
        <<F::Output as JobReturn>::Output as JobOutput>::Checked,
        <<F::Output as JobReturn>::Error as JobFnError>::Checked,
    >;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project()
            .future
            .poll(cx)
            .map(|returned| match returned.into_result() {
                Ok(output) => Ok(output.checked()),
                Err(error) => Err(error.checked()),
            })
    }
}

/// What a job's output must be ([`Job::Output`]'s bounds), as a bound of
/// [`GeneratedJob::Return`]. The bounds are those of [`Checked`](Self::Checked),
/// not supertraits: a type missing them is then reported as missing this
/// trait (one error, with this message) rather than each bound on its own.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the output of a `#[job]`",
    label = "a job's output must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "the output is stored as MessagePack for the caller: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait JobOutput: Sized {
    /// `Self`, known to have the bounds.
    type Checked: serde::Serialize + serde::de::DeserializeOwned + Send + 'static;
    /// `self`.
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> JobOutput for T {
    type Checked = T;
    fn checked(self) -> T {
        self
    }
}

/// What a job's error must be ([`Job::Error`]'s bounds), as [`JobOutput`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of a `#[job]`",
    label = "a job's error must be `Debug + Display + Send + Sync + 'static`",
    note = "any `std::error::Error + Send + Sync + 'static` type works, and so do `anyhow::Error`, `Box<dyn std::error::Error + Send + Sync>` and `String`; its `Display` is the job's error message"
)]
pub trait JobFnError: Sized {
    /// `Self`, known to have the bounds.
    type Checked: std::fmt::Debug + std::fmt::Display + Send + Sync + 'static;
    /// `self`.
    fn checked(self) -> Self::Checked;
}

#[diagnostic::do_not_recommend]
impl<T: std::fmt::Debug + std::fmt::Display + Send + Sync + 'static> JobFnError for T {
    type Checked = T;
    fn checked(self) -> T {
        self
    }
}

// The fields of the generated job structs and step enums are serialized,
// deserialized and cloned through `FieldProbe` (autoref specialization:
// `(&FieldProbe::<T>::new()).serde_via()` is `FieldChecked` when `T` has
// the capability, else `FieldUnchecked`), so that code type-checks whatever
// `T` is, and the field's bounds are checked once, by its marker trait
// (`JobField`, `JobFieldOwned`, `StepField`) named at the parameter's type:
// one error per field that misses a bound. `FieldUnchecked` only serves a
// build that fails at that check; it never runs.

/// A field of a job struct taken by reference: the generated code names
/// `<T as JobField>::check` once, at the parameter's type, so a missing
/// bound is one error there.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[job]` parameter",
    label = "job parameters must be `Serialize + DeserializeOwned + Send + Sync + 'static`",
    note = "a job's parameters are its fields, stored as MessagePack until a worker runs it: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`; application state (a pool, a client) is not a parameter: register it with `JobRunnerBuilder::state` and read it with `ctx.state::<T>()`"
)]
pub trait JobField {
    /// Named by the generated check; does nothing.
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static> JobField for T {}

/// A field of a job struct taken by value: as [`JobField`], and cloned out
/// of the stored job for each attempt.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[job]` parameter taken by value",
    label = "a by-value job parameter must be `Clone + Serialize + DeserializeOwned + Send + Sync + 'static`",
    note = "a job's parameters are its fields, stored as MessagePack, and one taken by value is cloned for each attempt: derive `Clone`, `serde::Serialize` and `serde::Deserialize` for `{Self}`, or take it by reference (`&{Self}`); application state (a pool, a client) is not a parameter: register it with `JobRunnerBuilder::state` and read it with `ctx.state::<T>()`"
)]
pub trait JobFieldOwned {
    /// Named by the generated check; does nothing.
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<T: Clone + serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static>
    JobFieldOwned for T
{
}

/// A probe for the capabilities of a field's type `T` (see the comment
/// above [`JobField`]).
pub struct FieldProbe<T>(PhantomData<fn() -> T>);

impl<T> FieldProbe<T> {
    /// A probe.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for FieldProbe<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// The `T: Serialize + DeserializeOwned` case of [`FieldProbe`].
pub trait ProbeSerde {
    /// [`FieldChecked`].
    fn serde_via(&self) -> FieldChecked {
        FieldChecked
    }
}
impl<T: serde::Serialize + serde::de::DeserializeOwned> ProbeSerde for FieldProbe<T> {}

/// The fallback case of [`ProbeSerde`].
pub trait ProbeSerdeUnchecked {
    /// [`FieldUnchecked`].
    fn serde_via(&self) -> FieldUnchecked {
        FieldUnchecked
    }
}
impl<T> ProbeSerdeUnchecked for &FieldProbe<T> {}

/// The `T: Clone` case of [`FieldProbe`].
pub trait ProbeClone {
    /// [`FieldChecked`].
    fn clone_via(&self) -> FieldChecked {
        FieldChecked
    }
}
impl<T: Clone> ProbeClone for FieldProbe<T> {}

/// The fallback case of [`ProbeClone`].
pub trait ProbeCloneUnchecked {
    /// [`FieldUnchecked`].
    fn clone_via(&self) -> FieldUnchecked {
        FieldUnchecked
    }
}
impl<T> ProbeCloneUnchecked for &FieldProbe<T> {}

/// A field's type has the capability: serialize, deserialize or clone it.
pub struct FieldChecked;

impl FieldChecked {
    /// Serializes `value`.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: serde::Serialize, S: serde::Serializer>(
        self,
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.serialize(serializer)
    }

    /// Deserializes a `T`.
    ///
    /// # Errors
    /// The deserializer's.
    pub fn deserialize<'de, T: serde::Deserialize<'de>, D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<T, D::Error> {
        T::deserialize(deserializer)
    }

    /// Clones `value`.
    pub fn clone_value<T: Clone>(self, value: &T) -> T {
        value.clone()
    }
}

/// A field's type misses the capability: the field's check fails the
/// build, so these never run.
pub struct FieldUnchecked;

impl FieldUnchecked {
    /// An error: the type cannot be serialized.
    ///
    /// # Errors
    /// Always.
    pub fn serialize<T, S: serde::Serializer>(
        self,
        _value: &T,
        _serializer: S,
    ) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom(UNCHECKED))
    }

    /// An error: the type cannot be deserialized.
    ///
    /// # Errors
    /// Always.
    pub fn deserialize<'de, T, D: serde::Deserializer<'de>>(
        self,
        _deserializer: D,
    ) -> Result<T, D::Error> {
        Err(serde::de::Error::custom(UNCHECKED))
    }

    /// Unreachable: the type cannot be cloned.
    ///
    /// # Panics
    /// Always; a build that reaches it fails at the field's check.
    pub fn clone_value<T>(self, _value: &T) -> T {
        unreachable!("{UNCHECKED}")
    }
}

const UNCHECKED: &str =
    "a `#[job]` or `#[step]` field whose type misses a bound (the build that wrote this fails)";

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

/// `#[job(classify = f)]`, for the return type `R` (autoref
/// specialization): `(&ClassifyProbe::<R>::new()).slot()` is a
/// [`Classify<E>`] when `R` is `Result<T, E>`, which the generated code then
/// assigns `f` to (a wrong signature is one error, at `f`), and a
/// `Classify<X>` for whatever `X` `f` takes otherwise (`R` is then reported
/// once, at the return type, not at `f` too).
pub struct ClassifyProbe<R>(PhantomData<fn() -> R>);

impl<R> ClassifyProbe<R> {
    /// A probe.
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<R> Default for ClassifyProbe<R> {
    fn default() -> Self {
        Self::new()
    }
}

/// The `R = Result<T, E>` case of [`ClassifyProbe`].
pub trait ClassifyResult<E> {
    /// A classifier of errors `E`, for `f` to be assigned to.
    fn slot(&self) -> Classify<E> {
        |_| crate::StepErrorKind::Transient
    }
}
impl<T, E> ClassifyResult<E> for ClassifyProbe<Result<T, E>> {}

/// The fallback case of [`ClassifyProbe`].
pub trait ClassifyOther {
    /// A classifier of errors of any type, for `f` to be assigned to.
    fn slot<X>(&self) -> Classify<X> {
        |_| crate::StepErrorKind::Transient
    }
}
impl<R> ClassifyOther for &ClassifyProbe<R> {}

/// The kind `classify` gives `error` (the job's error, as
/// [`GeneratedJob::classify`] gets it).
pub fn classify_with<E: 'static>(
    classify: Classify<E>,
    error: &dyn std::any::Any,
) -> crate::StepErrorKind {
    match error.downcast_ref::<E>() {
        Some(error) => classify(error),
        // Never: `GeneratedJob::classify` is given the job's error.
        None => crate::StepErrorKind::Transient,
    }
}

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

/// A field of a step enum variant: the generated code names
/// `<T as StepField>::check` once, at the parameter's type, so a missing
/// bound is one error there (the enum is serialized through [`FieldProbe`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[step]` parameter",
    label = "step parameters must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "a step's parameters are stored in the run's payload as MessagePack: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`; application state (a pool, a client) is not a parameter: keep it in the workflow value and read it through `&self`"
)]
pub trait StepField {
    /// Named by the generated check; does nothing.
    fn check() {}
}

#[diagnostic::do_not_recommend]
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> StepField for T {}

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
