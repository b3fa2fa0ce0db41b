//! [`CliError`]: every way a command fails, and the exit code each maps to
//! (1 for a failed command, 2 for a usage error found after parsing).

use std::process::ExitCode;

use taquba_workflow::RunId;

/// Why a command failed. The message names the run id, path or value
/// involved.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line is well formed but cannot be carried out as given
    /// (several queues in a store and no `--db`, an unreadable `--file`,
    /// JSON that does not parse). Exit code 2.
    #[error("{0}")]
    Usage(String),
    /// The store location could not be turned into a store, or did not
    /// answer.
    #[error(transparent)]
    Store(#[from] crate::location::LocationError),
    /// The queue could not be opened for reading (or, `--offline`, for
    /// writing).
    #[error("cannot open the queue at {path:?} in {store}: {source}")]
    Open {
        /// The store, as the location was given.
        store: String,
        /// The queue's path in the store.
        path: String,
        /// The queue's error.
        source: taquba::Error,
    },
    /// A query of the queue failed.
    #[error("reading the store failed: {0}")]
    Queue(#[from] taquba::Error),
    /// A query of the workflow records failed.
    #[error("{0}")]
    Workflow(#[from] taquba_workflow::Error),
    /// A listing of the object store failed.
    #[error("listing the store failed: {0}")]
    Listing(#[from] taquba::object_store::Error),
    /// The run is not in the store (never submitted there, or removed by
    /// retention).
    #[error(
        "run {0} not found in this store (never submitted here, or its records were removed by retention)"
    )]
    RunNotFound(RunId),
    /// No shard of the cluster holds the run.
    #[error(
        "run {run_id} not found in the cluster ({shards} shards): not in its home shard {home}{}; never submitted here, or its records were removed by retention",
        if crate::error::member_shaped(run_id) { " nor, as its id has a group member's form, in any other shard" } else { "" }
    )]
    RunNotInCluster {
        /// The run.
        run_id: RunId,
        /// The cluster's shard count.
        shards: u32,
        /// The run id's home shard.
        home: u32,
    },
    /// A cluster's record or one of its shards could not be read.
    #[error("{0}")]
    Cluster(#[from] taquba_workflow::cluster::ClusterViewError),
    /// The run exists but the command cannot apply to it (a result of a run
    /// that is still active, ...).
    #[error("{0}")]
    Refused(String),
    /// A run's outcome was printed and it did not succeed (`runs result`).
    /// The outcome is on stdout; this only sets the exit code.
    #[error("run {run_id} {status}")]
    RunDidNotSucceed {
        /// The run.
        run_id: RunId,
        /// How it ended (`failed`, `cancelled`).
        status: String,
    },
    /// An operation did not finish within its bound.
    #[error("{0}")]
    Timeout(String),
    /// The dashboard could not listen on its address, or its server
    /// failed.
    #[cfg(feature = "ui")]
    #[error("{0}")]
    Serve(String),
    /// Writing the output failed (other than a closed pipe).
    #[error("writing the output failed: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    /// The process exit code of this error: 2 for usage errors, 1 for
    /// everything else.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// Whether `id` has a group member's run id form (64 lowercase hex
/// digits), which a cluster looks for beyond the id's home shard.
pub fn member_shaped(id: &RunId) -> bool {
    id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The result of a command.
pub type CliResult<T> = Result<T, CliError>;
