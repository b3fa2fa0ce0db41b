//! The shards this process hosts: each an ordinary [`WorkflowRuntime`] over
//! the shard's queue, with its worker loop on a task of its own; opened
//! when the process comes to own the shard, handed over in order (stop
//! claiming, drain within a bound, close the queue) when it stops owning
//! it, and dropped at once when it was fenced out.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::{OpenOptions, Queue};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::ClusterError;
use super::route::shard_store;
use crate::error::Result as RuntimeResult;
use crate::hooks::terminal::TerminalHook;
use crate::runner::StepRunner;
use crate::runtime::{WorkflowRuntime, WorkflowRuntimeBuilder};

/// The path of a shard's queue inside the shard's store.
pub const SHARD_QUEUE_PATH: &str = "db";

/// Builds the queue options of a shard (`OpenOptions` is not `Clone`).
pub(crate) type OpenOptionsFn = Arc<dyn Fn(u32) -> OpenOptions + Send + Sync>;
/// Configures a shard's runtime builder.
pub(crate) type ConfigureFn<R, H> =
    Arc<dyn Fn(WorkflowRuntimeBuilder<R, H>) -> WorkflowRuntimeBuilder<R, H> + Send + Sync>;

/// What every shard's runtime is built from.
pub(crate) struct ShardFactory<R, H> {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) root: String,
    pub(crate) runner: R,
    pub(crate) hook: H,
    pub(crate) open_options: OpenOptionsFn,
    pub(crate) configure: ConfigureFn<R, H>,
}

/// One hosted shard.
pub(crate) struct LocalShard<R, H> {
    pub(crate) shard: u32,
    /// The lease epoch it is held at (`None` under static ownership).
    pub(crate) epoch: Option<u64>,
    pub(crate) runtime: WorkflowRuntime<R, H>,
    queue: Arc<Queue>,
    stop: CancellationToken,
    worker: std::sync::Mutex<Option<JoinHandle<RuntimeResult<()>>>>,
}

/// How a hosted shard's worker loop ended on its own.
pub(crate) enum Ended {
    /// The store ran past its outage budget: host the shard again once the
    /// store answers.
    Outage(crate::OutageExceeded),
    /// Another process opened the shard's queue, or the loop failed
    /// otherwise: the shard is not this process's any more.
    Fenced(String),
}

impl<R, H> LocalShard<R, H> {
    /// How the worker loop ended, once it has (`None` while it runs).
    pub(crate) async fn ended(&self) -> Option<Ended> {
        let worker = {
            let Ok(mut worker) = self.worker.lock() else {
                return Some(Ended::Fenced("the shard's worker slot is poisoned".into()));
            };
            match worker.as_ref() {
                Some(handle) if !handle.is_finished() => return None,
                _ => worker.take(),
            }
        };
        let Some(worker) = worker else {
            return Some(Ended::Fenced("the shard's worker loop is gone".into()));
        };
        Some(match worker.await {
            Ok(Err(crate::Error::StoreOutage(outage))) => Ended::Outage(outage),
            Ok(Err(err)) => Ended::Fenced(err.to_string()),
            Ok(Ok(())) => Ended::Fenced("the worker loop returned".into()),
            Err(err) => Ended::Fenced(format!("the worker task failed: {err}")),
        })
    }
}

impl<R, H> ShardFactory<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    /// Open shard `shard`'s queue (which fences any earlier writer), build
    /// its runtime and start its worker loop.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] when the queue does not open.
    pub(crate) async fn open(
        &self,
        shard: u32,
        epoch: Option<u64>,
    ) -> Result<LocalShard<R, H>, ClusterError> {
        let store = shard_store(self.store.clone(), &self.root, shard)?;
        let queue =
            Queue::open_with_options(store.clone(), SHARD_QUEUE_PATH, (self.open_options)(shard))
                .await
                .map_err(|err| ClusterError::Runtime(crate::Error::Queue(err)))?;
        let queue = Arc::new(queue);
        let builder =
            WorkflowRuntime::builder(queue.clone(), store, self.runner.clone(), self.hook.clone());
        let runtime = (self.configure)(builder).build();
        let stop = CancellationToken::new();
        let worker = {
            let (runtime, stop) = (runtime.clone(), stop.clone());
            tokio::spawn(async move { runtime.run(stop.cancelled_owned()).await })
        };
        info!(shard, ?epoch, "cluster shard opened");
        Ok(LocalShard {
            shard,
            epoch,
            runtime,
            queue,
            stop,
            worker: std::sync::Mutex::new(Some(worker)),
        })
    }
}

/// The table of hosted shards. A call takes a shard's runtime out of it
/// (a clone) and never holds the lock across an await.
pub(crate) struct HostedShards<R, H> {
    shards: RwLock<BTreeMap<u32, Arc<LocalShard<R, H>>>>,
}

impl<R, H> Default for HostedShards<R, H> {
    fn default() -> Self {
        Self {
            shards: RwLock::new(BTreeMap::new()),
        }
    }
}

impl<R, H> HostedShards<R, H> {
    pub(crate) fn get(&self, shard: u32) -> Option<Arc<LocalShard<R, H>>> {
        self.shards
            .read()
            .ok()
            .and_then(|shards| shards.get(&shard).cloned())
    }

    pub(crate) fn insert(&self, local: LocalShard<R, H>) {
        if let Ok(mut shards) = self.shards.write() {
            shards.insert(local.shard, Arc::new(local));
        }
    }

    pub(crate) fn remove(&self, shard: u32) -> Option<Arc<LocalShard<R, H>>> {
        self.shards
            .write()
            .ok()
            .and_then(|mut shards| shards.remove(&shard))
    }

    /// The hosted shards, in order.
    pub(crate) fn list(&self) -> Vec<u32> {
        self.shards
            .read()
            .map(|shards| shards.keys().copied().collect())
            .unwrap_or_default()
    }

    pub(crate) fn all(&self) -> Vec<Arc<LocalShard<R, H>>> {
        self.shards
            .read()
            .map(|shards| shards.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Hand `local` (already out of the table) over: stop claiming, let the
/// steps in flight settle within `drain`, close the queue. A step still
/// running after `drain` is abandoned: its queue closes under it, its
/// settlement fails, and the next owner delivers it again (at least once,
/// as after a crash). The lease is released by the caller, after this.
pub(crate) async fn hand_over<R, H>(local: Arc<LocalShard<R, H>>, drain: Duration) {
    let shard = local.shard;
    local.stop.cancel();
    let worker = local
        .worker
        .lock()
        .ok()
        .and_then(|mut worker| worker.take());
    if let Some(mut worker) = worker {
        match tokio::time::timeout(drain, &mut worker).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => warn!(shard, "the shard's worker loop ended with: {err}"),
            Ok(Err(err)) => warn!(shard, "the shard's worker task failed: {err}"),
            Err(_) => {
                warn!(
                    shard,
                    drain_ms = drain.as_millis() as u64,
                    "steps still in flight after the drain bound; they are delivered again by the next owner"
                );
                worker.abort();
            }
        }
    }
    close(local, drain).await;
}

/// Drop `local` at once, without a drain: it was fenced out (another
/// process owns the shard), so nothing it would commit could land.
pub(crate) async fn drop_fenced<R, H>(local: Arc<LocalShard<R, H>>) {
    local.stop.cancel();
    if let Some(worker) = local
        .worker
        .lock()
        .ok()
        .and_then(|mut worker| worker.take())
    {
        worker.abort();
    }
    close(local, Duration::from_secs(1)).await;
}

/// Close the shard's queue once the last clone of its runtime is gone
/// (calls in flight finish first), waiting at most `bound`; past it the
/// queue is dropped unclosed (every commit the runtime made was durable
/// when it returned, so nothing committed is lost).
async fn close<R, H>(local: Arc<LocalShard<R, H>>, bound: Duration) {
    let shard = local.shard;
    let deadline = tokio::time::Instant::now() + bound;
    let Some(owned) = sole(local, deadline).await else {
        warn!(
            shard,
            "the shard's runtime is still in use; its queue is dropped unclosed"
        );
        return;
    };
    let LocalShard { runtime, queue, .. } = owned;
    drop(runtime);
    match sole(queue, deadline).await {
        Some(queue) => match queue.close().await {
            Ok(()) => info!(shard, "cluster shard closed"),
            Err(err) => warn!(shard, "closing the shard's queue: {err}"),
        },
        None => warn!(shard, "the shard's queue is still in use; dropped unclosed"),
    }
}

/// `shared` unwrapped once no other clone is left, or `None` at `deadline`.
async fn sole<T>(mut shared: Arc<T>, deadline: tokio::time::Instant) -> Option<T> {
    loop {
        match Arc::try_unwrap(shared) {
            Ok(owned) => return Some(owned),
            Err(still) if tokio::time::Instant::now() < deadline => {
                shared = still;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(_) => return None,
        }
    }
}
