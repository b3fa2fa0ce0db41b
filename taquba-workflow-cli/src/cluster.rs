//! A cluster root (`--store` pointing at a location holding a cluster
//! record at its top level, `cluster`): every shard `k` under
//! `shards/{k}/` is opened as a store of its own ([`ShardSession`]: its
//! location, a read-only reader of its queue at `--db`, default `db`, and
//! the runtime it records), and a [`ClusterView`] over all of them serves
//! the merged listings. A run's reads and commands go to the shard that
//! holds it; a key-only signal to the key's home shard
//! ([`ClusterSession::signal_shard`], the cluster runtime's rule).
//!
//! Each shard is opened through its own location, so on a local directory
//! its store is a `LocalFileSystem` rooted at the shard's directory: the
//! inbox of a shard is read and written with the same guards as a single
//! store's (no link followed, nothing but regular files opened), and every
//! call is bounded as for any store. A shard directory that is a link is
//! refused.

use std::sync::Arc;

use futures_util::StreamExt;
use taquba::object_store::ObjectStore;
use taquba_workflow::cluster::{
    ClusterRecord, ClusterView, LeaseState, SHARD_QUEUE_PATH, shard_prefix,
};
use taquba_workflow::view::{GroupPage, RunFilter, RunPage, RunSummary};
use taquba_workflow::{RunId, RunStatus, WorkflowView};

use crate::cli::Global;
use crate::error::{CliError, CliResult};
use crate::location::Location;
use crate::session::{Runtime, Session, Target};

/// Shards opened (and read, for `store info`) at once.
pub const SHARD_CONCURRENCY: usize = 8;

/// The cluster record at the top level of `store` (at `location`), `None`
/// when there is none (a single store). In a local directory the record
/// is read only when `cluster` is a regular file: a directory of that name
/// is a queue's (no cluster), and anything else (a link, a FIFO that
/// would block its reader) is refused without being opened.
///
/// # Errors
/// [`CliError::Cluster`] for a record this build cannot use (a later
/// format, another hash, bytes that do not decode) or a store that fails;
/// [`CliError::Refused`] for a local `cluster` that is not a regular file
/// or a directory.
pub async fn detect(
    location: &Location,
    store: &Arc<dyn ObjectStore>,
) -> CliResult<Option<ClusterRecord>> {
    if let Location::Dir(dir) = location {
        let path = dir.join("cluster");
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(CliError::Refused(format!(
                    "cannot examine {}: {e}",
                    path.display()
                )));
            }
            Ok(meta) if meta.is_dir() => return Ok(None),
            Ok(meta) if !meta.file_type().is_file() => {
                return Err(CliError::Refused(format!(
                    "{} is not a regular file (a link, a FIFO or another special file): it is not read as a cluster record",
                    path.display()
                )));
            }
            Ok(_) => {}
        }
    }
    ClusterRecord::open(store.clone(), "")
        .await
        .map_err(|e| CliError::Cluster(e.into()))
}

/// Who holds shard `shard` and under which lease epoch, as `store info`
/// and the dashboard show it: `HOLDER (epoch N)`, `free (epoch N, last
/// HOLDER)`, or `—` for a shard with no lease (a cluster on static
/// ownership, or a shard no process took).
pub async fn shard_owner(cluster: &ClusterSession, shard: u32) -> String {
    let Ok(store) = cluster.location.object_store() else {
        return "—".to_string();
    };
    match taquba_workflow::cluster::read_lease(store, "", shard).await {
        Ok(Some(lease)) => match (lease.state, lease.holder) {
            (LeaseState::Held, Some(holder)) => format!("{holder} (epoch {})", lease.epoch),
            (_, Some(holder)) => format!("free (epoch {}, last {holder})", lease.epoch),
            (_, None) => format!("free (epoch {})", lease.epoch),
        },
        Ok(None) => "—".to_string(),
        Err(e) => format!("unreadable lease: {e}"),
    }
}

/// One open shard: its number, its store session and the runtime whose
/// runs it reads.
pub struct ShardSession {
    /// The shard.
    pub shard: u32,
    /// Its location, store and reader.
    pub session: Session,
    /// The runtime recorded in it (queue name, memo prefix, view).
    pub runtime: Runtime,
}

/// An open cluster: its location, record, shards and the view over all of
/// them.
pub struct ClusterSession {
    /// The cluster root, as given.
    pub location: Location,
    /// The cluster record.
    pub record: ClusterRecord,
    /// The shards in order; `None` for a shard whose queue no process has
    /// created yet (it holds nothing).
    pub shards: Vec<Option<ShardSession>>,
    /// The merged and routed reads.
    pub view: ClusterView,
}

impl ClusterSession {
    /// Open every shard of the cluster `record` describes at `location`
    /// ([`SHARD_CONCURRENCY`] at a time, each bounded as a store's open).
    ///
    /// # Errors
    /// The first shard's error that is not "no queue yet" (its readers
    /// opened so far are closed): a shard directory that is a link, a
    /// queue that cannot be read, several runtimes in a shard and no
    /// `--queue`.
    pub async fn open(
        global: &Global,
        location: Location,
        record: ClusterRecord,
    ) -> CliResult<Self> {
        let opens = (0..record.shards)
            .map(|k| {
                let location = location.clone();
                async move { open_shard(global, &location, k).await }
            })
            .collect::<Vec<_>>();
        let opened: Vec<CliResult<Option<ShardSession>>> = futures_util::stream::iter(opens)
            .buffered(SHARD_CONCURRENCY)
            .collect()
            .await;
        let mut shards = Vec::with_capacity(opened.len());
        let mut failed = None;
        for shard in opened {
            match shard {
                Ok(shard) => shards.push(shard),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            for shard in shards.into_iter().flatten() {
                shard.session.close().await;
            }
            return Err(e);
        }
        let views = shards
            .iter()
            .map(|shard| shard.as_ref().map(|s| s.runtime.view.clone()))
            .collect();
        let view = ClusterView::new(record.clone(), views)
            .map_err(CliError::Cluster)?
            .with_concurrency(SHARD_CONCURRENCY);
        Ok(Self {
            location,
            record,
            shards,
            view,
        })
    }

    /// Shard `shard`, when it is open.
    pub fn shard(&self, shard: u32) -> Option<&ShardSession> {
        self.shards.get(shard as usize)?.as_ref()
    }

    /// The open shards, in order.
    pub fn open_shards(&self) -> impl Iterator<Item = &ShardSession> {
        self.shards.iter().flatten()
    }

    /// The shard holding run `id`.
    ///
    /// # Errors
    /// [`CliError::RunNotInCluster`] when no shard holds it; storage
    /// errors.
    pub async fn run_shard(&self, id: &RunId) -> CliResult<&ShardSession> {
        let found = self.view.locate_run(id).await?;
        found
            .and_then(|k| self.shard(k))
            .ok_or_else(|| CliError::RunNotInCluster {
                run_id: id.clone(),
                shards: self.record.shards,
                home: self.view.shard_of_run(id),
            })
    }

    /// The shard a key-only signal on `key` goes to, by the cluster
    /// runtime's rule ([`ClusterView::signal_shard`]: the lowest shard where
    /// a run waits on the key, else the key's home shard), which must be
    /// open.
    ///
    /// # Errors
    /// [`CliError::Refused`] when that shard has no queue yet; the view's
    /// read errors.
    pub async fn signal_shard(&self, key: &str) -> CliResult<&ShardSession> {
        let k = self
            .view
            .signal_shard(key)
            .await
            .map_err(CliError::Cluster)?;
        self.shard(k).ok_or_else(|| {
            CliError::Refused(format!(
                "the signal {key:?} goes to its home shard {k}, which has no queue yet (no process has opened {}): nothing was sent",
                self.location.below(&shard_prefix("", k))
            ))
        })
    }

    /// The cluster's location and record path, for headers:
    /// `LOCATION (cluster of N shards)`.
    pub fn label(&self) -> String {
        format!(
            "{} (cluster of {} shards)",
            self.location, self.record.shards
        )
    }

    /// Close every shard's reader (failures reported on stderr).
    pub async fn close(self) {
        for shard in self.shards.into_iter().flatten() {
            shard.session.close().await;
        }
    }
}

/// The location of shard `k` below the cluster root `root`, `None` when a
/// local shard has no directory (nothing has written it).
///
/// # Errors
/// [`CliError::Refused`] for a shard directory (or `shards/`) that is a
/// link or not a directory, or that cannot be examined.
fn shard_location(root: &Location, k: u32) -> CliResult<Option<Location>> {
    let location = root.below(&shard_prefix("", k));
    if let (Location::Dir(root_dir), Location::Dir(dir)) = (root, &location) {
        for path in [root_dir.join("shards"), dir.clone()] {
            match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => {
                    return Err(CliError::Refused(format!(
                        "cannot examine the shard directory {}: {e}",
                        path.display()
                    )));
                }
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(CliError::Refused(format!(
                        "{} is a symbolic link: a cluster's shard directories are plain directories, and links are not followed",
                        path.display()
                    )));
                }
                Ok(meta) if !meta.is_dir() => {
                    return Err(CliError::Refused(format!(
                        "{} is not a directory: a cluster's shards are directories under shards/",
                        path.display()
                    )));
                }
                Ok(_) => {}
            }
        }
    }
    Ok(Some(location))
}

/// Open shard `k` of the cluster at `root`: `None` when its queue does not
/// exist yet.
async fn open_shard(global: &Global, root: &Location, k: u32) -> CliResult<Option<ShardSession>> {
    let Some(location) = shard_location(root, k)? else {
        return Ok(None);
    };
    let store = location.object_store()?;
    let db_path = global
        .db
        .as_deref()
        .map_or(SHARD_QUEUE_PATH, |db| db.trim_matches('/'))
        .to_string();
    let target = Target {
        location,
        store,
        db_path,
    };
    let reader = match target.open_reader().await {
        Ok(reader) => reader,
        Err(CliError::Open {
            source: taquba::Error::StoreNotInitialized { .. },
            ..
        }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let session = Session { target, reader };
    match session.runtime(global).await {
        Ok(runtime) => Ok(Some(ShardSession {
            shard: k,
            session,
            runtime,
        })),
        Err(e) => {
            session.close().await;
            Err(match e {
                CliError::Usage(message) => CliError::Usage(format!("shard {k}: {message}")),
                other => other,
            })
        }
    }
}

/// Where the listings and run reads of a command go: one store's view, or
/// a cluster's merged view.
#[derive(Clone, Copy)]
pub enum Reads<'a> {
    /// A single store.
    Store(&'a WorkflowView),
    /// Every shard of a cluster.
    Cluster(&'a ClusterView),
}

impl Reads<'_> {
    /// One page of runs ([`WorkflowView::runs`], merged over the shards).
    ///
    /// # Errors
    /// Storage errors (naming the shard on a cluster).
    pub async fn runs(self, filter: &RunFilter) -> CliResult<RunPage> {
        Ok(match self {
            Reads::Store(view) => view.runs(filter).await?,
            Reads::Cluster(view) => view.runs(filter).await?,
        })
    }

    /// One page of groups ([`WorkflowView::groups`], merged over the
    /// shards).
    ///
    /// # Errors
    /// Storage errors (naming the shard on a cluster).
    pub async fn groups(self, after: Option<&RunId>, limit: usize) -> CliResult<GroupPage> {
        Ok(match self {
            Reads::Store(view) => view.groups(after, limit).await?,
            Reads::Cluster(view) => view.groups(after, limit).await?,
        })
    }

    /// The status of run `id`, from the shard holding it on a cluster.
    ///
    /// # Errors
    /// Storage errors (naming the shard on a cluster).
    pub async fn status(self, id: &RunId) -> CliResult<Option<RunStatus>> {
        Ok(match self {
            Reads::Store(view) => view.status(id).await?,
            Reads::Cluster(view) => view.status(id).await?,
        })
    }

    /// The shard a listed run is in; `None` for a single store.
    pub fn shard_of(self, run: &RunSummary) -> Option<u32> {
        match self {
            Reads::Store(_) => None,
            Reads::Cluster(view) => Some(view.shard_of_listed(&run.run_id, run.group.as_ref())),
        }
    }
}
