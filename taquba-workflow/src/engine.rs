//! The runtime's engine, shared by every clone of a runtime and by its run
//! groups: submission, the settlement effects of each transition, external
//! cancellation and waiting for a run. The worker path, signals and sweeps
//! extend it in their own modules.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use taquba::object_store::ObjectStore;
use taquba::{
    CancelOutcome, Clock, EnqueueOptions, EnqueueRequest, EnqueueResult, ExpiryIndex, JobRecord,
    JobStatus, Queue, SettlementEffects,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::durable::{
    self, DurableCurrentStep, DurableRunOutcome, DurableRunRecord, DurableRunResult,
    DurableTermination,
};
use crate::effects::StagedKv;
use crate::error::{Error, Result};
use crate::group::{GroupStore, Membership, pending_member, terminated_member};
use crate::inflight::{CancelVerdict, InFlightRegistry};
use crate::keys::{
    GROUP_TERMINALS_PREFIX, HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, RESERVED_HEADER_PREFIX,
    RunId, TERMINALS_PREFIX, group_submissions_kv_key, outcome_kv_key, run_kv_key, sha256,
    step_dedup_key, step_kv_key,
};
use crate::memo::{MemoStore, RUN_RESULT_MEMO_KEY};
use crate::run_watch::{RunWatchers, store_closed_token};
use crate::runner::StepErrorKind;
use crate::runtime::{RunEnd, RunOptions, RunSpec, RunTermination, SubmitOutcome};
use crate::signal::SignalLocks;
use crate::submit_batch::{Batched, SubmitBatcher};
use crate::terminal::{RunOutcome, TerminalStatus};
use crate::view::WorkflowView;

/// Attempts of a submission whose compare-and-commit lost to a concurrent
/// writer of the same run record before the call gives up.
const SUBMIT_RACE_RETRIES: usize = 8;

/// Whether a terminal hook wants a notification for an outcome.
pub(crate) type Observes = Arc<dyn Fn(&RunOutcome) -> bool + Send + Sync>;

/// What the builder hands the engine.
pub(crate) struct Settings {
    pub(crate) queue: Arc<Queue>,
    pub(crate) object_store: Arc<dyn ObjectStore>,
    pub(crate) queue_name: String,
    pub(crate) memo_prefix: String,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_concurrent_steps: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) memo_retention: Option<Duration>,
    pub(crate) group_retention: Option<Duration>,
    pub(crate) step_output_replay: bool,
    pub(crate) observes: Observes,
}

/// The engine of one runtime.
pub(crate) struct RuntimeCore {
    pub(crate) queue: Arc<Queue>,
    pub(crate) queue_name: String,
    pub(crate) view: WorkflowView,
    pub(crate) memo_store: MemoStore,
    pub(crate) group_store: GroupStore,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) max_concurrent_steps: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) memo_retention: Option<Duration>,
    pub(crate) group_retention: Option<Duration>,
    pub(crate) step_output_replay: bool,
    /// Run terminal markers (memo retention).
    pub(crate) terminals: ExpiryIndex,
    /// Group terminal markers (group retention).
    pub(crate) group_terminals: ExpiryIndex,
    pub(crate) inflight: Arc<InFlightRegistry>,
    /// Waiters on run terminations in this process.
    pub(crate) run_watchers: RunWatchers,
    /// The group commit of submissions under fresh run ids.
    submit_batcher: SubmitBatcher,
    pub(crate) signal_locks: SignalLocks,
    observes: Observes,
    /// Dead letters the worker performed since the last reconciliation look.
    /// Signed: a dead letter counted before its settlement and uncounted
    /// after it failed can leave the count below zero for one look.
    pub(crate) own_dead_letters: AtomicI64,
    /// The queue's dead count at the last look; -1 before the first.
    pub(crate) last_dead_count: AtomicI64,
    /// Maintenance rounds done, for the periodic full reconciliation.
    pub(crate) maintenance_rounds: AtomicU64,
    /// Fired once the queue's store is closed to this process for good
    /// (closed, or fenced by another process that opened it): the worker
    /// loop stops and waits fail instead of waiting forever. Shared by
    /// every runtime over the same queue.
    pub(crate) store_closed: CancellationToken,
}

/// What a submission does with a run id whose run terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTerminated {
    /// Start a new run under the id (runs and groups).
    Restart,
    /// Answer with the recorded run (idempotent jobs).
    Keep,
    /// Answer with the recorded run when it succeeded, start a new run
    /// otherwise (group members).
    KeepSucceeded,
}

/// The queue options of a run's next step.
#[derive(Debug, Clone, Default)]
pub(crate) struct StepEnqueueOpts {
    pub(crate) run_at: Option<SystemTime>,
    pub(crate) priority: Option<u32>,
    pub(crate) max_attempts: Option<u32>,
    /// Reserved headers beyond the run id and step (membership, signals).
    pub(crate) reserved_headers: Vec<(&'static str, String)>,
}

/// A new step job, built with its id so the pointer can name it in the same
/// transaction.
pub(crate) struct PreparedStep {
    pub(crate) job_id: String,
    pub(crate) request: EnqueueRequest,
}

impl RuntimeCore {
    pub(crate) fn new(settings: Settings) -> Self {
        let memo_store =
            MemoStore::new(settings.object_store.clone(), settings.memo_prefix.clone());
        let view = WorkflowView::new(settings.queue.view().clone(), memo_store.clone());
        let run_watchers = RunWatchers::for_queue(&settings.queue);
        let store_closed = store_closed_token(&settings.queue);
        let submit_batcher = SubmitBatcher::new(settings.queue.clone());
        let group_store = GroupStore::new(
            settings.object_store,
            settings.memo_prefix,
            memo_store.clone(),
            settings.queue.clone(),
        );
        Self {
            queue: settings.queue,
            queue_name: settings.queue_name,
            view,
            memo_store,
            group_store,
            clock: settings.clock,
            max_concurrent_steps: settings.max_concurrent_steps,
            poll_interval: settings.poll_interval,
            memo_retention: settings.memo_retention,
            group_retention: settings.group_retention,
            step_output_replay: settings.step_output_replay,
            terminals: ExpiryIndex::new(TERMINALS_PREFIX.as_bytes().to_vec()),
            group_terminals: ExpiryIndex::new(GROUP_TERMINALS_PREFIX.as_bytes().to_vec()),
            inflight: Arc::default(),
            run_watchers,
            submit_batcher,
            signal_locks: SignalLocks::default(),
            observes: settings.observes,
            own_dead_letters: AtomicI64::new(0),
            last_dead_count: AtomicI64::new(-1),
            maintenance_rounds: AtomicU64::new(0),
            store_closed,
        }
    }

    /// Record an error of the queue: one that says the store is closed to
    /// this process fires [`Self::store_closed`].
    pub(crate) fn note_error(&self, err: &Error) {
        self.note_closed(err.is_store_closed(), err);
    }

    /// Fire [`Self::store_closed`] when `closed`, logging `err`.
    fn note_closed(&self, closed: bool, err: &dyn std::fmt::Display) {
        if closed && !self.store_closed.is_cancelled() {
            tracing::error!(queue = %self.queue_name, "the queue's store is closed to this process (another process opened it, or it was closed): {err}");
            self.store_closed.cancel();
        }
    }

    /// The error reported once the store is closed to this process.
    pub(crate) fn store_closed_error(&self) -> Error {
        Error::Queue(taquba::Error::Storage(slatedb::Error::closed(
            format!(
                "the store of queue `{}` is closed to this process: another process opened it (a store has one writer) or it was closed",
                self.queue_name
            ),
            slatedb::CloseReason::Fenced,
        )))
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The absolute time `delay` from now on the runtime's clock.
    pub(crate) fn run_at_after(&self, delay: Duration) -> SystemTime {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX / 2);
        UNIX_EPOCH + Duration::from_millis(self.now_ms().saturating_add(delay_ms))
    }

    /// Build step `step_number` of `run_id`: its id, dedup key and headers
    /// (the submitter's `user_headers` plus the reserved ones).
    pub(crate) fn prepare_step(
        &self,
        run_id: &RunId,
        step_number: u32,
        payload: Vec<u8>,
        user_headers: &HashMap<String, String>,
        opts: StepEnqueueOpts,
    ) -> PreparedStep {
        let job_id = self.queue.next_job_id();
        let mut headers = user_headers.clone();
        headers.insert(HEADER_RUN_ID.to_string(), run_id.to_string());
        headers.insert(HEADER_STEP.to_string(), step_number.to_string());
        for (name, value) in opts.reserved_headers {
            headers.insert(name.to_string(), value);
        }
        let options = EnqueueOptions::default()
            .id_override(job_id.clone())
            .dedup_key(step_dedup_key(run_id, step_number))
            .headers(headers)
            .priority(opts.priority)
            .max_attempts(opts.max_attempts)
            .run_at(opts.run_at);
        PreparedStep {
            job_id,
            request: EnqueueRequest {
                queue: self.queue_name.clone(),
                payload,
                options,
            },
        }
    }

    /// The effects that make `step` the current step of `run_id`: its
    /// enqueue and the pointer naming it.
    pub(crate) fn step_effects(
        run_id: &RunId,
        step_number: u32,
        step: PreparedStep,
        effects: SettlementEffects,
    ) -> SettlementEffects {
        let pointer = DurableCurrentStep {
            step_number,
            job_id: step.job_id,
        };
        effects
            .enqueue(step.request)
            .kv_put(step_kv_key(run_id), durable::encode(&pointer))
    }

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
        let RunSpec {
            run_id,
            input,
            options,
            effects: user_effects,
        } = spec;
        Self::check_submission(&options, &user_effects)?;
        // A fresh ULID names no recorded run: its first attempt skips the
        // reads (the compare-and-commit below still guards the record).
        let mut fresh_id = run_id.is_none();
        let batchable = membership.is_none()
            && user_effects.enqueues.is_empty()
            && user_effects.kv_writes.is_empty()
            && user_effects.kv_deletes.is_empty()
            && user_effects.expiry_entries.is_empty();
        let run_id = run_id.unwrap_or_else(RunId::generate);
        let input_hash = sha256(&input).to_vec();
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
        let record = DurableRunRecord {
            input_hash: input_hash.to_vec(),
            submitted_at_ms: self.now_ms(),
            cancel_requested: false,
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
                    crate::group_submit::new_counter_value(),
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

    /// The terminal record of a termination happening now.
    pub(crate) fn termination(
        &self,
        outcome: &RunOutcome,
        error_kind: Option<StepErrorKind>,
        input_hash: &[u8],
    ) -> DurableTermination {
        DurableTermination {
            status: outcome.status.into(),
            error: outcome.error.clone(),
            error_kind: error_kind.map(Into::into),
            final_step: outcome.final_step,
            terminated_at_ms: self.now_ms(),
            input_hash: input_hash.to_vec(),
        }
    }

    /// Await `commit`, a queue commit that carries the termination of
    /// `ended` (when given), and report that end to the run's waiters in
    /// this process when `committed` says the termination is in it. While
    /// the commit is in flight the run is marked terminating, so a waiter
    /// that reads the not-yet-durable termination waits for this report; a
    /// closed store is noted before the mark goes.
    pub(crate) async fn commit_ending<T>(
        &self,
        ended: Option<&(RunId, RunEnd)>,
        commit: impl Future<Output = taquba::Result<T>>,
        committed: impl FnOnce(&T) -> bool,
    ) -> taquba::Result<T> {
        let _terminating = ended.map(|(run_id, _)| self.run_watchers.terminating(run_id));
        let result = commit.await;
        match &result {
            Ok(value) => {
                if let Some((run_id, end)) = ended
                    && committed(value)
                {
                    self.run_watchers.notify(run_id, end);
                }
            }
            Err(err) => self.note_closed(Error::is_queue_store_closed(err), err),
        }
        result
    }

    /// Write the run result record of a worker-performed termination to the
    /// run memo; done before the terminating settlement.
    pub(crate) async fn store_run_result(
        &self,
        outcome: &RunOutcome,
        termination: &DurableTermination,
    ) -> Result<()> {
        let record = DurableRunResult {
            termination: termination.clone(),
            outcome: outcome.into(),
        };
        self.memo_store
            .new_run_memo(&outcome.run_id)
            .put(RUN_RESULT_MEMO_KEY, &durable::encode(&record))
            .await
    }

    /// The effects of terminating `outcome.run_id`: remove the run record
    /// and pointer, write the terminal record (and the member record of a
    /// group member), the retention marker when retention is configured,
    /// and the notification job when the hook observes the outcome.
    /// `max_attempts` is the terminal step's attempt limit, which the
    /// notification inherits. With the effects, the end the run's waiters
    /// are told once they commit: with `outcome` when `recorded` (its run
    /// result record was written).
    pub(crate) fn terminate_effects(
        &self,
        outcome: &RunOutcome,
        termination: DurableTermination,
        membership: Option<&Membership>,
        max_attempts: u32,
        recorded: bool,
    ) -> (SettlementEffects, (RunId, RunEnd)) {
        let run_id = &outcome.run_id;
        let end = RunEnd {
            termination: termination.clone().into(),
            outcome: recorded.then(|| outcome.clone()),
        };
        let at_ms = termination.terminated_at_ms;
        let mut effects = SettlementEffects::default()
            .kv_delete(run_kv_key(run_id))
            .kv_delete(step_kv_key(run_id))
            .kv_put(outcome_kv_key(run_id), durable::encode(&termination));
        if let Some(membership) = membership {
            effects = effects.kv_put(
                membership.kv_key(),
                durable::encode(&terminated_member(membership, termination)),
            );
        }
        if self.memo_retention.is_some() {
            effects = effects.expiry_entry(&self.terminals, at_ms, run_id.as_bytes());
        }
        if (self.observes)(outcome) {
            let headers = HashMap::from([
                (
                    HEADER_TERMINAL.to_string(),
                    outcome.status.as_str().to_string(),
                ),
                (HEADER_RUN_ID.to_string(), run_id.to_string()),
            ]);
            effects = effects.enqueue(EnqueueRequest {
                queue: self.queue_name.clone(),
                payload: durable::encode(&DurableRunOutcome::from(outcome)),
                options: EnqueueOptions::default()
                    .headers(headers)
                    .max_attempts(max_attempts),
            });
        }
        (effects, (run_id.clone(), end))
    }

    /// The outcome of a run terminated outside any runner call, at the step
    /// whose queue record is `job`.
    pub(crate) fn detached_outcome(
        run_id: &RunId,
        job: &JobRecord,
        final_step: u32,
        status: TerminalStatus,
        error: Option<String>,
    ) -> RunOutcome {
        RunOutcome {
            run_id: run_id.clone(),
            status,
            result: None,
            error,
            headers: user_headers(&job.headers),
            final_step,
        }
    }

    /// Request cancellation of `run_id`; see
    /// [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel).
    pub(crate) async fn cancel(&self, run_id: &RunId) -> Result<bool> {
        let run_key = run_kv_key(run_id);
        // 1. Record the request durably (compare-and-set on the record, so
        //    a concurrent termination that deletes it is noticed).
        let record = loop {
            let Some(bytes) = self.queue.view().kv_get(&run_key).await? else {
                return Ok(false);
            };
            let mut record: DurableRunRecord = durable::decode(&bytes)?;
            if record.cancel_requested {
                break record;
            }
            record.cancel_requested = true;
            let effects =
                SettlementEffects::default().kv_put(run_key.clone(), durable::encode(&record));
            if self
                .queue
                .kv_compare_commit(&run_key, Some(&bytes), effects)
                .await?
                .is_some()
            {
                break record;
            }
        };
        // 2. Reach the current step wherever it is.
        loop {
            let Some((pointer, job)) = self.view.current_job(run_id).await? else {
                // Terminated meanwhile: the request won only if the run
                // ended cancelled.
                return self.ended_cancelled(run_id).await;
            };
            match job.status {
                JobStatus::Pending | JobStatus::Scheduled => {
                    match self
                        .cancel_removing(run_id, &pointer, &job, &record)
                        .await?
                    {
                        CancelOutcome::Removed => return Ok(true),
                        // Claimed or settled meanwhile: look again.
                        CancelOutcome::Requested | CancelOutcome::NotFound => continue,
                    }
                }
                JobStatus::Claimed => {
                    match self.inflight.request_cancel(run_id) {
                        CancelVerdict::Requested => return Ok(true),
                        CancelVerdict::NotInFlight => {
                            // Claimed but not running in this runtime: not
                            // registered yet (its record read sees the
                            // request), held by another runtime over the
                            // queue, whose runner may already have returned,
                            // or settled since the read. Fire the claim's
                            // token; only the step's settlement tells
                            // whether the holder honoured the request, so
                            // wait for it and look again.
                            match self
                                .cancel_removing(run_id, &pointer, &job, &record)
                                .await?
                            {
                                // Re-queued since the read: removed with the
                                // run's termination.
                                CancelOutcome::Removed => return Ok(true),
                                CancelOutcome::Requested => {
                                    self.queue.wait_for_completion(&job.id).await?;
                                    continue;
                                }
                                CancelOutcome::NotFound => continue,
                            }
                        }
                        CancelVerdict::Settling(mut settled) => {
                            // The runner returned before the request: let its
                            // settlement finish, then apply the request to
                            // whatever step is current (or find the run
                            // terminated).
                            let _ = settled.wait_for(|done| *done).await;
                            continue;
                        }
                    };
                }
                JobStatus::Done | JobStatus::Dead => {
                    // The pointer moves with the ack, so a done job here is
                    // a read between two commits; a dead one awaits
                    // reconciliation, which honours the request.
                    if job.status == JobStatus::Dead {
                        crate::sweep::reconcile_job(self, &job).await?;
                        return self.ended_cancelled(run_id).await;
                    }
                    continue;
                }
            }
        }
    }

    /// Cancel the step job `job` of `run_id` (which `pointer` names): when
    /// it is still waiting it is removed together with the run's
    /// `Cancelled` termination and the cleanup of a signal waiter the job
    /// registered; a claimed one gets its cancellation requested.
    async fn cancel_removing(
        &self,
        run_id: &RunId,
        pointer: &DurableCurrentStep,
        job: &JobRecord,
        record: &DurableRunRecord,
    ) -> Result<CancelOutcome> {
        let outcome = Self::detached_outcome(
            run_id,
            job,
            pointer.step_number,
            TerminalStatus::Cancelled,
            None,
        );
        let termination = self.termination(&outcome, None, &record.input_hash);
        let membership = Membership::from_headers(&job.headers)?;
        let (mut effects, ended) = self.terminate_effects(
            &outcome,
            termination,
            membership.as_ref(),
            job.max_attempts,
            false,
        );
        effects
            .kv_deletes
            .extend(crate::signal::waiter_cleanup(job));
        let (outcome, _) = self
            .commit_ending(
                Some(&ended),
                self.queue.cancel_with(&job.id, effects),
                |(outcome, _)| *outcome == CancelOutcome::Removed,
            )
            .await?;
        Ok(outcome)
    }

    async fn ended_cancelled(&self, run_id: &RunId) -> Result<bool> {
        Ok(self
            .view
            .terminal_record(run_id)
            .await?
            .is_some_and(|t| t.status == durable::DurableStatus::Cancelled))
    }

    /// Wait until `run_id` terminates.
    ///
    /// Woken in-process by the commit that terminates the run (see
    /// [`RunWatchers`]), so following a run costs one read however many
    /// steps it takes. Every poll interval the wait also looks at the run's
    /// current step: a step dead-lettered outside the worker (the reaper)
    /// is reconciled here rather than left to the next maintenance round.
    pub(crate) async fn wait_run(&self, run_id: &RunId) -> Result<RunEnd> {
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
                        end = watch.ended() => return Ok(end),
                        () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                        () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                    }
                    continue;
                }
                return self.ended_run(run_id).await;
            };
            if look_at_step {
                // The record alone: the payload may be a large object.
                match self.queue.view().job_record(&pointer.job_id).await? {
                    Some(job) if job.status == JobStatus::Dead => {
                        // The dead record, not one read before, carries the
                        // error the run fails with.
                        missing = None;
                        if crate::sweep::reconcile_job(self, &job).await? == 1 {
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
                end = watch.ended() => return Ok(end),
                () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
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

    /// The end of a run found terminated, from its records.
    async fn ended_run(&self, run_id: &RunId) -> Result<RunEnd> {
        let Some(termination) = self.view.terminal_record(run_id).await? else {
            return Err(Error::RunNotFound(run_id.clone()));
        };
        let termination: RunTermination = termination.into();
        let outcome = self
            .view
            .run_result_of(run_id, &termination)
            .await?
            .map(|result| result.outcome);
        Ok(RunEnd {
            termination,
            outcome,
        })
    }
}

/// The submitter's headers of a step job: every header outside the reserved
/// prefix.
pub(crate) fn user_headers(headers: &HashMap<String, String>) -> HashMap<String, String> {
    headers
        .iter()
        .filter(|(name, _)| !name.starts_with(RESERVED_HEADER_PREFIX))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

impl RuntimeCore {
    /// Write the terminal marker of a group whose last termination a results
    /// consumer observed (group retention only).
    pub(crate) async fn mark_group_terminated(&self, group_id: &RunId) -> Result<()> {
        if self.group_retention.is_some() {
            self.queue
                .commit_effects(SettlementEffects::default().expiry_entry(
                    &self.group_terminals,
                    self.now_ms(),
                    group_id.as_bytes(),
                ))
                .await?;
        }
        Ok(())
    }
}
