//! Durable signals, the engine's side: a step that continues on a signal registers a waiter
//! under its correlation key and its next step is scheduled at the timeout;
//! [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal) wakes that
//! step early with the payload attached to its queue record, or buffers the
//! signal for the next waiter. Registration, delivery and buffering of one
//! key are serialised by an in-process lock (the store has one writer), and
//! each change commits in one transaction.

use std::time::Duration;

use taquba::{JobRecord, JobStatus, SettlementEffects, WakeOutcome};
use tracing::{debug, warn};

use crate::engine::settle::{ClaimedStep, SettleKind, Settlement};
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::model::StepErrorKind;
use crate::model::TerminalStatus;
use crate::store::durable::{self, DurableRunRecord, DurableWaiter};
use crate::store::keys::{
    HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, RunId, signal_buffer_kv_key,
    signal_delivered_kv_key, signal_waiter_kv_key,
};

/// Lock stripes of correlation keys.
use crate::coordination::signal::{SignalOutcome, check_correlation_key, check_payload};

impl RuntimeCore {
    /// Deliver or buffer a signal.
    pub(crate) async fn signal(
        &self,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<SignalOutcome> {
        check_correlation_key(correlation_key)?;
        check_payload(&payload)?;
        let _lock = self.signal_locks.lock(correlation_key).await;
        let waiter_key = signal_waiter_kv_key(correlation_key);
        if let Some(bytes) = self.queue.view().kv_get(&waiter_key).await? {
            if let Some(waiter) = durable::decode_or_absent::<DurableWaiter>(
                &bytes,
                "signal waiter",
                &correlation_key,
            ) {
                let waiting = self.is_waiting(&waiter).await?;
                #[cfg(feature = "opentelemetry")]
                let sender = match waiting {
                    true => self.note_signal_sender(&waiter.job_id).await?,
                    false => None,
                };
                if waiting
                    && self
                        .commits
                        .wake_scheduled(&waiter.job_id, Some(payload.clone()))
                        .await?
                        == WakeOutcome::Woken
                {
                    self.commits.kv_compare_delete(&waiter_key, &bytes).await?;
                    debug!(correlation_key, run_id = %waiter.run_id, "signal delivered");
                    return Ok(SignalOutcome::Delivered);
                }
                #[cfg(feature = "opentelemetry")]
                self.unnote_signal_sender(sender).await?;
            }
            // A stale waiter (timed out, or unreadable): forget it.
            self.commits.kv_compare_delete(&waiter_key, &bytes).await?;
        }
        #[cfg(not(feature = "opentelemetry"))]
        self.commits
            .kv_put(&signal_buffer_kv_key(correlation_key), &payload)
            .await?;
        #[cfg(feature = "opentelemetry")]
        self.commits
            .commit(Self::buffer_sender(
                correlation_key,
                SettlementEffects::default().kv_put(signal_buffer_kv_key(correlation_key), payload),
            ))
            .await?;
        debug!(correlation_key, "signal buffered");
        Ok(SignalOutcome::Buffered)
    }

    /// Whether `waiter` still waits: its step's job is scheduled and has
    /// not run. Only such a wait is woken by a signal, and only such a wait
    /// keeps its key from another run's wait: a step that already ran
    /// (attempts > 0) observed its timeout, and its redeliveries must
    /// observe it too; a job that is gone (cancelled, dead-lettered,
    /// settled) waits for nothing.
    ///
    /// # Errors
    /// Storage errors reading the job.
    pub(super) async fn is_waiting(&self, waiter: &DurableWaiter) -> Result<bool> {
        Ok(self
            .queue
            .view()
            .job_record(&waiter.job_id)
            .await?
            .is_some_and(|job| job.status == JobStatus::Scheduled && job.attempts == 0))
    }

    /// Delete the waiter record of `job`'s signal wait (a step that ends
    /// outside a runner call: cancelled, dead-lettered), once the commit
    /// that ended it returned, and only while the record still names the
    /// job: once woken, the step left the key to another run's wait, whose
    /// record must stay. A compare-and-delete, so a record rewritten
    /// meanwhile stays. Best effort: a record left behind (a failure here,
    /// a crash before) names a job that waits for nothing, which a signal
    /// forgets and another run's wait replaces (see
    /// [`is_waiting`](Self::is_waiting)).
    pub(crate) async fn forget_waiter_of(&self, job: &JobRecord) {
        let Some(correlation_key) = job.headers.get(HEADER_SIGNAL_WAIT) else {
            return;
        };
        let waiter_key = signal_waiter_kv_key(correlation_key);
        let forgotten = async {
            let Some(bytes) = self.queue.view().kv_get(&waiter_key).await? else {
                return Ok(());
            };
            let ours = durable::decode_or_absent::<DurableWaiter>(
                &bytes,
                "signal waiter",
                correlation_key,
            )
            .is_none_or(|waiter| waiter.job_id == job.id);
            if ours {
                self.commits.kv_compare_delete(&waiter_key, &bytes).await?;
            }
            Ok::<(), Error>(())
        };
        if let Err(err) = forgotten.await {
            warn!(correlation_key, job_id = %job.id, "the ended step's signal waiter is left to be forgotten later: {err}");
        }
    }

    /// Discard a buffered signal.
    pub(crate) async fn clear_signal(&self, correlation_key: &str) -> Result<bool> {
        check_correlation_key(correlation_key)?;
        let _lock = self.signal_locks.lock(correlation_key).await;
        let key = signal_buffer_kv_key(correlation_key);
        let cleared = match self.queue.view().kv_get(&key).await? {
            Some(bytes) => self.commits.kv_compare_delete(&key, &bytes).await?,
            None => false,
        };
        #[cfg(feature = "opentelemetry")]
        if cleared {
            self.commits
                .commit(Self::clear_buffered_sender(correlation_key))
                .await?;
        }
        Ok(cleared)
    }

    /// The signal a claimed step observes and the signal state its
    /// settlement deletes.
    pub(super) async fn resolve_step_signal(
        &self,
        job: &JobRecord,
        run_id: &RunId,
        step_number: u32,
    ) -> Result<(Option<Vec<u8>>, Vec<Vec<u8>>)> {
        if job.headers.contains_key(HEADER_SIGNAL_DELIVERED) {
            let key = signal_delivered_kv_key(run_id, step_number);
            let signal = self.queue.view().kv_get(&key).await?.map(|b| b.to_vec());
            return Ok((signal, vec![key]));
        }
        let Some(correlation_key) = job.headers.get(HEADER_SIGNAL_WAIT) else {
            return Ok((None, Vec::new()));
        };
        // A signal delivered from the inbox is stored for the step.
        let delivered_key = signal_delivered_kv_key(run_id, step_number);
        if let Some(signal) = self.queue.view().kv_get(&delivered_key).await? {
            return Ok((Some(signal.to_vec()), vec![delivered_key]));
        }
        let signal = job.woken_at.and(job.wake_payload.clone());
        let waiter_key = signal_waiter_kv_key(correlation_key);
        let mut deletes = Vec::new();
        if let Some(bytes) = self.queue.view().kv_get(&waiter_key).await?
            && durable::decode_or_absent::<DurableWaiter>(&bytes, "signal waiter", correlation_key)
                .is_none_or(|w| w.run_id == *run_id && w.step_number == step_number)
        {
            if signal.is_none() {
                // A timeout: claim it by removing the waiter, so an inbox
                // delivery guarded on the waiter cannot give this step a
                // signal after it observed none. Lost to such a delivery,
                // the step takes the signal it delivered.
                let claimed = self
                    .queue
                    .kv_compare_commit(
                        &waiter_key,
                        Some(&bytes),
                        SettlementEffects::default().kv_delete(waiter_key.clone()),
                    )
                    .await?;
                if claimed.is_none()
                    && let Some(signal) = self.queue.view().kv_get(&delivered_key).await?
                {
                    return Ok((Some(signal.to_vec()), vec![delivered_key]));
                }
                return Ok((None, deletes));
            }
            deletes.push(waiter_key);
        }
        Ok((signal, deletes))
    }

    /// The settlement of a step continuing on a signal: consume a buffered
    /// signal (the next step runs at once and sees it) or register the
    /// waiter (the next step is scheduled at the timeout). A key with a
    /// waiter of another run fails this run. The key's lock is held until
    /// the settlement commits.
    pub(super) async fn advance_on_signal(
        &self,
        claimed: &ClaimedStep<'_>,
        payload: Vec<u8>,
        correlation_key: &str,
        timeout: Duration,
        run: &DurableRunRecord,
    ) -> Settlement {
        let lock = self.signal_locks.lock(correlation_key).await;
        match self
            .signal_settlement(claimed, payload, correlation_key, timeout, run)
            .await
        {
            Ok(mut settlement) => {
                settlement.signal_lock = Some(lock);
                settlement
            }
            Err(err) => {
                let error = crate::model::StepError::from(err);
                match error.kind {
                    StepErrorKind::Permanent => Settlement::of(SettleKind::Fail {
                        error: error.message,
                        permanent: true,
                        effects: SettlementEffects::default(),
                    }),
                    StepErrorKind::Transient => Settlement::of(SettleKind::Retry(error.message)),
                }
            }
        }
    }

    async fn signal_settlement(
        &self,
        claimed: &ClaimedStep<'_>,
        payload: Vec<u8>,
        correlation_key: &str,
        timeout: Duration,
        run: &DurableRunRecord,
    ) -> Result<Settlement> {
        let run_id = &claimed.run_id;
        let next = claimed.step_number + 1;
        let waiter_key = signal_waiter_kv_key(correlation_key);
        let refused = match check_correlation_key(correlation_key) {
            Err(err) => Some(err.to_string()),
            Ok(()) => {
                let other = match self.queue.view().kv_get(&waiter_key).await? {
                    Some(bytes) => durable::decode_or_absent::<DurableWaiter>(
                        &bytes,
                        "signal waiter",
                        &correlation_key,
                    )
                    .filter(|waiter| waiter.run_id != *run_id),
                    None => None,
                };
                // Another run's record whose wait is over (timed out, its
                // step gone) no longer holds the key: this wait replaces
                // it, as a signal would forget it.
                match other {
                    Some(waiter) if self.is_waiting(&waiter).await? => Some(format!(
                        "correlation key {correlation_key:?} already has a waiting run `{}`; only one run may wait on a key",
                        waiter.run_id
                    )),
                    _ => None,
                }
            }
        };
        if let Some(reason) = refused {
            let reason = crate::run::context::RunScope::of_job(run_id, claimed.job).name(reason);
            let outcome = crate::model::RunOutcome {
                run_id: run_id.clone(),
                status: TerminalStatus::Failed,
                result: None,
                error: Some(reason),
                headers: claimed.headers.clone(),
                final_step: claimed.step_number,
            };
            let termination = self.termination(
                &outcome,
                Some(StepErrorKind::Permanent),
                run,
                &claimed.job.id,
                claimed.membership.as_ref(),
            );
            self.store_run_result_of_claim(claimed, &outcome, &termination)
                .await?;
            let (effects, ending) = self.terminate_effects(
                &outcome,
                termination,
                claimed.membership.as_ref(),
                claimed.job,
                true,
            );
            return Ok(Settlement::of(SettleKind::Ack(effects)).ending(ending));
        }
        let buffer_key = signal_buffer_kv_key(correlation_key);
        let mut opts: StepEnqueueOpts = claimed.next_step_opts();
        let effects = match self.queue.view().kv_get(&buffer_key).await? {
            Some(signal) => {
                opts.reserved_headers
                    .push((HEADER_SIGNAL_DELIVERED, correlation_key.to_string()));
                let effects = self
                    .advance(claimed, payload, opts)
                    .kv_put(signal_delivered_kv_key(run_id, next), signal.to_vec())
                    .kv_delete(buffer_key);
                #[cfg(feature = "opentelemetry")]
                let effects = {
                    let job_id = effects
                        .enqueues
                        .first()
                        .and_then(|request| request.options.id_override.clone())
                        .unwrap_or_default();
                    self.consume_buffered_sender(correlation_key, &job_id, effects)
                        .await?
                };
                effects
            }
            None => {
                opts.run_at = Some(self.run_at_after(timeout));
                opts.reserved_headers
                    .push((HEADER_SIGNAL_WAIT, correlation_key.to_string()));
                let effects = self.advance(claimed, payload, opts);
                let job_id = effects
                    .enqueues
                    .first()
                    .and_then(|request| request.options.id_override.clone())
                    .unwrap_or_default();
                let waiter = DurableWaiter {
                    run_id: run_id.clone(),
                    step_number: next,
                    job_id,
                };
                effects.kv_put(waiter_key, durable::encode(&waiter))
            }
        };
        Ok(Settlement::of(SettleKind::Ack(effects)))
    }
}
