//! The actions, all sent as commands to the owner's inbox (never by
//! opening the store as a writer), each behind the form token and the
//! same-origin check:
//!
//! - `GET /runs/{id}/cancel`: what a cancel does to the run, and the form
//!   (a reason) that confirms it; `POST` sends it.
//! - `POST /runs/{id}/requeue`: requeue a failed run's dead-lettered step.
//! - `POST /runs/{id}/fork`: start a new run from a recorded step of an
//!   ended run (`step` 0: restart it).
//! - `GET /signal`: the form of a signal (key and JSON payload); `POST`
//!   sends it, MessagePack-encoded as `WorkflowRuntime::signal_value`
//!   does.
//! - `GET /commands/{id}`: where a sent command is (pending, accepted,
//!   applied with its answer, rejected with the error), refreshed until the
//!   owner applied or rejected it.
//!
//! Each action checks what it can first (the run exists, the command
//! applies to it) as `taquba-workflow runs …` does, then answers with a
//! redirect to the command's page (so a reload does not send it again).

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use taquba_workflow::RunId;
use taquba_workflow::inbox::{Command, CommandId, CommandState, Inbox, MAX_COMMAND_TEXT_LEN};

use crate::commands::activity;
use crate::commands::mutate::{
    cancel_effect, check_fork, check_requeue, existing_run, where_it_is,
};
use crate::output::short_duration;
use crate::payload::encode_json;
use crate::present::command::{AnswerJson, CommandJson};
use crate::present::state::RunStateJson;
use crate::ui::app::App;
use crate::ui::error::{UiError, UiResult};
use crate::ui::layout::{self, Section};
use crate::ui::pages::{given, run_id, url};

/// How long a command may stay pending before its page asks whether the
/// owner runs.
pub const PENDING_HINT_AFTER_MS: u64 = 30_000;

/// The fields every action form carries.
#[derive(Debug, Default, Deserialize)]
pub struct ActionForm {
    /// The form token.
    #[serde(default)]
    pub csrf: String,
    /// A cancel's reason.
    #[serde(default)]
    pub reason: String,
}

/// The signal form.
#[derive(Debug, Default, Deserialize)]
pub struct SignalForm {
    /// The form token.
    #[serde(default)]
    pub csrf: String,
    /// The correlation key.
    #[serde(default)]
    pub key: String,
    /// The payload as JSON.
    #[serde(default)]
    pub json: String,
    /// The run the form was opened from, for the way back.
    #[serde(default)]
    pub run: String,
}

/// The query of the signal form and of a command's page.
#[derive(Debug, Default, Deserialize)]
pub struct FromRun {
    /// A signal's key to fill in.
    pub key: Option<String>,
    /// The run the page was opened from.
    pub run: Option<String>,
}

/// Refuse an action of a read-only dashboard or with a wrong token.
pub(crate) fn allowed(app: &App, token: &str) -> UiResult<()> {
    if app.read_only {
        return Err(UiError::forbidden(
            "This dashboard is read-only (--read-only): it sends no commands.",
        ));
    }
    if !app.guard.verify_token(token) {
        return Err(UiError::forbidden(
            "The form's token is missing or not this dashboard's (it changes each time the dashboard starts): reload the page and try again. Nothing was sent.",
        ));
    }
    Ok(())
}

/// Send `command` to the owner's inbox. The send runs on its own task,
/// so a request dropped halfway (a closed tab) still completes it.
pub(crate) async fn send(inbox: &Inbox, command: Command) -> UiResult<CommandId> {
    let inbox = inbox.clone();
    let sent = tokio::spawn(async move { inbox.send(command).await })
        .await
        .map_err(|e| {
            UiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Not sent",
                format!("the send stopped: {e}"),
            )
        })?;
    sent.map_err(|e| match e {
        taquba_workflow::Error::InvalidCommand(_) => UiError::bad_request(e.to_string()),
        other => other.into(),
    })
}

pub(crate) fn to_command(id: &CommandId, run: Option<&RunId>) -> Response {
    let run = run.map(ToString::to_string).unwrap_or_default();
    Redirect::to(&url(&format!("/commands/{id}"), &[("run", &run)])).into_response()
}

/// `GET /runs/{id}/cancel`: what a cancel does, and the form confirming
/// it.
///
/// # Errors
/// 403 on a read-only dashboard; 404 for an unknown run; 409 for a
/// terminated one.
pub async fn confirm_cancel(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> UiResult<Markup> {
    if app.read_only {
        return Err(UiError::forbidden(
            "This dashboard is read-only (--read-only): it sends no commands.",
        ));
    }
    let id = run_id(&id)?;
    let place = app.run_place(&id).await?;
    let run = existing_run(&place.runtime.view, &id).await?;
    let effect = cancel_effect(&run)?;
    let body = html! {
        section.confirm {
            p { (where_it_is(&run)) }
            p { (effect) }
            p.note { "Via: the owning process's inbox (it applies commands at each maintenance round)." }
            form method="post" action={ "/runs/" (id) "/cancel" } {
                (layout::token_field(&app))
                label.block { "Reason (recorded with the cancellation, optional)"
                    input type="text" name="reason" #reason maxlength=(MAX_COMMAND_TEXT_LEN) placeholder="why";
                }
                div.actions {
                    button.danger type="submit" #confirm-cancel { "Cancel run " (id) }
                    a.button href={ "/runs/" (id) } { "Keep it running" }
                }
            }
        }
    };
    Ok(layout::page(
        &app,
        Section::Runs,
        &format!("Cancel run {id}?"),
        body,
    ))
}

/// `POST /runs/{id}/cancel`: send the cancel.
///
/// # Errors
/// 403 for a wrong token or a read-only dashboard; 404 for an unknown
/// run; 409 for a terminated one; 400 for a reason over 1 KiB.
pub async fn cancel(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> UiResult<Response> {
    allowed(&app, &form.csrf)?;
    let id = run_id(&id)?;
    let place = app.run_place(&id).await?;
    let run = existing_run(&place.runtime.view, &id).await?;
    cancel_effect(&run)?;
    let reason = Some(form.reason.trim().to_string()).filter(|r| !r.is_empty());
    let command = send(place.inbox, Command::cancel(id.clone(), reason)).await?;
    Ok(to_command(&command, Some(&id)))
}

/// `POST /runs/{id}/requeue`: requeue the failed run's dead-lettered step.
///
/// # Errors
/// 403 for a wrong token or a read-only dashboard; 404 for an unknown
/// run; 409 for a run that did not fail.
pub async fn requeue(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Form(form): Form<ActionForm>,
) -> UiResult<Response> {
    allowed(&app, &form.csrf)?;
    let id = run_id(&id)?;
    let place = app.run_place(&id).await?;
    let run = existing_run(&place.runtime.view, &id).await?;
    check_requeue(&run)?;
    let command = send(place.inbox, Command::requeue(id.clone())).await?;
    Ok(to_command(&command, Some(&id)))
}

/// The fork form: the token and the step to start from.
#[derive(Debug, Default, Deserialize)]
pub struct ForkForm {
    /// The form token.
    #[serde(default)]
    pub csrf: String,
    /// The step the fork starts from (0: a restart).
    #[serde(default)]
    pub step: String,
}

/// `POST /runs/{id}/fork`: start a new run from step `step` of the ended
/// run (a restart from step 0). An active run is refused: cancel it first.
///
/// # Errors
/// 403 for a wrong token or a read-only dashboard; 404 for an unknown
/// run; 400 for a step that is not a number; 409 for an active run or a
/// step past the run's end.
pub async fn fork(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Form(form): Form<ForkForm>,
) -> UiResult<Response> {
    allowed(&app, &form.csrf)?;
    let id = run_id(&id)?;
    let step: u32 = form.step.trim().parse().map_err(|_| {
        UiError::new(
            StatusCode::BAD_REQUEST,
            "Not a step",
            format!(
                "The step to fork from must be a step number (0 or more), not {:?}. Nothing was sent.",
                form.step
            ),
        )
    })?;
    let place = app.run_place(&id).await?;
    let run = existing_run(&place.runtime.view, &id).await?;
    check_fork(&run, step, false)?;
    let command = send(place.inbox, Command::fork(id.clone(), step, None)).await?;
    Ok(to_command(&command, Some(&id)))
}

/// `GET /signal[?key=K&run=ID]`: the signal form.
///
/// # Errors
/// 403 on a read-only dashboard.
pub async fn signal_form(
    State(app): State<Arc<App>>,
    Query(query): Query<FromRun>,
) -> UiResult<Markup> {
    if app.read_only {
        return Err(UiError::forbidden(
            "This dashboard is read-only (--read-only): it sends no commands.",
        ));
    }
    let form = SignalForm {
        key: given(&query.key).unwrap_or("").to_string(),
        run: given(&query.run).unwrap_or("").to_string(),
        ..SignalForm::default()
    };
    Ok(signal_page(&app, &form, None))
}

fn signal_page(app: &App, form: &SignalForm, error: Option<&str>) -> Markup {
    let body = html! {
        section.confirm {
            p { "A signal wakes the run waiting on its key, or is buffered for the next waiter. The payload is JSON, MessagePack-encoded as WorkflowRuntime::signal_value encodes a typed value." }
            @if let Some(error) = error {
                p.error-message #form-error { (error) }
            }
            form method="post" action="/signal" {
                (layout::token_field(app))
                input type="hidden" name="run" value=(form.run);
                label.block { "Key"
                    input type="text" name="key" #key value=(form.key) required placeholder="approve:42";
                }
                label.block { "Payload (JSON)"
                    textarea name="json" #json rows="6" placeholder=r#"{"approved": true}"# { (form.json) }
                }
                div.actions {
                    button type="submit" #send-signal { "Send signal" }
                    @if !form.run.is_empty() {
                        a.button href={ "/runs/" (form.run) } { "Back to run " (form.run) }
                    }
                }
            }
        }
    };
    layout::page(app, Section::Signal, "Send a signal", body)
}

/// `POST /signal`: send the signal.
///
/// # Errors
/// 403 for a wrong token or a read-only dashboard; 400 (the form again,
/// with the error) for a missing key or a payload that is not JSON.
pub async fn signal(
    State(app): State<Arc<App>>,
    Form(form): Form<SignalForm>,
) -> UiResult<Response> {
    allowed(&app, &form.csrf)?;
    let again = |error: String| {
        Ok((
            StatusCode::BAD_REQUEST,
            signal_page(&app, &form, Some(&error)),
        )
            .into_response())
    };
    let key = form.key.trim();
    if key.is_empty() {
        return again("The signal needs a key.".to_string());
    }
    let text = if form.json.trim().is_empty() {
        "null"
    } else {
        form.json.as_str()
    };
    let payload = match encode_json(text, "the payload") {
        Ok(payload) => payload,
        Err(e) => return again(e.to_string()),
    };
    let run = RunId::new(form.run.as_str()).ok();
    let place = app.signal_place(key).await?;
    let command = send(place.inbox, Command::signal(key, payload)).await?;
    Ok(to_command(&command, run.as_ref()))
}

/// `GET /commands/{id}[?run=ID]`: where command `id` is.
///
/// # Errors
/// 400 for an id that is not a command id; 500 when the store fails.
pub async fn command_page(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    Query(query): Query<FromRun>,
) -> UiResult<Markup> {
    let id: CommandId = id
        .parse()
        .map_err(|e: taquba_workflow::Error| UiError::bad_request(e.to_string()))?;
    let found = app.command_place(&id).await?;
    let json = match &found {
        Some((place, state)) => {
            CommandJson::new(&id, state, place.inbox.command_path(&id).to_string())
        }
        None => CommandJson::new(
            &id,
            &CommandState::Unknown,
            "(in no shard's inbox and recorded by no shard)".to_string(),
        ),
    };
    let place = found.as_ref().map(|(place, _)| *place);
    let settled = json.state.is_settled();
    let run = given(&query.run)
        .and_then(|r| RunId::new(r).ok())
        .or_else(|| json.answer.as_ref().and_then(answer_run));
    let run_state = match &run {
        Some(run) => app
            .reads()
            .status(run)
            .await?
            .map(|s| RunStateJson::from(&s.state)),
        None => None,
    };
    let times = app.times();
    let age = times.now_ms().saturating_sub(id.timestamp_ms());
    let hint = match place {
        Some(place) if !settled && age > PENDING_HINT_AFTER_MS => Some(
            activity::last_commit_hint(&place.session.target, &place.session.reader, &times)
                .await?,
        ),
        _ => None,
    };
    let here = url(
        &format!("/commands/{id}"),
        &[(
            "run",
            &run.as_ref().map(ToString::to_string).unwrap_or_default(),
        )],
    );
    let body = layout::live(
        (!settled).then_some(here.as_str()),
        html! {
            dl.card {
                dt { "Command" } dd.id { (json.command_id) }
                dt { "State" } dd #command-state { (layout::badge(json.state.as_str())) }
                dt { "Sent" } dd { (layout::time(&times, id.timestamp_ms())) }
                @if let Some(answer) = &json.answer {
                    dt { "Answer" } dd #answer { (answer.text()) }
                }
                @if let Some(error) = &json.error {
                    dt { "Error" } dd { (layout::text_block(error)) }
                }
                @if let Some(at) = json.at_ms {
                    dt { "Recorded" } dd { (layout::time(&times, at)) }
                }
                dt { "Object" } dd.id { (json.path) }
                @if let Some(shard) = place.and_then(|p| p.shard) {
                    dt { "Shard" } dd { (shard) }
                }
                @if let Some(note) = json.state.note() {
                    dt { "Note" } dd { (note) }
                }
            }
            @if let Some(hint) = &hint {
                p.warning {
                    "Not applied after " (short_duration(age)) ": is the owning process running? "
                    "In the store, " (hint) ". "
                    "The command stays in the inbox and is applied when the owner next runs; for a store no process owns, "
                    code { "taquba-workflow runs … --offline" }
                    " applies commands directly."
                }
            }
            @if let Some(run) = &run {
                p {
                    "Run " a href={ "/runs/" (run) } #run-link { (run) }
                    @if let Some(state) = run_state { " is " (layout::badge(state.as_str())) }
                    @if run_state.is_some_and(RunStateJson::is_terminated) { "." } @else { " now." }
                }
            }
        },
    );
    Ok(layout::page(
        &app,
        Section::None,
        &format!("Command {id}"),
        body,
    ))
}

/// The run an applied command's answer names.
fn answer_run(answer: &AnswerJson) -> Option<RunId> {
    let id = match answer {
        AnswerJson::Submitted { run_id, .. }
        | AnswerJson::Cancelled { run_id, .. }
        | AnswerJson::Requeued { run_id, .. } => Some(run_id.as_str()),
        AnswerJson::Signalled { run_id, .. } => run_id.as_deref(),
        // The new run.
        AnswerJson::Forked { new_run_id, .. } => Some(new_run_id.as_str()),
        AnswerJson::Schedule { .. } | AnswerJson::Other => None,
    };
    id.and_then(|id| RunId::new(id).ok())
}
