//! The data of runs and steps, shared by every layer of the runtime: what is
//! submitted ([`RunSpec`], [`RunOptions`]) and what the submission did
//! ([`SubmitOutcome`]); what a step decided ([`StepOutcome`], [`Trigger`],
//! [`StepError`]); where a run is ([`RunStatus`], [`RunState`]) and how it
//! ended ([`RunTermination`], [`RunEnd`], [`RunOutcome`], [`TerminalStatus`]).
//! Plain values: nothing here reads or writes the store.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use taquba::SettlementEffects;

use crate::error::Error;
use crate::store::keys::RunId;

/// The latest first-step time a submission may ask for
/// ([`RunOptions::run_at`], [`SubmitCommand::run_at_ms`](crate::inbox::SubmitCommand::run_at_ms)),
/// ms since the UNIX epoch: 9999-12-31T23:59:59.999Z, the last instant
/// RFC 3339 writes with a four-digit year, so every stored time can be
/// shown. A later one is refused with [`Error::InvalidRunOptions`].
pub const MAX_RUN_AT_MS: u64 = 253_402_300_799_999;
/// The most headers a submission may carry ([`RunOptions::headers`]);
/// more are refused with [`Error::InvalidRunOptions`]. Every step job of
/// the run carries a copy.
pub const MAX_HEADERS: usize = 128;
/// The most bytes a submission's headers may take, names and values
/// together ([`RunOptions::headers`]); more are refused with
/// [`Error::InvalidRunOptions`].
pub const MAX_HEADERS_SIZE: usize = 16 * 1024;

/// Per-run options, applied to every step of the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Headers threaded through every step ([`Delivery::headers`](crate::Delivery::headers))
    /// and reported to the terminal hook ([`RunOutcome::headers`]). Names
    /// starting with `workflow.` are reserved and rejected; at most
    /// [`MAX_HEADERS`] of them, [`MAX_HEADERS_SIZE`] bytes in all.
    pub headers: HashMap<String, String>,
    /// The queue priority of every step (lower is claimed first; see
    /// [`taquba::PRIORITY_NORMAL`]); `None` is the queue's default.
    pub priority: Option<u32>,
    /// The attempt limit of every step; `None` is the queue's default.
    pub max_attempts_per_step: Option<u32>,
    /// The first step is not claimable before this time (at most
    /// [`MAX_RUN_AT_MS`]).
    pub run_at: Option<SystemTime>,
    /// The concurrency key of the run: at most
    /// [`concurrency_limit`](Self::concurrency_limit) runs under one key
    /// are active at a time, each holding a slot from its admission to its
    /// end (timers and signal waits included). A run submitted while its
    /// key is at its limit waits, holding no worker slot, and is admitted
    /// in submission order as slots free. 1 to
    /// [`MAX_CONCURRENCY_KEY_LEN`](crate::limits::MAX_CONCURRENCY_KEY_LEN) bytes,
    /// no `/` and no control characters; anything else is refused with
    /// [`Error::InvalidRunOptions`]. See
    /// [`WorkflowView::concurrency_keys`](crate::WorkflowView::concurrency_keys).
    pub concurrency_key: Option<String>,
    /// The most runs of [`concurrency_key`](Self::concurrency_key) active at
    /// a time, at least 1; `None` is 1. Set without a key, or 0, it is
    /// refused with [`Error::InvalidRunOptions`].
    pub concurrency_limit: Option<u32>,
}

impl RunOptions {
    /// Check the limits every submission is held to, in process and from
    /// the inbox alike: the header count and size, the run time, and the
    /// concurrency key and limit.
    ///
    /// # Errors
    /// [`Error::InvalidRunOptions`] naming the limit and the value.
    pub(crate) fn check_limits(&self) -> Result<(), Error> {
        let run_at_ms = self.run_at.map(|at| {
            at.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        });
        check_limits(&self.headers, run_at_ms)?;
        crate::coordination::keys::check_options(
            self.concurrency_key.as_deref(),
            self.concurrency_limit,
        )
    }
}

/// [`RunOptions::check_limits`] of `headers` and a run time of
/// `run_at_ms` (ms since the UNIX epoch).
pub(crate) fn check_limits(
    headers: &HashMap<String, String>,
    run_at_ms: Option<u64>,
) -> Result<(), Error> {
    if headers.len() > MAX_HEADERS {
        return Err(Error::InvalidRunOptions(format!(
            "{} headers, more than the {MAX_HEADERS} allowed",
            headers.len()
        )));
    }
    let size: usize = headers
        .iter()
        .map(|(name, value)| name.len().saturating_add(value.len()))
        .fold(0, usize::saturating_add);
    if size > MAX_HEADERS_SIZE {
        return Err(Error::InvalidRunOptions(format!(
            "the {} headers take {size} bytes (names and values), more than the {MAX_HEADERS_SIZE} allowed",
            headers.len()
        )));
    }
    if let Some(ms) = run_at_ms
        && ms > MAX_RUN_AT_MS
    {
        return Err(Error::InvalidRunOptions(format!(
            "run_at is {ms} ms since the epoch, past the latest allowed ({MAX_RUN_AT_MS}, 9999-12-31T23:59:59.999Z)"
        )));
    }
    Ok(())
}

/// A run to submit.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    /// The run's id; a ULID is generated when `None` (on the runtime's
    /// clock, monotonic within a millisecond, so generated ids sort in the
    /// order the submissions were made). Submission is idempotent on
    /// `(run_id, input)`.
    pub run_id: Option<RunId>,
    /// The payload of step 0.
    pub input: Vec<u8>,
    /// Options of every step.
    pub options: RunOptions,
    /// Application KV effects (and enqueues) committed atomically with the
    /// step-0 enqueue; dropped when the submission is a duplicate. Keys under
    /// `workflow/` are rejected, and so are enqueues with a `workflow.`
    /// header or into the runtime's own queue (see
    /// [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit)).
    pub effects: SettlementEffects,
}

/// What [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitOutcome {
    /// The run's id (generated when the spec had none).
    pub run_id: RunId,
    /// `false` when the run was already active with the same input: nothing
    /// was written.
    pub newly_submitted: bool,
    /// The queue job currently representing the run (its current step).
    pub job_id: String,
}

/// Where a run is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// The current step is waiting to be claimed (pending, scheduled on a
    /// timer, waiting for a signal, or backing off before a retry).
    Pending,
    /// The current step is claimed by a worker.
    Running,
    /// A cancellation was requested and the run has not terminated yet.
    Cancelling,
    /// The run terminated.
    Terminated(RunTermination),
}

/// The status of a run, from its durable records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunStatus {
    /// The run.
    pub run_id: RunId,
    /// Its state.
    pub state: RunState,
    /// The current step number (the final step for a terminated run).
    pub current_step: u32,
}

/// The longest error a run's terminal record keeps
/// ([`RunTermination::error`]), and a step job's last error in the queue:
/// 64 KiB. A longer one (a runner's error or `Fail` reason) is cut at a
/// character boundary, ending with `…`, so the records stay within the
/// queue's KV value limit; the run's outcome ([`RunOutcome::error`], in
/// its run result record and the terminal hook's notification) keeps it
/// whole.
pub const MAX_TERMINATION_ERROR_LEN: usize = 64 * 1024;

/// How a run terminated, from its terminal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunTermination {
    /// How it ended.
    pub status: TerminalStatus,
    /// The error (or runner-issued cancel reason); `None` on success and
    /// for an external cancellation. Cut to [`MAX_TERMINATION_ERROR_LEN`].
    pub error: Option<String>,
    /// For a failure from a step error or a runner `Fail` verdict
    /// (`Permanent`), its kind; `None` otherwise (including a dead letter
    /// outside the worker).
    pub error_kind: Option<StepErrorKind>,
    /// The step the run terminated at.
    pub final_step: u32,
    /// When the termination committed, ms since the UNIX epoch (runtime
    /// clock).
    pub terminated_at_ms: u64,
}

/// A terminated run as [`WorkflowRuntime::wait`](crate::WorkflowRuntime::wait) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnd {
    /// The termination.
    pub termination: RunTermination,
    /// The committed outcome, when the worker that terminated the run
    /// recorded one (`None` for a cancellation of a waiting step or a dead
    /// letter outside the worker).
    pub outcome: Option<RunOutcome>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalStatus {
    /// The runner returned [`StepOutcome::Succeed`].
    Succeeded,
    /// The runner returned [`StepOutcome::Fail`],
    /// or a step dead-lettered (permanent error, attempts exhausted, lease
    /// expired past its attempts).
    Failed,
    /// The runner returned [`StepOutcome::Cancel`]
    /// or the run was cancelled from outside.
    Cancelled,
}

impl TerminalStatus {
    /// `"succeeded"`, `"failed"` or `"cancelled"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for TerminalStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The committed outcome of a run, as a [`TerminalHook`](crate::TerminalHook) receives it and
/// [`WorkflowRuntime::outcome`](crate::WorkflowRuntime::outcome)(crate::WorkflowRuntime::outcome) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run.
    pub run_id: RunId,
    /// How it ended.
    pub status: TerminalStatus,
    /// The `Succeed` result bytes; `None` otherwise.
    pub result: Option<Vec<u8>>,
    /// The failure's error, or the reason of a runner-issued cancel; `None`
    /// on success and for an external cancellation.
    pub error: Option<String>,
    /// The submitter's headers (without the reserved `workflow.` ones).
    pub headers: HashMap<String, String>,
    /// The step the run terminated at.
    pub final_step: u32,
}

/// When the next step of a [`StepOutcome::Continue`] becomes claimable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// At once.
    Immediate,
    /// After the delay, measured on the runtime's clock; the timer is a
    /// scheduled queue job, so it survives restarts and holds no worker.
    After(Duration),
    /// When a signal for `correlation_key` arrives through
    /// [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal)(crate::WorkflowRuntime::signal), or when
    /// `timeout` elapses, whichever comes first. The next step sees
    /// [`Step::signal`](crate::Step::signal) `Some(payload)` or `None` (timeout).
    OnSignal {
        /// The key the signal is sent under. One waiter per key.
        correlation_key: String,
        /// How long to wait before the step runs without a signal.
        timeout: Duration,
    },
}

/// What a step decided. Every variant is settled in one queue transaction
/// with the acknowledgement of the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Enqueue the next step (step number + 1) with `payload`, claimable
    /// per `when`.
    Continue {
        /// The next step's payload.
        payload: Vec<u8>,
        /// When the next step becomes claimable.
        when: Trigger,
    },
    /// The run succeeded with `result` (the bytes
    /// [`RunOutcome::result`](crate::RunOutcome::result) reports).
    Succeed {
        /// The run's result bytes.
        result: Vec<u8>,
    },
    /// The run failed: a verdict of the runner, acknowledged normally (no
    /// dead letter). The reason is the run's error.
    Fail {
        /// Why the run failed.
        reason: String,
    },
    /// The runner cancelled the run; the reason is reported on
    /// [`RunOutcome::error`](crate::RunOutcome::error). Staged effects are
    /// kept.
    Cancel {
        /// Why the run was cancelled.
        reason: String,
    },
}

impl StepOutcome {
    /// Continue with `payload` at once.
    pub fn continue_now(payload: Vec<u8>) -> Self {
        Self::Continue {
            payload,
            when: Trigger::Immediate,
        }
    }

    /// Continue with `payload` after `delay` (a durable timer).
    pub fn continue_after(payload: Vec<u8>, delay: Duration) -> Self {
        Self::Continue {
            payload,
            when: Trigger::After(delay),
        }
    }

    /// Continue with `payload` when a signal for `correlation_key` arrives
    /// or after `timeout`.
    pub fn continue_on_signal(
        payload: Vec<u8>,
        correlation_key: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        Self::Continue {
            payload,
            when: Trigger::OnSignal {
                correlation_key: correlation_key.into(),
                timeout,
            },
        }
    }
}

/// How a [`StepError`] is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepErrorKind {
    /// Retry with backoff up to the attempt limit, then dead-letter.
    Transient,
    /// Dead-letter at once.
    Permanent,
}

/// A step that could not produce an outcome. The message becomes the
/// queue job's `last_error` and, when the error ends the run, the run's
/// error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct StepError {
    /// What went wrong.
    pub message: String,
    /// Whether a retry may help.
    pub kind: StepErrorKind,
}

impl StepError {
    /// A failure a retry may fix (a timeout, a 503, a lost connection).
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: StepErrorKind::Transient,
        }
    }

    /// A failure no retry can fix (bad input, a 4xx).
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            kind: StepErrorKind::Permanent,
        }
    }
}

impl From<Error> for StepError {
    /// Transient for storage errors, permanent for the rest
    /// ([`Error::is_permanent`]).
    fn from(err: Error) -> Self {
        let kind = if err.is_permanent() {
            StepErrorKind::Permanent
        } else {
            StepErrorKind::Transient
        };
        Self {
            message: err.to_string(),
            kind,
        }
    }
}
