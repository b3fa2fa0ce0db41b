//! Staged KV effects: [`EffectsHandle`] collects a step's application KV
//! writes and deletes, [`TerminalEffects`] a terminal hook's writes,
//! deletes and follow-up enqueues. Both validate as they stage and are
//! sealed once their owner returns, so nothing staged late is silently
//! lost. [`check_enqueue`] is the rule of every enqueue a caller adds to
//! the runtime's commits (a hook's, a submission's).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use taquba::{EnqueueRequest, MAX_KV_VALUE_SIZE};

use crate::error::{Error, Result};
use crate::store::keys::{RESERVED_HEADER_PREFIX, RESERVED_KV_PREFIX};

/// Why an enqueue into the runtime's own queue is refused.
const OWN_QUEUE_REASON: &str =
    "it is the runtime's own queue, which takes only the runtime's step and notification jobs";

/// Check an enqueue a caller adds to the runtime's commits: no header under
/// [`RESERVED_HEADER_PREFIX`] (those headers make a job a step or a
/// notification of a runtime over the queue, so the enqueue would forge
/// one), and not into `own_queue`, the runtime's queue (when known).
///
/// # Errors
/// [`Error::ReservedHeaderInSubmit`] naming the reserved header (the first
/// in byte order when there are several); [`Error::Queue`] with
/// [`taquba::Error::InvalidQueueName`] naming the runtime's queue.
pub(crate) fn check_enqueue(request: &EnqueueRequest, own_queue: Option<&str>) -> Result<()> {
    if let Some(name) = request
        .options
        .headers
        .keys()
        .filter(|name| name.starts_with(RESERVED_HEADER_PREFIX))
        .min()
    {
        return Err(Error::ReservedHeaderInSubmit(name.clone()));
    }
    if own_queue == Some(request.queue.as_str()) {
        return Err(Error::Queue(taquba::Error::InvalidQueueName {
            queue: request.queue.clone(),
            reason: OWN_QUEUE_REASON,
        }));
    }
    Ok(())
}

/// The writes and deletes one step (or hook) staged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StagedKv {
    pub(crate) writes: HashMap<Vec<u8>, Vec<u8>>,
    pub(crate) deletes: BTreeSet<Vec<u8>>,
}

impl StagedKv {
    /// Check that application effects stay out of the reserved prefix and
    /// within the value cap; used for staged effects and for the effects of
    /// a submission.
    pub(crate) fn check_key(key: &[u8]) -> Result<()> {
        if key.starts_with(RESERVED_KV_PREFIX.as_bytes()) {
            return Err(Error::ReservedKvKey(
                String::from_utf8_lossy(key).into_owned(),
            ));
        }
        Ok(())
    }

    pub(crate) fn check_value(value: &[u8]) -> Result<()> {
        if value.len() > MAX_KV_VALUE_SIZE {
            return Err(Error::Queue(taquba::Error::KvValueTooLarge {
                size: value.len(),
                max: MAX_KV_VALUE_SIZE,
            }));
        }
        Ok(())
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<()> {
        Self::check_key(&key)?;
        Self::check_value(&value)?;
        if self.deletes.contains(&key) {
            return Err(Error::ConflictingKvEffect(
                String::from_utf8_lossy(&key).into_owned(),
            ));
        }
        self.writes.insert(key, value);
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<()> {
        Self::check_key(&key)?;
        if self.writes.contains_key(&key) {
            return Err(Error::ConflictingKvEffect(
                String::from_utf8_lossy(&key).into_owned(),
            ));
        }
        self.deletes.insert(key);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Staging {
    kv: StagedKv,
    enqueues: Vec<EnqueueRequest>,
    sealed: bool,
}

/// Shared staging state; clones of a handle stage into one set.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Staging>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Staging> {
        // A panic while staging cannot leave the set half-updated (every
        // mutation is a single insert), so a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn stage(&self, f: impl FnOnce(&mut Staging) -> Result<()>) -> Result<()> {
        let mut staging = self.lock();
        if staging.sealed {
            return Err(Error::EffectsSealed);
        }
        f(&mut staging)
    }

    fn seal_and_take(&self) -> (StagedKv, Vec<EnqueueRequest>) {
        let mut staging = self.lock();
        staging.sealed = true;
        (
            std::mem::take(&mut staging.kv),
            std::mem::take(&mut staging.enqueues),
        )
    }

    fn counts(&self) -> (usize, usize, usize) {
        let staging = self.lock();
        (
            staging.kv.writes.len(),
            staging.kv.deletes.len(),
            staging.enqueues.len(),
        )
    }
}

/// Application KV effects of one step, committed in the settlement of the
/// outcome the runner returns (any outcome: `Continue`, `Succeed`, `Fail`,
/// runner-issued `Cancel`). Nothing is applied when the runner returns a
/// [`StepError`](crate::StepError) or when an external cancellation
/// overrides the outcome.
///
/// Keys are bytes in the queue's caller KV namespace; read committed values
/// back with [`Delivery::kv`](crate::Delivery::kv),
/// [`taquba::QueueView::kv_get`] or a `taquba::QueueReader`. A retried step
/// stages its effects again, so stage absolute values.
///
/// Cheap to clone; clones stage into the same set.
#[derive(Clone, Default)]
pub struct EffectsHandle {
    shared: Shared,
}

impl EffectsHandle {
    /// A handle bound to no step: effects are validated and staged, and
    /// dropped with the handle. For tests of runners.
    pub fn detached() -> Self {
        Self::default()
    }

    /// Stage a write of `value` at `key`.
    ///
    /// # Errors
    /// [`Error::ReservedKvKey`] for a key under `workflow/`;
    /// [`Error::Queue`] with `taquba::Error::KvValueTooLarge` for a value
    /// over [`taquba::MAX_KV_VALUE_SIZE`] (256 KiB); [`Error::ConflictingKvEffect`]
    /// when the key is already staged for deletion in this step;
    /// [`Error::EffectsSealed`] once the step has returned.
    pub fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        let (key, value) = (key.into(), value.into());
        self.shared.stage(|s| s.kv.put(key, value))
    }

    /// Stage a delete of `key`.
    ///
    /// # Errors
    /// [`Error::ReservedKvKey`], [`Error::ConflictingKvEffect`] (the key is
    /// staged for a write) and [`Error::EffectsSealed`], as for
    /// [`put`](Self::put).
    pub fn delete(&self, key: impl Into<Vec<u8>>) -> Result<()> {
        let key = key.into();
        self.shared.stage(|s| s.kv.delete(key))
    }

    /// Seal the handle and take what was staged.
    pub(crate) fn seal_and_take(&self) -> StagedKv {
        self.shared.seal_and_take().0
    }
}

impl fmt::Debug for EffectsHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (writes, deletes, _) = self.shared.counts();
        f.debug_struct("EffectsHandle")
            .field("writes", &writes)
            .field("deletes", &deletes)
            .finish()
    }
}

/// Effects of a [`TerminalHook`](crate::TerminalHook): KV writes and
/// deletes plus follow-up enqueues, applied in the transaction that
/// acknowledges the run's notification job. Validated as for
/// [`EffectsHandle`]; sealed once the hook returns.
#[derive(Clone, Default)]
pub struct TerminalEffects {
    shared: Shared,
    /// The runtime's queue, which no follow-up enqueue may target; `None`
    /// for a detached handle.
    own_queue: Option<Arc<str>>,
}

impl TerminalEffects {
    /// A handle bound to no notification, for tests of hooks. It knows no
    /// runtime, so it refuses reserved headers but no queue.
    pub fn detached() -> Self {
        Self::default()
    }

    /// The handle of a notification of the runtime on `own_queue`.
    pub(crate) fn for_queue(own_queue: &str) -> Self {
        Self {
            shared: Shared::default(),
            own_queue: Some(Arc::from(own_queue)),
        }
    }

    /// Stage a follow-up enqueue, on any queue of the runtime's
    /// [`taquba::Queue`] but the runtime's own.
    ///
    /// # Errors
    /// [`Error::ReservedHeaderInSubmit`] naming a header under
    /// [`RESERVED_HEADER_PREFIX`](crate::RESERVED_HEADER_PREFIX) (such a
    /// job would pass for a step or a notification of a runtime);
    /// [`Error::Queue`] with [`taquba::Error::InvalidQueueName`] naming the
    /// runtime's own queue when the request targets it (the runtime's
    /// worker takes every job there for one of its own);
    /// [`Error::EffectsSealed`] once the hook has returned. Both refusals
    /// are permanent: a hook that returns them with `?` dead-letters the
    /// notification with the message, and nothing it staged commits.
    pub fn enqueue(&self, request: EnqueueRequest) -> Result<()> {
        self.shared.stage(|s| {
            check_enqueue(&request, self.own_queue.as_deref())?;
            s.enqueues.push(request);
            Ok(())
        })
    }

    /// Stage a KV write; errors as [`EffectsHandle::put`].
    pub fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        let (key, value) = (key.into(), value.into());
        self.shared.stage(|s| s.kv.put(key, value))
    }

    /// Stage a KV delete; errors as [`EffectsHandle::delete`].
    pub fn delete(&self, key: impl Into<Vec<u8>>) -> Result<()> {
        let key = key.into();
        self.shared.stage(|s| s.kv.delete(key))
    }

    /// Seal the handle and take what was staged.
    pub(crate) fn seal_and_take(&self) -> (StagedKv, Vec<EnqueueRequest>) {
        self.shared.seal_and_take()
    }
}

impl fmt::Debug for TerminalEffects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (writes, deletes, enqueues) = self.shared.counts();
        f.debug_struct("TerminalEffects")
            .field("writes", &writes)
            .field("deletes", &deletes)
            .field("enqueues", &enqueues)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_validates_each_effect() {
        let h = EffectsHandle::detached();
        h.put("app/a", "1").unwrap();
        h.put("app/a", "2").unwrap();
        assert!(
            matches!(h.put("workflow/x", "v"), Err(Error::ReservedKvKey(k)) if k == "workflow/x")
        );
        assert!(matches!(h.delete("app/a"), Err(Error::ConflictingKvEffect(k)) if k == "app/a"));
        h.delete("app/b").unwrap();
        assert!(matches!(
            h.put("app/b", "v"),
            Err(Error::ConflictingKvEffect(_))
        ));
        let big = vec![0u8; MAX_KV_VALUE_SIZE + 1];
        let err = h.put("app/big", big).unwrap_err();
        assert!(
            err.to_string()
                .contains(&(MAX_KV_VALUE_SIZE + 1).to_string()),
            "{err}"
        );
        let staged = h.seal_and_take();
        assert_eq!(staged.writes.get(b"app/a".as_slice()), Some(&b"2".to_vec()));
        assert!(staged.deletes.contains(b"app/b".as_slice()));
        assert!(matches!(h.put("app/c", "v"), Err(Error::EffectsSealed)));
        assert!(matches!(
            h.clone().delete("app/c"),
            Err(Error::EffectsSealed)
        ));
    }

    #[test]
    fn enqueues_are_checked_for_reserved_headers_and_the_runtimes_queue() {
        let with = |queue: &str, headers: &[&str]| EnqueueRequest {
            queue: queue.into(),
            payload: vec![],
            options: taquba::EnqueueOptions::default().headers(
                headers
                    .iter()
                    .map(|h| (h.to_string(), "v".to_string()))
                    .collect(),
            ),
        };
        let err = check_enqueue(&with("q", &["workflow.z", "a", "workflow.b"]), None)
            .expect_err("reserved");
        assert!(
            matches!(&err, Error::ReservedHeaderInSubmit(h) if h == "workflow.b"),
            "{err:?}"
        );
        let err = check_enqueue(&with("steps", &["a"]), Some("steps")).expect_err("own");
        assert!(err.to_string().contains("`steps`"), "{err}");
        assert!(err.is_permanent());
        check_enqueue(
            &with("steps", &["workflowx", "a.workflow.b"]),
            Some("other"),
        )
        .expect("neither");

        let bound = TerminalEffects::for_queue("steps");
        assert!(bound.enqueue(with("steps", &[])).is_err());
        bound.enqueue(with("other", &[])).expect("another queue");
        TerminalEffects::detached()
            .enqueue(with("steps", &[]))
            .expect("a detached handle knows no runtime queue");
        assert_eq!(bound.seal_and_take().1.len(), 1, "only the accepted one");
    }

    #[test]
    fn terminal_effects_collect_enqueues() {
        let t = TerminalEffects::detached();
        t.enqueue(EnqueueRequest {
            queue: "q".into(),
            payload: vec![1],
            options: Default::default(),
        })
        .unwrap();
        t.put("k", "v").unwrap();
        let (kv, enqueues) = t.seal_and_take();
        assert_eq!(enqueues.len(), 1);
        assert_eq!(kv.writes.len(), 1);
        assert!(matches!(t.delete("k"), Err(Error::EffectsSealed)));
    }
}
