//! `runs describe` and `runs result [--wait]`: one run's state and its
//! committed outcome, read through the [`WorkflowView`] of a reader.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use taquba_workflow::{
    RunId, RunOutcome, RunState, RunStatus, RunTermination, StepErrorKind, TerminalStatus,
    WorkflowView,
};

use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Times};
use crate::payload::Decoded;
use crate::session::READER_POLL_INTERVAL;

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

fn kind_word(kind: StepErrorKind) -> &'static str {
    match kind {
        StepErrorKind::Transient => "transient",
        StepErrorKind::Permanent => "permanent",
    }
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
            headers: o.headers.clone().into_iter().collect(),
            final_step: o.final_step,
        }
    }
}

/// `runs describe`, as printed.
#[derive(Debug, Serialize)]
pub struct DescribeJson {
    /// The run.
    pub run_id: String,
    /// Its state word.
    pub state: &'static str,
    /// The current (or final) step.
    pub current_step: u32,
    /// How it terminated.
    pub termination: Option<TerminationJson>,
    /// Its committed outcome.
    pub outcome: Option<OutcomeJson>,
}

/// `runs describe ID`.
///
/// # Errors
/// [`CliError::RunNotFound`]; storage errors.
pub async fn describe(view: &WorkflowView, id: &RunId, out: &Output) -> CliResult<()> {
    let status = view
        .status(id)
        .await?
        .ok_or_else(|| CliError::RunNotFound(id.clone()))?;
    let outcome = view.outcome(id).await?;
    let json = describe_json(&status, outcome.as_ref());
    out.one(&json, |times| describe_card(&json, times))
}

fn describe_json(status: &RunStatus, outcome: Option<&RunOutcome>) -> DescribeJson {
    let termination = match &status.state {
        RunState::Terminated(t) => Some(TerminationJson::from(t)),
        _ => None,
    };
    DescribeJson {
        run_id: status.run_id.to_string(),
        state: state_word(&status.state),
        current_step: status.current_step,
        termination,
        outcome: outcome.map(OutcomeJson::from),
    }
}

fn describe_card(json: &DescribeJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Run", &json.run_id).field("State", json.state);
    match &json.termination {
        None => {
            card.field("Current step", json.current_step.to_string());
        }
        Some(t) => {
            card.field("Final step", t.final_step.to_string());
            card.field("Ended", times.at(t.terminated_at_ms));
            card.field_opt("Error", t.error.as_deref());
            card.field_opt("Error kind", t.error_kind);
        }
    }
    if let Some(outcome) = &json.outcome {
        if let Some(result) = &outcome.result {
            card.field("Result", result.text());
        }
        if !outcome.headers.is_empty() {
            card.section(
                "Headers",
                outcome
                    .headers
                    .iter()
                    .map(|(k, v)| format!("{k} = {v}"))
                    .collect(),
            );
        }
    }
    card
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

/// `runs result ID [--wait [--timeout D]]`: the committed outcome of a
/// terminated run; with `--wait`, polls until it terminates.
///
/// # Errors
/// [`CliError::RunNotFound`]; [`CliError::Refused`] for an active run
/// without `--wait`; [`CliError::Timeout`] when `--timeout` passes;
/// [`CliError::RunDidNotSucceed`] (exit code 1, after printing) when the
/// run failed or was cancelled.
pub async fn result(
    view: &WorkflowView,
    id: &RunId,
    wait: bool,
    timeout: Option<Duration>,
    out: &Output,
) -> CliResult<()> {
    let started = Instant::now();
    let termination = loop {
        let status = view
            .status(id)
            .await?
            .ok_or_else(|| CliError::RunNotFound(id.clone()))?;
        match status.state {
            RunState::Terminated(termination) => break termination,
            state if !wait => {
                return Err(CliError::Refused(format!(
                    "run {id} is {} at step {}: it has no result yet (pass --wait to wait for it)",
                    state_word(&state),
                    status.current_step
                )));
            }
            state => {
                if let Some(timeout) = timeout
                    && started.elapsed() >= timeout
                {
                    return Err(CliError::Timeout(format!(
                        "run {id} is still {} at step {} after {}",
                        state_word(&state),
                        status.current_step,
                        humantime::format_duration(timeout)
                    )));
                }
                tokio::time::sleep(READER_POLL_INTERVAL).await;
            }
        }
    };
    let outcome = view.outcome(id).await?;
    let json = ResultJson {
        run_id: id.to_string(),
        termination: TerminationJson::from(&termination),
        outcome: outcome.as_ref().map(OutcomeJson::from),
    };
    out.one(&json, |times| result_card(&json, times))?;
    match termination.status {
        TerminalStatus::Succeeded => Ok(()),
        other => Err(CliError::RunDidNotSucceed {
            run_id: id.clone(),
            status: other.as_str().to_string(),
        }),
    }
}

fn result_card(json: &ResultJson, times: &Times) -> Card {
    let t = &json.termination;
    let mut card = Card::new();
    card.field("Run", &json.run_id)
        .field("Status", t.status)
        .field("Final step", t.final_step.to_string())
        .field("Ended", times.at(t.terminated_at_ms));
    card.field_opt("Error", t.error.as_deref());
    if let Some(result) = json.outcome.as_ref().and_then(|o| o.result.as_ref()) {
        card.field("Result", result.text());
    }
    card
}
