//! Calling the application's [`TerminalHook`] so that its faults stay its
//! own: a panic in [`TerminalHook::observes`] or
//! [`TerminalHook::on_termination`] is caught and logged with the run id,
//! and each `on_termination` call is bounded by the runtime's hook timeout,
//! with the notification's lease extended to cover it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use futures_util::FutureExt;
use taquba::LeaseHandle;
use tracing::{error, warn};

use crate::hooks::terminal::TerminalHook;
use crate::model::{RunOutcome, StepError};
use crate::run::effects::TerminalEffects;

/// The share of the lease the default hook timeout leaves for settling.
const DEFAULT_MARGIN_FRACTION: u32 = 5;
/// The most the default hook timeout leaves for settling.
const MAX_DEFAULT_MARGIN: Duration = Duration::from_secs(5);

/// The longest hook timeout: a year. A longer one (`Duration::MAX`, the
/// spelling of "no timeout") is taken as this, since the lease extension
/// that covers the call is counted in milliseconds on the queue's clock
/// and would overflow it.
pub(crate) const MAX_HOOK_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest lease the worker claims a job for: a year. taquba counts a
/// lease in milliseconds on the queue's clock and overflows on a longer
/// one (`Duration::MAX`, a plausible "never reap"), so a longer
/// [`taquba::QueueConfig::lease_duration`] is taken as this.
pub(crate) const MAX_CLAIM_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The lease the worker claims the jobs of `queue_name` for: the queue's
/// configured lease, at most [`MAX_CLAIM_LEASE`].
pub(crate) fn claim_lease(queue: &taquba::Queue, queue_name: &str) -> Duration {
    queue.queue_lease_duration(queue_name).min(MAX_CLAIM_LEASE)
}

/// The shortest default hook timeout: a lease shorter than a second and a
/// quarter (zero, say) would leave a hook less time than an HTTP round
/// trip, or none. The lease is extended to cover the call either way.
const MIN_DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(1);

/// The default bound on one `on_termination` call for a queue whose jobs
/// are leased for `lease`: the lease less a fifth of it, at most 5 s less
/// (25 s for taquba's default 30 s lease), so the call ends, and its
/// settlement commits, while the notification is still leased; at least
/// 1 s.
pub(crate) fn default_hook_timeout(lease: Duration) -> Duration {
    (lease - settlement_margin(lease)).max(MIN_DEFAULT_HOOK_TIMEOUT)
}

/// The part of a `lease` left for a settlement to commit once the work
/// under it is done: a fifth of it, at most 5 s.
pub(crate) fn settlement_margin(lease: Duration) -> Duration {
    (lease / DEFAULT_MARGIN_FRACTION).min(MAX_DEFAULT_MARGIN)
}

/// Whether `hook` wants a notification for `outcome`. A panic is logged
/// and counts as `true`: a notification enqueued for nothing costs the
/// hook one idempotent call, while one skipped is lost for good, so the
/// hook's `on_termination` decides under its own retry rules.
pub(crate) fn observes<H: TerminalHook + ?Sized>(hook: &H, outcome: &RunOutcome) -> bool {
    match catch_unwind(AssertUnwindSafe(|| hook.observes(outcome))) {
        Ok(observes) => observes,
        Err(panic) => {
            error!(
                run_id = %outcome.run_id,
                status = %outcome.status,
                "the terminal hook's `observes` panicked; the notification is enqueued as if observed: {}",
                panic_message(panic.as_ref())
            );
            true
        }
    }
}

/// Run `hook.on_termination` for `outcome`, bounded by `timeout`. The
/// notification's `lease` is first extended to cover the whole call, so
/// the queue does not deliver the notification to another slot while it
/// runs here. A panic (also one raised before the hook's future exists)
/// and a timeout are transient errors naming the cause, so the
/// notification is retried per the queue's backoff and dead-lettered on
/// its last attempt; a timed-out call is dropped at its next await.
///
/// # Errors
/// The hook's error; a transient [`StepError`] for a panic or a timeout.
pub(crate) async fn on_termination<H: TerminalHook + ?Sized>(
    hook: &H,
    outcome: &RunOutcome,
    effects: &TerminalEffects,
    lease: &LeaseHandle,
    timeout: Duration,
) -> Result<(), StepError> {
    match lease.ensure_at_least(timeout) {
        Ok(()) => {}
        // The reaper took the claim back: the delivery that holds the job
        // now runs the hook.
        Err(taquba::Error::ClaimLost) => {
            return Err(StepError::transient(
                "the notification's claim ended before the terminal hook ran",
            ));
        }
        // A cancellation of the notification job itself: the hook still
        // runs, under the lease as it is.
        Err(err) => {
            warn!(run_id = %outcome.run_id, "the notification's lease was not extended to the hook timeout: {err}");
        }
    }
    // The call happens inside the guarded future, so a hook that panics
    // before returning its future is caught as well.
    let call =
        AssertUnwindSafe(async { hook.on_termination(outcome, effects).await }).catch_unwind();
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(result)) => result,
        Ok(Err(panic)) => {
            let message = panic_message(panic.as_ref());
            warn!(run_id = %outcome.run_id, "terminal hook panicked: {message}");
            Err(StepError::transient(format!(
                "terminal hook panicked: {message}"
            )))
        }
        Err(_) => {
            warn!(run_id = %outcome.run_id, ?timeout, "terminal hook did not return in time; retried");
            Err(StepError::transient(format!(
                "terminal hook did not return within {timeout:?}"
            )))
        }
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::model::{StepErrorKind, TerminalStatus};
    use crate::store::keys::RunId;

    fn outcome() -> RunOutcome {
        RunOutcome {
            run_id: RunId::new("r").unwrap(),
            status: TerminalStatus::Succeeded,
            result: None,
            error: None,
            headers: HashMap::new(),
            final_step: 0,
        }
    }

    #[test]
    fn the_default_timeout_leaves_a_margin_of_the_lease() {
        assert_eq!(
            default_hook_timeout(Duration::from_secs(30)),
            Duration::from_secs(25)
        );
        assert_eq!(
            default_hook_timeout(Duration::from_secs(2)),
            Duration::from_millis(1600)
        );
        assert_eq!(
            default_hook_timeout(Duration::from_secs(600)),
            Duration::from_secs(595)
        );
        assert_eq!(default_hook_timeout(Duration::ZERO), Duration::from_secs(1));
        assert_eq!(
            default_hook_timeout(Duration::from_millis(500)),
            Duration::from_secs(1)
        );
    }

    struct Panics;

    impl TerminalHook for Panics {
        #[allow(clippy::manual_async_fn)]
        fn on_termination(
            &self,
            _outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> impl Future<Output = Result<(), StepError>> + Send {
            panic!("no future");
            #[allow(unreachable_code)]
            async {
                Ok(())
            }
        }

        fn observes(&self, _outcome: &RunOutcome) -> bool {
            panic!("no judgement")
        }
    }

    #[test]
    fn a_panicking_observes_counts_as_observing() {
        assert!(observes(&Panics, &outcome()));
        assert!(!observes(&crate::NoopTerminalHook, &outcome()));
    }

    #[tokio::test(start_paused = true)]
    async fn panics_and_timeouts_are_transient_errors() {
        let effects = TerminalEffects::detached();
        let lease = LeaseHandle::detached();
        let err = on_termination(
            &Panics,
            &outcome(),
            &effects,
            &lease,
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, StepErrorKind::Transient);
        assert!(err.message.contains("panicked: no future"), "{err:?}");

        struct Hangs;
        impl TerminalHook for Hangs {
            async fn on_termination(
                &self,
                _outcome: &RunOutcome,
                _effects: &TerminalEffects,
            ) -> Result<(), StepError> {
                std::future::pending().await
            }
        }
        let err = on_termination(&Hangs, &outcome(), &effects, &lease, Duration::from_secs(3))
            .await
            .unwrap_err();
        assert_eq!(err.kind, StepErrorKind::Transient);
        assert!(err.message.contains("within 3s"), "{err:?}");
    }
}
