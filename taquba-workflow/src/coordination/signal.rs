//! Durable signals, the parts outside the engine: the outcome of a
//! delivery ([`SignalOutcome`]), the in-process locks that serialise the
//! registration, delivery and buffering of one correlation key
//! ([`SignalLocks`]; the store has one writer), and the checks of keys and
//! payloads. The engine's side (registering a waiter, delivering, buffering)
//! is `engine::signal`.

use std::sync::Arc;

use taquba::{JobRecord, MAX_KV_VALUE_SIZE};
use tokio::sync::{Mutex, OwnedMutexGuard};

use crate::error::{Error, Result};
use crate::store::keys::{
    HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, MAX_CORRELATION_KEY_LEN, RunId, sha256,
    signal_delivered_kv_key,
};

/// Lock stripes of correlation keys.
const STRIPES: usize = 64;

/// What [`WorkflowRuntime::signal`](crate::WorkflowRuntime::signal) did with
/// a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalOutcome {
    /// A waiting run was woken; its next step sees the payload.
    Delivered,
    /// No run was waiting: the signal is held durably for the next waiter
    /// (replacing any signal buffered before under the key).
    Buffered,
}

/// The in-process locks of correlation keys, striped by key digest.
pub(crate) struct SignalLocks {
    stripes: Vec<Arc<Mutex<()>>>,
}

impl Default for SignalLocks {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Arc::new(Mutex::new(()))).collect(),
        }
    }
}

impl SignalLocks {
    pub(crate) async fn lock(&self, correlation_key: &str) -> OwnedMutexGuard<()> {
        let digest = sha256(correlation_key.as_bytes());
        let stripe = usize::from(digest[0]) % self.stripes.len();
        self.stripes[stripe].clone().lock_owned().await
    }
}

/// The signal state of its own a waiting (or woken) step leaves behind,
/// deleted when the step ends outside a runner call (cancellation, dead
/// letter). Not the key's waiter record: once the step was woken, the
/// record may be another run's wait on the same key, so it is deleted
/// apart, and only while it still names the step (see
/// [`RuntimeCore::forget_waiter_of`](crate::engine::RuntimeCore)).
pub(crate) fn waiter_cleanup(job: &JobRecord) -> Vec<Vec<u8>> {
    let mut keys = Vec::new();
    // A waiting step holds a delivered signal once an inbox signal reached
    // it (see `signal_command`).
    if (job.headers.contains_key(HEADER_SIGNAL_DELIVERED)
        || job.headers.contains_key(HEADER_SIGNAL_WAIT))
        && let (Some(run_id), Some(step)) = (
            job.headers.get(crate::store::keys::HEADER_RUN_ID),
            job.headers.get(crate::store::keys::HEADER_STEP),
        )
        && let (Ok(run_id), Ok(step)) = (RunId::parse_ref(run_id), step.parse::<u32>())
    {
        keys.push(signal_delivered_kv_key(&run_id, step));
    }
    #[cfg(feature = "opentelemetry")]
    keys.extend(crate::telemetry::otel::sender_cleanup(job));
    keys
}

/// Refuse a correlation key over [`MAX_CORRELATION_KEY_LEN`].
pub(crate) fn check_correlation_key(correlation_key: &str) -> Result<()> {
    if correlation_key.len() > MAX_CORRELATION_KEY_LEN {
        let mut end = 64.min(correlation_key.len());
        while !correlation_key.is_char_boundary(end) {
            end -= 1;
        }
        return Err(Error::InvalidCorrelationKey {
            len: correlation_key.len(),
            max: MAX_CORRELATION_KEY_LEN,
            start: correlation_key[..end].to_string(),
        });
    }
    Ok(())
}

/// Refuse a signal payload over the KV value limit.
pub(crate) fn check_payload(payload: &[u8]) -> Result<()> {
    if payload.len() > MAX_KV_VALUE_SIZE {
        return Err(Error::Queue(taquba::Error::KvValueTooLarge {
            size: payload.len(),
            max: MAX_KV_VALUE_SIZE,
        }));
    }
    Ok(())
}
