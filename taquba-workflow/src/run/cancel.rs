//! External cancellation of a run: the durable request on the run record,
//! then the current step reached wherever it is (waiting, claimed here or
//! elsewhere, dead).

use taquba::{CancelOutcome, JobRecord, JobStatus, SettlementEffects};

use crate::coordination::group::Membership;
use crate::error::Result;
use crate::history::record::DurableAttemptOutcome;
use crate::model::TerminalStatus;
use crate::run::compose::{is_empty, merge_effects};
use crate::run::core::RuntimeCore;
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
    pub(crate) async fn cancel(&self, run_id: &RunId) -> Result<bool> {
        Ok(self
            .cancel_as(run_id, CancelRequest::default())
            .await?
            .unwrap_or(false))
    }

    /// [`cancel`](Self::cancel) with `request`: `None` when the run is not
    /// active (nothing was committed), else whether it ends cancelled.
    pub(crate) async fn cancel_as(
        &self,
        run_id: &RunId,
        request: CancelRequest,
    ) -> Result<Option<bool>> {
        let run_key = run_kv_key(run_id);
        let CancelRequest {
            reason,
            with_request,
        } = request;
        // 1. Record the request durably (compare-and-set on the record, so
        //    a concurrent termination that deletes it is noticed).
        let record = loop {
            let Some(bytes) = self.queue.view().kv_get(&run_key).await? else {
                return Ok(None);
            };
            let mut record: DurableRunRecord = durable::decode(&bytes)?;
            if record.cancel_requested {
                if !is_empty(&with_request) {
                    self.queue.commit_effects(with_request).await?;
                }
                break record;
            }
            record.cancel_requested = true;
            record.cancel_reason.clone_from(&reason);
            let mut effects =
                SettlementEffects::default().kv_put(run_key.clone(), durable::encode(&record));
            merge_effects(&mut effects, with_request.clone());
            if self
                .queue
                .kv_compare_commit(&run_key, Some(&bytes), effects)
                .await?
                .is_some()
            {
                break record;
            }
        };
        // 2. Reach the current step wherever it is.
        loop {
            let Some((pointer, job)) = self.view.current_job(run_id).await? else {
                // Terminated meanwhile: the request won only if the run
                // ended cancelled.
                return self.ended_cancelled(run_id).await.map(Some);
            };
            match job.status {
                JobStatus::Pending | JobStatus::Scheduled => {
                    match self
                        .cancel_removing(run_id, &pointer, &job, &record)
                        .await?
                    {
                        CancelOutcome::Removed => return Ok(Some(true)),
                        // Claimed or settled meanwhile: look again.
                        CancelOutcome::Requested | CancelOutcome::NotFound => continue,
                    }
                }
                JobStatus::Claimed => {
                    match self.inflight.request_cancel(run_id) {
                        CancelVerdict::Requested => return Ok(Some(true)),
                        CancelVerdict::NotInFlight => {
                            // Claimed but not running in this runtime: not
                            // registered yet (its record read sees the
                            // request), held by another runtime over the
                            // queue, whose runner may already have returned,
                            // or settled since the read. Fire the claim's
                            // token; only the step's settlement tells
                            // whether the holder honoured the request, so
                            // wait for it and look again.
                            match self
                                .cancel_removing(run_id, &pointer, &job, &record)
                                .await?
                            {
                                // Re-queued since the read: removed with the
                                // run's termination.
                                CancelOutcome::Removed => return Ok(Some(true)),
                                CancelOutcome::Requested => {
                                    self.queue.wait_for_completion(&job.id).await?;
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
                    // a read between two commits; a dead one awaits
                    // reconciliation, which honours the request.
                    if job.status == JobStatus::Dead {
                        crate::worker::sweep::reconcile_job(self, &job).await?;
                        return self.ended_cancelled(run_id).await.map(Some);
                    }
                    continue;
                }
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
        let termination = self.termination(&outcome, None, record, &job.id);
        let membership = Membership::from_headers(&job.headers)?;
        let (mut effects, ended) = self.terminate_effects(
            &outcome,
            termination,
            membership.as_ref(),
            job.max_attempts,
            false,
        );
        effects
            .kv_deletes
            .extend(crate::coordination::signal::waiter_cleanup(job));
        let reason = DurableAttemptOutcome::cancelled(record.cancel_reason.as_deref());
        let history = self
            .detached_history(run_id, pointer.step_number, job, record, reason, None)
            .await;
        merge_effects(&mut effects, history);
        let (outcome, _) = self
            .commit_ending(
                Some(&ended),
                self.queue.cancel_with(&job.id, effects),
                |(outcome, _)| *outcome == CancelOutcome::Removed,
            )
            .await?;
        Ok(outcome)
    }

    async fn ended_cancelled(&self, run_id: &RunId) -> Result<bool> {
        Ok(self
            .view
            .terminal_record(run_id)
            .await?
            .is_some_and(|t| t.status == durable::DurableStatus::Cancelled))
    }
}
