//! Signals addressed to one run's current wait:
//! [`WorkflowRuntime::signal_run`](crate::WorkflowRuntime::signal_run)
//! wakes the named run's step waiting on the key and nothing else. Unlike
//! [`signal`](crate::WorkflowRuntime::signal), it never buffers: a signal
//! the run is not waiting for (sent early, after the wait timed out, a
//! second time, on another key) is refused, so it cannot wake a later,
//! unrelated wait on the key.
//!
//! The run is waiting when the key's registered waiter names it and its
//! current step, and that step is still scheduled and never ran (its
//! timeout has not fired). The check and the wake happen under the key's
//! signal lock, as `signal`'s do, so a wait registered or consumed
//! concurrently is seen whole.

use taquba::WakeOutcome;
use tracing::debug;

use crate::coordination::signal::check_payload;
use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::store::durable::{self, DurableWaiter};
use crate::store::keys::{RunId, signal_waiter_kv_key};

impl RuntimeCore {
    /// Deliver `payload` to `run_id`'s current wait on `correlation_key`.
    ///
    /// # Errors
    /// [`Error::NotWaitingForSignal`] when the run is not waiting on the
    /// key; [`Error::RunNotFound`] for a run neither active nor recorded as
    /// terminated; `KvValueTooLarge` for an oversized payload; storage
    /// errors.
    pub(crate) async fn signal_run(
        &self,
        run_id: &RunId,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<()> {
        crate::coordination::signal::check_correlation_key(correlation_key)?;
        check_payload(&payload)?;
        let _lock = self.signal_locks.lock(correlation_key).await;
        let waiter_key = signal_waiter_kv_key(correlation_key);
        let Some(bytes) = self.queue.view().kv_get(&waiter_key).await? else {
            return Err(self.not_waiting(run_id, correlation_key).await?);
        };
        let waiter =
            durable::decode_or_absent::<DurableWaiter>(&bytes, "signal waiter", &correlation_key)
                .filter(|waiter| waiter.run_id == *run_id);
        let Some(waiter) = waiter else {
            return Err(self.not_waiting(run_id, correlation_key).await?);
        };
        let waiting = self.waits_at(run_id, &waiter).await?;
        #[cfg(feature = "opentelemetry")]
        let sender = match waiting {
            true => self.note_signal_sender(&waiter.job_id).await?,
            false => None,
        };
        if waiting
            && self
                .commits
                .wake_scheduled(&waiter.job_id, Some(payload))
                .await?
                == WakeOutcome::Woken
        {
            self.commits.kv_compare_delete(&waiter_key, &bytes).await?;
            debug!(correlation_key, run_id = %run_id, "signal delivered to the run's wait");
            return Ok(());
        }
        #[cfg(feature = "opentelemetry")]
        self.unnote_signal_sender(sender).await?;
        Err(self.not_waiting(run_id, correlation_key).await?)
    }

    /// Whether `waiter` (of `run_id`) is the run's current step, scheduled
    /// and never run (a step that ran observed its timeout).
    pub(super) async fn waits_at(&self, run_id: &RunId, waiter: &DurableWaiter) -> Result<bool> {
        let Some(pointer) = self.view.current_step_if_active(run_id).await? else {
            return Ok(false);
        };
        if pointer.job_id != waiter.job_id {
            return Ok(false);
        }
        self.is_waiting(waiter).await
    }

    /// The refusal of a signal to `run_id`, which is not waiting on
    /// `correlation_key`.
    pub(super) async fn not_waiting(&self, run_id: &RunId, correlation_key: &str) -> Result<Error> {
        if self.view.run_record(run_id).await?.is_none()
            && self.view.terminal_record(run_id).await?.is_none()
        {
            return Ok(Error::RunNotFound(run_id.clone()));
        }
        Ok(Error::NotWaitingForSignal {
            run_id: run_id.clone(),
            correlation_key: correlation_key.to_string(),
        })
    }
}
