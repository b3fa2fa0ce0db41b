//! The view of concurrency keys
//! ([`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key)):
//! every key in use with its active and waiting counts
//! ([`WorkflowView::concurrency_keys`]), one key's holders and waiters in
//! admission order ([`WorkflowView::concurrency_key`]), and a run's key on
//! [`RunDetails::concurrency`](crate::view::RunDetails::concurrency).

use std::collections::BTreeMap;

use futures_util::TryStreamExt;

use crate::coordination::keys::{
    DurableConcurrency, DurableKeySlot, DurableKeyWaiter, PARKING_QUEUE, check_key,
};
use crate::error::Result;
use crate::store::durable;
use crate::store::keys::{
    KEY_HELD_PREFIX, KEY_WAITING_PREFIX, RunId, key_held_prefix, key_waiting_prefix,
};
use crate::view::WorkflowView;

/// Records read per page by the key listings.
const PAGE: usize = 256;

/// A run's concurrency key, from
/// [`RunDetails::concurrency`](crate::view::RunDetails::concurrency).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunConcurrency {
    /// The key.
    pub key: String,
    /// The run's limit for the key.
    pub limit: u32,
    /// Whether the run waits for a slot of the key (its step 0 is not
    /// claimable yet); `false` once it was admitted, and for a terminated
    /// run.
    pub waiting: bool,
}

/// A concurrency key in use, from [`WorkflowView::concurrency_keys`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyKey {
    /// The key.
    pub key: String,
    /// Runs holding a slot of the key (admitted, not terminated).
    pub active: u32,
    /// Runs waiting for a slot.
    pub waiting: u32,
}

/// A run holding a slot of a key, from [`WorkflowView::concurrency_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyHolder {
    /// The run.
    pub run_id: RunId,
    /// When it was admitted, ms since the UNIX epoch (runtime clock).
    pub admitted_at_ms: u64,
}

/// A run waiting for a slot of a key, from
/// [`WorkflowView::concurrency_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyWaiter {
    /// The run.
    pub run_id: RunId,
    /// Its limit: it is admitted while fewer runs than this hold the key.
    pub limit: u32,
    /// When it was submitted, ms since the UNIX epoch (runtime clock).
    pub submitted_at_ms: u64,
}

/// One concurrency key described, from [`WorkflowView::concurrency_key`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyKeyDetails {
    /// The key.
    pub key: String,
    /// The runs holding a slot, in run-id order.
    pub holders: Vec<KeyHolder>,
    /// The runs waiting for a slot, in the order they are admitted
    /// (submission order).
    pub waiting: Vec<KeyWaiter>,
}

/// The public form of a run's concurrency record; `job_queue` is the queue
/// of its current step job (the parking queue while it waits).
pub(crate) fn run_concurrency(concurrency: DurableConcurrency, job_queue: &str) -> RunConcurrency {
    RunConcurrency {
        key: concurrency.key,
        limit: concurrency.limit,
        waiting: job_queue == PARKING_QUEUE,
    }
}

impl WorkflowView {
    /// Every concurrency key with an active or a waiting run, in key order,
    /// with its counts. Reads every slot and waiter record (one per active
    /// or waiting keyed run). Reads only: dropped at any await, it leaves
    /// nothing.
    ///
    /// # Errors
    /// Storage errors.
    pub async fn concurrency_keys(&self) -> Result<Vec<ConcurrencyKey>> {
        let mut keys: BTreeMap<String, ConcurrencyKey> = BTreeMap::new();
        for (prefix, active) in [(KEY_HELD_PREFIX, true), (KEY_WAITING_PREFIX, false)] {
            let entries: Vec<_> = self
                .queue
                .kv_entries(prefix.as_bytes(), .., PAGE)
                .try_collect()
                .await?;
            for (entry, _) in entries {
                let rest = &entry[prefix.len()..];
                let Some(end) = rest.iter().position(|b| *b == b'/') else {
                    continue;
                };
                let key = String::from_utf8_lossy(&rest[..end]).into_owned();
                let counts = keys.entry(key.clone()).or_insert(ConcurrencyKey {
                    key,
                    active: 0,
                    waiting: 0,
                });
                match active {
                    true => counts.active = counts.active.saturating_add(1),
                    false => counts.waiting = counts.waiting.saturating_add(1),
                }
            }
        }
        Ok(keys.into_values().collect())
    }

    /// The runs holding a slot of `key` and those waiting for one, in the
    /// order they are admitted. Empty lists for a key not in use. Reads
    /// only: dropped at any await, it leaves nothing.
    ///
    /// # Errors
    /// [`Error::InvalidRunOptions`](crate::Error::InvalidRunOptions) for a
    /// key no run can have (see
    /// [`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key));
    /// storage errors.
    pub async fn concurrency_key(&self, key: &str) -> Result<ConcurrencyKeyDetails> {
        check_key(key)?;
        let held: Vec<_> = self
            .queue
            .kv_entries(&key_held_prefix(key), .., PAGE)
            .try_collect()
            .await?;
        let holders = held
            .iter()
            .filter_map(|(_, bytes)| {
                durable::decode_or_absent::<DurableKeySlot>(bytes, "key slot", &key)
            })
            .map(|slot| KeyHolder {
                run_id: slot.run_id,
                admitted_at_ms: slot.admitted_at_ms,
            })
            .collect();
        let waiting: Vec<_> = self
            .queue
            .kv_entries(&key_waiting_prefix(key), .., PAGE)
            .try_collect()
            .await?;
        let waiting = waiting
            .iter()
            .filter_map(|(_, bytes)| {
                durable::decode_or_absent::<DurableKeyWaiter>(bytes, "key waiter", &key)
            })
            .map(|waiter| KeyWaiter {
                run_id: waiter.run_id,
                limit: waiter.limit,
                submitted_at_ms: waiter.submitted_at_ms,
            })
            .collect();
        Ok(ConcurrencyKeyDetails {
            key: key.to_string(),
            holders,
            waiting,
        })
    }
}
