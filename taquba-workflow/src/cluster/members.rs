//! Members: which processes of a cluster are alive, judged without
//! comparing clocks.
//!
//! Every process running with bucket leases rewrites its member record,
//! `{root}/members/{node}`, once per beat (a plain put; only its writer
//! writes it). An observer lists the records and notes, on its own
//! monotonic clock, when each one last changed (its e-tag or its
//! version); a member whose record has not changed for longer than the
//! lease time is dead. A clean shutdown deletes the record, so a process
//! that left is gone at the next listing.
//!
//! Which live member should hold a shard is rendezvous hashing
//! ([`preferred_member`]): every observer that sees the same members
//! computes the same owner, and a member joining or leaving moves only
//! the shards it wins or held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tokio::time::Instant;

use super::ClusterError;

/// The prefix of the cluster's member records: `{root}/members`.
pub fn members_prefix(root: &str) -> String {
    let root = root.trim_matches('/');
    if root.is_empty() {
        "members".to_string()
    } else {
        format!("{root}/members")
    }
}

/// What a member writes every beat (MessagePack with named fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// The process's node id.
    pub node: String,
    /// Beats written, increasing.
    pub beat: u64,
    /// The interval between its beats, ms.
    pub interval_ms: u64,
    /// The shards it held at the beat.
    pub shards: Vec<u32>,
    /// When the beat was written, ms since the UNIX epoch, on the member's
    /// clock (for display only).
    pub at_ms: u64,
}

/// The member records of the cluster at `root` (the CLI's read), by node.
/// Records that do not decode are skipped.
///
/// # Errors
/// [`ClusterError::Store`] when the store fails.
pub async fn read_members(
    store: &Arc<dyn ObjectStore>,
    root: &str,
) -> Result<Vec<MemberRecord>, ClusterError> {
    let prefix = Path::from(members_prefix(root));
    let metas: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    let mut members = Vec::new();
    for meta in metas {
        match store.get(&meta.location).await {
            Ok(got) => {
                if let Ok(record) = rmp_serde::from_slice::<MemberRecord>(&got.bytes().await?) {
                    members.push(record);
                }
            }
            Err(taquba::object_store::Error::NotFound { .. }) => {}
            Err(err) => return Err(err.into()),
        }
    }
    members.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(members)
}

/// This process's member record writer.
pub(crate) struct Beat {
    store: Arc<dyn ObjectStore>,
    path: Path,
    node: String,
    interval: Duration,
    beat: u64,
}

impl Beat {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        root: &str,
        node: &str,
        interval: Duration,
    ) -> Self {
        Self {
            store,
            path: Path::from(format!("{}/{node}", members_prefix(root))),
            node: node.to_string(),
            interval,
            beat: 0,
        }
    }

    /// Write the next beat.
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn beat(&mut self, shards: Vec<u32>) -> Result<(), ClusterError> {
        self.beat += 1;
        let record = MemberRecord {
            node: self.node.clone(),
            beat: self.beat,
            interval_ms: u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX),
            shards,
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let bytes = rmp_serde::to_vec_named(&record).map_err(|err| ClusterError::Corrupt {
            path: self.path.to_string(),
            reason: err.to_string(),
        })?;
        self.store
            .put(&self.path, PutPayload::from(Bytes::from(bytes)))
            .await?;
        Ok(())
    }

    /// Delete the record (a clean shutdown: the process left).
    ///
    /// # Errors
    /// Storage errors other than an absent record.
    pub(crate) async fn leave(&self) -> Result<(), ClusterError> {
        match self.store.delete(&self.path).await {
            Ok(()) | Err(taquba::object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}

/// An observer's memory of the member records: when each last changed on
/// the observer's monotonic clock.
pub(crate) struct Liveness {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    lease: Duration,
    seen: BTreeMap<String, Seen>,
    /// Members whose record was seen and then deleted (a clean leave).
    left: BTreeSet<String>,
    /// The first listing.
    started: Option<Instant>,
    /// The last listing. Deaths are judged up to it, not up to now: an
    /// observer that could not look for a while (its store down, its task
    /// late) learns nothing about the others meanwhile.
    observed: Option<Instant>,
}

struct Seen {
    /// What identifies the record's current version (e-tag, version, size
    /// and modification time).
    version: String,
    changed_at: Instant,
}

impl Liveness {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, root: &str, lease: Duration) -> Self {
        Self {
            store,
            prefix: Path::from(members_prefix(root)),
            lease,
            seen: BTreeMap::new(),
            left: BTreeSet::new(),
            started: None,
            observed: None,
        }
    }

    /// List the records and note which changed; returns the live members
    /// (those whose record changed within the lease time, counted from
    /// when this observer first saw it).
    ///
    /// # Errors
    /// Storage errors (the observer's memory is kept).
    pub(crate) async fn observe(&mut self) -> Result<BTreeSet<String>, ClusterError> {
        let metas: Vec<_> = self.store.list(Some(&self.prefix)).try_collect().await?;
        let now = Instant::now();
        self.started.get_or_insert(now);
        let mut present = BTreeSet::new();
        for meta in metas {
            let Some(node) = meta.location.filename().map(str::to_string) else {
                continue;
            };
            let version = format!(
                "{:?}/{:?}/{}/{}",
                meta.e_tag,
                meta.version,
                meta.size,
                meta.last_modified.timestamp_nanos_opt().unwrap_or_default()
            );
            match self.seen.get_mut(&node) {
                Some(seen) if seen.version == version => {}
                Some(seen) => {
                    seen.version = version;
                    seen.changed_at = now;
                }
                None => {
                    self.seen.insert(
                        node.clone(),
                        Seen {
                            version,
                            changed_at: now,
                        },
                    );
                }
            }
            present.insert(node);
        }
        // A deleted record: the member left.
        let left: Vec<String> = self
            .seen
            .keys()
            .filter(|node| !present.contains(*node))
            .cloned()
            .collect();
        for node in left {
            self.seen.remove(&node);
            self.left.insert(node);
        }
        self.left.retain(|node| !present.contains(node));
        self.observed = Some(now);
        Ok(self
            .seen
            .keys()
            .filter(|node| !self.is_dead(node))
            .cloned()
            .collect())
    }

    /// Whether `node` is dead: its record stayed the same over this
    /// observer's listings for longer than the lease time (on this
    /// observer's monotonic clock, up to its last listing), was deleted
    /// (it left), or was absent from a lease time of listings (a member
    /// that never beat, or whose record this observer has not listed yet,
    /// is given that long). Before any listing nobody is dead.
    pub(crate) fn is_dead(&self, node: &str) -> bool {
        let Some(observed) = self.observed else {
            return false;
        };
        match self.seen.get(node) {
            Some(seen) => observed.saturating_duration_since(seen.changed_at) > self.lease,
            None if self.left.contains(node) => true,
            None => self
                .started
                .is_some_and(|started| observed.saturating_duration_since(started) > self.lease),
        }
    }
}

/// The live member that should hold `shard`: the one with the highest
/// SHA-256 of `{node}/{shard}` (rendezvous hashing), `None` when there are
/// no members.
pub fn preferred_member<'a>(
    shard: u32,
    members: impl IntoIterator<Item = &'a String>,
) -> Option<&'a String> {
    members.into_iter().max_by_key(|node| {
        let digest = Sha256::digest(format!("{node}/{shard}").as_bytes());
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(head), node.as_str())
    })
}

#[cfg(test)]
mod tests {
    use taquba::object_store::memory::InMemory;

    use super::*;

    #[test]
    fn rendezvous_spreads_shards_and_moves_few() {
        let three: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut counts = BTreeMap::new();
        for shard in 0..64 {
            *counts
                .entry(preferred_member(shard, &three).unwrap().clone())
                .or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|&n| n >= 10), "{counts:?}");
        // `c` leaves: only its shards move.
        let two: Vec<String> = three[..2].to_vec();
        for shard in 0..64 {
            let before = preferred_member(shard, &three).unwrap();
            let after = preferred_member(shard, &two).unwrap();
            if before != "c" {
                assert_eq!(before, after, "shard {shard} moved");
            }
        }
        assert_eq!(preferred_member(0, &Vec::<String>::new()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_whose_record_stops_changing_is_dead_after_the_lease() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let lease = Duration::from_secs(10);
        let mut a = Beat::new(store.clone(), "c", "a", Duration::from_secs(1));
        let mut b = Beat::new(store.clone(), "c", "b", Duration::from_secs(1));
        let mut watch = Liveness::new(store.clone(), "c", lease);
        a.beat(vec![0]).await.unwrap();
        b.beat(vec![1]).await.unwrap();
        let live = watch.observe().await.unwrap();
        assert_eq!(live, ["a", "b"].map(String::from).into());
        // `a` goes on beating, `b` stops.
        for _ in 0..11 {
            tokio::time::advance(Duration::from_secs(1)).await;
            a.beat(vec![0]).await.unwrap();
            watch.observe().await.unwrap();
        }
        let live = watch.observe().await.unwrap();
        assert_eq!(live, ["a"].map(String::from).into());
        assert!(watch.is_dead("b") && !watch.is_dead("a"));
        // An observer that stops looking judges nobody dead meanwhile.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!watch.is_dead("a"), "not observed since");
        // A member never seen is given a lease time.
        assert!(watch.is_dead("never"), "watched for over a lease already");
        let mut fresh = Liveness::new(store.clone(), "c", lease);
        fresh.observe().await.unwrap();
        assert!(!fresh.is_dead("unseen-yet"));
        // `a` leaves cleanly: gone at once.
        a.leave().await.unwrap();
        assert!(watch.observe().await.unwrap().is_empty());
        assert!(watch.is_dead("a"));
        let records = read_members(&store, "c").await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            (records[0].node.as_str(), records[0].shards.as_slice()),
            ("b", &[1][..])
        );
    }
}
