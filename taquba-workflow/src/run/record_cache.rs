//! The in-memory copy of active runs' records that the worker's claim path
//! reads instead of the store: every claimed step needs its run's record
//! (the cancellation flag, the execution its history is tagged with, the
//! code the run started on), and reading it back costs about a twentieth
//! of a whole step.
//!
//! A store has one writer process, so every commit that changes a run
//! record happens here; the cache is shared by every runtime over the same
//! queue (keyed by the queue's address, as the group locks are). An entry
//! is the record of a run *as it was while one step job of it was
//! current*: it is keyed by the run id and that job's id, so an entry left
//! by an earlier execution under the same run id (a re-submission after a
//! termination, a fork, a requeue) never answers a step job of the new one.
//!
//! The only commits that change an active run's record in place are the
//! cancellation's (the request, and the note that it reached a running
//! step). Each holds a [`RecordWrite`] from before its commit starts until
//! the commit has finished (the guard travels with the commit onto its
//! task, so a dropped caller does not end it early): taking it and dropping
//! it each remove the run's entry and move the cache's generation on, and
//! a read of the store fills the cache only when no write began or ended
//! since the read started. So an entry, when present, is what the store
//! holds; while a write is in flight there is none, and readers read the
//! store.
//!
//! The cancellation's ordering with a step's claim is kept: a step
//! registers with the in-flight registry before it looks its record up,
//! and the cancellation looks for the registration only after its commit
//! ended (and removed the entry), so a step that registered too late for
//! the request to reach its token finds no entry, or one filled after the
//! commit, and reads the request.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use taquba::Queue;

use crate::run::per_queue::{Registry, shared};
use crate::store::durable::DurableRunRecord;
use crate::store::keys::RunId;

/// The most entries kept; reaching it empties the cache (runs waiting on
/// long timers would otherwise hold theirs forever).
const CAPACITY: usize = 16_384;

/// One run's record while `job_id` was its current step job.
#[derive(Debug)]
struct Entry {
    job_id: String,
    record: Arc<DurableRunRecord>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<RunId, Entry>,
    /// Commits changing a run's record that have begun and not ended.
    writing: HashMap<RunId, u32>,
    /// Moved on by every write's beginning and end.
    generation: u64,
}

static REGISTRY: LazyLock<Registry<Arc<Mutex<State>>>> = LazyLock::new(Registry::default);

/// See the module doc. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunRecordCache {
    state: Arc<Mutex<State>>,
}

/// What [`RunRecordCache::lookup`] found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// The record, as the store holds it.
    Hit(Arc<DurableRunRecord>),
    /// Read the store, then give the record to
    /// [`fill`](RunRecordCache::fill) with this ticket.
    Miss(FillTicket),
}

/// A read's permission to fill the cache: valid while no write began or
/// ended since the lookup.
#[derive(Debug)]
pub(crate) struct FillTicket {
    /// `None` when a write of the run was in flight at the lookup.
    generation: Option<u64>,
}

/// A commit changing one run's record in place; see the module doc. Held
/// until the commit has finished.
#[derive(Debug)]
pub(crate) struct RecordWrite {
    state: Arc<Mutex<State>>,
    run_id: RunId,
}

impl RunRecordCache {
    /// The cache of `queue`, shared by every runtime over it.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        Self {
            state: shared(&REGISTRY, queue, Arc::default),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The record of `run_id` for its step job `job_id`.
    pub(crate) fn lookup(&self, run_id: &RunId, job_id: &str) -> Lookup {
        let state = self.lock();
        if let Some(entry) = state.entries.get(run_id)
            && entry.job_id == job_id
        {
            return Lookup::Hit(entry.record.clone());
        }
        Lookup::Miss(ticket_of(&state, run_id))
    }

    /// A ticket to fill `run_id`'s entry with a record about to be
    /// committed: taken before the commit, it keeps out a fill that a
    /// change of the record during or after the commit would make stale.
    pub(crate) fn ticket(&self, run_id: &RunId) -> FillTicket {
        ticket_of(&self.lock(), run_id)
    }

    /// Keep `record`, read from the store after the lookup that gave
    /// `ticket`, as `run_id`'s while `job_id` is current; nothing when a
    /// write began or ended since.
    pub(crate) fn fill(
        &self,
        ticket: FillTicket,
        run_id: &RunId,
        job_id: &str,
        record: Arc<DurableRunRecord>,
    ) {
        let mut state = self.lock();
        if ticket.generation != Some(state.generation) {
            return;
        }
        if state.entries.len() >= CAPACITY {
            state.entries.clear();
        }
        state.entries.insert(
            run_id.clone(),
            Entry {
                job_id: job_id.to_string(),
                record,
            },
        );
    }

    /// The settlement of `run_id`'s step job `from_job` committed
    /// `to_job` as its next step: the record is unchanged, so its entry
    /// (if any, and still for `from_job`) now answers `to_job`.
    pub(crate) fn advance(&self, run_id: &RunId, from_job: &str, to_job: &str) {
        let mut state = self.lock();
        if let Some(entry) = state.entries.get_mut(run_id)
            && entry.job_id == from_job
        {
            entry.job_id = to_job.to_string();
        }
    }

    /// `run_id` terminated: its entry is of no more use.
    pub(crate) fn forget(&self, run_id: &RunId) {
        self.lock().entries.remove(run_id);
    }

    /// Begin a commit that changes `run_id`'s record in place; hold the
    /// guard until the commit has finished.
    pub(crate) fn begin_write(&self, run_id: &RunId) -> RecordWrite {
        let mut state = self.lock();
        state.entries.remove(run_id);
        *state.writing.entry(run_id.clone()).or_insert(0) += 1;
        state.generation = state.generation.wrapping_add(1);
        RecordWrite {
            state: self.state.clone(),
            run_id: run_id.clone(),
        }
    }
}

impl Drop for RecordWrite {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.entries.remove(&self.run_id);
        if let Some(count) = state.writing.get_mut(&self.run_id) {
            *count -= 1;
            if *count == 0 {
                state.writing.remove(&self.run_id);
            }
        }
        state.generation = state.generation.wrapping_add(1);
    }
}

/// A fill ticket for `run_id` as of `state`: none while a write of the run
/// is in flight.
fn ticket_of(state: &State, run_id: &RunId) -> FillTicket {
    let generation = (!state.writing.contains_key(run_id)).then_some(state.generation);
    FillTicket { generation }
}

/// Every mutation is a few map operations that cannot be left half done:
/// a poisoned lock's state is whole.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cancel: bool) -> Arc<DurableRunRecord> {
        Arc::new(DurableRunRecord {
            cancel_requested: cancel,
            ..DurableRunRecord::default()
        })
    }

    fn id(s: &str) -> RunId {
        RunId::new(s).expect("valid id")
    }

    fn ticket(cache: &RunRecordCache, run: &RunId, job: &str) -> FillTicket {
        match cache.lookup(run, job) {
            Lookup::Miss(ticket) => ticket,
            Lookup::Hit(_) => panic!("expected a miss"),
        }
    }

    fn hit(cache: &RunRecordCache, run: &RunId, job: &str) -> Option<bool> {
        match cache.lookup(run, job) {
            Lookup::Hit(record) => Some(record.cancel_requested),
            Lookup::Miss(_) => None,
        }
    }

    #[test]
    fn a_fill_answers_its_job_and_the_next_one_after_an_advance() {
        let cache = RunRecordCache::default();
        let run = id("r");
        let t = ticket(&cache, &run, "j0");
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), Some(false));
        // Another job of the run (a new execution's) misses.
        assert_eq!(hit(&cache, &run, "other"), None);
        cache.advance(&run, "j0", "j1");
        assert_eq!(hit(&cache, &run, "j1"), Some(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
        // An advance from a job the entry no longer names changes nothing.
        cache.advance(&run, "j0", "j9");
        assert_eq!(hit(&cache, &run, "j1"), Some(false));
        cache.forget(&run);
        assert_eq!(hit(&cache, &run, "j1"), None);
    }

    #[test]
    fn a_read_that_raced_a_write_does_not_fill() {
        let cache = RunRecordCache::default();
        let run = id("r");
        // The read began before the write: its (old) record is not kept.
        let t = ticket(&cache, &run, "j0");
        let write = cache.begin_write(&run);
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
        // A read while the write is in flight is not kept either, even
        // after the write ended.
        let t = ticket(&cache, &run, "j0");
        drop(write);
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
        // A read that began during the write and fills before its end.
        let write = cache.begin_write(&run);
        let t = ticket(&cache, &run, "j0");
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
        drop(write);
        // After the write: kept.
        let t = ticket(&cache, &run, "j0");
        cache.fill(t, &run, "j0", record(true));
        assert_eq!(hit(&cache, &run, "j0"), Some(true));
    }

    #[test]
    fn a_submission_ticket_taken_before_its_commit_keeps_out_a_record_a_write_changed() {
        let cache = RunRecordCache::default();
        let run = id("r");
        // Taken before the submission's commit; a cancellation writes the
        // record after the commit and before the fill: not kept.
        let t = cache.ticket(&run);
        drop(cache.begin_write(&run));
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
        // No write in between: kept for the submitted step job.
        let t = cache.ticket(&run);
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), Some(false));
    }

    #[test]
    fn a_write_removes_the_entry_at_its_beginning_and_its_end() {
        let cache = RunRecordCache::default();
        let run = id("r");
        let t = ticket(&cache, &run, "j0");
        cache.fill(t, &run, "j0", record(false));
        let write = cache.begin_write(&run);
        assert_eq!(hit(&cache, &run, "j0"), None);
        // Two writes of one run overlap: the first one's end leaves the
        // second in flight, and reads still do not fill.
        let second = cache.begin_write(&run);
        drop(write);
        let t = ticket(&cache, &run, "j0");
        drop(second);
        cache.fill(t, &run, "j0", record(false));
        assert_eq!(hit(&cache, &run, "j0"), None);
    }
}
