//! A run group as presented: its member counts by state ([`GroupJson`])
//! and, described, its members ([`GroupDetailsJson`]).

use serde::Serialize;
use taquba_workflow::GroupStatus;

use crate::present::run::SummaryJson;

/// A group's counts, as printed.
#[derive(Debug, Serialize)]
pub struct GroupJson {
    /// The group.
    pub group_id: String,
    /// Members in its manifest.
    pub total: usize,
    /// Members submitted and not terminated.
    pub pending: usize,
    /// Members that succeeded.
    pub succeeded: usize,
    /// Members that failed.
    pub failed: usize,
    /// Members that were cancelled.
    pub cancelled: usize,
}

impl From<&GroupStatus> for GroupJson {
    fn from(g: &GroupStatus) -> Self {
        Self {
            group_id: g.group_id.to_string(),
            total: g.total,
            pending: g.pending,
            succeeded: g.succeeded,
            failed: g.failed,
            cancelled: g.cancelled,
        }
    }
}

/// `groups describe`, as printed.
#[derive(Debug, Serialize)]
pub struct GroupDetailsJson {
    /// The counts.
    #[serde(flatten)]
    pub counts: GroupJson,
    /// Its members' runs (the first page).
    pub members: Vec<SummaryJson>,
    /// Whether more members follow.
    pub more_members: bool,
}
