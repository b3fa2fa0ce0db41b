//! What the owner and the tools read of the inbox's objects, and how: the
//! touch, the listing of `inbox/v1/`, a command object's bytes, its
//! removal. Anyone who may send commands can write there, so nothing
//! found there is trusted:
//!
//! - on a local-directory store ([`LocalDir`]) the inbox is read through
//!   directory handles that never follow a link, only regular files named
//!   directly in `inbox/v1/` are listed, nothing else is ever opened (a
//!   FIFO would block the reader), and a delete removes the listed name,
//!   never what a link points to;
//! - on any other store the store's own listing is used; an entry it
//!   fails on ends the listing there, and the entries before it are still
//!   handled.
//!
//! Entries that are not command objects are reported as skipped, each
//! described, for the caller to log.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt, stream};
use taquba::object_store;
use taquba::object_store::path::Path;

use crate::error::{Error, Result};
use crate::inbox::{MAX_COMMAND_SIZE, inbox_dir, inbox_touch_path};
use crate::store::blob::ObjectPrefix;
use crate::store::local_dir::{LocalDir, LocalEntry};

/// One object listed in the inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InboxEntry {
    /// Its path.
    pub(crate) location: Path,
    /// Its size, in bytes.
    pub(crate) size: u64,
}

/// One listing of the inbox.
#[derive(Debug, Default)]
pub(crate) struct InboxListing {
    /// The objects, at most the number asked for.
    pub(crate) entries: Vec<InboxEntry>,
    /// What was passed over, each described (`"name" (a symbolic link)`).
    pub(crate) skipped: Vec<String>,
    /// Whether more objects were there than were asked for.
    pub(crate) truncated: bool,
}

/// The touch object as last seen: its identity, or what is in its place.
pub(crate) type TouchSeen = Option<(Option<String>, String)>;

/// The inbox's objects in one store.
#[derive(Clone)]
pub(crate) struct InboxObjects {
    objects: ObjectPrefix,
    local: Option<Arc<LocalDir>>,
}

impl std::fmt::Debug for InboxObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboxObjects")
            .field("objects", &self.objects)
            .field("local", &self.local.is_some())
            .finish()
    }
}

impl InboxObjects {
    /// The inbox under `objects`' prefix.
    pub(crate) fn new(objects: &ObjectPrefix) -> Self {
        Self {
            local: LocalDir::of(objects.store().as_ref()).map(Arc::new),
            objects: objects.clone(),
        }
    }

    /// The directory of the command objects.
    pub(crate) fn dir(&self) -> Path {
        inbox_dir(&self.objects)
    }

    /// The touch object's identity, `None` when it is absent. On a local
    /// store something else in its place (a FIFO, a link) is not opened:
    /// its identity (no ETag) says what it is, with its inode and times, so
    /// it changes when it is replaced and not from round to round.
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn touch(&self) -> Result<TouchSeen> {
        let path = inbox_touch_path(&self.objects);
        match &self.local {
            Some(local) => {
                let local = local.clone();
                let entry = blocking(move || local.stat(&path)).await?;
                Ok(match entry {
                    LocalEntry::Absent => None,
                    LocalEntry::File { identity, .. } => Some((Some(identity), String::new())),
                    LocalEntry::Other { kind, identity } => {
                        Some((None, format!("{kind} ({identity})")))
                    }
                })
            }
            None => Ok(self
                .objects
                .head_meta(&path)
                .await?
                .map(|meta| (meta.e_tag, meta.last_modified.to_rfc3339()))),
        }
    }

    /// Whether a command object is at `path` (on a local store: a regular
    /// file; nothing is opened).
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn holds(&self, path: &Path) -> Result<bool> {
        match &self.local {
            Some(local) => {
                let local = local.clone();
                let path = path.clone();
                let entry = blocking(move || local.stat(&path)).await?;
                Ok(matches!(entry, LocalEntry::File { .. }))
            }
            None => self.objects.head(path).await,
        }
    }

    /// List the inbox: at most `max` objects (not in any order).
    ///
    /// # Errors
    /// Storage errors before anything was listed.
    pub(crate) async fn list(&self, max: usize) -> Result<InboxListing> {
        let dir = self.dir();
        match &self.local {
            Some(local) => {
                let local = local.clone();
                let found = blocking(move || local.list(&dir)).await?;
                let truncated = found.files.len() > max;
                Ok(InboxListing {
                    entries: found
                        .files
                        .into_iter()
                        .take(max)
                        .map(|file| InboxEntry {
                            location: file.location,
                            size: file.size,
                        })
                        .collect(),
                    skipped: found.skipped,
                    truncated,
                })
            }
            None => {
                let mut listing = InboxListing::default();
                let mut objects = self.objects.store().list(Some(&dir));
                loop {
                    match objects.try_next().await {
                        Ok(Some(_)) if listing.entries.len() == max => {
                            listing.truncated = true;
                            break;
                        }
                        Ok(Some(meta)) => listing.entries.push(InboxEntry {
                            location: meta.location,
                            size: meta.size,
                        }),
                        Ok(None) => break,
                        Err(err) if listing.entries.is_empty() => return Err(err.into()),
                        Err(err) => {
                            listing.skipped.push(format!(
                                "the entries after the {} listed (the listing failed: {err})",
                                listing.entries.len()
                            ));
                            listing.truncated = true;
                            break;
                        }
                    }
                }
                Ok(listing)
            }
        }
    }

    /// The bytes of the command object at `path`, at most one more than
    /// [`MAX_COMMAND_SIZE`]; `None` when it is gone.
    ///
    /// # Errors
    /// Storage errors; on a local store, a path that is no longer a
    /// regular file (never opened).
    pub(crate) async fn read(&self, path: &Path) -> Result<Option<Bytes>> {
        match &self.local {
            Some(local) => {
                let local = local.clone();
                let path = path.clone();
                let limit = u64::try_from(MAX_COMMAND_SIZE).unwrap_or(u64::MAX);
                Ok(blocking(move || local.read(&path, limit))
                    .await?
                    .map(Bytes::from))
            }
            None => self.objects.get(path).await,
        }
    }

    /// Delete the objects at `paths` (absent ones are not an error).
    ///
    /// # Errors
    /// The first storage error, once every delete was tried.
    pub(crate) async fn delete_all(&self, paths: Vec<Path>) -> Result<()> {
        if paths.is_empty() {
            return Ok(());
        }
        match &self.local {
            Some(local) => {
                let local = local.clone();
                blocking(move || {
                    let mut first = None;
                    for path in &paths {
                        if let Err(err) = local.delete(path) {
                            first.get_or_insert(err);
                        }
                    }
                    first.map_or(Ok(()), Err)
                })
                .await
            }
            None => {
                let store = self.objects.store().clone();
                // One request per batch on stores with a bulk delete (S3
                // takes 1000 keys a request).
                let results: Vec<_> = store
                    .delete_stream(stream::iter(paths.into_iter().map(Ok)).boxed())
                    .collect()
                    .await;
                results
                    .into_iter()
                    .find_map(|result| match result {
                        Ok(_) | Err(object_store::Error::NotFound { .. }) => None,
                        Err(err) => Some(Err(err.into())),
                    })
                    .unwrap_or(Ok(()))
            }
        }
    }
}

/// Run blocking file-system work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T> {
    let local_error = |source: Box<dyn std::error::Error + Send + Sync>| {
        Error::Store(object_store::Error::Generic {
            store: "LocalFileSystem",
            source,
        })
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(local_error(Box::new(err))),
        Err(join) => Err(local_error(Box::new(join))),
    }
}
