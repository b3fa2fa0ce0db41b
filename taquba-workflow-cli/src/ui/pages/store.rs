//! `GET /store`: the store as a whole, as `taquba-workflow store info`
//! shows it: job counts per queue, the runtimes it records, what the
//! reader sees of the owning writer (its epoch, last commit, last flush,
//! heartbeat),
//! and the size of each top-level prefix.

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};

use crate::commands::store_info::{bytes, gather};
use crate::output::short_duration;
use crate::ui::app::App;
use crate::ui::error::UiResult;
use crate::ui::layout::{self, Section};

/// `GET /store`.
///
/// # Errors
/// 500 when the store or its listing fails.
pub async fn page(State(app): State<Arc<App>>) -> UiResult<Markup> {
    let info = gather(&app.session.target, &app.session.reader).await?;
    let times = app.times();
    let w = &info.writer;
    let body = html! {
        div.columns {
            section.card {
                h2 { "Store" }
                dl.card {
                    dt { "Location" } dd.id { (info.store) }
                    dt { "Queue path" } dd.id { (info.db) }
                    dt { "Size" } dd { (bytes(info.total_bytes)) " in " (info.total_objects) " objects" }
                    dt { "Runtime shown" } dd { (app.runtime.queue_name) " (memo prefix " (app.runtime.memo_prefix) ")" }
                }
            }
            section.card {
                h2 { "Writer" }
                dl.card {
                    dt { "Epoch" } dd { (w.epoch) }
                    dt { "Last commit" }
                    dd {
                        @match &w.newest_wal {
                            Some(wal) => { (layout::time(&times, wal.at_ms)) " (newest write-ahead log object " code { (wal.path) } ")" }
                            None => "none in the write-ahead log",
                        }
                    }
                    dt { "Last flush" }
                    dd { @match w.last_flush_at_ms { Some(at) => { (layout::time(&times, at)) " (the manifest's newest table: it lags the commits)" }, None => "none recorded" } }
                    dt { "Heartbeat" }
                    dd {
                        @match &w.heartbeat {
                            None => "none (the writer does not write liveness beats)",
                            Some(beat) => {
                                (layout::time(&times, beat.at_ms)) " (every " (short_duration(beat.interval_ms))
                                @if beat.closed { ", closed cleanly" }
                                ", epoch " (beat.writer_epoch) ")"
                            }
                        }
                    }
                    dt { "Durable sequence" } dd { (w.durable_seq) }
                }
            }
        }
        section {
            h2 { "Queues" }
            @if info.queues.is_empty() {
                p.empty { "No jobs yet." }
            } @else {
                table.queues {
                    thead { tr {
                        th { "Queue" } th.num { "Pending" } th.num { "Scheduled" } th.num { "Claimed" }
                        th.num { "Done" } th.num { "Dead" }
                    } }
                    tbody {
                        @for q in &info.queues {
                            tr {
                                td { code { (q.queue) } }
                                td.num { (q.pending) } td.num { (q.scheduled) } td.num { (q.claimed) }
                                td.num { (q.done) }
                                td.num { @if q.dead > 0 { a href="/dead-letters" { (q.dead) } } @else { "0" } }
                            }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Runtimes" }
            @if info.runtimes.is_empty() {
                p.empty { "None recorded (a store written before runtimes recorded themselves: pass --queue and --memo-prefix)." }
            } @else {
                table.kv {
                    @for r in &info.runtimes {
                        tr {
                            th { code { (r.queue_name) } }
                            td { "memo prefix " code { (r.memo_prefix) } ", worker started " (layout::time(&times, r.started_at_ms)) " (taquba-workflow " (r.crate_version) ")" }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Objects by prefix" }
            table.queues {
                thead { tr { th { "Prefix" } th.num { "Objects" } th.num { "Size" } } }
                tbody {
                    @for p in &info.prefixes {
                        tr {
                            td { code { @if p.prefix.is_empty() { "(top level)" } @else { (p.prefix) } } }
                            td.num { (p.objects) } td.num { (bytes(p.bytes)) }
                        }
                    }
                }
            }
        }
    };
    Ok(layout::page(&app, Section::Store, "Store", body))
}
