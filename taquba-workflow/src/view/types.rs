//! The shapes the operator queries of [`WorkflowView`](crate::WorkflowView)
//! return and take: run listings ([`RunFilter`], [`RunPage`],
//! [`RunSummary`]), one run described ([`RunDetails`]), group listings
//! ([`GroupPage`]) and the runtimes recorded in a store
//! ([`RuntimeInfo`]). Plain data.

use std::collections::HashMap;

use crate::coordination::members::GroupStatus;
use crate::model::RunState;
use crate::store::keys::RunId;

/// The default page size of [`RunFilter`] and
/// [`WorkflowView::groups`](crate::WorkflowView::groups).
pub const DEFAULT_PAGE_LIMIT: usize = 100;
/// The largest page a listing returns; a larger `limit` is lowered to it.
pub const MAX_PAGE_LIMIT: usize = 1000;

/// Which runs a listing returns, by where they are in their life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StatusFilter {
    /// Runs not terminated yet (pending, running or cancelling).
    Active,
    /// Terminated runs whose terminal record retention has not removed.
    Terminated,
    /// Both, merged in run-id order.
    #[default]
    All,
}

/// What [`WorkflowView::runs`](crate::WorkflowView::runs) lists. Build it
/// with [`RunFilter::default`] (every run, [`DEFAULT_PAGE_LIMIT`] per page)
/// and the setters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunFilter {
    /// Active, terminated or all runs.
    pub status: StatusFilter,
    /// Only runs of this workflow: a `#[workflow]`'s name, or a job's
    /// [`NAME`](crate::jobs::Job::NAME).
    pub workflow: Option<String>,
    /// Only members of this run group.
    pub group: Option<RunId>,
    /// Only runs submitted at or after this time, ms since the UNIX epoch
    /// (queue clock). A terminated run recorded before the runtime stored
    /// submission times never matches.
    pub submitted_since_ms: Option<u64>,
    /// The page cursor: list runs whose id sorts after this one
    /// ([`RunPage::next`] of the page before).
    pub after: Option<RunId>,
    /// The most runs on the page (at least 1, at most [`MAX_PAGE_LIMIT`]).
    pub limit: usize,
    /// Only runs submitted on code of this version ([`RunSummary::version`];
    /// a run recorded before versions were kept never matches). A version
    /// longer than the 256 bytes a run keeps is compared cut the same way.
    pub version: Option<String>,
    /// Only runs whose recorded patches lack this one: the runs for which
    /// [`Delivery::patched`](crate::Delivery::patched) answers `false` (see
    /// [`versioning`](crate::versioning)). With [`StatusFilter::Active`]:
    /// the runs that still need the patch's old branch; none listed means
    /// the patch can be retired.
    pub lacks_patch: Option<String>,
}

impl Default for RunFilter {
    fn default() -> Self {
        Self {
            status: StatusFilter::All,
            workflow: None,
            group: None,
            submitted_since_ms: None,
            after: None,
            limit: DEFAULT_PAGE_LIMIT,
            version: None,
            lacks_patch: None,
        }
    }
}

impl RunFilter {
    /// Every run, [`DEFAULT_PAGE_LIMIT`] per page.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs in `status`.
    pub fn status(mut self, status: StatusFilter) -> Self {
        self.status = status;
        self
    }

    /// Only runs of the workflow (or job) `name`.
    pub fn workflow(mut self, name: impl Into<String>) -> Self {
        self.workflow = Some(name.into());
        self
    }

    /// Only members of `group`.
    pub fn group(mut self, group: RunId) -> Self {
        self.group = Some(group);
        self
    }

    /// Only runs submitted at or after `ms` (ms since the UNIX epoch).
    pub fn submitted_since_ms(mut self, ms: u64) -> Self {
        self.submitted_since_ms = Some(ms);
        self
    }

    /// The page after the run `run_id`.
    pub fn after(mut self, run_id: RunId) -> Self {
        self.after = Some(run_id);
        self
    }

    /// At most `limit` runs per page (clamped to `1..=`[`MAX_PAGE_LIMIT`]).
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Only runs submitted on code of `version`.
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = Some(version.into());
        self
    }

    /// Only runs whose recorded patches lack `patch` (see
    /// [`RunFilter::lacks_patch`](#structfield.lacks_patch)).
    pub fn lacks_patch(mut self, patch: impl Into<String>) -> Self {
        self.lacks_patch = Some(patch.into());
        self
    }
}

/// One page of a run listing.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunPage {
    /// The runs, in run-id order (generated ids are ULIDs, so for them this
    /// is submission order).
    pub runs: Vec<RunSummary>,
    /// The cursor of the next page ([`RunFilter::after`]); `None` when this
    /// page is the last.
    pub next: Option<RunId>,
}

/// A run as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunSummary {
    /// The run.
    pub run_id: RunId,
    /// Where it is: pending, running, cancelling or terminated (with how).
    pub state: RunState,
    /// The workflow (or job) name; `None` for a run of a hand-written
    /// runner, or recorded before the runtime stored names.
    pub workflow: Option<String>,
    /// The group the run is a member of.
    pub group: Option<RunId>,
    /// The current step (the final step of a terminated run).
    pub current_step: u32,
    /// That step's name, when known (see
    /// [`StepHistory::name`](crate::history::StepHistory::name)).
    pub step_name: Option<String>,
    /// Attempts consumed by that step (0 while it waits for its first
    /// delivery; for a terminated run, from its history, 0 when none is
    /// retained).
    pub attempts: u32,
    /// When the run was submitted, ms since the UNIX epoch (queue clock);
    /// `None` for a terminated run recorded before the runtime stored it.
    pub submitted_at_ms: Option<u64>,
    /// When it terminated, ms since the UNIX epoch; `None` while active.
    pub ended_at_ms: Option<u64>,
    /// The version of the code that submitted the run
    /// ([`versioning`](crate::versioning)); `None` when that code said
    /// none, or the run was recorded before versions were kept.
    pub version: Option<String>,
    /// The patches the run started with, sorted: those
    /// [`Delivery::patched`](crate::Delivery::patched) answers `true` for.
    pub patches: Vec<String>,
}

/// The signal a waiting step waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SignalWait {
    /// The correlation key a signal must be sent under.
    pub correlation_key: String,
    /// When the wait times out and the step runs without a signal, ms since
    /// the UNIX epoch (runtime clock).
    pub timeout_at_ms: Option<u64>,
}

/// One run described, from
/// [`WorkflowView::run`](crate::WorkflowView::run).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunDetails {
    /// The run.
    pub run_id: RunId,
    /// Where it is (for a terminated run, the termination with its status,
    /// error and final step).
    pub state: RunState,
    /// The workflow (or job) name, when known.
    pub workflow: Option<String>,
    /// The group the run is a member of.
    pub group: Option<RunId>,
    /// Its member key in that group (known while the run is active).
    pub group_key: Option<String>,
    /// The current step (the final step of a terminated run).
    pub current_step: u32,
    /// That step's name, when known.
    pub step_name: Option<String>,
    /// The queue job of the current step (an active run's; for a terminated
    /// run, the job of its final step when recorded).
    pub job_id: Option<String>,
    /// Attempts the current step consumed.
    pub attempts: u32,
    /// The current step's attempt limit (0 when unknown: a terminated run).
    pub max_attempts: u32,
    /// When a pending step becomes claimable (a timer, a retry backoff, a
    /// signal wait's timeout), ms since the UNIX epoch; `None` when it is
    /// claimable now, running, or the run terminated.
    pub scheduled_at_ms: Option<u64>,
    /// The signal the current step waits for.
    pub waiting_for_signal: Option<SignalWait>,
    /// The current step job's last error (a retried attempt's), or the
    /// termination's error.
    pub last_error: Option<String>,
    /// The submitter's headers (without the reserved `workflow.` ones); for
    /// a terminated run, from its recorded outcome (empty when none).
    pub headers: HashMap<String, String>,
    /// When the run was submitted, ms since the UNIX epoch (queue clock).
    pub submitted_at_ms: Option<u64>,
    /// When it terminated, ms since the UNIX epoch.
    pub ended_at_ms: Option<u64>,
    /// Whether a cancellation was requested from outside (for a terminated
    /// run: it was cancelled from outside).
    pub cancel_requested: bool,
    /// The reason given to that cancellation, if any.
    pub cancel_reason: Option<String>,
    /// The run and step this run was forked from
    /// ([`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork),
    /// [`restart`](crate::WorkflowRuntime::restart): step 0); `None` for a
    /// run submitted otherwise.
    pub forked_from: Option<crate::ForkedFrom>,
    /// The version of the code that submitted the run
    /// ([`versioning`](crate::versioning)); `None` when that code said
    /// none, or the run was recorded before versions were kept. Each
    /// step's is in its history ([`StepHistory::version`](crate::history::StepHistory::version)).
    pub version: Option<String>,
    /// The patches the run started with, sorted: those
    /// [`Delivery::patched`](crate::Delivery::patched) answers `true` for
    /// (empty for a run recorded before patches were kept).
    pub patches: Vec<String>,
    /// The run whose step started this run as its child
    /// ([`children`](crate::children)); `None` for a run submitted
    /// otherwise.
    pub parent: Option<RunId>,
    /// The child runs this run's steps started, in id order (at most
    /// 1000), active and ended alike.
    pub children: Vec<RunId>,
    /// The run's concurrency key
    /// ([`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key)),
    /// its limit, and whether the run waits for a slot; `None` for a run
    /// without a key.
    pub concurrency: Option<crate::view::RunConcurrency>,
}

/// One page of a group listing, from
/// [`WorkflowView::groups`](crate::WorkflowView::groups).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupPage {
    /// The groups in group-id order, with their member counts.
    pub groups: Vec<GroupStatus>,
    /// The cursor of the next page; `None` when this page is the last.
    pub next: Option<RunId>,
}

/// A runtime recorded in a store, from
/// [`WorkflowView::runtimes`](crate::WorkflowView::runtimes): what a tool
/// needs to open a [`WorkflowView`](crate::WorkflowView) of it with no
/// other configuration. Each runtime's worker records its own when it
/// starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RuntimeInfo {
    /// The runtime's queue name
    /// ([`WorkflowRuntimeBuilder::queue_name`](crate::WorkflowRuntimeBuilder::queue_name)).
    pub queue_name: String,
    /// Its memo prefix in the object store (build the view's
    /// [`MemoStore`](crate::MemoStore) and an [`Inbox`](crate::inbox::Inbox) at it).
    pub memo_prefix: String,
    /// The version of the runtime's store layout (currently 1).
    pub format: u32,
    /// The `taquba-workflow` version of the worker that recorded it.
    pub crate_version: String,
    /// When that worker started, ms since the UNIX epoch (runtime clock).
    pub started_at_ms: u64,
    /// The lease that worker claims its steps with, ms; `None` when it
    /// recorded none (a runtime before the worker record). A step claimed
    /// less than a lease ago may be running in it.
    pub claim_lease_ms: Option<u64>,
    /// When that worker stopped cleanly (its loop drained and returned),
    /// ms since the UNIX epoch (runtime clock); `None` while it runs, after
    /// it crashed or was dropped, and for a runtime that records no stop.
    pub stopped_at_ms: Option<u64>,
}
