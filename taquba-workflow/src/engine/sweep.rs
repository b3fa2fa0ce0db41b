//! Periodic maintenance of a runtime: reconciliation of runs whose step job
//! was dead-lettered outside the worker (the reaper, crash recovery at
//! open), and the retention sweeps of terminated runs and groups.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use taquba::{Expired, JobRecord, SettlementEffects};
use tracing::{debug, warn};

use crate::coordination::members::Membership;
use crate::engine::RuntimeCore;
use crate::engine::group_forget::Swept;
use crate::error::Result;
use crate::history::record::{DurableAttemptOutcome, dead_letter_attempts};
use crate::model::TerminalStatus;
use crate::store::durable::{self, DurableCurrentStep, DurableRunRecord, DurableTermination};
use crate::store::keys::{
    HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, RunId, outcome_kv_key, run_kv_key, step_kv_key,
};

/// The future of one expired entry, boxed so the sweep stays `Send` for
/// every lifetime the worker loop is spawned with.
type ExpiryFuture<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Expired> + Send + 'a>>;

/// Maintenance rounds between two unconditional reconciliation passes.
const FULL_RECONCILE_EVERY: u64 = 120;

/// Dead jobs read per page by a reconciliation pass.
const DEAD_PAGE: usize = 256;

/// Attempts of one job's reconciliation whose guarded commit found the run
/// record changed (a cancellation request recorded meanwhile); the next
/// pass tries again after these.
const RECONCILE_RETRIES: usize = 4;

impl RuntimeCore {
    /// One round of maintenance; failures are logged and retried next round.
    pub(crate) async fn maintain(&self) {
        if let Err(err) = self.reconcile_if_dead_count_changed().await {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "dead-letter reconciliation failed: {err}");
        }
        self.maintain_operator_surface().await;
        self.fire_schedules().await;
        self.maintain_children().await;
        if self.keys.pass_due(crate::engine::keys::KEY_PASS_EVERY)
            && let Err(err) = self.admit_all_waiting().await
        {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "admitting runs waiting on concurrency keys failed: {err}");
        }
        if let Err(err) = self.sweep_once().await {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "retention sweep failed: {err}");
        }
    }

    /// Mark a periodic maintenance task of this runtime as running until
    /// the returned guard drops (see [`maintained_here`](Self::maintained_here)).
    pub(crate) fn maintaining(self: &Arc<Self>) -> MaintainingGuard {
        self.maintainers.fetch_add(1, Ordering::Relaxed);
        MaintainingGuard { core: self.clone() }
    }

    /// Whether a periodic maintenance task of this runtime runs now: its
    /// worker claims and settles the steps here (every termination it
    /// commits wakes this process's waiters), and the task reconciles,
    /// every poll interval, the dead-lettered steps whose dead letter did
    /// not end their run (see `engine::wait::LookBackoff`).
    pub(crate) fn maintained_here(&self) -> bool {
        self.maintainers.load(Ordering::Relaxed) > 0
    }

    /// Count a dead letter the worker itself performs that terminates its
    /// run in the same transaction, so it does not trigger a scan (a dead
    /// letter that leaves its run active is not counted: the scan
    /// reconciles it).
    pub(crate) fn note_own_dead_letter(&self) {
        self.own_dead_letters.fetch_add(1, Ordering::Relaxed);
    }

    /// Uncount a dead letter noted with [`Self::note_own_dead_letter`] that
    /// did not happen (its settlement failed or retried the job). Left
    /// counted, it would hide a dead letter of the same job by someone else
    /// (the reaper, when the claim was lost to a lease expiry) from the
    /// next look, and that job's run would never be reconciled.
    pub(crate) fn forget_own_dead_letter(&self) {
        self.own_dead_letters.fetch_sub(1, Ordering::Relaxed);
    }

    /// Reconcile when the queue's dead count grew by more than the worker's
    /// own dead letters since the last look (always on the first look), and
    /// every [`FULL_RECONCILE_EVERY`] rounds regardless: a dead-retention
    /// sweep removing old dead jobs while a new one arrives leaves the count
    /// unchanged. The count is read when its schedule says
    /// ([`DeadCountSchedule`](crate::engine::dead_count::DeadCountSchedule):
    /// every round while reads are cheap, spaced out on a busy store, and
    /// at the next round after a dead letter the worker could not account
    /// for). A failed read or pass is retried at the next round.
    async fn reconcile_if_dead_count_changed(&self) -> Result<()> {
        let round = self.maintenance_rounds.fetch_add(1, Ordering::Relaxed);
        let full = round % FULL_RECONCILE_EVERY == FULL_RECONCILE_EVERY - 1;
        let first = self.last_dead_count.load(Ordering::Relaxed) < 0;
        if !(self.dead_count.due(round) || first || full) {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let stats = match self.queue.view().stats(&self.queue_name).await {
            Ok(stats) => stats,
            Err(err) => {
                self.dead_count.expect_change();
                return Err(err.into());
            }
        };
        self.dead_count
            .read_at(round, started.elapsed(), self.poll_interval);
        #[cfg(feature = "metrics")]
        crate::telemetry::metrics::steps_due(&self.queue_name, stats.pending);
        let dead = stats.dead;
        let own = self.own_dead_letters.swap(0, Ordering::Relaxed);
        let last = self.last_dead_count.swap(dead, Ordering::Relaxed);
        let unexplained = last < 0 || dead > last.saturating_add(own);
        if unexplained || full {
            match self.reconcile_dead_steps().await {
                Ok(reconciled) if reconciled > 0 => {
                    debug!(queue = %self.queue_name, reconciled, "terminated runs of dead-lettered steps");
                }
                Ok(_) => {}
                Err(err) => {
                    // Look again next round.
                    self.last_dead_count.store(-1, Ordering::Relaxed);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Terminate every run whose current step job is dead-lettered while the
    /// run is still active: `Failed` with the job's last error, in one
    /// transaction with the notification. Returns how many runs were
    /// terminated.
    pub(super) async fn reconcile_dead_steps(&self) -> Result<usize> {
        let mut reconciled = 0;
        let mut after: Option<String> = None;
        loop {
            let page = self
                .queue
                .view()
                .dead_jobs(&self.queue_name, after.as_deref(), DEAD_PAGE)
                .await?;
            let full = page.len() == DEAD_PAGE;
            after = page.last().map(|last| last.id.clone());
            for job in page {
                reconciled += reconcile_job(self, &job).await?;
            }
            if !full {
                return Ok(reconciled);
            }
        }
    }

    /// One pass of both retention sweeps; returns the markers removed.
    pub(crate) async fn sweep_once(&self) -> Result<usize> {
        let mut removed = 0;
        let now = self.now_ms();
        if let Some(retention) = self.memo_retention {
            removed += self
                .terminals
                .pass(
                    &self.queue,
                    now,
                    retention,
                    |at_ms, suffix| -> ExpiryFuture<'_> {
                        Box::pin(self.expire_run(at_ms, suffix))
                    },
                )
                .await?;
        }
        if let Some(retention) = self.group_retention {
            // A group is removed once its marker is more than the window
            // old: at exactly the window it is kept (the expiry index
            // expires entries at the window itself, hence the extra ms).
            let window = retention.saturating_add(Duration::from_millis(1));
            removed += self
                .group_terminals
                .pass(
                    &self.queue,
                    now,
                    window,
                    |at_ms, suffix| -> ExpiryFuture<'_> {
                        Box::pin(self.expire_group(at_ms, suffix))
                    },
                )
                .await?;
        }
        Ok(removed)
    }

    /// Clear the state of the run whose terminal marker, written when it
    /// terminated at `at_ms`, expired: its memo entries (run result and
    /// replay records included), its terminal record and its history
    /// records; a group member's terminal record stays until its group is
    /// removed (it names the member, so the run id stays the group's).
    /// Left alone, with
    /// only the marker removed: the state of a run id that is active again
    /// under a new submission, and of one whose terminal record is of a
    /// later termination (a run submitted again after this one ended, and
    /// ended since), which that termination's own marker clears a window
    /// after it.
    async fn expire_run(&self, at_ms: u64, suffix: Vec<u8>) -> Expired {
        let Some(run_id) = std::str::from_utf8(&suffix)
            .ok()
            .and_then(|s| RunId::new(s).ok())
        else {
            warn!("terminal marker with an invalid run id; removed");
            return Expired::Delete(SettlementEffects::default());
        };
        match self.queue.view().kv_get(&run_kv_key(&run_id)).await {
            Ok(Some(_)) => return Expired::Delete(SettlementEffects::default()),
            Ok(None) => {}
            Err(err) => {
                warn!(run_id = %run_id, "retention sweep deferred: {err}");
                return Expired::Keep;
            }
        }
        let outcome_key = outcome_kv_key(&run_id);
        let outcome = match self.queue.view().kv_get(&outcome_key).await {
            Ok(outcome) => outcome,
            Err(err) => {
                warn!(run_id = %run_id, "retention sweep deferred: {err}");
                return Expired::Keep;
            }
        };
        let termination = outcome.as_deref().and_then(|bytes| {
            durable::decode_or_absent::<DurableTermination>(bytes, "terminal record", &run_id)
        });
        if termination
            .as_ref()
            .is_some_and(|t| t.terminated_at_ms != at_ms)
        {
            return Expired::Delete(SettlementEffects::default());
        }
        // A group member's terminal record says whose run id it is: while
        // the group has the member, a plain submission under the id must
        // still be refused, so the record goes with the group (its `forget`
        // or group retention), not with the memo entries.
        let keep_record = termination.is_some_and(|t| t.member.is_some());
        if let Err(err) = self.memo_store.clear_memos_for_run(&run_id).await {
            warn!(run_id = %run_id, "retention sweep deferred: {err}");
            return Expired::Keep;
        }
        // The run's history goes with its terminal record, and so do its
        // links to its children and the ends of those that ended.
        let history = match crate::history::read::history_keys(self.queue.view(), &run_id).await {
            Ok(keys) => keys,
            Err(err) => {
                warn!(run_id = %run_id, "retention sweep deferred: {err}");
                return Expired::Keep;
            }
        };
        let history =
            match crate::engine::children::expired_parent_keys(self.queue.view(), &run_id).await {
                Ok(children) => history.into_iter().chain(children).collect::<Vec<_>>(),
                Err(err) => {
                    warn!(run_id = %run_id, "retention sweep deferred: {err}");
                    return Expired::Keep;
                }
            };
        match outcome {
            Some(_) if keep_record => {
                Expired::Delete(SettlementEffects::default().kv_deletes(history))
            }
            // Deleted only if unchanged: a termination committed since is
            // a later run's.
            Some(bytes) => Expired::DeleteIf {
                key: outcome_key.clone(),
                expected: Some(bytes.to_vec()),
                // `kv_deletes` sets the list, so it comes first.
                effects: SettlementEffects::default()
                    .kv_deletes(history)
                    .kv_delete(outcome_key),
            },
            None => Expired::Delete(SettlementEffects::default().kv_deletes(history)),
        }
    }

    /// Remove the group whose terminal marker, written at `at_ms` by a
    /// results consumer, expired, unless it was submitted again since (see
    /// [`remove_group_unchanged_since`](Self::remove_group_unchanged_since)):
    /// the marker goes either way, and a consumer observing the re-run's
    /// end writes the next. A group busy with a submission or a `forget`
    /// keeps its marker for the next pass.
    async fn expire_group(&self, at_ms: u64, suffix: Vec<u8>) -> Expired {
        let Some(group_id) = std::str::from_utf8(&suffix)
            .ok()
            .and_then(|s| RunId::new(s).ok())
        else {
            warn!("group terminal marker with an invalid group id; removed");
            return Expired::Delete(SettlementEffects::default());
        };
        match self.remove_group_unchanged_since(&group_id, at_ms).await {
            Ok(Swept::Removed) => Expired::Delete(SettlementEffects::default()),
            Ok(Swept::RanSince) => {
                debug!(group_id = %group_id, "group submitted again since its results were consumed; kept");
                Expired::Delete(SettlementEffects::default())
            }
            Ok(Swept::Busy) => Expired::Keep,
            Err(err) => {
                warn!(group_id = %group_id, "group retention sweep deferred: {err}");
                Expired::Keep
            }
        }
    }
}

/// Terminate the run of the dead step job `job` when it is still the run's
/// current step; returns 1 when this call terminated it, else 0.
///
/// The run ends `Failed` with the queue's last error of the job (`lease
/// expired` after the reaper took it), as the seeds' reconciliation says,
/// also when a cancellation was requested before the dead letter: the dead
/// letter ended the run, and a request recorded after it was never applied
/// to a step. The one exception is a request that reached the job while it
/// ran in this process, answered `Ok(true)` ([`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel)
/// records that on the run record before it answers): the job was alive
/// when the request reached it, so its dead letter came after, and the run
/// ends `Cancelled`, as the answer said.
///
/// The commit is guarded on the run record as read, so a request recorded
/// meanwhile is never overridden: the pass reads it again.
pub(super) async fn reconcile_job(core: &RuntimeCore, job: &JobRecord) -> Result<usize> {
    if job.headers.contains_key(HEADER_TERMINAL) {
        return Ok(0);
    }
    let (Some(run_id), Some(step)) = (job.headers.get(HEADER_RUN_ID), job.headers.get(HEADER_STEP))
    else {
        return Ok(0);
    };
    let (Ok(run_id), Ok(step_number)) = (RunId::parse_ref(run_id), step.parse::<u32>()) else {
        return Ok(0);
    };
    let span = crate::telemetry::spans::reconcile(&core.queue_name, &run_id, step_number, job);
    crate::telemetry::spans::within(span, reconcile_step(core, job, run_id, step_number)).await
}

/// [`reconcile_job`] of the step job `job`, step `step_number` of `run_id`.
async fn reconcile_step(
    core: &RuntimeCore,
    job: &JobRecord,
    run_id: RunId,
    step_number: u32,
) -> Result<usize> {
    for _ in 0..RECONCILE_RETRIES {
        let Some(pointer_bytes) = core.queue.view().kv_get(&step_kv_key(&run_id)).await? else {
            return Ok(0);
        };
        let Some(pointer) = durable::decode_or_absent::<DurableCurrentStep>(
            &pointer_bytes,
            "step pointer",
            &run_id,
        ) else {
            return Ok(0);
        };
        if pointer.job_id != job.id {
            return Ok(0);
        }
        let run_key = run_kv_key(&run_id);
        let Some(record_bytes) = core.queue.view().kv_get(&run_key).await? else {
            return Ok(0);
        };
        let Some(record) =
            durable::decode_or_absent::<DurableRunRecord>(&record_bytes, "run record", &run_id)
        else {
            return Ok(0);
        };
        let outcome = if record.cancel_delivered_to.as_deref() == Some(job.id.as_str()) {
            RuntimeCore::detached_outcome(
                &run_id,
                job,
                step_number,
                TerminalStatus::Cancelled,
                None,
            )
        } else {
            let error = job
                .last_error
                .clone()
                .unwrap_or_else(|| "step dead-lettered".to_string());
            RuntimeCore::detached_outcome(
                &run_id,
                job,
                step_number,
                TerminalStatus::Failed,
                Some(error),
            )
        };
        let membership = Membership::from_headers(&job.headers)?;
        let termination = core.termination(&outcome, None, &record, &job.id, membership.as_ref());
        let (mut effects, mut ending) =
            core.terminate_effects(&outcome, termination, membership.as_ref(), job, false);
        effects
            .kv_deletes
            .extend(crate::coordination::signal::waiter_cleanup(job));
        let entry = match &outcome.error {
            Some(error) => DurableAttemptOutcome::dead_lettered(error),
            None => DurableAttemptOutcome::cancelled(record.cancel_reason.as_deref()),
        };
        // The queue's own entries of the job's attempts: the dead letter's
        // claim time, and the attempts before it.
        let entries = match core.queue.view().attempt_history(&job.id).await {
            Ok(entries) => entries,
            Err(err) => {
                warn!(run_id = %run_id, job_id = %job.id, "the step's attempts are left out of its history: {err}");
                Vec::new()
            }
        };
        let attempts =
            dead_letter_attempts(&entries, job.attempts, job.claimed_at, entry, core.now_ms());
        core.record_detached_attempts(
            &mut effects,
            &mut ending.record,
            &run_id,
            &pointer,
            job,
            attempts,
        );
        // The pointer can leave a dead job only by the run's termination,
        // which deletes the run record too: the guard on the record stops a
        // concurrent settlement or reconciliation as well.
        if core
            .commits
            .compare_commit_ending(&run_key, Some(&record_bytes), effects, ending)
            .await?
            .is_some()
        {
            core.forget_waiter_of(job).await;
            #[cfg(feature = "metrics")]
            crate::telemetry::metrics::dead_lettered(&core.queue_name, "reconciled");
            return Ok(1);
        }
    }
    Ok(0)
}

/// A periodic maintenance task running (see [`RuntimeCore::maintaining`]).
pub(crate) struct MaintainingGuard {
    core: Arc<RuntimeCore>,
}

impl Drop for MaintainingGuard {
    fn drop(&mut self) {
        self.core.maintainers.fetch_sub(1, Ordering::Relaxed);
        self.core.maintenance_stopped.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use taquba::Queue;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::RunSpec;
    use crate::model::{StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;

    struct Never;

    impl StepRunner for Never {
        async fn run_step(&self, _: &Step) -> std::result::Result<StepOutcome, StepError> {
            Err(StepError::permanent("not run in this test"))
        }
    }

    /// Claim the runtime's next step job and dead-letter it ("hung"), as
    /// code other than the worker would.
    async fn dead_letter_as_other_code(queue: &Queue) {
        let claim = queue
            .claim("workflow-steps", Duration::from_secs(30))
            .await
            .expect("claim")
            .expect("the step job");
        queue
            .dead_letter(&claim, "hung")
            .await
            .expect("dead letter");
    }

    #[tokio::test(start_paused = true)]
    async fn a_dead_letter_the_count_does_not_show_is_reconciled_by_the_periodic_pass() {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runtime =
            WorkflowRuntime::builder(queue.clone(), store, Never, NoopTerminalHook).build();
        let core = runtime.inner.core.clone();
        let run = runtime.submit(RunSpec::default()).await.expect("submit");
        core.maintain().await;

        dead_letter_as_other_code(&queue).await;
        // As if a dead-retention sweep had removed another dead job meanwhile:
        // the count the next look compares against has not moved.
        let dead = queue
            .view()
            .stats("workflow-steps")
            .await
            .expect("stats")
            .dead;
        core.last_dead_count.store(dead, Ordering::Relaxed);
        let rounds = core.maintenance_rounds.load(Ordering::Relaxed);
        for _ in rounds..FULL_RECONCILE_EVERY - 1 {
            core.maintain().await;
        }
        assert!(
            core.view
                .run_record(&run.run_id)
                .await
                .expect("read")
                .is_some(),
            "not reconciled before the periodic pass"
        );
        core.maintain().await;
        let status = runtime
            .status(&run.run_id)
            .await
            .expect("status")
            .expect("known");
        assert!(
            matches!(status.state, crate::RunState::Terminated(ref t) if t.error.as_deref() == Some("hung")),
            "{status:?}"
        );
    }

    /// The run record of `run`, present while the run is active.
    async fn active(core: &RuntimeCore, run: &RunId) -> bool {
        core.view.run_record(run).await.expect("read").is_some()
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_store_spaces_its_dead_count_reads_and_a_foreign_dead_letter_waits_for_the_next()
    {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runtime =
            WorkflowRuntime::builder(queue.clone(), store, Never, NoopTerminalHook).build();
        let core = runtime.inner.core.clone();
        let run = runtime.submit(RunSpec::default()).await.expect("submit");
        core.maintain().await;
        // As if that read had taken 200 ms: on the default 500 ms poll
        // interval, the next read is 16 rounds later.
        let round = core.maintenance_rounds.load(Ordering::Relaxed);
        core.dead_count
            .read_at(round - 1, Duration::from_millis(200), core.poll_interval);

        dead_letter_as_other_code(&queue).await;
        for _ in 0..15 {
            core.maintain().await;
            assert!(
                active(&core, &run.run_id).await,
                "the count is not read between its spaced reads"
            );
        }
        core.maintain().await;
        assert!(
            !active(&core, &run.run_id).await,
            "the spaced read found the dead letter and reconciled it"
        );
    }

    /// A step that outlives its lease on its only attempt, then fails.
    struct LateFailure(Arc<tokio::sync::Notify>);

    impl StepRunner for LateFailure {
        async fn run_step(&self, _: &Step) -> std::result::Result<StepOutcome, StepError> {
            self.0.notified().await;
            Err(StepError::permanent("late failure"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_the_worker_lost_is_reconciled_at_the_next_round_however_spaced_the_reads() {
        let clock = taquba::MockClock::new(1_700_000_000_000);
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(
            Queue::open_with_options(
                store.clone(),
                "db",
                taquba::OpenOptions::default()
                    .clock(Arc::new(clock.clone()))
                    .flush_interval(Duration::from_millis(1))
                    .queue_config(
                        "workflow-steps",
                        taquba::QueueConfig::default().lease_duration(Duration::from_secs(10)),
                    ),
            )
            .await
            .expect("open"),
        );
        let release = Arc::new(tokio::sync::Notify::new());
        let poll = Duration::from_millis(50);
        let runtime = WorkflowRuntime::builder(
            queue.clone(),
            store,
            LateFailure(release.clone()),
            NoopTerminalHook,
        )
        .poll_interval(poll)
        .build();
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        let run = runtime
            .submit(RunSpec {
                options: crate::model::RunOptions {
                    max_attempts_per_step: Some(1),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await
            .expect("submit");
        // The step runs, and the first rounds have read the count.
        tokio::time::sleep(4 * poll).await;
        let round = core.maintenance_rounds.load(Ordering::Relaxed);
        assert!(round > 0, "maintenance ran");
        // As if every read took a second: 16 rounds apart.
        core.dead_count.read_at(round, Duration::from_secs(1), poll);
        // The step outlives its only lease: the reaper dead-letters it, and
        // the worker's settlement then finds its claim lost.
        clock.advance(Duration::from_secs(11));
        queue.reap_now().await.expect("reap");
        release.notify_one();
        for _ in 0..4 {
            tokio::time::sleep(poll).await;
        }
        assert!(
            core.maintenance_rounds.load(Ordering::Relaxed) < round + 16,
            "measured before the spaced read was due"
        );
        assert!(
            !active(&core, &run.run_id).await,
            "the lost claim made the next round read the count and reconcile the run"
        );
        let status = runtime
            .status(&run.run_id)
            .await
            .expect("status")
            .expect("known");
        assert!(
            matches!(status.state, crate::RunState::Terminated(ref t) if t.error.as_deref() == Some("lease expired")),
            "{status:?}"
        );
        worker.shutdown().await.expect("shutdown");
    }
}
