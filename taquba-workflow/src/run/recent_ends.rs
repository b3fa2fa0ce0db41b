//! The ends of the runs that terminated lately in this process, outcome
//! included, so that a wait for a run that ended before it began takes the
//! outcome from memory instead of reading the run result record back from
//! the object store (a GET: a file read on a local directory, a round trip
//! to a bucket).
//!
//! An end is kept once its terminating commit committed (the committer
//! reports it, as it tells the run's watchers), with the terminal record
//! that commit wrote, and used only for that termination: the waiter reads
//! the run's terminal record first, as before, and takes a kept outcome
//! only when that record is the kept one (the whole record but its history
//! entries, as a result record is matched to its termination: a run under
//! the same id that ended the same way in the same millisecond, with
//! another input or as a plain run instead of a group member, does not
//! match). A run ended again since (a requeue) has another terminal record
//! and reads its result record; a run whose records retention removed is
//! not found, whatever is kept; a run whose memos
//! [`MemoStore::clear_memos_for_run`](crate::MemoStore::clear_memos_for_run)
//! removed has its kept end forgotten with them.
//!
//! Shared by every runtime over the same queue (keyed by the queue, as the
//! run-record cache is): the runtime that waits need not be the one whose
//! worker ended the run. Bounded: at most [`MAX_ENDS`] ends and
//! [`MAX_BYTES`] of their results, errors and headers, the oldest going
//! first; an outcome over [`MAX_OUTCOME_BYTES`] is not kept.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use taquba::Queue;

use crate::model::{RunEnd, RunOutcome};
use crate::run::per_queue::{Registry, shared};
use crate::store::durable::DurableTermination;
use crate::store::keys::RunId;

/// The most ends kept per queue.
const MAX_ENDS: usize = 4096;
/// The most bytes of outcomes (results, errors, headers) kept per queue.
const MAX_BYTES: usize = 8 << 20;
/// The largest outcome kept, in bytes; larger ones are read back.
const MAX_OUTCOME_BYTES: usize = 64 << 10;

/// One run's kept end.
#[derive(Debug)]
struct Kept {
    /// The terminal record its commit wrote.
    record: DurableTermination,
    outcome: RunOutcome,
    /// Its outcome's bytes (see [`outcome_bytes`]).
    bytes: usize,
    /// Its listing in [`State::order`].
    number: u64,
}

#[derive(Debug, Default)]
struct State {
    ends: HashMap<RunId, Kept>,
    /// Run ids in the order their ends were kept (an id ended again is
    /// listed again; a listing whose number is not its kept end's is
    /// skipped when it comes up).
    order: VecDeque<(RunId, u64)>,
    /// The kept ends' outcome bytes.
    bytes: usize,
    /// The next listing's number.
    next: u64,
}

static REGISTRY: LazyLock<Registry<Arc<Mutex<State>>>> = LazyLock::new(Registry::default);

/// See the module doc. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecentEnds {
    state: Arc<Mutex<State>>,
}

impl RecentEnds {
    /// The recent ends of `queue`'s runs, shared by every runtime over it.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        Self {
            state: shared(&REGISTRY, queue, Arc::default),
        }
    }

    /// Keep `end`, just committed for `run_id` with the terminal record
    /// `record`, if it carries an outcome small enough; else forget what
    /// was kept of an earlier end of the run id (whatever it was, it is not
    /// this end's).
    pub(crate) fn ended(&self, run_id: &RunId, record: DurableTermination, end: &RunEnd) {
        let kept = end
            .outcome
            .as_ref()
            .map(|outcome| (outcome, outcome_bytes(outcome)))
            .filter(|(_, bytes)| *bytes <= MAX_OUTCOME_BYTES);
        let mut state = self.lock();
        state.forget(run_id);
        let Some((outcome, bytes)) = kept else {
            return;
        };
        let number = state.next;
        state.next += 1;
        state.bytes += bytes;
        state.ends.insert(
            run_id.clone(),
            Kept {
                record,
                outcome: outcome.clone(),
                bytes,
                number,
            },
        );
        state.order.push_back((run_id.clone(), number));
        while state.ends.len() > MAX_ENDS || state.bytes > MAX_BYTES {
            let Some((oldest, number)) = state.order.pop_front() else {
                break;
            };
            if state.is_listed(&oldest, number) {
                state.forget(&oldest);
            }
        }
        // Listings of ends forgotten or kept again since pile up only
        // until the next pass over them.
        if state.order.len() > 2 * MAX_ENDS {
            let mut order = std::mem::take(&mut state.order);
            order.retain(|(id, number)| state.is_listed(id, *number));
            state.order = order;
        }
    }

    /// The outcome kept for `run_id`'s termination whose terminal record,
    /// just read, is `record`; `None` when none is kept for that
    /// termination.
    pub(crate) fn outcome_of(
        &self,
        run_id: &RunId,
        record: &DurableTermination,
    ) -> Option<RunOutcome> {
        let state = self.lock();
        let kept = state.ends.get(run_id)?;
        kept.record
            .same_termination(record)
            .then(|| kept.outcome.clone())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain map and queue updates that cannot be left half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Forget the end kept for `run_id` over every queue: its run result record
/// is being removed ([`MemoStore::clear_memos_for_run`](crate::MemoStore::clear_memos_for_run),
/// which knows its object store, not the queue), and a wait after that
/// reads the store, which no longer has it.
pub(crate) fn forget_everywhere(run_id: &RunId) {
    let states: Vec<Arc<Mutex<State>>> = REGISTRY
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .values()
        .map(|(_, state)| state.clone())
        .collect();
    for state in states {
        RecentEnds { state }.lock().forget(run_id);
    }
}

impl State {
    fn forget(&mut self, run_id: &RunId) {
        if let Some(kept) = self.ends.remove(run_id) {
            self.bytes -= kept.bytes;
        }
    }

    /// Whether the listing `number` of `run_id` is its kept end's.
    fn is_listed(&self, run_id: &RunId, number: u64) -> bool {
        self.ends
            .get(run_id)
            .is_some_and(|kept| kept.number == number)
    }
}

/// The bytes `outcome` holds beyond its fixed size.
fn outcome_bytes(outcome: &RunOutcome) -> usize {
    outcome.result.as_ref().map_or(0, Vec::len)
        + outcome.error.as_ref().map_or(0, String::len)
        + outcome
            .headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RunTermination, TerminalStatus};

    /// A termination at `at_ms` with a `result`-byte result: its terminal
    /// record and its end.
    fn end(run: &RunId, at_ms: u64, result: usize) -> (DurableTermination, RunEnd) {
        let record = DurableTermination {
            status: crate::store::durable::DurableStatus::Succeeded,
            error: None,
            error_kind: None,
            final_step: 0,
            terminated_at_ms: at_ms,
            input_hash: vec![1; 32],
            submitted_at_ms: Some(1),
            job_id: Some("j".into()),
            history: None,
            execution: None,
            workflow: None,
            group: None,
            cancel_reason: None,
            member: None,
            forked_from: None,
            concurrency: None,
            version: None,
            patches: Vec::new(),
            parent: None,
        };
        let end = RunEnd {
            termination: RunTermination::from(&record),
            outcome: Some(RunOutcome {
                run_id: run.clone(),
                status: TerminalStatus::Succeeded,
                result: Some(vec![7; result]),
                error: None,
                headers: HashMap::new(),
                final_step: 0,
            }),
        };
        (record, end)
    }

    fn keep(ends: &RecentEnds, run: &RunId, (record, end): &(DurableTermination, RunEnd)) {
        ends.ended(run, record.clone(), end);
    }

    fn id(i: usize) -> RunId {
        RunId::new(format!("run-{i}")).unwrap()
    }

    #[test]
    fn an_outcome_answers_only_its_own_termination() {
        let ends = RecentEnds::default();
        let run = id(1);
        let first = end(&run, 10, 3);
        keep(&ends, &run, &first);
        assert_eq!(ends.outcome_of(&run, &first.0), first.1.outcome.clone());
        // Ended again (after a requeue): the earlier termination no longer
        // finds an outcome, the new one finds its own.
        let second = end(&run, 20, 5);
        keep(&ends, &run, &second);
        assert_eq!(ends.outcome_of(&run, &first.0), None);
        assert_eq!(ends.outcome_of(&run, &second.0), second.1.outcome);
        assert_eq!(ends.lock().bytes, 5);
    }

    #[test]
    fn a_termination_the_same_but_for_its_input_or_membership_is_another() {
        let ends = RecentEnds::default();
        let run = id(1);
        let kept = end(&run, 10, 3);
        keep(&ends, &run, &kept);
        // Another run under the id, ended the same way in the same
        // millisecond with another input: not the kept outcome's.
        let other_input = DurableTermination {
            input_hash: vec![2; 32],
            ..kept.0.clone()
        };
        assert_eq!(ends.outcome_of(&run, &other_input), None);
        let other_job = DurableTermination {
            job_id: Some("k".into()),
            ..kept.0.clone()
        };
        assert_eq!(ends.outcome_of(&run, &other_job), None);
        // The history entries the settlement adds afterwards do not count.
        let with_history = DurableTermination {
            history: Some(Default::default()),
            ..kept.0.clone()
        };
        assert_eq!(ends.outcome_of(&run, &with_history), kept.1.outcome);
    }

    #[test]
    fn an_end_that_is_not_kept_forgets_the_run_ids_earlier_one() {
        let ends = RecentEnds::default();
        let run = id(1);
        let first = end(&run, 10, 3);
        keep(&ends, &run, &first);
        // The run id ends again, at the same instant and the same way,
        // without an outcome: the first end's outcome is not its.
        let (record, mut again) = end(&run, 10, 0);
        again.outcome = None;
        ends.ended(&run, record, &again);
        assert_eq!(ends.outcome_of(&run, &first.0), None);
        assert_eq!(ends.lock().bytes, 0);
        keep(&ends, &run, &first);
        keep(&ends, &run, &end(&run, 10, MAX_OUTCOME_BYTES + 1));
        assert_eq!(ends.outcome_of(&run, &first.0), None);
    }

    #[test]
    fn ends_without_an_outcome_or_too_large_are_not_kept() {
        let ends = RecentEnds::default();
        let run = id(1);
        let (record, mut bare) = end(&run, 10, 0);
        bare.outcome = None;
        ends.ended(&run, record.clone(), &bare);
        assert_eq!(ends.outcome_of(&run, &record), None);
        let large = end(&run, 10, MAX_OUTCOME_BYTES + 1);
        keep(&ends, &run, &large);
        assert_eq!(ends.outcome_of(&run, &large.0), None);
        assert_eq!(ends.lock().bytes, 0);
    }

    #[test]
    fn the_oldest_ends_go_first_past_the_bounds() {
        let ends = RecentEnds::default();
        for i in 0..MAX_ENDS + 10 {
            keep(&ends, &id(i), &end(&id(i), 1, 1));
        }
        let state = ends.lock();
        assert_eq!(state.ends.len(), MAX_ENDS);
        assert!(!state.ends.contains_key(&id(9)));
        assert!(state.ends.contains_key(&id(10)));
        assert_eq!(state.bytes, MAX_ENDS);
        drop(state);
        // By bytes: each of these holds the largest outcome kept.
        let ends = RecentEnds::default();
        for i in 0..200 {
            keep(&ends, &id(i), &end(&id(i), 1, MAX_OUTCOME_BYTES));
        }
        let state = ends.lock();
        assert!(state.bytes <= MAX_BYTES);
        assert_eq!(state.ends.len(), MAX_BYTES / MAX_OUTCOME_BYTES);
        assert!(state.ends.contains_key(&id(199)));
    }

    #[test]
    fn listings_of_ids_kept_again_do_not_pile_up() {
        let ends = RecentEnds::default();
        let run = id(1);
        for at in 0..(3 * MAX_ENDS) as u64 {
            keep(&ends, &run, &end(&run, at, 1));
        }
        let state = ends.lock();
        assert_eq!(state.ends.len(), 1);
        assert!(state.order.len() <= 2 * MAX_ENDS + 1);
        assert_eq!(state.bytes, 1);
    }
}
