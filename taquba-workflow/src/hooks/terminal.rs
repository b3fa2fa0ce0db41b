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
///
/// The hook's faults stay its own: the run's termination has committed
/// before the hook runs, and no caller's `wait`, `status` or `cancel` ever
/// sees them. A panic in [`on_termination`](Self::on_termination) (also
/// one raised before its future exists) is logged with the run id and
/// counts as a transient error. A call that has not returned within
/// [`WorkflowRuntimeBuilder::hook_timeout`](crate::WorkflowRuntimeBuilder::hook_timeout)
/// (default: the queue's lease less a fifth, at most 5 s less, at least
/// 1 s) is dropped and counts as a transient error too; the
/// notification's lease is extended to cover the timeout, so a call still
/// running is never delivered to a second runner slot. A hook that blocks its thread
/// instead of awaiting cannot be timed out: keep blocking work off the
/// runtime's threads (`tokio::task::spawn_blocking`).
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
    /// the run terminates, inside the terminating settlement (so keep it a
    /// quick, pure judgement of `outcome`). `false` enqueues no
    /// notification job. Default `true`.
    ///
    /// A panic here is logged with the run id and the panic's message and
    /// counts as `true`: the run still terminates, and the notification is
    /// enqueued so that [`on_termination`](Self::on_termination) decides
    /// under its retry rules. A notification skipped is lost for good,
    /// while one enqueued for nothing costs an idempotent hook one call.
    fn observes(&self, outcome: &RunOutcome) -> bool {
        let _ = outcome;
        true
    }
}

/// A shared hook handles terminations as the hook it points to: hand one
/// hook to several runtimes (the shards of a
/// [`ClusterRuntime`](crate::cluster::ClusterRuntime)) as an `Arc`.
impl<T: TerminalHook + ?Sized> TerminalHook for std::sync::Arc<T> {
    fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> impl Future<Output = Result<(), StepError>> + Send {
        (**self).on_termination(outcome, effects)
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        (**self).observes(outcome)
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
