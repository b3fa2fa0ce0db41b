//! `GET /dead-letters`: the dead-lettered jobs of every queue of the
//! store (the jobs that used up their attempts), each with its run, that
//! run's state and its last error, and a requeue button for a failed
//! run's step.

use std::sync::Arc;

use axum::extract::{Query, State};
use maud::{Markup, html};
use serde::Deserialize;
use taquba::JobRecord;
use taquba_workflow::{HEADER_RUN_ID, HEADER_STEP, RunId};

use crate::commands::mutate::REQUEUE_EFFECT;
use crate::output::Times;
use crate::present::state::RunStateJson;
use crate::ui::app::App;
use crate::ui::error::{UiError, UiResult};
use crate::ui::layout::{self, Section};
use crate::ui::pages::runs::cut_text;
use crate::ui::pages::{given, url};

/// Dead letters per queue and page.
pub const DEAD_SHOWN: usize = 50;

/// The query of `GET /dead-letters`.
#[derive(Debug, Default, Deserialize)]
pub struct DeadQuery {
    /// Only this queue.
    pub queue: Option<String>,
    /// The page cursor in that queue: jobs after this id.
    pub after: Option<String>,
    /// On a cluster: only this shard (the cursor's shard).
    pub shard: Option<String>,
}

/// A dead letter with what the page shows of its run.
struct Row {
    job: JobRecord,
    run: Option<RunId>,
    state: Option<RunStateJson>,
}

/// `GET /dead-letters[?queue=Q&after=JOB]`.
///
/// # Errors
/// 400 for a cursor without its queue; 500 when the store fails.
pub async fn page(State(app): State<Arc<App>>, Query(query): Query<DeadQuery>) -> UiResult<Markup> {
    let only = given(&query.queue);
    let after = given(&query.after);
    if after.is_some() && only.is_none() {
        return Err(UiError::bad_request(
            "after needs the queue it pages through (queue=NAME)",
        ));
    }
    let only_shard =
        match given(&query.shard) {
            Some(text) => Some(text.parse::<u32>().map_err(|_| {
                UiError::bad_request(format!("shard {text:?} is not a shard number"))
            })?),
            None => None,
        };
    if after.is_some() && app.cluster_session().is_some() && only_shard.is_none() {
        return Err(UiError::bad_request(
            "after needs the shard it pages through on a cluster (shard=K)",
        ));
    }
    let mut sections = Vec::new();
    for place in app.places() {
        if only_shard.is_some() && place.shard != only_shard {
            continue;
        }
        let view = &place.runtime.view;
        let queues = view.queue();
        for name in queues.list_queues().await? {
            if only.is_some_and(|q| q != name) {
                continue;
            }
            let stats = queues.stats(&name).await?;
            if stats.dead == 0 {
                continue;
            }
            let jobs = queues.dead_jobs(&name, after, DEAD_SHOWN + 1).await?;
            let more = jobs.len() > DEAD_SHOWN;
            let mut rows = Vec::new();
            for job in jobs.into_iter().take(DEAD_SHOWN) {
                let run = job
                    .headers
                    .get(HEADER_RUN_ID)
                    .and_then(|id| RunId::new(id.as_str()).ok());
                let state = match &run {
                    Some(run) => view
                        .status(run)
                        .await?
                        .map(|s| RunStateJson::from(&s.state)),
                    None => None,
                };
                rows.push(Row { job, run, state });
            }
            sections.push((place.shard, name, stats.dead, rows, more));
        }
    }
    let times = app.times();
    let body = html! {
        @if sections.is_empty() {
            p.empty { "No dead letters." }
        }
        @for (shard, name, dead, rows, more) in &sections {
            @let shard_text = shard.map(|k| k.to_string()).unwrap_or_default();
            section {
                h2 {
                    @if let Some(k) = shard { "Shard " (k) " · " }
                    "Queue " code { (name) } " · " (dead) " dead"
                }
                (table(&app, rows, &times))
                @if *more {
                    @if let Some(last) = rows.last() {
                        p.pager { a.next href=(url("/dead-letters", &[("shard", &shard_text), ("queue", name), ("after", &last.job.id)])) rel="next" { "Next page →" } }
                    }
                }
            }
        }
        p.note { "A run whose step was dead-lettered ends failed; requeue enqueues that step again with fresh attempts (through the owner's inbox)." }
    };
    Ok(layout::page(
        &app,
        Section::DeadLetters,
        "Dead letters",
        body,
    ))
}

fn table(app: &App, rows: &[Row], times: &Times) -> Markup {
    html! {
        table.dead {
            thead { tr {
                th { "Job" } th { "Run" } th { "Step" } th.num { "Attempts" }
                th { "Enqueued" } th { "Last error" } th {}
            } }
            tbody {
                @for row in rows {
                    tr {
                        td.id { (row.job.id) }
                        td {
                            @match &row.run {
                                Some(run) => {
                                    a.id href={ "/runs/" (run) } { (run) }
                                    @if let Some(state) = row.state { " " (layout::badge(state.as_str())) }
                                }
                                None => span.none { "-" },
                            }
                        }
                        td { (row.job.headers.get(HEADER_STEP).map(String::as_str).unwrap_or("-")) }
                        td.num { (row.job.attempts) "/" (row.job.max_attempts) }
                        td { (layout::time(times, row.job.enqueued_at)) }
                        td.error {
                            @if let Some(error) = &row.job.last_error {
                                span title=(error) { (cut_text(error, 160)) }
                            }
                        }
                        td {
                            @if let (Some(run), Some(RunStateJson::Failed), false) = (&row.run, row.state, app.read_only) {
                                form method="post" action={ "/runs/" (run) "/requeue" } {
                                    (layout::token_field(app))
                                    button type="submit" title=(REQUEUE_EFFECT) { "Requeue" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
