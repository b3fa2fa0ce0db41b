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

    /// The termination of the child `child` committed: its wake is due.
    /// Told by the commit itself
    /// ([`Committer::run`](crate::run::commit::Committer::run)), so nothing
    /// is kept for a termination that never commits.
    pub(crate) fn ended(&self, child: &RunId) {
        let mut state = self.lock();
        if state.due.len() >= CAPACITY {
            state.due.clear();
        }
        state.due.push(child.clone());
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
    fn an_ended_childs_wake_is_due_once() {
        let wakes = ChildWakes::default();
        wakes.ended(&id("c1"));
        wakes.ended(&id("c2"));
        assert_eq!(wakes.take_due(), vec![id("c1"), id("c2")]);
        assert!(wakes.take_due().is_empty());
    }

    #[test]
    fn due_wakes_past_the_capacity_are_left_to_the_maintenance_round() {
        let wakes = ChildWakes::default();
        for n in 0..=CAPACITY {
            wakes.ended(&id(&format!("c{n}")));
        }
        assert_eq!(wakes.take_due(), vec![id(&format!("c{CAPACITY}"))]);
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
