//! Shard leases: one compare-and-set object per shard saying which process
//! holds it, at which epoch.
//!
//! A lease is SlateDB's own transactional object (`slatedb-txn-obj`, the
//! primitive its manifest is built on): each version is a file
//! `{root}/leases/{k}/{version:020}.lease` written with a create-if-absent
//! put, so two processes that read version `v` and both write `v + 1`
//! cannot both succeed, on a bucket and on a local directory alike. A
//! record holds the holder (a process's node id, or none), the epoch (bumped
//! by every take, never lowered) and the state.
//!
//! A lease is not renewed: whether its holder is alive is judged from the
//! holder's member record (see `members`), on the observer's monotonic
//! clock. What makes a take safe is the order of the taker (bump the epoch,
//! then open the shard's queue, which fences the old writer in SlateDB)
//! and the holder's check of its epoch before it trusts the shard again.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use slatedb_txn_obj::object_store::ObjectStoreSequencedStorageProtocol;
use slatedb_txn_obj::{
    ObjectCodec, SimpleTransactionalObject, TransactionalObject, TransactionalObjectError,
};
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;

use super::ClusterError;

/// The file suffix of a lease's versions.
const LEASE_SUFFIX: &str = "lease";

/// Whether a shard's lease is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// No process holds the shard: the last holder released it (or none
    /// ever took it).
    Free,
    /// [`LeaseRecord::holder`] holds the shard.
    Held,
}

/// One version of a shard's lease (MessagePack with named fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The shard.
    pub shard: u32,
    /// Bumped by every take; a holder whose epoch is below it lost the
    /// shard.
    pub epoch: u64,
    /// The node id of the process holding the shard (kept after a release,
    /// for the operator: who held it last).
    pub holder: Option<String>,
    /// Held or free.
    pub state: LeaseState,
    /// When this version was written, ms since the UNIX epoch, on the
    /// writer's clock (for display only; no decision reads it).
    pub at_ms: u64,
}

impl LeaseRecord {
    /// Whether `node` holds the shard at `epoch`.
    pub fn is_held_by(&self, node: &str, epoch: u64) -> bool {
        self.state == LeaseState::Held
            && self.epoch == epoch
            && self.holder.as_deref() == Some(node)
    }
}

struct Codec;

impl ObjectCodec<LeaseRecord> for Codec {
    fn encode(&self, value: &LeaseRecord) -> Bytes {
        // A record of plain fields always encodes.
        Bytes::from(rmp_serde::to_vec_named(value).unwrap_or_default())
    }

    fn decode(
        &self,
        bytes: &Bytes,
    ) -> std::result::Result<LeaseRecord, Box<dyn std::error::Error + Send + Sync>> {
        Ok(rmp_serde::from_slice(bytes)?)
    }
}

/// The directory of shard `shard`'s lease versions: `{root}/leases/{k}`.
pub fn lease_dir(root: &str, shard: u32) -> String {
    let root = root.trim_matches('/');
    if root.is_empty() {
        format!("leases/{shard}")
    } else {
        format!("{root}/leases/{shard}")
    }
}

fn protocol(
    store: Arc<dyn ObjectStore>,
    root: &str,
    shard: u32,
) -> Arc<ObjectStoreSequencedStorageProtocol<LeaseRecord>> {
    let root = root.trim_matches('/');
    let leases = match root.is_empty() {
        true => "leases".to_string(),
        false => format!("{root}/leases"),
    };
    // One path part per shard (a part with a `/` would be escaped).
    Arc::new(ObjectStoreSequencedStorageProtocol::new(
        &Path::from(leases),
        store,
        &shard.to_string(),
        LEASE_SUFFIX,
        Box::new(Codec),
    ))
}

fn lease_error(shard: u32, err: TransactionalObjectError) -> ClusterError {
    match err {
        TransactionalObjectError::ObjectStoreError(err) => ClusterError::Store(err),
        err => ClusterError::Lease {
            shard,
            reason: match &err {
                TransactionalObjectError::CallbackError(inner) => {
                    format!("a lease version does not decode: {inner}")
                }
                other => other.to_string(),
            },
        },
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The latest lease record of shard `shard` of the cluster at `root`, or
/// `None` when no process ever took it (the CLI's and dashboard's read).
///
/// # Errors
/// [`ClusterError::Store`] when the store fails; [`ClusterError::Lease`]
/// for a version that does not decode.
pub async fn read_lease(
    store: Arc<dyn ObjectStore>,
    root: &str,
    shard: u32,
) -> Result<Option<LeaseRecord>, ClusterError> {
    let object = SimpleTransactionalObject::<LeaseRecord>::try_load(protocol(store, root, shard))
        .await
        .map_err(|err| lease_error(shard, err))?;
    Ok(object.map(|object| object.object().clone()))
}

/// A process's handle on one shard's lease: the latest version it read,
/// and the compare-and-set writes that move it.
pub(crate) struct ShardLease {
    shard: u32,
    object: SimpleTransactionalObject<LeaseRecord>,
}

impl ShardLease {
    /// The lease of `shard`, created free when no process ever took it.
    ///
    /// # Errors
    /// Storage errors; a version that does not decode.
    pub(crate) async fn open(
        store: Arc<dyn ObjectStore>,
        root: &str,
        shard: u32,
    ) -> Result<Self, ClusterError> {
        let protocol = protocol(store, root, shard);
        let loaded = SimpleTransactionalObject::<LeaseRecord>::try_load(protocol.clone())
            .await
            .map_err(|err| lease_error(shard, err))?;
        let object = match loaded {
            Some(object) => object,
            None => {
                let free = LeaseRecord {
                    shard,
                    epoch: 0,
                    holder: None,
                    state: LeaseState::Free,
                    at_ms: now_ms(),
                };
                match SimpleTransactionalObject::init(protocol.clone(), free).await {
                    Ok(object) => object,
                    // Another process created it first: read theirs.
                    Err(err) if err.is_sequenced_write_conflict() => {
                        SimpleTransactionalObject::load(protocol)
                            .await
                            .map_err(|err| lease_error(shard, err))?
                    }
                    Err(err) => return Err(lease_error(shard, err)),
                }
            }
        };
        Ok(Self { shard, object })
    }

    /// The latest version this handle read or wrote.
    pub(crate) fn record(&self) -> &LeaseRecord {
        self.object.object()
    }

    /// Read the latest version.
    ///
    /// # Errors
    /// Storage errors; a version that does not decode.
    pub(crate) async fn refresh(&mut self) -> Result<&LeaseRecord, ClusterError> {
        let shard = self.shard;
        self.object
            .refresh()
            .await
            .map_err(|err| lease_error(shard, err))
    }

    /// Take the shard for `node` from the version last read: the epoch
    /// bumped, `node` the holder. `Ok(Some(epoch))` when this write won;
    /// `Ok(None)` when another process wrote a version first (the handle
    /// then holds the latest version: judge again).
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn take(&mut self, node: &str) -> Result<Option<u64>, ClusterError> {
        let current = self.record().clone();
        let epoch = current.epoch + 1;
        let next = LeaseRecord {
            shard: self.shard,
            epoch,
            holder: Some(node.to_string()),
            state: LeaseState::Held,
            at_ms: now_ms(),
        };
        match self.write(next).await? {
            true => Ok(Some(epoch)),
            false => Ok(None),
        }
    }

    /// Release the shard `node` holds at `epoch`: `Ok(true)` when written;
    /// `Ok(false)` when the lease is no longer `node`'s at `epoch` (another
    /// process took it: nothing to release).
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn release(&mut self, node: &str, epoch: u64) -> Result<bool, ClusterError> {
        loop {
            if !self.record().is_held_by(node, epoch) {
                return Ok(false);
            }
            let next = LeaseRecord {
                state: LeaseState::Free,
                at_ms: now_ms(),
                ..self.record().clone()
            };
            if self.write(next).await? {
                return Ok(true);
            }
        }
    }

    /// Write `next` over the version last read; `false` (and the latest
    /// version read) when another version came first.
    async fn write(&mut self, next: LeaseRecord) -> Result<bool, ClusterError> {
        let shard = self.shard;
        let mut dirty = self
            .object
            .prepare_dirty()
            .map_err(|err| lease_error(shard, err))?;
        dirty.value = next;
        match self.object.update(dirty).await {
            Ok(()) => Ok(true),
            Err(err) if err.is_sequenced_write_conflict() => {
                self.refresh().await?;
                Ok(false)
            }
            Err(err) => Err(lease_error(shard, err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use taquba::object_store::local::LocalFileSystem;
    use taquba::object_store::memory::InMemory;

    use super::*;

    async fn takes_and_releases(store: Arc<dyn ObjectStore>) {
        assert_eq!(read_lease(store.clone(), "c", 2).await.unwrap(), None);
        let mut a = ShardLease::open(store.clone(), "c", 2).await.unwrap();
        assert_eq!(a.record().state, LeaseState::Free);
        let mut b = ShardLease::open(store.clone(), "c", 2).await.unwrap();
        let epoch = a.take("a").await.unwrap().expect("a takes the free shard");
        assert_eq!(epoch, 1);
        // b read the free version: its take loses, and it then sees a's.
        assert_eq!(b.take("b").await.unwrap(), None);
        assert!(b.record().is_held_by("a", 1));
        // b takes over (a judged dead): the epoch is bumped.
        assert_eq!(b.take("b").await.unwrap(), Some(2));
        // a's release at its old epoch writes nothing.
        a.refresh().await.unwrap();
        assert!(!a.release("a", 1).await.unwrap());
        assert!(b.release("b", 2).await.unwrap());
        let last = read_lease(store, "c", 2).await.unwrap().expect("a lease");
        assert_eq!(
            (last.epoch, last.holder.as_deref(), last.state),
            (2, Some("b"), LeaseState::Free)
        );
    }

    #[tokio::test]
    async fn a_lease_is_taken_once_per_version_in_memory() {
        takes_and_releases(Arc::new(InMemory::new())).await;
    }

    #[tokio::test]
    async fn a_lease_is_taken_once_per_version_on_a_local_directory() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        takes_and_releases(store).await;
        assert!(dir.path().join("c/leases/2").is_dir());
    }

    /// Of many processes taking a shard at once, no two win the same
    /// version: every winner bumped the epoch by one from the version it
    /// read, on each store whose create-if-absent is atomic.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_takes_never_share_an_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let stores: [Arc<dyn ObjectStore>; 2] = [
            Arc::new(InMemory::new()),
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap()),
        ];
        for store in stores {
            let mut tasks = Vec::new();
            for i in 0..12 {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    let mut lease = ShardLease::open(store, "race", 0).await.unwrap();
                    lease.take(&format!("n{i}")).await.unwrap()
                }));
            }
            let mut winners = 0;
            for task in tasks {
                if task.await.unwrap().is_some() {
                    winners += 1;
                }
            }
            let last = read_lease(store, "race", 0).await.unwrap().unwrap();
            // Every take read the free version (epoch 0) or a later one;
            // each winner bumped the epoch by one from what it read.
            assert!(winners >= 1);
            assert_eq!(last.epoch as usize, winners, "{last:?}");
        }
    }
}
