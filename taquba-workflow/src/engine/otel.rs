//! The engine's records of a signal's sender (feature `opentelemetry`):
//! the trace context current when a signal is sent, stored beside the
//! signal until the step it wakes links to it (see `telemetry::otel`).

use taquba::SettlementEffects;

use crate::engine::RuntimeCore;
use crate::error::Result;
use crate::store::durable;
use crate::store::keys::{buffered_sender_kv_key, signal_sender_kv_key};
use crate::telemetry::otel::{NotedSender, TraceFields};

impl RuntimeCore {
    /// Record the trace context current now as the sender of a signal about
    /// to wake step job `job_id`. Written before the wake, so the woken
    /// step finds it; [`unnote_signal_sender`](Self::unnote_signal_sender)
    /// removes it when the wake does not happen.
    pub(super) async fn note_signal_sender(&self, job_id: &str) -> Result<NotedSender> {
        let Some(fields) = TraceFields::current() else {
            return Ok(None);
        };
        let (key, value) = (signal_sender_kv_key(job_id), durable::encode(&fields));
        self.commits.kv_put(&key, &value).await?;
        Ok(Some((key, value)))
    }

    /// Remove a sender recorded for a wake that did not happen.
    pub(super) async fn unnote_signal_sender(&self, noted: NotedSender) -> Result<()> {
        if let Some((key, value)) = noted {
            self.commits.kv_compare_delete(&key, &value).await?;
        }
        Ok(())
    }

    /// `effects` (which buffer a signal under `correlation_key`) with the
    /// current trace context stored as the buffered signal's sender, or the
    /// sender of the signal they replace removed.
    pub(super) fn buffer_sender(
        correlation_key: &str,
        effects: SettlementEffects,
    ) -> SettlementEffects {
        let key = buffered_sender_kv_key(correlation_key);
        match TraceFields::current() {
            Some(fields) => effects.kv_put(key, durable::encode(&fields)),
            None => effects.kv_delete(key),
        }
    }

    /// The effects that remove the sender of the signal buffered under
    /// `correlation_key` (a cleared signal).
    pub(super) fn clear_buffered_sender(correlation_key: &str) -> SettlementEffects {
        SettlementEffects::default().kv_delete(buffered_sender_kv_key(correlation_key))
    }

    /// `effects` (which consume the signal buffered under `correlation_key`
    /// for step job `job_id`) with that signal's sender moved to the job.
    pub(super) async fn consume_buffered_sender(
        &self,
        correlation_key: &str,
        job_id: &str,
        effects: SettlementEffects,
    ) -> Result<SettlementEffects> {
        let key = buffered_sender_kv_key(correlation_key);
        Ok(match self.queue.view().kv_get(&key).await? {
            Some(sender) => effects
                .kv_put(signal_sender_kv_key(job_id), sender.to_vec())
                .kv_delete(key),
            None => effects,
        })
    }
}
