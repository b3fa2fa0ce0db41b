//! The ownership task of a cluster process: one round every check
//! interval.
//!
//! Static ownership: watch the hosted shards; a shard whose worker loop
//! ended (another process opened its queue, fencing this one) is dropped
//! and not opened again.
//!
//! Bucket leases: a task of its own beats (rewrites this process's member
//! record) every check interval, whatever the rounds are doing; and each
//! round:
//! 1. lists the members;
//! 2. check each hosted shard's lease: a lease no longer this process's at
//!    its epoch means another process took the shard, which is dropped at
//!    once (it was fenced: nothing it would commit can land);
//! 3. hand over the hosted shards another live member should hold
//!    (rendezvous hashing): stop claiming, drain within the bound, close
//!    the queue, release the lease (on a task of its own, so the rounds go
//!    on meanwhile);
//! 4. take the shards this process should hold that are free or held by a
//!    dead member: bump the epoch, then open the queue (which fences the
//!    old writer in SlateDB); and, as a fallback, any shard left free or
//!    held by the dead for a whole lease time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{error, info, warn};

use super::builder::{LeaseOptions, Ownership};
use super::host::{Ended, drop_fenced, hand_over};
use super::lease::{LeaseState, ShardLease};
use super::members::{Beat, Liveness, preferred_member};
use super::runtime::ClusterInner;
use crate::hooks::terminal::TerminalHook;
use crate::runner::StepRunner;

/// Run the ownership task until the cluster stops.
pub(crate) async fn run<R, H>(inner: Arc<ClusterInner<R, H>>)
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    match inner.ownership.clone() {
        Ownership::Static(_) => watch_static(&inner).await,
        Ownership::Leases(options) => {
            let mut leases = Leases::new(inner.clone(), options);
            leases.run().await;
        }
        Ownership::Client => inner.stop.cancelled().await,
    }
}

fn note(node: &str, hosted: usize, change: Option<&'static str>) {
    #[cfg(feature = "metrics")]
    crate::telemetry::metrics::cluster_shards(node, hosted, change);
    #[cfg(not(feature = "metrics"))]
    let _ = (node, hosted, change);
}

async fn watch_static<R, H>(inner: &ClusterInner<R, H>)
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    note(&inner.node, inner.hosted.list().len(), None);
    let Ownership::Static(owned) = &inner.ownership else {
        return;
    };
    let owned = owned.owned(inner.record.shards);
    // Shards another process opened: never opened here again.
    let mut fenced = BTreeSet::new();
    let interval = super::builder::DEFAULT_CHECK_INTERVAL;
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        for local in inner.hosted.all() {
            let Some(ended) = local.ended().await else {
                continue;
            };
            let shard = local.shard;
            drop(local);
            let Some(local) = inner.hosted.remove(shard) else {
                continue;
            };
            match ended {
                Ended::Outage(outage) => {
                    warn!(shard, node = %inner.node, "the shard's store ran past its outage budget; the shard is opened again once the store answers: {outage}");
                }
                Ended::Fenced(reason) => {
                    error!(
                        shard,
                        node = %inner.node,
                        "fenced out of the shard: another process opened its queue; it is not opened again here (two processes are configured to own it): {reason}"
                    );
                    fenced.insert(shard);
                }
            }
            drop_fenced(local).await;
            note(&inner.node, inner.hosted.list().len(), Some("fenced"));
        }
        for &shard in &owned {
            if fenced.contains(&shard) || inner.hosted.get(shard).is_some() {
                continue;
            }
            match inner.factory.open(shard, None).await {
                Ok(local) => {
                    inner.hosted.insert(local);
                    info!(shard, node = %inner.node, "the shard is open again");
                    note(&inner.node, inner.hosted.list().len(), Some("opened"));
                }
                Err(err) => warn!(shard, node = %inner.node, "opening the shard again: {err}"),
            }
        }
    }
}

/// The state of the lease-mode task.
struct Leases<R, H> {
    inner: Arc<ClusterInner<R, H>>,
    options: LeaseOptions,
    liveness: Liveness,
    /// Handovers and fenced drops in progress.
    pending: JoinSet<()>,
    /// Lease handles by shard, opened on first use.
    handles: BTreeMap<u32, ShardLease>,
    /// Since when (this clock) each shard not hosted here was seen free
    /// or held by a dead member.
    orphaned_since: BTreeMap<u32, Instant>,
    last_sweep: Option<Instant>,
    rounds: u64,
}

impl<R, H> Leases<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    fn new(inner: Arc<ClusterInner<R, H>>, options: LeaseOptions) -> Self {
        let liveness = Liveness::new(inner.store.clone(), &inner.root, options.lease);
        Self {
            inner,
            options,
            pending: JoinSet::new(),
            liveness,
            handles: BTreeMap::new(),
            orphaned_since: BTreeMap::new(),
            last_sweep: None,
            rounds: 0,
        }
    }

    async fn run(&mut self) {
        let beats = self.inner.stop.child_token();
        let beating = tokio::spawn(beat(
            Beat::new(
                self.inner.store.clone(),
                &self.inner.root,
                &self.inner.node,
                self.options.check_interval,
            ),
            self.inner.hosted_list_fn(),
            self.options.check_interval,
            beats.clone(),
        ));
        loop {
            while self.pending.try_join_next().is_some() {}
            if let Err(err) = self.round().await {
                warn!(node = %self.inner.node, "cluster ownership round: {err}");
            }
            tokio::select! {
                () = self.inner.stop.cancelled() => break,
                () = tokio::time::sleep(self.options.check_interval) => {}
            }
        }
        self.leave().await;
        beats.cancel();
        match beating.await {
            Ok(beat) => {
                if let Err(err) = beat.leave().await {
                    warn!(node = %self.inner.node, "leaving the members failed: {err}");
                }
            }
            Err(err) => warn!(node = %self.inner.node, "the beat task failed: {err}"),
        }
    }

    async fn lease(&mut self, shard: u32) -> Result<&mut ShardLease, super::ClusterError> {
        if !self.handles.contains_key(&shard) {
            let lease = ShardLease::open(self.inner.store.clone(), &self.inner.root, shard).await?;
            self.handles.insert(shard, lease);
        }
        // Inserted above.
        self.handles
            .get_mut(&shard)
            .ok_or(super::ClusterError::NoSuchShard {
                shard,
                shards: self.inner.record.shards,
            })
    }

    async fn round(&mut self) -> Result<(), super::ClusterError> {
        self.rounds += 1;
        let node = self.inner.node.clone();
        let mut live = self.liveness.observe().await?;
        live.insert(node.clone());

        // 2. Hosted shards still ours?
        for local in self.inner.hosted.all() {
            let shard = local.shard;
            let epoch = local.epoch.unwrap_or_default();
            let lease = self.lease(shard).await?;
            let record = lease.refresh().await?.clone();
            let ours = record.is_held_by(&node, epoch);
            let ended = local.ended().await;
            drop(local);
            if !ours || ended.is_some() {
                let Some(local) = self.inner.hosted.remove(shard) else {
                    continue;
                };
                note(&node, self.inner.hosted.list().len(), Some("fenced"));
                if !ours {
                    error!(
                        shard,
                        node = %node,
                        epoch,
                        holder = ?record.holder,
                        lease_epoch = record.epoch,
                        "fenced out of the shard: another process took it; nothing more is committed here"
                    );
                    self.pending.spawn(drop_fenced(local));
                    continue;
                }
                match &ended {
                    Some(Ended::Outage(outage)) => warn!(
                        shard,
                        node = %node,
                        "the shard's store ran past its outage budget; its lease is released and the shard hosted again: {outage}"
                    ),
                    _ => error!(
                        shard,
                        node = %node,
                        reason = ?ended.as_ref().map(|ended| match ended {
                            Ended::Fenced(reason) => reason.as_str(),
                            Ended::Outage(_) => "outage",
                        }),
                        "the shard's worker ended under a lease still ours; the lease is released"
                    ),
                }
                // The worker ended under a lease still ours: close the queue
                // first, then let the shard go, so that a process that can
                // open it does (the order of a handover).
                drop_fenced(local).await;
                let lease = self.lease(shard).await?;
                lease.release(&node, epoch).await?;
            }
        }

        let desired: BTreeSet<u32> = (0..self.inner.record.shards)
            .filter(|&shard| preferred_member(shard, &live).is_some_and(|m| *m == node))
            .collect();

        // 3. Hand over what another live member should hold.
        for shard in self.inner.hosted.list() {
            if desired.contains(&shard) {
                continue;
            }
            info!(shard, node = %node, "handing the shard over to the member that should hold it");
            self.start_handover(shard);
        }

        // The first round only beats and looks: processes starting together
        // see each other before any takes a shard.
        if self.rounds < 2 {
            return Ok(());
        }

        // 4. Take what this process should hold, and orphans.
        let now = Instant::now();
        let sweep = self
            .last_sweep
            .is_none_or(|last| now.saturating_duration_since(last) >= self.options.lease);
        if sweep {
            self.last_sweep = Some(now);
        }
        for shard in 0..self.inner.record.shards {
            if self.inner.stop.is_cancelled() {
                return Ok(());
            }
            if self.inner.hosted.get(shard).is_some() {
                self.orphaned_since.remove(&shard);
                continue;
            }
            let wanted = desired.contains(&shard);
            if !wanted && !sweep && !self.orphaned_since.contains_key(&shard) {
                continue;
            }
            let lease = self.lease(shard).await?;
            let record = lease.refresh().await?.clone();
            let orphan = match (&record.state, &record.holder) {
                (LeaseState::Free, _) | (LeaseState::Held, None) => true,
                (LeaseState::Held, Some(holder)) => self.liveness.is_dead(holder),
            };
            if !orphan {
                self.orphaned_since.remove(&shard);
                continue;
            }
            let since = *self.orphaned_since.entry(shard).or_insert(now);
            let abandoned = now.saturating_duration_since(since) >= self.options.lease;
            if wanted || abandoned {
                self.take(shard).await?;
            }
        }
        Ok(())
    }

    /// Take `shard` (its lease read as free or held by the dead): bump the
    /// epoch, then open its queue.
    async fn take(&mut self, shard: u32) -> Result<(), super::ClusterError> {
        let node = self.inner.node.clone();
        let lease = self.lease(shard).await?;
        let previous = lease.record().clone();
        let Some(epoch) = lease.take(&node).await? else {
            // Another process wrote first; judged again next round.
            return Ok(());
        };
        match self.inner.factory.open(shard, Some(epoch)).await {
            Ok(local) => {
                self.inner.hosted.insert(local);
                self.orphaned_since.remove(&shard);
                info!(
                    shard,
                    node = %node,
                    epoch,
                    previous_holder = ?previous.holder,
                    "took the shard"
                );
                note(&node, self.inner.hosted.list().len(), Some("opened"));
            }
            Err(err) => {
                warn!(shard, node = %node, "the shard's queue did not open; its lease is released: {err}");
                let lease = self.lease(shard).await?;
                lease.release(&node, epoch).await?;
            }
        }
        Ok(())
    }

    /// A clean stop: hand every hosted shard over and release its lease,
    /// all at once, and wait for the handovers in progress.
    async fn leave(&mut self) {
        for shard in self.inner.hosted.list() {
            self.start_handover(shard);
        }
        while self.pending.join_next().await.is_some() {}
    }

    /// Take `shard` out of the hosted table and hand it over on a task of
    /// its own (drain, close, release its lease).
    fn start_handover(&mut self, shard: u32) {
        let Some(local) = self.inner.hosted.remove(shard) else {
            return;
        };
        let node = self.inner.node.clone();
        note(&node, self.inner.hosted.list().len(), Some("handed_over"));
        self.pending.spawn(release(
            self.inner.store.clone(),
            self.inner.root.clone(),
            node,
            local,
            self.options.drain,
        ));
    }
}

/// Beat every `interval` until `stop`; returns the beat, to leave with.
async fn beat(
    mut beat: Beat,
    hosted: impl Fn() -> Vec<u32>,
    interval: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) -> Beat {
    loop {
        if let Err(err) = beat.beat(hosted()).await {
            warn!("cluster member beat failed: {err}");
        }
        tokio::select! {
            () = stop.cancelled() => return beat,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Hand `local` over, then release its lease (read afresh: the handle of
/// the rounds stays theirs).
async fn release<R, H>(
    store: Arc<dyn taquba::object_store::ObjectStore>,
    root: String,
    node: String,
    local: Arc<super::host::LocalShard<R, H>>,
    drain: std::time::Duration,
) {
    let (shard, epoch) = (local.shard, local.epoch.unwrap_or_default());
    hand_over(local, drain).await;
    let released = match ShardLease::open(store, &root, shard).await {
        Ok(mut lease) => lease.release(&node, epoch).await,
        Err(err) => Err(err),
    };
    match released {
        Ok(_) => info!(shard, node = %node, "released the shard"),
        Err(err) => {
            warn!(shard, node = %node, "releasing the shard's lease failed; it is taken over after the lease time: {err}")
        }
    }
}
