//! The printed shapes shared by several commands: a run's state as a word,
//! its termination, its committed outcome. JSON output is built from these
//! (times as `*_ms`, ms since the Unix epoch, as the store keeps them).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use taquba_workflow::{RunOutcome, RunState, RunTermination, StepErrorKind};

use crate::payload::Decoded;

/// A run's state as a word: `pending`, `running`, `cancelling`,
/// `succeeded`, `failed`, `cancelled`.
pub fn state_word(state: &RunState) -> &'static str {
    match state {
        RunState::Pending => "pending",
        RunState::Running => "running",
        RunState::Cancelling => "cancelling",
        RunState::Terminated(termination) => termination.status.as_str(),
    }
}

/// An error kind as a word.
pub fn kind_word(kind: StepErrorKind) -> &'static str {
    match kind {
        StepErrorKind::Transient => "transient",
        StepErrorKind::Permanent => "permanent",
    }
}

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

/// How a run terminated, as printed.
#[derive(Debug, Serialize)]
pub struct TerminationJson {
    /// `succeeded`, `failed` or `cancelled`.
    pub status: &'static str,
    /// The error or cancel reason.
    pub error: Option<String>,
    /// `transient` or `permanent` for a failure from a step error.
    pub error_kind: Option<&'static str>,
    /// The final step.
    pub final_step: u32,
    /// When the termination committed (ms since the Unix epoch).
    pub terminated_at_ms: u64,
}

impl From<&RunTermination> for TerminationJson {
    fn from(t: &RunTermination) -> Self {
        Self {
            status: t.status.as_str(),
            error: t.error.clone(),
            error_kind: t.error_kind.map(kind_word),
            final_step: t.final_step,
            terminated_at_ms: t.terminated_at_ms,
        }
    }
}

/// A committed outcome, as printed.
#[derive(Debug, Serialize)]
pub struct OutcomeJson {
    /// `succeeded`, `failed` or `cancelled`.
    pub status: &'static str,
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
            status: o.status.as_str(),
            result: o.result.as_deref().map(Decoded::of),
            error: o.error.clone(),
            headers: sorted(&o.headers),
            final_step: o.final_step,
        }
    }
}
