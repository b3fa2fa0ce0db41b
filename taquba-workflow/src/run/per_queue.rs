//! State shared by every runtime over one queue in this process (its id
//! generator, its store-closed token, its run-record cache): a store has
//! one writer process, so what the runtimes over a queue must agree on is
//! kept once per queue here. Entries are keyed by the queue's address; the
//! weak reference tells a live queue from a dropped one whose address was
//! reused, and entries of dropped queues go as new ones come.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use taquba::Queue;

/// A registry of one kind of per-queue state.
pub(crate) type Registry<T> = Mutex<HashMap<usize, (Weak<Queue>, T)>>;

/// The state of `queue` in `registry` (a clone of it), made with `make`
/// the first time.
pub(crate) fn shared<T: Clone>(
    registry: &Registry<T>,
    queue: &Arc<Queue>,
    make: impl FnOnce() -> T,
) -> T {
    // The lock guards plain map updates that cannot leave it half-done.
    let mut entries = registry.lock().unwrap_or_else(PoisonError::into_inner);
    entries.retain(|_, (weak, _)| weak.strong_count() > 0);
    entries
        .entry(Arc::as_ptr(queue) as usize)
        .or_insert_with(|| (Arc::downgrade(queue), make()))
        .1
        .clone()
}
