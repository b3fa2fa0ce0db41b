//! `store info`: the store as a whole. Job counts per queue, the first dead
//! letters, the size of each top-level prefix (by listing the store), and
//! what the reader can tell of the owning writer: its epoch, what moves
//! with its commits (the durable sequence number, the newest write-ahead
//! log object), its last flush and, when it writes one, its liveness
//! heartbeat.

use std::collections::BTreeMap;

use futures_util::TryStreamExt;
use taquba::QueueReader;
use taquba_workflow::{HEADER_RUN_ID, WorkflowView};

use crate::commands::activity::newest_wal;
use crate::error::{CliError, CliResult};
use crate::location::Location;
use crate::output::{Card, Output, Times, short_duration};
use crate::present::store::{
    DeadLetterJson, HeartbeatJson, PrefixJson, QueueJson, RuntimeJson, StoreInfoJson, WriterJson,
};
use crate::session::{Session, Target};

/// The most dead letters listed per queue.
pub const DEAD_LETTERS_SHOWN: usize = 10;

/// `store info`.
///
/// # Errors
/// Storage and listing errors.
pub async fn info(session: &Session, out: &Output) -> CliResult<()> {
    let json = gather(&session.target, &session.reader).await?;
    out.one(&json, |times| card(&json, times))
}

/// What `store info` shows of the store `target` that `reader` reads.
///
/// # Errors
/// Storage and listing errors.
pub async fn gather(target: &Target, reader: &QueueReader) -> CliResult<StoreInfoJson> {
    let writer = writer(target, reader).await?;
    let runtimes = runtimes(reader).await?;
    let (queues, dead_letters) = queues(reader).await?;
    let (prefixes, passed_over) = sizes(target).await?;
    Ok(StoreInfoJson {
        store: target.location.to_string(),
        db: target.db_path.clone(),
        writer,
        runtimes,
        queues,
        dead_letters,
        total_objects: prefixes.iter().map(|p| p.objects).sum(),
        total_bytes: prefixes.iter().map(|p| p.bytes).sum(),
        prefixes,
        passed_over,
    })
}

/// What `reader` sees of the writer of `target`'s queue: its epoch, last
/// flush, durable sequence number, newest write-ahead log object and
/// heartbeat.
///
/// # Errors
/// The heartbeat's and the listing's errors.
pub async fn writer(target: &Target, reader: &QueueReader) -> CliResult<WriterJson> {
    let activity = reader.last_store_activity();
    let heartbeat = reader.writer_heartbeat().await?.map(|beat| HeartbeatJson {
        at_ms: beat.at_ms,
        interval_ms: u64::try_from(beat.interval.as_millis()).unwrap_or(u64::MAX),
        counter: beat.counter,
        writer_epoch: beat.writer_epoch,
        closed: beat.closed,
    });
    Ok(WriterJson {
        epoch: activity.writer_epoch,
        last_flush_at_ms: activity.last_flush_at_ms,
        durable_seq: activity.durable_seq,
        newest_wal: newest_wal(target).await?,
        heartbeat,
    })
}

/// The runtimes recorded in the store `reader` reads.
///
/// # Errors
/// Storage errors.
pub async fn runtimes(reader: &QueueReader) -> CliResult<Vec<RuntimeJson>> {
    Ok(WorkflowView::runtimes(reader.view())
        .await?
        .into_iter()
        .map(|r| RuntimeJson {
            queue_name: r.queue_name,
            memo_prefix: r.memo_prefix,
            crate_version: r.crate_version,
            started_at_ms: r.started_at_ms,
            stopped_at_ms: r.stopped_at_ms,
        })
        .collect())
}

/// Job counts per queue of the store `reader` reads, and the first
/// [`DEAD_LETTERS_SHOWN`] dead letters of each.
///
/// # Errors
/// Storage errors.
pub async fn queues(reader: &QueueReader) -> CliResult<(Vec<QueueJson>, Vec<DeadLetterJson>)> {
    let view = reader.view();
    let mut queues = Vec::new();
    let mut dead_letters = Vec::new();
    for name in view.list_queues().await? {
        let stats = view.stats(&name).await?;
        if stats.dead > 0 {
            for job in view.dead_jobs(&name, None, DEAD_LETTERS_SHOWN).await? {
                dead_letters.push(DeadLetterJson {
                    queue: name.clone(),
                    run_id: job.headers.get(HEADER_RUN_ID).cloned(),
                    job_id: job.id,
                    attempts: job.attempts,
                    max_attempts: job.max_attempts,
                    last_error: job.last_error,
                });
            }
        }
        queues.push(QueueJson {
            queue: name,
            pending: stats.pending,
            scheduled: stats.scheduled,
            claimed: stats.claimed,
            done: stats.done,
            dead: stats.dead,
        });
    }
    Ok((queues, dead_letters))
}

/// Objects and bytes per top-level prefix, and the entries passed over:
/// a local directory is walked without following links (a link, a FIFO,
/// a socket is passed over, never followed or opened), any other store
/// listed.
async fn sizes(target: &Target) -> CliResult<(Vec<PrefixJson>, u64)> {
    let mut by_prefix: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut passed_over = 0;
    match &target.location {
        Location::Dir(root) => {
            let dir = root.clone();
            let failed = |e: &dyn std::fmt::Display| {
                CliError::Refused(format!(
                    "cannot walk the store directory {}: {e}",
                    root.display()
                ))
            };
            let walked = tokio::task::spawn_blocking(move || walk(&dir))
                .await
                .map_err(|e| failed(&e))?
                .map_err(|e| failed(&e))?;
            for (prefix, size) in walked.files {
                let entry = by_prefix.entry(prefix).or_default();
                entry.0 += 1;
                entry.1 += size;
            }
            passed_over = walked.passed_over;
        }
        Location::S3 { .. } => {
            let mut listing = target.store.list(None);
            while let Some(meta) = listing.try_next().await? {
                let path = meta.location.as_ref();
                let prefix = match path.split_once('/') {
                    Some((top, _)) => top.to_string(),
                    None => String::new(),
                };
                let entry = by_prefix.entry(prefix).or_default();
                entry.0 += 1;
                entry.1 += meta.size;
            }
        }
    }
    let prefixes = by_prefix
        .into_iter()
        .map(|(prefix, (objects, bytes))| PrefixJson {
            prefix,
            objects,
            bytes,
        })
        .collect();
    Ok((prefixes, passed_over))
}

/// The regular files of a directory tree, by top-level prefix with their
/// sizes, and the entries that are not regular files or directories.
#[derive(Debug, Default)]
struct Walked {
    files: Vec<(String, u64)>,
    passed_over: u64,
}

/// Directories deeper than this are not walked (counted as passed over).
const MAX_WALK_DEPTH: usize = 64;

/// Walk `root` without following links.
fn walk(root: &std::path::Path) -> std::io::Result<Walked> {
    let mut walked = Walked::default();
    let mut dirs = vec![(root.to_path_buf(), None::<String>, 0)];
    while let Some((dir, top, depth)) = dirs.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if depth == 0 => return Err(e),
            Err(_) => {
                walked.passed_over += 1;
                continue;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else {
                walked.passed_over += 1;
                continue;
            };
            // `DirEntry::file_type` and `metadata` do not follow links.
            let Ok(kind) = entry.file_type() else {
                walked.passed_over += 1;
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            if kind.is_dir() && depth < MAX_WALK_DEPTH {
                let top = top.clone().unwrap_or_else(|| name.clone());
                dirs.push((entry.path(), Some(top), depth + 1));
            } else if kind.is_file() {
                let size = entry.metadata().map_or(0, |m| m.len());
                walked.files.push((top.clone().unwrap_or_default(), size));
            } else {
                walked.passed_over += 1;
            }
        }
    }
    Ok(walked)
}

/// `bytes` in binary units: `812 B`, `3.4 KiB`, `12.0 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn objects(n: u64) -> String {
    if n == 1 {
        "1 object".to_string()
    } else {
        format!("{n} objects")
    }
}

fn card(json: &StoreInfoJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Store", &json.store)
        .field("Queue path", &json.db);
    card.field(
        "Size",
        format!(
            "{} in {}",
            bytes(json.total_bytes),
            objects(json.total_objects)
        ),
    );
    let w = &json.writer;
    card.field("Writer epoch", w.epoch.to_string());
    card.field("Durable sequence", w.durable_seq.to_string());
    card.field(
        "Last commit",
        match &w.newest_wal {
            Some(wal) => format!(
                "{} (the newest write-ahead log object, {})",
                times.at(wal.at_ms),
                wal.path
            ),
            None => "none in the write-ahead log".to_string(),
        },
    );
    card.field(
        "Last flush",
        w.last_flush_at_ms.map_or_else(
            || "none recorded".to_string(),
            |ms| {
                format!(
                    "{} (the newest table in the manifest: it lags the commits)",
                    times.at(ms)
                )
            },
        ),
    );
    card.field(
        "Heartbeat",
        match &w.heartbeat {
            None => "none (the writer does not write liveness beats)".to_string(),
            Some(beat) => format!(
                "{} (every {}{}, epoch {})",
                times.at(beat.at_ms),
                short_duration(beat.interval_ms),
                if beat.closed { ", closed cleanly" } else { "" },
                beat.writer_epoch
            ),
        },
    );
    card.section(
        "Runtimes",
        if json.runtimes.is_empty() {
            vec!["none recorded (a store written before runtimes recorded themselves: pass --queue and --memo-prefix)".to_string()]
        } else {
            json.runtimes
                .iter()
                .map(|r| {
                    format!(
                        "{}: memo prefix {}, worker started {}{} (taquba-workflow {})",
                        r.queue_name,
                        r.memo_prefix,
                        times.at(r.started_at_ms),
                        r.stopped_at_ms
                            .map(|at| format!(", stopped cleanly {}", times.at(at)))
                            .unwrap_or_default(),
                        r.crate_version
                    )
                })
                .collect()
        },
    );
    let mut queue_lines = Vec::new();
    if json.queues.is_empty() {
        queue_lines.push("no jobs yet".to_string());
    }
    for q in &json.queues {
        queue_lines.push(format!(
            "{}: {} pending, {} scheduled, {} claimed, {} done, {} dead",
            q.queue, q.pending, q.scheduled, q.claimed, q.done, q.dead
        ));
    }
    card.section("Queues", queue_lines);
    if !json.dead_letters.is_empty() {
        card.section(
            "Dead letters",
            json.dead_letters
                .iter()
                .map(|d| {
                    format!(
                        "{} {}{} after {}/{} attempts: {}",
                        d.queue,
                        d.job_id,
                        d.run_id
                            .as_deref()
                            .map(|r| format!(" (run {r})"))
                            .unwrap_or_default(),
                        d.attempts,
                        d.max_attempts,
                        d.last_error.as_deref().unwrap_or("no error recorded")
                    )
                })
                .collect(),
        );
    }
    card.section(
        "Objects",
        json.prefixes
            .iter()
            .map(|p| {
                let name = if p.prefix.is_empty() {
                    "(top level)".to_string()
                } else {
                    format!("{}/", p.prefix)
                };
                format!("{name}: {} in {}", bytes(p.bytes), objects(p.objects))
            })
            .chain((json.passed_over > 0).then(|| {
                format!(
                    "{} entries that are not regular files (links, FIFOs, sockets): not counted, not followed",
                    json.passed_over
                )
            }))
            .collect(),
    );
    card
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(bytes(812), "812 B");
        assert_eq!(bytes(3 * 1024 + 400), "3.4 KiB");
        assert_eq!(bytes(12 * 1024 * 1024), "12.0 MiB");
    }
}
