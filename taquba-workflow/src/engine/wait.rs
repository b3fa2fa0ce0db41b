//! Waiting for a run's termination: woken in-process by the terminating
//! commit, with a periodic look at the current step for dead letters.

use std::time::Duration;

use taquba::JobStatus;

use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::model::{RunEnd, RunOutcome};
use crate::store::durable::DurableTermination;
use crate::store::keys::RunId;

impl RuntimeCore {
    /// Wait until `run_id` terminates.
    ///
    /// Woken in-process by the commit that terminates the run (see
    /// [`RunWatchers`](crate::run::watch::RunWatchers)), so following a run costs one read however many
    /// steps it takes. Every poll interval the wait also looks at the run's
    /// current step: a step dead-lettered outside the worker (the reaper)
    /// is reconciled here rather than left to the next maintenance round.
    pub(crate) async fn wait_run(&self, run_id: &RunId) -> Result<RunEnd> {
        match self.wait_run_until(run_id, None).await? {
            Some(end) => Ok(end),
            // Without a deadline the wait ends only with the run.
            None => Err(Error::InconsistentRunState(run_id.clone())),
        }
    }

    /// [`wait_run`](Self::wait_run) whose waiting ends at `deadline`
    /// (`Ok(None)`): the deadline bounds the waits between looks at the
    /// run's records, not a look in progress, so a run that terminated
    /// before the call is reported even with a deadline already passed.
    pub(crate) async fn wait_run_until(
        &self,
        run_id: &RunId,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<RunEnd>> {
        let expired = || async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        // The job a pointer named that was found absent: absent again under
        // the same pointer means the records disagree.
        let mut missing: Option<String> = None;
        let mut look_at_step = false;
        loop {
            // Registered before the reads: a termination committed after
            // them reaches the watch.
            let mut watch = self.run_watchers.watch(run_id);
            let Some(pointer) = self.view.current_step_if_active(run_id).await? else {
                if !self.read_termination_is_durable(run_id)? {
                    // The reads show a terminating commit of this process
                    // that is still waiting for its flush, which a takeover
                    // of the store would void: wait for its notification
                    // (or the store's closing), then look again.
                    tokio::select! {
                        end = watch.ended() => return Ok(Some(end)),
                        () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                        () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                        () = expired() => return Ok(None),
                    }
                    continue;
                }
                return self.ended_run(run_id).await.map(Some);
            };
            if look_at_step {
                // The record alone: the payload may be a large object.
                match self.queue.view().job_record(&pointer.job_id).await? {
                    Some(job) if job.status == JobStatus::Dead => {
                        // The dead record, not one read before, carries the
                        // error the run fails with.
                        missing = None;
                        if crate::engine::sweep::reconcile_job(self, &job).await? == 1 {
                            continue;
                        }
                    }
                    Some(_) => missing = None,
                    None => {
                        // Settled between the two reads (the pointer moved
                        // with it), or a pointer without its job.
                        if missing.as_deref() == Some(pointer.job_id.as_str()) {
                            return Err(Error::InconsistentRunState(run_id.clone()));
                        }
                        missing = Some(pointer.job_id);
                    }
                }
            }
            look_at_step = true;
            tokio::select! {
                end = watch.ended() => return Ok(Some(end)),
                () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                () = expired() => return Ok(None),
            }
        }
    }

    /// Whether a termination of `run_id` that a read just showed is durable:
    /// `false` while this process's commit of it is still in flight (its
    /// flush may yet fail; wait for its report).
    ///
    /// # Errors
    /// The store-closed error once another process opened the store: what
    /// the read showed may be a commit of this process that failed.
    pub(crate) fn read_termination_is_durable(&self, run_id: &RunId) -> Result<bool> {
        if self.run_watchers.is_terminating(run_id) {
            return Ok(false);
        }
        if self.store_closed.is_cancelled() {
            return Err(self.store_closed_error());
        }
        Ok(true)
    }

    /// The end of a run found terminated, from its terminal record and its
    /// result record (kept in memory when the termination was committed
    /// here lately: see `run::recent_ends`).
    async fn ended_run(&self, run_id: &RunId) -> Result<RunEnd> {
        let Some(record) = self.view.terminal_record(run_id).await? else {
            return Err(Error::RunNotFound(run_id.clone()));
        };
        let outcome = self.outcome_of_termination(run_id, &record).await?;
        Ok(RunEnd {
            termination: record.into(),
            outcome,
        })
    }

    /// The outcome of `run_id`'s termination `record` (its terminal
    /// record, just read): from the recent ends when this process committed
    /// it lately (see `run::recent_ends`), else from its run result record,
    /// `None` when that is absent or belongs to another termination.
    ///
    /// # Errors
    /// Storage errors reading the result record.
    pub(crate) async fn outcome_of_termination(
        &self,
        run_id: &RunId,
        record: &DurableTermination,
    ) -> Result<Option<RunOutcome>> {
        match self.recent_ends.outcome_of(run_id, record) {
            Some(outcome) => Ok(Some(outcome)),
            None => self.view.run_result_of(run_id, record).await,
        }
    }
}
