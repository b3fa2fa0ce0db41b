//! The in-process locks of run groups: a group's submissions (and resumes),
//! its `forget` and the retention sweep's removal of it hold the group's
//! lock, so a removal never runs between a submission's reads and its
//! commits, and a submission never starts a member between a removal's
//! check that none is active and its deletes.
//!
//! A store has one writer (opening it elsewhere fences this process), so
//! every commit of a group happens in this process, and the locks are
//! shared by every runtime over the same queue here: entries are keyed by
//! the queue's address, as the run watchers are, with the weak reference
//! telling a live queue from a dropped one whose address was reused.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};

use taquba::Queue;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

use crate::store::keys::RunId;

/// The lock of one group.
type GroupLock = Arc<AsyncMutex<()>>;

/// A queue's groups' locks, by group id; an entry lives while a holder or
/// a waiter has its lock.
#[derive(Default)]
struct QueueLocks {
    queue: Weak<Queue>,
    groups: HashMap<RunId, Weak<AsyncMutex<()>>>,
}

static REGISTRY: LazyLock<Mutex<HashMap<usize, QueueLocks>>> = LazyLock::new(Mutex::default);

/// The group locks of one queue. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct GroupLocks {
    queue: usize,
}

impl GroupLocks {
    /// The group locks of `queue`, shared by every runtime over it.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        let address = Arc::as_ptr(queue) as usize;
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        registry.retain(|_, locks| locks.queue.strong_count() > 0);
        registry.entry(address).or_insert_with(|| QueueLocks {
            queue: Arc::downgrade(queue),
            groups: HashMap::new(),
        });
        Self { queue: address }
    }

    /// Wait for and take the lock of `group_id`; it is released when the
    /// guard drops.
    pub(crate) async fn lock(&self, group_id: &RunId) -> OwnedMutexGuard<()> {
        let lock = self.lock_of(group_id);
        lock.lock_owned().await
    }

    /// Take the lock of `group_id` if it is free: for the retention sweep,
    /// which must not stall behind a long `forget` or submission.
    pub(crate) fn try_lock(&self, group_id: &RunId) -> Option<OwnedMutexGuard<()>> {
        self.lock_of(group_id).try_lock_owned().ok()
    }

    fn lock_of(&self, group_id: &RunId) -> GroupLock {
        // The critical section is a few map operations that cannot leave
        // the map half-updated, so a poisoned lock is still usable.
        let mut registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        let locks = registry.entry(self.queue).or_default();
        if let Some(lock) = locks.groups.get(group_id).and_then(Weak::upgrade) {
            return lock;
        }
        // Entries of locks nobody holds go as new ones come.
        locks.groups.retain(|_, lock| lock.strong_count() > 0);
        let lock = GroupLock::default();
        locks.groups.insert(group_id.clone(), Arc::downgrade(&lock));
        lock
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use taquba::object_store::memory::InMemory;

    use super::*;

    async fn open_queue() -> Arc<Queue> {
        Arc::new(
            Queue::open(Arc::new(InMemory::new()), "db")
                .await
                .expect("open"),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn one_group_is_locked_once_per_queue_and_other_groups_are_not_held_up() {
        let queue = open_queue().await;
        let (a, b) = (GroupLocks::for_queue(&queue), GroupLocks::for_queue(&queue));
        let g = RunId::new("g").expect("id");
        let held = a.lock(&g).await;
        // Another runtime over the queue waits for it.
        let waiting = tokio::time::timeout(Duration::from_millis(10), b.lock(&g)).await;
        assert!(waiting.is_err());
        assert!(b.try_lock(&g).is_none(), "held");
        // Another group does not.
        let other = b.lock(&RunId::new("h").expect("id")).await;
        drop(other);
        drop(held);
        let again = tokio::time::timeout(Duration::from_millis(10), b.lock(&g))
            .await
            .expect("released");
        drop(again);
        assert!(a.try_lock(&g).is_some(), "free");
        // Another queue's group of the same id is another lock.
        let _held = a.lock(&g).await;
        let other = open_queue().await;
        let elsewhere = GroupLocks::for_queue(&other);
        let _free = tokio::time::timeout(Duration::from_millis(10), elsewhere.lock(&g))
            .await
            .expect("another queue's lock");
    }

    #[tokio::test]
    async fn released_locks_do_not_accumulate() {
        let queue = open_queue().await;
        let locks = GroupLocks::for_queue(&queue);
        for i in 0..100 {
            drop(locks.lock(&RunId::new(format!("g{i}")).expect("id")).await);
        }
        let registry = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        let live = registry[&locks.queue]
            .groups
            .values()
            .filter(|lock| lock.strong_count() > 0)
            .count();
        assert_eq!(live, 0);
        assert!(registry[&locks.queue].groups.len() <= 2);
    }
}
