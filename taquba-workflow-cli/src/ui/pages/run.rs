//! `GET /runs/{id}`: one run. Its status card, the current wait (a timer
//! or retry due at, a signal key and its timeout), the actions that apply
//! to it, its result or error, its input and current step decoded from
//! MessagePack to JSON, its headers, and the step history as a timeline
//! (each attempt with when it started, how long it took, its outcome and
//! error). The page refreshes while the run is active.

use std::sync::Arc;

use axum::extract::{Path, State};
use maud::{Markup, html};
use taquba_workflow::{RunState, WorkflowView};

use crate::commands::mutate::{REQUEUE_EFFECT, existing_run, fork_effect};
use crate::output::{Times, short_duration};
use crate::payload::Decoded;
use crate::present::run::{DescribeJson, OutcomeJson, step_text};
use crate::present::state::RunStateJson;
use crate::present::step::{AttemptJson, HistoryJson};
use crate::ui::app::App;
use crate::ui::error::UiResult;
use crate::ui::layout::{self, Section};
use crate::ui::pages::{run_id, url};

/// What the page shows of a payload: decoded, absent, or unreadable.
enum Payload {
    Decoded(Decoded),
    Absent,
    Unreadable(String),
}

impl Payload {
    fn of(read: Result<Option<Vec<u8>>, impl std::fmt::Display>) -> Self {
        match read {
            Ok(Some(bytes)) => Payload::Decoded(Decoded::of(&bytes)),
            Ok(None) => Payload::Absent,
            Err(e) => Payload::Unreadable(e.to_string()),
        }
    }
}

/// The payload of job `job_id`, the queue keeps it.
async fn job_payload(view: &WorkflowView, job_id: &str) -> Payload {
    Payload::of(
        view.queue()
            .get_job(job_id)
            .await
            .map(|job| job.map(|job| job.payload)),
    )
}

/// `GET /runs/{id}`.
///
/// # Errors
/// 400 for an invalid run id, 404 for a run not in the store, 500 when the
/// store fails.
pub async fn page(State(app): State<Arc<App>>, Path(id): Path<String>) -> UiResult<Markup> {
    let id = run_id(&id)?;
    let place = app.run_place(&id).await?;
    let view = &place.runtime.view;
    let run = existing_run(view, &id).await?;
    let active = !matches!(run.state, RunState::Terminated(_));
    let outcome = match active {
        false => view.outcome(&id).await?,
        true => None,
    };
    let json = DescribeJson::new(&run, outcome.as_ref().map(OutcomeJson::from));
    let history = view.steps(&id).await?.map(|h| HistoryJson::from(&h));
    let input = Payload::of(view.input(&id).await);
    // At step 0 the current job's payload is the input.
    let current = match (&run.job_id, active && run.current_step > 0) {
        (Some(job), true) => Some(job_payload(view, job).await),
        _ => None,
    };
    let times = app.times();
    let here = format!("/runs/{id}");
    let poll = active.then_some(here.as_str());
    let body = layout::live(
        poll,
        html! {
            div.columns {
                section.card {
                    h2 { "Status" }
                    (status_card(&app, &json, &times))
                    @if let Some(shard) = place.shard {
                        p.note #run-shard { "In shard " (shard) " of the cluster (" code { (place.session.target.location) } ")." }
                    }
                }
                section.card {
                    h2 { @if active { "Now" } @else { "Outcome" } }
                    @if active {
                        (wait(&app, &json, &times))
                    } @else {
                        (ending(&json))
                    }
                    (actions(&app, &json))
                }
            }
            section {
                h2 { "Steps" }
                @match &history {
                    Some(history) => (timeline(history, &json, &times)),
                    None => p.empty { "No history recorded." },
                }
            }
            section.columns {
                div {
                    h2 { "Input" }
                    (payload_section(&input, "Not kept: the input is the payload of the run's step-0 job, which the queue deletes when that step settles (unless its QueueConfig::keep_done_jobs keeps done jobs for a while)."))
                }
                @if let Some(current) = &current {
                    div {
                        h2 { "Current step" }
                        (payload_section(current, "The current step's job is not readable."))
                    }
                }
            }
            section {
                h2 { "Headers" }
                @if json.headers.is_empty() {
                    p.empty { "No headers." }
                } @else {
                    table.kv {
                        @for (name, value) in &json.headers {
                            tr { th { (name) } td { (value) } }
                        }
                    }
                }
            }
        },
    );
    let title = format!("Run {id}");
    Ok(layout::page(&app, Section::Runs, &title, body))
}

fn status_card(app: &App, json: &DescribeJson, times: &Times) -> Markup {
    let terminated = json.termination.is_some();
    let attempts = if json.max_attempts > 0 {
        format!("{}/{}", json.attempts, json.max_attempts)
    } else {
        json.attempts.to_string()
    };
    let duration = match (json.submitted_at_ms, json.ended_at_ms) {
        (Some(from), Some(to)) => Some(short_duration(to.saturating_sub(from))),
        (Some(from), None) => Some(format!(
            "{} so far",
            short_duration(times.now_ms().saturating_sub(from))
        )),
        _ => None,
    };
    html! {
        dl.card {
            dt { "State" } dd #run-state { (layout::badge(json.state.as_str())) }
            @if let Some(workflow) = &json.workflow {
                dt { "Workflow" } dd { a href=(url("/runs", &[("workflow", workflow)])) { (workflow) } }
            }
            dt { @if terminated { "Final step" } @else { "Current step" } }
            dd { (step_text(json.current_step, json.step_name.as_deref())) }
            dt { "Attempts" } dd { (attempts) }
            @if let Some(version) = &json.version {
                dt { "Version" } dd #run-version { (version) }
            }
            @if !json.patches.is_empty() {
                dt { "Patches" }
                dd #run-patches { @for (i, patch) in json.patches.iter().enumerate() { @if i > 0 { ", " } code { (patch) } } }
            }
            dt { "Submitted" } dd { (layout::maybe_time(times, json.submitted_at_ms)) }
            @if terminated {
                dt { "Ended" } dd { (layout::maybe_time(times, json.ended_at_ms)) }
            }
            @if let Some(duration) = duration {
                dt { "Took" } dd { (duration) }
            }
            @if let Some(group) = &json.group {
                dt { "Group" }
                dd {
                    a href={ "/groups/" (group) } { (group) }
                    @if let Some(key) = &json.group_key { " (member " code { (key) } ")" }
                }
            }
            @if let Some(link) = &json.forked_from {
                dt { "Forked from" }
                dd #forked-from {
                    a href={ "/runs/" (link.run_id) } { (link.run_id) }
                    @if link.step == 0 { " (restarted from step 0)" } @else { ", step " (link.step) }
                }
            }
            @if let Some(parent) = &json.parent {
                dt { "Parent" }
                dd #run-parent { a href={ "/runs/" (parent) } { (parent) } }
            }
            @if !json.children.is_empty() {
                dt { "Children" }
                dd #run-children {
                    @for (i, child) in json.children.iter().enumerate() {
                        @if i > 0 { ", " }
                        a href={ "/runs/" (child) } { (child) }
                    }
                }
            }
            @if let Some(concurrency) = &json.concurrency {
                dt { "Concurrency key" }
                dd #concurrency-key { a href={ "/keys#key-" (concurrency.key) } { (concurrency.text()) } }
            }
            @if json.cancel_requested {
                dt { "Cancel requested" }
                dd { @match &json.cancel_reason { Some(reason) => (reason), None => "yes" } }
            }
            @if let Some(job) = &json.job_id {
                dt { "Job" } dd.id { (job) }
            }
            @if let Some(t) = &json.termination {
                @if let Some(kind) = t.error_kind {
                    dt { "Error kind" } dd { (kind.as_str()) }
                }
            }
            @if let Some(note) = json.note(times) {
                dt { "Note" } dd { (note) }
            }
        }
        @if let Some(error) = &json.last_error {
            h3 { @if terminated { "Error" } @else { "Last error" } }
            (layout::text_block(error))
        }
        @if app.read_only {
            p.note { "Read-only dashboard: no actions." }
        }
    }
}

/// What an active run waits for.
fn wait(app: &App, json: &DescribeJson, times: &Times) -> Markup {
    let step = step_text(json.current_step, json.step_name.as_deref());
    html! {
        div.wait {
            @if let Some(signal) = &json.waiting_for_signal {
                p { "Waiting for signal " code #signal-key { (signal.correlation_key) } }
                @if let Some(at) = signal.timeout_at_ms {
                    p { "Times out " (layout::time(times, at)) " (the step then runs without a signal)." }
                }
                @if !app.read_only {
                    p { a.button href=(url("/signal", &[("key", &signal.correlation_key), ("run", &json.run_id)])) { "Send signal…" } }
                }
            } @else if let Some(at) = json.scheduled_at_ms {
                @if json.attempts > 0 && json.last_error.is_some() {
                    p { "Retry of step " (step) " due " (layout::time(times, at)) "." }
                } @else {
                    p { "Timer: step " (step) " is due " (layout::time(times, at)) "." }
                }
            } @else {
                @match json.state {
                    RunStateJson::Running => {
                        p { "Running: a worker holds step " (step) "." }
                    }
                    RunStateJson::Cancelling => {
                        p { "Cancelling: the run ends when its step returns." }
                    }
                    _ => {
                        p { "Step " (step) " waits for a worker to claim it." }
                    }
                }
            }
        }
    }
}

/// How a terminated run ended: its result or its error.
fn ending(json: &DescribeJson) -> Markup {
    let result = json.outcome.as_ref().and_then(|o| o.result.as_ref());
    html! {
        @if let Some(t) = &json.termination {
            p { "The run " (layout::badge(t.status.as_str())) " at step " (t.final_step) "." }
        }
        @if let Some(result) = result {
            h3 { "Result" }
            (layout::payload(result))
        } @else if json.outcome.is_none() {
            p.note { "No result record: the run ended without a worker settling it (a cancelled waiting step, a dead letter reconciled by the owner)." }
        }
    }
}

fn actions(app: &App, json: &DescribeJson) -> Markup {
    if app.read_only {
        return html! {};
    }
    let id = &json.run_id;
    let active = json.termination.is_none();
    let failed = matches!(json.state, RunStateJson::Failed);
    html! {
        div.actions {
            @if active {
                a.button.danger #cancel href={ "/runs/" (id) "/cancel" } { "Cancel run…" }
            }
            @if failed {
                form method="post" action={ "/runs/" (id) "/requeue" } {
                    (layout::token_field(app))
                    button type="submit" #requeue title=(REQUEUE_EFFECT) { "Requeue the failed step" }
                }
            }
            @if !active {
                form method="post" action={ "/runs/" (id) "/fork" } {
                    (layout::token_field(app))
                    label { "From step "
                        input type="number" name="step" #fork-step min="0" max=(json.current_step) value=(json.current_step) required;
                    }
                    button type="submit" #fork title=(fork_effect(json.current_step)) { "Fork" }
                }
                form method="post" action={ "/runs/" (id) "/fork" } {
                    (layout::token_field(app))
                    input type="hidden" name="step" value="0";
                    button type="submit" #restart title=(fork_effect(0)) { "Restart" }
                }
            }
        }
    }
}

fn payload_section(payload: &Payload, absent: &str) -> Markup {
    match payload {
        Payload::Decoded(decoded) => layout::payload(decoded),
        Payload::Absent => html! { p.empty { (absent) } },
        Payload::Unreadable(e) => html! { p.error-message { "Not readable: " (e) } },
    }
}

/// The step history: one entry per step, each attempt with its start, its
/// duration (a bar as long as its share of the longest attempt), its
/// outcome and error; then the step in progress.
fn timeline(history: &HistoryJson, run: &DescribeJson, times: &Times) -> Markup {
    let took = |a: &AttemptJson| a.claimed_at_ms.map(|c| a.settled_at_ms.saturating_sub(c));
    let longest = history
        .attempts
        .iter()
        .filter_map(took)
        .max()
        .unwrap_or(0)
        .max(1);
    let mut steps: Vec<(u32, &str, Vec<&AttemptJson>)> = Vec::new();
    for attempt in &history.attempts {
        match steps.last_mut() {
            Some((step, _, attempts)) if *step == attempt.step => attempts.push(attempt),
            _ => steps.push((attempt.step, &attempt.name, vec![attempt])),
        }
    }
    // An active run's current step is in progress, whatever attempts of it
    // already settled.
    let in_progress = run.termination.is_none();
    html! {
        @if history.steps_dropped > 0 {
            p.note { (history.steps_dropped) " earlier steps have no history (the runtime keeps the last history_limit steps)." }
        }
        ol.timeline {
            @for (step, name, attempts) in &steps {
                li.step {
                    div.step-head {
                        span.step-n { "Step " (step) }
                        " " span.step-name { (name) }
                    }
                    div.attempts {
                    @for a in attempts {
                        div class={ "attempt o-" (a.outcome.as_str()) } {
                            span.dot {}
                            span.what { (a.outcome_word()) }
                            span.meta {
                                "attempt " (a.attempt)
                                @if let Some(version) = &a.version { " · version " (version) }
                                " · " (layout::maybe_time(times, a.claimed_at_ms.or(Some(a.settled_at_ms))))
                                @if let Some(ms) = took(a) { " · took " (short_duration(ms)) }
                            }
                            @if let Some(ms) = took(a) {
                                svg.took viewBox="0 0 100 4" preserveAspectRatio="none" {
                                    rect x="0" y="0" width=(format!("{:.2}", (ms as f64 / longest as f64 * 100.0).max(0.5))) height="4" {}
                                }
                            }
                            @if let Some(error) = &a.error {
                                (layout::text_block(error))
                            }
                        }
                    }
                    }
                }
            }
            @if in_progress {
                li.step.current {
                    div.step-head {
                        span.step-n { "Step " (run.current_step) }
                        @if let Some(name) = &run.step_name { " " span.step-name { (name) } }
                    }
                    div.attempts {
                        div.attempt.o-current {
                            span.dot {}
                            span.what { (run.state.as_str()) " now" }
                            @if run.attempts > 0 { span.meta { "attempt " (run.attempts) } }
                        }
                    }
                }
            }
        }
        p.note { (history.steps_taken) " steps taken, " (history.attempts.len()) " attempts shown." }
    }
}
