//! The test kit's error: the runtime's errors, and what a test asked of the
//! environment that did not hold.

use std::time::Duration;

use crate::error::Error;
use crate::jobs::JobError;
use crate::store::keys::RunId;
use crate::workflows::WorkflowError;

/// Why a call on a [`TestRuntime`](super::TestRuntime) or
/// [`TestJobs`](super::TestJobs) (or a handle of theirs) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The runtime (or its queue) returned an error.
    #[error(transparent)]
    Runtime(#[from] Error),
    /// [`run_until_idle`](super::TestRuntime::run_until_idle) gave up: steps
    /// were still due or running after `waited` of Tokio time (the bound
    /// set with `idle_timeout`, 60 s by default). A step that waits for
    /// something the test does only after `run_until_idle` returns keeps
    /// the queue busy forever.
    #[error(
        "the queue is not idle after {waited:?} of Tokio time: {pending} steps due, {claimed} claimed (a step that never returns keeps it busy)"
    )]
    NotIdle {
        /// How long it waited, in Tokio time.
        waited: Duration,
        /// Jobs due at the last look.
        pending: i64,
        /// Jobs claimed (running or settling) at the last look.
        claimed: i64,
    },
    /// The run has not ended: it has steps waiting (a timer, a signal, a
    /// retry backoff: [`advance`](super::TestRuntime::advance) the clock or
    /// signal it), or the test did not run the queue until idle.
    #[error("run `{0}` has not ended (advance the clock, signal it, or run until idle)")]
    NotEnded(RunId),
    /// The run was never submitted (or retention removed its records).
    #[error("run `{0}` is unknown: never submitted, or removed by retention")]
    UnknownRun(RunId),
    /// The workflow run ended without success (failed or cancelled).
    #[error(transparent)]
    RunFailed(#[from] WorkflowError),
    /// The job ended without success (failed or cancelled).
    #[error("job `{id}` did not succeed: {error}")]
    JobFailed {
        /// The job's id.
        id: RunId,
        /// How it ended.
        error: JobError,
    },
    /// A [`crash`](super::TestRuntime::crash) could not reopen the queue;
    /// the environment has no runtime since.
    #[error("the environment's queue did not reopen after the crash")]
    NotReopened,
}
