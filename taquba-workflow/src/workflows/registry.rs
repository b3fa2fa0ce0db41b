//! The registry of `#[workflow]`s linked into the binary (one `inventory`
//! entry each, which the macro writes) and the type-erased workflow a
//! [`Workflows`](crate::workflows::Workflows) router dispatches to.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use crate::workflows::Workflow;
use crate::{Step, StepError, StepOutcome, StepRunner};

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
    let names: Vec<&str> = W::STEPS
        .iter()
        .copied()
        .chain(W::ALIASES.iter().map(|(alias, _)| *alias))
        .collect();
    crate::runner::Hosted::workflow(W::NAME, &names)
}

/// What the `StepRunner` impl `#[workflow]` writes answers to
/// `StepRunner::code`: the workflow `W` with its version and patches.
pub fn workflow_code<W: Workflow>() -> crate::versioning::HostedCode {
    let mut code = crate::versioning::CodeInfo::new();
    code.version = W::VERSION.map(str::to_string);
    for patch in W::PATCHES {
        code = code.patch(*patch);
    }
    crate::versioning::HostedCode::workflow(W::NAME, code)
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
    /// `StepRunner::code` (none by default).
    fn code(&self) -> crate::versioning::HostedCode {
        crate::versioning::HostedCode::default()
    }
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

    fn code(&self) -> crate::versioning::HostedCode {
        StepRunner::code(self)
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
