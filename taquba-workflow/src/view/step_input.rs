//! [`WorkflowView::step_input`]: the payload a recorded step of a
//! terminated run was delivered with, what a fork starts from. It is read
//! from the step's history entry (which keeps a payload up to the
//! runtime's step input limit), else from the step's job while the queue
//! keeps it (a failed step's dead job; a done job only under
//! `taquba::QueueConfig::keep_done_jobs`). A fork that cancels an active
//! run first reads the same input from the run's records while it is
//! still active ([`WorkflowView::active_step_start`]), before the cancel
//! can delete the job that holds it.

use taquba::JobRecord;

use crate::error::{Error, Result};
use crate::history::read::execution_entries;
use crate::history::record::{DurableStepEntry, RecordedInput};
use crate::store::durable::{
    DurableCurrentStep, DurableForkLink, DurableTermination, PendingHistory,
};
use crate::store::keys::{
    HEADER_RUN_ID, HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, HEADER_STEP, RunId,
    signal_delivered_kv_key,
};
use crate::view::WorkflowView;

/// Reads of an active run's step input that found it moving (its pointer
/// naming another step job after a refusal) before the refusal stands.
const MOVING_RUN_READS: usize = 8;

/// A recorded step's start: its payload, and the signal that woke it.
#[derive(Debug)]
pub(crate) struct StepStart {
    /// The payload the step was delivered with.
    pub(crate) payload: Vec<u8>,
    /// The signal it was woken with, when its history entry kept one.
    pub(crate) signal: Option<Vec<u8>>,
}

/// Where a run's records keep the input of one of its steps: the history
/// entries of its execution (chunks, then `pending`), and the step jobs
/// the records name beside them.
struct InputRecords<'a> {
    execution: Option<&'a str>,
    pending: Option<&'a PendingHistory>,
    jobs: Vec<String>,
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
        if self.run_record(run_id).await?.is_some() {
            return Err(Error::RunActive(run_id.clone()));
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Err(not_forkable(
                run_id,
                step,
                "the run is not known (never submitted, or its records were removed by retention)"
                    .into(),
            ));
        };
        if step > termination.final_step {
            return Err(not_forkable(
                run_id,
                step,
                format!("the run ended at step {}", termination.final_step),
            ));
        }
        let first = first_step(run_id, step, termination.forked_from.as_ref())?;
        let records = InputRecords {
            execution: termination.execution.as_deref(),
            pending: termination.history.as_ref(),
            jobs: candidate_jobs(&termination, step, first),
        };
        self.recorded_start(run_id, step, records).await
    }

    /// What a fork from step `step` of the active run `run_id` starts with,
    /// read while the run is active (by a fork that then cancels it, before
    /// the cancel deletes the job that may hold the only copy): the input
    /// is read from the same places as [`step_start`](Self::step_start)'s
    /// (the history entries of the run's execution, the step's job), the
    /// current step's from its job. The current step's signal, when it was
    /// woken by one and no entry kept one, is read from its job's wake or
    /// the signal stored for it, kept as a settlement keeps it: when it and
    /// the payload kept inline are at most `step_input_limit` bytes.
    /// `None` when the run is not active (it ended, or was never
    /// submitted). A run that moves on while its input is read (its step
    /// settles, its job is deleted) is read again.
    ///
    /// # Errors
    /// - [`Error::StepNotForkable`] naming the run, the step and why: the
    ///   run has not reached `step`, it was forked from a later step, or
    ///   the step's input is no longer recorded.
    /// - Storage and decoding errors;
    ///   [`Error::InconsistentRunState`] when the pointer names a job that
    ///   does not exist on two reads.
    pub(crate) async fn active_step_start(
        &self,
        run_id: &RunId,
        step: u32,
        step_input_limit: usize,
    ) -> Result<Option<StepStart>> {
        let mut reads = 0;
        loop {
            let Some(record) = self.run_record(run_id).await? else {
                return Ok(None);
            };
            // The pointer goes with the record: without it the run ended
            // between the two reads.
            let Some((pointer, job)) = self.current_job(run_id).await? else {
                return Ok(None);
            };
            let current = pointer.step_number;
            if step > current {
                return Err(not_forkable(
                    run_id,
                    step,
                    format!("the run is at step {current} and has not reached step {step}"),
                ));
            }
            let first = first_step(run_id, step, record.forked_from.as_ref())?;
            let mut jobs = Vec::new();
            if step == current {
                jobs.push(pointer.job_id.clone());
            }
            if step == first
                && let Some(execution) = &record.execution
            {
                jobs.push(execution.clone());
            }
            let records = InputRecords {
                execution: record.execution.as_deref(),
                pending: pointer.history.as_ref(),
                jobs,
            };
            match self.recorded_start(run_id, step, records).await {
                Ok(mut start) => {
                    if step == current && start.signal.is_none() {
                        start.signal = self
                            .current_signal(run_id, &pointer, &job, step_input_limit)
                            .await?;
                    }
                    return Ok(Some(start));
                }
                Err(refused @ Error::StepNotForkable { .. }) => {
                    // Refused on records that moved under the reads (the
                    // step settled and its job went, its entry now on a
                    // newer pointer or chunk): read them again.
                    let moved = self
                        .current_step_if_active(run_id)
                        .await?
                        .is_none_or(|now| now.job_id != pointer.job_id);
                    reads += 1;
                    if !moved || reads >= MOVING_RUN_READS {
                        return Err(refused);
                    }
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The start of step `step` of `run_id` from `records`: the payload of
    /// the step's last entry that kept one, else of the first job the
    /// entries or `records.jobs` name that the queue still holds (and that
    /// is this run's step); the signal of the step's last entry that kept
    /// one.
    ///
    /// # Errors
    /// [`Error::StepNotForkable`] naming why when neither holds the input;
    /// storage and decoding errors.
    async fn recorded_start(
        &self,
        run_id: &RunId,
        step: u32,
        records: InputRecords<'_>,
    ) -> Result<StepStart> {
        let mut entries = self
            .step_entries(run_id, step, records.execution, records.pending)
            .await?;
        let signal = signal_of(&entries);
        if let Some(payload) = entries.iter_mut().rev().find_map(|e| e.payload.take()) {
            return Ok(StepStart {
                payload: payload.into_vec(),
                signal,
            });
        }
        let mut jobs: Vec<String> = entries.iter().filter_map(|e| e.job_id.clone()).collect();
        jobs.extend(records.jobs);
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
        Err(not_forkable(
            run_id,
            step,
            format!(
                "{why}, and the queue no longer holds the step's job (a done job is deleted when it settles unless `keep_done_jobs` is set; dead jobs go with the dead retention)"
            ),
        ))
    }

    /// The signal that woke step `step` of the terminated run `run_id`, as
    /// its history entry kept it ([`step_start`](Self::step_start)'s),
    /// whether or not its input is still recorded. `None` for an active or
    /// unknown run, and a step with no entry that kept a signal.
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub(crate) async fn ended_step_signal(
        &self,
        run_id: &RunId,
        step: u32,
    ) -> Result<Option<Vec<u8>>> {
        if self.run_record(run_id).await?.is_some() {
            return Ok(None);
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Ok(None);
        };
        let entries = self
            .step_entries(
                run_id,
                step,
                termination.execution.as_deref(),
                termination.history.as_ref(),
            )
            .await?;
        Ok(signal_of(&entries))
    }

    /// The history entries of step `step` of `run_id`'s execution
    /// `execution` (in its chunks, then `pending`), oldest first.
    async fn step_entries(
        &self,
        run_id: &RunId,
        step: u32,
        execution: Option<&str>,
        pending: Option<&PendingHistory>,
    ) -> Result<Vec<DurableStepEntry>> {
        let entries = execution_entries(&self.queue, run_id, execution, pending).await?;
        Ok(entries.into_iter().filter(|e| e.step == step).collect())
    }

    /// The signal the current step of `run_id` (`pointer`, its job `job`)
    /// was woken with, as the step observes it (the signal stored for the
    /// step, else its job's wake), when a settlement would keep it in the
    /// step's entry: it and the payload kept inline are at most `limit`
    /// bytes. `None` for a step that waits for no signal or was not woken
    /// by one (yet).
    async fn current_signal(
        &self,
        run_id: &RunId,
        pointer: &DurableCurrentStep,
        job: &JobRecord,
        limit: usize,
    ) -> Result<Option<Vec<u8>>> {
        let delivered = job.headers.contains_key(HEADER_SIGNAL_DELIVERED);
        let input = RecordedInput::of(job, limit);
        if limit == 0 || !(delivered || job.headers.contains_key(HEADER_SIGNAL_WAIT)) {
            return Ok(None);
        }
        let stored = self
            .queue
            .kv_get(&signal_delivered_kv_key(run_id, pointer.step_number))
            .await?
            .map(|signal| signal.to_vec());
        let signal = match stored {
            Some(signal) => Some(signal),
            None if delivered => None,
            None => job.woken_at.and(job.wake_payload.clone()),
        };
        // `job` is read in its stored form: an inline payload is there, as
        // in the claimed job a settlement records.
        Ok(signal.filter(|signal| input.keeps_signal(signal, limit)))
    }
}

/// The signal the last of a step's `entries` that kept one kept.
fn signal_of(entries: &[DurableStepEntry]) -> Option<Vec<u8>> {
    entries
        .iter()
        .rev()
        .find_map(|e| e.signal.as_ref())
        .map(|signal| signal.to_vec())
}

/// A refusal of a fork from step `step` of `run_id` saying `reason`.
fn not_forkable(run_id: &RunId, step: u32, reason: String) -> Error {
    Error::StepNotForkable {
        run_id: run_id.clone(),
        step,
        reason,
    }
}

/// The first step of a run forked from `forked_from` (0 for any other),
/// when it is not after `step`.
///
/// # Errors
/// [`Error::StepNotForkable`] for a `step` before it, naming the run to
/// fork instead.
fn first_step(run_id: &RunId, step: u32, forked_from: Option<&DurableForkLink>) -> Result<u32> {
    let first = forked_from.map_or(0, |link| link.step);
    if step < first {
        let origin = forked_from
            .map(|link| link.run_id.to_string())
            .unwrap_or_default();
        return Err(not_forkable(
            run_id,
            step,
            format!(
                "the run was forked from run `{origin}` at step {first} and has no step {step}; fork `{origin}` instead"
            ),
        ));
    }
    Ok(first)
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
