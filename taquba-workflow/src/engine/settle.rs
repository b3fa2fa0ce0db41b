//! The worker path: a claimed job is identified ([`ClaimedStep`]), run
//! through the [`StepRunner`] (or its recorded outcome replayed) and turned
//! into a [`Settlement`]: the one queue transaction that acknowledges,
//! retries or dead-letters it together with the run's transition. A
//! notification job runs the [`TerminalHook`] instead.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;
use taquba::{Claim, JobRecord, LeaseHandle, SettlementEffects};
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit};
use tracing::{debug, warn};

use crate::coordination::children::ChildrenHandle;
use crate::coordination::members::Membership;
use crate::engine::inner::RuntimeInner;
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::hooks::guard::{self, panic_message};
use crate::hooks::terminal::TerminalHook;
use crate::model::{RunOutcome, TerminalStatus};
use crate::model::{StepError, StepErrorKind, StepOutcome, Trigger};
use crate::run::commit::Ending;
use crate::run::effects::{EffectsHandle, StagedKv, TerminalEffects};
use crate::run::inflight::InFlightGuard;
use crate::run::record_cache::Lookup;
use crate::runner::{Delivery, Step, StepRunner};
use crate::store::durable::{self, DurableRunOutcome, DurableRunRecord};
use crate::store::keys::user_headers;
use crate::store::keys::{HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, RunId};
use crate::store::kv::KvReadHandle;

/// The first pause before a run result record write is tried again.
const RECORD_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
/// The longest pause between two tries of a run result record write.
const RECORD_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

fn duration_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How a claimed job is settled.
pub(crate) enum SettleKind {
    /// Acknowledge with these effects.
    Ack(SettlementEffects),
    /// Report a transient failure while attempts remain: the job is retried
    /// with backoff and nothing else changes.
    Retry(String),
    /// A failure that ends the job: dead-letter at once (`permanent`) or
    /// through the attempts-exhausting nack, applying `effects` (the run's
    /// termination) with the dead letter.
    Fail {
        error: String,
        permanent: bool,
        effects: SettlementEffects,
    },
}

/// A settlement and what must be held until it commits.
pub(crate) struct Settlement {
    pub(crate) kind: SettleKind,
    /// The step's in-flight registration; released once the settlement
    /// finished, so a cancellation racing it waits for the outcome.
    pub(crate) inflight: Option<InFlightGuard>,
    /// The signal lock of a correlation key whose waiter this settlement
    /// registers.
    pub(crate) signal_lock: Option<OwnedMutexGuard<()>>,
    /// The run and step whose pointer the acknowledgement moves, to adopt
    /// an already pending job of that step on a dedup hit.
    pub(crate) next_step: Option<(RunId, u32)>,
    /// The run termination this settlement commits, reported once it did
    /// (see [`Committer::run`](crate::run::commit::Committer::run)). Boxed:
    /// only a run's last settlement has one, and the settlement is held
    /// (more than once) in every step's future.
    pub(crate) ended: Option<Box<Ending>>,
    /// The trigger of the next step, when the settlement continues the run.
    pub(crate) continued: Option<Trigger>,
    /// The job the pointer this settlement writes names, when the history
    /// entries that pointer carries are in the runtime's history cache.
    pub(crate) history: Option<String>,
}

impl Settlement {
    /// How this settlement settles its attempt, as the step's span records
    /// it: a terminal status, `continued`, `retried`, `failed` or
    /// `dead_lettered`, and the error, if any.
    pub(crate) fn span_outcome(&self) -> (&'static str, Option<&str>) {
        let ended = self.ended.as_ref().map(|ending| &ending.end.termination);
        match &self.kind {
            SettleKind::Ack(_) => match ended {
                Some(termination) => (termination.status.as_str(), termination.error.as_deref()),
                None => ("continued", None),
            },
            SettleKind::Retry(error) => ("retried", Some(error.as_str())),
            SettleKind::Fail { error, .. } => (
                match ended {
                    Some(_) => "failed",
                    None => "dead_lettered",
                },
                Some(error.as_str()),
            ),
        }
    }

    pub(crate) fn of(kind: SettleKind) -> Self {
        Self {
            kind,
            inflight: None,
            signal_lock: None,
            next_step: None,
            ended: None,
            continued: None,
            history: None,
        }
    }

    /// This settlement, reporting `ended` once it commits.
    pub(crate) fn ending(self, ended: Ending) -> Self {
        Self {
            ended: Some(Box::new(ended)),
            ..self
        }
    }

    fn failure(error: &StepError, effects: SettlementEffects) -> Self {
        Self::of(SettleKind::Fail {
            error: error.message.clone(),
            permanent: error.kind == StepErrorKind::Permanent,
            effects,
        })
    }

    /// The settlement of an error of the runtime itself (a store read
    /// failed, a record does not decode): storage errors retry, the rest
    /// dead-letter.
    fn infrastructure(err: Error) -> Self {
        let error = StepError::from(err);
        if error.kind == StepErrorKind::Permanent {
            Self::failure(&error, SettlementEffects::default())
        } else {
            Self::of(SettleKind::Retry(error.message))
        }
    }
}

/// A claimed step job as the worker identifies it from its reserved headers.
pub(super) struct ClaimedStep<'a> {
    pub(crate) run_id: RunId,
    pub(crate) step_number: u32,
    pub(crate) membership: Option<Membership>,
    /// The submitter's headers, without the reserved ones.
    pub(crate) headers: HashMap<String, String>,
    pub(crate) job: &'a JobRecord,
    /// The lease of this attempt's claim of `job`.
    pub(crate) lease: &'a LeaseHandle,
    /// The signal the step was woken with, once resolved: its history
    /// entry keeps it for a fork from the step.
    pub(crate) signal: std::sync::OnceLock<Vec<u8>>,
}

impl<'a> ClaimedStep<'a> {
    /// Identify the step; fails for a job without a valid run id or step
    /// header (a job the runtime did not enqueue).
    pub(crate) fn parse(job: &'a JobRecord, lease: &'a LeaseHandle) -> Result<Self> {
        let run_id = RunId::parse_ref(
            job.headers
                .get(HEADER_RUN_ID)
                .ok_or(Error::MissingHeader(HEADER_RUN_ID))?
                .as_str(),
        )?;
        let step = job
            .headers
            .get(HEADER_STEP)
            .ok_or(Error::MissingHeader(HEADER_STEP))?;
        let step_number = step.parse().map_err(|_| Error::InvalidStepHeader {
            header: HEADER_STEP,
            value: step.clone(),
        })?;
        Ok(Self {
            run_id,
            step_number,
            membership: Membership::from_headers(&job.headers)?,
            headers: user_headers(&job.headers),
            job,
            lease,
            signal: std::sync::OnceLock::new(),
        })
    }

    /// The options of the run's next step: this step's priority, attempt
    /// limit and membership carry over.
    pub(super) fn next_step_opts(&self) -> StepEnqueueOpts {
        #[allow(unused_mut)]
        let mut reserved_headers = self
            .membership
            .as_ref()
            .map(Membership::reserved_headers)
            .unwrap_or_default();
        #[cfg(feature = "opentelemetry")]
        reserved_headers.extend(crate::telemetry::otel::carried(&self.job.headers));
        StepEnqueueOpts {
            run_at: None,
            priority: Some(self.job.priority),
            max_attempts: Some(self.job.max_attempts),
            reserved_headers,
        }
    }

    fn outcome(
        &self,
        status: TerminalStatus,
        result: Option<Vec<u8>>,
        error: Option<String>,
    ) -> RunOutcome {
        RunOutcome {
            run_id: self.run_id.clone(),
            status,
            result,
            error,
            headers: self.headers.clone(),
            final_step: self.step_number,
        }
    }
}

impl RuntimeCore {
    /// Terminate the run of `claimed` with `outcome` from an acknowledging
    /// settlement: record the run result, then build the settlement. A
    /// failed record write retries the step.
    async fn terminate_recorded(
        &self,
        claimed: &ClaimedStep<'_>,
        outcome: RunOutcome,
        error_kind: Option<StepErrorKind>,
        run: &DurableRunRecord,
    ) -> Settlement {
        let termination = self.termination(
            &outcome,
            error_kind,
            run,
            &claimed.job.id,
            claimed.membership.as_ref(),
        );
        if let Err(err) = self
            .store_run_result_within_lease(claimed, &outcome, &termination)
            .await
        {
            return Settlement::infrastructure(err);
        }
        let (effects, ending) = self.terminate_effects(
            &outcome,
            termination,
            claimed.membership.as_ref(),
            claimed.job,
            true,
        );
        Settlement::of(SettleKind::Ack(effects)).ending(ending)
    }

    /// [`store_run_result`](Self::store_run_result) for the step job of
    /// `claimed`, tried again within its lease ([`within_lease`](Self::within_lease)).
    async fn store_run_result_within_lease(
        &self,
        claimed: &ClaimedStep<'_>,
        outcome: &RunOutcome,
        termination: &crate::store::durable::DurableTermination,
    ) -> Result<()> {
        self.within_lease(claimed, "write the run result record", || {
            self.store_run_result_of_claim(claimed, outcome, termination)
        })
        .await
    }

    /// [`store_run_result`](Self::store_run_result) for the step job of
    /// `claimed`, written only while the claim is still this attempt's: its
    /// lease is first made to last the write and the settlement (a fifth
    /// of the lease, at most 5 s, past now). An attempt whose claim was lost
    /// (its lease expired and the step was delivered again, or the job
    /// ended) writes nothing: the record in the run's memo may be a later
    /// attempt's, whose termination committed, and this attempt's
    /// settlement fails on the lost claim anyway.
    ///
    /// # Errors
    /// [`taquba::Error::ClaimLost`] (as [`Error::Queue`], permanent) for a
    /// lost claim; storage errors of the write.
    pub(super) async fn store_run_result_of_claim(
        &self,
        claimed: &ClaimedStep<'_>,
        outcome: &RunOutcome,
        termination: &crate::store::durable::DurableTermination,
    ) -> Result<()> {
        let margin = guard::settlement_margin(guard::claim_lease(&self.queue, &self.queue_name));
        match claimed.lease.ensure_at_least(margin) {
            // A cancellation requested while the step ran leaves the lease
            // as it is; the claim is still this attempt's until it expires.
            Ok(()) | Err(taquba::Error::CancelRequested) => {}
            Err(err) => {
                debug!(run_id = %claimed.run_id, job_id = %claimed.job.id, "the run result record is not written: {err}");
                return Err(err.into());
            }
        }
        self.store_run_result(outcome, termination).await
    }

    /// Run `op`, an object-store access of the step job of `claimed` (its
    /// run result record, its replay record), trying a failure again after
    /// 50 ms, doubling up to 2 s, while the step's lease leaves room for
    /// the settlement (a fifth of the lease, at most 5 s): a blip of the
    /// object store then neither spends one of the step's attempts nor
    /// calls its runner again. A step whose access still fails is retried
    /// as a whole (once its attempts are spent, its run fails). Permanent
    /// errors, a closed store and a lease too short for the next try end
    /// the tries; `what` names the access in the log.
    async fn within_lease<T, F, Fut>(
        &self,
        claimed: &ClaimedStep<'_>,
        what: &str,
        mut op: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut err = match op().await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        // The bounds are worked out only once a first try failed: the
        // step transition's happy path pays nothing for them.
        let lease = crate::hooks::guard::claim_lease(&self.queue, &self.queue_name);
        let margin = crate::hooks::guard::settlement_margin(lease);
        // A bound on the caller's clock too, for a queue clock that only a
        // test moves.
        let give_up = tokio::time::Instant::now()
            .checked_add(lease.saturating_sub(margin))
            .unwrap_or_else(tokio::time::Instant::now);
        let mut delay = RECORD_RETRY_FIRST;
        loop {
            let retry_until = self
                .queue
                .lease_expiry(&self.queue_name, &claimed.job.id)
                .map(|expiry| expiry.saturating_sub(duration_ms(margin)));
            let room = retry_until
                .is_some_and(|until| self.now_ms().saturating_add(duration_ms(delay)) < until)
                && tokio::time::Instant::now()
                    .checked_add(delay)
                    .is_some_and(|next| next < give_up);
            if err.is_permanent() || !room || self.store_closed.is_cancelled() {
                return Err(err);
            }
            warn!(run_id = %claimed.run_id, "failed to {what}, trying again in {delay:?}: {err}");
            tokio::select! {
                () = self.store_closed.cancelled() => return Err(err),
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(RECORD_RETRY_MAX);
            err = match op().await {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
        }
    }

    /// The settlement of a step error that ends the run (permanent, or
    /// transient on the last attempt): the run's `Failed` termination rides
    /// on the dead letter. The run result record is written first; a failed
    /// write is logged, the termination still commits.
    async fn terminating_failure(
        &self,
        claimed: &ClaimedStep<'_>,
        error: &StepError,
        run: &DurableRunRecord,
    ) -> Settlement {
        let outcome = claimed.outcome(TerminalStatus::Failed, None, Some(error.message.clone()));
        let termination = self.termination(
            &outcome,
            Some(error.kind),
            run,
            &claimed.job.id,
            claimed.membership.as_ref(),
        );
        let recorded = match self
            .store_run_result_of_claim(claimed, &outcome, &termination)
            .await
        {
            Ok(()) => true,
            Err(err) => {
                warn!(run_id = %claimed.run_id, "failed to write the run result record: {err}");
                false
            }
        };
        let (effects, ending) = self.terminate_effects(
            &outcome,
            termination,
            claimed.membership.as_ref(),
            claimed.job,
            recorded,
        );
        Settlement::failure(error, effects).ending(ending)
    }

    /// The effects that make `payload` the run's next step.
    pub(super) fn advance(
        &self,
        claimed: &ClaimedStep<'_>,
        payload: Vec<u8>,
        opts: StepEnqueueOpts,
    ) -> SettlementEffects {
        let next = claimed.step_number + 1;
        let step = self.prepare_step(&claimed.run_id, next, payload, &claimed.headers, opts);
        Self::step_effects(&claimed.run_id, next, step, SettlementEffects::default())
    }
}

impl<R: StepRunner, H: TerminalHook> RuntimeInner<R, H> {
    /// Process one claimed job into its settlement. `permit` is the runner
    /// slot, released as soon as the runner (or hook) returns.
    pub(crate) async fn process(
        &self,
        claim: &Claim,
        lease: &LeaseHandle,
        permit: OwnedSemaphorePermit,
    ) -> Settlement {
        let job = claim.job();
        if job.headers.contains_key(HEADER_TERMINAL) {
            return self.process_notification(job, lease, permit).await;
        }
        let claimed = match ClaimedStep::parse(job, lease) {
            Ok(claimed) => claimed,
            Err(err) => {
                warn!(job_id = %job.id, error = %err, "step job with malformed headers; dead-lettered");
                return Settlement::failure(
                    &StepError::permanent(err.to_string()),
                    SettlementEffects::default(),
                );
            }
        };
        let core = &self.core;
        // Register before reading the run record: a cancellation either
        // finds this registration or wrote the record before the read.
        let claim_cancel = lease.cancel_token().clone();
        let guard = core.inflight.begin(&claimed.run_id, claim_cancel.clone());
        let mut settlement = self
            .process_step(&claimed, lease, claim_cancel, &guard, permit)
            .await;
        settlement.inflight = Some(guard);
        settlement
    }

    async fn process_step(
        &self,
        claimed: &ClaimedStep<'_>,
        lease: &LeaseHandle,
        claim_cancel: tokio_util::sync::CancellationToken,
        guard: &InFlightGuard,
        permit: OwnedSemaphorePermit,
    ) -> Settlement {
        let core = &self.core;
        let run_id = &claimed.run_id;
        let step_number = claimed.step_number;
        let job = claimed.job;

        // Read after the in-flight registration (see `record_cache`).
        let record = match core.run_records.lookup(run_id, &job.id) {
            Lookup::Hit(record) => record,
            Lookup::Miss(ticket) => match core.view.run_record(run_id).await {
                Ok(Some(record)) => {
                    let record = Arc::new(record);
                    core.run_records
                        .fill(ticket, run_id, &job.id, record.clone());
                    record
                }
                Ok(None) => {
                    warn!(run_id = %run_id, step_number, job_id = %job.id, "step job of a run without a run record; dead-lettered");
                    return Settlement::infrastructure(Error::InconsistentRunState(run_id.clone()));
                }
                Err(err) => return Settlement::infrastructure(err),
            },
        };
        let mut settlement = self
            .process_recorded_step(claimed, &record, lease, claim_cancel, guard, permit)
            .await;
        let name = || self.step_name(claimed);
        core.record_attempt(claimed, &record, &mut settlement, &name)
            .await;
        settlement
    }

    /// [`process_step`](Self::process_step) once the run record is read.
    async fn process_recorded_step(
        &self,
        claimed: &ClaimedStep<'_>,
        record: &DurableRunRecord,
        lease: &LeaseHandle,
        claim_cancel: tokio_util::sync::CancellationToken,
        guard: &InFlightGuard,
        permit: OwnedSemaphorePermit,
    ) -> Settlement {
        let core = &self.core;
        let run_id = &claimed.run_id;
        let step_number = claimed.step_number;
        let job = claimed.job;
        #[allow(unused_mut)]
        let (signal, mut signal_deletes) =
            match core.resolve_step_signal(job, run_id, step_number).await {
                Ok(resolved) => resolved,
                Err(err) => return Settlement::infrastructure(err),
            };
        // A wait on a child: the child's end, also when no wake reached it.
        let signal = match core.child_wait_signal(job, signal).await {
            Ok((signal, deletes)) => {
                signal_deletes.extend(deletes);
                signal
            }
            Err(err) => return Settlement::infrastructure(err),
        };
        if let Some(signal) = &signal {
            let _ = claimed.signal.set(signal.clone());
        }
        #[cfg(feature = "opentelemetry")]
        signal_deletes.extend(crate::telemetry::otel::sender_cleanup(job));

        // A cancellation requested before this claim: settle as cancelled
        // without running.
        if record.cancel_requested {
            drop(permit);
            let _ = guard.decide();
            let outcome = claimed.outcome(TerminalStatus::Cancelled, None, None);
            let mut settlement = core
                .terminate_recorded(claimed, outcome, None, record)
                .await;
            if let SettleKind::Ack(effects) = &mut settlement.kind {
                effects.kv_deletes.extend(signal_deletes);
            }
            return settlement;
        }

        let effects_handle = EffectsHandle::default();
        let step = Step {
            delivery: Delivery {
                run_id: run_id.clone(),
                headers: claimed.headers.clone(),
                job_id: job.id.clone(),
                attempts: job.attempts,
                max_attempts: job.max_attempts,
                cancel_token: claim_cancel.child_token(),
                lease: lease.clone(),
                memo: core.memo_store.new_memo(run_id, step_number),
                run_memo: core.memo_store.new_run_memo(run_id),
                effects: effects_handle.clone(),
                kv: KvReadHandle::for_queue(core.queue.clone()),
                children: ChildrenHandle::for_run(run_id.clone()),
                code: crate::versioning::RunCode::recorded(
                    record.workflow.as_deref(),
                    record.version.as_deref(),
                    &record.patches,
                    core.ops.code.of(record.workflow.as_deref()).clone(),
                ),
            },
            step_number,
            payload: job.payload.clone(),
            signal,
        };

        let replayed = if core.step_output_replay {
            match core
                .within_lease(claimed, "read the step's replay record", || {
                    core.load_step_output(
                        run_id,
                        record.execution.as_deref(),
                        step_number,
                        &job.payload,
                    )
                })
                .await
            {
                Ok(found) => found,
                Err(err) => return Settlement::infrastructure(err),
            }
        } else {
            None
        };
        let (outcome, replayed_effects) = match replayed {
            Some((outcome, effects)) => {
                debug!(run_id = %run_id, step_number, "replaying the recorded step outcome");
                (Ok(outcome), Some(effects))
            }
            None => {
                #[cfg(feature = "metrics")]
                let started = std::time::Instant::now();
                // The call happens inside the guarded future, so a runner
                // that panics before returning its future is caught too.
                let scope = crate::run::context::RunScope::of_job(run_id, job);
                let ran = scope
                    .scope(
                        AssertUnwindSafe(async { self.runner.run_step(&step).await })
                            .catch_unwind(),
                    )
                    .await;
                let outcome = ran.unwrap_or_else(|panic| {
                    let message = panic_message(panic.as_ref());
                    warn!(run_id = %run_id, step_number, "step runner panicked: {message}");
                    Err(StepError::transient(format!(
                        "step runner panicked: {message}"
                    )))
                });
                #[cfg(feature = "metrics")]
                crate::telemetry::metrics::step_ran(
                    &core.queue_name,
                    record.workflow.as_deref(),
                    started.elapsed(),
                    outcome.as_ref().err().map(|error| error.kind),
                );
                (outcome, None)
            }
        };
        drop(permit);

        // Sealed as soon as the runner returned: an effect staged later
        // through a kept handle could not join the settlement.
        let staged = effects_handle.seal_and_take();
        let children = step.delivery.children.seal_and_take();
        let was_replayed = replayed_effects.is_some();
        let staged = replayed_effects.unwrap_or(staged);
        let external_cancel = guard.decide() || claim_cancel.is_cancelled();

        // A step that started children is not replayed: its redelivery
        // runs it again, so it stages them again.
        if core.step_output_replay
            && !was_replayed
            && !external_cancel
            && children.is_empty()
            && let Ok(outcome) = &outcome
            && let Err(err) = core
                .within_lease(claimed, "write the step's replay record", || {
                    core.store_step_output(
                        run_id,
                        record.execution.as_deref(),
                        step_number,
                        &job.payload,
                        outcome,
                        &staged,
                    )
                })
                .await
        {
            return Settlement::infrastructure(err);
        }

        // A cancellation requested while the step ran: its reason is on the
        // run record as it is now.
        let refreshed;
        let record = match external_cancel {
            true => match core.view.run_record(run_id).await {
                Ok(Some(now)) => {
                    refreshed = now;
                    &refreshed
                }
                _ => record,
            },
            false => record,
        };
        let runner_cancelled = matches!(outcome, Ok(StepOutcome::Cancel { .. }));
        let trigger = match &outcome {
            Ok(StepOutcome::Continue { when, .. }) => Some(when.clone()),
            _ => None,
        };
        let mut settlement = self
            .settle_outcome(claimed, outcome, external_cancel, record)
            .await;
        if settlement.next_step.is_some() {
            settlement.continued = trigger;
        }
        // The external-cancel override discards the effects staged for the
        // outcome it replaces; a runner-issued Cancel keeps them.
        let keep_staged = runner_cancelled || !external_cancel;
        let child_effects = match (&settlement.kind, keep_staged && !children.is_empty()) {
            (SettleKind::Ack(_), true) => match core.child_start_effects(run_id, children).await {
                Ok(effects) => Some(effects),
                Err(err) => return Settlement::infrastructure(err),
            },
            _ => None,
        };
        match &mut settlement.kind {
            SettleKind::Ack(effects) => {
                // A step that waits again on the key it was woken by writes
                // that key's waiter anew; its delete must not conflict.
                let kept: Vec<_> = signal_deletes
                    .into_iter()
                    .filter(|key| !effects.kv_writes.contains_key(key))
                    .collect();
                effects.kv_deletes.extend(kept);
                if keep_staged {
                    merge_staged(effects, staged);
                }
                if let Some(child_effects) = child_effects {
                    crate::run::compose::merge_effects(effects, child_effects);
                }
            }
            SettleKind::Fail { effects, .. } => effects.kv_deletes.extend(signal_deletes),
            SettleKind::Retry(_) => {}
        }
        settlement
    }

    /// The settlement of the runner's `outcome` (cancellation precedence: a
    /// runner-issued `Cancel` keeps its reason; otherwise an external
    /// cancellation overrides any outcome, with no error).
    async fn settle_outcome(
        &self,
        claimed: &ClaimedStep<'_>,
        outcome: std::result::Result<StepOutcome, StepError>,
        external_cancel: bool,
        run: &DurableRunRecord,
    ) -> Settlement {
        let core = &self.core;
        let terminate = |outcome, kind| async move {
            core.terminate_recorded(claimed, outcome, kind, run).await
        };
        match outcome {
            Ok(StepOutcome::Cancel { reason }) => {
                terminate(
                    claimed.outcome(TerminalStatus::Cancelled, None, Some(reason)),
                    None,
                )
                .await
            }
            _ if external_cancel => {
                terminate(claimed.outcome(TerminalStatus::Cancelled, None, None), None).await
            }
            Ok(StepOutcome::Continue { payload, when }) => {
                let next = Some((claimed.run_id.clone(), claimed.step_number + 1));
                let settlement = match when {
                    Trigger::Immediate => Settlement::of(SettleKind::Ack(core.advance(
                        claimed,
                        payload,
                        claimed.next_step_opts(),
                    ))),
                    Trigger::After(delay) => {
                        let opts = StepEnqueueOpts {
                            run_at: Some(core.run_at_after(delay)),
                            ..claimed.next_step_opts()
                        };
                        Settlement::of(SettleKind::Ack(core.advance(claimed, payload, opts)))
                    }
                    Trigger::OnSignal {
                        correlation_key,
                        timeout,
                    } => {
                        core.advance_on_signal(claimed, payload, &correlation_key, timeout, run)
                            .await
                    }
                };
                Settlement {
                    next_step: next,
                    ..settlement
                }
            }
            Ok(StepOutcome::Succeed { result }) => {
                terminate(
                    claimed.outcome(TerminalStatus::Succeeded, Some(result), None),
                    None,
                )
                .await
            }
            Ok(StepOutcome::Fail { reason }) => {
                terminate(
                    claimed.outcome(TerminalStatus::Failed, None, Some(reason)),
                    Some(StepErrorKind::Permanent),
                )
                .await
            }
            Err(err) if err.kind == StepErrorKind::Permanent || claimed.job.is_last_attempt() => {
                core.terminating_failure(claimed, &err, run).await
            }
            Err(err) => Settlement::of(SettleKind::Retry(err.message)),
        }
    }

    /// Run the terminal hook for a notification job, through the guard
    /// that catches its panics and bounds the call by the hook timeout
    /// (extending `lease` to cover it).
    async fn process_notification(
        &self,
        job: &JobRecord,
        lease: &LeaseHandle,
        permit: OwnedSemaphorePermit,
    ) -> Settlement {
        let outcome: RunOutcome = match durable::decode::<DurableRunOutcome>(&job.payload) {
            Ok(record) => record.into(),
            Err(err) => {
                warn!(job_id = %job.id, error = %err, "terminal notification with a malformed payload; dead-lettered");
                return Settlement::failure(
                    &StepError::permanent(format!("malformed terminal notification: {err}")),
                    SettlementEffects::default(),
                );
            }
        };
        let effects = TerminalEffects::for_queue(&self.core.queue_name);
        let result = guard::on_termination(
            &*self.terminal_hook,
            &outcome,
            &effects,
            lease,
            self.hook_timeout,
        )
        .await;
        drop(permit);
        let (staged, enqueues) = effects.seal_and_take();
        match result {
            Ok(()) => {
                let mut settlement = SettlementEffects::default().enqueues(enqueues);
                merge_staged(&mut settlement, staged);
                Settlement::of(SettleKind::Ack(settlement))
            }
            Err(err) if err.kind == StepErrorKind::Permanent || job.is_last_attempt() => {
                Settlement::failure(&err, SettlementEffects::default())
            }
            Err(err) => Settlement::of(SettleKind::Retry(err.message)),
        }
    }
}

/// Add a step's staged KV effects to a settlement.
pub(super) fn merge_staged(effects: &mut SettlementEffects, staged: StagedKv) {
    effects.kv_writes.extend(staged.writes);
    effects.kv_deletes.extend(staged.deletes);
}
