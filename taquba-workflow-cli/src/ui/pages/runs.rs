//! `GET /runs`: the run list. Counts by status at the top (over the whole
//! store, or one workflow's runs), filters by status and workflow, a
//! search by run id (an exact id opens the run; otherwise the runs whose
//! id contains the text), pages in run-id order with a cursor, relative
//! times. The list refreshes while it shows an active run.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use taquba_workflow::{RunId, view::MAX_PAGE_LIMIT, view::RunFilter, view::StatusFilter};

use crate::cluster::Reads;
use crate::error::CliResult;
use crate::output::{Times, short_duration};
use crate::present::run::{SummaryJson, step_text};
use crate::present::state::RunStateJson;
use crate::ui::app::App;
use crate::ui::error::{UiError, UiResult};
use crate::ui::layout::{self, Section};
use crate::ui::pages::{given, url};

/// The most runs the counts (and one page of a filtered search) read.
pub const SCAN_LIMIT: usize = 10_000;
/// The page sizes offered; the first is the default.
pub const PAGE_SIZES: [usize; 3] = [50, 20, 100];

/// Which runs the list shows, by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Every run.
    All,
    /// Pending, running or cancelling runs.
    Active,
    /// Runs that ended.
    Terminated,
    /// The runs in one state.
    Only(RunStateJson),
}

impl Shown {
    /// The word the query spells it with: `all`, `active`, `terminated`
    /// or the state's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Shown::All => "all",
            Shown::Active => "active",
            Shown::Terminated => "terminated",
            Shown::Only(state) => state.as_str(),
        }
    }

    /// Whether a run in `state` is shown.
    pub fn keeps(self, state: RunStateJson) -> bool {
        match self {
            Shown::All => true,
            Shown::Active => !state.is_terminated(),
            Shown::Terminated => state.is_terminated(),
            Shown::Only(only) => state == only,
        }
    }
}

/// The status filters, in display order.
pub const STATUSES: [Shown; 9] = [
    Shown::All,
    Shown::Active,
    Shown::Only(RunStateJson::Pending),
    Shown::Only(RunStateJson::Running),
    Shown::Only(RunStateJson::Cancelling),
    Shown::Terminated,
    Shown::Only(RunStateJson::Succeeded),
    Shown::Only(RunStateJson::Failed),
    Shown::Only(RunStateJson::Cancelled),
];

/// The states a run can be in, in the order the counts show them.
const STATES: [RunStateJson; 6] = [
    RunStateJson::Pending,
    RunStateJson::Running,
    RunStateJson::Cancelling,
    RunStateJson::Succeeded,
    RunStateJson::Failed,
    RunStateJson::Cancelled,
];

/// The query of `GET /runs`.
#[derive(Debug, Default, Deserialize)]
pub struct RunsQuery {
    /// The word of one of [`STATUSES`] (default `all`).
    pub status: Option<String>,
    /// Only runs of this workflow.
    pub workflow: Option<String>,
    /// A run id, or part of one.
    pub q: Option<String>,
    /// The page cursor: runs after this id.
    pub after: Option<String>,
    /// The page size.
    pub limit: Option<String>,
}

/// The filter of a listing, checked.
struct Listing<'a> {
    status: Shown,
    workflow: Option<&'a str>,
    search: Option<&'a str>,
    after: Option<RunId>,
    limit: usize,
}

impl<'a> Listing<'a> {
    fn parse(query: &'a RunsQuery) -> UiResult<Self> {
        let status = match given(&query.status) {
            None => Shown::All,
            Some(word) => STATUSES
                .iter()
                .copied()
                .find(|s| s.as_str() == word)
                .ok_or_else(|| {
                    UiError::bad_request(format!(
                        "status {word:?} is not one of {}",
                        STATUSES.map(Shown::as_str).join(", ")
                    ))
                })?,
        };
        let after = given(&query.after)
            .map(|id| RunId::new(id).map_err(|e| UiError::bad_request(format!("after: {e}"))))
            .transpose()?;
        let limit = match given(&query.limit) {
            None => PAGE_SIZES[0],
            Some(text) => match text.parse::<usize>() {
                Ok(n) if (1..=MAX_PAGE_LIMIT).contains(&n) => n,
                _ => {
                    return Err(UiError::bad_request(format!(
                        "limit {text:?} is not a page size from 1 to {MAX_PAGE_LIMIT}"
                    )));
                }
            },
        };
        Ok(Self {
            status,
            workflow: given(&query.workflow),
            search: given(&query.q),
            after,
            limit,
        })
    }

    /// The view's filter this one narrows.
    fn coarse(&self) -> StatusFilter {
        match self.status {
            Shown::All => StatusFilter::All,
            Shown::Active => StatusFilter::Active,
            Shown::Terminated => StatusFilter::Terminated,
            Shown::Only(state) if state.is_terminated() => StatusFilter::Terminated,
            Shown::Only(_) => StatusFilter::Active,
        }
    }

    /// Whether the view's filter alone selects the runs.
    fn is_coarse(&self) -> bool {
        !matches!(self.status, Shown::Only(_)) && self.search.is_none()
    }

    fn keeps(&self, run: &SummaryJson) -> bool {
        self.status.keeps(run.state) && self.search.is_none_or(|text| run.run_id.contains(text))
    }

    /// This listing's URL with `after` as its cursor.
    fn url(&self, after: Option<&str>) -> String {
        let limit = self.limit.to_string();
        let limit = if self.limit == PAGE_SIZES[0] {
            ""
        } else {
            &limit
        };
        url(
            "/runs",
            &[
                (
                    "status",
                    match self.status {
                        Shown::All => "",
                        status => status.as_str(),
                    },
                ),
                ("workflow", self.workflow.unwrap_or("")),
                ("q", self.search.unwrap_or("")),
                ("after", after.unwrap_or("")),
                ("limit", limit),
            ],
        )
    }
}

/// Runs counted by state.
#[derive(Debug, Default)]
pub struct Counts {
    /// Runs per state.
    pub by_state: BTreeMap<RunStateJson, usize>,
    /// Runs counted.
    pub total: usize,
    /// The workflow names seen (of all runs, for the filter).
    pub workflows: BTreeSet<String>,
    /// Whether the scan stopped at [`SCAN_LIMIT`] before the end.
    pub cut: bool,
}

impl Counts {
    /// The count of the runs `shown` shows.
    pub fn of(&self, shown: Shown) -> usize {
        match shown {
            Shown::All => self.total,
            shown => self
                .by_state
                .iter()
                .filter(|(state, _)| shown.keeps(**state))
                .map(|(_, n)| n)
                .sum(),
        }
    }
}

/// Count the runs of the store (of `workflow`, when given), reading at
/// most [`SCAN_LIMIT`] runs.
///
/// # Errors
/// Storage errors.
pub async fn count(reads: Reads<'_>, workflow: Option<&str>) -> CliResult<Counts> {
    let mut counts = Counts::default();
    let mut after: Option<RunId> = None;
    let mut read = 0;
    loop {
        let mut filter = RunFilter::new()
            .status(StatusFilter::All)
            .limit(MAX_PAGE_LIMIT.min(SCAN_LIMIT - read));
        if let Some(after) = after.take() {
            filter = filter.after(after);
        }
        let page = reads.runs(&filter).await?;
        read += page.runs.len();
        for run in &page.runs {
            let json = SummaryJson::from(run);
            if let Some(name) = &json.workflow {
                counts.workflows.insert(name.clone());
            }
            if workflow.is_none_or(|w| json.workflow.as_deref() == Some(w)) {
                *counts.by_state.entry(json.state).or_default() += 1;
                counts.total += 1;
            }
        }
        match page.next {
            Some(next) if read < SCAN_LIMIT => after = Some(next),
            Some(_) => {
                counts.cut = true;
                return Ok(counts);
            }
            None => return Ok(counts),
        }
    }
}

/// One page of the listing: its runs, the cursor of the next page, and
/// whether the search stopped at [`SCAN_LIMIT`] runs read.
async fn list(
    reads: Reads<'_>,
    listing: &Listing<'_>,
) -> CliResult<(Vec<SummaryJson>, Option<String>, bool)> {
    let mut filter = RunFilter::new().status(listing.coarse());
    if let Some(workflow) = listing.workflow {
        filter = filter.workflow(workflow);
    }
    if listing.is_coarse() {
        let mut filter = filter.limit(listing.limit);
        if let Some(after) = &listing.after {
            filter = filter.after(after.clone());
        }
        let page = reads.runs(&filter).await?;
        let rows = page
            .runs
            .iter()
            .map(|run| SummaryJson::in_shard(run, reads.shard_of(run)))
            .collect();
        return Ok((rows, page.next.map(|id| id.to_string()), false));
    }
    // Narrower than the view's filters: read pages and keep the matches.
    let mut rows: Vec<SummaryJson> = Vec::new();
    let mut after = listing.after.clone();
    let mut read = 0;
    loop {
        let mut page_filter = filter.clone().limit(MAX_PAGE_LIMIT);
        if let Some(after) = after.take() {
            page_filter = page_filter.after(after);
        }
        let page = reads.runs(&page_filter).await?;
        for (i, run) in page.runs.iter().enumerate() {
            read += 1;
            let json = SummaryJson::in_shard(run, reads.shard_of(run));
            if listing.keeps(&json) {
                if rows.len() == listing.limit {
                    let next = rows.last().map(|r| r.run_id.clone());
                    return Ok((rows, next, false));
                }
                rows.push(json);
            }
            if read == SCAN_LIMIT {
                // Stop here; the next page goes on after this run.
                let more = page.next.is_some() || i + 1 < page.runs.len();
                let next = more.then(|| run.run_id.to_string());
                return Ok((rows, next, more));
            }
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((rows, None, false)),
        }
    }
}

/// `GET /runs`.
///
/// # Errors
/// 400 for a bad filter value; 500 when the store fails.
pub async fn page(
    State(app): State<Arc<App>>,
    Query(query): Query<RunsQuery>,
) -> UiResult<Response> {
    let listing = Listing::parse(&query)?;
    let reads = app.reads();
    // An exact run id opens the run.
    if let Some(text) = listing.search
        && let Ok(id) = RunId::new(text)
        && reads.status(&id).await?.is_some()
    {
        return Ok(Redirect::to(&format!("/runs/{id}")).into_response());
    }
    let counts = count(reads, listing.workflow).await?;
    let (rows, next, cut) = list(reads, &listing).await?;
    let times = app.times();
    let any_active = counts.of(Shown::Active) > 0 || rows.iter().any(|r| r.ended_at_ms.is_none());
    let here = listing.url(listing.after.as_deref());
    let poll = any_active.then_some(here.as_str());
    let body = html! {
        (filters(&listing, &counts))
        (layout::live(poll, html! {
            (count_chips(&listing, &counts))
            @if rows.is_empty() {
                p.empty { (empty_text(&listing)) }
            } @else {
                (table(&rows, &times))
            }
            (pager(&listing, rows.len(), next.as_deref(), cut))
        }))
    };
    Ok(layout::page(&app, Section::Runs, "Runs", body).into_response())
}

fn filters(listing: &Listing<'_>, counts: &Counts) -> Markup {
    html! {
        form.filters method="get" action="/runs" {
            label { "Status "
                select name="status" {
                    @for status in STATUSES {
                        option value=(status.as_str()) selected[listing.status == status] { (status.as_str()) }
                    }
                }
            }
            label { "Workflow "
                select name="workflow" {
                    option value="" selected[listing.workflow.is_none()] { "any" }
                    @for name in &counts.workflows {
                        option value=(name) selected[listing.workflow == Some(name.as_str())] { (name) }
                    }
                    // A filter naming a workflow no run has still shows.
                    @if let Some(name) = listing.workflow {
                        @if !counts.workflows.contains(name) {
                            option value=(name) selected { (name) }
                        }
                    }
                }
            }
            label { "Run id "
                input type="search" name="q" value=(listing.search.unwrap_or("")) placeholder="id or part of one";
            }
            label { "Per page "
                select name="limit" {
                    @for size in PAGE_SIZES {
                        option value=(size) selected[listing.limit == size] { (size) }
                    }
                }
            }
            button type="submit" { "Show" }
        }
    }
}

fn count_chips(listing: &Listing<'_>, counts: &Counts) -> Markup {
    let link = |shown: Shown| {
        url(
            "/runs",
            &[
                (
                    "status",
                    match shown {
                        Shown::All => "",
                        shown => shown.as_str(),
                    },
                ),
                ("workflow", listing.workflow.unwrap_or("")),
            ],
        )
    };
    html! {
        nav.counts aria-label="Runs by status" {
            a.chip href=(link(Shown::All)) class=[(listing.status == Shown::All).then_some("current")] {
                span.n { (counts.total) } (if counts.total == 1 { " run" } else { " runs" })
            }
            @for state in STATES {
                @let shown = Shown::Only(state);
                a href=(link(shown)) class={ "chip c-" (state.as_str()) @if listing.status == shown { " current" } } {
                    span.n { (counts.of(shown)) } " " (state.as_str())
                }
            }
            @if counts.cut {
                span.note { "(counted the first " (SCAN_LIMIT) " runs)" }
            }
        }
    }
}

/// The table of listed runs.
pub fn table(rows: &[SummaryJson], times: &Times) -> Markup {
    let sharded = rows.iter().any(|run| run.shard.is_some());
    html! {
        table.runs {
            thead { tr {
                th { "Status" } th { "Run" } th { "Workflow" } th { "Step" }
                th.num { "Attempts" } th { "Submitted" } th { "Took" } th { "Error" }
                @if sharded { th.num { "Shard" } }
            } }
            tbody {
                @for run in rows {
                    tr {
                        td { (layout::badge(run.state.as_str())) }
                        td.id { a href={ "/runs/" (run.run_id) } { (run.run_id) } }
                        td { (run.workflow.as_deref().unwrap_or("-")) }
                        td { (step_text(run.current_step, run.step_name.as_deref())) }
                        td.num { (run.attempts) }
                        td { (layout::maybe_time(times, run.submitted_at_ms)) }
                        td { (took(run, times)) }
                        td.error {
                            @if let Some(error) = &run.error {
                                span title=(error) { (cut_text(error, 120)) }
                            }
                        }
                        @if sharded { td.num { (run.shard.map_or_else(|| "-".to_string(), |k| k.to_string())) } }
                    }
                }
            }
        }
    }
}

/// How long a run took (or has taken so far).
fn took(run: &SummaryJson, times: &Times) -> String {
    match (run.submitted_at_ms, run.ended_at_ms) {
        (Some(from), Some(to)) => short_duration(to.saturating_sub(from)),
        (Some(from), None) => format!(
            "{} so far",
            short_duration(times.now_ms().saturating_sub(from))
        ),
        _ => "-".to_string(),
    }
}

/// `text` cut to `max` characters, with an ellipsis when cut.
pub fn cut_text(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn empty_text(listing: &Listing<'_>) -> String {
    let mut what = match listing.status {
        Shown::All => "No runs".to_string(),
        status => format!("No {} runs", status.as_str()),
    };
    if let Some(workflow) = listing.workflow {
        what.push_str(&format!(" of workflow {workflow:?}"));
    }
    if let Some(text) = listing.search {
        what.push_str(&format!(" whose id contains {text:?}"));
    }
    if listing.after.is_some() {
        what.push_str(" after this point");
    }
    what.push('.');
    what
}

fn pager(listing: &Listing<'_>, shown: usize, next: Option<&str>, cut: bool) -> Markup {
    html! {
        p.pager {
            "Showing " (shown) " " (if shown == 1 { "run" } else { "runs" })
            " in run-id order (submission order for generated ids)."
            @if cut {
                " The search read " (SCAN_LIMIT) " runs and stopped; the next page goes on from there."
            }
            @if listing.after.is_some() {
                " " a href=(listing.url(None)) { "First page" }
            }
            @if let Some(next) = next {
                " " a.next href=(listing.url(Some(next))) rel="next" { "Next page →" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_text_counts_characters() {
        assert_eq!(cut_text("héllo", 3), "hél…");
        assert_eq!(cut_text("abc", 3), "abc");
    }

    #[test]
    fn status_filters_spell_their_words_and_count_their_runs() {
        let words = STATUSES.map(Shown::as_str);
        assert_eq!(
            words,
            [
                "all",
                "active",
                "pending",
                "running",
                "cancelling",
                "terminated",
                "succeeded",
                "failed",
                "cancelled",
            ]
        );
        let mut counts = Counts::default();
        for (state, n) in STATES.into_iter().zip(1..) {
            counts.by_state.insert(state, n);
            counts.total += n;
        }
        assert_eq!(counts.of(Shown::All), 21);
        assert_eq!(counts.of(Shown::Active), 1 + 2 + 3);
        assert_eq!(counts.of(Shown::Terminated), 4 + 5 + 6);
        assert_eq!(counts.of(Shown::Only(RunStateJson::Cancelling)), 3);
        assert_eq!(counts.of(Shown::Only(RunStateJson::Failed)), 5);
        // Each state narrows the view's filter of its side.
        for state in STATES {
            let query = RunsQuery {
                status: Some(state.as_str().into()),
                ..RunsQuery::default()
            };
            let listing = Listing::parse(&query).unwrap();
            assert_eq!(listing.status, Shown::Only(state));
            let side = if state.is_terminated() {
                StatusFilter::Terminated
            } else {
                StatusFilter::Active
            };
            assert_eq!(listing.coarse(), side, "{state}");
            assert!(!listing.is_coarse());
        }
    }

    #[test]
    fn listing_values_are_checked() {
        let query = RunsQuery {
            status: Some("bogus".into()),
            ..RunsQuery::default()
        };
        let err = Listing::parse(&query).err().unwrap();
        assert!(err.message.contains("bogus"), "{}", err.message);
        let query = RunsQuery {
            limit: Some("0".into()),
            ..RunsQuery::default()
        };
        assert!(Listing::parse(&query).is_err());
        let query = RunsQuery {
            status: Some("failed".into()),
            workflow: Some("w".into()),
            limit: Some("20".into()),
            ..RunsQuery::default()
        };
        let listing = Listing::parse(&query).unwrap();
        assert_eq!(listing.coarse(), StatusFilter::Terminated);
        assert!(!listing.is_coarse());
        assert_eq!(
            listing.url(Some("r-9")),
            "/runs?status=failed&workflow=w&after=r-9&limit=20"
        );
    }
}
