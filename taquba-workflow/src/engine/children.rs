//! Child workflows, the engine's side (the types and records are
//! `coordination::children`):
//!
//! - start: the children a step staged become effects of the step's
//!   settlement ([`RuntimeCore::child_start_effects`]): each child's
//!   submission (run record naming its parent, step 0, pointer), its link
//!   under the parent and its active marker, so a child exists exactly
//!   when the parent's step settled;
//! - end: every terminating settlement of a child ([`child_end_effects`],
//!   from `terminate_effects`) records the child's end and a wake marker
//!   in its own transaction, and removes its active marker;
//! - wake: once the termination commits, the worker's wake task
//!   ([`pump_child_wakes_until`], see
//!   [`child_wakes`](crate::coordination::child_wakes)) sends the end as a
//!   signal under the child's correlation key (waking the parent's waiting
//!   step, or buffering for its wait), then removes the marker; the
//!   maintenance round ([`RuntimeCore::maintain_children`]) sends every
//!   marker left (a crash between the send and the removal sends it
//!   again). A step
//!   whose wait on a child timed out reads the end record
//!   ([`RuntimeCore::child_wait_signal`]), so a wake that lost the race to
//!   the timeout loses no end; the step that got the end deletes the end
//!   record with its settlement;
//! - cancel: cancelling a parent cancels its active children (and theirs)
//!   and waits for their ends before reaching the parent's own step
//!   ([`RuntimeCore::cancel_children`]); the maintenance round cancels any
//!   active child whose parent asked for cancellation or ended (a crash in
//!   the cascade, a parent that ended without waiting).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use futures_util::TryStreamExt;
use taquba::{JobRecord, QueueView, SettlementEffects};
use tracing::{debug, warn};

use crate::coordination::children::{
    ChildStart, DurableChildEnd, DurableChildLink, MAX_CHILD_RESULT_LEN, child_correlation_key,
    child_of_correlation_key,
};
use crate::engine::RuntimeCore;
use crate::engine::cancel::CancelRequest;
use crate::engine::submit::SubmittedAs;
use crate::error::{Error, Result};
use crate::model::RunOutcome;
use crate::run::compose::merge_effects;
use crate::store::durable::{self, DurableRunRecord, DurableStatus, DurableTermination};
use crate::store::keys::{
    CHILD_ACTIVE_PREFIX, CHILD_WAKES_PREFIX, HEADER_SIGNAL_WAIT, RunId, child_active_kv_key,
    child_end_kv_key, child_link_kv_key, child_links_kv_prefix, child_wake_kv_key, run_kv_key,
    sha256, signal_buffer_kv_key,
};

/// Wake markers and active markers one maintenance round looks at.
const MAINTENANCE_PAGE: usize = 256;
/// The orphan look (active children of cancelled or ended parents) runs
/// every this many maintenance rounds.
const ORPHAN_LOOK_EVERY: u64 = 4;
/// The most children [`list_children`] reads for a description.
pub(crate) const MAX_LISTED_CHILDREN: usize = 1000;

/// The effects a child's termination adds: its end record, the wake
/// marker naming its parent, the removal of its active marker. Nothing for
/// a run that is no child.
pub(crate) fn child_end_effects(
    mut effects: SettlementEffects,
    outcome: &RunOutcome,
    termination: &DurableTermination,
) -> SettlementEffects {
    let Some(parent) = &termination.parent else {
        return effects;
    };
    let child = &outcome.run_id;
    let (result, error) = match &outcome.result {
        Some(result) if result.len() > MAX_CHILD_RESULT_LEN => (
            None,
            Some(format!(
                "child run `{child}` succeeded with a result of {} bytes, over the {MAX_CHILD_RESULT_LEN} a child end carries; read it with WorkflowView::outcome",
                result.len()
            )),
        ),
        Some(result) if termination.status == DurableStatus::Succeeded => {
            (Some(serde_bytes::ByteBuf::from(result.clone())), None)
        }
        _ => (None, termination.error.clone()),
    };
    let end = DurableChildEnd {
        run_id: child.clone(),
        parent: parent.clone(),
        status: termination.status,
        result,
        error,
        error_kind: termination.error_kind,
    };
    effects = effects
        .kv_put(child_end_kv_key(child), durable::encode(&end))
        .kv_put(child_wake_kv_key(child), parent.as_bytes().to_vec())
        .kv_delete(child_active_kv_key(child));
    effects
}

/// The effects a requeue of the dead-lettered child `child` of `parent`
/// adds: its active marker again, so the maintenance round cancels it
/// should its parent be cancelled or end. Nothing for a run that is no
/// child.
pub(crate) fn child_resumed_effects(
    effects: SettlementEffects,
    child: &RunId,
    parent: Option<&RunId>,
) -> SettlementEffects {
    match parent {
        Some(parent) => effects.kv_put(child_active_kv_key(child), parent.as_bytes().to_vec()),
        None => effects,
    }
}

/// The children of `parent` linked in the store, in id order, at most
/// [`MAX_LISTED_CHILDREN`].
pub(crate) async fn list_children(view: &QueueView, parent: &RunId) -> Result<Vec<RunId>> {
    let prefix = child_links_kv_prefix(parent);
    let mut entries = std::pin::pin!(view.kv_entries(&prefix, .., MAINTENANCE_PAGE));
    let mut children = Vec::new();
    while let Some((key, _)) = entries.try_next().await? {
        if let Some(child) = key
            .strip_prefix(prefix.as_slice())
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| RunId::new(id).ok())
        {
            children.push(child);
        }
        if children.len() >= MAX_LISTED_CHILDREN {
            break;
        }
    }
    Ok(children)
}

/// The keys the retention sweep removes with the expired parent `parent`:
/// its links to its children and, for each child that is no longer
/// active, the child's end record and an end buffered for a wait the
/// parent never made (an active child's end is its own termination's, kept
/// for a later run of the parent under its id).
///
/// # Errors
/// Storage errors.
pub(crate) async fn expired_parent_keys(view: &QueueView, parent: &RunId) -> Result<Vec<Vec<u8>>> {
    let prefix = child_links_kv_prefix(parent);
    let mut entries = std::pin::pin!(view.kv_entries(&prefix, .., MAINTENANCE_PAGE));
    let mut keys = Vec::new();
    while let Some((key, _)) = entries.try_next().await? {
        let child = key
            .strip_prefix(prefix.as_slice())
            .and_then(|id| std::str::from_utf8(id).ok())
            .and_then(|id| RunId::new(id).ok());
        if let Some(child) = child
            && view.kv_get(&run_kv_key(&child)).await?.is_none()
        {
            keys.push(child_end_kv_key(&child));
            keys.push(signal_buffer_kv_key(&child_correlation_key(&child)));
        }
        keys.push(key.to_vec());
    }
    Ok(keys)
}

impl RuntimeCore {
    /// The effects that start the children `starts` of `parent` in the
    /// settlement of the parent's step. A child that is active as a child
    /// of `parent` is not started again (a key started by an earlier step
    /// of the run); one that ended is started anew, as a plain submission
    /// of an ended run id is (a key started again after its child ended,
    /// or by a new run of the parent under its id), its earlier end
    /// forgotten. A redelivered step never finds its own child: the child
    /// exists only once the step settled.
    ///
    /// # Errors
    /// [`Error::ChildRunIdTaken`] when the derived id names a run that is
    /// not a child of `parent`; storage and decoding errors.
    pub(crate) async fn child_start_effects(
        &self,
        parent: &RunId,
        starts: Vec<ChildStart>,
    ) -> Result<SettlementEffects> {
        let mut all = SettlementEffects::default();
        for start in starts {
            let child = &start.run_id;
            let (active, existing_parent) = match self.view.run_record(child).await? {
                Some(record) => (true, Some(record.parent)),
                None => (
                    false,
                    self.view.terminal_record(child).await?.map(|t| t.parent),
                ),
            };
            match existing_parent {
                Some(Some(of)) if of == *parent && active => {
                    debug!(parent = %parent, child = %child, "child active already");
                    continue;
                }
                // Ended: started anew.
                Some(Some(of)) if of == *parent => {}
                Some(_) => {
                    return Err(Error::ChildRunIdTaken {
                        parent: parent.clone(),
                        child: child.clone(),
                    });
                }
                None => {}
            }
            let input_hash = sha256(&start.input).to_vec();
            let (mut effects, _job_id, _) = self.submission_effects(
                child,
                start.input,
                &input_hash,
                &start.options,
                SubmittedAs::Plain,
                &SettlementEffects::default(),
            )?;
            // The run record names its parent.
            let run_key = run_kv_key(child);
            let record = effects
                .kv_writes
                .get(&run_key)
                .ok_or_else(|| Error::InconsistentRunState(child.clone()))?;
            let mut record: DurableRunRecord = durable::decode(record)?;
            record.parent = Some(parent.clone());
            effects.kv_writes.insert(run_key, durable::encode(&record));
            let link = DurableChildLink {
                key: start.key,
                started_at_ms: self.now_ms(),
            };
            effects = effects
                .kv_put(child_link_kv_key(parent, child), durable::encode(&link))
                .kv_put(child_active_kv_key(child), parent.as_bytes().to_vec())
                // An end of an earlier run under the id is not this one's.
                .kv_delete(child_end_kv_key(child))
                .kv_delete(child_wake_kv_key(child))
                .kv_delete(signal_buffer_kv_key(&child_correlation_key(child)));
            merge_effects(&mut all, effects);
            debug!(parent = %parent, child = %child, "child staged for start");
        }
        Ok(all)
    }

    /// The signal of a step that waited on a child's correlation key, and
    /// the child state its settlement deletes: `signal` as resolved when
    /// the wait was woken, else (the wait timed out, or its wake was lost
    /// to the timeout) the child's end record when the child has ended. The
    /// end record is deleted with the step's settlement (its end is the
    /// step's now), and so is a buffered end the timeout left. Any other
    /// step keeps `signal` and deletes nothing.
    ///
    /// # Errors
    /// Storage errors.
    pub(crate) async fn child_wait_signal(
        &self,
        job: &JobRecord,
        signal: Option<Vec<u8>>,
    ) -> Result<(Option<Vec<u8>>, Vec<Vec<u8>>)> {
        let Some(child) = job
            .headers
            .get(HEADER_SIGNAL_WAIT)
            .and_then(|key| child_of_correlation_key(key))
        else {
            return Ok((signal, Vec::new()));
        };
        let end_key = child_end_kv_key(&child);
        if signal.is_some() {
            return Ok((signal, vec![end_key]));
        }
        let end = self.queue.view().kv_get(&end_key).await?;
        Ok(match end {
            Some(end) => (
                Some(end.to_vec()),
                vec![
                    end_key,
                    signal_buffer_kv_key(&child_correlation_key(&child)),
                ],
            ),
            None => (None, Vec::new()),
        })
    }

    /// Cancel the active children of `parent` (and, through their own
    /// cancellation, theirs), then wait until each has ended: what a
    /// cancellation of `parent` does before it reaches the parent's own
    /// step, so the parent ends after its children. Dropped at any await,
    /// the requests already recorded stand and the maintenance round
    /// completes the rest.
    ///
    /// # Errors
    /// Storage errors of a child's cancellation or wait.
    pub(crate) async fn cancel_children(&self, parent: &RunId) -> Result<()> {
        let children = list_children(self.queue.view(), parent).await?;
        let mut cancelled = Vec::new();
        for child in children {
            let request = CancelRequest {
                reason: Some(format!("parent run `{parent}` was cancelled")),
                ..CancelRequest::default()
            };
            if Box::pin(self.cancel_as(&child, request)).await?.is_some() {
                cancelled.push(child);
            }
        }
        for child in cancelled {
            self.wait_run(&child).await?;
            debug!(parent = %parent, child = %child, "child ended before its parent's cancellation");
        }
        Ok(())
    }

    /// The children part of a maintenance round: send the ends whose
    /// parents are still to be woken, and every few rounds cancel the
    /// active children whose parent was cancelled or ended. Errors are
    /// logged; the next round tries again.
    pub(crate) async fn maintain_children(&self) {
        if let Err(err) = self.send_child_wakes().await {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "waking parents of ended children failed: {err}");
        }
        let round = self.maintenance_rounds.load(Ordering::Relaxed);
        if round.is_multiple_of(ORPHAN_LOOK_EVERY)
            && let Err(err) = self.cancel_orphans().await
        {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "cancelling children of ended parents failed: {err}");
        }
    }

    /// Send each marked child end to its parent as a signal under the
    /// child's correlation key, then remove the marker (compare-and-delete,
    /// so a marker rewritten meanwhile stays). A parent that is no longer
    /// active gets nothing.
    async fn send_child_wakes(&self) -> Result<()> {
        let page = self
            .queue
            .view()
            .kv_scan(CHILD_WAKES_PREFIX.as_bytes(), .., MAINTENANCE_PAGE)
            .await?;
        for (key, _) in page.entries {
            let Some(child) = run_id_after(&key, CHILD_WAKES_PREFIX) else {
                continue;
            };
            self.wake_parent_of(&child).await?;
        }
        Ok(())
    }

    /// Send the end of `child` to the parent its wake marker names, then
    /// remove the marker: at once for a termination this runtime committed
    /// (see [`child_wakes`](crate::coordination::child_wakes)), or from the
    /// maintenance round. Nothing when the marker is gone (sent already),
    /// nor while another task of this runtime sends it.
    pub(crate) async fn wake_parent_of(&self, child: &RunId) -> Result<()> {
        let Some(_sending) = self.commits.child_wakes().begin_send(child) else {
            return Ok(());
        };
        // Read under the sending: a task that sent it meanwhile removed it.
        let key = child_wake_kv_key(child);
        let Some(value) = self.queue.view().kv_get(&key).await? else {
            return Ok(());
        };
        let (key, value) = (key.as_slice(), value.as_ref());
        let parent = std::str::from_utf8(value)
            .ok()
            .and_then(|id| RunId::new(id).ok());
        let active_parent = match &parent {
            Some(parent) => self.view.run_record(parent).await?.is_some(),
            None => false,
        };
        if active_parent
            && let Some(end) = self.queue.view().kv_get(&child_end_kv_key(child)).await?
        {
            let outcome = self
                .signal(&child_correlation_key(child), end.to_vec())
                .await?;
            debug!(child = %child, ?outcome, "child end sent to its parent");
        }
        // A parent whose retention removed it (no run, no terminal record)
        // can never read the end: it goes with the marker. A parent that
        // ended but is still recorded may be requeued and read it.
        let forgotten = !active_parent
            && match &parent {
                Some(parent) => self.view.terminal_record(parent).await?.is_none(),
                None => true,
            };
        let mut effects = SettlementEffects::default().kv_delete(key.to_vec());
        if forgotten {
            effects = effects.kv_delete(child_end_kv_key(child));
        }
        self.commits
            .compare_commit(key, Some(value), effects)
            .await?;
        Ok(())
    }

    /// Cancel every active child whose parent asked for cancellation or is
    /// no longer active.
    async fn cancel_orphans(&self) -> Result<()> {
        let page = self
            .queue
            .view()
            .kv_scan(CHILD_ACTIVE_PREFIX.as_bytes(), .., MAINTENANCE_PAGE)
            .await?;
        let mut parents: HashMap<RunId, Option<bool>> = HashMap::new();
        for (key, value) in page.entries {
            let Some(child) = run_id_after(&key, CHILD_ACTIVE_PREFIX) else {
                continue;
            };
            let Some(parent) = std::str::from_utf8(&value)
                .ok()
                .and_then(|id| RunId::new(id).ok())
            else {
                continue;
            };
            let state = match parents.get(&parent) {
                Some(state) => *state,
                None => {
                    let state = self
                        .view
                        .run_record(&parent)
                        .await?
                        .map(|record| record.cancel_requested);
                    parents.insert(parent.clone(), state);
                    state
                }
            };
            let reason = match state {
                Some(false) => continue,
                Some(true) => format!("parent run `{parent}` was cancelled"),
                None => format!("parent run `{parent}` ended"),
            };
            let request = CancelRequest {
                reason: Some(reason),
                ..CancelRequest::default()
            };
            if Box::pin(self.cancel_as(&child, request)).await?.is_some() {
                debug!(parent = %parent, child = %child, "cancelled a child of a cancelled or ended parent");
            }
        }
        Ok(())
    }
}

/// The run id after `prefix` in a KV key.
fn run_id_after(key: &[u8], prefix: &str) -> Option<RunId> {
    key.strip_prefix(prefix.as_bytes())
        .and_then(|id| std::str::from_utf8(id).ok())
        .and_then(|id| RunId::new(id).ok())
}

/// Wake the parents of the children whose termination this runtime
/// committed, as they come (see
/// [`child_wakes`](crate::coordination::child_wakes)), until `stop`.
pub(crate) async fn pump_child_wakes_until(
    core: std::sync::Arc<RuntimeCore>,
    stop: tokio_util::sync::CancellationToken,
) {
    let wakes = core.commits.child_wakes().clone();
    loop {
        let notified = wakes.notified();
        for child in wakes.take_due() {
            if let Err(err) = core.wake_parent_of(&child).await {
                core.note_error(&err);
                warn!(child = %child, "waking the parent of an ended child failed (the maintenance round sends it): {err}");
            }
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = notified => {}
        }
    }
}
