//! Submission: the compare-and-commit of a run's first step with its run
//! record and pointer, the answers to duplicate submissions.

use taquba::{EnqueueResult, SettlementEffects};
use tracing::{debug, warn};

use crate::coordination::members::{Membership, pending_member};
use crate::engine::{OnTerminated, RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::model::{RunOptions, RunSpec, SubmitOutcome};
use crate::run::effects::{StagedKv, check_enqueue};
use crate::run::submit_batch::Batched;
use crate::store::durable::{self, DurableCurrentStep, DurableRunRecord};
use crate::store::keys::{
    HEADER_JOB_KEY, RESERVED_HEADER_PREFIX, RunId, group_submissions_kv_key, run_kv_key, sha256,
    step_kv_key,
};

/// Attempts of a submission whose compare-and-commit lost to a concurrent
/// writer of the same run record before the call gives up.
const SUBMIT_RACE_RETRIES: usize = 8;
/// The longest job key [`HEADER_JOB_KEY`] carries, in bytes.
const MAX_JOB_KEY_HEADER_LEN: usize = 256;

/// What a submitted run is besides its run id.
#[derive(Debug, Clone, Copy)]
pub(super) enum SubmittedAs<'a> {
    /// A plain run (or a keyless job).
    Plain,
    /// A member of a group.
    Member(&'a Membership),
    /// A keyed job, with its idempotency key.
    KeyedJob(&'a str),
}

impl RuntimeCore {
    /// Submit the plain run `spec` (group members are submitted by
    /// `group_submit`).
    pub(crate) async fn submit(&self, spec: RunSpec) -> Result<SubmitOutcome> {
        let input_hash = sha256(&spec.input).to_vec();
        self.submit_hashed(spec, input_hash, OnTerminated::Restart, None)
            .await
    }

    /// [`submit`](Self::submit) with the hash the run's input is recorded
    /// and compared under given, instead of the SHA-256 of `spec.input` (a
    /// job run's is the hash of its canonical encoding, so an equal job
    /// whose maps iterate in another order is the same input), and
    /// `on_terminated` deciding what a run id that is not active but has a
    /// terminal record means: a new run ([`OnTerminated::Restart`]), or the
    /// recorded run answering the submission ([`OnTerminated::Keep`]:
    /// `newly_submitted: false`, no job id; [`Error::InputMismatch`] for
    /// another input). The terminal record is read after the run record is
    /// found absent, in the same retry loop as the commit, so a run that
    /// terminates while it is submitted again is not started a second time.
    /// `drawn`, for a `spec` without a run id, is the id the runtime gives
    /// the run, drawn by the caller from [`new_run_id`](Self::new_run_id)
    /// (so it can watch the run before its submission commits); `None`
    /// draws one here. A `spec` that names its run id ignores it.
    pub(crate) async fn submit_hashed(
        &self,
        spec: RunSpec,
        input_hash: Vec<u8>,
        on_terminated: OnTerminated,
        drawn: Option<RunId>,
    ) -> Result<SubmitOutcome> {
        self.check_effects(&spec)?;
        self.submit_checked(spec, input_hash, on_terminated, drawn)
            .await
    }

    /// The submission of an inbox command: `spec` (already validated) with
    /// `record` (the command's record, under the reserved prefix) committed
    /// in the submission's transaction; nothing is committed for a
    /// duplicate (`newly_submitted: false`).
    pub(super) async fn submit_recorded(
        &self,
        mut spec: RunSpec,
        record: SettlementEffects,
    ) -> Result<SubmitOutcome> {
        self.check_effects(&spec)?;
        let input_hash = sha256(&spec.input).to_vec();
        crate::run::compose::merge_effects(&mut spec.effects, record);
        self.submit_checked(spec, input_hash, OnTerminated::Restart, None)
            .await
    }

    /// Refuse what no caller's submission may carry (see
    /// [`check_submission`](Self::check_submission) and
    /// [`check_enqueue`]).
    fn check_effects(&self, spec: &RunSpec) -> Result<()> {
        Self::check_submission(&spec.options, &spec.effects)?;
        for request in &spec.effects.enqueues {
            check_enqueue(request, Some(&self.queue_name))?;
        }
        Ok(())
    }

    /// Whether the submission of `spec` joins the group commit of fresh
    /// submissions (a runtime-drawn run id, no concurrency key, nothing of
    /// the caller's riding along): if so, nothing of it awaits before the
    /// batch's task has it, and the callers run it in their own task (see
    /// [`detached_unless_handed_over`](crate::run::commit::detached_unless_handed_over)).
    /// The first attempt of [`submit_checked`](Self::submit_checked) takes
    /// the group commit under exactly these conditions.
    pub(crate) fn joins_group_commit(spec: &RunSpec) -> bool {
        spec.run_id.is_none()
            && spec.options.concurrency_key.is_none()
            && Self::carries_nothing(&spec.effects)
    }

    /// Whether `effects`, the caller's, are empty.
    fn carries_nothing(effects: &SettlementEffects) -> bool {
        effects.enqueues.is_empty()
            && effects.kv_writes.is_empty()
            && effects.kv_deletes.is_empty()
            && effects.expiry_entries.is_empty()
    }

    /// [`submit_hashed`](Self::submit_hashed) once `spec` is checked.
    async fn submit_checked(
        &self,
        spec: RunSpec,
        input_hash: Vec<u8>,
        on_terminated: OnTerminated,
        drawn: Option<RunId>,
    ) -> Result<SubmitOutcome> {
        let RunSpec {
            run_id,
            input,
            options,
            effects: user_effects,
        } = spec;
        let job_key = match &on_terminated {
            OnTerminated::Keep(key) => Some(key.as_str()),
            OnTerminated::Restart => None,
        };
        // A fresh ULID names no recorded run: its first attempt skips the
        // reads (the compare-and-commit below still guards the record).
        let mut fresh_id = run_id.is_none();
        let batchable = Self::carries_nothing(&user_effects);
        // Generated before the first await: submissions get ids in the
        // order they were made.
        let run_id = run_id.or(drawn).unwrap_or_else(|| self.new_run_id());
        // The compare-and-commit guard: the run's record must still be
        // absent.
        let guard_key = run_kv_key(&run_id);

        for _ in 0..SUBMIT_RACE_RETRIES {
            let fresh = std::mem::take(&mut fresh_id);
            if !fresh {
                if let Some(existing) = self.view.run_record(&run_id).await? {
                    return self.duplicate(&run_id, &existing, &input_hash).await;
                }
                let termination = self.view.terminal_record(&run_id).await?;
                // A plain run under a member's run id would overwrite the
                // member's terminal and result records.
                if let Some(member) = termination.as_ref().and_then(|t| t.member.as_ref()) {
                    return Err(Error::GroupMemberRunId {
                        run_id,
                        group_id: member.group_id.clone(),
                        key: member.key.clone(),
                    });
                }
                if matches!(on_terminated, OnTerminated::Keep(_))
                    && let Some(termination) = termination
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
            }
            // A keyed run: the key's lock, held until the commit, and its
            // admission (see `engine::keys`).
            let slot = self.key_slot(&options).await?;
            let (mut effects, job_id, record) = self.submission_effects(
                &run_id,
                input.clone(),
                &input_hash,
                &options,
                job_key.map_or(SubmittedAs::Plain, SubmittedAs::KeyedJob),
                &user_effects,
            )?;
            if let Some(slot) = &slot {
                self.keyed_submission(slot, &run_id, &job_id, &mut effects)?;
            }
            // A fresh id with nothing of the caller's riding along joins the
            // group commit; the rest compare-and-commit on the run record.
            let committed = if fresh && batchable && slot.is_none() {
                // The worker here will claim step 0 soon: it finds the
                // record in the claim path's cache instead of reading it
                // back. The ticket is taken before the commit, so a
                // cancellation that changes the record after the commit
                // (or is changing it) keeps it out (see `record_cache`).
                let ticket = (options.run_at.is_none() && self.runs_worker())
                    .then(|| self.run_records.ticket(&run_id));
                match self.submit_batcher.commit(effects).await? {
                    Batched::Committed(results) => {
                        if let Some(ticket) = ticket {
                            self.run_records.fill(
                                ticket,
                                &run_id,
                                &job_id,
                                std::sync::Arc::new(record),
                            );
                        }
                        Some(results)
                    }
                    // Unknown whether it committed: look, then submit again.
                    Batched::Abandoned => continue,
                }
            } else {
                self.commits
                    .compare_commit(&guard_key, None, effects)
                    .await?
            };
            match committed {
                Some(results) => {
                    #[cfg(feature = "metrics")]
                    crate::telemetry::metrics::run_submitted(
                        &self.queue_name,
                        self.workflow_name_of(&input).as_deref(),
                    );
                    return self.submitted(run_id, job_id, &results).await;
                }
                // Another submission of this run id committed first.
                None => continue,
            }
        }
        Err(Error::InconsistentRunState(run_id))
    }

    /// The submission of a schedule's tick: `spec` (its run id given) with
    /// `extra` (the schedule's advanced record, under the reserved prefix)
    /// in one transaction, committed only while the KV key `guard` holds
    /// `expected` (the schedule record as read). `Ok(None)` when it did
    /// not: nothing was committed. The caller has found the run id free
    /// (no run record, no terminal record).
    ///
    /// # Errors
    /// As [`submit`](Self::submit)'s checks; storage errors.
    pub(crate) async fn submit_guarded(
        &self,
        spec: RunSpec,
        guard: &[u8],
        expected: &[u8],
        extra: SettlementEffects,
    ) -> Result<Option<SubmitOutcome>> {
        self.check_effects(&spec)?;
        let input_hash = sha256(&spec.input).to_vec();
        let run_id = spec.run_id.clone().unwrap_or_else(|| self.new_run_id());
        #[cfg(feature = "metrics")]
        let workflow = self.workflow_name_of(&spec.input);
        let slot = self.key_slot(&spec.options).await?;
        let (mut effects, job_id, _) = self.submission_effects(
            &run_id,
            spec.input,
            &input_hash,
            &spec.options,
            SubmittedAs::Plain,
            &spec.effects,
        )?;
        if let Some(slot) = &slot {
            self.keyed_submission(slot, &run_id, &job_id, &mut effects)?;
        }
        crate::run::compose::merge_effects(&mut effects, extra);
        let Some(results) = self
            .commits
            .compare_commit(guard, Some(expected), effects)
            .await?
        else {
            return Ok(None);
        };
        #[cfg(feature = "metrics")]
        crate::telemetry::metrics::run_submitted(&self.queue_name, workflow.as_deref());
        self.submitted(run_id, job_id, &results).await.map(Some)
    }

    /// Reject what no submission may carry: a reserved header name in
    /// `options` ([`Error::ReservedHeaderInSubmit`]), options past their
    /// limits ([`Error::InvalidRunOptions`]) or a KV key under the
    /// reserved prefix in `user_effects`.
    pub(crate) fn check_submission(
        options: &RunOptions,
        user_effects: &SettlementEffects,
    ) -> Result<()> {
        options.check_limits()?;
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
    /// then `user_effects`. With the step-0 job id. A keyed job's
    /// idempotency key is carried (cut) in [`HEADER_JOB_KEY`]. With the
    /// run record they write (for the claim path's cache).
    ///
    /// # Errors
    /// [`Error::InvalidCode`] when the runner's code breaks a patch limit
    /// (its patches could not be recorded).
    pub(super) fn submission_effects(
        &self,
        run_id: &RunId,
        input: Vec<u8>,
        input_hash: &[u8],
        options: &RunOptions,
        submitted_as: SubmittedAs<'_>,
        user_effects: &SettlementEffects,
    ) -> Result<(SettlementEffects, String, DurableRunRecord)> {
        let (membership, job_key) = match submitted_as {
            SubmittedAs::Plain => (None, None),
            SubmittedAs::Member(membership) => (Some(membership), None),
            SubmittedAs::KeyedJob(key) => (None, Some(key)),
        };
        // A code whose patches could not be recorded submits nothing.
        self.ops.code.check()?;
        let workflow = self.workflow_name_of(&input);
        // The submitting code's version and patches: the run's for good.
        let code = self.ops.code.of(workflow.as_deref());
        let mut record = DurableRunRecord {
            input_hash: input_hash.to_vec(),
            submitted_at_ms: self.now_ms(),
            cancel_requested: false,
            cancel_delivered_to: None,
            execution: None,
            workflow,
            group: membership.map(|m| m.group_id.clone()),
            cancel_reason: None,
            forked_from: None,
            concurrency: None,
            version: code.version.clone(),
            patches: code.patches.iter().cloned().collect(),
            parent: None,
        };
        #[allow(unused_mut)]
        let mut reserved_headers = membership
            .map(Membership::reserved_headers)
            .unwrap_or_default();
        #[cfg(feature = "opentelemetry")]
        reserved_headers.extend(crate::telemetry::otel::submit_headers());
        if let Some(key) = job_key {
            reserved_headers.push((
                HEADER_JOB_KEY,
                crate::history::cut_to(key, MAX_JOB_KEY_HEADER_LEN),
            ));
        }
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
                    durable::encode(&pending_member(membership, run_id)),
                )
                .kv_put(
                    group_submissions_kv_key(&membership.group_id),
                    crate::coordination::members::new_counter_value(),
                );
        }
        Ok((effects, job_id, record))
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
                history: None,
            };
            self.commits
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

    /// The answer to a plain submission of an active run: a duplicate
    /// (`newly_submitted == false`, the current step's job) when the input
    /// is the run's, as 0.13 answers it also for an active group member's
    /// run (the seed's group tests submit a re-run member's id plain and
    /// get the duplicate; nothing is committed, so the member stays the
    /// group's).
    ///
    /// # Errors
    /// [`Error::GroupMemberRunId`] for a member's run with another input
    /// (the id is the group's, whatever the input),
    /// [`Error::InputMismatch`] for another input of any other run.
    async fn duplicate(
        &self,
        run_id: &RunId,
        existing: &DurableRunRecord,
        input_hash: &[u8],
    ) -> Result<SubmitOutcome> {
        let current = self.view.current_job(run_id).await?;
        if existing.input_hash != input_hash {
            match &current {
                Some((_, job)) => self.check_same_membership(run_id, &job.headers, None)?,
                // Ended since the record was read: a member's end names its
                // group and key on its terminal record.
                None if existing.group.is_some() => {
                    if let Some(member) = self
                        .view
                        .terminal_record(run_id)
                        .await?
                        .and_then(|termination| termination.member)
                    {
                        return Err(Error::GroupMemberRunId {
                            run_id: run_id.clone(),
                            group_id: member.group_id,
                            key: member.key,
                        });
                    }
                }
                None => {}
            }
            return Err(Error::InputMismatch(run_id.clone()));
        }
        Ok(SubmitOutcome {
            run_id: run_id.clone(),
            newly_submitted: false,
            job_id: current
                .map(|(pointer, _)| pointer.job_id)
                .unwrap_or_default(),
        })
    }

    /// Refuse a submission (of a group member when `membership` is given)
    /// that would alias the active run `run_id`, whose current step job
    /// carries `headers`, of another kind: a member's run submitted plain,
    /// or a run outside the group submitted as the member.
    ///
    /// # Errors
    /// [`Error::GroupMemberRunId`], [`Error::MemberRunIdTaken`].
    pub(super) fn check_same_membership(
        &self,
        run_id: &RunId,
        headers: &std::collections::HashMap<String, String>,
        membership: Option<&Membership>,
    ) -> Result<()> {
        let held_by = Membership::from_headers(headers)?;
        match (membership, held_by) {
            (None, Some(member)) => Err(Error::GroupMemberRunId {
                run_id: run_id.clone(),
                group_id: member.group_id,
                key: member.key,
            }),
            (Some(wanted), held_by) if held_by.as_ref() != Some(wanted) => {
                Err(Error::MemberRunIdTaken {
                    group_id: wanted.group_id.clone(),
                    key: wanted.key.clone(),
                    run_id: run_id.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}
