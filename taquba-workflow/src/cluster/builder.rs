//! Building a [`ClusterRuntime`]: the cluster to join, how this process
//! decides which shards it hosts, and how each shard's queue and runtime
//! are configured.

use std::sync::Arc;
use std::time::Duration;

use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use tokio_util::sync::CancellationToken;

use super::ClusterError;
use super::host::{ConfigureFn, HostedShards, OpenOptionsFn, ShardFactory};
use super::ownership::StaticOwnership;
use super::record::ClusterRecord;
use super::remote::Remote;
use super::runtime::{ClusterInner, ClusterRuntime};
use crate::hooks::terminal::TerminalHook;
use crate::limits::DEFAULT_QUEUE_NAME;
use crate::runner::StepRunner;
use crate::runtime::WorkflowRuntimeBuilder;

/// The default lease time: a process whose member record has not changed
/// for this long is dead, and its shards are taken over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// The default interval of a process's ownership round (beat, look at the
/// members and leases, take and hand over shards).
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// The default bound on the drain of a shard handed over.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// The default poll interval of the readers of shards other processes
/// host (and of a wait on a run there).
pub const DEFAULT_READER_POLL: Duration = Duration::from_millis(200);

/// Which shards a process hosts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Ownership {
    /// Fixed by configuration (a StatefulSet ordinal, or a list). A shard
    /// whose worker loop was fenced out (another process opened it) is
    /// dropped and not opened again: two processes configured to own one
    /// shard would take it from each other forever.
    Static(StaticOwnership),
    /// Bucket leases: the process takes free shards and the shards of
    /// dead processes, up to its share of the live members (rendezvous
    /// hashing), and hands over shards another live member should hold.
    Leases(LeaseOptions),
    /// None: the process submits, steers and reads through the shards'
    /// inboxes and readers, and runs no step.
    Client,
}

/// The timing of [`Ownership::Leases`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How long a member's record may stay unchanged before it is dead
    /// ([`DEFAULT_LEASE`]); a dead member's shards are taken within about
    /// this plus one `check_interval`.
    pub lease: Duration,
    /// How often the process beats and looks at the members and leases
    /// ([`DEFAULT_CHECK_INTERVAL`]; at most a third of `lease`).
    pub check_interval: Duration,
    /// The bound on the drain of a shard handed over ([`DEFAULT_DRAIN`]).
    pub drain: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            check_interval: DEFAULT_CHECK_INTERVAL,
            drain: DEFAULT_DRAIN,
        }
    }
}

/// Builds a [`ClusterRuntime`]; from [`ClusterRuntime::builder`].
pub struct ClusterBuilder<R, H> {
    store: Arc<dyn ObjectStore>,
    root: String,
    runner: R,
    hook: H,
    shards: Option<u32>,
    ownership: Ownership,
    node_id: Option<String>,
    open_options: OpenOptionsFn,
    configure: ConfigureFn<R, H>,
    reader_poll: Duration,
}

impl<R, H> ClusterRuntime<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    /// Start building the process's part of the cluster at `root` in
    /// `store`: each hosted shard runs its steps with a clone of `runner`
    /// and its terminations with a clone of `hook` (wrap either in an
    /// `Arc` to share one). Defaults: [`Ownership::Client`], the node id
    /// `{host name}-{pid}-{ULID}`, default queue options.
    pub fn builder(
        store: Arc<dyn ObjectStore>,
        root: impl Into<String>,
        runner: R,
        hook: H,
    ) -> ClusterBuilder<R, H> {
        ClusterBuilder {
            store,
            root: root.into().trim_matches('/').to_string(),
            runner,
            hook,
            shards: None,
            ownership: Ownership::Client,
            node_id: None,
            open_options: Arc::new(|_| OpenOptions::default()),
            configure: Arc::new(|builder| builder),
            reader_poll: DEFAULT_READER_POLL,
        }
    }
}

impl<R, H> ClusterBuilder<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    /// Create the cluster with `shards` shards when there is none at the
    /// root (else check it has that many). Without it the cluster must
    /// exist.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = Some(shards);
        self
    }

    /// How this process decides the shards it hosts.
    pub fn ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = ownership;
        self
    }

    /// This process's node id in leases and member records (at most 128
    /// bytes of `[A-Za-z0-9._-]`); unique per process incarnation, so the
    /// default adds a ULID to the host name and pid.
    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.node_id = Some(node_id.into());
        self
    }

    /// The options each shard's queue opens with (`OpenOptions` is not
    /// `Clone`, so a function of the shard).
    pub fn open_options(
        mut self,
        options: impl Fn(u32) -> OpenOptions + Send + Sync + 'static,
    ) -> Self {
        self.open_options = Arc::new(options);
        self
    }

    /// Configure each shard's runtime builder (concurrency, poll interval,
    /// retention, step-output replay, clock ...). The queue name and memo
    /// prefix stay the defaults: every process and tool of the cluster
    /// finds a shard's runs there.
    pub fn configure(
        mut self,
        configure: impl Fn(WorkflowRuntimeBuilder<R, H>) -> WorkflowRuntimeBuilder<R, H>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.configure = Arc::new(configure);
        self
    }

    /// End a store outage after `budget`: every shard's queue, lease and
    /// member record goes through one [`OutageGuard`](crate::OutageGuard)
    /// over the cluster's store, so once every call has failed for longer
    /// than `budget` the hosted shards' calls fail with
    /// [`Error::StoreOutage`](crate::Error::StoreOutage) and their workers
    /// stop; the shards are hosted again (queues reopened) once the store
    /// answers. Off by default: calls wait out an outage.
    pub fn outage_budget(mut self, budget: Duration) -> Self {
        self.store = Arc::new(crate::store::outage::OutageGuard::new(self.store, budget));
        self
    }

    /// How often the readers of shards other processes host look for new
    /// state ([`DEFAULT_READER_POLL`]): the lag of a read and of a wait on
    /// a run there.
    pub fn reader_poll_interval(mut self, interval: Duration) -> Self {
        self.reader_poll = interval.max(Duration::from_millis(1));
        self
    }

    /// Join the cluster (creating it when [`shards`](Self::shards) is set
    /// and there is none) and start hosting shards: the static shards are
    /// opened before this returns; with leases, shards are taken from the
    /// second ownership round on (so that processes starting together see
    /// each other first).
    ///
    /// # Cancel safety
    ///
    /// The cluster record is one create-if-absent put (absent or whole).
    /// Dropped while static shards are being opened, the shards opened so
    /// far keep their worker loops with no handle to stop them, until
    /// another open of their queues fences them (a later `start` in this
    /// process does, and they stop at their next write): nothing committed
    /// is lost, but await `start` where the process must not serve those
    /// shards meanwhile.
    ///
    /// # Errors
    /// [`ClusterError::NoCluster`] without a cluster at the root and no
    /// shard count; [`ClusterError::InvalidOwnership`] for a node id that
    /// is empty, too long or has other characters, or lease timings out of
    /// proportion; the errors of [`ClusterRecord::create_or_open`]; with
    /// static ownership, [`ClusterError::NoSuchShard`] for a listed shard
    /// past the cluster's count, [`ClusterError::InvalidOwnership`] for an
    /// ownership of no shard (see [`StaticOwnership::check_against`]), and
    /// [`ClusterError::Runtime`] when a shard's queue does not open.
    pub async fn start(self) -> Result<ClusterRuntime<R, H>, ClusterError> {
        let node = match self.node_id {
            Some(node) => {
                check_node_id(&node)?;
                node
            }
            None => default_node_id(),
        };
        if let Ownership::Leases(lease) = &self.ownership
            && (lease.check_interval.is_zero() || lease.check_interval * 3 > lease.lease)
        {
            return Err(ClusterError::InvalidOwnership(format!(
                "a check interval of {} ms with a lease of {} ms; the interval must be positive and at most a third of the lease",
                lease.check_interval.as_millis(),
                lease.lease.as_millis()
            )));
        }
        // Created (or read) only once the options are known good: a refused
        // start must not fix a shard count.
        let record = match self.shards {
            Some(shards) => {
                ClusterRecord::create_or_open(self.store.clone(), &self.root, shards).await?
            }
            None => ClusterRecord::open(self.store.clone(), &self.root)
                .await?
                .ok_or_else(|| ClusterError::NoCluster {
                    root: self.root.clone(),
                })?,
        };
        let memo_prefix = format!("{DEFAULT_QUEUE_NAME}-memo");
        let configure = self.configure;
        let fixed_names = memo_prefix.clone();
        let factory = ShardFactory {
            store: self.store.clone(),
            root: self.root.clone(),
            runner: self.runner,
            hook: self.hook,
            open_options: self.open_options,
            configure: Arc::new(move |builder| {
                configure(builder)
                    .queue_name(DEFAULT_QUEUE_NAME)
                    .memo_prefix(fixed_names.clone())
            }),
        };
        let remote = Remote::new(
            self.store.clone(),
            &self.root,
            record.shards,
            &memo_prefix,
            Some(node.clone()),
            self.reader_poll,
        );
        let inner = Arc::new(ClusterInner {
            record,
            root: self.root,
            store: self.store,
            node,
            factory,
            hosted: HostedShards::default(),
            remote,
            ownership: self.ownership,
            stop: CancellationToken::new(),
            supervisor: std::sync::Mutex::new(None),
            next_local: std::sync::atomic::AtomicUsize::new(0),
        });
        ClusterRuntime::launch(inner).await
    }
}

/// The longest node id.
const MAX_NODE_ID_LEN: usize = 128;

fn check_node_id(node: &str) -> Result<(), ClusterError> {
    let fits = !node.is_empty()
        && node.len() <= MAX_NODE_ID_LEN
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fits {
        Ok(())
    } else {
        Err(ClusterError::InvalidOwnership(format!(
            "node id {node:?}: 1 to {MAX_NODE_ID_LEN} bytes of letters, digits, '.', '_' and '-'"
        )))
    }
}

/// `{host name}-{pid}-{ULID}`, the host name cut to what a node id takes.
fn default_node_id() -> String {
    let host: String = std::env::var("HOSTNAME")
        .ok()
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "node".to_string())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(64)
        .collect();
    format!("{host}-{}-{}", std::process::id(), ulid::Ulid::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked() {
        assert!(check_node_id("worker-0.pod_1").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(129)] {
            let err = check_node_id(bad).expect_err("refused");
            assert!(err.to_string().contains("node id"), "{err}");
        }
        assert!(check_node_id(&default_node_id()).is_ok());
    }
}
