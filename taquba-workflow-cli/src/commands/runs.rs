//! The read commands of `runs`: `list` (a table), `describe` (a card),
//! `steps` (the history) and `result [--wait]`, over the
//! [`WorkflowView`] of a reader.

use std::time::{Duration, Instant};

use taquba_workflow::{
    RunId, RunState, TerminalStatus, WorkflowView, view::RunFilter,
    view::StatusFilter as ViewStatus,
};

use crate::cli::{ListArgs, StatusFilter};
use crate::cluster::Reads;
use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Table, Times, short_duration};
use crate::present::run::{
    DescribeJson, OutcomeJson, ResultJson, SummaryJson, TerminationJson, step_text,
};
use crate::present::state::RunStateJson;
use crate::present::step::{AttemptJson, HistoryJson};
use crate::session::READER_POLL_INTERVAL;

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
    if let Some(version) = &args.version {
        filter = filter.version(version.clone());
    }
    if let Some(patch) = &args.lacks_patch {
        filter = filter.lacks_patch(patch.clone());
    }
    filter
}

/// `runs list`.
///
/// # Errors
/// Storage errors.
pub async fn list(reads: Reads<'_>, args: &ListArgs, out: &Output) -> CliResult<()> {
    let page = reads.runs(&filter(args, out.times().now_ms())).await?;
    let rows: Vec<SummaryJson> = page
        .runs
        .iter()
        .map(|run| SummaryJson::in_shard(run, reads.shard_of(run)))
        .collect();
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

/// The table of listed runs (with a `shard` column when the rows are a
/// cluster's).
pub fn summary_table(rows: &[SummaryJson], times: &Times) -> Table {
    let sharded = rows.iter().any(|run| run.shard.is_some());
    let mut header = vec![
        "status",
        "run id",
        "workflow",
        "step",
        "attempts",
        "submitted",
        "ended",
    ];
    // The version each run started on, when any run records one.
    let versioned = rows.iter().any(|run| run.version.is_some());
    if versioned {
        header.insert(5, "version");
    }
    if sharded {
        header.push("shard");
    }
    let mut table = Table::new(&header);
    for run in rows {
        let mut row = vec![
            run.state.to_string(),
            run.run_id.clone(),
            run.workflow.clone().unwrap_or_else(|| "-".to_string()),
            step_text(run.current_step, run.step_name.as_deref()),
            run.attempts.to_string(),
            times.maybe_at(run.submitted_at_ms),
            times.maybe_at(run.ended_at_ms),
        ];
        if versioned {
            row.insert(5, run.version.clone().unwrap_or_else(|| "-".to_string()));
        }
        if sharded {
            row.push(run.shard.map_or_else(|| "-".to_string(), |k| k.to_string()));
        }
        table.row(row);
    }
    table
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
    card.field("State", json.state.as_str());
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
            card.field_opt("Error kind", t.error_kind.map(|kind| kind.as_str()));
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
    if let Some(link) = &json.forked_from {
        card.field("Forked from", link.text());
    }
    card.field_opt("Parent", json.parent.as_deref());
    if !json.children.is_empty() {
        card.field("Children", json.children.join(", "));
    }
    if let Some(concurrency) = &json.concurrency {
        card.field("Concurrency key", concurrency.text());
    }
    if let Some(group) = &json.group {
        let key = json
            .group_key
            .as_deref()
            .map(|k| format!(" (member {k:?})"))
            .unwrap_or_default();
        card.field("Group", format!("{group}{key}"));
    }
    card.field_opt("Version", json.version.as_deref());
    if !json.patches.is_empty() {
        card.field("Patches", json.patches.join(", "));
    }
    card.field("Submitted", times.maybe_at(json.submitted_at_ms));
    if json.termination.is_some() {
        card.field("Ended", times.maybe_at(json.ended_at_ms));
    }
    card.field_opt("Job", json.job_id.as_deref());
    if let Some(result) = json.outcome.as_ref().and_then(|o| o.result.as_ref()) {
        card.field("Result", result.text());
    }
    if let Some(note) = json.note(times) {
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
    let json = HistoryJson::from(&history);
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
    // The version that settled each step, when any step records one.
    let versioned = attempts.iter().any(|a| a.version.is_some());
    let mut header = vec!["step", "name", "attempt", "claimed", "took", "outcome"];
    if versioned {
        header.insert(2, "version");
    }
    let mut table = Table::new(&header);
    for a in attempts {
        let took = a
            .claimed_at_ms
            .map(|claimed| short_duration(a.settled_at_ms.saturating_sub(claimed)))
            .unwrap_or_else(|| "-".to_string());
        let mut row = vec![
            a.step.to_string(),
            a.name.clone(),
            a.attempt.to_string(),
            times.maybe_at(a.claimed_at_ms.or(Some(a.settled_at_ms))),
            took,
            a.outcome_text(),
        ];
        if versioned {
            row.insert(2, a.version.clone().unwrap_or_else(|| "-".to_string()));
        }
        table.row(row);
    }
    table
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
                    RunStateJson::from(&state),
                    status.current_step
                )));
            }
            state => {
                if let Some(timeout) = timeout
                    && started.elapsed() >= timeout
                {
                    return Err(CliError::Timeout(format!(
                        "run {id} is still {} at step {} after {}",
                        RunStateJson::from(&state),
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
        .field("Status", t.status.as_str())
        .field("Final step", t.final_step.to_string())
        .field("Ended", times.at(t.terminated_at_ms));
    card.field_opt("Error", t.error.as_deref());
    if let Some(result) = json.outcome.as_ref().and_then(|o| o.result.as_ref()) {
        card.field("Result", result.text());
    }
    card
}
