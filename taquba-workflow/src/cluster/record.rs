//! The cluster record: written once, with a create-if-absent put, when the
//! first process creates the cluster; read by every process after.

use std::num::NonZeroU32;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::ClusterError;
use super::route::{HASH_NAME, shard_of};

/// The format of the cluster record this build writes and reads.
pub const CLUSTER_FORMAT: u32 = 1;

/// The most shards a cluster may have. Each shard a process owns is a
/// whole store (its own SlateDB), so a cluster is sized for the processes
/// it will ever run, not for its runs.
pub const MAX_SHARDS: u32 = 1024;

/// The path of the cluster record of the cluster at `root`:
/// `{root}/cluster` (`cluster` for an empty root).
pub fn cluster_record_path(root: &str) -> Path {
    let root = root.trim_matches('/');
    if root.is_empty() {
        Path::from("cluster")
    } else {
        Path::from(format!("{root}/cluster"))
    }
}

/// A cluster's fixed layout, as its record stores it (MessagePack with
/// named fields at [`cluster_record_path`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// The record's format ([`CLUSTER_FORMAT`]).
    pub format: u32,
    /// The number of shards, fixed at creation.
    pub shards: u32,
    /// The routing hash ([`HASH_NAME`]).
    pub hash: String,
    /// When the cluster was created, ms since the UNIX epoch (the creating
    /// process's clock; informational).
    pub created_at_ms: u64,
}

impl ClusterRecord {
    /// The cluster at `root` in `store` with `shards` shards: created when
    /// there is none (the record written with a create-if-absent put, so of
    /// processes creating it at once exactly one record is written and
    /// every process reads that one), else the existing one, checked.
    ///
    /// # Cancel safety
    ///
    /// One conditional put, then a read: dropped at any await, the record
    /// is absent or whole.
    ///
    /// # Errors
    /// [`ClusterError::InvalidShardCount`] outside `1..=`[`MAX_SHARDS`];
    /// [`ClusterError::ShardCountMismatch`] when the cluster exists with
    /// another count; [`ClusterError::Unsupported`] and
    /// [`ClusterError::Corrupt`] for a record this build cannot use;
    /// [`ClusterError::Store`] when the store fails.
    pub async fn create_or_open(
        store: Arc<dyn ObjectStore>,
        root: &str,
        shards: u32,
    ) -> Result<Self, ClusterError> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(ClusterError::InvalidShardCount {
                shards,
                max: MAX_SHARDS,
            });
        }
        let record = Self {
            format: CLUSTER_FORMAT,
            shards,
            hash: HASH_NAME.to_string(),
            created_at_ms: now_ms(),
        };
        let path = cluster_record_path(root);
        let bytes = rmp_serde::to_vec_named(&record).map_err(|err| ClusterError::Corrupt {
            path: path.to_string(),
            reason: err.to_string(),
        })?;
        let created = store
            .put_opts(
                &path,
                PutPayload::from(Bytes::from(bytes)),
                PutOptions::from(PutMode::Create),
            )
            .await;
        match created {
            Ok(_) => Ok(record),
            Err(taquba::object_store::Error::AlreadyExists { .. }) => {
                let existing =
                    Self::open(store, root)
                        .await?
                        .ok_or_else(|| ClusterError::Corrupt {
                            path: path.to_string(),
                            reason: "it existed for the create and was gone for the read".into(),
                        })?;
                if existing.shards != shards {
                    return Err(ClusterError::ShardCountMismatch {
                        root: root.to_string(),
                        stored: existing.shards,
                        requested: shards,
                    });
                }
                Ok(existing)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// The cluster record at `root`, or `None` when there is no cluster
    /// there (a reader's, a tool's).
    ///
    /// # Errors
    /// [`ClusterError::Unsupported`] and [`ClusterError::Corrupt`] for a
    /// record this build cannot use; [`ClusterError::Store`].
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        root: &str,
    ) -> Result<Option<Self>, ClusterError> {
        let path = cluster_record_path(root);
        let bytes = match store.get(&path).await {
            Ok(found) => found.bytes().await?,
            Err(taquba::object_store::Error::NotFound { .. }) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let record: Self = rmp_serde::from_slice(&bytes).map_err(|err| ClusterError::Corrupt {
            path: path.to_string(),
            reason: err.to_string(),
        })?;
        if record.format != CLUSTER_FORMAT || record.hash != HASH_NAME {
            return Err(ClusterError::Unsupported {
                path: path.to_string(),
                format: record.format,
                hash: record.hash,
            });
        }
        if record.shards == 0 || record.shards > MAX_SHARDS {
            return Err(ClusterError::Corrupt {
                path: path.to_string(),
                reason: format!("a shard count of {}", record.shards),
            });
        }
        Ok(Some(record))
    }

    /// The shard count, non-zero (checked when the record was read or
    /// made).
    pub fn shard_count(&self) -> NonZeroU32 {
        NonZeroU32::new(self.shards).unwrap_or(NonZeroU32::MIN)
    }

    /// The shard of the plain run (or keyed job) `run_id`
    /// ([`shard_of`](super::shard_of)).
    pub fn shard_of(&self, run_id: &str) -> u32 {
        shard_of(run_id, self.shard_count())
    }

    /// A fresh run id (a ULID) that routes to shard `shard`: what a fork
    /// made in that shard is named (see
    /// [`ClusterRuntime::fork`](super::ClusterRuntime::fork)). Each draw
    /// lands there with probability 1/N; after 64 N draws (a miss less
    /// likely than 1 in e^64) the last one is returned whatever its shard.
    pub fn new_run_id_on(&self, shard: u32) -> crate::RunId {
        let draws = 64 * self.shard_count().get();
        let mut id = ulid::Ulid::new().to_string();
        for _ in 0..draws {
            if self.shard_of(&id) == shard {
                break;
            }
            id = ulid::Ulid::new().to_string();
        }
        crate::RunId::new(id).unwrap_or_else(|_| unreachable!("a ULID is a valid run id"))
    }

    /// The shard of group `group_id`, which holds the group's manifest and
    /// every member's run: a group never spans shards.
    pub fn shard_of_group(&self, group_id: &str) -> u32 {
        shard_of(group_id, self.shard_count())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use taquba::object_store::local::LocalFileSystem;
    use taquba::object_store::memory::InMemory;

    use super::*;

    #[tokio::test]
    async fn the_first_creation_fixes_the_shard_count() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let made = ClusterRecord::create_or_open(store.clone(), "prod", 8)
            .await
            .expect("created");
        assert_eq!(
            (made.format, made.shards, made.hash.as_str()),
            (1, 8, HASH_NAME)
        );
        let again = ClusterRecord::create_or_open(store.clone(), "prod/", 8)
            .await
            .expect("opened");
        assert_eq!(again, made);
        let err = ClusterRecord::create_or_open(store.clone(), "prod", 16)
            .await
            .expect_err("another count");
        assert!(
            matches!(
                err,
                ClusterError::ShardCountMismatch {
                    stored: 8,
                    requested: 16,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("has 8 shards, not 16"), "{err}");
        assert_eq!(
            ClusterRecord::open(store.clone(), "prod")
                .await
                .expect("read"),
            Some(made)
        );
        assert_eq!(
            ClusterRecord::open(store, "other").await.expect("read"),
            None
        );
    }

    #[tokio::test]
    async fn of_concurrent_creations_with_different_counts_one_wins() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let attempts = (1..=16).map(|shards| {
            let store = store.clone();
            tokio::spawn(async move { ClusterRecord::create_or_open(store, "race", shards).await })
        });
        let mut won = Vec::new();
        for attempt in attempts {
            match attempt.await.expect("task") {
                Ok(record) => won.push(record.shards),
                Err(ClusterError::ShardCountMismatch { .. }) => {}
                Err(other) => panic!("unexpected: {other}"),
            }
        }
        assert_eq!(won.len(), 1, "exactly one count is the cluster's: {won:?}");
        let stored = ClusterRecord::open(store, "race")
            .await
            .expect("read")
            .expect("a record");
        assert_eq!(stored.shards, won[0]);
    }

    #[tokio::test]
    async fn bad_counts_and_foreign_records_are_refused_by_name() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        for shards in [0, MAX_SHARDS + 1] {
            let err = ClusterRecord::create_or_open(store.clone(), "c", shards)
                .await
                .expect_err("refused");
            assert!(err.to_string().contains(&shards.to_string()), "{err}");
        }
        store
            .put(
                &cluster_record_path("junk"),
                PutPayload::from_static(b"\xffnot msgpack"),
            )
            .await
            .expect("put");
        let err = ClusterRecord::open(store.clone(), "junk")
            .await
            .expect_err("corrupt");
        assert!(matches!(err, ClusterError::Corrupt { .. }), "{err}");
        let later = ClusterRecord {
            format: 2,
            shards: 4,
            hash: "xxh3".into(),
            created_at_ms: 0,
        };
        store
            .put(
                &cluster_record_path("later"),
                PutPayload::from(rmp_serde::to_vec_named(&later).expect("encode")),
            )
            .await
            .expect("put");
        let err = ClusterRecord::create_or_open(store, "later", 4)
            .await
            .expect_err("unsupported");
        assert!(
            matches!(err, ClusterError::Unsupported { format: 2, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_local_directory_creates_the_record_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).expect("local store"));
        ClusterRecord::create_or_open(store.clone(), "c", 4)
            .await
            .expect("created");
        let err = ClusterRecord::create_or_open(store, "c", 5)
            .await
            .expect_err("fixed");
        assert!(
            matches!(err, ClusterError::ShardCountMismatch { stored: 4, .. }),
            "{err}"
        );
    }
}
