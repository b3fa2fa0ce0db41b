//! Child workflows in `#[workflow]` steps: [`StepContext::start_child`]
//! stages a child run of another workflow and gives its [`ChildRun`]
//! handle (a step parameter like any other), [`Transition::on_child`]
//! waits for it durably and [`StepContext::child_result`] reads its typed
//! result in the step after. The raw surface is
//! [`children`](crate::children).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::coordination::children::{ChildEnd, child_correlation_key};
use crate::run::context::failure;
use crate::workflows::{
    StepContext, Transition, Workflow, WorkflowError, WorkflowInput, WorkflowOf, WorkflowResult,
    decode_output, encode_input,
};
use crate::{RunId, RunOptions, StepError, TerminalStatus, Trigger};

/// A child run of workflow `W` started by a step
/// ([`StepContext::start_child`]). Serialized as its run id, so a step can
/// pass it to the next step as a parameter.
pub struct ChildRun<W> {
    run_id: RunId,
    workflow: PhantomData<fn() -> W>,
}

impl<W> ChildRun<W> {
    /// The handle of the child run `run_id` (of workflow `W`).
    pub fn new(run_id: RunId) -> Self {
        Self {
            run_id,
            workflow: PhantomData,
        }
    }

    /// The child's run id (`{parent}--{key}`).
    pub fn id(&self) -> &RunId {
        &self.run_id
    }
}

impl<W> Clone for ChildRun<W> {
    fn clone(&self) -> Self {
        Self::new(self.run_id.clone())
    }
}

impl<W> fmt::Debug for ChildRun<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ChildRun").field(&self.run_id).finish()
    }
}

impl<W> PartialEq for ChildRun<W> {
    fn eq(&self, other: &Self) -> bool {
        self.run_id == other.run_id
    }
}

impl<W> Eq for ChildRun<W> {}

impl<W> Hash for ChildRun<W> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.run_id.hash(state);
    }
}

impl<W> Serialize for ChildRun<W> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.run_id.serialize(serializer)
    }
}

impl<'de, W> Deserialize<'de> for ChildRun<W> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        RunId::deserialize(deserializer).map(Self::new)
    }
}

impl StepContext<'_> {
    /// Start a run of the workflow `input` starts as this run's child
    /// under `key`, with default options: it is committed with this step's
    /// settlement (nothing starts when the step errors or is cancelled), as
    /// run [`child_run_id`](crate::children::child_run_id)`(this run,
    /// key)`, so a retried step starts the same child once. Wait for it
    /// with [`Transition::on_child`].
    ///
    /// # Errors
    /// A permanent [`StepError`] naming the key when it gives no valid run
    /// id (see [`ChildrenHandle::start`](crate::children::ChildrenHandle::start))
    /// or the input cannot be encoded.
    pub fn start_child<I: WorkflowInput>(
        &self,
        key: &str,
        input: I,
    ) -> std::result::Result<ChildRun<WorkflowOf<I>>, StepError> {
        self.start_child_with(key, input, RunOptions::default())
    }

    /// [`start_child`](Self::start_child) with `options` (headers,
    /// priority, attempts, start time) for the child.
    ///
    /// # Errors
    /// As [`start_child`](Self::start_child), and for options a
    /// submission could not carry.
    pub fn start_child_with<I: WorkflowInput>(
        &self,
        key: &str,
        input: I,
        options: RunOptions,
    ) -> std::result::Result<ChildRun<WorkflowOf<I>>, StepError> {
        let name = <WorkflowOf<I> as Workflow>::NAME;
        let payload = encode_input(input).map_err(|e| {
            failure(format_args!(
                "step `{}` of workflow `{}`: cannot encode the input of child `{key}` (workflow `{name}`): {e}",
                self.step_name(),
                self.workflow_name()
            ))
        })?;
        let run_id = self
            .step()
            .delivery
            .children
            .start(key, payload, options)
            .map_err(|e| {
                failure(format_args!(
                    "step `{}` of workflow `{}`: cannot start child `{key}` (workflow `{name}`): {e}",
                    self.step_name(),
                    self.workflow_name()
                ))
            })?;
        Ok(ChildRun::new(run_id))
    }

    /// The result of `child` when this step follows a
    /// [`Transition::on_child`] wait on it: `Ok(None)` when the wait timed
    /// out (the child had not ended; it keeps running), else
    /// `Ok(Some(Ok(output)))` for a child that succeeded and
    /// `Ok(Some(Err(error)))` for one that failed or was cancelled, the
    /// parent's to handle.
    ///
    /// # Errors
    /// A permanent [`StepError`] when the step's signal is not `child`'s
    /// end (the step did not wait on it), or its result does not decode as
    /// `W`'s output.
    pub fn child_result<W: Workflow>(
        &self,
        child: &ChildRun<W>,
    ) -> std::result::Result<Option<WorkflowResult<W>>, StepError> {
        let end = ChildEnd::of_signal(self.step().signal.as_deref()).map_err(|e| {
            failure(format_args!(
                "step `{}` of workflow `{}`: its signal is not the end of child run `{}`: {e}",
                self.step_name(),
                self.workflow_name(),
                child.id()
            ))
        })?;
        let Some(end) = end else {
            return Ok(None);
        };
        if end.run_id != *child.id() {
            return Err(failure(format_args!(
                "step `{}` of workflow `{}`: it was woken by the end of child run `{}`, not `{}`",
                self.step_name(),
                self.workflow_name(),
                end.run_id,
                child.id()
            )));
        }
        match (end.status, end.result) {
            (TerminalStatus::Succeeded, None) => Err(failure(format_args!(
                "step `{}` of workflow `{}`: {}",
                self.step_name(),
                self.workflow_name(),
                end.error.as_deref().unwrap_or("the child's end carries no result")
            ))),
            (TerminalStatus::Succeeded, Some(bytes)) => decode_output::<W>(&bytes)
                .map(|output| Some(Ok(output)))
                .map_err(|e| {
                    failure(format_args!(
                        "step `{}` of workflow `{}`: the result of child run `{}` does not decode as the output of `{}`: {e}",
                        self.step_name(),
                        self.workflow_name(),
                        child.id(),
                        W::NAME
                    ))
                }),
            (status, _) => Ok(Some(Err(WorkflowError {
                run_id: end.run_id,
                status,
                kind: end.error_kind,
                message: end.error,
            }))),
        }
    }
}

impl<S> Transition<S> {
    /// Run `step` next once `child` ended, or when `timeout` passes first
    /// (the child keeps running; the step sees `None` from
    /// [`StepContext::child_result`] and may wait again). The wait is the
    /// durable signal wait on the child's correlation key.
    pub fn on_child<W>(step: S, child: &ChildRun<W>, timeout: Duration) -> Self {
        Self::continue_with(
            step,
            Trigger::OnSignal {
                correlation_key: child_correlation_key(child.id()),
                timeout,
            },
        )
    }
}
