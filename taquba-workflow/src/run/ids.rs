//! Generated ids ([`IdGenerator`]): the ids of runs submitted without one,
//! of [`new_group`](crate::WorkflowRuntime::new_group) and of jobs without
//! an idempotency key are ULIDs whose time part is the runtime's clock and
//! which increase within a millisecond, so sorting generated ids gives the
//! order they were made in.
//!
//! One generator serves every runtime over the same queue in the process
//! (keyed by the queue's address, as the run watchers are): a runtime that
//! submits and another that runs jobs over clones of one `Arc<Queue>` share
//! one order.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use taquba::Queue;
use ulid::{Generator, Ulid};

use crate::run::per_queue::{Registry, shared};
use crate::store::keys::RunId;

/// The state of one queue's ids.
#[derive(Default)]
struct Monotonic {
    generator: Generator,
    /// The last id made, for the fallback when the random part of a
    /// millisecond's ids is used up.
    last: Option<Ulid>,
}

/// The latest time a ULID can spell, ms since the UNIX epoch (its time
/// part is 48 bits: the year 10889). A clock past it (a test's mock clock
/// skipped to a timeout of `Duration::MAX`) is taken as this time, so ids
/// keep increasing rather than wrap to 1970.
const MAX_ULID_MS: u64 = (1 << 48) - 1;

impl Monotonic {
    fn next(&mut self, now_ms: u64) -> Ulid {
        let now_ms = now_ms.min(MAX_ULID_MS);
        let next = match self.generator.generate_from_datetime(at(now_ms)) {
            Ok(next) => next,
            // 2^80 ids in one millisecond (or a random start that close to
            // the top): carry into the next millisecond, which is later than
            // every id made so far.
            Err(ulid::MonotonicError::Overflow) => {
                let carried = at(self
                    .last
                    .map_or(now_ms, |last| last.timestamp_ms())
                    .saturating_add(1)
                    .min(MAX_ULID_MS));
                // A fresh generator starts that millisecond at a random
                // point; its ids count on from there.
                self.generator = Generator::new();
                self.generator
                    .generate_from_datetime(carried)
                    .unwrap_or_else(|_| Ulid::from_datetime(carried))
            }
        };
        self.last = Some(next);
        next
    }
}

fn at(ms: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The generators of the queues runtimes were built over.
static GENERATORS: LazyLock<Registry<Arc<Mutex<Monotonic>>>> = LazyLock::new(Registry::default);

/// The id generator of one queue. Cheap to clone.
#[derive(Clone)]
pub(crate) struct IdGenerator {
    state: Arc<Mutex<Monotonic>>,
}

impl IdGenerator {
    /// The generator shared by every runtime over `queue`.
    pub(crate) fn for_queue(queue: &Arc<Queue>) -> Self {
        Self {
            state: shared(&GENERATORS, queue, Arc::default),
        }
    }

    /// A new id at `now_ms` (ms since the Unix epoch): later than every id
    /// this generator made before, its time part `now_ms` unless the clock
    /// went back (then the time of the latest id).
    pub(crate) fn next(&self, now_ms: u64) -> RunId {
        // A plain update that cannot be left half done: a poisoned lock is
        // still usable.
        let ulid = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next(now_ms);
        RunId::from_ulid(ulid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_past_the_last_ulid_time_does_not_wrap_the_ids() {
        let mut ids = Monotonic::default();
        let now = ids.next(1_700_000_000_000);
        let far = ids.next(u64::MAX / 2);
        let farther = ids.next(u64::MAX);
        assert!(now < far && far < farther, "{now} {far} {farther}");
        assert_eq!(far.timestamp_ms(), MAX_ULID_MS);
        // The clock back in range: ids still follow the latest one.
        assert!(ids.next(1_700_000_000_001) > farther);
    }

    #[test]
    fn ids_increase_within_a_millisecond_and_follow_the_clock() {
        let mut ids = Monotonic::default();
        let a = ids.next(1_000);
        let b = ids.next(1_000);
        assert!(b > a);
        assert_eq!((a.timestamp_ms(), b.timestamp_ms()), (1_000, 1_000));
        let c = ids.next(1_005);
        assert_eq!(c.timestamp_ms(), 1_005);
        // A clock that went back does not reorder ids.
        let d = ids.next(900);
        assert!(d > c);
        assert_eq!(d.timestamp_ms(), 1_005);
    }

    #[test]
    fn an_exhausted_millisecond_carries_into_the_next() {
        let mut ids = Monotonic::default();
        // The last id of millisecond 7: the generator cannot count past it.
        let top = ids
            .generator
            .generate_from_datetime_with_source(at(7), &mut AllOnes)
            .expect("a first id");
        ids.last = Some(top);
        let next = ids.next(7);
        assert_eq!(next.timestamp_ms(), 8);
        assert!(next > top);
        let after = ids.next(7);
        assert!(after > next, "later calls count on from the carried id");
    }

    /// A random source whose every bit is set.
    struct AllOnes;

    impl rand::RngCore for AllOnes {
        fn next_u32(&mut self) -> u32 {
            u32::MAX
        }

        fn next_u64(&mut self) -> u64 {
            u64::MAX
        }

        fn fill_bytes(&mut self, dst: &mut [u8]) {
            dst.fill(0xFF);
        }
    }
}
