//! [`WorkflowView`]: read-only queries over a workflow store (run status and
//! committed outcomes), usable from the runtime's process or, over a
//! `taquba::QueueReader`, from any other.

mod input;
pub(crate) mod keys;
mod ops;
mod step_input;
pub(crate) mod types;

pub use self::keys::{ConcurrencyKey, ConcurrencyKeyDetails, KeyHolder, KeyWaiter, RunConcurrency};
pub(crate) use self::ops::{DurableRuntimeInfo, DurableWorkerRecord};
pub(crate) use self::step_input::StepStart;
pub use self::types::{
    DEFAULT_PAGE_LIMIT, GroupPage, MAX_PAGE_LIMIT, RunDetails, RunFilter, RunPage, RunSummary,
    RuntimeInfo, SignalWait, StatusFilter,
};

use taquba::{JobRecord, JobStatus, QueueView};

use crate::error::{Error, Result};
use crate::model::RunOutcome;
use crate::model::{RunState, RunStatus};
use crate::store::durable::{
    self, DurableCurrentStep, DurableRunRecord, DurableRunResult, DurableTermination,
};
use crate::store::keys::{RunId, outcome_kv_key, run_kv_key, step_kv_key};
use crate::store::memo::{MemoStore, RUN_RESULT_MEMO_KEY};

/// Read-only queries of runs: [`status`](Self::status) and
/// [`outcome`](Self::outcome), and the operator queries: the
/// [`runtimes`](Self::runtimes) a store holds, run listings
/// ([`runs`](Self::runs)), one run described ([`run`](Self::run)), its
/// step history ([`steps`](Self::steps)), groups ([`groups`](Self::groups),
/// [`group`](Self::group)) and inbox commands ([`command`](Self::command)). [`WorkflowRuntime::view`](crate::WorkflowRuntime::view)
/// returns the runtime's; another process builds one with [`new`](Self::new)
/// from a `taquba::QueueReader`'s view and a [`MemoStore`] at the runtime's
/// memo prefix. Cheap to clone.
///
/// A view reads what the store holds at the moment: in the process that
/// writes the store, that includes a commit applied but still waiting for
/// its WAL flush, which a crash would lose. The runtime's own reads
/// ([`WorkflowRuntime::status`](crate::WorkflowRuntime::status),
/// [`outcome`](crate::WorkflowRuntime::outcome),
/// [`wait`](crate::WorkflowRuntime::wait), a job's and a group's results
/// and counts) report a run's end only once its commit is durable.
#[derive(Clone)]
pub struct WorkflowView {
    queue: QueueView,
    memos: MemoStore,
}

impl std::fmt::Debug for WorkflowView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkflowView")
            .field("memos", &self.memos)
            .finish_non_exhaustive()
    }
}

impl WorkflowView {
    /// A view over `queue` (a writer's [`taquba::Queue::view`] or a reader's
    /// [`taquba::QueueReader::view`]) and `memos`. Through a reader the
    /// answers are of the state the reader last observed.
    pub fn new(queue: QueueView, memos: MemoStore) -> Self {
        Self { queue, memos }
    }

    /// The status of `run_id`: an active run from its run record, pointer
    /// and current step job ([`RunState::Pending`], [`RunState::Running`],
    /// or [`RunState::Cancelling`] once a cancellation was requested); a
    /// terminated run from its terminal record ([`RunState::Terminated`]).
    /// `None` for a run never submitted or whose records retention removed.
    /// The step job is read in its stored form, without its payload: a done
    /// or dead record whose offloaded payload object is gone (a crash in
    /// the queue's retention sweep can leave one) reads like any other.
    ///
    /// # Errors
    /// Storage and decoding errors;
    /// [`Error::InconsistentRunState`] when the pointer names a job that does
    /// not exist on two reads.
    pub async fn status(&self, run_id: &RunId) -> Result<Option<RunStatus>> {
        let Some(record) = self.run_record(run_id).await? else {
            return self.terminated_status(run_id).await;
        };
        // The pointer goes with the record, so its absence means the run
        // terminated between the two reads.
        let Some((pointer, job)) = self.current_job(run_id).await? else {
            return self.terminated_status(run_id).await;
        };
        let state = if record.cancel_requested {
            RunState::Cancelling
        } else if job.status == JobStatus::Claimed {
            RunState::Running
        } else {
            RunState::Pending
        };
        Ok(Some(RunStatus {
            run_id: run_id.clone(),
            state,
            current_step: pointer.step_number,
        }))
    }

    /// The committed outcome of a terminated run, from the run result record
    /// its worker wrote before the terminating settlement. `None` while the
    /// run is active, for an unknown or swept run, and for a run terminated
    /// without a worker (a cancelled waiting step, a dead letter outside the
    /// worker). A record left by an earlier run under the same id is not
    /// reported.
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn outcome(&self, run_id: &RunId) -> Result<Option<RunOutcome>> {
        if self.current_step_if_active(run_id).await?.is_some() {
            return Ok(None);
        }
        self.recorded_outcome(run_id).await
    }

    /// How `run_id` ended, as [`WorkflowRuntime::wait`](crate::WorkflowRuntime::wait)
    /// reports it; `None` while it is active or when it is unknown (a
    /// cluster's wait on a shard another process owns polls this).
    pub(crate) async fn ended(&self, run_id: &RunId) -> Result<Option<crate::model::RunEnd>> {
        if self.current_step_if_active(run_id).await?.is_some() {
            return Ok(None);
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Ok(None);
        };
        let outcome = self.run_result_of(run_id, &termination).await?;
        Ok(Some(crate::model::RunEnd {
            termination: termination.into(),
            outcome,
        }))
    }

    /// The queue view it reads.
    pub(crate) fn queue_view(&self) -> &QueueView {
        &self.queue
    }

    pub(crate) async fn run_record(&self, run_id: &RunId) -> Result<Option<DurableRunRecord>> {
        durable::kv_record(&self.queue, &run_kv_key(run_id)).await
    }

    pub(crate) async fn current_step_if_active(
        &self,
        run_id: &RunId,
    ) -> Result<Option<DurableCurrentStep>> {
        durable::kv_record(&self.queue, &step_kv_key(run_id)).await
    }

    /// The current step of an active run with its queue record. A pointer
    /// that moved between the reads is followed.
    pub(crate) async fn current_job(
        &self,
        run_id: &RunId,
    ) -> Result<Option<(DurableCurrentStep, JobRecord)>> {
        let mut missing: Option<String> = None;
        loop {
            let Some(pointer) = self.current_step_if_active(run_id).await? else {
                return Ok(None);
            };
            if let Some(job) = self.queue.job_record(&pointer.job_id).await? {
                return Ok(Some((pointer, job)));
            }
            if missing.as_deref() == Some(pointer.job_id.as_str()) {
                return Err(Error::InconsistentRunState(run_id.clone()));
            }
            missing = Some(pointer.job_id);
        }
    }

    pub(crate) async fn terminal_record(
        &self,
        run_id: &RunId,
    ) -> Result<Option<DurableTermination>> {
        durable::kv_record(&self.queue, &outcome_kv_key(run_id)).await
    }

    async fn terminated_status(&self, run_id: &RunId) -> Result<Option<RunStatus>> {
        Ok(self.terminal_record(run_id).await?.map(|record| RunStatus {
            run_id: run_id.clone(),
            current_step: record.final_step,
            state: RunState::Terminated(record.into()),
        }))
    }

    /// The outcome in the run result record of the termination the terminal
    /// record describes.
    pub(crate) async fn recorded_outcome(&self, run_id: &RunId) -> Result<Option<RunOutcome>> {
        match self.terminal_record(run_id).await? {
            Some(termination) => self.run_result_of(run_id, &termination).await,
            None => Ok(None),
        }
    }

    /// The outcome in the run result record of `run_id` when the record
    /// belongs to `termination`,
    /// the terminal record as read: the whole record but its history entries
    /// must match, the input hash and group membership of the run included,
    /// so a record of an
    /// earlier run under the id, of a settlement that did not commit, or of
    /// another run that terminated the same way in the same millisecond is
    /// not reported.
    pub(crate) async fn run_result_of(
        &self,
        run_id: &RunId,
        termination: &DurableTermination,
    ) -> Result<Option<RunOutcome>> {
        Ok(self
            .run_result(run_id)
            .await?
            .filter(|record| record.termination.same_termination(termination))
            .map(|record| record.outcome.into()))
    }

    /// The run result record of `run_id`.
    async fn run_result(&self, run_id: &RunId) -> Result<Option<DurableRunResult>> {
        let Some(bytes) = self
            .memos
            .new_run_memo(run_id)
            .get(RUN_RESULT_MEMO_KEY)
            .await?
        else {
            return Ok(None);
        };
        Ok(durable::decode_or_absent::<DurableRunResult>(
            &bytes,
            "run result record",
            run_id,
        ))
    }
}
