//! The in-memory copy of the history entries each run's pointer carries,
//! keyed by the job the pointer names: the settlement that committed a
//! pointer leaves its entries here, and the settlement of the job it names
//! takes them instead of reading the pointer back (a read costs about as
//! much as the whole history entry otherwise would). A miss (a restart, a
//! job adopted by another runtime, an entry dropped to bound the memory)
//! reads the pointer; an entry is only ever what a committed pointer holds.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::history::record::PendingHistory;

/// The most entries kept; reaching it empties the cache (a run waiting on a
/// long timer or a cancelled one would otherwise hold its entry forever).
const CAPACITY: usize = 16_384;

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct HistoryCache {
    entries: Mutex<HashMap<String, PendingHistory>>,
}

impl HistoryCache {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, PendingHistory>> {
        // Every mutation is one insert or remove: a poisoned map is whole.
        self.entries
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Keep `pending`, the entries of the committed pointer naming `job_id`.
    pub(crate) fn put(&self, job_id: String, pending: PendingHistory) {
        let mut entries = self.lock();
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(job_id, pending);
    }

    /// Take the entries of the pointer naming `job_id`, if kept.
    pub(crate) fn take(&self, job_id: &str) -> Option<PendingHistory> {
        self.lock().remove(job_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_taken_once_and_the_cache_stays_bounded() {
        let cache = HistoryCache::default();
        cache.put("j".into(), PendingHistory::default());
        assert!(cache.take("j").is_some());
        assert!(cache.take("j").is_none());
        for n in 0..CAPACITY + 1 {
            cache.put(n.to_string(), PendingHistory::default());
        }
        assert!(cache.lock().len() <= CAPACITY);
    }
}
