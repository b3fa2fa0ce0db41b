//! Object-store access under one path prefix: the memo entries, run result
//! records, replay records and group manifests all live under the
//! runtime's memo prefix. Absence is `None`, never an error.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use taquba::object_store::path::{Path, PathPart};
use taquba::object_store::{self, ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::Result;
use crate::store::keys::sha256;

/// Deletes in flight at once when clearing a prefix.
const DELETE_CONCURRENCY: usize = 16;
/// The longest path segment written as is; longer ones (a memo key is free
/// text) are replaced by their digest so every store, including a local
/// file system with its 255-byte names, accepts them.
const MAX_SEGMENT_LEN: usize = 200;

/// An object store and the prefix every path is built under.
#[derive(Clone)]
pub(crate) struct ObjectPrefix {
    store: Arc<dyn ObjectStore>,
    /// The prefix as a path, parsed once (every memo and result-record
    /// path is built on it) and shared by every clone (each step's memos
    /// take one).
    base: Arc<Path>,
}

impl std::fmt::Debug for ObjectPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectPrefix")
            .field("prefix", &self.base.as_ref())
            .finish_non_exhaustive()
    }
}

impl ObjectPrefix {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>) -> Self {
        Self {
            store,
            base: Arc::new(Path::from(prefix.into().as_str())),
        }
    }

    /// The path of `segments` under the prefix. Each segment is one path
    /// part: a `/` inside it is escaped, not a separator, and an overlong
    /// segment is replaced by `h-{sha256 hex}`.
    pub(crate) fn path(&self, segments: &[&str]) -> Path {
        let parts = segments.iter().map(|segment| {
            let part = PathPart::from(*segment);
            if part.as_ref().len() > MAX_SEGMENT_LEN {
                PathPart::from(format!("h-{}", hex::encode(sha256(segment.as_bytes()))))
            } else {
                part
            }
        });
        self.base.parts().chain(parts).collect()
    }

    /// The object store.
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Whether an object exists at `path`.
    pub(crate) async fn head(&self, path: &Path) -> Result<bool> {
        Ok(self.head_meta(path).await?.is_some())
    }

    /// The metadata of the object at `path`, or `None` when it does not
    /// exist.
    pub(crate) async fn head_meta(&self, path: &Path) -> Result<Option<object_store::ObjectMeta>> {
        match self.store.head(path).await {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// The object at `path`, or `None` when it does not exist.
    pub(crate) async fn get(&self, path: &Path) -> Result<Option<Bytes>> {
        match self.store.get(path).await {
            Ok(result) => Ok(Some(result.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Write `value` at `path`, replacing any object there.
    pub(crate) async fn put(&self, path: &Path, value: &[u8]) -> Result<()> {
        self.store
            .put(path, PutPayload::from(Bytes::copy_from_slice(value)))
            .await?;
        Ok(())
    }

    /// Delete the object at `path`; an absent object is not an error.
    pub(crate) async fn delete(&self, path: &Path) -> Result<()> {
        match self.store.delete(path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Delete every object under `dir`; returns how many were deleted.
    pub(crate) async fn delete_all(&self, dir: &Path) -> Result<usize> {
        let listed: Vec<Path> = self
            .store
            .list(Some(dir))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await?;
        let count = listed.len();
        crate::settled::try_join_settled(listed, DELETE_CONCURRENCY, |path| async move {
            self.delete(&path).await
        })
        .await?;
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taquba::object_store::memory::InMemory;

    #[tokio::test]
    async fn segments_are_escaped_and_long_ones_hashed() {
        let objects = ObjectPrefix::new(Arc::new(InMemory::new()), "q-memo");
        let path = objects.path(&["runs", "r", "a/b"]);
        assert_eq!(path.parts().count(), 4);
        let long = "k".repeat(300);
        let path = objects.path(&["runs", &long]);
        assert!(path.as_ref().contains("h-"));
        objects.put(&path, b"v").await.unwrap();
        assert_eq!(
            objects.get(&path).await.unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(
            objects.delete_all(&objects.path(&["runs"])).await.unwrap(),
            1
        );
        assert!(objects.get(&path).await.unwrap().is_none());
        objects.delete(&path).await.unwrap();
    }
}
