//! Requeue: resume a run that failed because its step job was
//! dead-lettered. The final step is enqueued again (a new job with the dead
//! job's payload, headers, priority and attempt limit, and fresh attempts)
//! and the run is made active again under its id, in one transaction that
//! restores its run record and pointer, removes its terminal record and
//! puts the run's last history entries back on the pointer after a
//! `Requeued` marker. The dead job stays in the dead letters as the record
//! of what happened.

use taquba::{EnqueueResult, JobRecord, JobStatus, SettlementEffects};

use crate::coordination::members::{Membership, pending_member};
use crate::engine::attempt::set_pointer_history;
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::history::record::{DurableAttempt, DurableAttemptOutcome, DurableStepEntry};
use crate::model::TerminalStatus;
use crate::run::compose::merge_effects;
use crate::store::durable::{self, DurableRunRecord, DurableStatus, DurableTermination};
use crate::store::keys::user_headers;
use crate::store::keys::{
    HEADER_JOB_KEY, HEADER_REQUEUED, HEADER_RUN_ID, HEADER_STEP, RunId, group_submissions_kv_key,
    outcome_kv_key, run_kv_key,
};

/// Dead jobs read per page when a terminal record names no job.
const DEAD_PAGE: usize = 256;

impl RuntimeCore {
    /// Requeue the dead-lettered final step of `run_id`, committing
    /// `record(step, new job id)` in the same transaction. Returns the step
    /// and its new job.
    ///
    /// # Errors
    /// [`Error::CommandRefused`] naming the run and the reason when the run
    /// is active, unknown, did not fail, or its dead job is gone; storage
    /// and decoding errors.
    pub(crate) async fn requeue_recorded(
        &self,
        run_id: &RunId,
        record: impl Fn(u32, &str) -> SettlementEffects,
    ) -> Result<(u32, String)> {
        let refuse = |why: String| Err(Error::CommandRefused(format!("run `{run_id}` {why}")));
        let run_key = run_kv_key(run_id);
        if self.view.run_record(run_id).await?.is_some() {
            return refuse("is active; only a terminated run can be requeued".into());
        }
        let outcome_key = outcome_kv_key(run_id);
        let Some(bytes) = self.queue.view().kv_get(&outcome_key).await? else {
            return refuse(
                "is not known (never submitted, or its records were removed by retention)".into(),
            );
        };
        let termination: DurableTermination = durable::decode(&bytes)?;
        if termination.status != DurableStatus::Failed {
            let status = TerminalStatus::from(termination.status);
            return refuse(format!(
                "ended {status}; only a run that failed because its step was dead-lettered can be requeued"
            ));
        }
        let step = termination.final_step;
        let Some(job) = self.dead_step_job(run_id, &termination).await? else {
            return refuse(format!(
                "failed at step {step}, but that step's job is not in the dead letters: a runner's `Fail` verdict is final, and the queue's dead retention removes dead jobs"
            ));
        };
        let membership = Membership::from_headers(&job.headers)?;
        let requeues = job
            .headers
            .get(HEADER_REQUEUED)
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
            .saturating_add(1);
        let mut reserved_headers = membership
            .as_ref()
            .map(Membership::reserved_headers)
            .unwrap_or_default();
        reserved_headers.push((HEADER_REQUEUED, requeues.to_string()));
        if let Some(key) = job.headers.get(HEADER_JOB_KEY) {
            reserved_headers.push((HEADER_JOB_KEY, key.clone()));
        }
        let prepared = self.prepare_step(
            run_id,
            step,
            job.payload.clone(),
            &user_headers(&job.headers),
            StepEnqueueOpts {
                run_at: None,
                priority: Some(job.priority),
                max_attempts: Some(job.max_attempts),
                reserved_headers,
            },
        );
        let job_id = prepared.job_id.clone();
        let run = DurableRunRecord {
            input_hash: termination.input_hash.clone(),
            submitted_at_ms: termination.submitted_at_ms.unwrap_or_else(|| self.now_ms()),
            cancel_requested: false,
            cancel_delivered_to: None,
            execution: termination.execution.clone(),
            workflow: termination.workflow.clone(),
            group: termination.group.clone(),
            cancel_reason: None,
            forked_from: termination.forked_from.clone(),
            version: termination.version.clone(),
            patches: termination.patches.clone(),
            parent: termination.parent.clone(),
            concurrency: termination.concurrency.clone(),
        };
        // The history continues: the terminal record's pending entries go
        // back on the pointer, after a `Requeued` marker.
        let mut history = termination.history.clone().unwrap_or_default();
        let mut chunk = SettlementEffects::default();
        if self.ops.history_limit > 0 {
            history.push(&DurableStepEntry::new(
                step,
                self.detached_step_name(&job),
                vec![DurableAttempt {
                    attempt: 0,
                    claimed_at_ms: None,
                    settled_at_ms: self.now_ms(),
                    outcome: DurableAttemptOutcome::Requeued,
                }],
            ));
            chunk = history.flush_if_full(run_id, run.execution.as_deref(), self.ops.history_limit);
        }
        let mut effects = Self::step_effects(run_id, step, prepared, SettlementEffects::default())
            .kv_put(run_key.clone(), durable::encode(&run))
            .kv_delete(outcome_key);
        if let Some(membership) = &membership {
            effects = effects
                .kv_put(
                    membership.kv_key(),
                    durable::encode(&pending_member(membership, run_id)),
                )
                .kv_put(
                    group_submissions_kv_key(&membership.group_id),
                    crate::coordination::members::new_counter_value(),
                );
        }
        // A requeued child is active again (child workflows).
        effects =
            crate::engine::children::child_resumed_effects(effects, run_id, run.parent.as_ref());
        merge_effects(&mut effects, chunk);
        if self.ops.history_limit > 0 {
            set_pointer_history(&mut effects, run_id, history);
        }
        merge_effects(&mut effects, record(step, &job_id));
        // A keyed run takes a slot of its key again, or is refused.
        let _key_lock = self.requeue_slot(run_id, &run, &mut effects).await?;
        // Only while the run is not active: a submission meanwhile wins.
        match self.commits.compare_commit(&run_key, None, effects).await? {
            Some(results) => {
                if let Some(EnqueueResult::AlreadyEnqueued(existing)) = results.first() {
                    tracing::warn!(run_id = %run_id, job_id = %existing, "requeue found a pending job of the step");
                }
                Ok((step, job_id))
            }
            None => refuse("was submitted again while it was requeued".into()),
        }
    }

    /// The dead job of the final step of the terminated `run_id`: the job
    /// its terminal record names, or (for a record that names none) the
    /// dead job of that step found in the dead letters.
    async fn dead_step_job(
        &self,
        run_id: &RunId,
        termination: &DurableTermination,
    ) -> Result<Option<JobRecord>> {
        let is_step = |job: &JobRecord| {
            job.status == JobStatus::Dead
                && job.headers.get(HEADER_RUN_ID).map(String::as_str) == Some(run_id.as_str())
                && job
                    .headers
                    .get(HEADER_STEP)
                    .and_then(|s| s.parse::<u32>().ok())
                    == Some(termination.final_step)
        };
        if let Some(id) = &termination.job_id {
            return Ok(self.queue.view().get_job(id).await?.filter(is_step));
        }
        let mut after: Option<String> = None;
        loop {
            let page = self
                .queue
                .view()
                .dead_jobs(&self.queue_name, after.as_deref(), DEAD_PAGE)
                .await?;
            let full = page.len() == DEAD_PAGE;
            after = page.last().map(|job| job.id.clone());
            if let Some(job) = page.into_iter().rev().find(|job| is_step(job)) {
                // The stored form: fetch an offloaded payload.
                return Ok(self.queue.view().get_job(&job.id).await?);
            }
            if !full {
                return Ok(None);
            }
        }
    }
}
