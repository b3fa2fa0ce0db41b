//! `groups list` and `groups describe`: run groups with their member counts
//! by state, and one group's members.

use taquba_workflow::{RunId, WorkflowView, view::RunFilter, view::StatusFilter};

use crate::cluster::Reads;
use crate::commands::runs::summary_table;
use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Table};
use crate::present::group::{GroupDetailsJson, GroupJson};
use crate::present::run::SummaryJson;

/// `groups list`.
///
/// # Errors
/// Storage errors.
pub async fn list(reads: Reads<'_>, limit: usize, out: &Output) -> CliResult<()> {
    let page = reads.groups(None, limit).await?;
    let rows: Vec<GroupJson> = page.groups.iter().map(GroupJson::from).collect();
    let footer = match (&page.next, rows.len()) {
        (_, 0) => "No groups.".to_string(),
        (None, 1) => "Showing 1 group.".to_string(),
        (None, n) => format!("Showing {n} groups."),
        (Some(_), n) => format!("Showing the first {n} groups (`--limit` shows more)."),
    };
    out.list(
        &rows,
        |_| {
            let mut table = Table::new(&[
                "group",
                "total",
                "pending",
                "succeeded",
                "failed",
                "cancelled",
            ]);
            for g in &rows {
                table.row(vec![
                    g.group_id.clone(),
                    g.total.to_string(),
                    g.pending.to_string(),
                    g.succeeded.to_string(),
                    g.failed.to_string(),
                    g.cancelled.to_string(),
                ]);
            }
            table
        },
        Some(footer),
    )
}

/// The most members `groups describe` lists.
pub const MEMBERS_SHOWN: usize = 100;

/// `groups describe ID`.
///
/// # Errors
/// [`CliError::Refused`] for an unknown group; storage errors.
pub async fn describe(view: &WorkflowView, id: &RunId, out: &Output) -> CliResult<()> {
    let status = view
        .group(id)
        .await?
        .ok_or_else(|| CliError::Refused(format!("group {id} not found in this store")))?;
    let page = view
        .runs(
            &RunFilter::new()
                .status(StatusFilter::All)
                .group(id.clone())
                .limit(MEMBERS_SHOWN),
        )
        .await?;
    let json = GroupDetailsJson {
        counts: GroupJson::from(&status),
        members: page.runs.iter().map(SummaryJson::from).collect(),
        more_members: page.next.is_some(),
    };
    out.one(&json, |times| {
        let c = &json.counts;
        let mut card = Card::new();
        card.field("Group", &c.group_id)
            .field("Members", c.total.to_string())
            .field("Pending", c.pending.to_string())
            .field("Succeeded", c.succeeded.to_string())
            .field("Failed", c.failed.to_string())
            .field("Cancelled", c.cancelled.to_string());
        let mut lines: Vec<String> = if json.members.is_empty() {
            vec!["no member runs recorded".to_string()]
        } else {
            summary_table(&json.members, times)
                .render()
                .lines()
                .map(str::to_string)
                .collect()
        };
        if json.more_members {
            lines.push(format!(
                "(the first {MEMBERS_SHOWN}; `runs list --status all --group {}` pages through all)",
                c.group_id
            ));
        }
        card.section("Runs", lines);
        card
    })
}
