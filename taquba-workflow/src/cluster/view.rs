//! [`ClusterView`]: the read-only queries of [`WorkflowView`] over every
//! shard of a cluster at once. Listings ([`ClusterView::runs`],
//! [`ClusterView::groups`]) merge the shards' pages in id order behind one
//! cursor; the reads of one run or group go to the shard that holds it.
//!
//! Where a run is: a plain run (or keyed job) in its *home shard*, the
//! shard its run id hashes to ([`shard_of`]); a group and all its members
//! in the group id's shard. A member's run id is the hex SHA-256 of
//! `{group_id}/{key}`, from which the group cannot be read back, so a run
//! not found in its home shard whose id has that form is looked for in the
//! other shards ([`ClusterView::locate_run`]).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream;
use taquba::object_store::ObjectStore;
use taquba::{QueueReader, ReaderMode, ReaderOptions};

use super::host::SHARD_QUEUE_PATH;
use super::{
    ClusterError, ClusterRecord, cluster_record_path, shard_of, shard_prefix, shard_store,
};
use crate::history::RunHistory;
use crate::inbox::{CommandId, CommandState};
use crate::model::{RunOutcome, RunStatus};
use crate::store::keys::RunId;
use crate::store::memo::MemoStore;
use crate::view::{GroupPage, MAX_PAGE_LIMIT, RunDetails, RunFilter, RunPage, WorkflowView};
use crate::{Error, GroupStatus};

/// Shards read at once by default (opening readers, a listing's pages, the
/// search for a group member's run).
pub const DEFAULT_SHARD_CONCURRENCY: usize = 8;

/// What went wrong opening or reading a [`ClusterView`]. Each error names
/// the shard (and, opening, the path) involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterViewError {
    /// No cluster record at the root: the location is not a cluster (a
    /// single store, an empty prefix, a mistyped root).
    #[error("no cluster at root `{root}`: there is no cluster record at `{path}`")]
    NoCluster {
        /// The root asked for.
        root: String,
        /// Where the record was looked for.
        path: String,
    },
    /// The cluster record could not be read or used.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// [`ClusterView::new`] was given another number of shard views than
    /// the cluster has shards.
    #[error(
        "the cluster has {shards} shards, but {given} shard views were given (one per shard, in shard order)"
    )]
    ViewCount {
        /// The cluster's shard count.
        shards: u32,
        /// The number of views given.
        given: usize,
    },
    /// A shard number past the cluster's last shard.
    #[error("there is no shard {shard}: the cluster has {shards} shards (0 to {})", shards.saturating_sub(1))]
    NoSuchShard {
        /// The shard asked for.
        shard: u32,
        /// The cluster's shard count.
        shards: u32,
    },
    /// The shard has no queue yet (no process has opened it), so it holds
    /// no records to read.
    #[error("shard {shard} has no queue yet (no process has opened it): it holds no records")]
    ShardNotOpen {
        /// The shard.
        shard: u32,
    },
    /// A shard's queue could not be opened for reading.
    #[error("cannot open the queue of shard {shard} at `{path}`: {source}")]
    Open {
        /// The shard.
        shard: u32,
        /// The queue's path in the bucket (`{root}/shards/{k}/{queue_path}`).
        path: String,
        /// The queue's error.
        source: taquba::Error,
    },
    /// A shard's queue did not open within
    /// [`ClusterViewOptions::open_timeout`].
    #[error("opening the queue of shard {shard} at `{path}` did not finish within {after:?}")]
    OpenTimeout {
        /// The shard.
        shard: u32,
        /// The queue's path in the bucket.
        path: String,
        /// The bound that elapsed.
        after: Duration,
    },
    /// A query of one shard failed.
    #[error("reading shard {shard} failed: {source}")]
    Read {
        /// The shard.
        shard: u32,
        /// The shard's error.
        source: Error,
    },
}

/// How [`ClusterView::open`] opens the shards. Build it with
/// [`ClusterViewOptions::default`] and the setters.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClusterViewOptions {
    /// The queue's path inside each shard's store
    /// ([`SHARD_QUEUE_PATH`]).
    pub queue_path: String,
    /// The memo prefix inside each shard's store: the runtime's
    /// (`{queue_name}-memo`; default `workflow-steps-memo`, the default
    /// queue name's).
    pub memo_prefix: String,
    /// The options of each shard's `QueueReader`. The default follows the
    /// latest manifest ([`ReaderMode::FollowLatest`]: no writes, read-only
    /// credentials suffice), polling it every second.
    pub reader: ReaderOptions,
    /// Shards opened (and read) at once, at least 1
    /// ([`DEFAULT_SHARD_CONCURRENCY`]).
    pub concurrency: usize,
    /// The bound of each shard's open; `None` (the default): unbounded.
    pub open_timeout: Option<Duration>,
}

impl std::fmt::Debug for ClusterViewOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterViewOptions")
            .field("queue_path", &self.queue_path)
            .field("memo_prefix", &self.memo_prefix)
            .field("reader_mode", &self.reader.mode)
            .field(
                "manifest_poll_interval",
                &self.reader.manifest_poll_interval,
            )
            .field("concurrency", &self.concurrency)
            .field("open_timeout", &self.open_timeout)
            .finish_non_exhaustive()
    }
}

impl Default for ClusterViewOptions {
    fn default() -> Self {
        Self {
            queue_path: SHARD_QUEUE_PATH.to_string(),
            memo_prefix: format!("{}-memo", crate::limits::DEFAULT_QUEUE_NAME),
            reader: ReaderOptions::default()
                .mode(ReaderMode::FollowLatest)
                .manifest_poll_interval(Duration::from_secs(1)),
            concurrency: DEFAULT_SHARD_CONCURRENCY,
            open_timeout: None,
        }
    }
}

impl ClusterViewOptions {
    /// Each shard's queue at `path` inside the shard's store.
    pub fn queue_path(mut self, path: impl Into<String>) -> Self {
        self.queue_path = path.into();
        self
    }

    /// Each shard's memo prefix.
    pub fn memo_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.memo_prefix = prefix.into();
        self
    }

    /// Each shard's reader options.
    pub fn reader(mut self, reader: ReaderOptions) -> Self {
        self.reader = reader;
        self
    }

    /// At most `concurrency` shards opened and read at once (at least 1).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency;
        self
    }

    /// Each shard's open bounded by `timeout`.
    pub fn open_timeout(mut self, timeout: Duration) -> Self {
        self.open_timeout = Some(timeout);
        self
    }
}

/// One shard as the view holds it: its view, `None` while no process has
/// opened its queue, and the reader [`ClusterView::open`] opened.
struct Shard {
    view: Option<WorkflowView>,
    reader: Option<QueueReader>,
}

/// Read-only queries over every shard of a cluster: merged listings and
/// routed reads. A plain run (or keyed job) lives in its home shard, a
/// group and its members in the group id's shard
/// ([`locate_run`](Self::locate_run) finds either). Build it with
/// [`open`](Self::open) (a `QueueReader` per shard, from any process) or
/// [`new`](Self::new) (views the caller already has, such as a runtime's
/// own). A shard whose queue no process has created yet holds nothing: a
/// listing passes over it and a read of a run routed to it finds none.
pub struct ClusterView {
    record: ClusterRecord,
    shards: Vec<Shard>,
    concurrency: usize,
}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterView")
            .field("record", &self.record)
            .field(
                "open_shards",
                &(0..self.record.shards)
                    .filter(|&k| self.shard(k).is_some())
                    .collect::<Vec<_>>(),
            )
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

type Result<T, E = ClusterViewError> = std::result::Result<T, E>;

impl ClusterView {
    /// A view of the cluster `record` describes over `views`, one per
    /// shard in shard order, `None` for a shard whose queue does not exist
    /// yet. Reads [`DEFAULT_SHARD_CONCURRENCY`] shards at once.
    ///
    /// # Errors
    /// [`ClusterViewError::ViewCount`] when `views` does not hold one entry
    /// per shard.
    pub fn new(record: ClusterRecord, views: Vec<Option<WorkflowView>>) -> Result<Self> {
        if views.len() != record.shards as usize {
            return Err(ClusterViewError::ViewCount {
                shards: record.shards,
                given: views.len(),
            });
        }
        Ok(Self {
            record,
            shards: views
                .into_iter()
                .map(|view| Shard { view, reader: None })
                .collect(),
            concurrency: DEFAULT_SHARD_CONCURRENCY,
        })
    }

    /// The same view reading at most `concurrency` shards at once (at
    /// least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Open the cluster at `root` in `store`: read its record, then open a
    /// `QueueReader` on every shard (`options.concurrency` at a time, each
    /// bounded by `options.open_timeout`) at
    /// `{root}/shards/{k}/{options.queue_path}`, with its memo prefix
    /// `options.memo_prefix`. A shard whose queue was never created is
    /// held as not open. The readers poll their manifests until
    /// [`close`](Self::close) (or until the view is dropped).
    ///
    /// # Errors
    /// [`ClusterViewError::NoCluster`] when `root` holds no cluster
    /// record; [`ClusterViewError::Cluster`] for a record that cannot be
    /// read or used; [`ClusterViewError::Open`] and
    /// [`ClusterViewError::OpenTimeout`] for the first shard that failed
    /// to open (the readers already open are closed).
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        root: &str,
        options: &ClusterViewOptions,
    ) -> Result<Self> {
        let record = ClusterRecord::open(store.clone(), root)
            .await?
            .ok_or_else(|| ClusterViewError::NoCluster {
                root: root.to_string(),
                path: cluster_record_path(root).to_string(),
            })?;
        let concurrency = options.concurrency.max(1);
        let opens = (0..record.shards)
            .map(|k| {
                let shard = shard_store(store.clone(), root, k);
                let path = format!("{}/{}", shard_prefix(root, k), options.queue_path);
                let options = options.clone();
                async move {
                    let opened = match shard {
                        Ok(shard) => open_shard(shard, k, path, &options).await,
                        Err(err) => Err(ClusterViewError::Cluster(err)),
                    };
                    (k, opened)
                }
            })
            .collect::<Vec<_>>();
        let opened: Vec<(u32, Result<Shard>)> =
            stream::iter(opens).buffered(concurrency).collect().await;
        let mut shards = Vec::with_capacity(opened.len());
        let mut failed = None;
        for (_, shard) in opened {
            match shard {
                Ok(shard) => shards.push(shard),
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
        }
        let view = Self {
            record,
            shards,
            concurrency,
        };
        if let Some(err) = failed {
            // Whatever the closes say, the open's error is the one to tell.
            let _ = view.close().await;
            return Err(err);
        }
        Ok(view)
    }

    /// Close the readers [`open`](Self::open) opened (their manifest
    /// polling stops). A view built with [`new`](Self::new) has none.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the first shard whose reader
    /// failed to close (every reader is closed regardless).
    pub async fn close(&self) -> Result<()> {
        let mut first = None;
        for (k, shard) in (0u32..).zip(&self.shards) {
            if let Some(reader) = &shard.reader
                && let Err(err) = reader.close().await
            {
                first.get_or_insert(ClusterViewError::Read {
                    shard: k,
                    source: err.into(),
                });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The cluster's record (shard count, hash, format).
    pub fn record(&self) -> &ClusterRecord {
        &self.record
    }

    /// The number of shards.
    pub fn shard_count(&self) -> u32 {
        self.record.shards
    }

    /// Shard `shard`'s view; `None` past the last shard and for a shard
    /// whose queue no process has created yet.
    pub fn shard(&self, shard: u32) -> Option<&WorkflowView> {
        self.shards.get(shard as usize)?.view.as_ref()
    }

    /// The reader [`open`](Self::open) opened on shard `shard` (for its
    /// store activity and writer heartbeat); `None` for a view built with
    /// [`new`](Self::new), past the last shard and for a shard not open.
    pub fn reader(&self, shard: u32) -> Option<&QueueReader> {
        self.shards.get(shard as usize)?.reader.as_ref()
    }

    /// The home shard of `run_id`: where a plain run (or keyed job) with
    /// this id lives ([`shard_of`]). A group member lives in its group's
    /// shard instead; [`locate_run`](Self::locate_run) finds either.
    pub fn shard_of_run(&self, run_id: &RunId) -> u32 {
        shard_of(run_id.as_str(), self.record.shard_count())
    }

    /// The shard of group `group_id`: its manifest and every member.
    pub fn shard_of_group(&self, group_id: &RunId) -> u32 {
        self.record.shard_of_group(group_id.as_str())
    }

    /// The shard a listed run is in: its group's shard for a group member
    /// (`group`, as [`RunSummary::group`](crate::view::RunSummary::group)
    /// or [`RunDetails::group`] says), else its home shard.
    pub fn shard_of_listed(&self, run_id: &RunId, group: Option<&RunId>) -> u32 {
        match group {
            Some(group) => self.shard_of_group(group),
            None => self.shard_of_run(run_id),
        }
    }

    /// The shard holding run `run_id`: its home shard when the run is
    /// there, else, for an id of a group member's form (64 lowercase hex
    /// digits), the first other shard holding it (searched
    /// `concurrency` shards at a time). `None` when no shard holds it.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn locate_run(&self, run_id: &RunId) -> Result<Option<u32>> {
        let views = (0u32..)
            .zip(&self.shards)
            .filter_map(|(k, shard)| shard.view.clone().map(|view| (k, view)));
        locate(views, self.shard_of_run(run_id), run_id, self.concurrency)
            .await
            .map_err(|(shard, source)| ClusterViewError::Read { shard, source })
    }

    /// The shard holding `run_id` and its view, when a shard holds it.
    async fn run_shard(&self, run_id: &RunId) -> Result<Option<(u32, &WorkflowView)>> {
        Ok(self
            .locate_run(run_id)
            .await?
            .and_then(|k| self.shard(k).map(|view| (k, view))))
    }

    /// [`WorkflowView::status`] of `run_id` in the shard holding it
    /// ([`locate_run`](Self::locate_run)); `None` when no shard holds it.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn status(&self, run_id: &RunId) -> Result<Option<RunStatus>> {
        let Some((k, view)) = self.run_shard(run_id).await? else {
            return Ok(None);
        };
        view.status(run_id).await.map_err(read_error(k))
    }

    /// [`WorkflowView::outcome`] of `run_id` in the shard holding it;
    /// `None` when no shard holds it, and as that method says.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn outcome(&self, run_id: &RunId) -> Result<Option<RunOutcome>> {
        let Some((k, view)) = self.run_shard(run_id).await? else {
            return Ok(None);
        };
        view.outcome(run_id).await.map_err(read_error(k))
    }

    /// [`WorkflowView::run`] (the run described) of `run_id` in the shard
    /// holding it, with that shard; `None` when no shard holds it.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn run(&self, run_id: &RunId) -> Result<Option<(u32, RunDetails)>> {
        let Some((k, view)) = self.run_shard(run_id).await? else {
            return Ok(None);
        };
        Ok(view
            .run(run_id)
            .await
            .map_err(read_error(k))?
            .map(|details| (k, details)))
    }

    /// [`WorkflowView::steps`] (the step history) of `run_id` in the shard
    /// holding it; `None` when no shard holds it.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn steps(&self, run_id: &RunId) -> Result<Option<RunHistory>> {
        let Some((k, view)) = self.run_shard(run_id).await? else {
            return Ok(None);
        };
        view.steps(run_id).await.map_err(read_error(k))
    }

    /// [`WorkflowView::input`] (the submitted input, while the queue keeps
    /// it) of `run_id` in the shard holding it; `None` when no shard holds
    /// it, and as that method says.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn input(&self, run_id: &RunId) -> Result<Option<Vec<u8>>> {
        let Some((k, view)) = self.run_shard(run_id).await? else {
            return Ok(None);
        };
        view.input(run_id).await.map_err(read_error(k))
    }

    /// [`WorkflowView::group`] (the member counts) of group `group_id`,
    /// from the group's shard; `None` for a group never submitted (or
    /// forgotten), or whose shard is not open.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn group(&self, group_id: &RunId) -> Result<Option<GroupStatus>> {
        let k = self.shard_of_group(group_id);
        match self.shard(k) {
            Some(view) => view.group(group_id).await.map_err(read_error(k)),
            None => Ok(None),
        }
    }

    /// The shard a key-only signal on `correlation_key` goes to: the
    /// lowest shard where a run waits on the key, else the key's home
    /// shard ([`shard_of`] of the key). The rule of
    /// [`ClusterRuntime::signal`](super::ClusterRuntime::signal), written
    /// once; the CLI and the dashboard send by it.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] when a shard's read fails.
    pub async fn signal_shard(&self, correlation_key: &str) -> Result<u32> {
        let views = (0u32..)
            .zip(&self.shards)
            .filter_map(|(k, shard)| shard.view.clone().map(|view| (k, view)));
        let waiting = waiter_shard(views, correlation_key, self.concurrency)
            .await
            .map_err(|(shard, source)| ClusterViewError::Read { shard, source })?;
        Ok(waiting.unwrap_or_else(|| self.record.shard_of(correlation_key)))
    }

    /// [`WorkflowView::command`]: the state of inbox command `id` sent to
    /// shard `shard`'s inbox.
    ///
    /// # Errors
    /// [`ClusterViewError::NoSuchShard`] past the last shard;
    /// [`ClusterViewError::ShardNotOpen`] for a shard whose queue no
    /// process has created; [`ClusterViewError::Read`] when the read
    /// fails.
    pub async fn command(&self, shard: u32, id: &CommandId) -> Result<CommandState> {
        if shard >= self.record.shards {
            return Err(ClusterViewError::NoSuchShard {
                shard,
                shards: self.record.shards,
            });
        }
        let view = self
            .shard(shard)
            .ok_or(ClusterViewError::ShardNotOpen { shard })?;
        view.command(id).await.map_err(read_error(shard))
    }

    /// One page of runs matching `filter` over every shard, in run-id
    /// order, with the cursor of the next page ([`RunPage::next`], `None`
    /// when this page is the last): exactly the page a single store
    /// holding every shard's runs would give. A filter on a group reads
    /// the group's shard only.
    ///
    /// Each shard's runs are read in pages of about `limit / shards` (at
    /// least one more than that share), and a shard whose share ran out
    /// while the page is not full is read again from where it stopped, so
    /// a page reads about `limit` runs plus one page of slack per shard,
    /// not `limit` per shard.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn runs(&self, filter: &RunFilter) -> Result<RunPage> {
        let lanes: Vec<u32> = match &filter.group {
            Some(group) => vec![self.shard_of_group(group)],
            None => (0..self.record.shards).collect(),
        };
        let lanes: Vec<u32> = lanes
            .into_iter()
            .filter(|&k| self.shard(k).is_some())
            .collect();
        let limit = filter.limit.clamp(1, MAX_PAGE_LIMIT);
        let fetch = |k: u32, after: Option<RunId>, limit: usize| {
            let view = self.shard(k).cloned();
            let mut page_filter = filter.clone();
            page_filter.after = after;
            page_filter.limit = limit;
            async move {
                match view {
                    Some(view) => view
                        .runs(&page_filter)
                        .await
                        .map(|page| (page.runs, page.next))
                        .map_err(read_error(k)),
                    None => Ok((Vec::new(), None)),
                }
            }
        };
        let (runs, next) = merge_pages(
            lanes,
            filter.after.clone(),
            limit,
            self.concurrency,
            |run| &run.run_id,
            fetch,
        )
        .await?;
        Ok(RunPage { runs, next })
    }

    /// One page of the groups of every shard, in group-id order, after the
    /// group `after`, at most `limit` (clamped to `1..=`[`MAX_PAGE_LIMIT`]),
    /// with the cursor of the next page; merged as [`runs`](Self::runs)
    /// merges.
    ///
    /// # Errors
    /// [`ClusterViewError::Read`] naming the shard whose read failed.
    pub async fn groups(&self, after: Option<&RunId>, limit: usize) -> Result<GroupPage> {
        let lanes: Vec<u32> = (0..self.record.shards)
            .filter(|&k| self.shard(k).is_some())
            .collect();
        let limit = limit.clamp(1, MAX_PAGE_LIMIT);
        let fetch = |k: u32, after: Option<RunId>, limit: usize| {
            let view = self.shard(k).cloned();
            async move {
                match view {
                    Some(view) => view
                        .groups(after.as_ref(), limit)
                        .await
                        .map(|page| (page.groups, page.next))
                        .map_err(read_error(k)),
                    None => Ok((Vec::new(), None)),
                }
            }
        };
        let (groups, next) = merge_pages(
            lanes,
            after.cloned(),
            limit,
            self.concurrency,
            |group| &group.group_id,
            fetch,
        )
        .await?;
        Ok(GroupPage { groups, next })
    }
}

/// Open shard `k`'s reader on `store` (its shard store), `None` view when
/// its queue was never created.
async fn open_shard(
    store: Arc<dyn ObjectStore>,
    k: u32,
    path: String,
    options: &ClusterViewOptions,
) -> Result<Shard> {
    let open =
        QueueReader::open_with_options(store.clone(), &options.queue_path, options.reader.clone());
    let opened = match options.open_timeout {
        Some(after) => match tokio::time::timeout(after, open).await {
            Ok(opened) => opened,
            Err(_) => {
                return Err(ClusterViewError::OpenTimeout {
                    shard: k,
                    path,
                    after,
                });
            }
        },
        None => open.await,
    };
    match opened {
        Ok(reader) => Ok(Shard {
            view: Some(WorkflowView::new(
                reader.view().clone(),
                MemoStore::new(store, options.memo_prefix.clone()),
            )),
            reader: Some(reader),
        }),
        Err(taquba::Error::StoreNotInitialized { .. }) => Ok(Shard {
            view: None,
            reader: None,
        }),
        Err(source) => Err(ClusterViewError::Open {
            shard: k,
            path,
            source,
        }),
    }
}

/// The error of a failed read of shard `shard`.
fn read_error(shard: u32) -> impl FnOnce(Error) -> ClusterViewError {
    move |source| ClusterViewError::Read { shard, source }
}

/// Whether a run under `run_id` may live in another shard than its id's
/// home: a group member's run lives in its group's shard, a schedule
/// tick's run in its schedule's.
pub(crate) fn lives_beyond_home(run_id: &RunId) -> bool {
    is_member_run_id(run_id) || crate::schedule::fire::is_tick_run_id(run_id.as_str())
}

/// Whether `run_id` has the form of a group member's run id: the hex
/// SHA-256 of `{group_id}/{key}`, 64 lowercase hex digits.
pub(crate) fn is_member_run_id(run_id: &RunId) -> bool {
    run_id.len() == 64
        && run_id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One shard's part of a merged listing: what was read of it and not
/// taken yet, where its next read starts, and whether it has more.
struct Lane<T> {
    shard: u32,
    buffer: VecDeque<T>,
    after: Option<RunId>,
    more: bool,
}

/// One page of at most `limit` items over the shards `lanes`, in id order
/// (`id`), after `after`, with the cursor of the next page (the last
/// item's id when an item follows, `None` otherwise). `fetch(shard, after,
/// limit)` reads one shard's page: at most `limit` items after `after` in
/// id order, and a cursor that is `Some` exactly when a further item
/// follows. A lane is read again whenever its read items were all taken
/// while it has more, so every item taken is the smallest one left.
async fn merge_pages<T, F, Fut>(
    lanes: Vec<u32>,
    after: Option<RunId>,
    limit: usize,
    concurrency: usize,
    id: fn(&T) -> &RunId,
    fetch: F,
) -> Result<(Vec<T>, Option<RunId>)>
where
    F: Fn(u32, Option<RunId>, usize) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<RunId>)>>,
{
    let limit = limit.max(1);
    let mut lanes: Vec<Lane<T>> = lanes
        .into_iter()
        .map(|shard| Lane {
            shard,
            buffer: VecDeque::new(),
            after: after.clone(),
            more: true,
        })
        .collect();
    let mut page: Vec<T> = Vec::with_capacity(limit.min(MAX_PAGE_LIMIT));
    loop {
        let need = limit - page.len();
        let live = lanes
            .iter()
            .filter(|lane| lane.more || !lane.buffer.is_empty())
            .count()
            .max(1);
        // Each live shard's share of what is still needed, and one more, so
        // that evenly spread ids fill the page in one round.
        let batch = (need.div_ceil(live) + 1).min(need);
        let reads: Vec<_> = lanes
            .iter()
            .enumerate()
            .filter(|(_, lane)| lane.more && lane.buffer.is_empty())
            .map(|(i, lane)| {
                let read = fetch(lane.shard, lane.after.clone(), batch);
                async move { (i, read.await) }
            })
            .collect();
        let read: Vec<_> = stream::iter(reads)
            .buffered(concurrency.max(1))
            .collect()
            .await;
        for (i, result) in read {
            let (items, next) = result?;
            let lane = &mut lanes[i];
            // A read that found nothing has nothing after it either.
            lane.more = next.is_some() && !items.is_empty();
            lane.after = next.or_else(|| items.last().map(|item| id(item).clone()));
            lane.buffer = items.into();
        }
        // Take the smallest head while every lane with more has one.
        while page.len() < limit && !lanes.iter().any(|l| l.more && l.buffer.is_empty()) {
            let smallest = lanes
                .iter()
                .enumerate()
                .filter_map(|(i, lane)| lane.buffer.front().map(|head| (i, head)))
                .min_by(|a, b| id(a.1).cmp(id(b.1)))
                .map(|(i, _)| i);
            let Some(item) = smallest.and_then(|i| lanes[i].buffer.pop_front()) else {
                break;
            };
            page.push(item);
        }
        let exhausted = lanes
            .iter()
            .all(|lane| !lane.more && lane.buffer.is_empty());
        if page.len() == limit {
            let next = match exhausted {
                true => None,
                false => page.last().map(|item| id(item).clone()),
            };
            return Ok((page, next));
        }
        if exhausted {
            return Ok((page, None));
        }
    }
}

/// The shard of `views` holding `run_id`: `home` when the run is there,
/// else, for an id of a group member's form, the first other shard holding
/// it (`concurrency` shards read at once); `None` when none holds it.
///
/// # Errors
/// The first failed read, with its shard.
pub(crate) async fn locate(
    views: impl IntoIterator<Item = (u32, WorkflowView)>,
    home: u32,
    run_id: &RunId,
    concurrency: usize,
) -> std::result::Result<Option<u32>, (u32, Error)> {
    let views: Vec<(u32, WorkflowView)> = views.into_iter().collect();
    if let Some((_, view)) = views.iter().find(|(k, _)| *k == home)
        && view
            .status(run_id)
            .await
            .map_err(|err| (home, err))?
            .is_some()
    {
        return Ok(Some(home));
    }
    if !lives_beyond_home(run_id) {
        return Ok(None);
    }
    let searches = views
        .into_iter()
        .filter(|(k, _)| *k != home)
        .map(|(k, view)| async move { (k, view.status(run_id).await) })
        // Collected first: a lazily mapped iterator would put a closure
        // with a higher-ranked lifetime into the future's type, which then
        // is not `Send` for callers (an axum handler).
        .collect::<Vec<_>>();
    let mut searches = std::pin::pin!(stream::iter(searches).buffered(concurrency.max(1)));
    while let Some((k, status)) = searches.next().await {
        if status.map_err(|err| (k, err))?.is_some() {
            return Ok(Some(k));
        }
    }
    Ok(None)
}

/// The lowest of `views`' shards where a run waits on `correlation_key`
/// (the key's waiter is registered there), reading `concurrency` shards at
/// once; `None` when no shard has one. Each view answers as of its last
/// look at its shard: a reader lags its owner by its poll interval.
///
/// # Errors
/// The first failed read, with its shard.
pub(crate) async fn waiter_shard(
    views: impl IntoIterator<Item = (u32, WorkflowView)>,
    correlation_key: &str,
    concurrency: usize,
) -> std::result::Result<Option<u32>, (u32, Error)> {
    let key = crate::store::keys::signal_waiter_kv_key(correlation_key);
    let looks: Vec<_> = views
        .into_iter()
        .map(|(shard, view)| {
            let key = key.clone();
            async move {
                match view.queue().kv_get(&key).await {
                    Ok(waiter) => Ok(waiter.map(|_| shard)),
                    Err(err) => Err((shard, Error::Queue(err))),
                }
            }
        })
        .collect();
    let found: Vec<_> = stream::iter(looks)
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut lowest: Option<u32> = None;
    for look in found {
        if let Some(shard) = look? {
            lowest = Some(lowest.map_or(shard, |low| low.min(shard)));
        }
    }
    Ok(lowest)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use taquba::object_store::ObjectStoreExt;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::view::StatusFilter;
    use crate::{
        GroupMember, NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner,
        WorkflowRuntime,
    };

    fn command_id() -> CommandId {
        "01ARZ3NDEKTSV4RRFFQ69G5FAV".parse().expect("a ULID")
    }

    fn id(text: &str) -> RunId {
        RunId::new(text).expect("valid id")
    }

    /// Every page of a merge over `shards` (each a sorted id list) with
    /// `limit`, and how many shard reads and items read it took.
    async fn pages(shards: &[Vec<RunId>], limit: usize) -> (Vec<Vec<RunId>>, (usize, usize)) {
        let reads = AtomicUsize::new(0);
        let items = AtomicUsize::new(0);
        let fetch = |k: u32, after: Option<RunId>, limit: usize| {
            reads.fetch_add(1, Ordering::SeqCst);
            let ids: Vec<RunId> = shards[k as usize]
                .iter()
                .filter(|id| after.as_ref().is_none_or(|after| *id > after))
                .cloned()
                .collect();
            let more = ids.len() > limit;
            let page: Vec<RunId> = ids.into_iter().take(limit).collect();
            items.fetch_add(page.len(), Ordering::SeqCst);
            let next = more.then(|| page.last().cloned()).flatten();
            async move { Ok((page, next)) }
        };
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let lanes = (0..u32::try_from(shards.len()).expect("few")).collect();
            let (page, next) = merge_pages(lanes, after, limit, 3, |id| id, &fetch)
                .await
                .expect("merge");
            assert!(page.len() <= limit);
            if next.is_some() {
                assert_eq!(page.len(), limit, "a page with a cursor is full");
                assert_eq!(next.as_ref(), page.last(), "the cursor is the last id");
            }
            all.push(page);
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
            assert!(all.len() < 1000, "the pages end");
        }
        (
            all,
            (reads.load(Ordering::SeqCst), items.load(Ordering::SeqCst)),
        )
    }

    #[tokio::test]
    async fn merged_pages_are_the_pages_of_one_store() {
        let ids: Vec<RunId> = (0..37).map(|i| id(&format!("r{i:03}"))).collect();
        // Uneven spreads: round robin, everything on one shard, runs of
        // neighbours on one shard, an empty shard.
        let spreads: Vec<Vec<Vec<RunId>>> = vec![
            (0..4)
                .map(|k| ids.iter().skip(k).step_by(4).cloned().collect())
                .collect(),
            vec![Vec::new(), ids.clone(), Vec::new()],
            ids.chunks(5)
                .fold(vec![Vec::new(); 3], |mut shards, chunk| {
                    let k = chunk.len() % 3 + shards[0].len() % 2;
                    shards[k].extend(chunk.iter().cloned());
                    shards
                }),
            vec![ids[..10].to_vec(), ids[10..].to_vec()],
        ];
        for shards in &spreads {
            let mut shards = shards.clone();
            for shard in &mut shards {
                shard.sort();
            }
            for limit in [1, 2, 3, 5, 7, 10, 36, 37, 38, 100] {
                let (pages, _) = pages(&shards, limit).await;
                let flat: Vec<RunId> = pages.iter().flatten().cloned().collect();
                assert_eq!(flat, ids, "limit {limit} over {shards:?}");
                assert_eq!(
                    pages.len(),
                    ids.len().div_ceil(limit).max(1),
                    "limit {limit}"
                );
            }
        }
        let (pages, _) = pages(&[Vec::new(), Vec::new()], 5).await;
        assert_eq!(pages, vec![Vec::<RunId>::new()]);
    }

    #[tokio::test]
    async fn an_even_spread_reads_each_shard_about_once_per_page() {
        let ids: Vec<RunId> = (0..400).map(|i| id(&format!("r{i:04}"))).collect();
        let shards: Vec<Vec<RunId>> = (0..8)
            .map(|k| ids.iter().skip(k).step_by(8).cloned().collect())
            .collect();
        let (even, (reads, items)) = pages(&shards, 100).await;
        assert_eq!(even.len(), 4);
        // One read per shard per page; a refill now and then. Each page
        // reads its 100 items and a little slack from each shard, not 100
        // from every shard (800).
        assert!(
            reads <= 4 * 8 + 8,
            "{reads} shard reads for 4 pages of 8 shards"
        );
        assert!(
            items <= 4 * (100 + 2 * 8),
            "{items} items read for 400 listed"
        );
        println!("8 shards, 400 ids, pages of 100: {reads} shard reads, {items} items read");
        // Everything on one shard of eight: that shard is read again where
        // its share ran out, the others once per page.
        let skewed: Vec<Vec<RunId>> = std::iter::once(ids.clone())
            .chain((1..8).map(|_| Vec::new()))
            .collect();
        let (skewed, (reads, items)) = pages(&skewed, 100).await;
        assert_eq!(skewed.len(), 4);
        assert!(items <= 4 * (100 + 14), "{items} items read for 400 listed");
        println!(
            "1 of 8 shards holding 400 ids, pages of 100: {reads} shard reads, {items} items read"
        );
    }

    /// A runner that ends every run at once, with its input as result.
    struct Done;
    impl StepRunner for Done {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            })
        }
    }

    type Runtime = WorkflowRuntime<Done, NoopTerminalHook>;

    /// A cluster of `shards` shards on `bucket` at `root`, each shard run by
    /// a runtime of its own (queue path "db", default memo prefix) with its
    /// worker running.
    async fn cluster(
        bucket: Arc<dyn ObjectStore>,
        root: &str,
        shards: u32,
    ) -> (ClusterRecord, Vec<(Runtime, crate::RunnerHandle)>) {
        let record = ClusterRecord::create_or_open(bucket.clone(), root, shards)
            .await
            .expect("the cluster record");
        let mut runtimes = Vec::new();
        for k in 0..shards {
            let store = shard_store(bucket.clone(), root, k).expect("a shard store");
            let queue = Arc::new(
                taquba::Queue::open(store.clone(), SHARD_QUEUE_PATH)
                    .await
                    .expect("open the shard's queue"),
            );
            let runtime = WorkflowRuntime::builder(queue, store, Done, NoopTerminalHook)
                .poll_interval(Duration::from_millis(20))
                .build();
            let worker = runtime.spawn(std::future::pending::<()>());
            runtimes.push((runtime, worker));
        }
        (record, runtimes)
    }

    /// Submit run `run_id` to its home shard's runtime and wait for its end.
    async fn run_to_end(
        record: &ClusterRecord,
        runtimes: &[(Runtime, crate::RunnerHandle)],
        run_id: &RunId,
    ) {
        let runtime = &runtimes[record.shard_of(run_id.as_str()) as usize].0;
        runtime
            .submit(RunSpec {
                run_id: Some(run_id.clone()),
                input: run_id.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .expect("submit");
        tokio::time::timeout(Duration::from_secs(30), runtime.wait(run_id))
            .await
            .expect("ends in time")
            .expect("wait");
    }

    #[tokio::test]
    async fn listings_merge_the_shards_and_reads_go_to_the_run() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (record, runtimes) = cluster(bucket.clone(), "prod", 4).await;
        let ids: Vec<RunId> = (0..24).map(|i| id(&format!("order-{i:02}"))).collect();
        for run_id in &ids {
            run_to_end(&record, &runtimes, run_id).await;
        }
        let homes: std::collections::BTreeSet<u32> =
            ids.iter().map(|r| record.shard_of(r.as_str())).collect();
        assert_eq!(homes.len(), 4, "the runs spread over every shard");
        let view = ClusterView::new(
            record.clone(),
            runtimes
                .iter()
                .map(|(r, _)| Some(r.view().clone()))
                .collect(),
        )
        .expect("one view per shard");

        for limit in [1, 3, 5, 24, 25] {
            let mut listed = Vec::new();
            let mut after: Option<RunId> = None;
            loop {
                let mut filter = RunFilter::new()
                    .status(StatusFilter::Terminated)
                    .limit(limit);
                if let Some(after) = after.take() {
                    filter = filter.after(after);
                }
                let page = view.runs(&filter).await.expect("a page");
                listed.extend(page.runs.iter().map(|r| r.run_id.clone()));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            assert_eq!(listed, ids, "limit {limit}");
        }
        let active = view
            .runs(&RunFilter::new().status(StatusFilter::Active))
            .await
            .expect("active");
        assert!(active.runs.is_empty() && active.next.is_none());

        let run_id = &ids[7];
        let home = view.shard_of_run(run_id);
        assert_eq!(view.locate_run(run_id).await.expect("locate"), Some(home));
        let (shard, details) = view.run(run_id).await.expect("run").expect("found");
        assert_eq!((shard, &details.run_id), (home, run_id));
        let status = view.status(run_id).await.expect("status").expect("found");
        assert!(matches!(status.state, crate::RunState::Terminated(_)));
        let outcome = view.outcome(run_id).await.expect("outcome").expect("found");
        assert_eq!(outcome.result.as_deref(), Some(run_id.as_bytes()));
        assert!(view.steps(run_id).await.expect("steps").is_some());
        let missing = id("never-submitted");
        assert_eq!(view.locate_run(&missing).await.expect("locate"), None);
        assert!(view.run(&missing).await.expect("run").is_none());
        assert!(view.outcome(&missing).await.expect("outcome").is_none());

        let err = view
            .command(9, &command_id())
            .await
            .expect_err("no shard 9");
        assert!(err.to_string().contains("no shard 9"), "{err}");
        for (runtime, worker) in runtimes {
            worker.shutdown().await.expect("shutdown");
            drop(runtime);
        }
    }

    #[tokio::test]
    async fn a_group_and_its_members_are_read_from_the_group_shard() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (record, runtimes) = cluster(bucket.clone(), "", 4).await;
        let view = ClusterView::new(
            record.clone(),
            runtimes
                .iter()
                .map(|(r, _)| Some(r.view().clone()))
                .collect(),
        )
        .expect("views");
        let mut group_ids = Vec::new();
        for g in 0..5 {
            let group_id = id(&format!("batch-{g}"));
            let runtime = &runtimes[view.shard_of_group(&group_id) as usize].0;
            let members: Vec<GroupMember> = (0..3)
                .map(|m| GroupMember {
                    key: format!("m{m}"),
                    input: vec![m],
                })
                .collect();
            runtime
                .group(group_id.clone())
                .submit(members, &Default::default())
                .await
                .expect("submit the group");
            group_ids.push(group_id);
        }
        for limit in [1, 2, 5, 6] {
            let mut listed = Vec::new();
            let mut after: Option<RunId> = None;
            loop {
                let page = view.groups(after.as_ref(), limit).await.expect("groups");
                listed.extend(page.groups.iter().map(|g| g.group_id.clone()));
                match page.next {
                    Some(next) => after = Some(next),
                    None => break,
                }
            }
            assert_eq!(listed, group_ids, "limit {limit}");
        }
        // A member found away from its home shard.
        let mut away = 0;
        for group_id in &group_ids {
            let shard = view.shard_of_group(group_id);
            let status = view.group(group_id).await.expect("group").expect("found");
            assert_eq!(status.total, 3);
            let members = view
                .runs(&RunFilter::new().group(group_id.clone()))
                .await
                .expect("members");
            assert_eq!(members.runs.len(), 3);
            for member in &members.runs {
                assert_eq!(
                    view.locate_run(&member.run_id).await.expect("locate"),
                    Some(shard)
                );
                assert_eq!(
                    view.shard_of_listed(&member.run_id, member.group.as_ref()),
                    shard
                );
                if view.shard_of_run(&member.run_id) != shard {
                    away += 1;
                    let (found, details) = view
                        .run(&member.run_id)
                        .await
                        .expect("run")
                        .expect("found away from home");
                    assert_eq!(found, shard);
                    assert_eq!(details.group.as_ref(), Some(group_id));
                }
            }
        }
        assert!(away > 0, "some member lives away from its home shard");
        for (runtime, worker) in runtimes {
            worker.shutdown().await.expect("shutdown");
            drop(runtime);
        }
    }

    #[tokio::test]
    async fn open_reads_every_shard_from_another_process_and_passes_over_unopened_ones() {
        let bucket: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (record, runtimes) = cluster(bucket.clone(), "prod/wf", 3).await;
        // A fourth shard no process has opened: grow the record by hand.
        let grown = ClusterRecord {
            shards: 4,
            ..record.clone()
        };
        bucket
            .put(
                &cluster_record_path("prod/wf"),
                rmp_serde::to_vec_named(&grown).expect("encode").into(),
            )
            .await
            .expect("put");
        let ids: Vec<RunId> = (0..12)
            .map(|i| id(&format!("job-{i:02}")))
            .filter(|r| grown.shard_of(r.as_str()) < 3)
            .collect();
        for run_id in &ids {
            run_to_end(&record, &runtimes, run_id).await;
        }

        let err = ClusterView::open(bucket.clone(), "elsewhere", &ClusterViewOptions::default())
            .await
            .expect_err("no cluster there");
        assert!(
            err.to_string().contains("no cluster at root `elsewhere`"),
            "{err}"
        );
        let options = ClusterViewOptions::default()
            .reader(
                ReaderOptions::default()
                    .mode(ReaderMode::FollowLatest)
                    .manifest_poll_interval(Duration::from_millis(50)),
            )
            .concurrency(2)
            .open_timeout(Duration::from_secs(30));
        let view = ClusterView::open(bucket.clone(), "prod/wf", &options)
            .await
            .expect("open");
        assert_eq!(view.shard_count(), 4);
        assert!((0..3).all(|k| view.shard(k).is_some() && view.reader(k).is_some()));
        assert!(view.shard(3).is_none() && view.reader(3).is_none());
        let err = view.command(3, &command_id()).await.expect_err("not open");
        assert!(
            matches!(err, ClusterViewError::ShardNotOpen { shard: 3 }),
            "{err}"
        );

        // The readers follow the writers' commits within a few polls.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let listed = loop {
            let page = view
                .runs(&RunFilter::new().status(StatusFilter::All).limit(5))
                .await
                .expect("runs");
            let mut listed: Vec<RunId> = page.runs.iter().map(|r| r.run_id.clone()).collect();
            let mut next = page.next;
            while let Some(after) = next {
                let page = view
                    .runs(
                        &RunFilter::new()
                            .status(StatusFilter::All)
                            .limit(5)
                            .after(after),
                    )
                    .await
                    .expect("runs");
                listed.extend(page.runs.iter().map(|r| r.run_id.clone()));
                next = page.next;
            }
            if listed.len() == ids.len() || tokio::time::Instant::now() > deadline {
                break listed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(listed, ids);
        view.close().await.expect("close");
        for (runtime, worker) in runtimes {
            worker.shutdown().await.expect("shutdown");
            drop(runtime);
        }
    }

    #[test]
    fn a_view_takes_one_entry_per_shard() {
        let record = ClusterRecord {
            format: super::super::CLUSTER_FORMAT,
            shards: 3,
            hash: super::super::HASH_NAME.to_string(),
            created_at_ms: 0,
        };
        let err = ClusterView::new(record, vec![None, None]).expect_err("two for three");
        assert!(
            err.to_string().contains("3 shards, but 2 shard views"),
            "{err}"
        );
        let member = crate::coordination::members::member_run_id(&id("g"), "k");
        assert!(is_member_run_id(&member), "{member}");
        assert!(!is_member_run_id(&id("order-7")));
    }
}
