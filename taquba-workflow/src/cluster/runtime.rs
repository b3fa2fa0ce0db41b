//! [`ClusterRuntime`]: the 0.13 calls over every shard of a cluster. A
//! call about a run goes to the run's shard ([`shard_of`](super::shard_of)):
//! committed directly when this process hosts the shard, else sent to the
//! shard's inbox, which its owner applies ([`Routed::Sent`]). Reads of a
//! shard hosted elsewhere go through a reader of it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use taquba::object_store::ObjectStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::ClusterError;
use super::builder::Ownership;
use super::host::{HostedShards, LocalShard, ShardFactory};
use super::record::ClusterRecord;
use super::remote::Remote;
use super::view::DEFAULT_SHARD_CONCURRENCY;
use crate::coordination::signal::SignalOutcome;
use crate::error::Error;
use crate::hooks::terminal::TerminalHook;
use crate::inbox::{Command, CommandId, CommandState, SubmitCommand};
use crate::model::{RunEnd, RunOutcome, RunSpec, RunStatus, SubmitOutcome};
use crate::runner::StepRunner;
use crate::store::keys::RunId;
use crate::view::WorkflowView;

/// Where a call about a run was carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Routed<T> {
    /// This process hosts the run's shard: the call committed here, with
    /// this answer.
    Applied(T),
    /// Another process hosts the shard (or none does right now): the call
    /// is a command in the shard's inbox, applied once by its owner.
    /// [`ClusterRuntime::answer`] waits for what it did.
    Sent(SentCommand),
}

impl<T> Routed<T> {
    /// The answer of an applied call; `None` for a sent one.
    pub fn applied(self) -> Option<T> {
        match self {
            Self::Applied(answer) => Some(answer),
            Self::Sent(_) => None,
        }
    }
}

/// A command a [`ClusterRuntime`] sent to a shard's inbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentCommand {
    /// The shard.
    pub shard: u32,
    /// The command's id in the shard's inbox.
    pub id: CommandId,
    /// The run the command is about (for a submission, its id, chosen
    /// before the command was sent); `None` for a key-only signal.
    pub run_id: Option<RunId>,
}

pub(crate) struct ClusterInner<R, H> {
    pub(crate) record: ClusterRecord,
    pub(crate) root: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) node: String,
    pub(crate) factory: ShardFactory<R, H>,
    pub(crate) hosted: HostedShards<R, H>,
    pub(crate) remote: Remote,
    pub(crate) ownership: Ownership,
    pub(crate) stop: CancellationToken,
    pub(crate) supervisor: std::sync::Mutex<Option<JoinHandle<()>>>,
    pub(crate) next_local: AtomicUsize,
}

impl<R, H> ClusterInner<R, H>
where
    R: 'static,
    H: 'static,
{
    /// A function listing the hosted shards, for the beat task (which must
    /// not keep the cluster alive).
    pub(crate) fn hosted_list_fn(self: &Arc<Self>) -> impl Fn() -> Vec<u32> + Send + 'static
    where
        R: Send + Sync,
        H: Send + Sync,
    {
        let weak = Arc::downgrade(self);
        move || {
            weak.upgrade()
                .map(|inner| inner.hosted.list())
                .unwrap_or_default()
        }
    }
}

/// This process's part of a cluster: the shards it hosts (each an
/// ordinary [`WorkflowRuntime`](crate::WorkflowRuntime) with its worker
/// loop running), and the 0.13 calls over every shard. Build it with
/// [`ClusterRuntime::builder`]; stop it with
/// [`shutdown`](Self::shutdown). Cheap to clone.
///
/// What a cluster does not promise: a single run is never faster (it
/// lives in one shard), a group and its members live in one shard, there
/// is no transaction across shards, and the shard count is fixed.
pub struct ClusterRuntime<R, H> {
    pub(crate) inner: Arc<ClusterInner<R, H>>,
}

impl<R, H> Clone for ClusterRuntime<R, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<R, H> std::fmt::Debug for ClusterRuntime<R, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterRuntime")
            .field("root", &self.inner.root)
            .field("node", &self.inner.node)
            .field("shards", &self.inner.record.shards)
            .field("hosted", &self.inner.hosted.list())
            .finish_non_exhaustive()
    }
}

/// A local call that failed because the shard left this process while it
/// ran (handed over or fenced out): sent through the inbox instead.
pub(super) fn shard_left(err: &Error) -> bool {
    err.is_store_closed() || matches!(err, Error::RuntimeShutdown)
}

impl<R, H> ClusterRuntime<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    pub(crate) async fn launch(inner: Arc<ClusterInner<R, H>>) -> Result<Self, ClusterError> {
        let cluster = Self { inner };
        if let Ownership::Static(owned) = &cluster.inner.ownership {
            owned.check_against(cluster.inner.record.shards)?;
            for shard in owned.owned(cluster.inner.record.shards) {
                let local = cluster.inner.factory.open(shard, None).await;
                match local {
                    Ok(local) => cluster.inner.hosted.insert(local),
                    Err(err) => {
                        // The shards opened so far are closed again.
                        cluster.stop_hosting().await;
                        return Err(err);
                    }
                }
            }
        }
        let supervisor = tokio::spawn(super::supervisor::run(cluster.inner.clone()));
        if let Ok(mut slot) = cluster.inner.supervisor.lock() {
            *slot = Some(supervisor);
        }
        Ok(cluster)
    }

    /// The cluster's record (shard count, hash, format).
    pub fn record(&self) -> &ClusterRecord {
        &self.inner.record
    }

    /// This process's node id.
    pub fn node_id(&self) -> &str {
        &self.inner.node
    }

    /// The shard that holds `run_id`.
    pub fn shard_of(&self, run_id: &RunId) -> u32 {
        self.inner.record.shard_of(run_id.as_str())
    }

    /// The shards this process hosts now, in order.
    pub fn hosted_shards(&self) -> Vec<u32> {
        self.inner.hosted.list()
    }

    pub(super) fn local(&self, shard: u32) -> Option<Arc<LocalShard<R, H>>> {
        self.inner.hosted.get(shard)
    }

    /// Submit a run. With no `spec.run_id`, an id is generated on a shard
    /// this process hosts (round robin over them; a ULID drawn until it
    /// routes there), so the submission commits here; a process hosting
    /// none generates a ULID and sends it. With a run id, it goes to the
    /// id's shard. Idempotent on `(run_id, input)` as
    /// [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit).
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit) for
    /// a hosted shard; a command is one object written whole or not at
    /// all. Submitting the same run id and input again answers for a
    /// dropped call.
    ///
    /// # Errors
    /// [`ClusterError::NotHosted`] for KV effects on a shard hosted
    /// elsewhere (the inbox carries none); [`ClusterError::Runtime`] with
    /// the errors of [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit)
    /// (and of [`Inbox::send`](crate::inbox::Inbox::send) for a command).
    pub async fn submit(&self, mut spec: RunSpec) -> Result<Routed<SubmitOutcome>, ClusterError> {
        let run_id = match spec.run_id.clone() {
            Some(run_id) => run_id,
            None => self.new_run_id(),
        };
        spec.run_id = Some(run_id.clone());
        let shard = self.shard_of(&run_id);
        if let Some(local) = self.local(shard) {
            match local.runtime.submit(spec.clone()).await {
                Err(err) if shard_left(&err) => {}
                submitted => return Ok(Routed::Applied(submitted?)),
            }
        }
        let effects = &spec.effects;
        if !(effects.enqueues.is_empty()
            && effects.kv_writes.is_empty()
            && effects.kv_deletes.is_empty())
        {
            return Err(ClusterError::NotHosted {
                shard,
                what: format!("the KV effects of the submission of run `{run_id}`"),
            });
        }
        let mut command = SubmitCommand::new(spec.input).run_id(run_id.clone());
        command.headers = spec.options.headers;
        command.priority = spec.options.priority;
        command.max_attempts_per_step = spec.options.max_attempts_per_step;
        command.run_at_ms = spec
            .options
            .run_at
            .map(|at| {
                at.duration_since(UNIX_EPOCH)
                    .map(|since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
                    .map_err(|_| {
                        ClusterError::Runtime(Error::InvalidRunOptions(format!(
                            "run_at {at:?} is before the UNIX epoch"
                        )))
                    })
            })
            .transpose()?;
        self.send(shard, Command::Submit(command), Some(run_id))
            .await
    }

    /// A fresh run id for a keyless submission: on a hosted shard (round
    /// robin), else any.
    fn new_run_id(&self) -> RunId {
        match self.draw_id() {
            Some((_, id)) => id,
            // Always a valid id.
            None => RunId::new(ulid::Ulid::new().to_string())
                .unwrap_or_else(|_| unreachable!("a ULID is a valid run id")),
        }
    }

    /// A fresh ULID (on the shard runtime's clock, so ordered with its
    /// generated ids) that routes to a hosted shard picked round robin, as
    /// a run id and as a group id alike (both route by the same hash);
    /// `None` when no shard is hosted.
    fn draw_id(&self) -> Option<(Arc<LocalShard<R, H>>, RunId)> {
        let hosted = self.inner.hosted.all();
        if hosted.is_empty() {
            return None;
        }
        let pick = self.inner.next_local.fetch_add(1, Ordering::Relaxed) % hosted.len();
        let local = hosted[pick].clone();
        let shards = self.inner.record.shard_count();
        // Each draw lands on the shard with probability 1/N; after 64 N
        // draws (a miss less likely than 1 in e^64) any id will do.
        let draws = 64 * shards.get();
        let mut id = local.runtime.inner.core.new_run_id();
        for _ in 0..draws {
            if super::shard_of(id.as_str(), shards) == local.shard {
                break;
            }
            id = local.runtime.inner.core.new_run_id();
        }
        Some((local, id))
    }

    pub(super) async fn send<T>(
        &self,
        shard: u32,
        command: Command,
        run_id: Option<RunId>,
    ) -> Result<Routed<T>, ClusterError> {
        let id = self.inner.remote.send(shard, command).await?;
        Ok(Routed::Sent(SentCommand { shard, id, run_id }))
    }

    /// The run group `id`, on this process's runtime of the group's shard
    /// ([`ClusterRecord::shard_of_group`]): a group and all its members
    /// live there, so its owner submits, joins and forgets it. The group
    /// holds that runtime: while it is kept, a handover of the shard drops
    /// the shard's queue unclosed after the drain bound (nothing committed
    /// is lost; the next owner replays the write-ahead log).
    ///
    /// # Errors
    /// [`ClusterError::NotHosted`] when another process hosts the group's
    /// shard.
    pub fn group(&self, id: RunId) -> Result<crate::RunGroup, ClusterError> {
        let shard = self.inner.record.shard_of_group(id.as_str());
        match self.local(shard) {
            Some(local) => Ok(local.runtime.group(id)),
            None => Err(ClusterError::NotHosted {
                shard,
                what: format!("run group `{id}`"),
            }),
        }
    }

    /// A run group with a fresh ULID id whose shard this process hosts
    /// (round robin over the hosted shards; ids drawn until one routes
    /// there), as [`WorkflowRuntime::new_group`](crate::WorkflowRuntime::new_group).
    ///
    /// # Errors
    /// [`ClusterError::NotHosted`] when this process hosts no shard.
    pub fn new_group(&self) -> Result<crate::RunGroup, ClusterError> {
        let Some((local, id)) = self.draw_id() else {
            return Err(ClusterError::NotHosted {
                shard: 0,
                what: "a new run group (this process hosts no shard)".to_string(),
            });
        };
        Ok(local.runtime.group(id))
    }

    /// Cancel `run_id`, as [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel).
    ///
    /// # Cancel safety
    ///
    /// As [`cancel_with_reason`](Self::cancel_with_reason).
    ///
    /// # Errors
    /// As [`cancel_with_reason`](Self::cancel_with_reason).
    pub async fn cancel(&self, run_id: &RunId) -> Result<Routed<bool>, ClusterError> {
        self.cancel_inner(run_id, None).await
    }

    /// Cancel `run_id` with `reason`, as
    /// [`WorkflowRuntime::cancel_with_reason`](crate::WorkflowRuntime::cancel_with_reason).
    ///
    /// # Cancel safety
    ///
    /// As the runtime's for a hosted shard; a command is written whole or
    /// not at all, and cancelling again is harmless.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] with the runtime's (or the inbox's)
    /// errors.
    pub async fn cancel_with_reason(
        &self,
        run_id: &RunId,
        reason: impl Into<String>,
    ) -> Result<Routed<bool>, ClusterError> {
        self.cancel_inner(run_id, Some(reason.into())).await
    }

    async fn cancel_inner(
        &self,
        run_id: &RunId,
        reason: Option<String>,
    ) -> Result<Routed<bool>, ClusterError> {
        let shard = self.holding(run_id).await?;
        if let Some(local) = self.local(shard) {
            let cancelled = match &reason {
                Some(reason) => {
                    local
                        .runtime
                        .cancel_with_reason(run_id, reason.clone())
                        .await
                }
                None => local.runtime.cancel(run_id).await,
            };
            match cancelled {
                Err(err) if shard_left(&err) => {}
                cancelled => return Ok(Routed::Applied(cancelled?)),
            }
        }
        self.send(
            shard,
            Command::cancel(run_id.clone(), reason),
            Some(run_id.clone()),
        )
        .await
    }

    /// Resume a run that failed by a dead letter, as
    /// [`WorkflowRuntime::requeue`](crate::WorkflowRuntime::requeue).
    ///
    /// # Cancel safety
    ///
    /// As the runtime's for a hosted shard; a command is written whole or
    /// not at all.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] with the runtime's (or the inbox's)
    /// errors.
    pub async fn requeue(&self, run_id: &RunId) -> Result<Routed<SubmitOutcome>, ClusterError> {
        let shard = self.holding(run_id).await?;
        if let Some(local) = self.local(shard) {
            match local.runtime.requeue(run_id).await {
                Err(err) if shard_left(&err) => {}
                requeued => return Ok(Routed::Applied(requeued?)),
            }
        }
        self.send(
            shard,
            Command::requeue(run_id.clone()),
            Some(run_id.clone()),
        )
        .await
    }

    /// Start a new run from step `from_step` of the ended run `run_id`, as
    /// [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork), in the
    /// original's shard (its step input is read there). The new run's id
    /// is [`ForkOptions::run_id`](crate::ForkOptions::run_id) when given,
    /// which must route to that shard, else a fresh ULID drawn to route
    /// there ([`ClusterRecord::new_run_id_on`]), so every process finds the
    /// fork by its id. On a shard hosted elsewhere the fork is a `fork`
    /// command naming the new id; with
    /// [`ForkOptions::cancel_active`](crate::ForkOptions::cancel_active)
    /// an active original is first cancelled through its shard and waited
    /// for (the inbox refuses to fork an active run).
    ///
    /// # Cancel safety
    ///
    /// As the runtime's for a hosted shard; a command is written whole or
    /// not at all. Dropped after the cancel of an active original, the run
    /// may be cancelled without the fork: call again with the same
    /// `ForkOptions::run_id` (the answer of a fork made is idempotent on
    /// it).
    ///
    /// # Errors
    /// [`ClusterError::ForkIdElsewhere`] for a given id of another shard;
    /// [`ClusterError::Runtime`] with the runtime's (or the inbox's)
    /// errors ([`Error::RunActive`](crate::Error::RunActive),
    /// [`Error::StepNotForkable`](crate::Error::StepNotForkable), ...).
    pub async fn fork(
        &self,
        run_id: &RunId,
        from_step: u32,
        mut options: crate::ForkOptions,
    ) -> Result<Routed<SubmitOutcome>, ClusterError> {
        let shard = self.holding(run_id).await?;
        let new_id = match options.run_id.take() {
            Some(given) => {
                let routes_to = self.shard_of(&given);
                if routes_to != shard {
                    return Err(ClusterError::ForkIdElsewhere {
                        run_id: given,
                        routes_to,
                        shard,
                    });
                }
                given
            }
            None => self.inner.record.new_run_id_on(shard),
        };
        options.run_id = Some(new_id.clone());
        if let Some(local) = self.local(shard) {
            match local.runtime.fork(run_id, from_step, options.clone()).await {
                Err(err) if shard_left(&err) => {}
                forked => return Ok(Routed::Applied(forked?)),
            }
        }
        if options.cancel_active
            && self
                .status(run_id)
                .await?
                .is_some_and(|status| !matches!(status.state, crate::RunState::Terminated(_)))
        {
            let reason = format!("cancelled to fork it from step {from_step}");
            // The cancel's answer is the run's end, waited for below.
            let _sent: Routed<bool> = self
                .send(
                    shard,
                    Command::cancel(run_id.clone(), Some(reason)),
                    Some(run_id.clone()),
                )
                .await?;
            self.wait(run_id).await?;
        }
        self.send(
            shard,
            Command::fork(run_id.clone(), from_step, Some(new_id.clone())),
            Some(new_id),
        )
        .await
    }

    /// Start the ended run `run_id` again from step 0 under a new id: the
    /// [`fork`](Self::fork) from step 0.
    ///
    /// # Cancel safety
    ///
    /// As [`fork`](Self::fork).
    ///
    /// # Errors
    /// As [`fork`](Self::fork).
    pub async fn restart(
        &self,
        run_id: &RunId,
        options: crate::ForkOptions,
    ) -> Result<Routed<SubmitOutcome>, ClusterError> {
        self.fork(run_id, 0, options).await
    }

    /// Deliver a signal to `run_id`'s current wait on `correlation_key`,
    /// as [`WorkflowRuntime::signal_run`](crate::WorkflowRuntime::signal_run):
    /// nothing is buffered. Sent to a shard hosted elsewhere, a run that is
    /// not waiting makes the command rejected.
    ///
    /// # Cancel safety
    ///
    /// As the runtime's for a hosted shard; a command is written whole or
    /// not at all.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] with the runtime's (or the inbox's)
    /// errors.
    pub async fn signal_run(
        &self,
        run_id: &RunId,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<Routed<()>, ClusterError> {
        let shard = self.holding(run_id).await?;
        if let Some(local) = self.local(shard) {
            match local
                .runtime
                .signal_run(run_id, correlation_key, payload.clone())
                .await
            {
                Err(err) if shard_left(&err) => {}
                signalled => return Ok(Routed::Applied(signalled?)),
            }
        }
        self.send(
            shard,
            Command::signal_run(run_id.clone(), correlation_key, payload),
            Some(run_id.clone()),
        )
        .await
    }

    /// Deliver a key-only signal, as
    /// [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal) does in
    /// one store. In a cluster the key's waiter may be in any shard, so:
    ///
    /// 1. every shard is read for a waiter on the key (a step that
    ///    continued on it); the signal goes to the first shard that has
    ///    one (its lowest number), which delivers it, or buffers it if the
    ///    wait ended meanwhile;
    /// 2. with no waiter anywhere, it goes to the key's home shard,
    ///    [`shard_of(key)`](super::shard_of), and is buffered there.
    ///
    /// Each signal is applied in one shard, once. A buffered signal wakes
    /// the next wait on the key *in its home shard* only: a run in another
    /// shard that waits on the key later does not see it. For a signal
    /// that may come before its run waits, send it with
    /// [`signal_run`](Self::signal_run) once the run waits, or give the
    /// run an id in the key's home shard.
    ///
    /// # Cancel safety
    ///
    /// As the runtime's for a hosted shard; a command is written whole or
    /// not at all.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] with the runtime's (or the inbox's)
    /// errors; the errors of a shard's reader.
    pub async fn signal(
        &self,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<Routed<SignalOutcome>, ClusterError> {
        crate::coordination::signal::check_correlation_key(correlation_key)
            .map_err(ClusterError::Runtime)?;
        let shard = match self.waiter_shard(correlation_key).await? {
            Some(shard) => shard,
            None => self.inner.record.shard_of(correlation_key),
        };
        if let Some(local) = self.local(shard) {
            match local.runtime.signal(correlation_key, payload.clone()).await {
                Err(err) if shard_left(&err) => {}
                signalled => return Ok(Routed::Applied(signalled?)),
            }
        }
        self.send(shard, Command::signal(correlation_key, payload), None)
            .await
    }

    /// The views of every shard that has a queue (readers opened on first
    /// use).
    async fn views(&self) -> Result<Vec<(u32, WorkflowView)>, ClusterError> {
        // All at once: the first call opens a reader per shard.
        let looks = (0..self.inner.record.shards)
            .map(|shard| async move { Ok::<_, ClusterError>((shard, self.view(shard).await?)) });
        let views = futures_util::future::try_join_all(looks).await?;
        Ok(views
            .into_iter()
            .filter_map(|(shard, view)| view.map(|view| (shard, view)))
            .collect())
    }

    /// The shard holding `run_id`: its home shard, but for a group member
    /// (which lives in its group's shard) found by a search of the others
    /// when its id has a member's form. The home shard when no shard
    /// holds it (yet).
    async fn holding(&self, run_id: &RunId) -> Result<u32, ClusterError> {
        let home = self.shard_of(run_id);
        // A group member's run lives in its group's shard, a tick's run in
        // its schedule's, a child's in its parent's: look for them beyond
        // their ids' home.
        if !super::view::lives_beyond_home(run_id) {
            return Ok(home);
        }
        let found =
            super::view::locate(self.views().await?, home, run_id, DEFAULT_SHARD_CONCURRENCY)
                .await
                .map_err(|(_, err)| ClusterError::Runtime(err))?;
        Ok(found.unwrap_or(home))
    }

    /// The lowest shard with a waiter registered on `correlation_key`.
    async fn waiter_shard(&self, correlation_key: &str) -> Result<Option<u32>, ClusterError> {
        super::view::waiter_shard(
            self.views().await?,
            correlation_key,
            DEFAULT_SHARD_CONCURRENCY,
        )
        .await
        .map_err(|(_, err)| ClusterError::Runtime(err))
    }

    /// The view of shard `shard`: the hosted runtime's, else a reader's
    /// (`None` when the shard has no queue yet).
    ///
    /// # Errors
    /// [`ClusterError::NoSuchShard`] past the shard count; storage errors
    /// opening a reader.
    pub async fn view(&self, shard: u32) -> Result<Option<WorkflowView>, ClusterError> {
        if let Some(local) = self.local(shard) {
            return Ok(Some(local.runtime.view().clone()));
        }
        self.inner.remote.view(shard).await
    }

    /// The status of `run_id`, from its shard (through a reader when
    /// another process hosts it, so it lags that owner by the reader's
    /// poll interval). On a hosted shard it is
    /// [`WorkflowRuntime::status`](crate::WorkflowRuntime::status): a
    /// termination whose commit this process still waits to flush is
    /// reported once that commit did. A hosted shard another writer has
    /// fenced is read through a reader until this process drops it.
    ///
    /// # Errors
    /// The errors of [`WorkflowView::status`] and of opening a reader; on a
    /// hosted shard those of
    /// [`WorkflowRuntime::status`](crate::WorkflowRuntime::status) but the
    /// store-closed error (the shard is then read through a reader).
    pub async fn status(&self, run_id: &RunId) -> Result<Option<RunStatus>, ClusterError> {
        self.read_run(
            run_id,
            |runtime| async move { runtime.status(run_id).await },
            |view| async move { view.status(run_id).await },
        )
        .await
    }

    /// The committed outcome of `run_id`, as
    /// [`WorkflowView::outcome`]; on a hosted shard as
    /// [`WorkflowRuntime::outcome`](crate::WorkflowRuntime::outcome), which
    /// reports only durable terminations (see [`status`](Self::status)).
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub async fn outcome(&self, run_id: &RunId) -> Result<Option<RunOutcome>, ClusterError> {
        self.read_run(
            run_id,
            |runtime| async move { runtime.outcome(run_id).await },
            |view| async move { view.outcome(run_id).await },
        )
        .await
    }

    /// A read of `run_id` on its shard: `hosted` with the shard's runtime
    /// when this process hosts it, else (or when the hosted shard is found
    /// fenced by another writer, until it is dropped) `remote` with the
    /// shard's reader; `None` for a shard no reader can open yet.
    async fn read_run<T, HostedRead, HostedFut, RemoteRead, RemoteFut>(
        &self,
        run_id: &RunId,
        hosted: HostedRead,
        remote: RemoteRead,
    ) -> Result<Option<T>, ClusterError>
    where
        HostedRead: FnOnce(crate::WorkflowRuntime<R, H>) -> HostedFut,
        HostedFut: Future<Output = Result<Option<T>, Error>>,
        RemoteRead: FnOnce(WorkflowView) -> RemoteFut,
        RemoteFut: Future<Output = Result<Option<T>, Error>>,
    {
        let shard = self.holding(run_id).await?;
        if let Some(local) = self.local(shard) {
            match hosted(local.runtime.clone()).await {
                // Fenced by another writer: read as another process's.
                Err(err) if shard_left(&err) => {}
                answer => return Ok(answer?),
            }
        }
        match self.inner.remote.view(shard).await? {
            Some(view) => Ok(remote(view).await?),
            None => Ok(None),
        }
    }

    /// Wait until `run_id` ends. On a hosted shard it is the runtime's
    /// wait; elsewhere the shard's reader is polled every
    /// [`reader_poll_interval`](super::ClusterBuilder::reader_poll_interval).
    /// A run not found yet is waited for (a submission sent to an inbox
    /// appears once its owner applies it): bound the wait with
    /// [`wait_timeout`](Self::wait_timeout) for an id that may not exist.
    ///
    /// # Cancel safety
    ///
    /// Reads only; drop it at will.
    ///
    /// # Errors
    /// The errors of the reads.
    pub async fn wait(&self, run_id: &RunId) -> Result<RunEnd, ClusterError> {
        loop {
            if let Some(end) = self.wait_timeout(run_id, Duration::from_secs(3600)).await? {
                return Ok(end);
            }
        }
    }

    /// [`wait`](Self::wait), giving up after `timeout` (`Ok(None)`).
    ///
    /// # Cancel safety
    ///
    /// Reads only; drop it at will.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub async fn wait_timeout(
        &self,
        run_id: &RunId,
        timeout: Duration,
    ) -> Result<Option<RunEnd>, ClusterError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let poll = self.inner.remote.poll();
        let mut shard = self.holding(run_id).await?;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let mut found = true;
            let mut read_remote = true;
            if let Some(local) = self.local(shard) {
                read_remote = false;
                // Looked at again every few polls: the shard may leave.
                match local
                    .runtime
                    .wait_timeout(run_id, left.min(poll * 10))
                    .await
                {
                    Ok(Some(end)) => return Ok(Some(end)),
                    Ok(None) => {}
                    Err(Error::RunNotFound(_)) => {
                        found = false;
                        tokio::time::sleep(poll.min(left)).await;
                    }
                    // Fenced by another writer: until the supervisor drops
                    // the shard, its state is read from the store as
                    // another process's, a poll apart (the local runtime
                    // answers at once, so asking it again would spin).
                    Err(err) if shard_left(&err) => read_remote = true,
                    Err(err) => return Err(err.into()),
                }
            }
            if read_remote {
                if let Some(view) = self.inner.remote.view(shard).await? {
                    if let Some(end) = view.ended(run_id).await? {
                        return Ok(Some(end));
                    }
                    found = view.status(run_id).await?.is_some();
                }
                tokio::time::sleep(poll.min(left)).await;
            }
            if !found {
                // Not there (yet): a group member's run appears in its
                // group's shard.
                shard = self.holding(run_id).await?;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Where a sent command is, read from its shard.
    ///
    /// # Errors
    /// The errors of [`WorkflowView::command`] and of opening a reader.
    pub async fn command(&self, sent: &SentCommand) -> Result<CommandState, ClusterError> {
        match self.view(sent.shard).await? {
            Some(view) => Ok(view.command(&sent.id).await?),
            None => Ok(CommandState::Pending),
        }
    }

    /// Wait until a sent command is applied or rejected, at most
    /// `timeout`; returns its last state (`Pending`, `Accepted` or
    /// `Unknown` when the time ran out).
    ///
    /// # Cancel safety
    ///
    /// Reads only; drop it at will.
    ///
    /// # Errors
    /// As [`command`](Self::command).
    pub async fn answer(
        &self,
        sent: &SentCommand,
        timeout: Duration,
    ) -> Result<CommandState, ClusterError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let state = self.command(sent).await?;
            let settled = matches!(
                state,
                CommandState::Applied { .. } | CommandState::Rejected { .. }
            );
            let now = tokio::time::Instant::now();
            if settled || now >= deadline {
                return Ok(state);
            }
            tokio::time::sleep(self.inner.remote.poll().min(deadline - now)).await;
        }
    }

    /// Stop: stop taking shards, hand every hosted shard over (stop
    /// claiming, drain the steps in flight within the drain bound, close
    /// its queue, release its lease), leave the members and close the
    /// readers of other shards. Another process takes the shards at its
    /// next round. Until it is called the process keeps hosting its shards
    /// (dropping every handle does not stop them, as a spawned worker loop
    /// is not stopped by dropping its handle).
    ///
    /// # Cancel safety
    ///
    /// Dropped, the shards handed over so far are released; the rest stay
    /// hosted until the process exits, and are taken over after the lease
    /// time.
    ///
    /// # Errors
    /// None so far; storage errors releasing a lease are logged (the
    /// shard is taken over after the lease time).
    pub async fn shutdown(&self) -> Result<(), ClusterError> {
        self.inner.stop.cancel();
        let supervisor = self
            .inner
            .supervisor
            .lock()
            .ok()
            .and_then(|mut slot| slot.take());
        if let Some(supervisor) = supervisor
            && let Err(err) = supervisor.await
        {
            warn!("the cluster's ownership task failed: {err}");
        }
        // Static shards (and any left by a failed supervisor).
        self.stop_hosting().await;
        self.inner.remote.close().await;
        Ok(())
    }

    async fn stop_hosting(&self) {
        let drain = match &self.inner.ownership {
            Ownership::Leases(lease) => lease.drain,
            _ => super::builder::DEFAULT_DRAIN,
        };
        for shard in self.inner.hosted.list() {
            if let Some(local) = self.inner.hosted.remove(shard) {
                super::host::hand_over(local, drain).await;
            }
        }
    }
}
