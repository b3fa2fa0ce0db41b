//! The runner-facing types: the [`StepRunner`] trait an application
//! implements, the [`Step`] and [`Delivery`] it receives, and the
//! [`StepOutcome`] / [`StepError`] it returns.

use std::collections::HashMap;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use taquba::LeaseHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::run::effects::EffectsHandle;
use crate::store::keys::RunId;
use crate::store::kv::KvReadHandle;
use crate::store::memo::{Memo, MemoStore};

/// The per-step logic of a workflow: bytes in ([`Step::payload`]), a
/// decision out ([`StepOutcome`]). The runtime persists everything else.
///
/// Delivery is at-least-once: a step whose lease expires, or whose process
/// crashes before the settlement commits, runs again with the same
/// `(run_id, step_number, payload)`. Implementations must be idempotent for
/// that triple; [`Delivery::memo`] records expensive side effects so a retry
/// does not repeat them.
///
/// A runner that panics is treated as a transient error carrying the panic
/// message: the step is retried, and dead-letters (the run ends `Failed`,
/// naming the panic) once its attempts are exhausted.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a step runner",
    label = "implement `taquba_workflow::StepRunner` for `{Self}`",
    note = "a step runner is `impl StepRunner for T {{ async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {{ .. }} }}` with `T: Send + Sync`"
)]
pub trait StepRunner: Send + Sync {
    /// Run one step and decide what happens next.
    ///
    /// # Errors
    /// [`StepError::transient`] retries the step with the queue's backoff
    /// up to its attempt limit, then dead-letters it and fails the run;
    /// [`StepError::permanent`] dead-letters at once and fails the run.
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send;
}

/// When the next step of a [`StepOutcome::Continue`] becomes claimable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// At once.
    Immediate,
    /// After the delay, measured on the runtime's clock; the timer is a
    /// scheduled queue job, so it survives restarts and holds no worker.
    After(Duration),
    /// When a signal for `correlation_key` arrives through
    /// [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal), or when
    /// `timeout` elapses, whichever comes first. The next step sees
    /// [`Step::signal`] `Some(payload)` or `None` (timeout).
    OnSignal {
        /// The key the signal is sent under. One waiter per key.
        correlation_key: String,
        /// How long to wait before the step runs without a signal.
        timeout: Duration,
    },
}

/// What a step decided. Every variant is settled in one queue transaction
/// with the acknowledgement of the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Enqueue the next step (step number + 1) with `payload`, claimable
    /// per `when`.
    Continue {
        /// The next step's payload.
        payload: Vec<u8>,
        /// When the next step becomes claimable.
        when: Trigger,
    },
    /// The run succeeded with `result` (the bytes
    /// [`RunOutcome::result`](crate::RunOutcome::result) reports).
    Succeed {
        /// The run's result bytes.
        result: Vec<u8>,
    },
    /// The run failed: a verdict of the runner, acknowledged normally (no
    /// dead letter). The reason is the run's error.
    Fail {
        /// Why the run failed.
        reason: String,
    },
    /// The runner cancelled the run; the reason is reported on
    /// [`RunOutcome::error`](crate::RunOutcome::error). Staged effects are
    /// kept.
    Cancel {
        /// Why the run was cancelled.
        reason: String,
    },
}

impl StepOutcome {
    /// Continue with `payload` at once.
    pub fn continue_now(payload: Vec<u8>) -> Self {
        Self::Continue {
            payload,
            when: Trigger::Immediate,
        }
    }

    /// Continue with `payload` after `delay` (a durable timer).
    pub fn continue_after(payload: Vec<u8>, delay: Duration) -> Self {
        Self::Continue {
            payload,
            when: Trigger::After(delay),
        }
    }

    /// Continue with `payload` when a signal for `correlation_key` arrives
    /// or after `timeout`.
    pub fn continue_on_signal(
        payload: Vec<u8>,
        correlation_key: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        Self::Continue {
            payload,
            when: Trigger::OnSignal {
                correlation_key: correlation_key.into(),
                timeout,
            },
        }
    }
}

/// How a [`StepError`] is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepErrorKind {
    /// Retry with backoff up to the attempt limit, then dead-letter.
    Transient,
    /// Dead-letter at once.
    Permanent,
}

/// A step that could not produce an outcome. The message becomes the
/// queue job's `last_error` and, when the error ends the run, the run's
/// error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StepError {
    /// What went wrong.
    pub message: String,
    /// Whether a retry may help.
    pub kind: StepErrorKind,
}

impl StepError {
    /// A failure a retry may fix (a timeout, a 503, a lost connection).
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: StepErrorKind::Transient,
        }
    }

    /// A failure no retry can fix (bad input, a 4xx).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: StepErrorKind::Permanent,
        }
    }
}

impl From<Error> for StepError {
    /// Transient for storage errors, permanent for the rest
    /// ([`Error::is_permanent`]).
    fn from(err: Error) -> Self {
        let kind = if err.is_permanent() {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        };
        Self {
            message: err.to_string(),
            kind,
        }
    }
}

/// One delivery of a step job: who it belongs to and the handles a runner
/// uses during the step. [`Step`] and
/// [`JobContext`](crate::jobs::JobContext) dereference to it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The run the step belongs to.
    pub run_id: RunId,
    /// The submitter's headers ([`RunOptions::headers`](crate::RunOptions::headers)),
    /// without the reserved `workflow.` ones.
    pub headers: HashMap<String, String>,
    /// The queue job id of this step.
    pub job_id: String,
    /// Attempts consumed including this one (1 on the first delivery).
    pub attempts: u32,
    /// The step's attempt limit.
    pub max_attempts: u32,
    /// Fired when the run is cancelled from outside
    /// ([`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel)). The
    /// runner's outcome is then discarded and the run ends `Cancelled`, so a
    /// runner that watches the token only returns sooner.
    pub cancel_token: CancellationToken,
    /// The step's lease: extend it ([`LeaseHandle::ensure_at_least`]) before
    /// a call that may outlive it, or the reaper delivers the step again.
    pub lease: LeaseHandle,
    /// Durable memo scoped to `(run_id, step_number)`.
    pub memo: Memo,
    /// Durable memo shared by every step of the run.
    pub run_memo: Memo,
    /// KV writes and deletes committed with this step's settlement.
    pub effects: EffectsHandle,
    /// Reads of committed KV state.
    pub kv: KvReadHandle,
}

impl Delivery {
    /// Whether a transient error from this attempt dead-letters the step
    /// (`attempts >= max_attempts`).
    pub fn is_last_attempt(&self) -> bool {
        self.attempts >= self.max_attempts
    }

    /// A delivery bound to no queue, for unit tests of runners: run id
    /// `"detached"`, first of three attempts, a token never fired by the
    /// runtime, a detached lease, memos in a private in-memory store,
    /// effects that are staged and dropped, KV reads that find nothing.
    pub fn detached() -> Self {
        let run_id = RunId::new("detached").expect("a valid literal id");
        let memos = MemoStore::new(
            std::sync::Arc::new(taquba::object_store::memory::InMemory::new()),
            "detached-memo",
        );
        Self {
            memo: memos.new_memo(&run_id, 0),
            run_memo: memos.new_run_memo(&run_id),
            run_id,
            headers: HashMap::new(),
            job_id: "detached".to_string(),
            attempts: 1,
            max_attempts: 3,
            cancel_token: CancellationToken::new(),
            lease: LeaseHandle::detached(),
            effects: EffectsHandle::detached(),
            kv: KvReadHandle::detached(),
        }
    }
}

/// One step of a run as the runner sees it. Dereferences to its
/// [`Delivery`].
#[derive(Debug, Clone)]
pub struct Step {
    /// The delivery: run id, headers, attempts, handles.
    pub delivery: Delivery,
    /// 0 for the run's first step, then +1 per `Continue`.
    pub step_number: u32,
    /// The step's payload: the run's input for step 0, the previous step's
    /// `Continue` payload after.
    pub payload: Vec<u8>,
    /// For a step after [`Trigger::OnSignal`]: `Some(payload)` when the
    /// signal arrived, `None` when the wait timed out. `None` otherwise.
    /// The same value on every redelivery.
    pub signal: Option<Vec<u8>>,
}

impl Step {
    /// A step 0 with `payload` over a [`Delivery::detached`], for tests.
    pub fn detached(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            delivery: Delivery::detached(),
            step_number: 0,
            payload: payload.into(),
            signal: None,
        }
    }

    /// See [`Delivery::is_last_attempt`].
    pub fn is_last_attempt(&self) -> bool {
        self.delivery.is_last_attempt()
    }
}

impl Deref for Step {
    type Target = Delivery;
    fn deref(&self) -> &Delivery {
        &self.delivery
    }
}

impl DerefMut for Step {
    fn deref_mut(&mut self) -> &mut Delivery {
        &mut self.delivery
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_build_the_triggers() {
        assert_eq!(
            StepOutcome::continue_after(vec![1], Duration::from_secs(2)),
            StepOutcome::Continue {
                payload: vec![1],
                when: Trigger::After(Duration::from_secs(2))
            }
        );
        assert!(matches!(
            StepOutcome::continue_on_signal(vec![], "k", Duration::ZERO),
            StepOutcome::Continue { when: Trigger::OnSignal { ref correlation_key, .. }, .. } if correlation_key == "k"
        ));
    }

    #[test]
    fn a_detached_step_is_a_first_attempt_of_step_zero() {
        let step = Step::detached(b"x".to_vec());
        assert_eq!(step.step_number, 0);
        assert_eq!(step.run_id, "detached");
        assert!(!step.is_last_attempt());
        assert_eq!(StepError::transient("boom").to_string(), "boom");
    }
}
