//! The checks and glue of the code `#[job]` generates: its return type,
//! output, error and parameters, its key template's parts and its
//! `classify` fn, each checked once at the user's token.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use crate::jobs::Job;

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
    /// [`Job::concurrency_key`].
    fn concurrency_key(&self) -> Option<String> {
        None
    }
    /// [`Job::concurrency_limit`].
    fn concurrency_limit(&self) -> u32 {
        1
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

    fn concurrency_key(&self) -> Option<String> {
        GeneratedJob::concurrency_key(self)
    }

    fn concurrency_limit(&self) -> u32 {
        GeneratedJob::concurrency_limit(self)
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
