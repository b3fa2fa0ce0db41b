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
    /// `file!()` of the fn.
    pub file: &'static str,
    /// `line!()` of the fn.
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

/// `Ok` and `Err` of a job fn's return type.
#[diagnostic::on_unimplemented(
    message = "a `#[job]` fn must return `Result<T, E>`, not `{Self}`",
    label = "not `core::result::Result`",
    note = "write `-> Result<T, E>` with `E: std::error::Error + Send + Sync + 'static` (a `Result` alias such as `io::Result<T>` works too)"
)]
pub trait JobReturn {
    /// `T`.
    type Ok;
    /// `E`.
    type Err;
}

impl<T, E> JobReturn for core::result::Result<T, E> {
    type Ok = T;
    type Err = E;
}

/// The bounds of a job field, checked where the generated struct
/// serializes the field (`#[serde(with = "job_field")]`), so a missing
/// bound is reported at the parameter with this message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[job]` parameter",
    label = "job parameters must be `Serialize + DeserializeOwned + Send + Sync + 'static`",
    note = "a job's parameters are its fields, stored as MessagePack until a worker runs it: derive `serde::Serialize` and `serde::Deserialize` for `{Self}` (and keep it `Send + Sync`)"
)]
pub trait JobField: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static {}
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static> JobField for T {}

/// `#[serde(with)]` of a job field: serde's own, behind [`JobField`].
pub mod job_field {
    /// Serializes the field.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: super::JobField, S: serde::Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.serialize(serializer)
    }

    /// Deserializes the field.
    ///
    /// # Errors
    /// The deserializer's.
    pub fn deserialize<'de, T: super::JobField, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        T::deserialize(deserializer)
    }
}

/// A parameter taken by value is cloned out of the job for each run.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is taken by value, so the job clones it for each run, but it is not `Clone`",
    label = "take it by reference (`&{Self}`) or implement `Clone`",
    note = "`#[job]` passes a reference parameter as a borrow of the stored field, and clones a by-value one"
)]
pub trait JobFieldClone: Clone {}
impl<T: Clone> JobFieldClone for T {}

/// Clones a by-value job parameter out of the stored field.
pub fn clone_param<T: JobFieldClone>(value: &T) -> T {
    value.clone()
}

/// The output of a job, checked where `Job::Output` is defined.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the output of a `#[job]`",
    label = "a job's output must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "the output is stored as MessagePack for the caller: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait JobOutputType {
    /// `Self`.
    type Type: serde::Serialize + serde::de::DeserializeOwned + Send + 'static;
}
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> JobOutputType for T {
    type Type = T;
}

/// The error of a job, checked where `Job::Error` is defined.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the error of a `#[job]`",
    label = "a job's error must be `std::error::Error + Send + Sync + 'static`",
    note = "use an error type that implements `std::error::Error` (for example with `thiserror`); `String`, `anyhow::Error` and `Box<dyn Error>` do not"
)]
pub trait JobErrorType {
    /// `Self`.
    type Type: std::error::Error + Send + Sync + 'static;
}
impl<T: std::error::Error + Send + Sync + 'static> JobErrorType for T {
    type Type = T;
}

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
    /// `file!()` of the impl block.
    pub file: &'static str,
    /// `line!()` of the impl block.
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

/// A boxed step future.
pub type BoxStepFuture<'a> =
    Pin<Box<dyn Future<Output = Result<StepOutcome, StepError>> + Send + 'a>>;

/// A workflow behind a pointer, for the [`Workflows`](crate::workflows::Workflows) router.
pub trait ErasedWorkflow: Send + Sync + 'static {
    /// `std::any::type_name` of the workflow.
    fn type_name(&self) -> &'static str;
    /// `StepRunner::run_step`, boxed.
    fn run_erased<'a>(&'a self, step: &'a Step) -> BoxStepFuture<'a>;
}

impl<W: Workflow> ErasedWorkflow for W {
    fn type_name(&self) -> &'static str {
        std::any::type_name::<W>()
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

/// What a step fn returns.
#[diagnostic::on_unimplemented(
    message = "a `#[step]` fn must return `Result<Transition<{S}>, E>` with `E: Into<StepError>`, not `{Self}`",
    label = "expected `Result<Transition<{S}>, E>` with `E: Into<StepError>`",
    note = "return `Ok(Transition::next(...))`, `Ok(Transition::done(...))`, ...; `E` can be `StepError`, `taquba_workflow::Error`, or any type with `impl From<E> for StepError`"
)]
pub trait StepReturn<S> {
    /// The untyped outcome.
    fn into_step_outcome(self) -> Result<StepOutcome, StepError>;
}

impl<S: WorkflowStep, E: Into<StepError>> StepReturn<S> for Result<Transition<S>, E> {
    fn into_step_outcome(self) -> Result<StepOutcome, StepError> {
        self.map_err(Into::into)?.into_outcome()
    }
}

/// Encodes a step fn's return value; `R` is written out (the step's
/// return type, at its span) so a wrong one is reported there.
pub fn finish_step<S: WorkflowStep, R: StepReturn<S>>(
    returned: R,
) -> Result<StepOutcome, StepError> {
    returned.into_step_outcome()
}

/// The future of a step fn, which the runtime moves between threads.
pub fn step_future<F: Future + Send>(future: F) -> F {
    future
}

/// The bounds of a step parameter, checked where the step enum serializes
/// the field (`#[serde(with = "step_field")]`), so a missing bound is
/// reported at the parameter with this message.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a `#[step]` parameter",
    label = "step parameters must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "a step's parameters are stored in the run's payload as MessagePack: derive `serde::Serialize` and `serde::Deserialize` for `{Self}` (and keep it `Send`)"
)]
pub trait StepField: serde::Serialize + serde::de::DeserializeOwned + Send + 'static {}
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> StepField for T {}

/// `#[serde(with)]` of a step field: serde's own, behind [`StepField`].
pub mod step_field {
    /// Serializes the field.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<T: super::StepField, S: serde::Serializer>(
        value: &T,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        value.serialize(serializer)
    }

    /// Deserializes the field.
    ///
    /// # Errors
    /// The deserializer's.
    pub fn deserialize<'de, T: super::StepField, D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<T, D::Error> {
        T::deserialize(deserializer)
    }
}

/// The output of a workflow, checked where `Workflow::Output` is defined.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the output of a `#[workflow]`",
    label = "a workflow's output must be `Serialize + DeserializeOwned + Send + 'static`",
    note = "the output is stored as MessagePack for the caller: derive `serde::Serialize` and `serde::Deserialize` for `{Self}`"
)]
pub trait WorkflowOutputType {
    /// `Self`.
    type Type: serde::Serialize + serde::de::DeserializeOwned + Send + 'static;
}
impl<T: serde::Serialize + serde::de::DeserializeOwned + Send + 'static> WorkflowOutputType for T {
    type Type = T;
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
