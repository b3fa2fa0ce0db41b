//! `GET /store`: the store as a whole, as `taquba-workflow store info`
//! shows it: job counts per queue, the runtimes it records, what the
//! reader sees of the owning writer (its epoch, last commit, last flush,
//! heartbeat),
//! and the size of each top-level prefix.

use std::sync::Arc;

use axum::extract::State;
use maud::{Markup, html};

use crate::cluster::ClusterSession;
use crate::commands::cluster_info;
use crate::commands::store_info::{bytes, gather};
use crate::output::short_duration;
use crate::present::store::{QueueJson, ShardInfoJson};
use crate::session::{Runtime, Session};
use crate::ui::app::{App, Scope};
use crate::ui::error::UiResult;
use crate::ui::layout::{self, Section};
use crate::ui::pages::url;

/// `GET /store`.
///
/// # Errors
/// 500 when the store or its listing fails.
pub async fn page(State(app): State<Arc<App>>) -> UiResult<Markup> {
    match &app.scope {
        Scope::Store {
            session, runtime, ..
        } => store_page(&app, session, runtime).await,
        Scope::Cluster { cluster, .. } => cluster_page(&app, cluster).await,
    }
}

/// The page of a cluster: its record and a row per shard (owner, what its
/// reader sees of the writer, job counts), as `store info` shows it.
async fn cluster_page(app: &App, cluster: &ClusterSession) -> UiResult<Markup> {
    let info = cluster_info::gather(cluster).await?;
    let times = app.times();
    let open = info.shards.iter().filter(|s| s.open).count();
    let sum = |shard: &ShardInfoJson, f: fn(&QueueJson) -> i64| -> i64 {
        shard.queues.iter().map(f).sum()
    };
    let body = html! {
        section.card {
            h2 { "Cluster" }
            dl.card {
                dt { "Location" } dd.id { (info.store) }
                dt { "Shards" } dd { (info.shard_count) " (" (open) " with a queue)" }
                dt { "Hash" } dd { code { (info.hash) } }
                dt { "Format" } dd { (info.format) }
                dt { "Created" } dd { (layout::time(&times, info.created_at_ms)) }
            }
        }
        section {
            h2 { "Shards" }
            table.queues #shards {
                thead { tr {
                    th.num { "Shard" } th { "Owner" } th.num { "Epoch" } th.num { "Durable seq" }
                    th { "Last commit" } th { "Heartbeat" }
                    th.num { "Pending" } th.num { "Scheduled" } th.num { "Claimed" } th.num { "Dead" }
                } }
                tbody {
                    @for shard in &info.shards {
                        tr {
                            td.num { (shard.shard) }
                            td { (shard.owner) }
                            @match &shard.writer {
                                None => { td colspan="8" { "no queue yet (no process has opened this shard)" } }
                                Some(w) => {
                                    td.num { (w.epoch) }
                                    td.num { (w.durable_seq) }
                                    td { @match &w.newest_wal { Some(wal) => (layout::time(&times, wal.at_ms)), None => "none" } }
                                    td {
                                        @match &w.heartbeat {
                                            None => "none",
                                            Some(beat) => {
                                                (layout::time(&times, beat.at_ms)) " (every " (short_duration(beat.interval_ms))
                                                @if beat.closed { ", closed cleanly" }
                                                ")"
                                            }
                                        }
                                    }
                                    td.num { (sum(shard, |q| q.pending)) }
                                    td.num { (sum(shard, |q| q.scheduled)) }
                                    td.num { (sum(shard, |q| q.claimed)) }
                                    td.num {
                                        @let dead = sum(shard, |q| q.dead);
                                        @if dead > 0 { a href=(url("/dead-letters", &[("shard", &shard.shard.to_string())])) { (dead) } } @else { "0" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            p.note { "The owner of a shard comes from its lease once the cluster runtime records leases; the times are what each shard's reader sees (the newest write-ahead log object is the last commit)." }
        }
    };
    Ok(layout::page(app, Section::Store, "Cluster", body))
}

async fn store_page(app: &App, session: &Session, runtime: &Runtime) -> UiResult<Markup> {
    let info = gather(&session.target, &session.reader).await?;
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
                    dt { "Runtime shown" } dd { (runtime.queue_name) " (memo prefix " (runtime.memo_prefix) ")" }
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
    Ok(layout::page(app, Section::Store, "Store", body))
}
