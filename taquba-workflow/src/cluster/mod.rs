//! A cluster: one namespace of runs on one bucket, served by many
//! processes, each hosting some of its shards.
//!
//! A cluster is a root prefix in an object store holding a cluster record,
//! written once with a create-if-absent put ([`ClusterRecord`]: the shard
//! count, the hash that routes runs, the format), and `N` shards, each an
//! ordinary store (a taquba queue at [`SHARD_QUEUE_PATH`] and the default
//! memo prefix) under `{root}/shards/{k}/` ([`shard_prefix`], opened as a
//! store of its own with [`shard_store`]). `N` never changes: a store
//! whose keys do not lead with a run's shard cannot be split, so choose it
//! at creation as the most processes you will ever run (8 to 64 is the
//! usual range; at most [`MAX_SHARDS`]).
//!
//! Routing is one function ([`shard_of`]): a run lives in the shard its run
//! id hashes to; a group and all its members live in the group id's shard
//! ([`ClusterRecord::shard_of_group`]).
//!
//! [`ClusterRuntime`] is a process's part of the cluster: the shards it
//! hosts, each an ordinary [`WorkflowRuntime`](crate::WorkflowRuntime),
//! and the 0.13 calls over every shard, committed directly on a hosted
//! shard and sent through the shard's inbox elsewhere ([`Routed`]). Which
//! process hosts which shard is decided by its [`Ownership`]:
//!
//! * static ([`StaticOwnership`]: a StatefulSet ordinal or an explicit
//!   list), with SlateDB's writer fencing covering two processes that both
//!   believe they own a shard;
//! * bucket leases: one compare-and-set object per shard on SlateDB's own
//!   `slatedb-txn-obj` ([`LeaseRecord`], [`read_lease`]), member records
//!   rewritten every round ([`MemberRecord`]) whose silence for a lease
//!   time on the observer's monotonic clock makes a member dead, shares by
//!   rendezvous hashing ([`preferred_member`]); a taker bumps the lease's
//!   epoch, then opens the queue, which fences the old writer.
//!
//! [`ClusterView`] reads every shard from any process (the CLI's and the
//! dashboard's view): listings merged in id order behind one cursor, a
//! run's or group's reads routed to its shard.

mod builder;
mod host;
mod lease;
mod members;
mod ownership;
mod record;
mod remote;
mod route;
mod runtime;
mod schedules;
mod supervisor;
mod view;

pub use builder::{
    ClusterBuilder, DEFAULT_CHECK_INTERVAL, DEFAULT_DRAIN, DEFAULT_LEASE, DEFAULT_READER_POLL,
    LeaseOptions, Ownership,
};
pub use host::SHARD_QUEUE_PATH;
pub use lease::{LeaseRecord, LeaseState, lease_dir, read_lease};
pub use members::{MemberRecord, members_prefix, preferred_member, read_members};
pub use ownership::StaticOwnership;
pub use record::{CLUSTER_FORMAT, ClusterRecord, MAX_SHARDS, cluster_record_path};
pub use route::{HASH_NAME, shard_of, shard_prefix, shard_store};
pub use runtime::{ClusterRuntime, Routed, SentCommand};
pub use view::{ClusterView, ClusterViewError, ClusterViewOptions, DEFAULT_SHARD_CONCURRENCY};

/// What went wrong reading or creating a cluster's layout.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A shard count outside `1..=MAX_SHARDS`.
    #[error("a cluster has 1 to {max} shards, not {shards}")]
    InvalidShardCount {
        /// The count asked for.
        shards: u32,
        /// [`MAX_SHARDS`].
        max: u32,
    },
    /// The cluster at this root was created with another shard count; a
    /// cluster's shard count never changes.
    #[error(
        "the cluster at `{root}` has {stored} shards, not {requested}; a cluster's shard count is fixed when it is created"
    )]
    ShardCountMismatch {
        /// The cluster's root prefix.
        root: String,
        /// The count in the cluster record.
        stored: u32,
        /// The count asked for.
        requested: u32,
    },
    /// The cluster record names a format or a hash this build does not
    /// know (a cluster created by a later version).
    #[error(
        "the cluster record at `{path}` has format {format} and hash {hash:?}; this build reads format {CLUSTER_FORMAT} with hash {HASH_NAME:?}"
    )]
    Unsupported {
        /// The record's path.
        path: String,
        /// The record's format.
        format: u32,
        /// The record's hash name.
        hash: String,
    },
    /// The object at the cluster record's path does not decode.
    #[error("the object at `{path}` is not a cluster record: {reason}")]
    Corrupt {
        /// The record's path.
        path: String,
        /// Why it does not decode.
        reason: String,
    },
    /// A static ownership that cannot be: no replicas, an ordinal past the
    /// replica count, a host name without an ordinal.
    #[error("invalid shard ownership: {0}")]
    InvalidOwnership(String),
    /// A shard's lease could not be read or written (a version that does
    /// not decode, an object in its directory that is not a version).
    #[error("the lease of shard {shard}: {reason}")]
    Lease {
        /// The shard.
        shard: u32,
        /// What went wrong.
        reason: String,
    },
    /// A directory on the way to a local shard is a symbolic link: it is
    /// refused, never followed (the shard's inbox must stay in the store).
    #[error(
        "shard {shard}: `{path}` is a symbolic link; a shard's directory is never followed out of the store"
    )]
    LinkedShard {
        /// The shard.
        shard: u32,
        /// The link's path.
        path: String,
    },
    /// No cluster record at the root, and no shard count to create one.
    #[error("no cluster at `{root}`: no cluster record there (give a shard count to create one)")]
    NoCluster {
        /// The cluster's root prefix.
        root: String,
    },
    /// A shard number past the cluster's shard count.
    #[error("shard {shard} is not a shard of this cluster of {shards}")]
    NoSuchShard {
        /// The shard asked for.
        shard: u32,
        /// The cluster's shard count.
        shards: u32,
    },
    /// A call that only the shard's owner can carry out, on a shard this
    /// process does not host.
    #[error("shard {shard} is hosted by another process; {what} cannot go through its inbox")]
    NotHosted {
        /// The shard.
        shard: u32,
        /// What could not be sent.
        what: String,
    },
    /// A fork's given run id routes to another shard than the run it forks:
    /// a fork is made in the original's shard (its input is read there), and
    /// its id must route there for the cluster to find it.
    #[error(
        "the fork's run id `{run_id}` routes to shard {routes_to}, not to shard {shard} of the run it forks; omit it to draw one, or pick one of that shard"
    )]
    ForkIdElsewhere {
        /// The given run id.
        run_id: crate::RunId,
        /// The shard it routes to.
        routes_to: u32,
        /// The shard of the run it forks.
        shard: u32,
    },
    /// A shard's runtime (or its inbox, or its reader) failed.
    #[error(transparent)]
    Runtime(#[from] crate::Error),
    /// The object store failed.
    #[error("cluster store error: {0}")]
    Store(#[from] taquba::object_store::Error),
}
