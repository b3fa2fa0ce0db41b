//! Recording an attempt: the history entry of a settlement, derived from
//! what the settlement commits, appended to the run's pending entries and
//! written into the record the settlement writes anyway (the next step's
//! pointer, or the terminal record), with a chunk when the pending entries
//! fill one.

use std::borrow::Cow;

use taquba::{JobRecord, SettlementEffects};
use tracing::warn;

use crate::engine::RuntimeCore;
use crate::engine::inner::RuntimeInner;
use crate::engine::settle::{ClaimedStep, SettleKind, Settlement};
use crate::error::{Error, Result};
use crate::history::record::{
    DurableAttempt, DurableAttemptOutcome, DurableStepEntry, PendingHistory, RecordedInput,
    earlier_attempts,
};
use crate::hooks::terminal::TerminalHook;
use crate::model::{StepErrorKind, TerminalStatus, Trigger};
use crate::run::compose::merge_effects;
use crate::runner::StepRunner;
use crate::store::durable::{
    self, DurableCurrentStep, DurableErrorKind, DurableRunRecord, DurableTermination,
};
use crate::store::keys::{HEADER_REQUEUED, RunId, outcome_kv_key, step_kv_key};

impl<R: StepRunner, H: TerminalHook> RuntimeInner<R, H> {
    /// The name of the claimed step: the runner's, else the payload's
    /// (`#[workflow]` step, job name), else the runner's label.
    pub(super) fn step_name(&self, claimed: &ClaimedStep<'_>) -> Cow<'_, str> {
        self.name_of_step(claimed.step_number, &claimed.job.payload)
    }

    /// The name of step `step_number` with `payload` (see
    /// [`step_name`](Self::step_name)).
    pub(super) fn name_of_step(&self, step_number: u32, payload: &[u8]) -> Cow<'_, str> {
        match self
            .runner
            .step_name(step_number, payload)
            .or_else(|| self.core.ops.naming.step_of(payload))
        {
            Some(name) => Cow::Owned(name),
            None => Cow::Borrowed(&self.core.ops.runner_label),
        }
    }
}

impl<R: StepRunner, H: TerminalHook> RuntimeInner<R, H> {
    /// The workflow and step names of step job `job`, for its span: the
    /// workflow (or job) its payload names, else the runner's label; the
    /// step's name.
    pub(crate) fn span_names(&self, job: &JobRecord) -> (Option<String>, String) {
        let step_number = job
            .headers
            .get(crate::store::keys::HEADER_STEP)
            .and_then(|step| step.parse().ok())
            .unwrap_or(0);
        let workflow = self
            .core
            .ops
            .naming
            .workflow_of(&job.payload)
            .unwrap_or_else(|| self.core.ops.runner_label.clone());
        let step = self.name_of_step(step_number, &job.payload).into_owned();
        (Some(workflow), step)
    }
}

/// Where a settlement's entry is written.
enum Target {
    /// The terminal record of the run it ends.
    Terminal,
    /// The pointer to the run's next step.
    Pointer,
}

impl RuntimeCore {
    /// Add the history entry of `settlement` (the settlement of `claimed`,
    /// a step of the run whose record is `run`) to what it commits. A retry
    /// adds nothing (the queue's attempt history records it, and the step's
    /// entry takes it in when the step settles), nor does a dead letter that
    /// ends no run (reconciliation records it). When the entries pending
    /// since the last chunk cannot be read, the settlement becomes a retry:
    /// committing it would drop them.
    pub(super) async fn record_attempt<'n>(
        &self,
        claimed: &ClaimedStep<'_>,
        run: &DurableRunRecord,
        settlement: &mut Settlement,
        name: &(dyn Fn() -> Cow<'n, str> + Sync),
    ) {
        if self.ops.history_limit == 0 {
            return;
        }
        let Some(outcome) = attempt_outcome(settlement, run) else {
            return;
        };
        let run_id = &claimed.run_id;
        let Some(target) = target_of(settlement) else {
            return;
        };
        let job = claimed.job;
        let mut pending = match self.pending_history(run_id, claimed).await {
            Ok(pending) => pending,
            Err(err) => {
                warn!(run_id = %run_id, job_id = %job.id, "the run's history cannot be read; the step is retried: {err}");
                *settlement = Settlement::of(SettleKind::Retry(format!(
                    "the run's history cannot be read: {err}"
                )));
                return;
            }
        };
        let this = DurableAttempt {
            attempt: job.attempts,
            claimed_at_ms: job.claimed_at,
            settled_at_ms: self.now_ms(),
            outcome,
        };
        let name = name();
        let name = crate::history::cut_cow(&name, crate::history::naming::MAX_NAME_LEN);
        // The step's input rides on its entry (what a fork starts from).
        let input = RecordedInput::of(job, self.ops.step_input_limit);
        // So does the signal that woke it: the two share the limit, so an
        // entry keeps at most the limit of input bytes.
        let signal = claimed
            .signal
            .get()
            .map(Vec::as_slice)
            .filter(|signal| input.keeps_signal(signal, self.ops.step_input_limit));
        // The settling code's version, kept when it is not the run's start.
        let version = self
            .ops
            .code
            .of(run.workflow.as_deref())
            .version
            .as_deref()
            .filter(|version| Some(*version) != run.version.as_deref());
        if job.attempts > 1 {
            // The job's earlier attempts (retries, lost leases) are in the
            // queue's attempt history, committed with each.
            let mut attempts = match self.queue.view().attempt_history(&job.id).await {
                Ok(entries) => earlier_attempts(&entries, job.attempts),
                Err(err) => {
                    warn!(run_id = %run_id, job_id = %job.id, "earlier attempts left out of the history: {err}");
                    Vec::new()
                }
            };
            attempts.push(this);
            pending.push_step_signalled(
                claimed.step_number,
                &name,
                &attempts,
                0,
                input,
                version,
                signal,
            );
        } else {
            pending.push_step_signalled(
                claimed.step_number,
                &name,
                std::slice::from_ref(&this),
                0,
                input,
                version,
                signal,
            );
        }
        let effects = match &mut settlement.kind {
            SettleKind::Ack(effects) | SettleKind::Fail { effects, .. } => effects,
            SettleKind::Retry(_) => return,
        };
        match target {
            // A terminal target has its ending (see `target_of`).
            Target::Terminal => {
                if let Some(ending) = settlement.ended.as_mut() {
                    set_terminal_history(effects, run_id, &mut ending.record, pending);
                }
            }
            Target::Pointer => {
                let chunk =
                    pending.flush_if_full(run_id, run.execution.as_deref(), self.ops.history_limit);
                merge_effects(effects, chunk);
                let next = claimed.step_number.saturating_add(1);
                if let Some(job_id) = write_pointer_history(effects, run_id, next, &pending) {
                    // Kept before the commit: the next step can be claimed
                    // as soon as it commits, and its job exists only if the
                    // pointer holding these entries committed.
                    self.history_cache.put(job_id.clone(), pending);
                    settlement.history = Some(job_id);
                }
            }
        }
    }

    /// The entries pending on the pointer naming the claimed job (from the
    /// cache, or read back; none for a step 0 the submission's pointer
    /// names).
    async fn pending_history(
        &self,
        run_id: &RunId,
        claimed: &ClaimedStep<'_>,
    ) -> Result<PendingHistory> {
        let job = claimed.job;
        if let Some(pending) = self.history_cache.take(&job.id) {
            return Ok(pending);
        }
        if claimed.step_number == 0 && !job.headers.contains_key(HEADER_REQUEUED) {
            return Ok(PendingHistory::default());
        }
        let pointer = match self.queue.view().kv_get(&step_kv_key(run_id)).await {
            Ok(bytes) => bytes.and_then(|bytes| {
                durable::decode_or_absent::<DurableCurrentStep>(&bytes, "step pointer", run_id)
            }),
            Err(err) => return Err(Error::from(err)),
        };
        Ok(pointer
            .filter(|pointer| pointer.job_id == job.id)
            .and_then(|pointer| pointer.history)
            .unwrap_or_default())
    }

    /// The history effects of step `step` of the run whose pointer is
    /// `pointer` (naming `job`) ending outside the worker, unclaimed, with
    /// `outcome` (a cancelled waiting step): the entry is appended to the
    /// pending ones in the terminal record `effects` writes, whose fields
    /// are `record` (its ending's).
    pub(super) fn record_detached(
        &self,
        effects: &mut SettlementEffects,
        record: &mut DurableTermination,
        run_id: &RunId,
        pointer: &DurableCurrentStep,
        job: &JobRecord,
        outcome: DurableAttemptOutcome,
    ) {
        let attempt = DurableAttempt {
            attempt: job.attempts,
            claimed_at_ms: None,
            settled_at_ms: self.now_ms(),
            outcome,
        };
        self.record_detached_attempts(effects, record, run_id, pointer, job, vec![attempt]);
    }

    /// [`record_detached`](Self::record_detached) with the step's entry
    /// holding `attempts` (a reconciled dead letter's, with the attempts
    /// before it).
    pub(super) fn record_detached_attempts(
        &self,
        effects: &mut SettlementEffects,
        record: &mut DurableTermination,
        run_id: &RunId,
        pointer: &DurableCurrentStep,
        job: &JobRecord,
        attempts: Vec<DurableAttempt>,
    ) {
        // The cached copy of this pointer is of no more use.
        let cached = self.history_cache.take(&job.id);
        if self.ops.history_limit == 0 {
            return;
        }
        let mut pending = pointer.history.clone().or(cached).unwrap_or_default();
        pending.push(
            &DurableStepEntry::new(pointer.step_number, self.detached_step_name(job), attempts)
                .with_input(RecordedInput::of(job, self.ops.step_input_limit)),
        );
        set_terminal_history(effects, run_id, record, pending);
    }

    /// The name of `job`'s step read outside a runner: the payload's, else
    /// the runner's label.
    pub(super) fn detached_step_name(&self, job: &JobRecord) -> String {
        let name = self
            .ops
            .naming
            .step_of(&job.payload)
            .unwrap_or_else(|| self.ops.runner_label.clone());
        crate::history::cut_to(&name, crate::history::naming::MAX_NAME_LEN)
    }
}

/// Where the entry of `settlement` goes: the terminal record of the run it
/// ends, or the pointer to the step it enqueues.
fn target_of(settlement: &Settlement) -> Option<Target> {
    match (&settlement.kind, &settlement.ended, &settlement.next_step) {
        (SettleKind::Retry(_), _, _) => None,
        (_, Some(_), _) => Some(Target::Terminal),
        (SettleKind::Ack(_), None, Some(_)) => Some(Target::Pointer),
        _ => None,
    }
}

/// Put `pending` on the terminal record `effects` writes for `run_id`,
/// whose fields (its history entries aside) are `record`, the record its
/// ending carries: encoded once with the entries (not decoded back from
/// the written bytes), which are taken back out of `record` after, so it
/// stays the record the ending is told with.
fn set_terminal_history(
    effects: &mut SettlementEffects,
    run_id: &RunId,
    record: &mut DurableTermination,
    pending: PendingHistory,
) {
    let Some(bytes) = effects.kv_writes.get_mut(&outcome_kv_key(run_id)) else {
        return;
    };
    let earlier = record.history.replace(pending);
    let mut encoded = Vec::with_capacity(bytes.len().saturating_mul(2));
    durable::encode_into(&*record, &mut encoded);
    *bytes = encoded;
    record.history = earlier;
}

/// Rewrite the pointer `effects` writes for `run_id` (to step `step`) with
/// `pending`, reading only its job id; returns the job it names.
fn write_pointer_history(
    effects: &mut SettlementEffects,
    run_id: &RunId,
    step: u32,
    pending: &PendingHistory,
) -> Option<String> {
    let bytes = effects.kv_writes.get_mut(&step_kv_key(run_id))?;
    /// The job a pointer names, read in place.
    #[derive(serde::Deserialize)]
    struct PointerJob<'a> {
        #[serde(borrow)]
        job_id: &'a str,
    }
    let job_id = rmp_serde::from_slice::<PointerJob<'_>>(bytes)
        .ok()?
        .job_id
        .to_string();
    /// The pointer's fields, the history by reference.
    #[derive(serde::Serialize)]
    struct PointerOut<'a> {
        step_number: u32,
        job_id: &'a str,
        history: &'a PendingHistory,
    }
    let mut encoded = Vec::with_capacity(64 + pending.entries.len());
    durable::encode_into(
        &PointerOut {
            step_number: step,
            job_id: &job_id,
            history: pending,
        },
        &mut encoded,
    );
    *bytes = encoded;
    Some(job_id)
}

/// Put `pending` on the pointer `effects` writes for `run_id`; returns the
/// job it names.
pub(super) fn set_pointer_history(
    effects: &mut SettlementEffects,
    run_id: &RunId,
    pending: PendingHistory,
) -> Option<String> {
    let bytes = effects.kv_writes.get_mut(&step_kv_key(run_id))?;
    let mut pointer = durable::decode::<DurableCurrentStep>(bytes).ok()?;
    let mut encoded = Vec::with_capacity(64 + pending.entries.len());
    pointer.history = Some(pending);
    durable::encode_into(&pointer, &mut encoded);
    *bytes = encoded;
    Some(pointer.job_id)
}

/// What `settlement` commits, as a history outcome.
fn attempt_outcome(
    settlement: &Settlement,
    run: &DurableRunRecord,
) -> Option<DurableAttemptOutcome> {
    if let Some(ending) = &settlement.ended {
        let (run_id, termination) = (&ending.run_id, &ending.end.termination);
        let error = termination.error.as_deref().unwrap_or_default();
        // The reason of a cancellation from outside, from the terminal
        // record the settlement commits (the request may be newer than the
        // run record the step was claimed with). Decoded for a cancellation
        // only: no other outcome reads it.
        let committed_reason = || match &settlement.kind {
            SettleKind::Ack(effects) | SettleKind::Fail { effects, .. } => effects
                .kv_writes
                .get(&outcome_kv_key(run_id))
                .and_then(|bytes| durable::decode::<DurableTermination>(bytes).ok())
                .and_then(|t| t.cancel_reason),
            SettleKind::Retry(_) => None,
        };
        return Some(match termination.status {
            TerminalStatus::Succeeded => DurableAttemptOutcome::Succeeded,
            TerminalStatus::Failed => DurableAttemptOutcome::failed(
                DurableErrorKind::from(termination.error_kind.unwrap_or(StepErrorKind::Permanent)),
                error,
            ),
            // A runner's reason, else the reason given from outside.
            TerminalStatus::Cancelled => {
                let committed = match termination.error {
                    Some(_) => None,
                    None => committed_reason(),
                };
                DurableAttemptOutcome::cancelled(
                    termination
                        .error
                        .as_deref()
                        .or(committed.as_deref())
                        .or(run.cancel_reason.as_deref()),
                )
            }
        });
    }
    match &settlement.kind {
        SettleKind::Ack(_) => settlement.continued.as_ref().map(|trigger| match trigger {
            Trigger::Immediate => DurableAttemptOutcome::continued(None, None),
            Trigger::After(delay) => DurableAttemptOutcome::continued(Some(millis(*delay)), None),
            Trigger::OnSignal {
                correlation_key,
                timeout,
            } => DurableAttemptOutcome::continued(
                None,
                Some((correlation_key.as_str(), millis(*timeout))),
            ),
        }),
        SettleKind::Retry(_) | SettleKind::Fail { .. } => None,
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use taquba::{EnqueueOptions, EnqueueRequest};

    use super::*;
    use crate::store::keys::step_dedup_key;

    #[test]
    fn a_pointer_rewritten_with_history_decodes_as_a_pointer() {
        let run_id = RunId::new("r").unwrap();
        let pointer = DurableCurrentStep {
            step_number: 4,
            job_id: "j4".into(),
            history: None,
        };
        let mut effects = SettlementEffects::default()
            .enqueue(EnqueueRequest {
                queue: "q".into(),
                payload: vec![],
                options: EnqueueOptions::default()
                    .id_override("j4".to_string())
                    .dedup_key(step_dedup_key(&run_id, 4)),
            })
            .kv_put(step_kv_key(&run_id), durable::encode(&pointer));
        let mut pending = PendingHistory::default();
        pending.push(&DurableStepEntry::new(3, "s".into(), Vec::new()));
        let job = write_pointer_history(&mut effects, &run_id, 4, &pending);
        assert_eq!(job.as_deref(), Some("j4"));
        let written: DurableCurrentStep =
            durable::decode(&effects.kv_writes[&step_kv_key(&run_id)]).unwrap();
        assert_eq!(
            written,
            DurableCurrentStep {
                history: Some(pending),
                ..pointer
            }
        );
    }

    #[test]
    fn a_terminal_record_is_written_with_its_entries_and_its_ending_keeps_none() {
        let run_id = RunId::new("r").unwrap();
        let mut record = crate::store::durable::tests::full_termination();
        let mut effects = SettlementEffects::default()
            .kv_put(crate::store::keys::run_kv_key(&run_id), vec![1])
            .kv_put(outcome_kv_key(&run_id), durable::encode(&record));
        let mut pending = PendingHistory::default();
        pending.push(&DurableStepEntry::new(3, "s".into(), Vec::new()));
        set_terminal_history(&mut effects, &run_id, &mut record, pending.clone());
        let written: DurableTermination =
            durable::decode(&effects.kv_writes[&outcome_kv_key(&run_id)]).unwrap();
        assert_eq!(
            written,
            DurableTermination {
                history: Some(pending),
                ..crate::store::durable::tests::full_termination()
            }
        );
        assert_eq!(
            effects.kv_writes[&crate::store::keys::run_kv_key(&run_id)],
            vec![1]
        );
        // The record is left as its ending tells it: without the entries.
        assert_eq!(record, crate::store::durable::tests::full_termination());
    }
}
