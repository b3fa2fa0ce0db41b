//! `store info` on a cluster root: the cluster record (shard count, hash,
//! format, creation) and, per shard, what `store info` shows of one store
//! that stays cheap with many shards: what its reader sees of the writer
//! (epoch, durable sequence number, newest write-ahead log object, last
//! flush, heartbeat), its owner (from the shard leases, once the cluster
//! records them: [`shard_owner`]), its runtimes and its job counts with the
//! first dead letters. Sizes per prefix are not walked here (`store info
//! --store ROOT/shards/K` shows one shard's).

use futures_util::StreamExt;

use crate::cluster::{ClusterSession, SHARD_CONCURRENCY, shard_owner};
use crate::commands::store_info::{queues, runtimes, writer};
use crate::error::CliResult;
use crate::output::{Card, Output, Table, Times, short_duration};
use crate::present::store::{ClusterInfoJson, ShardInfoJson};

/// `store info` on a cluster root.
///
/// # Errors
/// Storage and listing errors, naming the shard.
pub async fn info(cluster: &ClusterSession, out: &Output) -> CliResult<()> {
    let json = gather(cluster).await?;
    out.one(&json, |times| card(&json, times))
}

/// What `store info` shows of `cluster`, its shards read
/// [`SHARD_CONCURRENCY`] at a time.
///
/// # Errors
/// Storage and listing errors.
pub async fn gather(cluster: &ClusterSession) -> CliResult<ClusterInfoJson> {
    let reads: Vec<_> = (0..cluster.record.shards)
        .map(|k| gather_shard(cluster, k))
        .collect();
    let shards: Vec<CliResult<ShardInfoJson>> = futures_util::stream::iter(reads)
        .buffered(SHARD_CONCURRENCY)
        .collect()
        .await;
    Ok(ClusterInfoJson {
        store: cluster.location.to_string(),
        format: cluster.record.format,
        hash: cluster.record.hash.clone(),
        shard_count: cluster.record.shards,
        created_at_ms: cluster.record.created_at_ms,
        shards: shards.into_iter().collect::<CliResult<_>>()?,
    })
}

async fn gather_shard(cluster: &ClusterSession, k: u32) -> CliResult<ShardInfoJson> {
    let location = cluster
        .location
        .below(&taquba_workflow::cluster::shard_prefix("", k));
    let Some(shard) = cluster.shard(k) else {
        return Ok(ShardInfoJson {
            shard: k,
            location: location.to_string(),
            db: String::new(),
            open: false,
            owner: shard_owner(cluster, k).await,
            writer: None,
            runtimes: Vec::new(),
            queues: Vec::new(),
            dead_letters: Vec::new(),
        });
    };
    let session = &shard.session;
    let (queues, dead_letters) = queues(&session.reader).await?;
    Ok(ShardInfoJson {
        shard: k,
        location: session.target.location.to_string(),
        db: session.target.db_path.clone(),
        open: true,
        owner: shard_owner(cluster, k).await,
        writer: Some(writer(&session.target, &session.reader).await?),
        runtimes: runtimes(&session.reader).await?,
        queues,
        dead_letters,
    })
}

/// The table of shards: one row each, with its owner, what its reader
/// sees of the writer and its job counts (summed over its queues).
pub fn shard_table(json: &ClusterInfoJson, times: &Times) -> Table {
    let mut table = Table::new(&[
        "shard",
        "owner",
        "epoch",
        "durable seq",
        "last commit",
        "heartbeat",
        "pending",
        "scheduled",
        "claimed",
        "dead",
    ]);
    for shard in &json.shards {
        let Some(w) = &shard.writer else {
            table.row(vec![
                shard.shard.to_string(),
                shard.owner.clone(),
                "no queue yet".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]);
            continue;
        };
        let sum = |f: fn(&crate::present::store::QueueJson) -> i64| -> String {
            shard.queues.iter().map(f).sum::<i64>().to_string()
        };
        table.row(vec![
            shard.shard.to_string(),
            shard.owner.clone(),
            w.epoch.to_string(),
            w.durable_seq.to_string(),
            w.newest_wal
                .as_ref()
                .map_or_else(|| "none".to_string(), |wal| times.at(wal.at_ms)),
            match &w.heartbeat {
                None => "none".to_string(),
                Some(beat) => format!(
                    "{} (every {}{})",
                    times.at(beat.at_ms),
                    short_duration(beat.interval_ms),
                    if beat.closed { ", closed" } else { "" }
                ),
            },
            sum(|q| q.pending),
            sum(|q| q.scheduled),
            sum(|q| q.claimed),
            sum(|q| q.dead),
        ]);
    }
    table
}

fn card(json: &ClusterInfoJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Cluster", &json.store)
        .field("Shards", json.shard_count.to_string())
        .field("Hash", &json.hash)
        .field("Format", json.format.to_string())
        .field("Created", times.at(json.created_at_ms));
    let open = json.shards.iter().filter(|s| s.open).count();
    card.field(
        "Open shards",
        format!(
            "{open} of {} ({})",
            json.shard_count,
            if open == json.shards.len() {
                "every shard has a queue".to_string()
            } else {
                "a shard with no queue yet has never been opened by a process: it holds nothing"
                    .to_string()
            }
        ),
    );
    card.section(
        "Shards",
        shard_table(json, times)
            .render()
            .lines()
            .map(str::to_string)
            .collect(),
    );
    let runtimes: Vec<String> = json
        .shards
        .iter()
        .flat_map(|s| {
            s.runtimes.iter().map(move |r| {
                format!(
                    "shard {}: {} (memo prefix {}), worker started {}{} (taquba-workflow {})",
                    s.shard,
                    r.queue_name,
                    r.memo_prefix,
                    times.at(r.started_at_ms),
                    r.stopped_at_ms
                        .map(|at| format!(", stopped cleanly {}", times.at(at)))
                        .unwrap_or_default(),
                    r.crate_version
                )
            })
        })
        .collect();
    if !runtimes.is_empty() {
        card.section("Runtimes", runtimes);
    }
    let dead: Vec<String> = json
        .shards
        .iter()
        .flat_map(|s| {
            s.dead_letters.iter().map(move |d| {
                format!(
                    "shard {}: {} {}{} after {}/{} attempts: {}",
                    s.shard,
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
        })
        .collect();
    if !dead.is_empty() {
        card.section("Dead letters", dead);
    }
    card
}
