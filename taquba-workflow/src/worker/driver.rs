//! The worker loop: claims batches of jobs from the runtime's queue as
//! runner slots free up, runs each on its own task and settles it, and
//! does the periodic maintenance (dead-letter reconciliation, retention
//! sweeps). Runner calls are bounded by `max_concurrent_steps`;
//! settlements waiting for the durable commit are bounded separately, so a
//! slow WAL flush does not idle the runner slots.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use taquba::{Claim, EnqueueResult, NackOutcome, Queue};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Span, debug, error, warn};

use crate::engine::RuntimeCore;
use crate::engine::inner::RuntimeInner;
use crate::engine::settle::{SettleKind, Settlement};
use crate::error::Result;
use crate::history::cut_to;
use crate::hooks::guard::panic_message;
use crate::hooks::terminal::TerminalHook;
use crate::model::MAX_TERMINATION_ERROR_LEN;
use crate::runner::StepRunner;
use crate::store::durable::{self, DurableCurrentStep};
use crate::store::keys::{HEADER_TERMINAL, step_kv_key};
use crate::telemetry::spans;

/// Settlements in flight per runner slot (at least [`MIN_SETTLING`]): a
/// claimed job holds memory until it settles, so their number is bounded.
const SETTLING_PER_SLOT: usize = 4;
const MIN_SETTLING: usize = 64;
/// The longest pause after a failed claim; the pause doubles from the poll
/// interval's tenth up to this.
const MAX_CLAIM_BACKOFF: Duration = Duration::from_secs(5);

/// Run the worker loop of `inner` until `shutdown` resolves, then drain.
pub(crate) async fn run<R, H, F>(inner: Arc<RuntimeInner<R, H>>, shutdown: F) -> Result<()>
where
    R: StepRunner + 'static,
    H: TerminalHook + 'static,
    F: Future<Output = ()>,
{
    run_loop(inner, shutdown, Maintenance::Periodic).await
}

/// Who does the maintenance (dead-letter reconciliation, retention sweeps,
/// the inbox) of a worker loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Maintenance {
    /// A task beside the loop, at startup and every poll interval.
    Periodic,
    /// The caller, at points of its choosing (the test kit runs it when
    /// the queue is idle, so that its rounds are deterministic).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    ByCaller,
}

/// [`run`] with the maintenance done as `maintenance` says.
pub(crate) async fn run_loop<R, H, F>(
    inner: Arc<RuntimeInner<R, H>>,
    shutdown: F,
    maintenance: Maintenance,
) -> Result<()>
where
    R: StepRunner + 'static,
    H: TerminalHook + 'static,
    F: Future<Output = ()>,
{
    let core = inner.core.clone();
    let queue = core.queue.clone();
    let queue_name = core.queue_name.clone();
    // A name the queue refuses fails every claim: say so at once rather
    // than retry a claim that can never work.
    taquba::QueueName::new(queue_name.as_str())?;
    let slots = core.max_concurrent_steps;
    let runner_slots = Arc::new(Semaphore::new(slots));
    let settling = Arc::new(Semaphore::new(
        slots.saturating_mul(SETTLING_PER_SLOT).max(MIN_SETTLING),
    ));
    let lease = crate::hooks::guard::claim_lease(&queue, &queue_name);
    // Each claimed job runs on a task of its own (spawned, so never
    // aborted): dropping this loop's future stops the runner calls in
    // progress through `stop_runners`, while a settlement already under way
    // finishes on the task that made it (see `process_and_settle`). One
    // task per step: the settlement needs no second one.
    let tasks = TaskTracker::new();
    let stop_runners = CancellationToken::new();
    let _stop_runners_on_drop = stop_runners.clone().drop_guard();
    let mut shutdown = std::pin::pin!(shutdown);
    // Maintenance runs beside the claim loop, so a slow sweep (many expired
    // runs on a remote store) never holds up claiming.
    let stop_maintenance = CancellationToken::new();
    let maintenance = (maintenance == Maintenance::Periodic)
        .then(|| tokio::spawn(maintain_until(core.clone(), stop_maintenance.clone())));
    // The admission pump of concurrency keys, stopped with the maintenance.
    let pump = tokio::spawn(crate::engine::keys::pump_keys_until(
        core.clone(),
        stop_maintenance.clone(),
    ));
    // The prompt wakes of parents whose children ended here.
    let wakes = tokio::spawn(crate::engine::children::pump_child_wakes_until(
        core.clone(),
        stop_maintenance.clone(),
    ));
    // Stops the maintenance task also when this loop's future is dropped
    // (an aborted worker task), so it never outlives the loop.
    let _stop_on_drop = stop_maintenance.clone().drop_guard();
    let mut claim_backoff = Duration::ZERO;

    let closed = core.store_closed.clone();
    loop {
        // Wait for a runner slot and room for its settlement.
        let first = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            () = closed.cancelled() => break,
            permits = acquire_both(runner_slots.clone(), settling.clone()) => permits,
        };
        // Let the step tasks already woken run first: those whose runners
        // return now free their slots before the count below, so a claim
        // (a queue transaction whose cost is mostly per call) takes a fuller
        // batch. At the default 8 slots with runners that return at once,
        // this halves the claims per step (about 4 jobs a claim to 8).
        tokio::task::yield_now().await;
        let mut permits = vec![first];
        while let (Ok(runner), Ok(settle)) = (
            runner_slots.clone().try_acquire_owned(),
            settling.clone().try_acquire_owned(),
        ) {
            permits.push((runner, settle));
        }
        let claims = match queue
            .claim_batch(&queue_name, permits.len(), lease)
            .boxed()
            .await
        {
            Ok(claims) => {
                claim_backoff = Duration::ZERO;
                claims
            }
            Err(err) => {
                let err = crate::error::Error::from(err);
                core.note_error(&err);
                if closed.is_cancelled() {
                    break;
                }
                claim_backoff = (claim_backoff * 2)
                    .max(core.poll_interval / 10)
                    .max(Duration::from_millis(1))
                    .min(MAX_CLAIM_BACKOFF);
                warn!(queue = %queue_name, "claim failed, retrying in {claim_backoff:?}: {err}");
                drop(permits);
                tokio::select! {
                    biased;
                    _ = &mut shutdown => break,
                    () = closed.cancelled() => break,
                    _ = tokio::time::sleep(claim_backoff) => {}
                }
                continue;
            }
        };
        if claims.is_empty() {
            drop(permits);
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                () = closed.cancelled() => break,
                _ = queue.wait_for_jobs_on(&queue_name, core.poll_interval).boxed() => {}
            }
            continue;
        }
        for (claim, (runner_permit, settle_permit)) in claims.into_iter().zip(permits) {
            let inner = inner.clone();
            let queue = queue.clone();
            let stop_runners = stop_runners.clone();
            tasks.spawn(async move {
                #[cfg(feature = "metrics")]
                let _in_flight = crate::telemetry::metrics::InFlight::begin(&inner.core.queue_name);
                let span = spans::step(&inner.core.queue_name, claim.job(), || {
                    inner.span_names(claim.job())
                });
                #[cfg(feature = "opentelemetry")]
                crate::telemetry::otel::link_signal_sender(&inner.core.queue, &span, claim.job()).await;
                // Boxed: the step's future is kilobytes (the runner's own
                // future inside it), and a task is moved several times on
                // its way into the scheduler; a box moves as one pointer.
                // The claim stays here, lent to it: the future holds it
                // once (an async fn keeps what it is given beside what it
                // takes apart).
                let work = AssertUnwindSafe(Box::pin(process_and_settle(&inner, &queue, &claim, runner_permit, span, &stop_runners)));
                if let Err(panic) = work.catch_unwind().await {
                    // The runner's own panics are caught inside; this is the
                    // runtime's, and the claim is left to its lease.
                    warn!(job_id = %claim.id, "worker task panicked: {}", panic_message(panic.as_ref()));
                }
                drop(settle_permit);
            });
        }
    }
    debug!(queue = %queue_name, in_flight = tasks.len(), "worker loop draining");
    if closed.is_cancelled() {
        // The store is closed to this process (another process opened it):
        // no step running here can commit its settlement, and the new
        // writer delivers each again. Their runner calls are dropped now
        // rather than run to their end, so the worker stops promptly.
        stop_runners.cancel();
    }
    tasks.close();
    tasks.wait().await;
    stop_maintenance.cancel();
    if let Err(err) = pump.await {
        warn!("concurrency key pump ended abnormally: {err}");
    }
    if let Err(err) = wakes.await {
        warn!("child wake pump ended abnormally: {err}");
    }
    let periodic = maintenance.is_some();
    if let Some(maintenance) = maintenance
        && let Err(err) = maintenance.await
    {
        warn!("maintenance task ended abnormally: {err}");
    }
    if periodic && !closed.is_cancelled() {
        // A cancel command accepted in a round whose running step settled
        // during the drain gets its answer now, not at the next start
        // (a process that exits once its run ended would leave it
        // `Accepted` until then).
        if let Err(err) = core.apply_inbox().await {
            warn!("inbox round at shutdown: {err}");
        }
        core.record_clean_stop().await;
    }
    if closed.is_cancelled() {
        // The store is closed to this process (another process opened it):
        // nothing more can be committed here.
        return Err(core.store_closed_error());
    }
    Ok(())
}

/// Dead-letter reconciliation and retention sweeps at startup and every poll
/// interval, until `stop` fires. A round in progress when `stop` fires is
/// abandoned: each of its commits is whole, and the next start redoes the
/// rest.
async fn maintain_until(core: Arc<RuntimeCore>, stop: CancellationToken) {
    let _maintaining = core.maintaining();
    let period = core.poll_interval.max(Duration::from_millis(1));
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = core.maintain().boxed() => {}
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

async fn acquire_both(
    runner_slots: Arc<Semaphore>,
    settling: Arc<Semaphore>,
) -> (
    tokio::sync::OwnedSemaphorePermit,
    tokio::sync::OwnedSemaphorePermit,
) {
    // Neither semaphore is ever closed.
    let settle = settling.acquire_owned().await.expect("semaphore open");
    let runner = runner_slots.acquire_owned().await.expect("semaphore open");
    (runner, settle)
}

/// Process one claimed job and apply its settlement. Settlement failures
/// affect this job only: a lost claim means a redelivery settles it, any
/// other failure leaves the claim to the reaper.
///
/// This runs on a spawned task that nothing aborts, so the settlement runs
/// whole once begun: a settlement dropped while its commit waits for the
/// WAL flush would leave its next step committed but never claimed (see
/// [`crate::run::commit`]). `stop_runners` fires when the worker loop's
/// future is dropped: a step whose runner (or hook) is still running is
/// then dropped unsettled, and delivered again once its lease expires.
async fn process_and_settle<R: StepRunner, H: TerminalHook>(
    inner: &RuntimeInner<R, H>,
    queue: &Arc<Queue>,
    claim: &Claim,
    runner_permit: tokio::sync::OwnedSemaphorePermit,
    span: Span,
    stop_runners: &CancellationToken,
) {
    let lease = queue.lease_handle(claim);
    let settlement = tokio::select! {
        biased;
        () = stop_runners.cancelled() => return,
        settlement = spans::within(span.clone(), inner.process(claim, &lease, runner_permit)) => settlement,
    };
    spans::settling(&span, settlement.span_outcome());
    spans::within(span, settle(&inner.core, queue, claim, settlement)).await;
}

/// Logs a settlement refused because the claim has ended. Normally its
/// lease expired and the queue's reaper redelivered the step, so the new
/// attempt settles it. taquba 0.14's reaper can also drop the lease of a
/// claim whose own commit took longer than the lease (the lease is
/// registered before the commit; the reaper finds no claimed record yet
/// and discards the entry): the job then stays claimed with no lease, and
/// nothing in this process redelivers it until the queue is next opened,
/// which re-queues every claimed record. That case is told apart — the
/// record is still this attempt's claim and the queue holds no lease for
/// it — and logged as an error naming the job and the remedy, since the
/// run shows `Running` until then.
async fn report_lost_claim(queue: &Queue, claim: &Claim) {
    let orphaned = queue.lease_expiry(&claim.queue, &claim.id).is_none()
        && matches!(
            queue.view().job_record(&claim.id).await,
            Ok(Some(record))
                if record.status == taquba::JobStatus::Claimed && record.attempts == claim.attempts
        );
    if orphaned {
        error!(
            job_id = %claim.id,
            attempt = claim.attempts,
            "the queue holds this step claimed with no lease (its lease was dropped while the \
             claim committed): it is redelivered when the queue is next opened"
        );
    } else {
        warn!(
            job_id = %claim.id,
            "step outlived its lease; the redelivered attempt settles it"
        );
    }
}

/// Apply `settlement` to `claim`: its commit, then what the commit tells
/// (the run's end, the next step's pointer on a dedup hit). A plain fn
/// returning the future: the settlement is taken apart before the future is
/// built, so the future holds each part once (an async fn would also keep
/// the whole settlement it was given for as long as it runs).
fn settle<'a>(
    core: &'a RuntimeCore,
    queue: &'a Queue,
    claim: &'a Claim,
    settlement: Settlement,
) -> impl Future<Output = ()> + Send + 'a {
    let Settlement {
        kind,
        inflight,
        signal_lock,
        next_step,
        ended,
        continued: _,
        history,
    } = settlement;
    async move {
        #[cfg(feature = "metrics")]
        let transition = match &ended {
            Some(ending) => ending.end.termination.status.as_str(),
            None => "continued",
        };
        // The ending moves into the commit's report below.
        let ended_run = ended.as_ref().map(|ending| ending.run_id.clone());
        let ends_run = ended_run.is_some();
        let result = match kind {
            SettleKind::Ack(effects) => {
                let terminating = core.commits.terminating(ended);
                let acked = terminating
                    .finish(queue.ack_with(claim, effects).await, |_| true)
                    .await
                    .map(Some);
                // A notification's acknowledgement moves no run.
                #[cfg(feature = "metrics")]
                if acked.is_ok() && (ends_run || next_step.is_some()) {
                    crate::telemetry::metrics::transition(&core.queue_name, transition);
                }
                acked
            }
            SettleKind::Retry(error) => {
                let error = cut_to(&error, MAX_TERMINATION_ERROR_LEN);
                let retried = queue.nack(claim, &error).await.map(|()| None);
                if retried.is_ok() && claim.job().is_last_attempt() {
                    // Out of attempts, the nack dead-lettered the step and
                    // its run is still active: maintenance reconciles it.
                    core.dead_count.expect_change();
                }
                #[cfg(feature = "metrics")]
                if retried.is_ok() {
                    crate::telemetry::metrics::retried(&core.queue_name);
                }
                retried
            }
            SettleKind::Fail {
                error,
                permanent,
                effects,
            } => {
                let error = cut_to(&error, MAX_TERMINATION_ERROR_LEN);
                // Counted before the commit, so a look between the commit and
                // the count cannot take it for a foreign dead letter; uncounted
                // when no dead letter happened. Only a dead letter that ends its
                // run in the same commit (or a notification's, which has no run
                // to reconcile) is the worker's own: one that leaves the run
                // active (an infrastructure failure) is reconciled by the next
                // maintenance round, as a foreign one is.
                let own = ends_run || claim.job().headers.contains_key(HEADER_TERMINAL);
                if own {
                    core.note_own_dead_letter();
                }
                let terminating = core.commits.terminating(ended);
                let dead_letter = if permanent {
                    queue
                        .dead_letter_with(claim, &error, effects)
                        .await
                        .map(|_| true)
                } else {
                    queue
                        .nack_with(claim, &error, effects)
                        .await
                        .map(|outcome| matches!(outcome, NackOutcome::DeadLettered(_)))
                };
                let dead_lettered = terminating.finish(dead_letter, |dead| *dead).await;
                if own && !matches!(dead_lettered, Ok(true)) {
                    core.forget_own_dead_letter();
                }
                if !own && matches!(dead_lettered, Ok(true)) {
                    // A dead letter that left its run active: maintenance
                    // reconciles it at its next round.
                    core.dead_count.expect_change();
                }
                #[cfg(feature = "metrics")]
                if matches!(dead_lettered, Ok(true)) {
                    crate::telemetry::metrics::dead_lettered(&core.queue_name, "worker");
                    if ends_run {
                        crate::telemetry::metrics::transition(&core.queue_name, transition);
                    }
                }
                dead_lettered.map(|_| None)
            }
        };
        drop(signal_lock);
        if result.is_ok()
            && let Some(run_id) = &ended_run
        {
            core.run_records.forget(run_id);
        }
        match result {
            Ok(Some(results)) => {
                if let (Some((run_id, _)), Some(EnqueueResult::New(next_job))) =
                    (&next_step, results.first())
                {
                    // The run's record is unchanged by the settlement: its
                    // cached copy now answers the next step.
                    core.run_records.advance(run_id, &claim.id, next_job);
                }
                if let (
                    Some((run_id, step_number)),
                    Some(EnqueueResult::AlreadyEnqueued(existing)),
                ) = (next_step, results.first())
                {
                    // The next step was already pending (a stale job of an
                    // earlier attempt): point the run at it, with the history
                    // the pointer carries.
                    // The entries the committed pointer carries: kept in memory,
                    // else read back from it.
                    let mut pending = history.and_then(|job_id| core.history_cache.take(&job_id));
                    if pending.is_none() {
                        pending = durable::kv_record::<DurableCurrentStep>(
                            queue.view(),
                            &step_kv_key(&run_id),
                        )
                        .await
                        .ok()
                        .flatten()
                        .and_then(|pointer| pointer.history);
                    }
                    let pointer = DurableCurrentStep {
                        step_number,
                        job_id: existing.clone(),
                        history: pending.clone(),
                    };
                    match queue
                        .kv_put(&step_kv_key(&run_id), &durable::encode(&pointer))
                        .await
                    {
                        Ok(()) => {
                            core.run_records.advance(&run_id, &claim.id, existing);
                            if let Some(pending) = pending {
                                core.history_cache.put(existing.clone(), pending);
                            }
                        }
                        Err(err) => {
                            warn!(run_id = %run_id, "failed to adopt the pending next step: {err}");
                        }
                    }
                }
            }
            Ok(None) => {}
            Err(taquba::Error::ClaimLost) => {
                // The lease expired and the reaper retried the step or, out
                // of attempts, dead-lettered it with its run still active.
                core.dead_count.expect_change();
                report_lost_claim(queue, claim).await;
            }
            Err(err) => {
                let err = crate::error::Error::from(err);
                core.note_error(&err);
                warn!(job_id = %claim.id, "settlement failed; the lease expiry redelivers the step: {err}");
            }
        }
        drop(inflight);
    }
}
