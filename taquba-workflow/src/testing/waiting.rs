//! What an active run waits for ([`Waiting`]), read from its details in the
//! view ([`WorkflowView::run`]), for the [`TestError::NotEnded`] a test
//! gets when it asks for the output of a run that has not ended.

use std::fmt;
use std::future::Future;

use super::error::TestError;
use crate::model::RunState;
use crate::store::keys::RunId;
use crate::view::WorkflowView;
use crate::view::types::RunDetails;

/// What the kit needs of an environment whatever its runner: the current
/// view (for the run handles, which outlive crashes).
pub(crate) trait CurrentView: Send + Sync {
    /// The view of the current runtime.
    fn view(&self) -> std::result::Result<WorkflowView, TestError>;
    /// The clock's time, ms since the UNIX epoch.
    fn now_ms(&self) -> u64;
}

/// What the current step of a run that has not ended waits for, from
/// [`WorkflowView::run`]. Times are ms since the UNIX epoch on the
/// environment's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waiting {
    /// Nothing: the step is due now, and runs at the next
    /// [`run_until_idle`](super::TestRuntime::run_until_idle).
    Due,
    /// The step is claimed: running or settling (a `run_until_idle` the
    /// test dropped), or held by a claim of the test's own.
    Running,
    /// A cancellation was requested and the run has not applied it yet.
    Cancelling,
    /// A durable timer ([`Trigger::After`](crate::Trigger::After), or a
    /// delayed start).
    Timer {
        /// When it fires.
        due_at_ms: u64,
    },
    /// A signal: the step runs when one is sent under `correlation_key`,
    /// or without one at `timeout_at_ms`.
    Signal {
        /// The key a signal must be sent under.
        correlation_key: String,
        /// When the wait times out.
        timeout_at_ms: Option<u64>,
    },
    /// A retry backoff: attempt `attempts` failed with a transient error.
    Retry {
        /// The attempts the step consumed so far.
        attempts: u32,
        /// The failed attempt's error.
        error: Option<String>,
        /// When the next attempt is due.
        due_at_ms: u64,
    },
}

impl Waiting {
    /// What the step of the run `details` describe waits for.
    pub(crate) fn of(details: &RunDetails) -> Self {
        match &details.state {
            RunState::Running => return Self::Running,
            RunState::Cancelling => return Self::Cancelling,
            RunState::Pending | RunState::Terminated(_) => {}
        }
        if let Some(signal) = &details.waiting_for_signal {
            return Self::Signal {
                correlation_key: signal.correlation_key.clone(),
                timeout_at_ms: signal.timeout_at_ms,
            };
        }
        match details.scheduled_at_ms {
            Some(due_at_ms) if details.attempts > 0 => Self::Retry {
                attempts: details.attempts,
                error: details.last_error.clone(),
                due_at_ms,
            },
            Some(due_at_ms) => Self::Timer { due_at_ms },
            None => Self::Due,
        }
    }

    /// The text of the wait, its times also as offsets from `now_ms`.
    pub(crate) fn describe(&self, now_ms: u64) -> String {
        let at = |ms: u64| format!("{ms} ms ({})", Offset(ms, now_ms));
        match self {
            Self::Due => "nothing: it is due now (run the queue until idle)".into(),
            Self::Running => {
                "its claim to settle: it is running, or claimed outside the worker".into()
            }
            Self::Cancelling => "its cancellation to be applied".into(),
            Self::Timer { due_at_ms } => format!("a timer due at {}", at(*due_at_ms)),
            Self::Signal {
                correlation_key,
                timeout_at_ms,
            } => match timeout_at_ms {
                Some(timeout) => format!(
                    "a signal under `{correlation_key}`, or its timeout at {}",
                    at(*timeout)
                ),
                None => format!("a signal under `{correlation_key}`"),
            },
            Self::Retry {
                attempts,
                error,
                due_at_ms,
            } => format!(
                "a retry backoff after attempt {attempts} failed{}: the next attempt is due at {}",
                error
                    .as_deref()
                    .map(|error| format!(" ({error})"))
                    .unwrap_or_default(),
                at(*due_at_ms)
            ),
        }
    }
}

/// `at` relative to `now`, in seconds.
struct Offset(u64, u64);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self(at, now) = *self;
        let secs = |ms: u64| ms as f64 / 1000.0;
        if at >= now {
            write!(f, "in {} s", secs(at - now))
        } else {
            write!(f, "{} s ago", secs(now - at))
        }
    }
}

/// The [`TestError::NotEnded`] of `run_id` at `now_ms`, from its details in
/// `view`: [`TestError::UnknownRun`] when it has none, a storage error as
/// itself. A run that ended meanwhile (a worker left running by a dropped
/// `run_until_idle`) is reported as running.
pub(crate) async fn not_ended(view: &WorkflowView, run_id: &RunId, now_ms: u64) -> TestError {
    match view.run(run_id).await {
        Ok(Some(details)) => TestError::NotEnded {
            run_id: run_id.clone(),
            step: details.step_name.clone(),
            waiting: match details.state {
                RunState::Terminated(_) => Waiting::Running,
                _ => Waiting::of(&details),
            },
            now_ms,
        },
        Ok(None) => TestError::UnknownRun(run_id.clone()),
        Err(err) => TestError::Runtime(err),
    }
}

/// What `read` returns once the run `run_id` ended, else its
/// [`TestError::NotEnded`] from `env`'s view. A run reported running is
/// read again: it may have ended since the first read (a worker left
/// running by a dropped `run_until_idle`).
pub(crate) async fn ended_or_waiting<T, F, Fut>(
    env: &dyn CurrentView,
    run_id: &RunId,
    read: F,
) -> Result<T, TestError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Option<T>, TestError>>,
{
    if let Some(ended) = read().await? {
        return Ok(ended);
    }
    let err = not_ended(&env.view()?, run_id, env.now_ms()).await;
    if matches!(
        err,
        TestError::NotEnded {
            waiting: Waiting::Running,
            ..
        }
    ) && let Some(ended) = read().await?
    {
        return Ok(ended);
    }
    Err(err)
}
