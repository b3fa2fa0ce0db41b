//! The in-process registry of running steps, which decides the race between
//! an external cancellation and a step's own outcome.
//!
//! The queue is single-writer, so every settlement and every cancellation of
//! a store happen in this process. A running step registers here before it
//! reads its run record; when its runner returns it *decides* (under the
//! registry's lock) whether a cancellation arrived first. A cancellation
//! arriving later finds the step settling and waits for that settlement, so
//! [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel) returns
//! `Ok(true)` only when the run really ends cancelled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::keys::RunId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The runner is running.
    Running,
    /// An external cancellation arrived while the runner ran.
    CancelRequested,
    /// The runner returned first; the settlement is in flight.
    Settling,
}

struct Entry {
    generation: u64,
    phase: Phase,
    token: CancellationToken,
    settled: watch::Receiver<bool>,
}

/// What a cancellation request found.
pub(crate) enum CancelVerdict {
    /// The step is running: its token fired and its settlement will end the
    /// run cancelled.
    Requested,
    /// The step's runner already returned; the receiver turns `true` once
    /// that settlement finished (committed or not), after which the request
    /// is applied to whatever step is then current.
    Settling(watch::Receiver<bool>),
    /// No step of the run is running in this process.
    NotInFlight,
}

#[derive(Default)]
pub(crate) struct InFlightRegistry {
    inner: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    next_generation: u64,
    entries: HashMap<RunId, Entry>,
}

impl InFlightRegistry {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every critical section is a few map operations that cannot leave
        // the map inconsistent, so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Register a running step of `run_id`; `token` is fired by a
    /// cancellation. The registration ends when the guard drops.
    pub(crate) fn begin(
        self: &Arc<Self>,
        run_id: &RunId,
        token: CancellationToken,
    ) -> InFlightGuard {
        let (settled_tx, settled) = watch::channel(false);
        let mut registry = self.lock();
        registry.next_generation += 1;
        let generation = registry.next_generation;
        registry.entries.insert(
            run_id.clone(),
            Entry {
                generation,
                phase: Phase::Running,
                token,
                settled,
            },
        );
        InFlightGuard {
            registry: self.clone(),
            run_id: run_id.clone(),
            generation,
            settled: settled_tx,
        }
    }

    /// Whether no step is registered: every step that began in this
    /// process has settled (or was dropped).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    /// Deliver an external cancellation to the running step of `run_id`.
    pub(crate) fn request_cancel(&self, run_id: &RunId) -> CancelVerdict {
        let mut registry = self.lock();
        let Some(entry) = registry.entries.get_mut(run_id) else {
            return CancelVerdict::NotInFlight;
        };
        match entry.phase {
            Phase::Running | Phase::CancelRequested => {
                entry.phase = Phase::CancelRequested;
                entry.token.cancel();
                CancelVerdict::Requested
            }
            Phase::Settling => CancelVerdict::Settling(entry.settled.clone()),
        }
    }
}

/// A running step's registration.
pub(crate) struct InFlightGuard {
    registry: Arc<InFlightRegistry>,
    run_id: RunId,
    generation: u64,
    settled: watch::Sender<bool>,
}

impl InFlightGuard {
    /// Decide, once the runner returned, whether an external cancellation
    /// came first (`true`: settle as cancelled). Otherwise the step is
    /// marked settling and later requests wait for its settlement.
    pub(crate) fn decide(&self) -> bool {
        let mut registry = self.registry.lock();
        match registry.entries.get_mut(&self.run_id) {
            Some(entry) if entry.generation == self.generation => match entry.phase {
                Phase::CancelRequested => true,
                _ => {
                    entry.phase = Phase::Settling;
                    false
                }
            },
            _ => false,
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        {
            let mut registry = self.registry.lock();
            if registry
                .entries
                .get(&self.run_id)
                .is_some_and(|entry| entry.generation == self.generation)
            {
                registry.entries.remove(&self.run_id);
            }
        }
        let _ = self.settled.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> RunId {
        RunId::new("r").unwrap()
    }

    #[test]
    fn a_cancel_before_the_decision_wins_and_fires_the_token() {
        let registry = Arc::new(InFlightRegistry::default());
        let token = CancellationToken::new();
        let guard = registry.begin(&id(), token.clone());
        assert!(matches!(
            registry.request_cancel(&id()),
            CancelVerdict::Requested
        ));
        assert!(token.is_cancelled());
        assert!(guard.decide());
    }

    #[tokio::test]
    async fn a_cancel_after_the_decision_waits_for_the_settlement() {
        let registry = Arc::new(InFlightRegistry::default());
        let guard = registry.begin(&id(), CancellationToken::new());
        assert!(!guard.decide());
        let CancelVerdict::Settling(mut settled) = registry.request_cancel(&id()) else {
            panic!("expected to wait for the settlement");
        };
        drop(guard);
        settled.wait_for(|done| *done).await.unwrap();
        assert!(matches!(
            registry.request_cancel(&id()),
            CancelVerdict::NotInFlight
        ));
    }

    #[test]
    fn an_older_guard_does_not_remove_a_newer_registration() {
        let registry = Arc::new(InFlightRegistry::default());
        let old = registry.begin(&id(), CancellationToken::new());
        let _new = registry.begin(&id(), CancellationToken::new());
        drop(old);
        assert!(matches!(
            registry.request_cancel(&id()),
            CancelVerdict::Requested
        ));
    }
}
