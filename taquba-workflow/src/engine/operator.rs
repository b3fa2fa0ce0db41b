//! The operator surface's part of each maintenance round: the runtime's
//! descriptor and worker record (once per worker start; the worker record
//! again at a clean stop), the inbox commands, and the command retention
//! sweep. Failures are logged and retried at the next round, as
//! for the rest of maintenance.

use std::sync::atomic::Ordering;

use taquba::SettlementEffects;
use tracing::{debug, warn};

use crate::engine::RuntimeCore;
use crate::store::durable;
use crate::store::keys::{runtime_kv_key, worker_kv_key};
use crate::view::{DurableRuntimeInfo, DurableWorkerRecord};

/// The store layout version a descriptor states.
const FORMAT: u32 = 1;

impl RuntimeCore {
    /// The operator round: descriptor, inbox, command retention.
    pub(super) async fn maintain_operator_surface(&self) {
        if !self.descriptor_recorded.load(Ordering::Relaxed) {
            match self.record_descriptor().await {
                Ok(()) => self.descriptor_recorded.store(true, Ordering::Relaxed),
                Err(err) => {
                    self.note_error(&err);
                    warn!(queue = %self.queue_name, "recording the runtime descriptor failed: {err}");
                }
            }
        }
        match self.poll_inbox().await {
            Ok(0) => {}
            Ok(handled) => debug!(queue = %self.queue_name, handled, "inbox commands handled"),
            Err(err) => {
                self.note_error(&err);
                warn!(queue = %self.queue_name, "applying inbox commands failed: {err}");
            }
        }
        if let Err(err) = self.sweep_commands().await {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "command retention sweep failed: {err}");
        }
    }

    /// Write this runtime's descriptor (`workflow/runtimes/{queue_name}`),
    /// so tools find its memo prefix from the store alone, and in the same
    /// transaction its worker record (`workflow/workers/{queue_name}`:
    /// this start, its claim lease, no stop yet).
    async fn record_descriptor(&self) -> crate::error::Result<()> {
        let started_at_ms = self.now_ms();
        let info = DurableRuntimeInfo {
            queue_name: self.queue_name.clone(),
            memo_prefix: self.memo_prefix.clone(),
            format: FORMAT,
            crate_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at_ms,
        };
        let worker = self.worker_record(started_at_ms, None);
        self.commits
            .commit(
                SettlementEffects::default()
                    .kv_put(runtime_kv_key(&self.queue_name), durable::encode(&info))
                    .kv_put(worker_kv_key(&self.queue_name), durable::encode(&worker)),
            )
            .await?;
        self.worker_started_at_ms
            .store(started_at_ms, Ordering::Relaxed);
        Ok(())
    }

    /// Whether this runtime's worker loop has started (its start is
    /// recorded): the steps this runtime submits are claimed here.
    pub(crate) fn runs_worker(&self) -> bool {
        self.worker_started_at_ms.load(Ordering::Relaxed) != 0
    }

    /// Record that the worker started at the recorded start stopped
    /// cleanly (its loop drained and returned), so a tool that finds no
    /// heartbeat can tell a stopped owner from a live one. Nothing is
    /// written when no start was recorded.
    pub(crate) async fn record_clean_stop(&self) {
        let started_at_ms = self.worker_started_at_ms.load(Ordering::Relaxed);
        if started_at_ms == 0 {
            return;
        }
        let worker = self.worker_record(started_at_ms, Some(self.now_ms()));
        if let Err(err) = self
            .commits
            .kv_put(&worker_kv_key(&self.queue_name), &durable::encode(&worker))
            .await
        {
            warn!(queue = %self.queue_name, "recording the worker's clean stop failed: {err}");
        }
    }

    fn worker_record(&self, started_at_ms: u64, stopped_at_ms: Option<u64>) -> DurableWorkerRecord {
        let lease = crate::hooks::guard::claim_lease(&self.queue, &self.queue_name);
        DurableWorkerRecord {
            started_at_ms,
            claim_lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            stopped_at_ms,
        }
    }
}
