//! [`WorkflowView::step_input`]: the payload a recorded step of a
//! terminated run was delivered with, what a fork starts from. It is read
//! from the step's history entry (which keeps a payload up to the
//! runtime's step input limit), else from the step's job while the queue
//! keeps it (a failed step's dead job; a done job only under
//! `taquba::QueueConfig::keep_done_jobs`).

use crate::error::{Error, Result};
use crate::history::read::execution_entries;
use crate::store::durable::DurableTermination;
use crate::store::keys::{HEADER_RUN_ID, HEADER_STEP, RunId};
use crate::view::WorkflowView;

/// A recorded step's start: its payload, and the signal that woke it.
pub(crate) struct StepStart {
    /// The payload the step was delivered with.
    pub(crate) payload: Vec<u8>,
    /// The signal it was woken with, when its history entry kept one.
    pub(crate) signal: Option<Vec<u8>>,
}

impl WorkflowView {
    /// The payload step `step` of the terminated run `run_id` was delivered
    /// with (a `#[workflow]` run's step envelope, a job run's job input at
    /// step 0, a hand-written runner's bytes): from the step's history
    /// entry when it kept the payload (one of at most
    /// [`step_input_limit`](crate::WorkflowRuntimeBuilder::step_input_limit)
    /// bytes), else from the step's job while the queue keeps it. An
    /// offloaded payload is fetched.
    ///
    /// # Errors
    /// - [`Error::RunActive`] when the run has not ended.
    /// - [`Error::StepNotForkable`] naming the run, the step and why: the
    ///   run is unknown (never submitted, or its records were removed by
    ///   retention), it ended before `step`, it was itself forked from a
    ///   later step, or the step's input is no longer recorded (its history
    ///   entry fell out of the run's last
    ///   [`history_limit`](crate::WorkflowRuntimeBuilder::history_limit)
    ///   entries or recorded no payload, and the queue no longer holds its
    ///   job).
    /// - Storage and decoding errors.
    pub async fn step_input(&self, run_id: &RunId, step: u32) -> Result<Vec<u8>> {
        Ok(self.step_start(run_id, step).await?.payload)
    }

    /// What a fork from step `step` of `run_id` starts with: the payload
    /// ([`step_input`](Self::step_input)) and the signal that woke the step
    /// when its history entry kept one.
    ///
    /// # Errors
    /// As [`step_input`](Self::step_input).
    pub(crate) async fn step_start(&self, run_id: &RunId, step: u32) -> Result<StepStart> {
        let refuse = |reason: String| Error::StepNotForkable {
            run_id: run_id.clone(),
            step,
            reason,
        };
        if self.run_record(run_id).await?.is_some() {
            return Err(Error::RunActive(run_id.clone()));
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Err(refuse(
                "the run is not known (never submitted, or its records were removed by retention)"
                    .into(),
            ));
        };
        if step > termination.final_step {
            return Err(refuse(format!(
                "the run ended at step {}",
                termination.final_step
            )));
        }
        let first = termination.forked_from.as_ref().map_or(0, |link| link.step);
        if step < first {
            let origin = termination
                .forked_from
                .as_ref()
                .map(|link| link.run_id.to_string())
                .unwrap_or_default();
            return Err(refuse(format!(
                "the run was forked from run `{origin}` at step {first} and has no step {step}; fork `{origin}` instead"
            )));
        }
        let entries = execution_entries(
            &self.queue,
            run_id,
            termination.execution.as_deref(),
            termination.history.as_ref(),
        )
        .await?;
        let mut entries: Vec<_> = entries.into_iter().filter(|e| e.step == step).collect();
        let signal = entries
            .iter()
            .rev()
            .find_map(|e| e.signal.clone())
            .map(|signal| signal.into_vec());
        if let Some(payload) = entries.iter_mut().rev().find_map(|e| e.payload.take()) {
            return Ok(StepStart {
                payload: payload.into_vec(),
                signal,
            });
        }
        let mut jobs: Vec<String> = entries.iter().filter_map(|e| e.job_id.clone()).collect();
        jobs.extend(candidate_jobs(&termination, step, first));
        for job_id in &jobs {
            if let Some(job) = self.queue.get_job(job_id).await?
                && job.headers.get(HEADER_RUN_ID).map(String::as_str) == Some(run_id.as_str())
                && job.headers.get(HEADER_STEP).and_then(|s| s.parse().ok()) == Some(step)
            {
                return Ok(StepStart {
                    payload: job.payload,
                    signal,
                });
            }
        }
        let why = if entries.is_empty() {
            "its history entry is no longer kept (a run keeps the entries of its last `history_limit` steps, none with the history off)"
        } else if jobs.is_empty() {
            "its history entry records no payload (written before step inputs were recorded, or with a step input limit of 0)"
        } else {
            "its payload was larger than the step input limit (or offloaded), so its history entry names its job instead"
        };
        Err(refuse(format!(
            "{why}, and the queue no longer holds the step's job (a done job is deleted when it settles unless `keep_done_jobs` is set; dead jobs go with the dead retention)"
        )))
    }
}

/// The jobs a terminated run's records name for step `step` (its first
/// step being `first`): the final step's job, and the first step's (the
/// execution tag).
fn candidate_jobs(termination: &DurableTermination, step: u32, first: u32) -> Vec<String> {
    let mut jobs = Vec::new();
    if step == termination.final_step
        && let Some(job_id) = &termination.job_id
    {
        jobs.push(job_id.clone());
    }
    if step == first
        && let Some(execution) = &termination.execution
    {
        jobs.push(execution.clone());
    }
    jobs
}
