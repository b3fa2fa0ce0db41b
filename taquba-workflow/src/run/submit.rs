//! Submission: the compare-and-commit of a run's first step with its run
//! record and pointer, the answers to duplicate submissions.

use taquba::{EnqueueResult, SettlementEffects};
use tracing::{debug, warn};

use crate::coordination::group::{Membership, pending_member};
use crate::error::{Error, Result};
use crate::model::{RunOptions, RunSpec, SubmitOutcome};
use crate::run::core::{OnTerminated, RuntimeCore, StepEnqueueOpts};
use crate::run::effects::StagedKv;
use crate::run::submit_batch::Batched;
use crate::store::durable::{self, DurableCurrentStep, DurableRunRecord};
use crate::store::keys::{
    RESERVED_HEADER_PREFIX, RunId, group_submissions_kv_key, run_kv_key, sha256, step_kv_key,
};

/// Attempts of a submission whose compare-and-commit lost to a concurrent
/// writer of the same run record before the call gives up.
const SUBMIT_RACE_RETRIES: usize = 8;

impl RuntimeCore {
    /// Submit `spec`, as a member of a group when `membership` is given.
    pub(crate) async fn submit(
        &self,
        spec: RunSpec,
        membership: Option<&Membership>,
    ) -> Result<SubmitOutcome> {
        self.submit_as(spec, membership, OnTerminated::Restart)
            .await
    }

    /// [`submit`](Self::submit), with `on_terminated` deciding what a run id
    /// that is not active but has a terminal record means. With
    /// [`OnTerminated::Keep`] (and, for a success, with
    /// [`OnTerminated::KeepSucceeded`]) the recorded run answers the
    /// submission (`newly_submitted: false`, no job id;
    /// [`Error::InputMismatch`] for another input). The terminal record is
    /// read after the run record is found absent, in the same retry loop as
    /// the commit, so a run that terminates while it is submitted again is
    /// not started a second time.
    pub(crate) async fn submit_as(
        &self,
        spec: RunSpec,
        membership: Option<&Membership>,
        on_terminated: OnTerminated,
    ) -> Result<SubmitOutcome> {
        let input_hash = sha256(&spec.input).to_vec();
        self.submit_hashed(spec, input_hash, membership, on_terminated)
            .await
    }

    /// [`submit_as`](Self::submit_as) with the hash the run's input is
    /// recorded and compared under given, instead of the SHA-256 of
    /// `spec.input`: a job run's is the hash of its canonical encoding, so
    /// an equal job whose maps iterate in another order is the same input.
    pub(crate) async fn submit_hashed(
        &self,
        spec: RunSpec,
        input_hash: Vec<u8>,
        membership: Option<&Membership>,
        on_terminated: OnTerminated,
    ) -> Result<SubmitOutcome> {
        Self::check_submission(&spec.options, &spec.effects)?;
        self.submit_checked(spec, input_hash, membership, on_terminated)
            .await
    }

    /// The submission of an inbox command: `spec` (already validated) with
    /// `record` (the command's record, under the reserved prefix) committed
    /// in the submission's transaction; nothing is committed for a
    /// duplicate (`newly_submitted: false`).
    pub(crate) async fn submit_recorded(
        &self,
        mut spec: RunSpec,
        record: SettlementEffects,
    ) -> Result<SubmitOutcome> {
        Self::check_submission(&spec.options, &spec.effects)?;
        let input_hash = sha256(&spec.input).to_vec();
        crate::run::compose::merge_effects(&mut spec.effects, record);
        self.submit_checked(spec, input_hash, None, OnTerminated::Restart)
            .await
    }

    /// [`submit_hashed`](Self::submit_hashed) once `spec` is checked.
    async fn submit_checked(
        &self,
        spec: RunSpec,
        input_hash: Vec<u8>,
        membership: Option<&Membership>,
        on_terminated: OnTerminated,
    ) -> Result<SubmitOutcome> {
        let RunSpec {
            run_id,
            input,
            options,
            effects: user_effects,
        } = spec;
        // A fresh ULID names no recorded run: its first attempt skips the
        // reads (the compare-and-commit below still guards the record).
        let mut fresh_id = run_id.is_none();
        let batchable = membership.is_none()
            && user_effects.enqueues.is_empty()
            && user_effects.kv_writes.is_empty()
            && user_effects.kv_deletes.is_empty()
            && user_effects.expiry_entries.is_empty();
        let run_id = run_id.unwrap_or_else(RunId::generate);
        // The compare-and-commit guard: a run's record must still be absent.
        // A group member's record changes with every submission and
        // termination of it, so a member is guarded on that record as read
        // before anything else: a run record absent again after a re-run
        // that ended meanwhile would pass the first guard.
        let guard_key = membership.map_or_else(|| run_kv_key(&run_id), Membership::kv_key);

        for _ in 0..SUBMIT_RACE_RETRIES {
            let fresh = std::mem::take(&mut fresh_id);
            let guard = match membership {
                Some(_) => self.queue.view().kv_get(&guard_key).await?,
                None => None,
            };
            if !fresh && let Some(existing) = self.view.run_record(&run_id).await? {
                return self.duplicate(&run_id, &existing, &input_hash).await;
            }
            if !fresh
                && on_terminated != OnTerminated::Restart
                && let Some(termination) = self.view.terminal_record(&run_id).await?
                && (on_terminated == OnTerminated::Keep
                    || termination.status == durable::DurableStatus::Succeeded)
            {
                if termination.input_hash != input_hash {
                    return Err(Error::InputMismatch(run_id));
                }
                return Ok(SubmitOutcome {
                    run_id,
                    newly_submitted: false,
                    job_id: String::new(),
                });
            }
            let (effects, job_id) = self.submission_effects(
                &run_id,
                input.clone(),
                &input_hash,
                &options,
                membership,
                &user_effects,
            );
            // A fresh id with nothing of the caller's riding along joins the
            // group commit; the rest compare-and-commit on the run record.
            let committed = if fresh && batchable {
                match self.submit_batcher.commit(effects).await? {
                    Batched::Committed(results) => Some(results),
                    // Unknown whether it committed: look, then submit again.
                    Batched::Abandoned => continue,
                }
            } else {
                self.queue
                    .kv_compare_commit(&guard_key, guard.as_deref(), effects)
                    .await?
            };
            match committed {
                Some(results) => return self.submitted(run_id, job_id, &results).await,
                // Another submission of this run id committed first.
                None => continue,
            }
        }
        Err(Error::InconsistentRunState(run_id))
    }

    /// Reject what no submission may carry: a reserved header name in
    /// `options` ([`Error::ReservedHeaderInSubmit`]) or a KV key under the
    /// reserved prefix in `user_effects`.
    pub(crate) fn check_submission(
        options: &RunOptions,
        user_effects: &SettlementEffects,
    ) -> Result<()> {
        if let Some(name) = options
            .headers
            .keys()
            .find(|name| name.starts_with(RESERVED_HEADER_PREFIX))
        {
            return Err(Error::ReservedHeaderInSubmit(name.clone()));
        }
        for key in user_effects
            .kv_writes
            .keys()
            .chain(user_effects.kv_deletes.iter())
        {
            StagedKv::check_key(key)?;
        }
        Ok(())
    }

    /// The effects that submit `run_id` (step 0 with `input`, whose hash is
    /// `input_hash`): the step-0 enqueue first, so its result is at index
    /// 0, the pointer, the run record, the member record of a group member,
    /// then `user_effects`. With the step-0 job id.
    pub(crate) fn submission_effects(
        &self,
        run_id: &RunId,
        input: Vec<u8>,
        input_hash: &[u8],
        options: &RunOptions,
        membership: Option<&Membership>,
        user_effects: &SettlementEffects,
    ) -> (SettlementEffects, String) {
        let mut record = DurableRunRecord {
            input_hash: input_hash.to_vec(),
            submitted_at_ms: self.now_ms(),
            cancel_requested: false,
            execution: None,
            workflow: self.workflow_name_of(&input),
            group: membership.map(|m| m.group_id.clone()),
            cancel_reason: None,
        };
        let reserved_headers = membership
            .map(Membership::reserved_headers)
            .unwrap_or_default();
        let step = self.prepare_step(
            run_id,
            0,
            input,
            &options.headers,
            StepEnqueueOpts {
                run_at: options.run_at,
                priority: options.priority,
                max_attempts: options.max_attempts_per_step,
                reserved_headers,
            },
        );
        let job_id = step.job_id.clone();
        record.execution = Some(job_id.clone());
        let mut effects = Self::step_effects(run_id, 0, step, SettlementEffects::default())
            .kv_put(run_kv_key(run_id), durable::encode(&record));
        effects
            .enqueues
            .extend(user_effects.enqueues.iter().cloned());
        for (key, value) in &user_effects.kv_writes {
            effects.kv_writes.insert(key.clone(), value.clone());
        }
        effects
            .kv_deletes
            .extend(user_effects.kv_deletes.iter().cloned());
        effects
            .expiry_entries
            .extend(user_effects.expiry_entries.iter().cloned());
        if let Some(membership) = membership {
            // Every member submission moves the group's submission counter,
            // so a chunk of another submission that read the group before
            // this commit cannot commit after it.
            effects = effects
                .kv_put(
                    membership.kv_key(),
                    durable::encode(&pending_member(membership)),
                )
                .kv_put(
                    group_submissions_kv_key(&membership.group_id),
                    crate::coordination::group_submit::new_counter_value(),
                );
        }
        (effects, job_id)
    }

    /// The outcome of a committed submission of `run_id` whose step-0 job
    /// was prepared as `job_id`; `results` are the commit's enqueue results
    /// for this submission (step 0 first).
    pub(crate) async fn submitted(
        &self,
        run_id: RunId,
        job_id: String,
        results: &[EnqueueResult],
    ) -> Result<SubmitOutcome> {
        if let Some(EnqueueResult::AlreadyEnqueued(orphan)) = results.first() {
            // A step-0 job of this run id was pending without a run record
            // (left by outside interference): adopt it as the run's current
            // step.
            warn!(run_id = %run_id, job_id = %orphan, "adopting a pending step-0 job without a run record");
            let pointer = DurableCurrentStep {
                step_number: 0,
                job_id: orphan.clone(),
            };
            self.queue
                .kv_put(&step_kv_key(&run_id), &durable::encode(&pointer))
                .await?;
            return Ok(SubmitOutcome {
                run_id,
                newly_submitted: true,
                job_id: orphan.clone(),
            });
        }
        debug!(run_id = %run_id, job_id = %job_id, "run submitted");
        Ok(SubmitOutcome {
            run_id,
            newly_submitted: true,
            job_id,
        })
    }

    /// The answer to a submission of an active run.
    async fn duplicate(
        &self,
        run_id: &RunId,
        existing: &DurableRunRecord,
        input_hash: &[u8],
    ) -> Result<SubmitOutcome> {
        if existing.input_hash != input_hash {
            return Err(Error::InputMismatch(run_id.clone()));
        }
        let job_id = self
            .view
            .current_step_if_active(run_id)
            .await?
            .map(|pointer| pointer.job_id)
            .unwrap_or_default();
        Ok(SubmitOutcome {
            run_id: run_id.clone(),
            newly_submitted: false,
            job_id,
        })
    }
}
