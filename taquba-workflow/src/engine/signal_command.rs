//! A signal applied for an inbox command: delivered or buffered in one
//! transaction with the command's record, so it is never applied twice.
//!
//! [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal) wakes a
//! waiting step (`wake_scheduled`, a queue transition that cannot carry
//! other effects) and then removes its waiter. Here the delivery itself is
//! a KV transaction: guarded on the waiter as read, it removes the waiter,
//! stores the signal as the waiting step's delivered signal (which the
//! step reads when it runs, as a step enqueued with a buffered signal
//! does) and writes the command record. The step is then woken, only to
//! run sooner: if the wake is lost (a crash, a timeout promoting it first)
//! the step still runs at its timeout and sees the signal. A step that
//! timed out claims its timeout by removing the waiter before it runs
//! (see `resolve_step_signal`), so the guarded delivery and the timeout
//! cannot both win.

use taquba::{JobStatus, SettlementEffects};
use tracing::{debug, warn};

use crate::coordination::signal::SignalOutcome;
use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::run::compose::merge_effects;
use crate::store::durable::{self, DurableWaiter};
use crate::store::keys::{
    RunId, signal_buffer_kv_key, signal_delivered_kv_key, signal_waiter_kv_key,
};

/// Attempts of a delivery whose guard lost to a concurrent change of the
/// waiter (a step registering or claiming its timeout) before it gives up.
const SIGNAL_RACE_RETRIES: usize = 8;

impl RuntimeCore {
    /// Deliver `payload` under `correlation_key` to the waiting run, or
    /// buffer it, committing `record(outcome, woken run)` in the same
    /// transaction. Returns what it did. With `only` (a
    /// [`Command::SignalRun`](crate::inbox::Command::SignalRun)), the
    /// signal goes to that run's current wait or nowhere: nothing is
    /// buffered.
    ///
    /// # Errors
    /// `KvValueTooLarge` for a payload over the KV value cap; storage
    /// errors; [`Error::CommandRefused`] after [`SIGNAL_RACE_RETRIES`]
    /// lost races (a retry applies it); with `only`,
    /// [`Error::NotWaitingForSignal`] when that run is not waiting on the
    /// key and [`Error::RunNotFound`] for a run never submitted.
    pub(super) async fn signal_recorded(
        &self,
        correlation_key: &str,
        payload: Vec<u8>,
        only: Option<&RunId>,
        record: impl Fn(SignalOutcome, Option<&RunId>) -> SettlementEffects,
    ) -> Result<(SignalOutcome, Option<RunId>)> {
        crate::coordination::signal::check_correlation_key(correlation_key)?;
        crate::run::effects::StagedKv::check_value(&payload)?;
        let _lock = self.signal_locks.lock(correlation_key).await;
        let waiter_key = signal_waiter_kv_key(correlation_key);
        for _ in 0..SIGNAL_RACE_RETRIES {
            let current = self.queue.view().kv_get(&waiter_key).await?;
            let waiter = match &current {
                Some(bytes) => durable::decode_or_absent::<DurableWaiter>(
                    bytes,
                    "signal waiter",
                    &correlation_key,
                ),
                None => None,
            };
            // Only a wait that has not timed out (its step never ran) takes
            // the signal.
            let waiting = match &waiter {
                Some(waiter) => self
                    .queue
                    .view()
                    .job_record(&waiter.job_id)
                    .await?
                    .is_some_and(|job| job.status == JobStatus::Scheduled && job.attempts == 0),
                None => false,
            };
            if let Some(run_id) = only {
                let its_wait = match &waiter {
                    Some(waiter) if waiting && waiter.run_id == *run_id => {
                        self.waits_at(run_id, waiter).await?
                    }
                    _ => false,
                };
                if !its_wait {
                    return Err(self.not_waiting(run_id, correlation_key).await?);
                }
            }
            let (outcome, woken, mut effects) = match waiter {
                Some(waiter) if waiting => {
                    let effects = SettlementEffects::default()
                        .kv_delete(waiter_key.clone())
                        .kv_put(
                            signal_delivered_kv_key(&waiter.run_id, waiter.step_number),
                            payload.clone(),
                        );
                    (SignalOutcome::Delivered, Some(waiter), effects)
                }
                _ => {
                    let mut effects = SettlementEffects::default()
                        .kv_put(signal_buffer_kv_key(correlation_key), payload.clone());
                    if current.is_some() {
                        // A stale waiter (timed out, or unreadable): forget it.
                        effects = effects.kv_delete(waiter_key.clone());
                    }
                    (SignalOutcome::Buffered, None, effects)
                }
            };
            let woken_run = woken.as_ref().map(|w| w.run_id.clone());
            merge_effects(&mut effects, record(outcome, woken_run.as_ref()));
            if self
                .commits
                .compare_commit(&waiter_key, current.as_deref(), effects)
                .await?
                .is_none()
            {
                continue;
            }
            if let Some(waiter) = woken {
                // Sooner than its timeout; the signal is already its own.
                if let Err(err) = self
                    .queue
                    .wake_scheduled(&waiter.job_id, Some(payload.clone()))
                    .await
                {
                    warn!(correlation_key, run_id = %waiter.run_id, "delivered signal: waking the step failed, it runs at its timeout: {err}");
                }
            }
            debug!(correlation_key, ?outcome, "signal applied from the inbox");
            return Ok((outcome, woken_run));
        }
        Err(Error::CommandRefused(format!(
            "the waiter of correlation key {correlation_key:?} kept changing while the signal was applied; send it again"
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use taquba::object_store::memory::InMemory;
    use taquba::{MockClock, OpenOptions, Queue, QueueConfig};

    use super::*;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{RunSpec, StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;

    struct Waits;

    impl StepRunner for Waits {
        async fn run_step(&self, _: &Step) -> std::result::Result<StepOutcome, StepError> {
            Ok(StepOutcome::continue_on_signal(
                vec![],
                "k",
                Duration::from_secs(10),
            ))
        }
    }

    /// The race a delivery from the inbox and a timeout run: the delivery
    /// read the waiter while the step was still waiting, the step then timed
    /// out, was claimed and observed no signal; the delivery, guarded on
    /// the waiter it read, must then lose.
    #[tokio::test(start_paused = true)]
    async fn a_step_that_observed_its_timeout_makes_a_racing_delivery_lose() {
        let clock = MockClock::new(1_700_000_000_000);
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(
            Queue::open_with_options(
                store.clone(),
                "db",
                OpenOptions::default()
                    .clock(Arc::new(clock.clone()))
                    .flush_interval(Duration::from_millis(1))
                    .default_queue_config(
                        QueueConfig::default().retry_backoff_base(Duration::ZERO),
                    ),
            )
            .await
            .unwrap(),
        );
        let runtime = WorkflowRuntime::builder(queue.clone(), store, Waits, NoopTerminalHook)
            .poll_interval(Duration::from_millis(50))
            .build();
        let core = runtime.inner.core.clone();
        let run = runtime.submit(RunSpec::default()).await.unwrap();
        let worker = runtime.spawn(std::future::pending::<()>());
        let waiter_key = signal_waiter_kv_key("k");
        let mut waiter = None;
        for _ in 0..1000 {
            waiter = queue.view().kv_get(&waiter_key).await.unwrap();
            if waiter.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        worker.shutdown().await.unwrap();
        // What the delivery read while the step waited.
        let waiter_bytes = waiter.expect("the step waits on `k`");
        let waiting: DurableWaiter = durable::decode(&waiter_bytes).unwrap();

        // The step times out and is claimed; it observes no signal.
        clock.advance(Duration::from_secs(11));
        queue.promote_scheduled_now().await.unwrap();
        let claim = queue
            .claim(&core.queue_name, Duration::from_secs(30))
            .await
            .unwrap()
            .expect("the timed-out step");
        let (signal, _) = core
            .resolve_step_signal(claim.job(), &run.run_id, 1)
            .await
            .unwrap();
        assert_eq!(signal, None);

        // The delivery's guarded commit, as `signal_recorded` makes it.
        let delivery = SettlementEffects::default()
            .kv_delete(waiter_key.clone())
            .kv_put(
                signal_delivered_kv_key(&waiting.run_id, waiting.step_number),
                b"late".to_vec(),
            );
        let committed = queue
            .kv_compare_commit(&waiter_key, Some(&waiter_bytes), delivery)
            .await
            .unwrap();
        assert!(
            committed.is_none(),
            "the timeout won; the delivery must not"
        );
        // And a delivery now buffers for the next waiter.
        let (outcome, woken) = core
            .signal_recorded("k", b"late".to_vec(), None, |_, _| {
                SettlementEffects::default()
            })
            .await
            .unwrap();
        assert_eq!((outcome, woken), (SignalOutcome::Buffered, None));
    }
}
