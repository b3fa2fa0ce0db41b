//! Child workflows, the parts outside the engine: a child's derived run id
//! ([`child_run_id`]) and the correlation key its end is signalled under
//! ([`child_correlation_key`]), the staging of child starts on a step's
//! [`Delivery`](crate::Delivery) ([`ChildrenHandle`]), the end a parent's
//! step reads ([`ChildEnd`]) and the durable records of the child links
//! and ends. The engine's side (the child's submission in the parent's
//! settlement, its end in its own termination, the wake, the cancel
//! cascade) is `engine::children`.
//!
//! A step starts a child by staging it: the child's run record, its step 0
//! and its link to the parent commit in the transaction that settles the
//! parent's step, so the child exists exactly when that step settled, and
//! a redelivered step stages it again under the same derived id. The
//! parent waits for the child with the durable signal wait on
//! [`child_correlation_key`]; the child's terminating settlement records
//! its [`ChildEnd`] in its own transaction, and the parent's waiting step
//! is woken with it as its signal.

use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use crate::error::{Error, Result};
use crate::model::{RunOptions, StepErrorKind, TerminalStatus};
use crate::store::durable::{DurableErrorKind, DurableStatus};
use crate::store::keys::{MAX_RUN_ID_LEN, RunId};

/// What separates the parent's run id from the child's key in a child's
/// run id: `{parent}--{key}`.
pub const CHILD_ID_SEPARATOR: &str = "--";
/// The prefix of the correlation key a child's end is signalled under:
/// `workflow.child:{child_run_id}`. Signals sent by hand under such a key
/// are read as child ends by the waiting step.
pub const CHILD_CORRELATION_PREFIX: &str = "workflow.child:";
/// The most children one step may start.
pub const MAX_CHILDREN_PER_STEP: usize = 100;
/// The largest child result a [`ChildEnd`] carries, in bytes (192 KiB,
/// within the queue's 256 KiB value limit beside the end's error). A
/// child that succeeds with a larger result reaches its parent as
/// [`TerminalStatus::Succeeded`] with no result and an error saying so;
/// read it with [`WorkflowView::outcome`](crate::WorkflowView::outcome).
pub const MAX_CHILD_RESULT_LEN: usize = 192 * 1024;

/// The run id of the child of `parent` started under `key`:
/// `{parent}--{key}`. The same for every start of the key by the parent,
/// so a redelivered step that starts it again names the same run.
///
/// # Errors
/// [`Error::InvalidChildKey`] naming the key when it is empty, holds a
/// byte outside `[A-Za-z0-9_-]`, or makes the id longer than
/// [`MAX_RUN_ID_LEN`] bytes.
pub fn child_run_id(parent: &RunId, key: &str) -> Result<RunId> {
    let invalid = |reason: String| Error::InvalidChildKey {
        parent: parent.clone(),
        key: key.to_string(),
        reason,
    };
    if key.is_empty() {
        return Err(invalid("a child key must not be empty".into()));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            "a child key may contain only ASCII letters, digits, '_' and '-'".into(),
        ));
    }
    let len = parent.len() + CHILD_ID_SEPARATOR.len() + key.len();
    if len > MAX_RUN_ID_LEN {
        return Err(invalid(format!(
            "the child run id `{parent}{CHILD_ID_SEPARATOR}{key}` would be {len} bytes, over the {MAX_RUN_ID_LEN} a run id may have"
        )));
    }
    RunId::new(format!("{parent}{CHILD_ID_SEPARATOR}{key}"))
}

/// The correlation key the end of the child run `child` is signalled
/// under: a step that waits for the child continues with
/// [`Trigger::OnSignal`](crate::Trigger::OnSignal) on it
/// ([`StepOutcome::continue_on_child`](crate::StepOutcome::continue_on_child)).
pub fn child_correlation_key(child: &RunId) -> String {
    format!("{CHILD_CORRELATION_PREFIX}{child}")
}

impl crate::model::StepOutcome {
    /// Continue with `payload` when the child run `child` ends, or after
    /// `timeout`: a [`Trigger::OnSignal`](crate::Trigger::OnSignal) on
    /// [`child_correlation_key`]. The next step's
    /// [`signal`](crate::Step::signal) is the child's end
    /// ([`ChildEnd::of_signal`]), `None` when the child had not ended
    /// within `timeout` (it keeps running; wait again to get its end).
    pub fn continue_on_child(
        payload: Vec<u8>,
        child: &RunId,
        timeout: std::time::Duration,
    ) -> Self {
        Self::continue_on_signal(payload, child_correlation_key(child), timeout)
    }
}

/// The child run a correlation key names, when it is a child's key.
pub(crate) fn child_of_correlation_key(key: &str) -> Option<RunId> {
    key.strip_prefix(CHILD_CORRELATION_PREFIX)
        .and_then(|id| RunId::new(id).ok())
}

/// How a child run ended, as its parent's waiting step sees it: the signal
/// of a step after a wait on [`child_correlation_key`], read with
/// [`ChildEnd::of_signal`] (a `#[workflow]` step reads it typed with
/// [`StepContext::child_result`](crate::workflows::StepContext::child_result)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChildEnd {
    /// The child run.
    pub run_id: RunId,
    /// How it ended.
    pub status: TerminalStatus,
    /// Its result bytes when it succeeded (`None` for a result over
    /// [`MAX_CHILD_RESULT_LEN`], which `error` then says).
    pub result: Option<Vec<u8>>,
    /// Its error, or the reason of a runner-issued cancel; `None` on
    /// success and for an external cancellation.
    pub error: Option<String>,
    /// For a failure from a step error or a `Fail` verdict, its kind.
    pub error_kind: Option<StepErrorKind>,
}

impl ChildEnd {
    /// The child end a step's signal carries: `Ok(None)` for no signal
    /// (the wait timed out: the child had not ended).
    ///
    /// # Errors
    /// [`Error::Deserialization`] when the signal is not a child end (a
    /// signal sent by hand under the child's correlation key).
    pub fn of_signal(signal: Option<&[u8]>) -> Result<Option<Self>> {
        signal
            .map(|bytes| crate::store::durable::decode::<DurableChildEnd>(bytes).map(Into::into))
            .transpose()
    }
}

/// A child's end as stored (its end record, and the wake signal's
/// payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableChildEnd {
    pub(crate) run_id: RunId,
    pub(crate) parent: RunId,
    pub(crate) status: DurableStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<ByteBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error_kind: Option<DurableErrorKind>,
}

impl From<DurableChildEnd> for ChildEnd {
    fn from(end: DurableChildEnd) -> Self {
        Self {
            run_id: end.run_id,
            status: end.status.into(),
            result: end.result.map(ByteBuf::into_vec),
            error: end.error,
            error_kind: end.error_kind.map(Into::into),
        }
    }
}

/// The link of a child to its parent, under the parent's prefix: written
/// with the child's submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableChildLink {
    /// The key the parent started it under.
    pub(crate) key: String,
    /// When it was started, ms since the UNIX epoch (runtime clock).
    pub(crate) started_at_ms: u64,
}

/// A child start staged by a step.
#[derive(Debug, Clone)]
pub(crate) struct ChildStart {
    pub(crate) run_id: RunId,
    pub(crate) key: String,
    pub(crate) input: Vec<u8>,
    pub(crate) options: RunOptions,
}

#[derive(Debug, Default)]
struct Staging {
    starts: Vec<ChildStart>,
    sealed: bool,
}

/// The child runs one step starts, committed in the settlement of the
/// outcome the runner returns, like [`EffectsHandle`](crate::EffectsHandle):
/// nothing is started when the runner returns a
/// [`StepError`](crate::StepError) or an external cancellation overrides
/// the outcome. A retried step stages its children again under the same
/// derived ids; a child whose run already exists (started by an earlier
/// step of this run under the same key) is not started again.
///
/// Cheap to clone; clones stage into the same set.
#[derive(Clone, Default)]
pub struct ChildrenHandle {
    parent: Option<RunId>,
    staging: Arc<Mutex<Staging>>,
}

impl ChildrenHandle {
    /// A handle bound to no step, staging children of `parent`: starts are
    /// validated and staged, and dropped with the handle. For tests of
    /// runners.
    pub fn detached(parent: RunId) -> Self {
        Self::for_run(parent)
    }

    pub(crate) fn for_run(parent: RunId) -> Self {
        Self {
            parent: Some(parent),
            staging: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Staging> {
        // Every mutation is a single push or flag set.
        self.staging
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Stage the start of a child run under `key` with `input` (its step
    /// 0's payload) and `options`; its run id is
    /// [`child_run_id`]`(parent, key)`, returned. Staging the same key
    /// twice in one step with the same input and options is one start.
    ///
    /// # Errors
    /// [`Error::InvalidChildKey`] for a key that gives no valid id (also
    /// for a key staged twice with another input);
    /// [`Error::ReservedHeaderInSubmit`] and [`Error::InvalidRunOptions`]
    /// for options a submission could not carry;
    /// [`Error::InvalidRunOptions`] past [`MAX_CHILDREN_PER_STEP`], and for
    /// a [`RunOptions::concurrency_key`] (a child takes none);
    /// [`Error::EffectsSealed`] once the step has returned.
    pub fn start(&self, key: &str, input: Vec<u8>, options: RunOptions) -> Result<RunId> {
        let parent = self.parent.clone().ok_or(Error::EffectsSealed)?;
        let run_id = child_run_id(&parent, key)?;
        crate::engine::RuntimeCore::check_submission(&options, &Default::default())?;
        // A key's admission reads and commits under the key's lock; a
        // child commits inside its parent's settlement instead.
        crate::coordination::keys::refuse_key(
            &options,
            &format!("the child `{run_id}`"),
            "child runs",
        )?;
        let mut staging = self.lock();
        if staging.sealed {
            return Err(Error::EffectsSealed);
        }
        if let Some(same) = staging.starts.iter().find(|s| s.key == key) {
            if same.input == input && same.options == options {
                return Ok(run_id);
            }
            return Err(Error::InvalidChildKey {
                parent,
                key: key.to_string(),
                reason: "the key was staged already in this step with another input".into(),
            });
        }
        if staging.starts.len() >= MAX_CHILDREN_PER_STEP {
            return Err(Error::InvalidRunOptions(format!(
                "a step may start at most {MAX_CHILDREN_PER_STEP} children; child key {key:?} is one more"
            )));
        }
        staging.starts.push(ChildStart {
            run_id: run_id.clone(),
            key: key.to_string(),
            input,
            options,
        });
        Ok(run_id)
    }

    /// Seal the handle and take what was staged.
    pub(crate) fn seal_and_take(&self) -> Vec<ChildStart> {
        let mut staging = self.lock();
        staging.sealed = true;
        std::mem::take(&mut staging.starts)
    }
}

impl std::fmt::Debug for ChildrenHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildrenHandle")
            .field("parent", &self.parent)
            .field("staged", &self.lock().starts.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_id_joins_parent_and_key_and_refuses_a_bad_key_by_name() {
        let parent = RunId::new("order-1").unwrap();
        assert_eq!(
            child_run_id(&parent, "pay").unwrap().as_str(),
            "order-1--pay"
        );
        let err = child_run_id(&parent, "a/b").unwrap_err().to_string();
        assert!(err.contains("\"a/b\"") && err.contains("order-1"), "{err}");
        assert!(child_run_id(&parent, "").is_err());
        let long = "k".repeat(MAX_RUN_ID_LEN);
        let err = child_run_id(&parent, &long).unwrap_err().to_string();
        assert!(err.contains("over the 128"), "{err}");
        let key = child_correlation_key(&RunId::new("order-1--pay").unwrap());
        assert_eq!(
            child_of_correlation_key(&key).unwrap().as_str(),
            "order-1--pay"
        );
        assert_eq!(child_of_correlation_key("other"), None);
    }

    #[test]
    fn a_key_staged_twice_is_one_start_or_refused() {
        let handle = ChildrenHandle::detached(RunId::new("p").unwrap());
        handle
            .start("a", b"x".to_vec(), RunOptions::default())
            .unwrap();
        handle
            .start("a", b"x".to_vec(), RunOptions::default())
            .unwrap();
        assert!(
            handle
                .start("a", b"y".to_vec(), RunOptions::default())
                .is_err()
        );
        assert_eq!(handle.seal_and_take().len(), 1);
        assert!(matches!(
            handle.start("b", vec![], RunOptions::default()),
            Err(Error::EffectsSealed)
        ));
    }
}
