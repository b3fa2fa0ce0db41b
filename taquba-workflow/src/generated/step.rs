//! The checks and glue of the code `#[workflow]` generates for its steps:
//! decoding a step, converting what a step fn returns (its transition and
//! its error) into the step's outcome, and the step parameters' bounds.

use std::future::Future;
use std::marker::PhantomData;

use crate::workflows::{Transition, Workflow, WorkflowStep};
use crate::{Step, StepError, StepOutcome};

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
/// bound is one error there (the enum is serialized through [`FieldProbe`](crate::generated::job::FieldProbe)).
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
