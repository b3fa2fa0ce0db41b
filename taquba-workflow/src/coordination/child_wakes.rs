//! The prompt wake of a parent whose child ended in this process: the
//! child's terminating commit leaves a wake marker (see
//! [`children`](crate::engine::children)), which the maintenance round
//! turns into the signal its parent waits on. A termination committed here
//! is also handed to a small task beside the worker loop, which sends it
//! at once, so a parent waits for its child's end, not for the next
//! maintenance round. The maintenance round stays the guarantee (a crash,
//! a termination committed by a runtime without a worker): the marker is
//! removed only once its signal was sent.
//!
//! One child's wake is sent by one task of this runtime at a time
//! ([`ChildWakes::begin_send`]), so the task and the maintenance round
//! never signal the same end twice.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::store::keys::RunId;

/// The most terminations kept waiting for their wake; past it they are
/// left to the maintenance round (a runtime without a worker takes none).
const CAPACITY: usize = 4096;

#[derive(Debug, Default)]
struct State {
    /// Children whose terminating commit is in flight.
    ending: HashSet<RunId>,
    /// Children whose termination committed, to wake the parent of.
    due: Vec<RunId>,
    /// Children whose parent is being woken.
    sending: HashSet<RunId>,
}

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct ChildWakes {
    state: Mutex<State>,
    notify: Notify,
}

/// A wake being sent; the child's entry is freed when it drops.
pub(crate) struct Sending<'a> {
    wakes: &'a ChildWakes,
    child: RunId,
}

impl ChildWakes {
    /// Every mutation is one set or vector operation: a poisoned lock's
    /// state is whole.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A termination of the child `child` is about to commit.
    pub(crate) fn ending(&self, child: &RunId) {
        let mut state = self.lock();
        if state.ending.len() >= CAPACITY {
            state.ending.clear();
        }
        state.ending.insert(child.clone());
    }

    /// The terminating commit of `run_id` returned, `committed` or not;
    /// a committed child's wake is due.
    pub(crate) fn ended(&self, run_id: &RunId, committed: bool) {
        let mut state = self.lock();
        if !state.ending.remove(run_id) || !committed {
            return;
        }
        if state.due.len() >= CAPACITY {
            state.due.clear();
        }
        state.due.push(run_id.clone());
        drop(state);
        self.notify.notify_one();
    }

    /// The children whose wake is due, emptied.
    pub(crate) fn take_due(&self) -> Vec<RunId> {
        std::mem::take(&mut self.lock().due)
    }

    /// Notified when a wake is due.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Take the sending of `child`'s wake; `None` while another task of
    /// this runtime sends it.
    pub(crate) fn begin_send(&self, child: &RunId) -> Option<Sending<'_>> {
        self.lock().sending.insert(child.clone()).then(|| Sending {
            wakes: self,
            child: child.clone(),
        })
    }

    /// Whether a wake is due or being sent: for the test kit, whose idle is
    /// nothing left to do.
    #[cfg(feature = "testing")]
    pub(crate) fn busy(&self) -> bool {
        let state = self.lock();
        !state.due.is_empty() || !state.sending.is_empty()
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.wakes.lock().sending.remove(&self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> RunId {
        RunId::new(s).expect("valid id")
    }

    #[test]
    fn only_a_committed_childs_termination_is_due_once() {
        let wakes = ChildWakes::default();
        // Not a child (never marked ending): nothing due.
        wakes.ended(&id("plain"), true);
        wakes.ending(&id("c1"));
        wakes.ended(&id("c1"), false);
        wakes.ending(&id("c2"));
        wakes.ended(&id("c2"), true);
        // A second report of the same commit adds nothing.
        wakes.ended(&id("c2"), true);
        assert_eq!(wakes.take_due(), vec![id("c2")]);
        assert!(wakes.take_due().is_empty());
    }

    #[test]
    fn one_wake_of_a_child_is_sent_at_a_time() {
        let wakes = ChildWakes::default();
        let first = wakes.begin_send(&id("c")).expect("free");
        assert!(wakes.begin_send(&id("c")).is_none());
        assert!(wakes.begin_send(&id("other")).is_some());
        drop(first);
        assert!(wakes.begin_send(&id("c")).is_some());
    }
}
