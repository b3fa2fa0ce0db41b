//! `keys list` and `keys describe`: the store's concurrency keys
//! (`RunOptions::concurrency_key`) with their active and waiting runs, and
//! one key's holders and waiters in admission order. Read-only.

use serde::Serialize;
use taquba_workflow::WorkflowView;
use taquba_workflow::view::{ConcurrencyKey, ConcurrencyKeyDetails};

use crate::error::CliResult;
use crate::output::{Card, Output, Table};

/// A key in use, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct KeyJson {
    /// The key.
    pub key: String,
    /// Runs holding a slot.
    pub active: u32,
    /// Runs waiting for one.
    pub waiting: u32,
}

impl From<&ConcurrencyKey> for KeyJson {
    fn from(key: &ConcurrencyKey) -> Self {
        Self {
            key: key.key.clone(),
            active: key.active,
            waiting: key.waiting,
        }
    }
}

/// One key described, as printed.
#[derive(Debug, Clone, Serialize)]
pub struct KeyDetailsJson {
    /// The key.
    pub key: String,
    /// The runs holding a slot, with when they were admitted (ms).
    pub holders: Vec<(String, u64)>,
    /// The runs waiting, in admission order, with their limit and when
    /// they were submitted (ms).
    pub waiting: Vec<(String, u32, u64)>,
}

impl From<&ConcurrencyKeyDetails> for KeyDetailsJson {
    fn from(details: &ConcurrencyKeyDetails) -> Self {
        Self {
            key: details.key.clone(),
            holders: details
                .holders
                .iter()
                .map(|h| (h.run_id.to_string(), h.admitted_at_ms))
                .collect(),
            waiting: details
                .waiting
                .iter()
                .map(|w| (w.run_id.to_string(), w.limit, w.submitted_at_ms))
                .collect(),
        }
    }
}

/// `keys list`.
///
/// # Errors
/// Storage errors.
pub async fn list(view: &WorkflowView, out: &Output) -> CliResult<()> {
    let rows: Vec<KeyJson> = view
        .concurrency_keys()
        .await?
        .iter()
        .map(Into::into)
        .collect();
    let footer = match rows.len() {
        0 => "No concurrency key in use.".to_string(),
        1 => "Showing 1 key.".to_string(),
        n => format!("Showing {n} keys."),
    };
    out.list(
        &rows,
        |_| {
            let mut table = Table::new(&["key", "active", "waiting"]);
            for k in &rows {
                table.row(vec![
                    k.key.clone(),
                    k.active.to_string(),
                    k.waiting.to_string(),
                ]);
            }
            table
        },
        Some(footer),
    )
}

/// `keys describe KEY`.
///
/// # Errors
/// [`CliError::Workflow`](crate::error::CliError) for a key no run can
/// have; storage errors.
pub async fn describe(view: &WorkflowView, key: &str, out: &Output) -> CliResult<()> {
    let json = KeyDetailsJson::from(&view.concurrency_key(key).await?);
    out.one(&json, |times| {
        let mut card = Card::new();
        card.field("Key", &json.key)
            .field("Active", json.holders.len().to_string())
            .field("Waiting", json.waiting.len().to_string())
            .section(
                "Holding a slot",
                json.holders
                    .iter()
                    .map(|(run, at)| format!("{run}  admitted {}", times.at(*at)))
                    .collect(),
            )
            .section(
                "Waiting, in admission order",
                json.waiting
                    .iter()
                    .map(|(run, limit, at)| {
                        format!("{run}  limit {limit}, submitted {}", times.at(*at))
                    })
                    .collect(),
            );
        card
    })
}
