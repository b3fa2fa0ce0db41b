//! Shards this process does not host: reached through their inbox for
//! commands and a read-only `QueueReader` for reads.
//!
//! A reader is opened the first time a shard is read and kept; it follows
//! the shard's latest manifest, so its answers lag the owner's commits by
//! the poll interval. A shard no process ever opened has no queue yet: it
//! reads as empty.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;
use taquba::{QueueReader, ReaderMode, ReaderOptions};
use tokio::sync::OnceCell;

use super::ClusterError;
use super::host::SHARD_QUEUE_PATH;
use super::route::{shard_prefix, shard_store};
use crate::inbox::{Command, CommandId, Inbox};
use crate::store::memo::MemoStore;
use crate::view::WorkflowView;

/// One shard's reader and the view over it.
struct ShardReader {
    // Kept open for the view, which reads through it; closed at shutdown.
    reader: QueueReader,
    view: WorkflowView,
}

/// The inboxes and readers of a cluster's shards.
pub(crate) struct Remote {
    store: Arc<dyn ObjectStore>,
    root: String,
    memo_prefix: String,
    sender: Option<String>,
    poll: Duration,
    readers: Vec<OnceCell<Arc<ShardReader>>>,
}

impl Remote {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        root: &str,
        shards: u32,
        memo_prefix: &str,
        sender: Option<String>,
        poll: Duration,
    ) -> Self {
        Self {
            store,
            root: root.to_string(),
            memo_prefix: memo_prefix.to_string(),
            sender,
            poll,
            readers: (0..shards).map(|_| OnceCell::new()).collect(),
        }
    }

    /// How often a remote wait looks at the run.
    pub(crate) fn poll(&self) -> Duration {
        self.poll
    }

    /// Send `command` to shard `shard`'s inbox.
    ///
    /// # Errors
    /// As [`Inbox::send`].
    pub(crate) async fn send(
        &self,
        shard: u32,
        command: Command,
    ) -> Result<CommandId, ClusterError> {
        let mut inbox = Inbox::new(
            shard_store(self.store.clone(), &self.root, shard)?,
            self.memo_prefix.clone(),
        );
        if let Some(sender) = &self.sender {
            inbox = inbox.with_sender(sender.clone());
        }
        Ok(inbox.send(command).await?)
    }

    /// The view of shard `shard` through its reader, opened on first use;
    /// `None` when the shard has no queue yet (no process ever opened it).
    ///
    /// # Errors
    /// Storage errors opening the reader (a later call tries again).
    pub(crate) async fn view(&self, shard: u32) -> Result<Option<WorkflowView>, ClusterError> {
        let Some(cell) = self.readers.get(shard as usize) else {
            return Err(ClusterError::NoSuchShard {
                shard,
                shards: u32::try_from(self.readers.len()).unwrap_or(u32::MAX),
            });
        };
        if let Some(reader) = cell.get() {
            return Ok(Some(reader.view.clone()));
        }
        if !self.has_queue(shard).await? {
            return Ok(None);
        }
        let reader = cell
            .get_or_try_init(|| async {
                let store = shard_store(self.store.clone(), &self.root, shard)?;
                let reader = QueueReader::open_with_options(
                    store.clone(),
                    SHARD_QUEUE_PATH,
                    ReaderOptions::default()
                        .mode(ReaderMode::FollowLatest)
                        .manifest_poll_interval(self.poll),
                )
                .await
                .map_err(|err| ClusterError::Runtime(crate::Error::Queue(err)))?;
                let view = WorkflowView::new(
                    reader.view().clone(),
                    MemoStore::new(store, self.memo_prefix.clone()),
                );
                Ok::<_, ClusterError>(Arc::new(ShardReader { reader, view }))
            })
            .await?;
        Ok(Some(reader.view.clone()))
    }

    /// Close the readers opened so far (their manifest polling stops).
    pub(crate) async fn close(&self) {
        for reader in self.readers.iter().filter_map(OnceCell::get) {
            if let Err(err) = reader.reader.close().await {
                tracing::warn!("closing a shard's reader: {err}");
            }
        }
    }

    /// Whether shard `shard` has a queue (a SlateDB manifest under its
    /// queue path).
    async fn has_queue(&self, shard: u32) -> Result<bool, ClusterError> {
        let manifest = Path::from(format!(
            "{}/{SHARD_QUEUE_PATH}/manifest",
            shard_prefix(&self.root, shard)
        ));
        let mut listing = self.store.list(Some(&manifest));
        match listing.next().await {
            Some(Ok(_)) => Ok(true),
            Some(Err(err)) => Err(err.into()),
            None => Ok(false),
        }
    }
}
