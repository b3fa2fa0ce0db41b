//! `GET /keys`: the concurrency keys in use (each shard's, on a cluster)
//! with their active and waiting counts, and under each key the runs
//! holding its slots and those waiting, in admission order. Read-only.

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};

use crate::ui::app::App;
use crate::ui::error::UiResult;
use crate::ui::layout::{self, Section};

/// `GET /keys`.
///
/// # Errors
/// 500 when the store fails.
pub async fn page(State(app): State<Arc<App>>) -> UiResult<Markup> {
    let mut keys = Vec::new();
    for place in app.places() {
        for key in place.runtime.view.concurrency_keys().await? {
            let details = place.runtime.view.concurrency_key(&key.key).await?;
            keys.push((place.shard, key, details));
        }
    }
    let times = app.times();
    let cluster = app.cluster_session().is_some();
    let body = html! {
        @if keys.is_empty() {
            p.empty { "No concurrency key in use. A run takes one with RunOptions::concurrency_key, a job with #[job(concurrency_key = \"...\")]." }
        } @else {
            table.keys {
                thead { tr {
                    th { "Key" }
                    @if cluster { th.num { "Shard" } }
                    th.num { "Active" } th.num { "Waiting" }
                    th { "Holding a slot" } th { "Next to start" }
                } }
                tbody {
                    @for (shard, key, details) in &keys {
                        tr id={ "key-" (key.key) } {
                            td.id { (key.key) }
                            @if cluster { td.num { (shard.map(|k| k.to_string()).unwrap_or_default()) } }
                            td.num { (key.active) }
                            td.num { (key.waiting) }
                            td.id {
                                @for holder in &details.holders {
                                    a href={ "/runs/" (holder.run_id) } { (holder.run_id) }
                                    " (" (layout::time(&times, holder.admitted_at_ms)) ") "
                                }
                            }
                            td.id {
                                @for waiter in details.waiting.iter().take(5) {
                                    a href={ "/runs/" (waiter.run_id) } { (waiter.run_id) } " "
                                }
                                @if details.waiting.len() > 5 { "…" }
                            }
                        }
                    }
                }
            }
        }
        p.meta { "A run holds a slot of its key from its admission to its end, timers and signal waits included; a waiting run holds no worker slot and starts, in submission order, when a slot frees." }
    };
    Ok(layout::page(&app, Section::Keys, "Concurrency keys", body))
}
