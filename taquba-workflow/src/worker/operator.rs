//! The operator surface's part of each maintenance round: the runtime's
//! descriptor (once per worker start), the inbox commands, and the command
//! retention sweep. Failures are logged and retried at the next round, as
//! for the rest of maintenance.

use std::sync::atomic::Ordering;

use tracing::{debug, warn};

use crate::run::core::RuntimeCore;
use crate::store::durable;
use crate::store::keys::runtime_kv_key;
use crate::view::DurableRuntimeInfo;

/// The store layout version a descriptor states.
const FORMAT: u32 = 1;

impl RuntimeCore {
    /// The operator round: descriptor, inbox, command retention.
    pub(crate) async fn maintain_operator_surface(&self) {
        if !self.descriptor_recorded.load(Ordering::Relaxed) {
            match self.record_descriptor().await {
                Ok(()) => self.descriptor_recorded.store(true, Ordering::Relaxed),
                Err(err) => {
                    self.note_error(&err);
                    warn!(queue = %self.queue_name, "recording the runtime descriptor failed: {err}");
                }
            }
        }
        match self.apply_inbox().await {
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
    /// so tools find its memo prefix from the store alone.
    async fn record_descriptor(&self) -> crate::error::Result<()> {
        let info = DurableRuntimeInfo {
            queue_name: self.queue_name.clone(),
            memo_prefix: self.memo_prefix.clone(),
            format: FORMAT,
            crate_version: env!("CARGO_PKG_VERSION").to_string(),
            started_at_ms: self.now_ms(),
        };
        self.queue
            .kv_put(&runtime_kv_key(&self.queue_name), &durable::encode(&info))
            .await?;
        Ok(())
    }
}
