//! A run as presented: listed ([`SummaryJson`]), described
//! ([`DescribeJson`], with its [`TerminationJson`] and committed
//! [`OutcomeJson`]), its result ([`ResultJson`]), and the small texts both
//! the command line and the dashboard show of it.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use taquba_workflow::{RunOutcome, RunState, RunTermination, view::RunDetails, view::RunSummary};

use crate::output::Times;
use crate::payload::Decoded;
use crate::present::state::{ErrorKindJson, RunStateJson, TerminalStatusJson};

/// A step as text: `3 (count)`, or `3` without a name.
pub fn step_text(step: u32, name: Option<&str>) -> String {
    match name {
        Some(name) => format!("{step} ({name})"),
        None => step.to_string(),
    }
}

/// Headers sorted by name (for stable output).
pub fn sorted(headers: &HashMap<String, String>) -> BTreeMap<String, String> {
    headers
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// A listed run, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryJson {
    /// The run.
    pub run_id: String,
    /// Its state.
    pub state: RunStateJson,
    /// The workflow (or job) name.
    pub workflow: Option<String>,
    /// The group it is a member of.
    pub group: Option<String>,
    /// The current (or final) step.
    pub current_step: u32,
    /// That step's name.
    pub step_name: Option<String>,
    /// Attempts of that step.
    pub attempts: u32,
    /// When it was submitted (ms since the Unix epoch).
    pub submitted_at_ms: Option<u64>,
    /// When it ended (ms since the Unix epoch).
    pub ended_at_ms: Option<u64>,
    /// The termination's error.
    pub error: Option<String>,
    /// The cluster shard holding the run (listings of a cluster root only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
    /// The version of the code that submitted the run.
    pub version: Option<String>,
    /// The patches the run started with.
    pub patches: Vec<String>,
}

impl SummaryJson {
    /// `run` as listed from shard `shard` of a cluster (`None`: a single
    /// store).
    pub fn in_shard(run: &RunSummary, shard: Option<u32>) -> Self {
        Self {
            shard,
            ..Self::from(run)
        }
    }
}

impl From<&RunSummary> for SummaryJson {
    fn from(run: &RunSummary) -> Self {
        let error = match &run.state {
            RunState::Terminated(t) => t.error.clone(),
            _ => None,
        };
        Self {
            run_id: run.run_id.to_string(),
            state: RunStateJson::from(&run.state),
            workflow: run.workflow.clone(),
            group: run.group.as_ref().map(ToString::to_string),
            current_step: run.current_step,
            step_name: run.step_name.clone(),
            attempts: run.attempts,
            submitted_at_ms: run.submitted_at_ms,
            ended_at_ms: run.ended_at_ms,
            error,
            shard: None,
            version: run.version.clone(),
            patches: run.patches.clone(),
        }
    }
}

/// How a run terminated, as printed.
#[derive(Debug, Serialize)]
pub struct TerminationJson {
    /// How it ended.
    pub status: TerminalStatusJson,
    /// The error or cancel reason.
    pub error: Option<String>,
    /// The kind of a failure from a step error.
    pub error_kind: Option<ErrorKindJson>,
    /// The final step.
    pub final_step: u32,
    /// When the termination committed (ms since the Unix epoch).
    pub terminated_at_ms: u64,
}

impl From<&RunTermination> for TerminationJson {
    fn from(t: &RunTermination) -> Self {
        Self {
            status: t.status.into(),
            error: t.error.clone(),
            error_kind: t.error_kind.map(ErrorKindJson::from),
            final_step: t.final_step,
            terminated_at_ms: t.terminated_at_ms,
        }
    }
}

/// A committed outcome, as printed.
#[derive(Debug, Serialize)]
pub struct OutcomeJson {
    /// How the run ended.
    pub status: TerminalStatusJson,
    /// The result, decoded.
    pub result: Option<Decoded>,
    /// The error or cancel reason.
    pub error: Option<String>,
    /// The submitter's headers.
    pub headers: BTreeMap<String, String>,
    /// The final step.
    pub final_step: u32,
}

impl From<&RunOutcome> for OutcomeJson {
    fn from(o: &RunOutcome) -> Self {
        Self {
            status: o.status.into(),
            result: o.result.as_deref().map(Decoded::of),
            error: o.error.clone(),
            headers: sorted(&o.headers),
            final_step: o.final_step,
        }
    }
}

/// The signal a step waits for, as printed.
#[derive(Debug, Serialize)]
pub struct SignalWaitJson {
    /// The correlation key.
    pub correlation_key: String,
    /// When the wait times out (ms since the Unix epoch).
    pub timeout_at_ms: Option<u64>,
}

/// The run and step a run was forked from, as printed.
#[derive(Debug, Serialize)]
pub struct ForkedFromJson {
    /// The original run.
    pub run_id: String,
    /// The step of it the fork started from.
    pub step: u32,
}

impl ForkedFromJson {
    /// `run X, step N` (`run X (restarted)` for step 0).
    pub fn text(&self) -> String {
        match self.step {
            0 => format!("run {} (restarted from step 0)", self.run_id),
            n => format!("run {}, step {n}", self.run_id),
        }
    }
}

/// A described run (`runs describe`, the dashboard's run page), as
/// printed.
#[derive(Debug, Serialize)]
pub struct DescribeJson {
    /// The run.
    pub run_id: String,
    /// Its state.
    pub state: RunStateJson,
    /// The workflow (or job) name.
    pub workflow: Option<String>,
    /// The group it is a member of.
    pub group: Option<String>,
    /// Its member key there.
    pub group_key: Option<String>,
    /// The current (or final) step.
    pub current_step: u32,
    /// That step's name.
    pub step_name: Option<String>,
    /// That step's queue job.
    pub job_id: Option<String>,
    /// Attempts of that step.
    pub attempts: u32,
    /// Its attempt limit (0 when unknown).
    pub max_attempts: u32,
    /// When the step becomes claimable (ms since the Unix epoch).
    pub scheduled_at_ms: Option<u64>,
    /// The signal it waits for.
    pub waiting_for_signal: Option<SignalWaitJson>,
    /// The last error.
    pub last_error: Option<String>,
    /// The submitter's headers.
    pub headers: BTreeMap<String, String>,
    /// When it was submitted (ms since the Unix epoch).
    pub submitted_at_ms: Option<u64>,
    /// When it ended (ms since the Unix epoch).
    pub ended_at_ms: Option<u64>,
    /// Whether a cancellation was requested.
    pub cancel_requested: bool,
    /// Its reason.
    pub cancel_reason: Option<String>,
    /// The run and step it was forked from (`runs fork`; step 0 for
    /// `runs restart`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFromJson>,
    /// The run whose step started this run as its child.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The child runs this run's steps started, in id order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    /// Its concurrency key, limit and whether it waits for a slot (absent
    /// for a run without a key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyJson>,
    /// How it terminated.
    pub termination: Option<TerminationJson>,
    /// Its committed outcome.
    pub outcome: Option<OutcomeJson>,
    /// The version of the code that submitted the run.
    pub version: Option<String>,
    /// The patches the run started with (`patched` answers `true` for
    /// these, `false` for any other).
    pub patches: Vec<String>,
}

impl DescribeJson {
    /// `run` as printed, with its committed `outcome` (a terminated run's).
    pub fn new(run: &RunDetails, outcome: Option<OutcomeJson>) -> Self {
        let termination = match &run.state {
            RunState::Terminated(t) => Some(TerminationJson::from(t)),
            _ => None,
        };
        Self {
            run_id: run.run_id.to_string(),
            state: RunStateJson::from(&run.state),
            workflow: run.workflow.clone(),
            group: run.group.as_ref().map(ToString::to_string),
            group_key: run.group_key.clone(),
            current_step: run.current_step,
            step_name: run.step_name.clone(),
            job_id: run.job_id.clone(),
            attempts: run.attempts,
            max_attempts: run.max_attempts,
            scheduled_at_ms: run.scheduled_at_ms,
            waiting_for_signal: run.waiting_for_signal.as_ref().map(|w| SignalWaitJson {
                correlation_key: w.correlation_key.clone(),
                timeout_at_ms: w.timeout_at_ms,
            }),
            last_error: run.last_error.clone(),
            headers: sorted(&run.headers),
            submitted_at_ms: run.submitted_at_ms,
            ended_at_ms: run.ended_at_ms,
            cancel_requested: run.cancel_requested,
            cancel_reason: run.cancel_reason.clone(),
            forked_from: run.forked_from.as_ref().map(|link| ForkedFromJson {
                run_id: link.run_id.to_string(),
                step: link.step,
            }),
            parent: run.parent.as_ref().map(ToString::to_string),
            children: run.children.iter().map(ToString::to_string).collect(),
            concurrency: run.concurrency.as_ref().map(|c| ConcurrencyJson {
                key: c.key.clone(),
                limit: c.limit,
                waiting: c.waiting,
            }),
            termination,
            outcome,
            version: run.version.clone(),
            patches: run.patches.clone(),
        }
    }

    /// What an operator most likely wants to know next about the run.
    pub fn note(&self, times: &Times) -> Option<String> {
        if self.termination.is_some() {
            return None;
        }
        if self.attempts > 0 && self.last_error.is_some() {
            return Some(match self.scheduled_at_ms {
                Some(at) => format!(
                    "Attempt {} failed; the next attempt is {}.",
                    self.attempts,
                    times.at(at)
                ),
                None => format!("Attempt {} failed; the step is retried.", self.attempts),
            });
        }
        match self.state {
            RunStateJson::Running => Some(
                "A worker holds the step (a claim says nothing of the worker being alive).".into(),
            ),
            _ => None,
        }
    }
}

/// `runs result`, as printed.
#[derive(Debug, Serialize)]
pub struct ResultJson {
    /// The run.
    pub run_id: String,
    /// How it terminated.
    pub termination: TerminationJson,
    /// Its committed outcome (`None` for a run terminated without a worker:
    /// a cancelled waiting step, a dead letter outside the worker).
    pub outcome: Option<OutcomeJson>,
}

/// A run's concurrency key, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct ConcurrencyJson {
    /// The key.
    pub key: String,
    /// The run's limit for it.
    pub limit: u32,
    /// Whether the run waits for a slot.
    pub waiting: bool,
}

impl ConcurrencyJson {
    /// `customer:acme (limit 1, waiting for a slot)`.
    pub fn text(&self) -> String {
        let state = if self.waiting {
            ", waiting for a slot"
        } else {
            ""
        };
        format!("{} (limit {}{state})", self.key, self.limit)
    }
}
