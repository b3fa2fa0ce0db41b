//! External cancellation of a run: the durable request on the run record,
//! then the current step reached wherever it is (waiting, claimed here or
//! elsewhere, dead).

use std::time::Duration;

use taquba::{CancelOutcome, JobRecord, JobStatus, SettlementEffects};

use crate::coordination::members::Membership;
use crate::engine::RuntimeCore;
use crate::error::Result;
use crate::history::record::DurableAttemptOutcome;
use crate::model::TerminalStatus;
use crate::run::compose::{is_empty, merge_effects};
use crate::run::inflight::CancelVerdict;
use crate::store::durable::{self, DurableCurrentStep, DurableRunRecord};
use crate::store::keys::{RunId, run_kv_key};

/// A cancellation request: its reason, and effects that commit in the
/// transaction recording it (an inbox command's record).
#[derive(Debug, Default)]
pub(crate) struct CancelRequest {
    pub(crate) reason: Option<String>,
    /// Committed with the request; alone when a request was recorded
    /// before; not at all when the run is not active.
    pub(crate) with_request: SettlementEffects,
}

impl RuntimeCore {
    /// Request cancellation of `run_id`; see
    /// [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel).
    ///
    /// Of concurrent calls on one run, the one whose compare-and-set
    /// records the request is the one that can answer `true`; the others
    /// find the request recorded and answer `false`, though each still
    /// reaches the current step (the recording call may have failed after
    /// its write, and a later call completes its work).
    pub(crate) async fn cancel(&self, run_id: &RunId) -> Result<bool> {
        Ok(self
            .cancel_as(run_id, CancelRequest::default())
            .await?
            .unwrap_or(false))
    }

    /// [`cancel`](Self::cancel) with `request`: `None` when the run is not
    /// active (nothing was committed), else whether this call's request
    /// ends it cancelled.
    pub(crate) async fn cancel_as(
        &self,
        run_id: &RunId,
        request: CancelRequest,
    ) -> Result<Option<bool>> {
        let Some((record, recorded_here)) = self.record_cancel_request(run_id, request).await?
        else {
            return Ok(None);
        };
        // Its active children end first (child workflows).
        self.cancel_children(run_id).await?;
        let ends_cancelled = self.reach_current_step(run_id, &record).await?;
        Ok(Some(recorded_here && ends_cancelled))
    }

    /// Record the cancellation request (with its reason and the effects
    /// riding on it) on the run record, a compare-and-set so a concurrent
    /// termination that deletes the record is noticed: the record, and
    /// whether this call wrote the request; `None` for a run that is not
    /// active. A request recorded before commits `request.with_request`
    /// alone.
    async fn record_cancel_request(
        &self,
        run_id: &RunId,
        request: CancelRequest,
    ) -> Result<Option<(DurableRunRecord, bool)>> {
        let CancelRequest {
            reason,
            with_request,
        } = request;
        let run_key = run_kv_key(run_id);
        loop {
            let Some(bytes) = self.queue.view().kv_get(&run_key).await? else {
                return Ok(None);
            };
            let mut record: DurableRunRecord = durable::decode(&bytes)?;
            if record.cancel_requested {
                if !is_empty(&with_request) {
                    self.commits.commit(with_request).await?;
                }
                return Ok(Some((record, false)));
            }
            record.cancel_requested = true;
            record.cancel_reason.clone_from(&reason);
            let mut effects =
                SettlementEffects::default().kv_put(run_key.clone(), durable::encode(&record));
            merge_effects(&mut effects, with_request.clone());
            let write = self.run_records.begin_write(run_id);
            if self
                .commits
                .compare_commit_writing(&run_key, Some(&bytes), effects, write)
                .await?
                .is_some()
            {
                return Ok(Some((record, true)));
            }
        }
    }

    /// Apply the recorded request to the current step of `run_id` wherever
    /// it is; whether the run ends (or ended) `Cancelled`.
    async fn reach_current_step(&self, run_id: &RunId, record: &DurableRunRecord) -> Result<bool> {
        loop {
            let Some((pointer, job)) = self.view.current_job(run_id).await? else {
                // Terminated meanwhile: the request won only if the run
                // ended cancelled.
                return self.ended_cancelled(run_id).await;
            };
            match job.status {
                JobStatus::Pending | JobStatus::Scheduled => {
                    match self.cancel_removing(run_id, &pointer, &job, record).await? {
                        CancelOutcome::Removed => return Ok(true),
                        // Claimed, settled or removed by a concurrent
                        // cancellation meanwhile: look again.
                        CancelOutcome::Requested | CancelOutcome::NotFound => continue,
                    }
                }
                JobStatus::Claimed => {
                    match self.inflight.request_cancel(run_id) {
                        CancelVerdict::Requested => {
                            return self.note_delivered(run_id, record, &job.id).await;
                        }
                        CancelVerdict::NotInFlight => {
                            // Claimed but not running in this runtime: not
                            // registered yet (its record read sees the
                            // request), held by another runtime over the
                            // queue, whose runner may already have returned,
                            // or settled since the read. Fire the claim's
                            // token; only the step's settlement tells
                            // whether the holder honoured the request, so
                            // wait for it and look again.
                            match self.cancel_removing(run_id, &pointer, &job, record).await? {
                                // Re-queued since the read: removed with the
                                // run's termination.
                                CancelOutcome::Removed => return Ok(true),
                                CancelOutcome::Requested => {
                                    self.wait_for_settlement(&job.id).await?;
                                    continue;
                                }
                                CancelOutcome::NotFound => continue,
                            }
                        }
                        CancelVerdict::Settling(mut settled) => {
                            // The runner returned before the request: let its
                            // settlement finish, then apply the request to
                            // whatever step is current (or find the run
                            // terminated).
                            let _ = settled.wait_for(|done| *done).await;
                            continue;
                        }
                    };
                }
                JobStatus::Done | JobStatus::Dead => {
                    // The pointer moves with the ack, so a done job here is
                    // a read between two commits. A dead one was
                    // dead-lettered outside the worker (the reaper, crash
                    // recovery): the run failed there, whatever was
                    // requested since, and reconciliation records it so.
                    if job.status == JobStatus::Dead {
                        crate::engine::sweep::reconcile_job(self, &job).await?;
                        return self.ended_cancelled(run_id).await;
                    }
                    continue;
                }
            }
        }
    }

    /// Record on the run record of `run_id` that the request reached its
    /// step job `job_id` while the step ran in this process (its token
    /// fired), before the call answers `true`: should the step then outlive
    /// its lease on its last attempt, the reaper's dead letter of it came
    /// after the request, and its reconciliation ends the run `Cancelled`
    /// as the answer says, in any process that reconciles it. Whether the
    /// run ends (or ended) `Cancelled`: the run ended before the record was
    /// written when its record is gone (or is another run's, `requested`
    /// being this run's as the request left it), and then the answer is
    /// what it ended as.
    async fn note_delivered(
        &self,
        run_id: &RunId,
        requested: &DurableRunRecord,
        job_id: &str,
    ) -> Result<bool> {
        let run_key = run_kv_key(run_id);
        loop {
            let Some(bytes) = self.queue.view().kv_get(&run_key).await? else {
                return self.ended_cancelled(run_id).await;
            };
            let mut record: DurableRunRecord = durable::decode(&bytes)?;
            if record.execution != requested.execution {
                return self.ended_cancelled(run_id).await;
            }
            if record.cancel_delivered_to.as_deref() == Some(job_id) {
                return Ok(true);
            }
            record.cancel_delivered_to = Some(job_id.to_string());
            let effects =
                SettlementEffects::default().kv_put(run_key.clone(), durable::encode(&record));
            let write = self.run_records.begin_write(run_id);
            if self
                .commits
                .compare_commit_writing(&run_key, Some(&bytes), effects, write)
                .await?
                .is_some()
            {
                return Ok(true);
            }
        }
    }

    /// Cancel the step job `job` of `run_id` (which `pointer` names): when
    /// it is still waiting it is removed together with the run's
    /// `Cancelled` termination and the cleanup of a signal waiter the job
    /// registered; a claimed one gets its cancellation requested.
    async fn cancel_removing(
        &self,
        run_id: &RunId,
        pointer: &DurableCurrentStep,
        job: &JobRecord,
        record: &DurableRunRecord,
    ) -> Result<CancelOutcome> {
        let outcome = Self::detached_outcome(
            run_id,
            job,
            pointer.step_number,
            TerminalStatus::Cancelled,
            None,
        );
        let membership = Membership::from_headers(&job.headers)?;
        let termination = self.termination(&outcome, None, record, &job.id, membership.as_ref());
        let (mut effects, mut ending) =
            self.terminate_effects(&outcome, termination, membership.as_ref(), job, false);
        effects
            .kv_deletes
            .extend(crate::coordination::signal::waiter_cleanup(job));
        let reason = DurableAttemptOutcome::cancelled(record.cancel_reason.as_deref());
        self.record_detached(
            &mut effects,
            &mut ending.record,
            run_id,
            pointer,
            job,
            reason,
        );
        let (outcome, _) = self.commits.cancel_with(&job.id, effects, ending).await?;
        if outcome == CancelOutcome::Removed {
            self.forget_waiter_of(job).await;
        }
        Ok(outcome)
    }

    /// Wait until the claimed job `job_id` is done, dead or gone. The
    /// queue's completion wait reads the job with its payload, which fails
    /// on a record whose offloaded payload object is gone (a done or dead
    /// record left so by a crash in the queue's retention sweep): such a
    /// record is followed in its stored form instead, at the poll interval,
    /// until it is no longer claimed. Reads only, so dropping the wait
    /// leaves nothing behind.
    async fn wait_for_settlement(&self, job_id: &str) -> Result<()> {
        match self.queue.wait_for_completion(job_id).await {
            Ok(_) => Ok(()),
            Err(taquba::Error::PayloadMissing { .. }) => loop {
                match self.queue.view().job_record(job_id).await? {
                    Some(job) if job.status == JobStatus::Claimed => {
                        tokio::select! {
                            () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                            () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                        }
                    }
                    _ => return Ok(()),
                }
            },
            Err(err) => Err(err.into()),
        }
    }

    async fn ended_cancelled(&self, run_id: &RunId) -> Result<bool> {
        Ok(self
            .view
            .terminal_record(run_id)
            .await?
            .is_some_and(|t| t.status == durable::DurableStatus::Cancelled))
    }
}
