//! `schedules list`, `schedules describe`, `schedules pause` and
//! `schedules resume`: a store's schedules with their next tick, and
//! pausing or resuming one through the owner's inbox (or `--offline`).

use taquba_workflow::WorkflowView;
use taquba_workflow::inbox::Command;

use crate::cli::SendArgs;
use crate::commands::answer::Change;
use crate::commands::mutate::{deliver, say};
use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Table, Times};
use crate::present::schedule::ScheduleJson;
use crate::session::{Runtime, Session};

/// `schedules list`.
///
/// # Errors
/// Storage errors.
pub async fn list(view: &WorkflowView, out: &Output) -> CliResult<()> {
    let rows: Vec<ScheduleJson> = view.schedules().await?.iter().map(Into::into).collect();
    let footer = match rows.len() {
        0 => "No schedules.".to_string(),
        1 => "Showing 1 schedule.".to_string(),
        n => format!("Showing {n} schedules."),
    };
    out.list(
        &rows,
        |times| {
            let mut table = Table::new(&["schedule", "when", "state", "next tick", "last run"]);
            for s in &rows {
                table.row(vec![
                    s.name.clone(),
                    s.when.clone(),
                    state(s).to_string(),
                    next_tick(s, times),
                    s.last_run_id.clone().unwrap_or_else(|| "-".to_string()),
                ]);
            }
            table
        },
        Some(footer),
    )
}

/// `schedules describe NAME`.
///
/// # Errors
/// [`CliError::Refused`] for an unknown schedule; storage errors.
pub async fn describe(view: &WorkflowView, name: &str, out: &Output) -> CliResult<()> {
    let json = ScheduleJson::from(&existing(view, name).await?);
    out.one(&json, |times| card(&json, times))
}

/// `schedules pause NAME` (`paused`) or `schedules resume NAME`.
///
/// # Errors
/// [`CliError::Refused`] for an unknown schedule; the delivery's errors.
pub async fn set_paused(
    session: &Session,
    runtime: &Runtime,
    name: &str,
    paused: bool,
    send: &SendArgs,
    out: &Output,
) -> CliResult<()> {
    let schedule = existing(&runtime.view, name).await?;
    let (command, what) = if paused {
        (
            Command::pause_schedule(name),
            format!("pause of schedule {name}"),
        )
    } else {
        (
            Command::resume_schedule(name),
            format!("resume of schedule {name}"),
        )
    };
    say(&format!(
        "Schedule {name} ({}) is {}.",
        ScheduleJson::from(&schedule).when,
        if schedule.paused { "paused" } else { "active" }
    ))?;
    say(if paused {
        "Pausing it: no tick fires until it is resumed."
    } else {
        "Resuming it: it fires next at its first tick after the owner applies the command (ticks it was paused over are not caught up)."
    })?;
    deliver(session, runtime, Change { command, what }, send, out).await
}

async fn existing(
    view: &WorkflowView,
    name: &str,
) -> CliResult<taquba_workflow::schedule::ScheduleInfo> {
    view.schedule(name)
        .await?
        .ok_or_else(|| CliError::Refused(format!("schedule {name:?} not found in this store")))
}

fn state(s: &ScheduleJson) -> &'static str {
    if s.paused { "paused" } else { "active" }
}

/// The next tick: relative or UTC as `--time-format` says, with the local
/// time of a cron expression's zone.
fn next_tick(s: &ScheduleJson, times: &Times) -> String {
    match (s.next_fire_ms, &s.zone, &s.next_fire_local) {
        (None, _, _) => "-".to_string(),
        (Some(ms), Some(zone), Some(local)) if zone != "UTC" => {
            format!("{} ({local} {zone})", times.at(ms))
        }
        (Some(ms), _, _) => times.at(ms),
    }
}

fn card(s: &ScheduleJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Schedule", &s.name)
        .field("When", &s.when)
        .field("Catch-up", &s.catch_up)
        .field("State", state(s))
        .field("Next tick", times.maybe_at(s.next_fire_ms))
        .field(
            "Next tick (UTC)",
            s.next_fire_ms.map_or("-".to_string(), crate::output::iso),
        )
        .field_opt("Next tick (local)", s.next_fire_local.clone())
        .field("Last tick", times.maybe_at(s.last_fired_ms))
        .field_opt("Last run", s.last_run_id.clone())
        .field("Ticks fired", s.fired.to_string())
        .field("Input", format!("{} bytes", s.input_bytes))
        .field("Queue", &s.queue)
        .field("Created", times.at(s.created_at_ms))
        .field("Updated", times.at(s.updated_at_ms));
    card
}
