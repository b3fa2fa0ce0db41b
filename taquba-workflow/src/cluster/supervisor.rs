//! The ownership task of a cluster process: one round every check
//! interval.
//!
//! Static ownership: watch the hosted shards; a shard whose worker loop
//! ended (another process opened its queue, fencing this one) is dropped
//! and not opened again.
//!
//! Bucket leases, each round:
//! 1. beat (rewrite this process's member record) and list the members;
//! 2. check each hosted shard's lease: a lease no longer this process's at
//!    its epoch means another process took the shard, which is dropped at
//!    once (it was fenced: nothing it would commit can land);
//! 3. hand over the hosted shards another live member should hold
//!    (rendezvous hashing): stop claiming, drain within the bound, close
//!    the queue, release the lease;
//! 4. take the shards this process should hold that are free or held by a
//!    dead member: bump the epoch, then open the queue (which fences the
//!    old writer in SlateDB); and, as a fallback, any shard left free or
//!    held by the dead for a whole lease time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::builder::{LeaseOptions, Ownership};
use super::host::{drop_fenced, hand_over};
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
            let mut leases = Leases::new(&inner, options);
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
    let interval = super::builder::DEFAULT_CHECK_INTERVAL;
    loop {
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        for local in inner.hosted.all() {
            if local.worker_ended()
                && let Some(local) = inner.hosted.remove(local.shard)
            {
                error!(
                    shard = local.shard,
                    node = %inner.node,
                    "fenced out of the shard: another process opened its queue; it is not opened again here (two processes are configured to own it)"
                );
                drop_fenced(local).await;
                note(&inner.node, inner.hosted.list().len(), Some("fenced"));
            }
        }
    }
}

/// The state of the lease-mode task.
struct Leases<'a, R, H> {
    inner: &'a ClusterInner<R, H>,
    options: LeaseOptions,
    beat: Beat,
    liveness: Liveness,
    /// Lease handles by shard, opened on first use.
    handles: BTreeMap<u32, ShardLease>,
    /// Since when (this clock) each shard not hosted here was seen free
    /// or held by a dead member.
    orphaned_since: BTreeMap<u32, Instant>,
    last_sweep: Option<Instant>,
    rounds: u64,
}

impl<'a, R, H> Leases<'a, R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    fn new(inner: &'a ClusterInner<R, H>, options: LeaseOptions) -> Self {
        Self {
            inner,
            options,
            beat: Beat::new(
                inner.store.clone(),
                &inner.root,
                &inner.node,
                options.check_interval,
            ),
            liveness: Liveness::new(inner.store.clone(), &inner.root, options.lease),
            handles: BTreeMap::new(),
            orphaned_since: BTreeMap::new(),
            last_sweep: None,
            rounds: 0,
        }
    }

    async fn run(&mut self) {
        loop {
            if let Err(err) = self.round().await {
                warn!(node = %self.inner.node, "cluster ownership round: {err}");
            }
            tokio::select! {
                () = self.inner.stop.cancelled() => break,
                () = tokio::time::sleep(self.options.check_interval) => {}
            }
        }
        self.leave().await;
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
        self.beat.beat(self.inner.hosted.list()).await?;
        let mut live = self.liveness.observe().await?;
        live.insert(node.clone());

        // 2. Hosted shards still ours?
        for local in self.inner.hosted.all() {
            let shard = local.shard;
            let epoch = local.epoch.unwrap_or_default();
            let lease = self.lease(shard).await?;
            let record = lease.refresh().await?.clone();
            let ours = record.is_held_by(&node, epoch);
            if !ours || local.worker_ended() {
                if let Some(local) = self.inner.hosted.remove(shard) {
                    error!(
                        shard,
                        node = %node,
                        epoch,
                        holder = ?record.holder,
                        lease_epoch = record.epoch,
                        "fenced out of the shard: another process took it; nothing more is committed here"
                    );
                    drop_fenced(local).await;
                    note(&node, self.inner.hosted.list().len(), Some("fenced"));
                }
                if ours {
                    // The worker ended under a lease still ours: let the
                    // shard go so that a process that can open it does.
                    let lease = self.lease(shard).await?;
                    lease.release(&node, epoch).await?;
                }
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
            if let Some(local) = self.inner.hosted.remove(shard) {
                let epoch = local.epoch.unwrap_or_default();
                info!(shard, node = %node, "handing the shard over to the member that should hold it");
                hand_over(local, self.options.drain).await;
                let lease = self.lease(shard).await?;
                lease.refresh().await?;
                lease.release(&node, epoch).await?;
                note(&node, self.inner.hosted.list().len(), Some("handed_over"));
            }
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

    /// A clean stop: hand every hosted shard over, release its lease,
    /// leave the members.
    async fn leave(&mut self) {
        let node = self.inner.node.clone();
        for shard in self.inner.hosted.list() {
            let Some(local) = self.inner.hosted.remove(shard) else {
                continue;
            };
            let epoch = local.epoch.unwrap_or_default();
            hand_over(local, self.options.drain).await;
            let released = match self.lease(shard).await {
                Ok(lease) => match lease.refresh().await {
                    Ok(_) => lease.release(&node, epoch).await,
                    Err(err) => Err(err),
                },
                Err(err) => Err(err),
            };
            if let Err(err) = released {
                warn!(shard, node = %node, "releasing the shard's lease failed; it is taken over after the lease time: {err}");
            }
            note(&node, self.inner.hosted.list().len(), Some("handed_over"));
        }
        if let Err(err) = self.beat.leave().await {
            warn!(node = %node, "leaving the members failed: {err}");
        }
    }
}
