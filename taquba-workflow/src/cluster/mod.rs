//! A cluster of shards on one bucket (issue 24, in progress): the pieces
//! every process of a cluster must agree on, built first so that the
//! runtime, the CLI and the dashboard share them.
//!
//! A cluster is a root prefix in an object store holding a cluster record,
//! written once with a create-if-absent put ([`ClusterRecord`]: the shard
//! count, the hash that routes runs, the format), and `N` shards, each an
//! ordinary store (a taquba queue and its memo prefix) under
//! `{root}/shards/{k}/` ([`shard_prefix`], opened as a store of its own
//! with [`shard_store`]). `N` never changes: a store
//! whose keys do not lead with a run's shard cannot be split, so choose it
//! at creation as the most processes you will ever run (8 to 64 is the
//! usual range; at most [`MAX_SHARDS`]).
//!
//! Routing is one function ([`shard_of`]): a run lives in the shard its run
//! id hashes to; a group and all its members live in the group id's shard
//! ([`ClusterRecord::shard_of_group`]); a keyed job routes by its derived
//! run id.
//!
//! Which process opens which shard is decided by an ownership backend; the
//! one here is static ([`StaticOwnership`]: a StatefulSet ordinal or an
//! explicit list), with SlateDB's writer fencing covering two processes
//! that both believe they own a shard. [`ClusterView`] reads every shard at once: listings merged in id order
//! behind one cursor, a run's or group's reads routed to its shard. What
//! is not built yet, and so not offered: the runtime over several shards,
//! and bucket leases and failover.

mod ownership;
mod record;
mod route;
mod view;

pub use ownership::StaticOwnership;
pub use record::{CLUSTER_FORMAT, ClusterRecord, MAX_SHARDS, cluster_record_path};
pub use route::{HASH_NAME, shard_of, shard_prefix, shard_store};
pub use view::{
    ClusterView, ClusterViewError, ClusterViewOptions, DEFAULT_SHARD_CONCURRENCY,
    DEFAULT_SHARD_QUEUE_PATH,
};

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
    /// The object store failed.
    #[error("cluster store error: {0}")]
    Store(#[from] taquba::object_store::Error),
}
