//! The dashboard's shared state ([`App`]): what every request of one
//! dashboard process reads. Its routes are in [`crate::ui::routes`].
//!
//! A dashboard shows one store or, on a cluster root, every shard of a
//! cluster ([`Scope`]). The pages ask the app where to read and send:
//! [`App::reads`] for listings (merged over the shards), [`App::run_place`]
//! for one run's shard, [`App::signal_place`] for a key-only signal's
//! shard, [`App::command_place`] for a sent command's shard.

use taquba_workflow::RunId;
use taquba_workflow::inbox::{CommandId, CommandState, Inbox};

use crate::cluster::{ClusterSession, Reads};
use crate::commands::mutate;
use crate::error::{CliError, CliResult};
use crate::output::Times;
use crate::session::{Runtime, Session};
use crate::ui::auth::Auth;
use crate::ui::security::Guard;

/// The name the dashboard's inbox commands record as their sender's tool.
pub const SENDER_TOOL: &str = "taquba-workflow ui";

/// What a dashboard shows.
pub enum Scope {
    /// One store.
    Store {
        /// The open store and its reader.
        session: Session,
        /// The runtime whose runs it shows.
        runtime: Runtime,
        /// The inbox of that runtime's owner.
        inbox: Inbox,
    },
    /// Every shard of a cluster.
    Cluster {
        /// The open cluster.
        cluster: ClusterSession,
        /// Each open shard's inbox, in shard order (`None` for a shard with
        /// no queue yet).
        inboxes: Vec<Option<Inbox>>,
    },
}

/// Where one run (or command) is read and sent: a single store, or one
/// shard of a cluster.
#[derive(Clone, Copy)]
pub struct Place<'a> {
    /// The shard, on a cluster.
    pub shard: Option<u32>,
    /// The store (or shard) session: its location and reader.
    pub session: &'a Session,
    /// The runtime read there.
    pub runtime: &'a Runtime,
    /// The inbox commands go to.
    pub inbox: &'a Inbox,
}

/// What every request of one dashboard process shares.
pub struct App {
    /// What it shows.
    pub scope: Scope,
    /// The request checks and the form token.
    pub guard: Guard,
    /// Whether actions are off (`--read-only`).
    pub read_only: bool,
    /// The login, when the dashboard has a token: every request but the
    /// login form's must then show it (or a session).
    pub auth: Option<Auth>,
}

impl App {
    /// The state of a dashboard over `session` showing `runtime`.
    pub fn new(
        session: Session,
        runtime: Runtime,
        guard: Guard,
        read_only: bool,
        auth: Option<Auth>,
    ) -> Self {
        let inbox = mutate::inbox(&session, &runtime, SENDER_TOOL);
        Self {
            scope: Scope::Store {
                session,
                runtime,
                inbox,
            },
            guard,
            read_only,
            auth,
        }
    }

    /// The state of a dashboard over every shard of `cluster`.
    pub fn cluster(
        cluster: ClusterSession,
        guard: Guard,
        read_only: bool,
        auth: Option<Auth>,
    ) -> Self {
        let inboxes = cluster
            .shards
            .iter()
            .map(|shard| {
                shard
                    .as_ref()
                    .map(|s| mutate::inbox(&s.session, &s.runtime, SENDER_TOOL))
            })
            .collect();
        Self {
            scope: Scope::Cluster { cluster, inboxes },
            guard,
            read_only,
            auth,
        }
    }

    /// The cluster shown, if the dashboard shows one.
    pub fn cluster_session(&self) -> Option<&ClusterSession> {
        match &self.scope {
            Scope::Store { .. } => None,
            Scope::Cluster { cluster, .. } => Some(cluster),
        }
    }

    /// Where listings read: the store's view, or the cluster's merged one.
    pub fn reads(&self) -> Reads<'_> {
        match &self.scope {
            Scope::Store { runtime, .. } => Reads::Store(&runtime.view),
            Scope::Cluster { cluster, .. } => Reads::Cluster(&cluster.view),
        }
    }

    /// Every place the dashboard reads, in shard order (one for a store).
    pub fn places(&self) -> Vec<Place<'_>> {
        match &self.scope {
            Scope::Store {
                session,
                runtime,
                inbox,
            } => vec![Place {
                shard: None,
                session,
                runtime,
                inbox,
            }],
            Scope::Cluster { cluster, inboxes } => (0..cluster.record.shards)
                .filter_map(|k| self.shard_place(cluster, inboxes, k))
                .collect(),
        }
    }

    fn shard_place<'a>(
        &'a self,
        cluster: &'a ClusterSession,
        inboxes: &'a [Option<Inbox>],
        k: u32,
    ) -> Option<Place<'a>> {
        let shard = cluster.shard(k)?;
        let inbox = inboxes.get(k as usize)?.as_ref()?;
        Some(Place {
            shard: Some(k),
            session: &shard.session,
            runtime: &shard.runtime,
            inbox,
        })
    }

    /// Where run `id` is read and its commands go: the store, or the shard
    /// holding it.
    ///
    /// # Errors
    /// [`CliError::RunNotInCluster`] when no shard holds it; storage
    /// errors.
    pub async fn run_place(&self, id: &RunId) -> CliResult<Place<'_>> {
        match &self.scope {
            Scope::Store {
                session,
                runtime,
                inbox,
            } => Ok(Place {
                shard: None,
                session,
                runtime,
                inbox,
            }),
            Scope::Cluster { cluster, inboxes } => {
                let shard = cluster.run_shard(id).await?;
                self.shard_place(cluster, inboxes, shard.shard)
                    .ok_or_else(|| CliError::RunNotFound(id.clone()))
            }
        }
    }

    /// Where group `id` is read: the store, or the group's shard (`None`
    /// when that shard has no queue yet).
    pub fn group_place(&self, id: &RunId) -> Option<Place<'_>> {
        match &self.scope {
            Scope::Store {
                session,
                runtime,
                inbox,
            } => Some(Place {
                shard: None,
                session,
                runtime,
                inbox,
            }),
            Scope::Cluster { cluster, inboxes } => {
                self.shard_place(cluster, inboxes, cluster.view.shard_of_group(id))
            }
        }
    }

    /// Where a key-only signal on `key` goes: the store, or on a cluster
    /// the shard the runtime's rule picks (the lowest shard where a run
    /// waits on the key, else its home shard:
    /// [`crate::cluster::ClusterSession::signal_shard`]).
    ///
    /// # Errors
    /// [`CliError::Refused`] when that shard has no queue yet; read errors.
    pub async fn signal_place(&self, key: &str) -> CliResult<Place<'_>> {
        match &self.scope {
            Scope::Store {
                session,
                runtime,
                inbox,
            } => Ok(Place {
                shard: None,
                session,
                runtime,
                inbox,
            }),
            Scope::Cluster { cluster, inboxes } => {
                let shard = cluster.signal_shard(key).await?;
                self.shard_place(cluster, inboxes, shard.shard)
                    .ok_or_else(|| {
                        CliError::Refused(format!(
                            "shard {} has no inbox open: nothing was sent",
                            shard.shard
                        ))
                    })
            }
        }
    }

    /// Where command `id` is and its state there: the store, or the first
    /// shard that knows it (`None` when no shard does).
    ///
    /// # Errors
    /// Storage errors.
    pub async fn command_place(
        &self,
        id: &CommandId,
    ) -> CliResult<Option<(Place<'_>, CommandState)>> {
        match &self.scope {
            Scope::Store {
                session,
                runtime,
                inbox,
            } => {
                let state = runtime.view.command(id).await?;
                let place = Place {
                    shard: None,
                    session,
                    runtime,
                    inbox,
                };
                Ok(Some((place, state)))
            }
            Scope::Cluster { cluster, inboxes } => Ok(mutate::find_command(cluster, id)
                .await?
                .and_then(|(shard, state)| {
                    self.shard_place(cluster, inboxes, shard.shard)
                        .map(|place| (place, state))
                })),
        }
    }

    /// Relative times as of now.
    pub fn times(&self) -> Times {
        Times::new(crate::cli::TimeFormat::Relative, Times::wall_clock_ms())
    }

    /// The store as the header shows it: `location · queue path`, or the
    /// cluster root with its shard count.
    pub fn store_label(&self) -> String {
        match &self.scope {
            Scope::Store { session, .. } => {
                format!("{} · {}", session.target.location, session.target.db_path)
            }
            Scope::Cluster { cluster, .. } => cluster.label(),
        }
    }

    /// Close every reader (failures reported on stderr).
    pub async fn close_readers(&self) {
        let sessions: Vec<&Session> = match &self.scope {
            Scope::Store { session, .. } => vec![session],
            Scope::Cluster { cluster, .. } => {
                cluster.open_shards().map(|shard| &shard.session).collect()
            }
        };
        for session in sessions {
            if let Err(e) = session.reader.close().await {
                eprintln!("taquba-workflow: closing the reader failed: {e}");
            }
        }
    }
}
