//! Per-key concurrency, the engine's side (the records and the rules are
//! in [`coordination::keys`](crate::coordination::keys)): a keyed run's
//! admission at submission (or its parking as a waiter), the release of
//! its slot with its termination, the admission of a key's waiters as
//! slots free (the pump, woken by each terminating commit, and a pass of
//! every waiting key in a runtime's first maintenance round and every
//! [`KEY_PASS_EVERY`] rounds after it), and the re-admission of a requeued
//! run.
//!
//! Every change of a key's records commits in the transaction of what it
//! describes: a slot record with the enqueue of the run's claimable step 0
//! (its submission, its admission as a waiter, its requeue), a waiter
//! record with the parked step 0, and their removal with the termination.
//! The admissions of a key hold its lock from their reads to their commit,
//! so no two of them count the same free slot.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures_util::TryStreamExt;
use taquba::{CancelOutcome, SettlementEffects};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::coordination::keys::{
    DurableConcurrency, DurableKeySlot, DurableKeyWaiter, PARKING_QUEUE,
};
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::model::RunOptions;
use crate::store::durable::{self, DurableRunRecord};
use crate::store::keys::{
    KEY_WAITING_PREFIX, RunId, key_held_kv_key, key_held_prefix, key_waiting_kv_key,
    key_waiting_prefix, run_kv_key,
};

/// Slot records read per page when a key's slots are counted.
const SLOT_PAGE: usize = 256;

/// Maintenance rounds between two passes over every waiting key (the
/// first round of a runtime always makes one).
pub(crate) const KEY_PASS_EVERY: u64 = 20;

/// A keyed submission's place: the key's lock, held until the submission
/// committed, and whether the run is admitted at once.
pub(crate) struct KeySlot {
    _lock: OwnedMutexGuard<()>,
    concurrency: DurableConcurrency,
    admitted: bool,
}

impl RuntimeCore {
    /// For a submission with a concurrency key in `options`: take the key's
    /// lock and decide whether the run is admitted now (fewer runs than its
    /// limit hold the key, and none waits before it) or waits. `None` for
    /// a submission without a key.
    pub(crate) async fn key_slot(&self, options: &RunOptions) -> Result<Option<KeySlot>> {
        let Some(key) = options.concurrency_key.as_deref() else {
            return Ok(None);
        };
        let limit = options.concurrency_limit.unwrap_or(1);
        let lock = self.keys.lock(key).await;
        let admitted = !self.has_waiters(key).await? && self.held_count(key).await? < limit;
        let seq = match admitted {
            true => self.new_run_id().to_string(),
            false => self.waiter_seq(key).await?,
        };
        Ok(Some(KeySlot {
            _lock: lock,
            concurrency: DurableConcurrency {
                key: key.to_string(),
                limit,
                seq,
            },
            admitted,
        }))
    }

    /// The number of a new waiter of `key`, which sorts after every waiter
    /// the key has: a new ULID, unless a waiter recorded earlier sorts at or
    /// after it (recorded by a process whose clock was ahead of this one's:
    /// a restart within the same millisecond, a clock stepped back on
    /// failover), then the ULID just after the last of those. Read under
    /// the key's lock, so no other admission or submission of the key
    /// commits between the read and the waiter's commit. Only waiters from
    /// this process's future are read, so it is one empty read normally.
    async fn waiter_seq(&self, key: &str) -> Result<String> {
        let candidate = self.new_run_id().to_string();
        let prefix = key_waiting_prefix(key);
        let from = key_waiting_kv_key(key, &candidate);
        let view = self.queue.view();
        let later = view.kv_entries(
            &prefix,
            (Bound::Included(from.as_slice()), Bound::Unbounded),
            SLOT_PAGE,
        );
        futures_util::pin_mut!(later);
        let mut last = None;
        while let Some((waiter_key, _)) = later.try_next().await? {
            last = Some(waiter_key);
        }
        let after_last = last.and_then(|waiter_key| {
            let seq = std::str::from_utf8(waiter_key.get(prefix.len()..)?).ok()?;
            ulid::Ulid::from_string(seq).ok()?.increment()
        });
        // A key whose last waiter is not a ULID (no waiter this runtime
        // records) keeps the candidate, as does the last ULID there is.
        Ok(after_last.map_or(candidate, |seq| seq.to_string()))
    }

    /// Make the submission `effects` of `run_id` (step 0 prepared as
    /// `job_id`, its enqueue first) keyed as `slot` says: the run record
    /// names the key; an admitted run gets its slot record, a waiting one
    /// its step 0 parked on [`PARKING_QUEUE`] and its waiter record.
    ///
    /// # Errors
    /// A run record in `effects` that does not decode (never: it was just
    /// encoded).
    pub(crate) fn keyed_submission(
        &self,
        slot: &KeySlot,
        run_id: &RunId,
        job_id: &str,
        effects: &mut SettlementEffects,
    ) -> Result<()> {
        let concurrency = &slot.concurrency;
        let run_key = run_kv_key(run_id);
        let Some(bytes) = effects.kv_writes.get_mut(&run_key) else {
            return Err(Error::InconsistentRunState(run_id.clone()));
        };
        let mut record: DurableRunRecord = durable::decode(bytes)?;
        record.concurrency = Some(concurrency.clone());
        *bytes = durable::encode(&record);
        let now_ms = self.now_ms();
        if slot.admitted {
            effects.kv_writes.insert(
                key_held_kv_key(&concurrency.key, run_id),
                durable::encode(&DurableKeySlot {
                    run_id: run_id.clone(),
                    admitted_at_ms: now_ms,
                }),
            );
            return Ok(());
        }
        let Some(step) = effects.enqueues.first_mut() else {
            return Err(Error::InconsistentRunState(run_id.clone()));
        };
        step.queue = PARKING_QUEUE.to_string();
        // The step's dedup key is its admission's.
        step.options.dedup_key = None;
        effects.kv_writes.insert(
            key_waiting_kv_key(&concurrency.key, &concurrency.seq),
            durable::encode(&DurableKeyWaiter {
                run_id: run_id.clone(),
                job_id: job_id.to_string(),
                queue: self.queue_name.clone(),
                limit: concurrency.limit,
                submitted_at_ms: now_ms,
            }),
        );
        debug!(run_id = %run_id, key = %concurrency.key, "run waits on its concurrency key");
        Ok(())
    }

    /// For the requeue of the keyed run `run_id` (whose restored record is
    /// `run`): take its key's lock and a slot in the requeue's `effects`.
    /// `None` for a run without a key.
    ///
    /// # Errors
    /// [`Error::CommandRefused`] when the key is at its limit or has
    /// waiters (they go first); storage errors.
    pub(crate) async fn requeue_slot(
        &self,
        run_id: &RunId,
        run: &DurableRunRecord,
        effects: &mut SettlementEffects,
    ) -> Result<Option<OwnedMutexGuard<()>>> {
        let Some(concurrency) = &run.concurrency else {
            return Ok(None);
        };
        let key = &concurrency.key;
        let lock = self.keys.lock(key).await;
        let held = self.held_count(key).await?;
        if self.has_waiters(key).await? || held >= concurrency.limit {
            return Err(Error::CommandRefused(format!(
                "run `{run_id}` runs under concurrency key `{key}`, which is at its limit ({held} of {} slots held, or runs wait for one): requeue it once a slot is free",
                concurrency.limit
            )));
        }
        effects.kv_writes.insert(
            key_held_kv_key(key, run_id),
            durable::encode(&DurableKeySlot {
                run_id: run_id.clone(),
                admitted_at_ms: self.now_ms(),
            }),
        );
        Ok(Some(lock))
    }

    /// How many runs hold a slot of `key`.
    pub(crate) async fn held_count(&self, key: &str) -> Result<u32> {
        let prefix = key_held_prefix(key);
        let count = self
            .queue
            .view()
            .kv_entries(&prefix, .., SLOT_PAGE)
            .try_fold(0u32, |n, _| async move { Ok(n.saturating_add(1)) })
            .await?;
        Ok(count)
    }

    /// Whether a run waits on `key`.
    async fn has_waiters(&self, key: &str) -> Result<bool> {
        let page = self
            .queue
            .view()
            .kv_scan(&key_waiting_prefix(key), .., 1)
            .await?;
        Ok(!page.entries.is_empty())
    }

    /// Admit the waiters of `key`, oldest first, while slots are free: each
    /// admission removes the parked step 0 and enqueues it on the runtime's
    /// queue with the run's slot record, in one transaction. Stops at the
    /// first waiter whose limit the key's slots reach, so no later waiter
    /// (or new submission) overtakes it. With `check`, a key whose waiters
    /// all wait has its slots checked ([`check_slots`](Self::check_slots)).
    /// Returns how many were admitted.
    pub(crate) async fn admit_waiters(&self, key: &str, check: bool) -> Result<usize> {
        let _lock = self.keys.lock(key).await;
        let prefix = key_waiting_prefix(key);
        let mut held = self.held_count(key).await?;
        let mut admitted = 0;
        loop {
            let page = self.queue.view().kv_scan(&prefix, .., 1).await?;
            let Some((waiter_key, bytes)) = page.entries.into_iter().next() else {
                return Ok(admitted);
            };
            let Some(waiter) =
                durable::decode_or_absent::<DurableKeyWaiter>(&bytes, "key waiter", &key)
            else {
                self.commits.kv_compare_delete(&waiter_key, &bytes).await?;
                continue;
            };
            if held >= waiter.limit {
                if check && admitted == 0 {
                    self.check_slots(key).await?;
                }
                return Ok(admitted);
            }
            if self.admit(key, &waiter_key, &bytes, waiter).await? {
                held = held.saturating_add(1);
                admitted += 1;
            }
        }
    }

    /// Admit `waiter` (its record, `bytes`, under `waiter_key`): whether it
    /// was. Not admitted when its parked step is gone: its run was
    /// cancelled meanwhile (the cancellation removed the waiter record with
    /// it), or the record was left without one (reported and removed).
    async fn admit(
        &self,
        key: &str,
        waiter_key: &[u8],
        bytes: &[u8],
        waiter: DurableKeyWaiter,
    ) -> Result<bool> {
        let Some(job) = self.queue.view().get_job(&waiter.job_id).await? else {
            // No commit removes a parked step without its waiter record.
            if self.commits.kv_compare_delete(waiter_key, bytes).await? {
                error!(key, run_id = %waiter.run_id, job_id = %waiter.job_id, "a waiter record of the concurrency key named no parked step; removed it");
            }
            return Ok(false);
        };
        let run_at = job
            .run_at
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
            .filter(|at| *at > UNIX_EPOCH + Duration::from_millis(self.now_ms()));
        let mut step = self.prepare_step(
            &waiter.run_id,
            0,
            job.payload,
            &job.headers,
            StepEnqueueOpts {
                run_at,
                priority: Some(job.priority),
                max_attempts: Some(job.max_attempts),
                reserved_headers: Vec::new(),
            },
        );
        // On the queue of the runtime the run was submitted to.
        step.request.queue.clone_from(&waiter.queue);
        let effects = Self::step_effects(&waiter.run_id, 0, step, SettlementEffects::default())
            .kv_put(
                key_held_kv_key(key, &waiter.run_id),
                durable::encode(&DurableKeySlot {
                    run_id: waiter.run_id.clone(),
                    admitted_at_ms: self.now_ms(),
                }),
            )
            .kv_delete(waiter_key.to_vec());
        let parked = waiter.job_id.clone();
        let (outcome, _) = self
            .commits
            .run(
                None,
                move |queue| async move { queue.cancel_with(&parked, effects).await },
                |_| false,
            )
            .await?;
        match outcome {
            CancelOutcome::Removed => {
                debug!(key, run_id = %waiter.run_id, "run admitted by its concurrency key");
                Ok(true)
            }
            CancelOutcome::NotFound => Ok(false),
            CancelOutcome::Requested => {
                // Nothing claims from the parking queue.
                warn!(key, run_id = %waiter.run_id, job_id = %waiter.job_id, "a parked step was claimed");
                Ok(false)
            }
        }
    }

    /// The check of a key whose waiters wait for a slot: every slot record
    /// names an active run of the key. The records of a run change only
    /// in the transactions of its admission and termination, so a slot
    /// record without its run is a bug; it is reported (and removed, or
    /// the key would wait for it forever). Called with the key's lock held.
    async fn check_slots(&self, key: &str) -> Result<()> {
        let prefix = key_held_prefix(key);
        let slots: Vec<(Vec<u8>, bytes::Bytes)> = self
            .queue
            .view()
            .kv_entries(&prefix, .., SLOT_PAGE)
            .try_collect()
            .await?;
        for (slot_key, bytes) in slots {
            let Some(slot) = durable::decode_or_absent::<DurableKeySlot>(&bytes, "key slot", &key)
            else {
                continue;
            };
            let active = self
                .view
                .run_record(&slot.run_id)
                .await?
                .is_some_and(|run| run.concurrency.is_some_and(|c| c.key == key));
            if !active && self.commits.kv_compare_delete(&slot_key, &bytes).await? {
                error!(key, run_id = %slot.run_id, "a slot of the concurrency key was held by a run that is not active; released it");
            }
        }
        Ok(())
    }

    /// Admit the waiters of every key that has some, checking the slots of
    /// those still waiting: a pass over the waiter records, one key at a
    /// time, for the first maintenance round of a runtime (after a crash
    /// between a termination and its admissions) and every
    /// [`KEY_PASS_EVERY`] rounds after it (an admission that failed).
    /// Returns how many runs were admitted.
    pub(crate) async fn admit_all_waiting(&self) -> Result<usize> {
        let mut admitted = 0;
        for key in self.waiting_keys().await? {
            admitted += self.admit_waiters(&key, true).await?;
        }
        Ok(admitted)
    }

    /// The keys with a waiter record, in key order.
    pub(crate) async fn waiting_keys(&self) -> Result<BTreeSet<String>> {
        let mut keys = BTreeSet::new();
        let mut from: Option<Vec<u8>> = None;
        loop {
            let range = match &from {
                Some(after) => (Bound::Included(after.as_slice()), Bound::Unbounded),
                None => (Bound::Unbounded, Bound::Unbounded),
            };
            let page = self
                .queue
                .view()
                .kv_scan(KEY_WAITING_PREFIX.as_bytes(), range, 1)
                .await?;
            let Some((entry, _)) = page.entries.first() else {
                return Ok(keys);
            };
            let rest = &entry[KEY_WAITING_PREFIX.len()..];
            let Some(end) = rest.iter().position(|b| *b == b'/') else {
                return Ok(keys);
            };
            let key = String::from_utf8_lossy(&rest[..end]).into_owned();
            // Skip the key's other waiters: `0` follows `/`.
            let mut next = key_waiting_prefix(&key);
            next.pop();
            next.push(b'0');
            from = Some(next);
            keys.insert(key);
        }
    }
}

/// `effects` (a termination of `run_id`) with the deletes of the run's
/// slot record and waiter record (whichever exists). The key is marked for
/// the admission pump by the termination's commit (its
/// [`Ending`](crate::run::commit::Ending) names the key).
pub(crate) fn release_key_effects(
    run_id: &RunId,
    concurrency: &DurableConcurrency,
    effects: SettlementEffects,
) -> SettlementEffects {
    effects
        .kv_delete(key_held_kv_key(&concurrency.key, run_id))
        .kv_delete(key_waiting_kv_key(&concurrency.key, &concurrency.seq))
}

/// The admission pump of the queue's keys: whenever a committed
/// termination freed a slot of a key, admit the key's waiters. Runs beside
/// the worker loop until `stop` fires; a failed admission is logged and
/// left to the next maintenance round.
pub(crate) async fn pump_keys_until(core: Arc<RuntimeCore>, stop: CancellationToken) {
    let notify = core.keys.notify();
    loop {
        let (freed, pumping) = core.keys.take_freed();
        for key in freed {
            if let Err(err) = core.admit_waiters(&key, false).await {
                core.note_error(&err);
                warn!(
                    key,
                    "admitting the waiters of a concurrency key failed: {err}"
                );
            }
        }
        drop(pumping);
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = notify.notified() => {}
        }
    }
}
