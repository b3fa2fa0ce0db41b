//! Fork and restart: a new run, under a new id linked to the original,
//! that starts at a recorded step of an ended run with the payload that
//! step was delivered with (`view::step_input`); the steps before it are
//! not run again. A restart is the fork from step 0. The new run's first
//! step, run record (with the link) and pointer commit in one
//! compare-and-commit on its run record, as a submission does.

use taquba::SettlementEffects;
use tracing::debug;

use crate::engine::cancel::CancelRequest;
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::fork::ForkOptions;
use crate::model::SubmitOutcome;
use crate::store::durable::{self, DurableForkLink, DurableRunRecord};
use crate::store::keys::{
    HEADER_SIGNAL_DELIVERED, RunId, run_kv_key, sha256, signal_delivered_kv_key,
};

/// Attempts of a fork whose compare-and-commit lost to a concurrent
/// writer of the new run's record before the call gives up.
const FORK_RACE_RETRIES: usize = 4;

impl RuntimeCore {
    /// Fork `run_id` from step `from_step` (see
    /// [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork)).
    pub(crate) async fn fork(
        &self,
        run_id: &RunId,
        from_step: u32,
        options: &ForkOptions,
    ) -> Result<SubmitOutcome> {
        let link = DurableForkLink {
            run_id: run_id.clone(),
            step: from_step,
        };
        // A retried fork under the id it was given answers the fork made.
        if let Some(new_id) = &options.run_id
            && let Some(made) = self.fork_made(new_id, &link).await?
        {
            return Ok(made);
        }
        if self.view.run_record(run_id).await?.is_some() {
            if !options.cancel_active {
                return Err(Error::RunActive(run_id.clone()));
            }
            let request = CancelRequest {
                reason: Some(format!("cancelled to fork it from step {from_step}")),
                ..Default::default()
            };
            self.cancel_as(run_id, request).await?;
            self.wait_run(run_id).await?;
        }
        let start = self.view.step_start(run_id, from_step).await?;
        let payload = start.payload;
        // The submitter's headers carry over, from the recorded outcome.
        let original = self.view.run(run_id).await?;
        let headers = original
            .as_ref()
            .map(|details| details.headers.clone())
            .unwrap_or_default();
        let workflow = self.workflow_name_of(&payload);
        // A fork goes on from where the original was, so it keeps the code
        // version and patches the original started with: a later step
        // branches as the original's earlier steps did. A restart runs
        // every step again on the code at hand, so it is a new start.
        let (version, patches) = match original {
            Some(details) if from_step > 0 => (details.version, details.patches),
            _ => {
                let code = self.ops.code.of(workflow.as_deref());
                (code.version.clone(), code.patches.iter().cloned().collect())
            }
        };
        let new_id = options.run_id.clone().unwrap_or_else(|| self.new_run_id());
        let run_key = run_kv_key(&new_id);
        for _ in 0..FORK_RACE_RETRIES {
            let step = self.prepare_step(
                &new_id,
                from_step,
                payload.clone(),
                &headers,
                StepEnqueueOpts {
                    run_at: None,
                    priority: None,
                    max_attempts: None,
                    // A step a signal woke is delivered it again, as an
                    // inbox-delivered signal is: stored for the step.
                    reserved_headers: match start.signal {
                        Some(_) => vec![(HEADER_SIGNAL_DELIVERED, "fork".to_string())],
                        None => Vec::new(),
                    },
                },
            );
            let job_id = step.job_id.clone();
            let record = DurableRunRecord {
                input_hash: sha256(&payload).to_vec(),
                submitted_at_ms: self.now_ms(),
                cancel_requested: false,
                cancel_delivered_to: None,
                execution: Some(job_id.clone()),
                workflow: workflow.clone(),
                group: None,
                cancel_reason: None,
                forked_from: Some(link.clone()),
                concurrency: None,
                version: version.clone(),
                patches: patches.clone(),
                parent: None,
            };
            let mut effects =
                Self::step_effects(&new_id, from_step, step, SettlementEffects::default())
                    .kv_put(run_key.clone(), durable::encode(&record));
            if let Some(signal) = &start.signal {
                effects =
                    effects.kv_put(signal_delivered_kv_key(&new_id, from_step), signal.clone());
            }
            if self
                .commits
                .compare_commit(&run_key, None, effects)
                .await?
                .is_some()
            {
                debug!(run_id = %new_id, forked_from = %run_id, step = from_step, "run forked");
                return Ok(SubmitOutcome {
                    run_id: new_id,
                    newly_submitted: true,
                    job_id,
                });
            }
            // Another writer of the new id committed first: this fork
            // retried, or another run.
            if let Some(made) = self.fork_made(&new_id, &link).await? {
                return Ok(made);
            }
        }
        Err(Error::InconsistentRunState(new_id))
    }

    /// The answer to a fork under `new_id` of `link` already made
    /// (`newly_submitted: false`), `None` when no run has the id.
    ///
    /// # Errors
    /// [`Error::ForkRunIdTaken`] when a run that is not that fork has it.
    async fn fork_made(
        &self,
        new_id: &RunId,
        link: &DurableForkLink,
    ) -> Result<Option<SubmitOutcome>> {
        let (forked_from, job_id) = match self.view.run_record(new_id).await? {
            Some(record) => {
                let job_id = self
                    .view
                    .current_job(new_id)
                    .await?
                    .map(|(pointer, _)| pointer.job_id)
                    .unwrap_or_default();
                (record.forked_from, job_id)
            }
            None => match self.view.terminal_record(new_id).await? {
                Some(termination) => (termination.forked_from, String::new()),
                None => return Ok(None),
            },
        };
        if forked_from.as_ref() != Some(link) {
            return Err(Error::ForkRunIdTaken(new_id.clone()));
        }
        Ok(Some(SubmitOutcome {
            run_id: new_id.clone(),
            newly_submitted: false,
            job_id,
        }))
    }
}
