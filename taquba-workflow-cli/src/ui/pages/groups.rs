//! `GET /groups`: the run groups with their progress; `GET /groups/{id}`:
//! one group, its members by status. Both refresh while a member is still
//! to end.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;
use taquba_workflow::{RunId, view::RunFilter, view::StatusFilter};

use crate::commands::groups::MEMBERS_SHOWN;
use crate::present::group::GroupJson;
use crate::present::run::SummaryJson;
use crate::present::state::RunStateJson;
use crate::ui::app::App;
use crate::ui::error::{UiError, UiResult};
use crate::ui::layout::{self, Section};
use crate::ui::pages::runs::table;
use crate::ui::pages::{given, run_id, url};

/// Groups per page.
pub const GROUPS_SHOWN: usize = 50;

/// The query of `GET /groups`.
#[derive(Debug, Default, Deserialize)]
pub struct GroupsQuery {
    /// The page cursor: groups after this id.
    pub after: Option<String>,
}

/// Members not submitted yet: in the manifest, with no record.
fn unsubmitted(g: &GroupJson) -> usize {
    g.total
        .saturating_sub(g.pending + g.succeeded + g.failed + g.cancelled)
}

/// Whether members are still to end.
fn open(g: &GroupJson) -> bool {
    g.pending > 0 || unsubmitted(g) > 0
}

/// A group's progress bar and its counts in words.
fn progress(g: &GroupJson) -> Markup {
    let ended = g.succeeded + g.failed + g.cancelled;
    html! {
        div.progress {
            (layout::bar(g.total, &[
                ("succeeded", g.succeeded, "succeeded"),
                ("failed", g.failed, "failed"),
                ("cancelled", g.cancelled, "cancelled"),
                ("pending", g.pending, "pending"),
            ]))
            span.meta { (ended) " of " (g.total) " ended" }
        }
    }
}

/// `GET /groups`.
///
/// # Errors
/// 400 for a bad cursor; 500 when the store fails.
pub async fn list(
    State(app): State<Arc<App>>,
    Query(query): Query<GroupsQuery>,
) -> UiResult<Markup> {
    let after = given(&query.after).map(run_id).transpose()?;
    let page = app.reads().groups(after.as_ref(), GROUPS_SHOWN).await?;
    let rows: Vec<GroupJson> = page.groups.iter().map(GroupJson::from).collect();
    let poll = rows.iter().any(open).then(|| {
        url(
            "/groups",
            &[(
                "after",
                &after.as_ref().map(ToString::to_string).unwrap_or_default(),
            )],
        )
    });
    let body = layout::live(
        poll.as_deref(),
        html! {
            @if rows.is_empty() {
                p.empty { "No groups." }
            } @else {
                table.groups {
                    thead { tr {
                        th { "Group" } th { "Progress" } th.num { "Members" } th.num { "Pending" }
                        th.num { "Succeeded" } th.num { "Failed" } th.num { "Cancelled" }
                    } }
                    tbody {
                        @for g in &rows {
                            tr {
                                td.id { a href={ "/groups/" (g.group_id) } { (g.group_id) } }
                                td { (progress(g)) }
                                td.num { (g.total) } td.num { (g.pending) }
                                td.num { (g.succeeded) } td.num { (g.failed) } td.num { (g.cancelled) }
                            }
                        }
                    }
                }
            }
            p.pager {
                "Showing " (rows.len()) " groups in group-id order."
                @if after.is_some() { " " a href="/groups" { "First page" } }
                @if let Some(next) = &page.next {
                    " " a.next href=(url("/groups", &[("after", next)])) rel="next" { "Next page →" }
                }
            }
        },
    );
    Ok(layout::page(&app, Section::Groups, "Groups", body))
}

/// `GET /groups/{id}`.
///
/// # Errors
/// 400 for an invalid id; 404 for a group not in the store; 500 when the
/// store fails.
pub async fn page(State(app): State<Arc<App>>, Path(id): Path<String>) -> UiResult<Markup> {
    let id: RunId = run_id(&id)?;
    let not_found = || {
        UiError::not_found(format!(
            "group {id} not found in this store (never submitted here, or forgotten)"
        ))
    };
    let place = app.group_place(&id).ok_or_else(not_found)?;
    let view = &place.runtime.view;
    let status = view.group(&id).await?.ok_or_else(|| {
        UiError::not_found(format!(
            "group {id} not found in this store (never submitted here, or forgotten)"
        ))
    })?;
    let members = view
        .runs(
            &RunFilter::new()
                .status(StatusFilter::All)
                .group(id.clone())
                .limit(MEMBERS_SHOWN),
        )
        .await?;
    let counts = GroupJson::from(&status);
    let rows: Vec<SummaryJson> = members.runs.iter().map(SummaryJson::from).collect();
    let times = app.times();
    let here = format!("/groups/{id}");
    let states = [
        RunStateJson::Pending,
        RunStateJson::Running,
        RunStateJson::Cancelling,
        RunStateJson::Failed,
        RunStateJson::Cancelled,
        RunStateJson::Succeeded,
    ];
    let body = layout::live(
        open(&counts).then_some(here.as_str()),
        html! {
            section.card {
                (progress(&counts))
                dl.card {
                    dt { "Members" } dd { (counts.total) }
                    dt { "Pending" } dd { (counts.pending) }
                    dt { "Succeeded" } dd { (counts.succeeded) }
                    dt { "Failed" } dd { (counts.failed) }
                    dt { "Cancelled" } dd { (counts.cancelled) }
                    @if unsubmitted(&counts) > 0 {
                        dt { "Not submitted yet" } dd { (unsubmitted(&counts)) }
                    }
                }
                p { a href=(url("/runs", &[])) { "All runs" } }
            }
            @if rows.is_empty() {
                p.empty { "No member runs recorded." }
            }
            @for state in states {
                @let of_state: Vec<SummaryJson> = rows.iter().filter(|r| r.state == state).cloned().collect();
                @if !of_state.is_empty() {
                    section {
                        h2 { (layout::badge(state.as_str())) " " (of_state.len()) }
                        (table(&of_state, &times))
                    }
                }
            }
            @if members.next.is_some() {
                p.note { "The first " (MEMBERS_SHOWN) " members are shown." }
            }
        },
    );
    Ok(layout::page(
        &app,
        Section::Groups,
        &format!("Group {id}"),
        body,
    ))
}
