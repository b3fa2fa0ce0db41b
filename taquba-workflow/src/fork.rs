//! Fork and restart: the public shapes of
//! [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork) and
//! [`WorkflowRuntime::restart`](crate::WorkflowRuntime::restart) (the
//! options a fork takes, the link a forked run keeps to its origin). The
//! engine's side is in `engine::fork`, the recorded step input it starts
//! from in `view::step_input`.

use crate::store::durable::DurableForkLink;
use crate::store::keys::RunId;

/// The run and step a run was forked from
/// ([`RunDetails::forked_from`](crate::view::RunDetails::forked_from)):
/// kept on the forked run's records for as long as they are kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ForkedFrom {
    /// The original run.
    pub run_id: RunId,
    /// The step of the original run the fork started from (0 for a
    /// restart).
    pub step: u32,
}

impl From<DurableForkLink> for ForkedFrom {
    fn from(link: DurableForkLink) -> Self {
        Self {
            run_id: link.run_id,
            step: link.step,
        }
    }
}

/// How [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork) and
/// [`restart`](crate::WorkflowRuntime::restart) start the new run. Build it
/// with [`ForkOptions::new`] (a generated run id; an active run refused)
/// and the setters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForkOptions {
    /// The new run's id; a ULID is generated when `None`. Give one to make
    /// the fork idempotent: a retried call with the same id, run and step
    /// answers the fork already made (`newly_submitted: false`).
    pub run_id: Option<RunId>,
    /// Cancel the original run first when it is still active (and wait for
    /// it to end); without it an active run is refused with
    /// [`Error::RunActive`](crate::Error::RunActive). The step's input is
    /// read before the cancel, so a fork refused
    /// ([`Error::StepNotForkable`](crate::Error::StepNotForkable): a step
    /// the run has not reached, or whose input is no longer recorded)
    /// leaves the run running, and a step whose only copy of its input is
    /// its job (a payload over the
    /// [step input limit](crate::WorkflowRuntimeBuilder::step_input_limit))
    /// is forked although the cancel deletes the job.
    pub cancel_active: bool,
}

impl ForkOptions {
    /// A fork under a generated id that refuses an active run.
    pub fn new() -> Self {
        Self::default()
    }

    /// The new run's id (see [`ForkOptions::run_id`]).
    pub fn run_id(mut self, run_id: RunId) -> Self {
        self.run_id = Some(run_id);
        self
    }

    /// Cancel an active original run first (see
    /// [`ForkOptions::cancel_active`]).
    pub fn cancel_active(mut self, cancel: bool) -> Self {
        self.cancel_active = cancel;
        self
    }
}
