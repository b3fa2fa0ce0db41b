//! Recording a worker's attempt: the history entry of a claimed step's
//! settlement, derived from the settlement itself (what it commits is what
//! the entry says) and committed with it.

use tracing::warn;

use crate::history::record::{DurableAttempt, DurableAttemptOutcome, Entry, earlier_attempts};
use crate::hooks::terminal::TerminalHook;
use crate::model::{StepErrorKind, TerminalStatus, Trigger};
use crate::run::core::RuntimeCore;
use crate::run::settle::{ClaimedStep, SettleKind, Settlement};
use crate::runner::StepRunner;
use crate::runtime::RuntimeInner;
use crate::store::durable::{self, DurableErrorKind, DurableRunRecord, DurableTermination};
use crate::store::keys::{HEADER_REQUEUED, outcome_kv_key};

impl<R: StepRunner, H: TerminalHook> RuntimeInner<R, H> {
    /// The name of the claimed step: the runner's, else the payload's
    /// (`#[workflow]` step, job name), else the runner's label.
    pub(crate) fn step_name(&self, claimed: &ClaimedStep<'_>) -> String {
        let payload = &claimed.job.payload;
        self.runner
            .step_name(claimed.step_number, payload)
            .or_else(|| self.core.ops.naming.step_of(payload))
            .unwrap_or_else(|| self.core.ops.runner_label.clone())
    }
}

impl RuntimeCore {
    /// Add the history entry of `settlement` (the settlement of `claimed`,
    /// a step of the run whose record is `run`) to it. A settlement that
    /// ends nothing it can name (a dead letter of a malformed step, which
    /// reconciliation records) adds none. A failed read of the step's
    /// record skips the entry: history never holds a settlement up.
    pub(crate) async fn record_attempt(
        &self,
        claimed: &ClaimedStep<'_>,
        run: &DurableRunRecord,
        settlement: &mut Settlement,
        name: &(dyn Fn() -> String + Sync),
    ) {
        let Some(outcome) = attempt_outcome(settlement, run) else {
            return;
        };
        let job = claimed.job;
        let fresh = job.attempts <= 1 && !job.headers.contains_key(HEADER_REQUEUED);
        // The job's earlier attempts (retries, lost leases) are in the
        // queue's attempt history, committed with each; they join the step's
        // record with this settlement.
        let mut attempts = Vec::new();
        if job.attempts > 1 {
            match self.queue.view().attempt_history(&job.id).await {
                Ok(entries) => attempts = earlier_attempts(&entries, job.attempts),
                Err(err) => {
                    warn!(run_id = %claimed.run_id, job_id = %job.id, "earlier attempts left out of the history: {err}");
                }
            }
        }
        attempts.push(DurableAttempt {
            attempt: job.attempts,
            claimed_at_ms: job.claimed_at,
            settled_at_ms: self.now_ms(),
            outcome,
        });
        let entry = Entry {
            run_id: &claimed.run_id,
            step: claimed.step_number,
            execution: run.execution.as_deref(),
            name,
            attempts,
        };
        match self.history_effects(entry, fresh).await {
            Ok(effects) => settlement.history = effects,
            Err(err) => {
                warn!(run_id = %claimed.run_id, step = claimed.step_number, "history entry skipped: {err}");
            }
        }
    }
}

/// What `settlement` commits, as a history outcome.
fn attempt_outcome(
    settlement: &Settlement,
    run: &DurableRunRecord,
) -> Option<DurableAttemptOutcome> {
    if let Some((run_id, end)) = &settlement.ended {
        let termination = &end.termination;
        // The reason of a cancellation from outside, from the terminal
        // record the settlement commits (the request may be newer than the
        // run record the step was claimed with).
        let committed_reason = match &settlement.kind {
            SettleKind::Ack(effects) | SettleKind::Fail { effects, .. } => effects
                .kv_writes
                .get(&outcome_kv_key(run_id))
                .and_then(|bytes| durable::decode::<DurableTermination>(bytes).ok())
                .and_then(|t| t.cancel_reason),
            SettleKind::Retry(_) => None,
        };
        let error = termination.error.as_deref().unwrap_or_default();
        return Some(match termination.status {
            TerminalStatus::Succeeded => DurableAttemptOutcome::Succeeded,
            TerminalStatus::Failed => DurableAttemptOutcome::failed(
                DurableErrorKind::from(termination.error_kind.unwrap_or(StepErrorKind::Permanent)),
                error,
            ),
            // A runner's reason, else the reason given from outside.
            TerminalStatus::Cancelled => DurableAttemptOutcome::cancelled(
                termination
                    .error
                    .as_deref()
                    .or(committed_reason.as_deref())
                    .or(run.cancel_reason.as_deref()),
            ),
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
        SettleKind::Retry(error) => Some(DurableAttemptOutcome::retried(error)),
        SettleKind::Fail { .. } => None,
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl RuntimeCore {
    /// The history entry of step `job` of the run whose record is `run`,
    /// ended outside the worker with `outcome` (a cancelled waiting step, a
    /// dead letter reconciled), appended to the step's record; empty when
    /// the step's record cannot be read (logged) or history is off.
    pub(crate) async fn detached_history(
        &self,
        run_id: &crate::store::keys::RunId,
        step: u32,
        job: &taquba::JobRecord,
        run: &DurableRunRecord,
        outcome: DurableAttemptOutcome,
        claimed_at_ms: Option<u64>,
    ) -> taquba::SettlementEffects {
        let name = || {
            self.ops
                .naming
                .step_of(&job.payload)
                .unwrap_or_else(|| self.ops.runner_label.clone())
        };
        let entry = Entry {
            run_id,
            step,
            execution: run.execution.as_deref(),
            name: &name,
            attempts: vec![DurableAttempt {
                attempt: job.attempts,
                claimed_at_ms,
                settled_at_ms: self.now_ms(),
                outcome,
            }],
        };
        match self.history_effects(entry, false).await {
            Ok(effects) => effects,
            Err(err) => {
                warn!(run_id = %run_id, step, "history entry skipped: {err}");
                taquba::SettlementEffects::default()
            }
        }
    }
}
