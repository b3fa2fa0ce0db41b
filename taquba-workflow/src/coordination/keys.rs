//! Per-key concurrency, the state outside the engine: the rules a
//! concurrency key and limit follow, the durable records of a key's slots
//! and waiters, and the in-process coordination of a queue's keys (their
//! locks, and the keys whose slots a committed termination freed).
//!
//! A run submitted with [`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key)
//! holds a slot of its key from its admission to its end: a slot record
//! (`workflow/concurrency/held/{key}/{run_id}`) is written in the
//! transaction that makes its step 0 claimable and deleted in the
//! transaction that terminates it. A run submitted while the key is at its
//! limit (or has waiters before it) is recorded with its step 0 parked on
//! [`PARKING_QUEUE`], which no worker claims, and a waiter record
//! (`workflow/concurrency/waiting/{key}/{seq}`, `seq` a ULID after every
//! waiter the key has, so waiters sort in submission order even across a
//! restart whose clock is behind); its admission removes the parked job and
//! enqueues step 0 on the runtime's queue with the slot record, in one
//! transaction. The number of a key's active runs is the number of its slot
//! records, so no commit can leak or double-count a slot.
//!
//! A store has one writer, so every commit of a key happens in this
//! process: a key's admissions are serialised by its lock, shared by every
//! runtime over the queue (keyed by the queue's address, as the group
//! locks are). A termination does not take the lock: it deletes its own
//! records, and the key is then marked for the admission pump
//! ([`ConcurrencyKeys::take_freed`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use serde::{Deserialize, Serialize};
use taquba::Queue;
use tokio::sync::{Mutex as AsyncMutex, Notify, OwnedMutexGuard};

use crate::error::Error;
use crate::store::keys::{MAX_CONCURRENCY_KEY_LEN, RunId};

/// The queue the step 0 of a run waiting on its concurrency key is parked
/// on. No worker claims from it; the admission of the run removes the
/// parked job in the transaction that enqueues its step 0 on the runtime's
/// queue.
pub(crate) const PARKING_QUEUE: &str = "workflow.waiting-on-key";

/// Check a submission's concurrency key and limit.
///
/// # Errors
/// [`Error::InvalidRunOptions`] naming the value: a key that is empty,
/// longer than [`MAX_CONCURRENCY_KEY_LEN`] bytes, or holds a `/` or a
/// control character; a limit of 0; a limit without a key.
pub(crate) fn check_options(key: Option<&str>, limit: Option<u32>) -> Result<(), Error> {
    match (key, limit) {
        (None, None) => Ok(()),
        (None, Some(limit)) => Err(Error::InvalidRunOptions(format!(
            "concurrency_limit is {limit} but no concurrency_key is set: set the key the limit applies to"
        ))),
        (Some(_), Some(0)) => Err(Error::InvalidRunOptions(
            "concurrency_limit is 0: the limit must be at least 1".into(),
        )),
        (Some(key), _) => check_key(key),
    }
}

/// Refuse the concurrency key and limit in `options` of runs that take
/// none: `on` names what carries the options (`the child `p--c``,
/// `schedule "s"`, `a group's submission`), `runs` those runs (`child
/// runs`). Such runs commit outside a key's lock (in a parent's
/// settlement, a schedule's tick, a group's batch), so a key would be
/// dropped or double-counted.
///
/// # Errors
/// [`Error::InvalidRunOptions`] naming the key (its first 64 bytes) or the
/// limit, and `on`.
pub(crate) fn refuse_key(
    options: &crate::model::RunOptions,
    on: &str,
    runs: &str,
) -> Result<(), Error> {
    if let Some(key) = &options.concurrency_key {
        let shown = crate::history::cut_to(key, 64);
        return Err(Error::InvalidRunOptions(format!(
            "concurrency_key {shown:?} is set on {on}: {runs} do not take concurrency keys"
        )));
    }
    if let Some(limit) = options.concurrency_limit {
        return Err(Error::InvalidRunOptions(format!(
            "concurrency_limit {limit} is set on {on}: {runs} do not take concurrency keys or limits"
        )));
    }
    Ok(())
}

/// Check a concurrency key (see [`check_options`]).
///
/// # Errors
/// [`Error::InvalidRunOptions`] naming the key and the rule it breaks.
pub(crate) fn check_key(key: &str) -> Result<(), Error> {
    let shown = crate::history::cut_to(key, 64);
    if key.is_empty() {
        return Err(Error::InvalidRunOptions(
            "concurrency_key is empty: a key is 1 to 256 bytes".into(),
        ));
    }
    if key.len() > MAX_CONCURRENCY_KEY_LEN {
        return Err(Error::InvalidRunOptions(format!(
            "concurrency_key {shown:?} is {} bytes, more than the {MAX_CONCURRENCY_KEY_LEN} allowed",
            key.len()
        )));
    }
    if key.contains('/') {
        return Err(Error::InvalidRunOptions(format!(
            "concurrency_key {shown:?} holds a `/`, which keys may not hold"
        )));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::InvalidRunOptions(format!(
            "concurrency_key {shown:?} holds a control character, which keys may not hold"
        )));
    }
    Ok(())
}

/// A keyed run's concurrency, kept on its run record and terminal record:
/// the termination deletes the slot record and the waiter record it names
/// (whichever exists).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableConcurrency {
    /// The concurrency key.
    pub(crate) key: String,
    /// The run's limit for the key.
    pub(crate) limit: u32,
    /// The number of its waiter record (a ULID), given at submission
    /// whether or not it waited.
    pub(crate) seq: String,
}

/// A slot record: `run_id` holds a slot of the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableKeySlot {
    /// The run holding the slot.
    pub(crate) run_id: RunId,
    /// When it was admitted, ms since the UNIX epoch (runtime clock).
    pub(crate) admitted_at_ms: u64,
}

/// A waiter record: `run_id` waits for a slot of the key, its step 0
/// parked as `job_id` on [`PARKING_QUEUE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableKeyWaiter {
    /// The waiting run.
    pub(crate) run_id: RunId,
    /// Its parked step-0 job.
    pub(crate) job_id: String,
    /// The queue its step 0 is enqueued on when it is admitted (the queue
    /// of the runtime it was submitted to: runtimes of other queues over
    /// the same store share the key and may admit it).
    pub(crate) queue: String,
    /// Its limit: it is admitted while fewer runs than this hold the key.
    pub(crate) limit: u32,
    /// When it was submitted, ms since the UNIX epoch (runtime clock).
    pub(crate) submitted_at_ms: u64,
}

/// A queue's keys: their locks, and the keys a committed termination freed
/// a slot of.
#[derive(Default)]
struct QueueKeys {
    queue: Weak<Queue>,
    locks: HashMap<String, Weak<AsyncMutex<()>>>,
    freed: BTreeSet<String>,
    notify: Arc<Notify>,
    /// Maintenance rounds asked [`ConcurrencyKeys::pass_due`].
    rounds: u64,
    /// Batches of freed keys taken and not yet admitted from.
    pumping: usize,
}

static REGISTRY: LazyLock<Mutex<HashMap<usize, QueueKeys>>> = LazyLock::new(Mutex::default);

/// The concurrency keys of one queue, shared by every runtime over it.
/// Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct ConcurrencyKeys {
    queue: usize,
}

impl ConcurrencyKeys {
    /// The keys of `queue`, shared by every runtime over it.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        let address = Arc::as_ptr(queue) as usize;
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        registry.retain(|_, keys| keys.queue.strong_count() > 0);
        registry.entry(address).or_insert_with(|| QueueKeys {
            queue: Arc::downgrade(queue),
            ..Default::default()
        });
        Self { queue: address }
    }

    /// Run `f` on this queue's entry. The critical sections are a few map
    /// operations that cannot leave the maps half-updated, so a poisoned
    /// lock is still usable.
    fn with<T>(&self, f: impl FnOnce(&mut QueueKeys) -> T) -> T {
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        f(registry.entry(self.queue).or_default())
    }

    /// Wait for and take the lock of `key`; released when the guard drops.
    pub(crate) async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = self.with(|keys| {
            if let Some(lock) = keys.locks.get(key).and_then(Weak::upgrade) {
                return lock;
            }
            keys.locks.retain(|_, lock| lock.strong_count() > 0);
            let lock = Arc::new(AsyncMutex::new(()));
            keys.locks.insert(key.to_string(), Arc::downgrade(&lock));
            lock
        });
        lock.lock_owned().await
    }

    /// A committed termination freed a slot of `key` (or removed one of its
    /// waiters): the key is marked for the admission pump. Told by the
    /// commit itself ([`Committer::run`](crate::run::commit::Committer::run)),
    /// so nothing is kept for a termination that never commits.
    pub(crate) fn ended(&self, key: &str) {
        let notify = self.with(|keys| {
            keys.freed.insert(key.to_string());
            keys.notify.clone()
        });
        notify.notify_one();
    }

    /// Whether this maintenance round of the queue passes over every
    /// waiting key: the first round over the queue (in this process) and
    /// every `every` rounds after it.
    pub(crate) fn pass_due(&self, every: u64) -> bool {
        self.with(|keys| {
            let due = keys.rounds % every.max(1) == 0;
            keys.rounds = keys.rounds.wrapping_add(1);
            due
        })
    }

    /// The keys marked since the last call, emptied, with a guard that
    /// counts them as being admitted from until it drops.
    pub(crate) fn take_freed(&self) -> (BTreeSet<String>, Pumping) {
        self.with(|keys| {
            keys.pumping = keys.pumping.saturating_add(1);
            (std::mem::take(&mut keys.freed), Pumping(self.clone()))
        })
    }

    /// Whether a key is marked, or marked keys are being admitted from:
    /// for the test kit, whose idle is no admission to come.
    #[cfg(feature = "testing")]
    pub(crate) fn busy(&self) -> bool {
        self.with(|keys| !keys.freed.is_empty() || keys.pumping > 0)
    }

    /// Notified when a key is marked.
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.with(|keys| keys.notify.clone())
    }
}

/// Keys taken by [`ConcurrencyKeys::take_freed`] being admitted from.
pub(crate) struct Pumping(ConcurrencyKeys);

impl Drop for Pumping {
    fn drop(&mut self) {
        self.0
            .with(|keys| keys.pumping = keys.pumping.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_limits_are_checked() {
        assert!(check_options(None, None).is_ok());
        assert!(check_options(Some("customer-42"), None).is_ok());
        assert!(check_options(Some("tenant:a@b.com"), Some(10)).is_ok());
        for (key, limit, says) in [
            (None, Some(2), "no concurrency_key"),
            (Some("k"), Some(0), "at least 1"),
            (Some(""), None, "empty"),
            (Some("a/b"), None, "`/`"),
            (Some("a\nb"), None, "control character"),
        ] {
            let err = check_options(key, limit).expect_err("refused").to_string();
            assert!(err.contains(says), "{err}");
        }
        let long = "k".repeat(MAX_CONCURRENCY_KEY_LEN + 1);
        let err = check_key(&long).expect_err("long").to_string();
        assert!(err.contains("257 bytes"), "{err}");
        assert!(check_key(&"k".repeat(MAX_CONCURRENCY_KEY_LEN)).is_ok());
    }

    #[tokio::test]
    async fn an_ended_key_is_marked_once_and_its_pump_notified() {
        let store = Arc::new(taquba::object_store::memory::InMemory::new());
        let queue = Arc::new(Queue::open(store, "keys").await.expect("open"));
        let keys = ConcurrencyKeys::for_queue(&queue);
        let notify = keys.notify();
        let notified = notify.notified();
        keys.ended("a");
        keys.ended("a");
        keys.ended("b");
        // The permit `notify_one` stored wakes the pump's next wait.
        tokio::time::timeout(std::time::Duration::from_secs(5), notified)
            .await
            .expect("the pump is notified");
        let (freed, pumping) = keys.take_freed();
        assert_eq!(freed, BTreeSet::from(["a".to_string(), "b".to_string()]));
        drop(pumping);
        assert!(keys.take_freed().0.is_empty());
    }
}
