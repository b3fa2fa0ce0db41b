//! Run history: one compact record per step of a run, written by the
//! settlement of each of its attempts in the same transaction, so the
//! history says exactly what the store committed. The public shapes a
//! reader gets ([`RunHistory`], [`StepHistory`], [`StepAttempt`],
//! [`AttemptOutcome`]) are here; the stored records and the effects that
//! write them are in `record` (with the in-memory copy in `cache`), the
//! worker's entries in `attempt`, names in `naming`, the read in `read`.

pub(crate) mod cache;
pub(crate) mod naming;
pub(crate) mod read;
pub(crate) mod record;

use crate::model::StepErrorKind;
use crate::store::keys::RunId;

/// The number of most recent history entries (one per settled step) a run
/// keeps at least, by default
/// ([`WorkflowRuntimeBuilder::history_limit`](crate::WorkflowRuntimeBuilder::history_limit)).
pub const DEFAULT_HISTORY_LIMIT: u32 = 100;
/// The longest error message, reason or signal key a history entry keeps,
/// in bytes: a longer one is cut at a character boundary at most this long
/// and ends with `…` (U+2026).
pub const MAX_HISTORY_TEXT_LEN: usize = 1024;
/// The most attempts one step's record keeps: the earliest are dropped
/// first and counted in [`StepHistory::attempts_dropped`].
pub const MAX_ATTEMPTS_PER_STEP: usize = 16;
/// The largest step payload a history entry keeps by default, in bytes
/// ([`WorkflowRuntimeBuilder::step_input_limit`](crate::WorkflowRuntimeBuilder::step_input_limit)):
/// what [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork) starts a
/// fork from. A larger payload is not copied; its entry names the step's
/// job instead, which a fork reads while the queue keeps it. Kept small:
/// an entry rides on the run's pointer, which every settlement rewrites
/// until 8 entries fill a chunk, so a kept payload of `n` bytes is written
/// about five times (≈ `5 × n` bytes more per step than without it).
pub const DEFAULT_STEP_INPUT_LIMIT: usize = 1024;
/// The largest [`step_input_limit`](crate::WorkflowRuntimeBuilder::step_input_limit)
/// a runtime takes, in bytes (a larger one is lowered to it): a chunk of 8
/// entries with their payloads and attempts stays under the queue's KV
/// value cap.
pub const MAX_STEP_INPUT_LIMIT: usize = 8192;

/// The recorded history of one run, from
/// [`WorkflowView::steps`](crate::WorkflowView::steps): the retained steps
/// in step order, and counters that say what is not retained.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunHistory {
    /// The run.
    pub run_id: RunId,
    /// The retained steps, in step order. A step appears once it settled (or
    /// was ended from outside: a cancellation of a waiting step, a dead
    /// letter reconciled outside the worker); the current step of an active
    /// run appears once an attempt of it was retried or lost its lease.
    pub steps: Vec<StepHistory>,
    /// Steps the run has taken so far: its current (or final) step number
    /// plus one.
    pub steps_taken: u32,
    /// Steps before the first retained one (dropped to keep the last
    /// `history_limit` entries, or taken while history was off).
    pub steps_dropped: u32,
    /// The version of the code that submitted the run
    /// ([`versioning`](crate::versioning)); `None` when that code said
    /// none, or the run was submitted before versions were recorded.
    pub version: Option<String>,
}

/// The history of one step of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepHistory {
    /// The step number (0 for the run's first step).
    pub step: u32,
    /// The step's name: the `#[step]` fn of a `#[workflow]` run, the job's
    /// [`NAME`](crate::jobs::Job::NAME) for a job, what
    /// [`StepRunner::step_name`](crate::StepRunner::step_name) returned, or
    /// else the runner's type name (its last path segment). Empty for the
    /// current step of an active run that has only retried so far, when its
    /// payload names nothing.
    pub name: String,
    /// The settled attempts, oldest first (at most
    /// [`MAX_ATTEMPTS_PER_STEP`]). An attempt whose lease expired without a
    /// settlement leaves no entry: the attempt numbers then skip it.
    pub attempts: Vec<StepAttempt>,
    /// Earlier attempts of this step not kept in `attempts`.
    pub attempts_dropped: u32,
    /// The version of the code that settled the step (its last entry's), or
    /// else the version the run started on ([`RunHistory::version`]).
    pub version: Option<String>,
}

/// One settled attempt of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepAttempt {
    /// The attempt number (1 for the first delivery; 0 for a step ended
    /// from outside before it was ever delivered).
    pub attempt: u32,
    /// When the attempt was claimed, ms since the UNIX epoch (queue clock);
    /// `None` for an entry of a step that was not running (a cancelled
    /// waiting step, a requeue).
    pub claimed_at_ms: Option<u64>,
    /// When its settlement committed, ms since the UNIX epoch (runtime
    /// clock).
    pub settled_at_ms: u64,
    /// What happened.
    pub outcome: AttemptOutcome,
}

/// What one attempt of a step led to. (Not `taquba::AttemptOutcome`, the
/// queue's view of a job's delivery.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The run continued with its next step: at once (`delay_ms` and
    /// `signal` both `None`), after a durable timer, or on a signal.
    Continued {
        /// The timer's delay, ms.
        delay_ms: Option<u64>,
        /// The signal the next step waits for.
        signal: Option<SignalWaitSpec>,
    },
    /// A transient error: the step is retried with the queue's backoff. (A
    /// retry's entry is the queue's own record of it, committed with the
    /// retry and read into the step's history when the step settles.)
    Retried {
        /// The error (cut to [`MAX_HISTORY_TEXT_LEN`]).
        error: String,
    },
    /// The run succeeded.
    Succeeded,
    /// The run failed at this attempt: a runner `Fail` verdict (kind
    /// `Permanent`), or a step error that ended it (a permanent one, or a
    /// transient one on the last attempt), whose step job was dead-lettered
    /// in the same transaction.
    Failed {
        /// How the error was classified.
        kind: StepErrorKind,
        /// The error (cut to [`MAX_HISTORY_TEXT_LEN`]).
        error: String,
    },
    /// The run was cancelled: by the runner (`reason` is its reason) or from
    /// outside (`reason` is the one given to the cancellation, if any).
    Cancelled {
        /// Why (cut to [`MAX_HISTORY_TEXT_LEN`]).
        reason: Option<String>,
    },
    /// The step job was dead-lettered outside the worker (a lease that
    /// expired past the last attempt, an operator's or tool's
    /// `taquba::Queue::dead_letter`) and the run was failed by
    /// reconciliation. (A crash on the last attempt is [`Interrupted`](Self::Interrupted).)
    DeadLettered {
        /// The job's last error (cut to [`MAX_HISTORY_TEXT_LEN`]).
        error: String,
    },
    /// The attempt's lease expired before it settled and the queue's reaper
    /// delivered the step again; what the attempt did is unknown.
    LeaseExpired,
    /// The process holding the attempt exited before it settled: the step
    /// was delivered again when the store was next opened, or, when this
    /// was its last attempt, the queue dead-lettered it then and the run
    /// was failed by reconciliation (its error `claim interrupted by
    /// process exit`). Either way the entry has the attempt's claim time.
    Interrupted,
    /// The dead-lettered step was requeued by an operator
    /// ([`Command::Requeue`](crate::inbox::Command::Requeue)): a marker, not an
    /// attempt; the attempts after it count from 1 again.
    Requeued,
}

/// The signal a step continued on ([`Trigger::OnSignal`](crate::Trigger::OnSignal)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignalWaitSpec {
    /// The correlation key (cut to [`MAX_HISTORY_TEXT_LEN`]).
    pub correlation_key: String,
    /// How long the next step waits before it runs without a signal, ms.
    pub timeout_ms: u64,
}

/// `text` cut to at most [`MAX_HISTORY_TEXT_LEN`] bytes at a character
/// boundary, ending with `…` when cut.
pub(crate) fn cut(text: &str) -> String {
    cut_to(text, MAX_HISTORY_TEXT_LEN)
}

/// `text` cut to at most `max` bytes (`max` ≥ 3) at a character boundary,
/// ending with `…` when cut.
pub(crate) fn cut_to(text: &str, max: usize) -> String {
    cut_cow(text, max).into_owned()
}

/// [`cut_to`], borrowing `text` when it is short enough.
pub(crate) fn cut_cow(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    const ELLIPSIS: &str = "…";
    let mut end = max.saturating_sub(ELLIPSIS.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = String::with_capacity(end + ELLIPSIS.len());
    cut.push_str(&text[..end]);
    cut.push_str(ELLIPSIS);
    std::borrow::Cow::Owned(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_at_a_char_boundary_with_an_ellipsis() {
        assert_eq!(cut("short"), "short");
        let exact = "x".repeat(MAX_HISTORY_TEXT_LEN);
        assert_eq!(cut(&exact), exact);
        let long = "é".repeat(MAX_HISTORY_TEXT_LEN);
        let cut = cut(&long);
        assert!(cut.len() <= MAX_HISTORY_TEXT_LEN, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
        assert_eq!(cut_to("abcdef", 5), "ab…");
    }
}
