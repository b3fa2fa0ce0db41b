//! The read commands of `runs`: `list` (a table), `describe` (a card),
//! `steps` (the history) and `result [--wait]`, over the
//! [`WorkflowView`] of a reader.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use taquba_workflow::{
    AttemptOutcome, RunDetails, RunFilter, RunHistory, RunId, RunState, RunSummary,
    StatusFilter as ViewStatus, TerminalStatus, WorkflowView,
};

use crate::cli::{ListArgs, StatusFilter};
use crate::commands::json::{
    OutcomeJson, TerminationJson, kind_word, sorted, state_word, step_text,
};
use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Table, Times, short_duration};
use crate::session::READER_POLL_INTERVAL;

/// A listed run, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryJson {
    /// The run.
    pub run_id: String,
    /// Its state word.
    pub state: &'static str,
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
}

impl From<&RunSummary> for SummaryJson {
    fn from(run: &RunSummary) -> Self {
        let error = match &run.state {
            RunState::Terminated(t) => t.error.clone(),
            _ => None,
        };
        Self {
            run_id: run.run_id.to_string(),
            state: state_word(&run.state),
            workflow: run.workflow.clone(),
            group: run.group.as_ref().map(ToString::to_string),
            current_step: run.current_step,
            step_name: run.step_name.clone(),
            attempts: run.attempts,
            submitted_at_ms: run.submitted_at_ms,
            ended_at_ms: run.ended_at_ms,
            error,
        }
    }
}

/// The filter of `runs list` (and of `groups describe`'s members).
pub fn filter(args: &ListArgs, now_ms: u64) -> RunFilter {
    let mut filter = RunFilter::new()
        .status(match args.status {
            StatusFilter::Active => ViewStatus::Active,
            StatusFilter::Terminated => ViewStatus::Terminated,
            StatusFilter::All => ViewStatus::All,
        })
        .limit(args.limit);
    if let Some(workflow) = &args.workflow {
        filter = filter.workflow(workflow.clone());
    }
    if let Some(group) = &args.group {
        filter = filter.group(group.clone());
    }
    if let Some(since) = args.since {
        let since_ms = u64::try_from(since.as_millis()).unwrap_or(u64::MAX);
        filter = filter.submitted_since_ms(now_ms.saturating_sub(since_ms));
    }
    if let Some(after) = &args.after {
        filter = filter.after(after.clone());
    }
    filter
}

/// `runs list`.
///
/// # Errors
/// Storage errors.
pub async fn list(view: &WorkflowView, args: &ListArgs, out: &Output) -> CliResult<()> {
    let page = view.runs(&filter(args, out.times().now_ms())).await?;
    let rows: Vec<SummaryJson> = page.runs.iter().map(SummaryJson::from).collect();
    let which = match args.status {
        StatusFilter::Active => "active runs",
        StatusFilter::Terminated => "terminated runs",
        StatusFilter::All => "runs",
    };
    let footer = match (&page.next, rows.len()) {
        (_, 0) => match args.status {
            StatusFilter::Active => {
                "No active runs. (`--status all` lists terminated runs too.)".to_string()
            }
            _ => format!("No {which}."),
        },
        (None, 1) => format!("Showing 1 {}.", which.trim_end_matches('s')),
        (None, n) => format!("Showing {n} {which}."),
        (Some(next), n) => {
            format!("Showing the first {n} {which}; more after {next} (`--after {next}`).")
        }
    };
    out.list(&rows, |times| summary_table(&rows, times), Some(footer))
}

/// The table of listed runs.
pub fn summary_table(rows: &[SummaryJson], times: &Times) -> Table {
    let mut table = Table::new(&[
        "status",
        "run id",
        "workflow",
        "step",
        "attempts",
        "submitted",
        "ended",
    ]);
    for run in rows {
        table.row(vec![
            run.state.to_string(),
            run.run_id.clone(),
            run.workflow.clone().unwrap_or_else(|| "-".to_string()),
            step_text(run.current_step, run.step_name.as_deref()),
            run.attempts.to_string(),
            times.maybe_at(run.submitted_at_ms),
            times.maybe_at(run.ended_at_ms),
        ]);
    }
    table
}

/// The signal a step waits for, as printed.
#[derive(Debug, Serialize)]
pub struct SignalWaitJson {
    /// The correlation key.
    pub correlation_key: String,
    /// When the wait times out (ms since the Unix epoch).
    pub timeout_at_ms: Option<u64>,
}

/// `runs describe`, as printed.
#[derive(Debug, Serialize)]
pub struct DescribeJson {
    /// The run.
    pub run_id: String,
    /// Its state word.
    pub state: &'static str,
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
    /// How it terminated.
    pub termination: Option<TerminationJson>,
    /// Its committed outcome.
    pub outcome: Option<OutcomeJson>,
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
            state: state_word(&run.state),
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
            termination,
            outcome,
        }
    }
}

/// `runs describe ID`.
///
/// # Errors
/// [`CliError::RunNotFound`]; storage errors.
pub async fn describe(view: &WorkflowView, id: &RunId, out: &Output) -> CliResult<()> {
    let run = view
        .run(id)
        .await?
        .ok_or_else(|| CliError::RunNotFound(id.clone()))?;
    let outcome = match run.state {
        RunState::Terminated(_) => view.outcome(id).await?,
        _ => None,
    };
    let json = DescribeJson::new(&run, outcome.as_ref().map(OutcomeJson::from));
    out.one(&json, |times| describe_card(&json, times))
}

fn describe_card(json: &DescribeJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Run", &json.run_id);
    card.field_opt("Workflow", json.workflow.as_deref());
    card.field("State", json.state);
    let step = step_text(json.current_step, json.step_name.as_deref());
    match &json.termination {
        None => {
            card.field("Current step", step);
            let attempts = if json.max_attempts > 0 {
                format!("{}/{}", json.attempts, json.max_attempts)
            } else {
                json.attempts.to_string()
            };
            card.field("Attempts", attempts);
            if let Some(at) = json.scheduled_at_ms
                && json.waiting_for_signal.is_none()
            {
                card.field("Scheduled", times.at(at));
            }
            if let Some(wait) = &json.waiting_for_signal {
                let until = wait
                    .timeout_at_ms
                    .map(|at| format!(" (times out {})", times.at(at)))
                    .unwrap_or_default();
                card.field(
                    "Waiting for",
                    format!("signal {:?}{until}", wait.correlation_key),
                );
            }
        }
        Some(t) => {
            card.field("Final step", step);
            card.field_opt("Error kind", t.error_kind);
        }
    }
    card.field_opt("Last error", json.last_error.as_deref());
    if json.cancel_requested {
        card.field(
            "Cancel requested",
            json.cancel_reason
                .as_deref()
                .map_or_else(|| "yes".to_string(), |r| format!("yes: {r}")),
        );
    }
    if let Some(group) = &json.group {
        let key = json
            .group_key
            .as_deref()
            .map(|k| format!(" (member {k:?})"))
            .unwrap_or_default();
        card.field("Group", format!("{group}{key}"));
    }
    card.field("Submitted", times.maybe_at(json.submitted_at_ms));
    if json.termination.is_some() {
        card.field("Ended", times.maybe_at(json.ended_at_ms));
    }
    card.field_opt("Job", json.job_id.as_deref());
    if let Some(result) = json.outcome.as_ref().and_then(|o| o.result.as_ref()) {
        card.field("Result", result.text());
    }
    if let Some(note) = note(json, times) {
        card.field("Note", note);
    }
    if !json.headers.is_empty() {
        card.section(
            "Headers",
            json.headers
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect(),
        );
    }
    card
}

/// What an operator most likely wants to know next about the run.
pub fn note(json: &DescribeJson, times: &Times) -> Option<String> {
    if json.termination.is_some() {
        return None;
    }
    if json.attempts > 0 && json.last_error.is_some() {
        return Some(match json.scheduled_at_ms {
            Some(at) => format!(
                "Attempt {} failed; the next attempt is {}.",
                json.attempts,
                times.at(at)
            ),
            None => format!("Attempt {} failed; the step is retried.", json.attempts),
        });
    }
    if json.state == "running" {
        return Some(
            "A worker holds the step (a claim says nothing of the worker being alive).".into(),
        );
    }
    None
}

/// One line of `runs steps`, as printed.
#[derive(Debug, Serialize)]
pub struct AttemptJson {
    /// The step number.
    pub step: u32,
    /// The step name.
    pub name: String,
    /// The attempt (1-based; 0 for a step ended from outside before it was
    /// delivered).
    pub attempt: u32,
    /// When it was claimed (ms since the Unix epoch).
    pub claimed_at_ms: Option<u64>,
    /// When its settlement committed (ms since the Unix epoch).
    pub settled_at_ms: u64,
    /// What happened: `continued`, `retried`, `succeeded`, `failed`,
    /// `cancelled`, `dead_lettered`, `requeued`.
    pub outcome: &'static str,
    /// The timer of a `continued` step (ms).
    pub delay_ms: Option<u64>,
    /// The signal a `continued` step waits for.
    pub signal: Option<String>,
    /// Its timeout (ms).
    pub signal_timeout_ms: Option<u64>,
    /// The error kind of a `failed` attempt.
    pub error_kind: Option<&'static str>,
    /// The error or reason.
    pub error: Option<String>,
}

/// One settled `attempt` of step `step` (named `name`), as printed.
pub fn attempt_json(step: u32, name: &str, attempt: &taquba_workflow::StepAttempt) -> AttemptJson {
    let mut json = AttemptJson {
        step,
        name: name.to_string(),
        attempt: attempt.attempt,
        claimed_at_ms: attempt.claimed_at_ms,
        settled_at_ms: attempt.settled_at_ms,
        outcome: "unknown",
        delay_ms: None,
        signal: None,
        signal_timeout_ms: None,
        error_kind: None,
        error: None,
    };
    match &attempt.outcome {
        AttemptOutcome::Continued { delay_ms, signal } => {
            json.outcome = "continued";
            json.delay_ms = *delay_ms;
            if let Some(signal) = signal {
                json.signal = Some(signal.correlation_key.clone());
                json.signal_timeout_ms = Some(signal.timeout_ms);
            }
        }
        AttemptOutcome::Retried { error } => {
            json.outcome = "retried";
            json.error = Some(error.clone());
        }
        AttemptOutcome::Succeeded => json.outcome = "succeeded",
        AttemptOutcome::Failed { kind, error } => {
            json.outcome = "failed";
            json.error_kind = Some(kind_word(*kind));
            json.error = Some(error.clone());
        }
        AttemptOutcome::Cancelled { reason } => {
            json.outcome = "cancelled";
            json.error = reason.clone();
        }
        AttemptOutcome::DeadLettered { error } => {
            json.outcome = "dead_lettered";
            json.error = Some(error.clone());
        }
        AttemptOutcome::Requeued => json.outcome = "requeued",
        // An outcome a later runtime version records.
        _ => {}
    }
    json
}

/// What happened, as the `runs steps` table says it: the outcome and its
/// error.
pub fn outcome_text(a: &AttemptJson) -> String {
    let word = outcome_word(a);
    match &a.error {
        Some(error) => format!("{word}: {error}"),
        None => word,
    }
}

/// What happened, without the error: `continued after 1h`, `failed
/// (permanent)`, `dead-lettered`.
pub fn outcome_word(a: &AttemptJson) -> String {
    match a.outcome {
        "continued" => match (&a.signal, a.delay_ms) {
            (Some(key), _) => format!(
                "continued on signal {key:?} (timeout {})",
                short_duration(a.signal_timeout_ms.unwrap_or(0))
            ),
            (None, Some(delay)) => format!("continued after {}", short_duration(delay)),
            (None, None) => "continued".to_string(),
        },
        "failed" => match a.error_kind {
            Some(kind) => format!("failed ({kind})"),
            None => "failed".to_string(),
        },
        "dead_lettered" => "dead-lettered".to_string(),
        other => other.to_string(),
    }
}

/// `runs steps`, as printed in JSON: the attempts and the counters.
#[derive(Debug, Serialize)]
pub struct HistoryJson {
    /// The run.
    pub run_id: String,
    /// Steps taken so far.
    pub steps_taken: u32,
    /// Steps before the first retained one.
    pub steps_dropped: u32,
    /// Every retained attempt, in step then attempt order.
    pub attempts: Vec<AttemptJson>,
}

/// The history of a run, as printed.
pub fn history_json(history: &RunHistory) -> HistoryJson {
    let mut attempts = Vec::new();
    for step in &history.steps {
        for attempt in &step.attempts {
            attempts.push(attempt_json(step.step, &step.name, attempt));
        }
    }
    HistoryJson {
        run_id: history.run_id.to_string(),
        steps_taken: history.steps_taken,
        steps_dropped: history.steps_dropped,
        attempts,
    }
}

/// `runs steps ID`: one table row per settled attempt (JSON: the history
/// with its counters; JSON lines: one object per attempt).
///
/// # Errors
/// [`CliError::RunNotFound`]; storage errors.
pub async fn steps(view: &WorkflowView, id: &RunId, out: &Output) -> CliResult<()> {
    let history = view
        .steps(id)
        .await?
        .ok_or_else(|| CliError::RunNotFound(id.clone()))?;
    let json = history_json(&history);
    let dropped = history
        .steps
        .iter()
        .map(|s| s.attempts_dropped)
        .sum::<u32>();
    let mut notes = Vec::new();
    if json.steps_dropped > 0 {
        notes.push(format!(
            "{} earlier steps have no history (the runtime keeps the last `history_limit` steps; a store written before run history has none).",
            json.steps_dropped
        ));
    }
    if dropped > 0 {
        notes.push(format!(
            "{dropped} earlier attempts of retried steps are not retained."
        ));
    }
    notes.push(format!(
        "{} steps taken, {} attempts shown.",
        json.steps_taken,
        json.attempts.len()
    ));
    let footer = Some(notes.join("\n"));
    match out.format() {
        crate::cli::Format::Json => out.one(&json, |_| Card::new()),
        _ => out.list(
            &json.attempts,
            |times| steps_table(&json.attempts, times),
            footer,
        ),
    }
}

fn steps_table(attempts: &[AttemptJson], times: &Times) -> Table {
    let mut table = Table::new(&["step", "name", "attempt", "claimed", "took", "outcome"]);
    for a in attempts {
        let took = a
            .claimed_at_ms
            .map(|claimed| short_duration(a.settled_at_ms.saturating_sub(claimed)))
            .unwrap_or_else(|| "-".to_string());
        table.row(vec![
            a.step.to_string(),
            a.name.clone(),
            a.attempt.to_string(),
            times.maybe_at(a.claimed_at_ms.or(Some(a.settled_at_ms))),
            took,
            outcome_text(a),
        ]);
    }
    table
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
