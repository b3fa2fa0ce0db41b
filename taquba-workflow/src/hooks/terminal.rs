//! Terminations and who hears of them: [`TerminalStatus`], the committed
//! [`RunOutcome`], and the [`TerminalHook`] run once per committed
//! termination as a notification job on the runtime's queue.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;

use crate::run::effects::TerminalEffects;
use crate::runner::StepError;
use crate::store::keys::RunId;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalStatus {
    /// The runner returned [`StepOutcome::Succeed`](crate::StepOutcome::Succeed).
    Succeeded,
    /// The runner returned [`StepOutcome::Fail`](crate::StepOutcome::Fail),
    /// or a step dead-lettered (permanent error, attempts exhausted, lease
    /// expired past its attempts).
    Failed,
    /// The runner returned [`StepOutcome::Cancel`](crate::StepOutcome::Cancel)
    /// or the run was cancelled from outside.
    Cancelled,
}

impl TerminalStatus {
    /// `"succeeded"`, `"failed"` or `"cancelled"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TerminalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The committed outcome of a run, as a [`TerminalHook`] receives it and
/// [`WorkflowRuntime::outcome`](crate::WorkflowRuntime::outcome) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run.
    pub run_id: RunId,
    /// How it ended.
    pub status: TerminalStatus,
    /// The `Succeed` result bytes; `None` otherwise.
    pub result: Option<Vec<u8>>,
    /// The failure's error, or the reason of a runner-issued cancel; `None`
    /// on success and for an external cancellation.
    pub error: Option<String>,
    /// The submitter's headers (without the reserved `workflow.` ones).
    pub headers: HashMap<String, String>,
    /// The step the run terminated at.
    pub final_step: u32,
}

/// Processes each committed termination of a run.
///
/// The settlement that terminates a run enqueues, in the same transaction, a
/// notification job on the runtime's queue; the worker runs the hook as that
/// job's handler. The hook therefore sees only terminations that committed,
/// at least once each: make it idempotent. A transient error retries the
/// notification with the queue's backoff up to the terminal step's attempt
/// limit; a permanent error (or the last attempt) dead-letters it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a terminal hook",
    label = "implement `taquba_workflow::TerminalHook` for `{Self}`, or pass `NoopTerminalHook`"
)]
pub trait TerminalHook: Send + Sync {
    /// Handle one termination. Effects staged on `effects` commit with the
    /// notification's acknowledgement.
    ///
    /// # Errors
    /// A [`StepError`]: transient retries the notification, permanent
    /// dead-letters it.
    fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> impl Future<Output = Result<(), StepError>> + Send;

    /// Whether this hook wants a notification for `outcome`; consulted when
    /// the run terminates. `false` enqueues no notification job. Default
    /// `true`.
    fn observes(&self, outcome: &RunOutcome) -> bool {
        let _ = outcome;
        true
    }
}

/// A hook that observes nothing: runs terminate without notification jobs.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopTerminalHook;

impl TerminalHook for NoopTerminalHook {
    async fn on_termination(
        &self,
        _outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        Ok(())
    }

    fn observes(&self, _outcome: &RunOutcome) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_stable_names() {
        assert_eq!(TerminalStatus::Cancelled.to_string(), "cancelled");
        assert_eq!(TerminalStatus::Succeeded.as_str(), "succeeded");
        let outcome = RunOutcome {
            run_id: RunId::new("r").unwrap(),
            status: TerminalStatus::Failed,
            result: None,
            error: Some("x".into()),
            headers: HashMap::new(),
            final_step: 2,
        };
        assert!(!NoopTerminalHook.observes(&outcome));
    }
}
