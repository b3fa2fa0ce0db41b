//! What moves when the owning process commits, read for the liveness
//! hints (`--wait` giving up, the dashboard's command page) and `store
//! info`: the durable sequence number (moves with every commit, no clock
//! involved), the newest object in the queue's write-ahead log (a commit
//! writes one, so its time is the last commit's, as the store's clock
//! stamps it) and the liveness heartbeat when the owner writes one. The
//! manifest's last flush is not among them: an owner that commits every
//! second can go minutes without a flush.

use taquba::QueueReader;
use taquba::object_store::path::Path;

use crate::error::CliResult;
use crate::output::{Times, short_duration};
use crate::present::store::WalObject;
use crate::session::Target;

/// The most write-ahead log objects listed to find the newest.
pub const MAX_WAL_LISTED: usize = 100_000;

/// The newest object under `{db_path}/wal/`, `None` when there is none.
///
/// # Errors
/// The listing's errors.
pub async fn newest_wal(target: &Target) -> CliResult<Option<WalObject>> {
    use futures_util::TryStreamExt;
    let dir = Path::from(format!("{}/wal", target.db_path));
    let mut listing = target.store.list(Some(&dir));
    let mut newest: Option<WalObject> = None;
    let mut listed = 0;
    while let Some(meta) = listing.try_next().await? {
        let at_ms = u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
        if newest.as_ref().is_none_or(|n| at_ms >= n.at_ms) {
            newest = Some(WalObject {
                path: meta.location.to_string(),
                at_ms,
            });
        }
        listed += 1;
        if listed == MAX_WAL_LISTED {
            break;
        }
    }
    Ok(newest)
}

/// The hint of a command still not applied after a wait during which the
/// durable sequence number went from `seq_before` to `reader`'s current
/// one: whether the owner commits, from what moves, naming each source.
///
/// # Errors
/// The heartbeat's and the listing's errors.
pub async fn owner_hint(
    target: &Target,
    reader: &QueueReader,
    seq_before: u64,
    times: &Times,
) -> CliResult<String> {
    let seq_now = reader.last_store_activity().durable_seq;
    let commits = if seq_now != seq_before {
        format!(
            "a writer is committing (the durable sequence number moved from {seq_before} to {seq_now} meanwhile): the owner runs, but has not applied the command (a backlog in its inbox, or it is not the runtime of this memo prefix)"
        )
    } else {
        format!("the durable sequence number did not move meanwhile (it is {seq_now})")
    };
    Ok(format!(
        "{commits}; {}",
        last_commit_hint(target, reader, times).await?
    ))
}

/// What says when the owner last committed, without watching: the newest
/// write-ahead log object and the heartbeat, each named.
///
/// # Errors
/// The heartbeat's and the listing's errors.
pub async fn last_commit_hint(
    target: &Target,
    reader: &QueueReader,
    times: &Times,
) -> CliResult<String> {
    let wal = match newest_wal(target).await? {
        Some(wal) => format!(
            "the newest write-ahead log object (the last commit) was written {}",
            times.at(wal.at_ms)
        ),
        None => "the write-ahead log holds no object".to_string(),
    };
    let beat = match reader.writer_heartbeat().await? {
        None => "no heartbeat is recorded".to_string(),
        Some(beat) if beat.closed => format!(
            "the last heartbeat, {}, is a clean close's",
            times.at(beat.at_ms)
        ),
        Some(beat) => format!(
            "the last heartbeat was {} (one every {})",
            times.at(beat.at_ms),
            short_duration(u64::try_from(beat.interval.as_millis()).unwrap_or(u64::MAX))
        ),
    };
    Ok(format!("{wal}; {beat}"))
}
