//! `GET /schedules`: the store's schedules (each shard's, on a cluster)
//! with their timer, state and next tick in UTC and in their zone;
//! `POST /schedules/{name}/pause` and `POST /schedules/{name}/resume` send
//! the command to the owner's inbox, behind the form token and the
//! same-origin check, and are refused (and not shown) on a read-only
//! dashboard.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use taquba_workflow::inbox::Command;

use crate::present::schedule::ScheduleJson;
use crate::ui::app::{App, Place};
use crate::ui::error::{UiError, UiResult};
use crate::ui::layout::{self, Section};
use crate::ui::pages::actions::{allowed, send, to_command};

/// The pause and resume forms.
#[derive(Debug, Default, Deserialize)]
pub struct ScheduleForm {
    /// The form token.
    #[serde(default)]
    pub csrf: String,
    /// The shard holding the schedule, on a cluster.
    #[serde(default)]
    pub shard: Option<u32>,
}

/// `GET /schedules`.
///
/// # Errors
/// 500 when the store fails.
pub async fn page(State(app): State<Arc<App>>) -> UiResult<Markup> {
    let mut rows: Vec<(Option<u32>, ScheduleJson)> = Vec::new();
    for place in app.places() {
        for schedule in place.runtime.view.schedules().await? {
            rows.push((place.shard, ScheduleJson::from(&schedule)));
        }
    }
    let times = app.times();
    let cluster = app.cluster_session().is_some();
    let body = html! {
        @if rows.is_empty() {
            p.empty { "No schedules. A process creates them with WorkflowRuntime::schedule." }
        } @else {
            table.schedules {
                thead { tr {
                    th { "Schedule" }
                    @if cluster { th.num { "Shard" } }
                    th { "When" } th { "Catch-up" } th { "State" }
                    th { "Next tick (UTC)" } th { "Next tick (local)" }
                    th { "Last run" } th.num { "Fired" }
                    @if !app.read_only { th { "" } }
                } }
                tbody {
                    @for (shard, s) in &rows {
                        tr id={ "schedule-" (s.name) } {
                            td.id { (s.name) }
                            @if cluster { td.num { (shard.map(|k| k.to_string()).unwrap_or_default()) } }
                            td { (s.when) }
                            td { (s.catch_up) }
                            td { (layout::badge(if s.paused { "paused" } else { "active" })) }
                            td.next-tick {
                                @match s.next_fire_ms {
                                    Some(ms) => (layout::time(&times, ms)),
                                    None => "-",
                                }
                            }
                            td { (s.next_fire_local.clone().unwrap_or_else(|| "-".to_string())) }
                            td.id {
                                @match &s.last_run_id {
                                    Some(run) => a href={ "/runs/" (run) } { (run) },
                                    None => "-",
                                }
                            }
                            td.num { (s.fired) }
                            @if !app.read_only {
                                td { (toggle(&app, *shard, s)) }
                            }
                        }
                    }
                }
            }
        }
        p.meta { "Ticks fire in the owning process's worker, every poll interval; a paused schedule fires nothing until resumed, and then at its first tick after now." }
    };
    Ok(layout::page(&app, Section::Schedules, "Schedules", body))
}

/// The pause (or resume) button of `s`.
fn toggle(app: &App, shard: Option<u32>, s: &ScheduleJson) -> Markup {
    let (action, label) = if s.paused {
        ("resume", "Resume")
    } else {
        ("pause", "Pause")
    };
    html! {
        form method="post" action={ "/schedules/" (s.name) "/" (action) } {
            (layout::token_field(app))
            @if let Some(shard) = shard {
                input type="hidden" name="shard" value=(shard);
            }
            button type="submit" id={ (action) "-" (s.name) } { (label) }
        }
    }
}

/// `POST /schedules/{name}/pause`.
///
/// # Errors
/// 403 on a read-only dashboard or with a wrong token; 404 for an unknown
/// schedule; 500 when the store fails.
pub async fn pause(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Form(form): Form<ScheduleForm>,
) -> UiResult<Response> {
    set_paused(&app, &name, &form, true).await
}

/// `POST /schedules/{name}/resume`.
///
/// # Errors
/// As [`pause`].
pub async fn resume(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Form(form): Form<ScheduleForm>,
) -> UiResult<Response> {
    set_paused(&app, &name, &form, false).await
}

async fn set_paused(
    app: &App,
    name: &str,
    form: &ScheduleForm,
    paused: bool,
) -> UiResult<Response> {
    allowed(app, &form.csrf)?;
    let place = place_of(app, form.shard)?;
    if place.runtime.view.schedule(name).await?.is_none() {
        return Err(UiError::not_found(format!(
            "schedule {name:?} not found in this store"
        )));
    }
    let command = if paused {
        Command::pause_schedule(name)
    } else {
        Command::resume_schedule(name)
    };
    let id = send(place.inbox, command).await?;
    Ok(to_command(&id, None))
}

/// The place holding the schedule: the store, or shard `shard`.
fn place_of(app: &App, shard: Option<u32>) -> UiResult<Place<'_>> {
    app.places()
        .into_iter()
        .find(|place| place.shard == shard)
        .ok_or_else(|| {
            UiError::bad_request(format!("no shard {shard:?} in this dashboard's store"))
        })
}
