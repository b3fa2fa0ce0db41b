//! When maintenance reads the queue's dead count, the trigger of its
//! dead-letter reconciliation (see `engine::sweep`).
//!
//! The count comes from taquba's `QueueView::stats`, which reads all five
//! of the queue's counters. They are merge operands in SlateDB, one per
//! transition, and a read folds every operand not yet compacted: on a busy
//! store the read costs tens of milliseconds of CPU (measured 20–140 ms
//! after 10k–400k transitions in memory), where it costs about one on a
//! quiet one. Read every poll interval (500 ms by default), that was a
//! tenth to a quarter of a core on a busy runtime.
//!
//! So a read is made every round only while reads are cheap. One that took
//! longer than [`CHEAP_READ`] spaces the next so that the reads take about
//! a fiftieth of the time between them, at most [`MAX_ROUNDS_BETWEEN`]
//! rounds apart. Whatever the spacing, the next round reads when the
//! worker reports a dead letter it could not account for
//! ([`DeadCountSchedule::expect_change`]): a failure dead-lettered without
//! ending its run, a retry on the last attempt, a claim lost to its lease's
//! expiry (the reaper then retried or dead-lettered it). What only the
//! spaced reads see is a dead letter by other code on the queue, or by the
//! reaper while the step's runner still runs; a wait on such a run looks
//! at its step every poll interval anyway.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A read of the count that took at most this long (wall clock) leaves the
/// next one at the next round.
pub(crate) const CHEAP_READ: Duration = Duration::from_millis(10);

/// The share of the time between two reads that reads may take, as its
/// inverse: 50 is a fiftieth, 2 %.
const READ_SHARE_INVERSE: u32 = 50;

/// The most maintenance rounds between two reads, however long one takes
/// (8 s at the default 500 ms poll interval).
pub(crate) const MAX_ROUNDS_BETWEEN: u64 = 16;

/// When the next read of the dead count is due.
#[derive(Debug, Default)]
pub(crate) struct DeadCountSchedule {
    /// The first round whose look reads the count.
    next_round: AtomicU64,
    /// Set when the worker performed or met a dead letter it could not
    /// account for: the next round reads, whatever `next_round` says.
    expected: AtomicBool,
}

impl DeadCountSchedule {
    /// Whether round `round` reads the count; consumes a change expected
    /// since the last read (give it back with
    /// [`expect_change`](Self::expect_change) if the read fails).
    pub(crate) fn due(&self, round: u64) -> bool {
        let expected = self.expected.swap(false, Ordering::Relaxed);
        expected || round >= self.next_round.load(Ordering::Relaxed)
    }

    /// Record a read made at `round` that took `took` (wall clock), with
    /// rounds `poll_interval` apart: the next read is due as
    /// [`rounds_between`] says.
    pub(crate) fn read_at(&self, round: u64, took: Duration, poll_interval: Duration) {
        self.next_round.store(
            round.saturating_add(rounds_between(took, poll_interval)),
            Ordering::Relaxed,
        );
    }

    /// Make the next round read the count: the worker performed or met a
    /// dead letter it does not count as its own.
    pub(crate) fn expect_change(&self) {
        self.expected.store(true, Ordering::Relaxed);
    }
}

/// The rounds from one read of the count, which took `took`, to the next:
/// 1 (the next round) for a read of at most [`CHEAP_READ`], else enough
/// rounds of `poll_interval` that reads take about 2 % of the time, at most
/// [`MAX_ROUNDS_BETWEEN`].
pub(crate) fn rounds_between(took: Duration, poll_interval: Duration) -> u64 {
    if took <= CHEAP_READ {
        return 1;
    }
    let budget = (poll_interval / READ_SHARE_INVERSE).max(Duration::from_micros(1));
    let rounds = took.as_nanos().div_ceil(budget.as_nanos());
    u64::try_from(rounds)
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_ROUNDS_BETWEEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn cheap_reads_are_made_every_round() {
        assert_eq!(rounds_between(Duration::ZERO, 500 * MS), 1);
        assert_eq!(rounds_between(CHEAP_READ, 500 * MS), 1);
        // Even with a poll interval so short that 10 ms is many of them.
        assert_eq!(rounds_between(CHEAP_READ, MS), 1);
    }

    #[test]
    fn expensive_reads_take_a_fiftieth_of_the_time_up_to_sixteen_rounds() {
        // 2 % of 500 ms is 10 ms a round.
        assert_eq!(rounds_between(11 * MS, 500 * MS), 2);
        assert_eq!(rounds_between(20 * MS, 500 * MS), 2);
        assert_eq!(rounds_between(21 * MS, 500 * MS), 3);
        assert_eq!(rounds_between(140 * MS, 500 * MS), 14);
        assert_eq!(rounds_between(161 * MS, 500 * MS), MAX_ROUNDS_BETWEEN);
        assert_eq!(rounds_between(Duration::MAX, 500 * MS), MAX_ROUNDS_BETWEEN);
        // A zero poll interval neither divides by zero nor waits forever.
        assert_eq!(rounds_between(20 * MS, Duration::ZERO), MAX_ROUNDS_BETWEEN);
        // A long poll interval leaves room for a slow read every round.
        assert_eq!(rounds_between(100 * MS, Duration::from_secs(10)), 1);
    }

    #[test]
    fn a_schedule_reads_first_then_as_its_last_read_says() {
        let schedule = DeadCountSchedule::default();
        assert!(schedule.due(0), "the first round reads");
        schedule.read_at(0, 140 * MS, 500 * MS);
        for round in 1..14 {
            assert!(!schedule.due(round), "round {round} skips the read");
        }
        assert!(schedule.due(14));
        schedule.read_at(14, MS, 500 * MS);
        assert!(schedule.due(15));
    }

    #[test]
    fn an_expected_change_makes_the_next_round_read_once() {
        let schedule = DeadCountSchedule::default();
        schedule.read_at(0, 160 * MS, 500 * MS);
        assert!(!schedule.due(1));
        schedule.expect_change();
        assert!(schedule.due(2), "read on the expected change");
        assert!(!schedule.due(3), "the change is consumed by one round");
        assert!(schedule.due(16), "the spacing of the last read still ends");
    }
}
