//! In-process notification of run terminations: every place that commits a
//! run's termination (a settlement, a cancellation of a waiting step, a
//! dead-letter reconciliation) reports the [`RunEnd`] here once the commit
//! returned, and [`RuntimeCore::wait_run`](crate::engine::RuntimeCore)
//! waits on it instead of following the run across its steps.
//!
//! A watch is registered before the waiter reads the run's state, so a
//! termination committed after that read reaches the watch, and one
//! committed before it is visible to the read.
//!
//! The registry is shared by every runtime over the same queue in the
//! process (a `WorkflowRuntime` that submits and waits and another that
//! runs the worker, over clones of one `Arc<Queue>`): entries are keyed by
//! the queue's address, which stays put while any runtime holds the queue.
//! So is [`store_closed_token`], fired when the queue's store is found
//! closed to this process, so that every waiter on the queue stops.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use taquba::Queue;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::model::RunEnd;
use crate::run::per_queue::{Registry, shared};
use crate::store::keys::RunId;

type Senders = Vec<(u64, oneshot::Sender<RunEnd>)>;

/// A run of one queue: the queue's address and the run id.
type WatchKey = (usize, RunId);

#[derive(Default)]
struct Inner {
    next_token: u64,
    watches: HashMap<WatchKey, Senders>,
    /// Runs whose terminating commit is in flight in this process, with
    /// how many such commits there are.
    terminating: HashMap<WatchKey, usize>,
}

static REGISTRY: LazyLock<Mutex<Inner>> = LazyLock::new(Mutex::default);

fn lock() -> MutexGuard<'static, Inner> {
    // The lock guards plain map updates that cannot leave it half-done.
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The store-closed tokens of the queues runtimes were built over.
static CLOSED: LazyLock<Registry<CancellationToken>> = LazyLock::new(Registry::default);

/// The token fired once `queue`'s store is closed to this process, shared by
/// every runtime over `queue`.
pub(crate) fn store_closed_token(queue: &Arc<Queue>) -> CancellationToken {
    shared(&CLOSED, queue, CancellationToken::new)
}

/// The waiters on the runs of one queue. Cheap when nobody waits: a
/// termination costs one map lookup under a short lock.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunWatchers {
    queue: usize,
}

impl RunWatchers {
    /// The waiters on the runs of `queue`.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        Self {
            queue: Arc::as_ptr(queue) as usize,
        }
    }

    /// Watch `run_id` until the returned registration is dropped.
    pub(crate) fn watch(&self, run_id: &RunId) -> RunWatch {
        let (tx, rx) = oneshot::channel();
        let key = (self.queue, run_id.clone());
        let mut inner = lock();
        let token = inner.next_token;
        inner.next_token += 1;
        inner
            .watches
            .entry(key.clone())
            .or_default()
            .push((token, tx));
        RunWatch { key, token, rx }
    }

    /// Report the committed termination of `run_id` to its watches (the
    /// last one takes `end` itself).
    pub(crate) fn notify(&self, run_id: &RunId, end: RunEnd) {
        let Some(mut senders) = lock().watches.remove(&(self.queue, run_id.clone())) else {
            return;
        };
        // The last watch takes `end` itself, the others a copy. A watch
        // dropped after the removal above no longer listens.
        let last = senders.pop();
        for (_, tx) in senders {
            let _ = tx.send(end.clone());
        }
        if let Some((_, tx)) = last {
            let _ = tx.send(end);
        }
    }

    /// Mark a terminating commit of `run_id` in flight until the returned
    /// guard is dropped: a waiter that reads the run as terminated
    /// meanwhile may be seeing a commit not yet durable, and waits for its
    /// notification instead.
    pub(crate) fn terminating(&self, run_id: &RunId) -> TerminatingGuard {
        let key = (self.queue, run_id.clone());
        *lock().terminating.entry(key.clone()).or_default() += 1;
        TerminatingGuard { key }
    }

    /// Whether a terminating commit of `run_id` is in flight.
    pub(crate) fn is_terminating(&self, run_id: &RunId) -> bool {
        lock()
            .terminating
            .contains_key(&(self.queue, run_id.clone()))
    }

    #[cfg(test)]
    fn watched(&self) -> usize {
        lock()
            .watches
            .iter()
            .filter(|((queue, _), _)| *queue == self.queue)
            .map(|(_, senders)| senders.len())
            .sum()
    }
}

/// A terminating commit in flight; see [`RunWatchers::terminating`].
pub(crate) struct TerminatingGuard {
    key: WatchKey,
}

impl Drop for TerminatingGuard {
    fn drop(&mut self) {
        let mut inner = lock();
        if let Some(count) = inner.terminating.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                inner.terminating.remove(&self.key);
            }
        }
    }
}

/// One registered watch of a run; removed from the registry when dropped.
pub(crate) struct RunWatch {
    key: WatchKey,
    token: u64,
    rx: oneshot::Receiver<RunEnd>,
}

impl RunWatch {
    /// The run's termination if one was reported already; `None` while
    /// none is (the watch keeps listening).
    pub(crate) fn try_ended(&mut self) -> Option<RunEnd> {
        self.rx.try_recv().ok()
    }

    /// The run's termination, once one is reported. Pending forever when
    /// none is (the caller bounds the wait).
    pub(crate) async fn ended(&mut self) -> RunEnd {
        match (&mut self.rx).await {
            Ok(end) => end,
            // The sender is only dropped after it was removed from the
            // registry, which happens on notify (that sends first) or on
            // this watch's own drop.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for RunWatch {
    fn drop(&mut self) {
        let mut inner = lock();
        if let Some(senders) = inner.watches.get_mut(&self.key) {
            senders.retain(|(token, _)| *token != self.token);
            if senders.is_empty() {
                inner.watches.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunTermination;
    use crate::model::TerminalStatus;

    fn end(step: u32) -> RunEnd {
        RunEnd {
            termination: RunTermination {
                status: TerminalStatus::Succeeded,
                error: None,
                error_kind: None,
                final_step: step,
                terminated_at_ms: 7,
            },
            outcome: None,
        }
    }

    /// Watchers of a queue no other test uses (a unique fake address).
    fn fresh_watchers() -> RunWatchers {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        RunWatchers {
            queue: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    #[tokio::test]
    async fn every_watch_of_the_run_gets_the_end_and_others_do_not() {
        let watchers = fresh_watchers();
        let elsewhere = fresh_watchers();
        let a = RunId::new("a").unwrap();
        let b = RunId::new("b").unwrap();
        let mut first = watchers.watch(&a);
        let mut second = watchers.watch(&a);
        let mut other = watchers.watch(&b);
        let mut same_id_other_queue = elsewhere.watch(&a);
        watchers.notify(&a, end(3));
        assert_eq!(first.ended().await, end(3));
        assert_eq!(second.ended().await, end(3));
        let pending = tokio::time::timeout(std::time::Duration::from_millis(5), other.ended());
        assert!(pending.await.is_err(), "b was not terminated");
        let pending = tokio::time::timeout(
            std::time::Duration::from_millis(5),
            same_id_other_queue.ended(),
        );
        assert!(
            pending.await.is_err(),
            "the run `a` of another queue was not"
        );
    }

    #[test]
    fn a_dropped_watch_leaves_nothing_behind() {
        let watchers = fresh_watchers();
        let a = RunId::new("a").unwrap();
        for _ in 0..100 {
            let _watch = watchers.watch(&a);
        }
        let kept = watchers.watch(&a);
        assert_eq!(watchers.watched(), 1);
        drop(kept);
        assert_eq!(watchers.watched(), 0);
        // Notifying a run nobody watches is a no-op.
        watchers.notify(&a, end(0));
    }
}
