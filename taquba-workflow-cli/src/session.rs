//! Opening a store for a command: the location, the queue's path inside it
//! (`--db`, or discovered: the top-level prefixes holding a SlateDB
//! manifest), a read-only [`QueueReader`] on it, and the runtime whose runs
//! a command reads (`--queue`, `--memo-prefix`).
//!
//! The reader follows the latest manifest without a checkpoint
//! ([`ReaderMode::FollowLatest`]): it writes nothing to the store, so
//! read-only credentials suffice and a copied store stays as it was.

use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::{QueueReader, ReaderMode, ReaderOptions};
use taquba_workflow::{MemoStore, WorkflowView, limits::DEFAULT_QUEUE_NAME, view::RuntimeInfo};

use crate::cli::Global;
use crate::error::{CliError, CliResult};
use crate::location::{self, Location, LocationError};

/// The default bound of a queue's open; see [`open_timeout`].
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable overriding [`DEFAULT_OPEN_TIMEOUT`], in whole
/// seconds (the examples' store helper reads the same one).
pub const OPEN_TIMEOUT_ENV: &str = "TAQUBA_OPEN_TIMEOUT_SECS";
/// How often the reader looks for new state: the lag of `--wait` behind
/// the owner's commits.
pub const READER_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// The bound of a queue's open: `TAQUBA_OPEN_TIMEOUT_SECS` seconds when set
/// to a positive integer, else [`DEFAULT_OPEN_TIMEOUT`].
pub fn open_timeout() -> Duration {
    std::env::var(OPEN_TIMEOUT_ENV)
        .ok()
        .and_then(|secs| secs.trim().parse::<u64>().ok())
        .filter(|secs| *secs > 0)
        .map_or(DEFAULT_OPEN_TIMEOUT, Duration::from_secs)
}

/// A store location resolved to an object store and a queue path.
pub struct Target {
    /// The location as parsed.
    pub location: Location,
    /// Its object store.
    pub store: Arc<dyn ObjectStore>,
    /// The queue's path inside the store.
    pub db_path: String,
}

impl Target {
    /// Resolve `--db` in the store `location` already opened and probed
    /// ([`open_location`]): take `--db` or discover the one queue in the
    /// store.
    ///
    /// # Errors
    /// [`CliError::Usage`] when the store holds no queue or several and no
    /// `--db` picks one; the listing's errors.
    pub async fn resolve_in(
        global: &Global,
        location: Location,
        store: Arc<dyn ObjectStore>,
    ) -> CliResult<Self> {
        let db_path = match &global.db {
            Some(path) => path.trim_matches('/').to_string(),
            None => {
                let found = discover_queues(store.as_ref(), &location).await?;
                match found.as_slice() {
                    [one] => one.clone(),
                    [] if is_queue_itself(store.as_ref()).await => {
                        return Err(CliError::Usage(format!(
                            "{location} is a queue's own directory (it holds a SlateDB manifest): pass the store it lives in as --store (its parent) and its name as --db"
                        )));
                    }
                    [] => {
                        return Err(CliError::Usage(format!(
                            "no queue found in {location}: no top-level prefix holds a SlateDB manifest (is this the store the runtime writes to? pass --db PATH for a queue below the top level)"
                        )));
                    }
                    several => {
                        return Err(CliError::Usage(format!(
                            "{location} holds several queues ({}): pass --db with one of them",
                            several.join(", ")
                        )));
                    }
                }
            }
        };
        Ok(Self {
            location,
            store,
            db_path,
        })
    }

    /// Open a read-only reader of the queue, bounded by [`open_timeout`].
    ///
    /// # Errors
    /// [`CliError::Open`] (naming the path) when the queue does not exist
    /// or cannot be read; [`CliError::Timeout`].
    pub async fn open_reader(&self) -> CliResult<QueueReader> {
        let options = ReaderOptions::default()
            .mode(ReaderMode::FollowLatest)
            .manifest_poll_interval(READER_POLL_INTERVAL);
        let after = open_timeout();
        let open = QueueReader::open_with_options(self.store.clone(), &self.db_path, options);
        match tokio::time::timeout(after, open).await {
            Ok(Ok(reader)) => Ok(reader),
            Ok(Err(source)) => Err(CliError::Open {
                store: self.location.to_string(),
                path: self.db_path.clone(),
                source,
            }),
            Err(_) => Err(LocationError::Timeout {
                what: "opening the queue",
                location: self.location.to_string(),
                after,
            }
            .into()),
        }
    }
}

/// Parse `--store`, build its object store and probe it (one listing).
///
/// # Errors
/// [`CliError::Usage`] without `--store`; the location's errors.
pub async fn open_location(global: &Global) -> CliResult<(Location, Arc<dyn ObjectStore>)> {
    let Some(given) = global.store.as_deref() else {
        return Err(CliError::Usage(
            "no store given: pass --store DIR|file:///DIR|s3://BUCKET/PREFIX (or set TAQUBA_WORKFLOW_STORE)"
                .to_string(),
        ));
    };
    let location = Location::parse(given)?;
    let store = location.object_store()?;
    location::probe(store.as_ref(), &location).await?;
    Ok((location, store))
}

/// The top-level prefixes of `store` that hold a SlateDB manifest
/// (`{prefix}/manifest/`), sorted.
///
/// # Errors
/// [`CliError::Listing`]; [`CliError::Store`] on a timeout.
pub async fn discover_queues(
    store: &dyn ObjectStore,
    location: &Location,
) -> CliResult<Vec<String>> {
    let bound = location::PROBE_TIMEOUT;
    let timeout = || LocationError::Timeout {
        what: "listing",
        location: location.to_string(),
        after: bound,
    };
    let top = tokio::time::timeout(bound, store.list_with_delimiter(None))
        .await
        .map_err(|_| timeout())??;
    let mut found = Vec::new();
    for prefix in top.common_prefixes {
        let manifest = prefix.clone().join("manifest");
        let listing = tokio::time::timeout(bound, store.list_with_delimiter(Some(&manifest)))
            .await
            .map_err(|_| timeout())??;
        if !listing.objects.is_empty() {
            found.push(prefix.to_string());
        }
    }
    found.sort();
    Ok(found)
}

/// Whether `store` itself is a queue's path (a SlateDB manifest at its
/// top level): the usual mistake of passing the queue's directory as the
/// store.
async fn is_queue_itself(store: &dyn ObjectStore) -> bool {
    let manifest = taquba::object_store::path::Path::from("manifest");
    matches!(
        tokio::time::timeout(location::PROBE_TIMEOUT, store.list_with_delimiter(Some(&manifest))).await,
        Ok(Ok(listing)) if !listing.objects.is_empty()
    )
}

/// The runtime a command reads: its queue name and memo prefix, how they
/// were chosen, and the view of its runs.
pub struct Runtime {
    /// The runtime's queue name.
    pub queue_name: String,
    /// The runtime's memo prefix.
    pub memo_prefix: String,
    /// The view of its runs.
    pub view: WorkflowView,
}

/// The runtime picked among those `recorded` in the store: `--queue`, else
/// the only one recorded, with the memo prefix it recorded (`--memo-prefix`
/// may only repeat it). A store with none recorded (written before
/// runtimes recorded themselves) takes both flags as given, else the
/// runtime's defaults: [`DEFAULT_QUEUE_NAME`] and [`default_memo_prefix`].
///
/// # Errors
/// - [`CliError::Usage`] when several runtimes are recorded and no
///   `--queue` picks one, listing them.
/// - [`CliError::Refused`] when the store records runtimes and `--queue`
///   names none of them, or `--memo-prefix` is not the picked runtime's:
///   no process reads such a runtime's inbox (a command sent there would
///   wait forever) and its records are not the store's. The message names
///   the value and lists what the store records.
pub fn choose_runtime(
    recorded: &[RuntimeInfo],
    queue: Option<&str>,
    memo_prefix: Option<&str>,
) -> CliResult<(String, String, Option<RuntimeInfo>)> {
    let listed = || {
        recorded
            .iter()
            .map(|r| {
                format!(
                    "queue {:?} with memo prefix {:?}",
                    r.queue_name, r.memo_prefix
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let info = match queue {
        Some(queue) if !recorded.is_empty() => {
            match recorded.iter().find(|r| r.queue_name == queue) {
                Some(info) => Some(info.clone()),
                None => {
                    return Err(CliError::Refused(format!(
                        "the store records no runtime on queue {queue:?} (it records {}): pass one of them to --queue",
                        listed()
                    )));
                }
            }
        }
        Some(_) => None,
        None => match recorded {
            [] => None,
            [one] => Some(one.clone()),
            several => {
                return Err(CliError::Usage(format!(
                    "the store holds several runtimes ({}): pass --queue with one of them",
                    several
                        .iter()
                        .map(|r| r.queue_name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        },
    };
    let queue_name = match (queue, &info) {
        (Some(queue), _) => queue.to_string(),
        (None, Some(info)) => info.queue_name.clone(),
        (None, None) => DEFAULT_QUEUE_NAME.to_string(),
    };
    let memo_prefix = match (memo_prefix, &info) {
        (Some(prefix), Some(info)) if prefix != info.memo_prefix => {
            return Err(CliError::Refused(format!(
                "--memo-prefix {prefix:?} is not the memo prefix of the runtime on queue {:?}, which records {:?}: no process reads a command sent under it (the store records {})",
                info.queue_name,
                info.memo_prefix,
                listed()
            )));
        }
        (Some(prefix), _) => prefix.to_string(),
        (None, Some(info)) => info.memo_prefix.clone(),
        (None, None) => default_memo_prefix(&queue_name),
    };
    Ok((queue_name, memo_prefix, info))
}

/// The memo prefix of a runtime on `queue_name` built without
/// `memo_prefix`: `{queue_name}-memo`, as `WorkflowRuntimeBuilder::build`
/// derives it (the runtime exports no constant or function for it).
pub fn default_memo_prefix(queue_name: &str) -> String {
    format!("{queue_name}-memo")
}

/// An open store: the target and a reader of its queue.
pub struct Session {
    /// Where the store is.
    pub target: Target,
    /// The read-only reader of its queue.
    pub reader: QueueReader,
}

impl Session {
    /// Resolve the target in the store `location` already opened and
    /// probed ([`open_location`]) and open its reader.
    ///
    /// # Errors
    /// As [`Target::resolve_in`] and [`Target::open_reader`].
    pub async fn open_in(
        global: &Global,
        location: Location,
        store: Arc<dyn ObjectStore>,
    ) -> CliResult<Self> {
        let target = Target::resolve_in(global, location, store).await?;
        let reader = target.open_reader().await?;
        Ok(Self { target, reader })
    }

    /// The runtime the command reads (see [`choose_runtime`]).
    ///
    /// # Errors
    /// As [`choose_runtime`]; storage errors.
    pub async fn runtime(&self, global: &Global) -> CliResult<Runtime> {
        let recorded = WorkflowView::runtimes(self.reader.view()).await?;
        let (queue_name, memo_prefix, _) = choose_runtime(
            &recorded,
            global.queue.as_deref(),
            global.memo_prefix.as_deref(),
        )?;
        let view = WorkflowView::new(
            self.reader.view().clone(),
            MemoStore::new(self.target.store.clone(), memo_prefix.clone()),
        );
        Ok(Runtime {
            queue_name,
            memo_prefix,
            view,
        })
    }

    /// Close the reader (stops its manifest polling). A failure is not the
    /// command's: it is reported on stderr.
    pub async fn close(self) {
        if let Err(e) = self.reader.close().await {
            eprintln!("taquba-workflow: closing the reader failed: {e}");
        }
    }
}
