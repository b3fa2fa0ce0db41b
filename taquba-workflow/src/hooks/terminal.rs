//! Who hears of terminations: the [`TerminalHook`] run once per committed
//! termination (a [`RunOutcome`]) as a notification job on the runtime's
//! queue, and the [`NoopTerminalHook`].

use std::future::Future;

use crate::model::RunOutcome;
use crate::model::StepError;
use crate::run::effects::TerminalEffects;

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
    use std::collections::HashMap;

    use super::*;
    use crate::model::TerminalStatus;
    use crate::store::keys::RunId;

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
