//! Routing: the one function that says which shard holds a run, and
//! where a shard lives.

use std::num::NonZeroU32;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::prefix::PrefixStore;

use super::ClusterError;
use crate::store::local_dir::{BelowError, LocalDir};

/// The name of the routing hash a cluster record stores
/// ([`shard_of`]'s): the first 8 bytes of the SHA-256 of the id, as a
/// big-endian `u64`, modulo the shard count.
pub const HASH_NAME: &str = "sha256-be64-mod";

/// The shard (`0..shards`) that holds the run `run_id`: the first 8 bytes
/// of the SHA-256 of the id's bytes, read as a big-endian `u64`, modulo
/// `shards` ([`HASH_NAME`]). The same in every process, build and tool; a
/// group's members route by the group id instead (see
/// [`ClusterRecord::shard_of_group`](super::ClusterRecord::shard_of_group)).
pub fn shard_of(run_id: &str, shards: NonZeroU32) -> u32 {
    let digest = Sha256::digest(run_id.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let shard = u64::from_be_bytes(head) % u64::from(shards.get());
    // Below `shards`, a u32.
    u32::try_from(shard).unwrap_or(0)
}

/// The prefix of shard `shard` of the cluster at `root`: `{root}/shards/{k}`
/// (`shards/{k}` for an empty root). The shard's queue and memo prefix are
/// under it, as a single store's are under its own root.
pub fn shard_prefix(root: &str, shard: u32) -> String {
    let root = root.trim_matches('/');
    if root.is_empty() {
        format!("shards/{shard}")
    } else {
        format!("{root}/shards/{shard}")
    }
}

/// Shard `shard` of the cluster at `root` in `store`, as a store of its
/// own: every path under [`shard_prefix`]. Open the shard's queue on it and
/// give it to the shard's runtime as its object store, exactly as a single
/// store is opened; its queue and memo prefix then live under the prefix.
///
/// On a local directory (a `LocalFileSystem`) the shard is a
/// `LocalFileSystem` rooted at the shard's own directory, created when
/// missing, so the shard's owner still reads its inbox through directory
/// handles that follow no link; elsewhere it is a `PrefixStore`.
///
/// # Errors
/// [`ClusterError::LinkedShard`] when a directory on the way to a local
/// shard is a symbolic link (it is never followed), and
/// [`ClusterError::Store`] when the directory cannot be made.
pub fn shard_store(
    store: Arc<dyn ObjectStore>,
    root: &str,
    shard: u32,
) -> Result<Arc<dyn ObjectStore>, ClusterError> {
    let prefix = shard_prefix(root, shard);
    if let Some(dir) = LocalDir::of(store.as_ref()) {
        let path = dir.create_below(&prefix).map_err(|err| match err {
            BelowError::Link(path) => ClusterError::LinkedShard {
                shard,
                path: path.display().to_string(),
            },
            BelowError::Io(err) => ClusterError::Store(taquba::object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(err),
            }),
        })?;
        let local = LocalFileSystem::new_with_prefix(&path).map_err(ClusterError::Store)?;
        return Ok(Arc::new(local));
    }
    Ok(Arc::new(PrefixStore::new(store, prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(shards: u32) -> NonZeroU32 {
        NonZeroU32::new(shards).expect("non-zero")
    }

    #[test]
    fn the_hash_is_the_documented_one() {
        // The first 8 bytes of the digest as a big-endian u64, modulo the
        // count, computed here independently of `shard_of`.
        let digest = Sha256::digest(b"order-7");
        let head = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
        for shards in [1, 2, 8, 64, 1024] {
            assert_eq!(
                u64::from(shard_of("order-7", n(shards))),
                head % u64::from(shards)
            );
        }
        assert_eq!(shard_of("anything", n(1)), 0);
    }

    #[test]
    fn runs_spread_over_the_shards() {
        let shards = n(8);
        let mut counts = [0u32; 8];
        for i in 0..8_000 {
            let shard = shard_of(&format!("run-{i}"), shards);
            counts[shard as usize] += 1;
        }
        for count in counts {
            assert!((800..1200).contains(&count), "{counts:?}");
        }
    }

    /// A shard is an ordinary store under its prefix: a runtime over it
    /// runs a run to its end, and everything it wrote is under
    /// `{root}/shards/{k}/`.
    #[tokio::test]
    async fn a_shard_is_a_whole_store_under_its_prefix() {
        use futures_util::TryStreamExt;
        use taquba::object_store::memory::InMemory;

        use crate::{NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner};

        struct Done;
        impl StepRunner for Done {
            async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
                step.memo.put("seen", b"yes").await?;
                Ok(StepOutcome::Succeed {
                    result: step.payload.clone(),
                })
            }
        }

        let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let shard = shard_store(bucket.clone(), "prod", 3).expect("a shard store");
        let queue = Arc::new(
            taquba::Queue::open(shard.clone(), "db")
                .await
                .expect("open the shard's queue"),
        );
        let runtime =
            crate::WorkflowRuntime::builder(queue.clone(), shard, Done, NoopTerminalHook).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        let submitted = runtime
            .submit(RunSpec {
                input: b"in".to_vec(),
                ..Default::default()
            })
            .await
            .expect("submit");
        let end = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            runtime.wait(&submitted.run_id),
        )
        .await
        .expect("ends in time")
        .expect("wait");
        assert_eq!(end.termination.status, crate::TerminalStatus::Succeeded);
        worker.shutdown().await.expect("shutdown");
        let paths: Vec<String> = bucket
            .list(None)
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .expect("list");
        assert!(!paths.is_empty());
        assert!(
            paths.iter().all(|path| path.starts_with("prod/shards/3/")),
            "{paths:?}"
        );
        assert!(
            paths
                .iter()
                .any(|path| path.starts_with("prod/shards/3/workflow-steps-memo/")),
            "the memo prefix is in the shard: {paths:?}"
        );
    }

    /// On a local directory a shard is a local store of its own (so its
    /// owner's inbox reads follow no link), and a link on the way to it is
    /// refused, never followed.
    #[cfg(unix)]
    #[test]
    fn a_local_shard_is_its_own_directory_and_links_are_refused() {
        use taquba::object_store::local::LocalFileSystem;

        let dir = tempfile::tempdir().expect("a temporary directory");
        let root: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir.path()).expect("a local store"));
        let shard = shard_store(root.clone(), "c", 1).expect("a shard store");
        assert!(dir.path().join("c/shards/1").is_dir());
        assert!(
            shard.to_string().starts_with("LocalFileSystem(file://")
                && shard.to_string().contains("c/shards/1"),
            "{shard}"
        );
        let outside = tempfile::tempdir().expect("another directory");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("c/shards/2")).expect("a link");
        let err = shard_store(root.clone(), "c", 2).expect_err("a linked shard");
        assert!(
            matches!(&err, ClusterError::LinkedShard { shard: 2, .. })
                && err.to_string().contains("c/shards/2"),
            "{err}"
        );
        // A link higher up is refused too.
        std::os::unix::fs::symlink(outside.path(), dir.path().join("d")).expect("a link");
        assert!(matches!(
            shard_store(root, "d", 0),
            Err(ClusterError::LinkedShard { .. })
        ));
    }

    #[test]
    fn shard_prefixes_nest_under_the_root() {
        assert_eq!(shard_prefix("prod/wf", 3), "prod/wf/shards/3");
        assert_eq!(shard_prefix("/prod/wf/", 0), "prod/wf/shards/0");
        assert_eq!(shard_prefix("", 7), "shards/7");
    }
}
