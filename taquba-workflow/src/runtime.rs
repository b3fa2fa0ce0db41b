//! The public face of the runtime: [`WorkflowRuntime`] and its builder. The
//! data it takes and returns is in `model`; the work itself is in the
//! engine (`run/`: submission, cancellation, waits, settlement) and the
//! worker loop (`worker/`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::{Clock, Queue, WorkerHandle};

use crate::coordination::group::RunGroup;
use crate::coordination::signal::SignalOutcome;
use crate::engine::inner::RuntimeInner;
use crate::engine::{OpsSettings, RuntimeCore, Settings};
use crate::error::Result;
use crate::fork::ForkOptions;
use crate::history::DEFAULT_HISTORY_LIMIT;
use crate::history::naming::{Naming, runner_label};
use crate::hooks::guard::{self, MAX_HOOK_TIMEOUT, default_hook_timeout};
use crate::hooks::terminal::TerminalHook;
use crate::model::RunOutcome;
use crate::model::{RunEnd, RunSpec, RunState, RunStatus, SubmitOutcome};
use crate::run::commit::{detached, detached_unless_handed_over};
use crate::runner::StepRunner;
use crate::store::keys::RunId;
use crate::telemetry::spans;
use crate::view::WorkflowView;

/// The default queue name of a runtime.
pub(crate) const DEFAULT_QUEUE_NAME: &str = "workflow-steps";
/// The default bound on concurrent runner calls.
pub(crate) const DEFAULT_MAX_CONCURRENT_STEPS: usize = 8;
/// The highest bound on concurrent runner calls; a higher one is taken as
/// this (Tokio's semaphores hold at most `usize::MAX >> 3` permits, and
/// the worker keeps four settlements in flight per slot).
pub(crate) const MAX_CONCURRENT_STEPS: usize = 1 << 16;
/// The default poll interval of the worker loop.
pub(crate) const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The shortest poll interval.
pub(crate) const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// The default retention of inbox command records.
pub(crate) const DEFAULT_COMMAND_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The handle of a spawned worker loop; [`WorkerHandle::shutdown`] stops
/// claiming, drains the steps in flight and returns the loop's result.
pub type RunnerHandle = WorkerHandle<Result<()>>;

/// A workflow runtime over one [`taquba::Queue`]: submits runs, runs their
/// steps through a [`StepRunner`] and reports their status.
///
/// Cheap to clone; clones share everything. Producers and the worker live
/// in one process (the queue is single-writer); another process observes
/// runs through a [`WorkflowView`] over a `taquba::QueueReader`.
pub struct WorkflowRuntime<R, H> {
    pub(crate) inner: Arc<RuntimeInner<R, H>>,
}

impl<R, H> Clone for WorkflowRuntime<R, H> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<R: StepRunner, H: TerminalHook> WorkflowRuntime<R, H> {
    /// Start building a runtime over `queue`, storing memos and other
    /// objects in `object_store` (usually the store the queue was opened
    /// on), running steps with `runner` and terminations with
    /// `terminal_hook` ([`NoopTerminalHook`](crate::NoopTerminalHook) for
    /// none).
    pub fn builder(
        queue: Arc<Queue>,
        object_store: Arc<dyn ObjectStore>,
        runner: R,
        terminal_hook: H,
    ) -> WorkflowRuntimeBuilder<R, H> {
        WorkflowRuntimeBuilder {
            queue,
            object_store,
            runner,
            terminal_hook,
            queue_name: DEFAULT_QUEUE_NAME.to_string(),
            memo_prefix: None,
            max_concurrent_steps: DEFAULT_MAX_CONCURRENT_STEPS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            memo_retention: None,
            group_retention: None,
            step_output_replay: false,
            clock: None,
            hook_timeout: None,
            history_limit: DEFAULT_HISTORY_LIMIT,
            step_input_limit: crate::history::DEFAULT_STEP_INPUT_LIMIT,
            command_retention: DEFAULT_COMMAND_RETENTION,
            naming: Naming::default(),
            runner_label: None,
        }
    }

    /// Submit a run: enqueue step 0 with `spec.input`, writing the run
    /// record (with the input's SHA-256), the current-step pointer and
    /// `spec.effects` in the same transaction.
    ///
    /// Idempotent on `(run_id, input)`: a run id that is active with the
    /// same input returns `newly_submitted: false` and writes nothing.
    ///
    /// A run id whose run terminated starts a new run (with any input).
    /// Its steps run afresh: the earlier run's
    /// [step-output replay](crate::WorkflowRuntimeBuilder::step_output_replay)
    /// records are never replayed. Its memo entries
    /// ([`Delivery::memo`](crate::Delivery::memo),
    /// [`Delivery::run_memo`](crate::Delivery::run_memo)) are shared with
    /// the earlier run, as in 0.13: a memoized call is not repeated (use a
    /// new run id for a clean memo), and
    /// [`memo_retention`](crate::WorkflowRuntimeBuilder::memo_retention)
    /// keeps them until a window after the last run's end.
    ///
    /// # Cancel safety
    ///
    /// Dropped at any await, it either never committed or commits and runs
    /// as if awaited; submitting the same run id and input again answers
    /// for it.
    ///
    /// # Errors
    /// Nothing is committed on an error.
    /// - [`Error::InputMismatch`](crate::Error::InputMismatch): the run is
    ///   active with a different input.
    /// - [`Error::GroupMemberRunId`](crate::Error::GroupMemberRunId): the
    ///   run id is a terminated group member's, or an active member's with
    ///   another input (an active member's with its own input is answered
    ///   as a duplicate, as in 0.13).
    /// - [`Error::ReservedHeaderInSubmit`](crate::Error::ReservedHeaderInSubmit):
    ///   a `workflow.` header in `spec.options` or on an enqueue of
    ///   `spec.effects`.
    /// - [`Error::InvalidRunOptions`](crate::Error::InvalidRunOptions): more
    ///   than [`MAX_HEADERS`](crate::limits::MAX_HEADERS) headers, over
    ///   [`MAX_HEADERS_SIZE`](crate::limits::MAX_HEADERS_SIZE) bytes of
    ///   them, or a `run_at` past
    ///   [`MAX_RUN_AT_MS`](crate::limits::MAX_RUN_AT_MS) (the value named).
    /// - [`Error::ReservedKvKey`](crate::Error::ReservedKvKey): an effect
    ///   under `workflow/`.
    /// - [`Error::Queue`](crate::Error::Queue): an enqueue of `spec.effects`
    ///   into the runtime's own queue ([`taquba::Error::InvalidQueueName`]
    ///   naming it), a queue that rejects the enqueue, or a store failure.
    /// - [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown): the
    ///   Tokio runtime shut down first.
    pub async fn submit(&self, spec: RunSpec) -> Result<SubmitOutcome> {
        let core = self.inner.core.clone();
        let span = spans::submit(&core.queue_name, spec.run_id.as_deref());
        let recorded = span.clone();
        let handed_over = RuntimeCore::joins_group_commit(&spec);
        detached_unless_handed_over(
            handed_over,
            spans::within(span, async move {
                let submitted = core.submit(spec).await;
                spans::submitted(&recorded, &submitted);
                submitted
            }),
        )
        .await
    }

    /// The runtime's read-only view.
    pub fn view(&self) -> &WorkflowView {
        &self.inner.core.view
    }

    /// The status of `run_id`; `None` for a run never submitted or whose
    /// records retention removed. See [`WorkflowView::status`].
    ///
    /// Reports only durable terminations: while this process's commit that
    /// terminates the run waits for its WAL flush (a crash would lose it),
    /// the answer waits for that commit to report (see [`Self::wait`]);
    /// [`Self::view`] answers what the store shows at once.
    ///
    /// # Errors
    /// Storage errors; [`Error::InconsistentRunState`](crate::Error::InconsistentRunState)
    /// when the records disagree; the store-closed error once another
    /// process opened the store.
    pub async fn status(&self, run_id: &RunId) -> Result<Option<RunStatus>> {
        let core = &self.inner.core;
        core.durable_read(
            run_id,
            || core.view.status(run_id),
            |status| {
                status
                    .as_ref()
                    .is_some_and(|status| matches!(status.state, RunState::Terminated(_)))
            },
        )
        .await
    }

    /// The committed outcome of a terminated run; `None` while it runs, for
    /// an unknown run and for a run terminated without a worker. See
    /// [`WorkflowView::outcome`].
    ///
    /// Reports only durable terminations, as [`Self::status`] does.
    ///
    /// # Errors
    /// Storage errors; the store-closed error once another process opened
    /// the store.
    pub async fn outcome(&self, run_id: &RunId) -> Result<Option<RunOutcome>> {
        let core = &self.inner.core;
        core.durable_read(run_id, || core.view.outcome(run_id), Option::is_some)
            .await
    }

    /// Wait until `run_id` terminates and report its termination and
    /// outcome. A terminated run is reported at once, from its terminal
    /// record and its run result record; the outcome of a run that ended
    /// lately in this process (the last 4,096 ends, their outcomes up to
    /// 64 KiB each and 8 MiB in all) is taken from memory instead of its
    /// result record, for the termination the terminal record names only.
    /// The wait is woken
    /// in-process by the commit that terminates the run (one read when it
    /// starts, none per step), so it belongs in the process that runs the
    /// worker; every runtime over the same `Arc<Queue>` there wakes it.
    /// Every [`poll_interval`](crate::WorkflowRuntimeBuilder::poll_interval)
    /// it also looks at the run's current step, so a step dead-lettered
    /// outside the worker (the queue's reaper) ends the wait promptly. While
    /// this runtime's worker runs, looks that find the same step still
    /// waiting its turn (pending, or scheduled on a timer or a signal) come
    /// twice as far apart each time, up to 16 poll intervals and at most
    /// 30 s (never under one poll interval): such a step ends only once
    /// claimed, and the worker's settlement or its maintenance wakes the
    /// wait then. Many waits on parked runs cost a few reads a second
    /// between them; a claimed step is looked at every poll interval.
    ///
    /// # Cancel safety
    ///
    /// A read, but for the reconciliation of such a dead
    /// letter, which commits on a task of its own; dropped, the wait leaves
    /// the run as it found it or reconciled.
    ///
    /// # Errors
    /// [`Error::RunNotFound`](crate::Error::RunNotFound) for a run that is
    /// neither active nor recorded as terminated; storage errors.
    pub async fn wait(&self, run_id: &RunId) -> Result<RunEnd> {
        self.inner.core.wait_run(run_id).await
    }

    /// [`wait`](Self::wait) bounded by `timeout`: `Ok(None)` when the run
    /// has not terminated by then. The timeout bounds the waiting, not the
    /// reads of the run's records: a run that terminated before the call is
    /// reported even with a zero timeout (so `wait_timeout(id,
    /// Duration::ZERO)` is a look that does not wait).
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    pub async fn wait_timeout(&self, run_id: &RunId, timeout: Duration) -> Result<Option<RunEnd>> {
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        match deadline {
            Some(deadline) => self.inner.core.wait_run_until(run_id, Some(deadline)).await,
            // Beyond Tokio's clock: no deadline.
            None => self.wait(run_id).await.map(Some),
        }
    }

    /// Cancel a run from outside the runner. The request is recorded on the
    /// run's durable record. A waiting (pending, scheduled, signal-waiting)
    /// step is removed and the run ends `Cancelled` before this returns; a
    /// running step's [`Delivery::cancel_token`](crate::Delivery::cancel_token)
    /// fires and the run ends `Cancelled` when the step returns, whatever it
    /// returned. A step claimed by a worker of another runtime over the
    /// queue cannot be judged from here, so the call then waits for that
    /// step to settle (a step record whose offloaded payload object is gone
    /// is waited on by its record, not failed on).
    ///
    /// `Ok(true)` means this call's request ends the run `Cancelled`: of
    /// several concurrent calls on one run exactly one answers `true` (the
    /// one that recorded the request), so a caller can act once on it (a
    /// refund, an audit event); the others answer `Ok(false)`. There is one
    /// termination and one terminal notification however many calls race.
    /// A run whose step was dead-lettered outside the worker (the reaper
    /// took it after its last lease expired; crash recovery) has failed:
    /// the call answers `Ok(false)` and the run ends `Failed` with the
    /// queue's last error. A step running in this process when the call
    /// reached it is the exception: `Ok(true)` is answered once the request
    /// is recorded against that step, and should the step then outlive its
    /// lease on its last attempt, the reaper's dead letter came after the
    /// cancellation and the run ends `Cancelled` all the same (whichever
    /// runtime over the queue reconciles it, also after a restart).
    ///
    /// A run that started [child runs](crate::children) cancels its active
    /// children (and theirs) first, with the reason naming it, and waits
    /// for their ends before its own step is reached (a child's step
    /// running in this process ends when it returns). A step of the run
    /// itself that a worker claims during that wait sees the request and
    /// ends the run without waiting.
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, either nothing was requested, or the request is applied
    /// to the current step as if the call had been awaited (a waiting step
    /// is removed, a running one's token fires).
    ///
    /// # Errors
    /// Storage errors; [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    /// Returns `Ok(false)` for an unknown or already terminated run, when
    /// another call recorded the request first, when the run's terminating
    /// settlement was already committing, and for a dead-lettered step.
    pub async fn cancel(&self, run_id: &RunId) -> Result<bool> {
        let (core, run_id) = (self.inner.core.clone(), run_id.clone());
        let span = spans::cancel(&core.queue_name, &run_id);
        let recorded = span.clone();
        detached(spans::within(span, async move {
            let cancelled = core.cancel(&run_id).await;
            spans::cancelled(&recorded, &cancelled);
            cancelled
        }))
        .await
    }

    /// [`cancel`](Self::cancel), recording `reason` with the request: it is
    /// reported by [`WorkflowView::run`] (`cancel_reason`) and in the
    /// cancelled step's history ([`WorkflowView::steps`]). The run's
    /// [`RunOutcome::error`](crate::RunOutcome::error) stays `None`, as for
    /// every cancellation from outside. A reason given to a run whose
    /// cancellation was already requested is not recorded.
    ///
    /// # Cancel safety
    ///
    /// As [`cancel`](Self::cancel), the whole call runs on a
    /// task of its own.
    ///
    /// # Errors
    /// As [`cancel`](Self::cancel).
    pub async fn cancel_with_reason(
        &self,
        run_id: &RunId,
        reason: impl Into<String>,
    ) -> Result<bool> {
        let request = crate::engine::cancel::CancelRequest {
            reason: Some(crate::history::cut(&reason.into())),
            ..Default::default()
        };
        let (core, run_id) = (self.inner.core.clone(), run_id.clone());
        let span = spans::cancel(&core.queue_name, &run_id);
        let recorded = span.clone();
        detached(spans::within(span, async move {
            let cancelled = core
                .cancel_as(&run_id, request)
                .await
                .map(|answer| answer.unwrap_or(false));
            spans::cancelled(&recorded, &cancelled);
            cancelled
        }))
        .await
    }

    /// Resume `run_id`, which failed because its step job was
    /// dead-lettered: its final step is enqueued again (the dead job's
    /// payload, headers, priority and attempt limit, fresh attempts) and
    /// the run is active again under its id, its history continuing with a
    /// `Requeued` marker, in one transaction. The dead job stays in the
    /// dead letters. Returns the run and its new step job.
    ///
    /// # Errors
    /// [`Error::CommandRefused`](crate::Error::CommandRefused) naming the
    /// run when it is active, unknown, succeeded, was cancelled, failed by
    /// a runner's `Fail` verdict, or its dead job was removed by the
    /// queue's dead retention; storage errors;
    /// [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, the run is requeued as if the call had been awaited, or
    /// nothing was committed.
    pub async fn requeue(&self, run_id: &RunId) -> Result<SubmitOutcome> {
        let (core, id) = (self.inner.core.clone(), run_id.clone());
        let (_, job_id) = detached(async move {
            core.requeue_recorded(&id, |_, _| taquba::SettlementEffects::default())
                .await
        })
        .await?;
        Ok(SubmitOutcome {
            run_id: run_id.clone(),
            newly_submitted: true,
            job_id,
        })
    }

    /// Start a new run from step `from_step` of the ended run `run_id`:
    /// a new id (a ULID, or [`ForkOptions::run_id`]) linked to the
    /// original ([`RunDetails::forked_from`](crate::view::RunDetails::forked_from)),
    /// whose first step is step `from_step` with the payload it was
    /// delivered with ([`WorkflowView::step_input`]: from the step's
    /// history entry, else its job while the queue keeps it). The steps
    /// before it are not run again; the new run's steps keep the original's
    /// numbers (its first step is `from_step`), so a runner that looks at
    /// [`Step::step_number`](crate::Step::step_number) sees what it saw.
    /// A step a signal woke gets that signal again
    /// ([`Step::signal`](crate::Step::signal)) when its history entry kept
    /// it: the signal and the kept payload share the
    /// [step input limit](crate::WorkflowRuntimeBuilder::step_input_limit);
    /// a signal not kept leaves the fork's step with none, as after a
    /// timeout. The fork's run memo starts empty.
    /// The submitter's headers carry over (from the original's recorded
    /// outcome; none for a run that ended without a worker settling it, a
    /// cancelled waiting step or a reconciled dead letter); the priority and attempt limit are the queue's defaults;
    /// a group membership, a job's idempotency key and a `run_at` do not
    /// carry over (the fork is a plain run). The original is left as it
    /// was. Returns the new run and its first step job
    /// (`newly_submitted: false` for a retried fork under the same
    /// [`ForkOptions::run_id`], which answers the fork already made).
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at any await, the
    /// fork is made as if the call had been awaited (with
    /// [`ForkOptions::cancel_active`], the original's cancel included), or
    /// nothing was committed. Should the process end after the cancel of
    /// an active original, the original may be cancelled without the fork
    /// being made: call again with the same [`ForkOptions::run_id`] (which
    /// forks the ended run from its records, and is refused when the
    /// step's only recorded input was the job the cancel deleted).
    ///
    /// With [`ForkOptions::cancel_active`], an active original is read
    /// before it is cancelled: whatever refuses the fork refuses it with
    /// the original left running, and the step's input is held while the
    /// run is cancelled and waited for (it does not change once the step is
    /// enqueued, so the run moving past the step or ending on its own
    /// meanwhile changes nothing).
    ///
    /// # Errors
    /// - [`Error::RunActive`](crate::Error::RunActive): the original has
    ///   not ended, and [`ForkOptions::cancel_active`] is not set.
    /// - [`Error::StepNotForkable`](crate::Error::StepNotForkable) naming
    ///   the run and step: an unknown run, a step it never reached (an
    ///   active run: has not reached yet), or a step whose input is no
    ///   longer recorded (see [`WorkflowView::step_input`]); for an active
    ///   original, before it is cancelled.
    /// - [`Error::ForkRunIdTaken`](crate::Error::ForkRunIdTaken): the given
    ///   run id names a run that is not this fork.
    /// - Storage errors; [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn fork(
        &self,
        run_id: &RunId,
        from_step: u32,
        options: ForkOptions,
    ) -> Result<SubmitOutcome> {
        let (core, run_id) = (self.inner.core.clone(), run_id.clone());
        detached(async move { core.fork(&run_id, from_step, &options).await }).await
    }

    /// Start the ended run `run_id` again from step 0 under a new id: the
    /// [`fork`](Self::fork) from step 0 (its input is the run's input, from
    /// step 0's history entry or its job while the queue keeps it).
    ///
    /// # Cancel safety
    ///
    /// As [`fork`](Self::fork): runs whole on a task of its own.
    ///
    /// # Errors
    /// As [`fork`](Self::fork).
    pub async fn restart(&self, run_id: &RunId, options: ForkOptions) -> Result<SubmitOutcome> {
        self.fork(run_id, 0, options).await
    }

    /// Apply the commands waiting in this runtime's inbox
    /// ([`Inbox`](crate::inbox::Inbox)) now, as the worker's maintenance does
    /// every [`poll_interval`](crate::WorkflowRuntimeBuilder::poll_interval):
    /// at most 64 per call, in id order. For a tool that opened a store no
    /// process owns (after checking that no writer is active) and applies
    /// commands without running steps. Returns how many commands were
    /// handled (applied, rejected, or found applied before).
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, the round completes as if awaited; each command is applied
    /// once with its record in any case.
    ///
    /// # Errors
    /// Storage errors (commands not reached are left for the next call);
    /// [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn apply_inbox(&self) -> Result<usize> {
        let core = self.inner.core.clone();
        detached(async move { core.apply_inbox().await }).await
    }

    /// The run group `id` of this runtime (nothing is written until it is
    /// submitted).
    pub fn group(&self, id: RunId) -> RunGroup {
        RunGroup::new(self.inner.core.clone(), id)
    }

    /// A run group with a fresh ULID id on the runtime's clock, ordered
    /// with the runtime's generated run ids.
    pub fn new_group(&self) -> RunGroup {
        self.group(self.inner.core.new_run_id())
    }

    /// Spawn the worker loop as a Tokio task; it stops when `shutdown`
    /// resolves or [`RunnerHandle::shutdown`] is called, after the steps in
    /// flight settle.
    pub fn spawn<F>(&self, shutdown: F) -> RunnerHandle
    where
        F: Future<Output = ()> + Send + 'static,
        R: 'static,
        H: 'static,
    {
        let inner = self.inner.clone();
        WorkerHandle::spawn(shutdown, move |stop| async move {
            crate::worker::driver::run(inner, stop.cancelled_owned()).await
        })
    }

    /// Run the worker loop on the current task until `shutdown` resolves:
    /// claim steps and notification jobs, run them, settle them; reconcile
    /// runs whose step was dead-lettered outside the worker; sweep expired
    /// retention markers at startup and every poll interval.
    ///
    /// # Cancel safety
    ///
    /// Dropping this future stops the loop at once, without
    /// the drain of a shutdown. Runner (and hook) calls in flight are
    /// dropped and their steps delivered again once their leases expire;
    /// settlements already committing run on tasks of their own and
    /// complete, so no committed step is left unclaimed.
    ///
    /// # Errors
    /// [`Error::Queue`](crate::Error::Queue) with
    /// [`taquba::Error::InvalidQueueName`] at once for a
    /// [`queue_name`](crate::WorkflowRuntimeBuilder::queue_name) the queue
    /// refuses (over 255 bytes); the store-closed error
    /// ([`Error::is_store_closed`](crate::Error::is_store_closed)) once
    /// another process opened the store. Otherwise none: storage errors are logged and retried at the poll
    /// interval, so the loop keeps serving runs through an outage. Writes
    /// of the queue itself wait out an outage (SlateDB retries them until
    /// the store answers), so during one the loop, and the drain of a
    /// shutdown, wait too: bound a shutdown with `tokio::time::timeout`
    /// where the process must exit (docs/storage.md, "Storage outages").
    pub async fn run<F>(&self, shutdown: F) -> Result<()>
    where
        F: Future<Output = ()>,
        R: 'static,
        H: 'static,
    {
        crate::worker::driver::run(self.inner.clone(), shutdown).await
    }

    /// Deliver a durable signal under `correlation_key`. A run waiting on
    /// the key ([`Trigger::OnSignal`](crate::Trigger::OnSignal)) is woken:
    /// its next step becomes claimable at once with
    /// [`Step::signal`](crate::Step::signal) `Some(payload)`
    /// ([`SignalOutcome::Delivered`]). With no waiter the signal is held
    /// durably and consumed by the next waiter ([`SignalOutcome::Buffered`]);
    /// a later signal replaces a buffered one.
    ///
    /// A buffered signal outlives the wait it was meant for: one sent
    /// before its run waits is what 0.13 buffers for, but one sent after
    /// that wait timed out, or sent twice, is held as well and wakes the
    /// next wait on the key, whichever run's it is (a later run reusing the
    /// key sees it at once). Use keys unique to one wait (include the run
    /// id), [`clear_signal`](Self::clear_signal) a signal no longer wanted,
    /// or send with [`signal_run`](Self::signal_run), which reaches only
    /// the named run's current wait and buffers nothing.
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, the signal is not sent, or it is delivered or buffered
    /// as if the call had been awaited.
    ///
    /// # Errors
    /// [`Error::Queue`](crate::Error::Queue) with `KvValueTooLarge` for a
    /// payload over [`taquba::MAX_KV_VALUE_SIZE`]; storage errors;
    /// [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn signal(&self, correlation_key: &str, payload: Vec<u8>) -> Result<SignalOutcome> {
        let (core, key) = (self.inner.core.clone(), correlation_key.to_string());
        let span = spans::signal(&core.queue_name, correlation_key, None);
        let recorded = span.clone();
        detached(spans::within(span, async move {
            let signalled = core.signal(&key, payload).await;
            spans::signalled(&recorded, &signalled, |outcome| match outcome {
                SignalOutcome::Delivered => "delivered",
                SignalOutcome::Buffered => "buffered",
            });
            signalled
        }))
        .await
    }

    /// Deliver a signal to `run_id`'s current wait on `correlation_key`, and
    /// to nothing else: its next step becomes claimable at once with
    /// [`Step::signal`](crate::Step::signal) `Some(payload)`, as with
    /// [`signal`](Self::signal). The run is waiting when its step that
    /// continued on the key ([`Trigger::OnSignal`](crate::Trigger::OnSignal))
    /// has settled and its timeout has not fired. Otherwise nothing is
    /// delivered or buffered, so the signal cannot wake a later wait on the
    /// key: sent before the run waits (retry once it does, or use `signal`,
    /// which buffers), after the wait timed out or was woken, or to a run
    /// that is not the key's waiter. An addition to the 0.13 API.
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, the signal is not sent, or it is delivered as if the call
    /// had been awaited.
    ///
    /// # Errors
    /// [`Error::NotWaitingForSignal`](crate::Error::NotWaitingForSignal)
    /// when the run is not waiting on the key;
    /// [`Error::RunNotFound`](crate::Error::RunNotFound) for a run never
    /// submitted (or whose records retention removed);
    /// [`Error::Queue`](crate::Error::Queue) with `KvValueTooLarge` for a
    /// payload over [`taquba::MAX_KV_VALUE_SIZE`]; storage errors;
    /// [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn signal_run(
        &self,
        run_id: &RunId,
        correlation_key: &str,
        payload: Vec<u8>,
    ) -> Result<()> {
        let (core, run_id, key) = (
            self.inner.core.clone(),
            run_id.clone(),
            correlation_key.to_string(),
        );
        let span = spans::signal(&core.queue_name, correlation_key, Some(run_id.as_str()));
        let recorded = span.clone();
        detached(spans::within(span, async move {
            let signalled = core.signal_run(&run_id, &key, payload).await;
            spans::signalled(&recorded, &signalled, |()| "delivered");
            signalled
        }))
        .await
    }

    /// Discard the signal buffered under `correlation_key`; `Ok(true)` when
    /// there was one.
    ///
    /// # Cancel safety
    ///
    /// One compare-and-delete on a task of its own; dropped,
    /// the signal is still buffered or discarded.
    ///
    /// # Errors
    /// Storage errors; [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn clear_signal(&self, correlation_key: &str) -> Result<bool> {
        let (core, key) = (self.inner.core.clone(), correlation_key.to_string());
        detached(async move { core.clear_signal(&key).await }).await
    }
}

/// Configures a [`WorkflowRuntime`]; from [`WorkflowRuntime::builder`].
pub struct WorkflowRuntimeBuilder<R, H> {
    queue: Arc<Queue>,
    object_store: Arc<dyn ObjectStore>,
    runner: R,
    terminal_hook: H,
    queue_name: String,
    memo_prefix: Option<String>,
    max_concurrent_steps: usize,
    poll_interval: Duration,
    memo_retention: Option<Duration>,
    group_retention: Option<Duration>,
    step_output_replay: bool,
    clock: Option<Arc<dyn Clock>>,
    hook_timeout: Option<Duration>,
    history_limit: u32,
    step_input_limit: usize,
    command_retention: Duration,
    naming: Naming,
    runner_label: Option<String>,
}

impl<R: StepRunner, H: TerminalHook> WorkflowRuntimeBuilder<R, H> {
    /// The queue the runtime's step and notification jobs go to (default
    /// `"workflow-steps"`). Per-queue settings (lease, attempts, backoff)
    /// are [`taquba::OpenOptions::queue_configs`] under this name.
    pub fn queue_name(mut self, name: impl Into<String>) -> Self {
        self.queue_name = name.into();
        self
    }

    /// The object-store path prefix of memos, run result records, replay
    /// records and group manifests (default `"{queue_name}-memo"`).
    pub fn memo_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.memo_prefix = Some(prefix.into());
        self
    }

    /// The most runner (and terminal hook) calls in flight at once (default
    /// 8; at least 1, at most 65 536: a higher bound, `usize::MAX`
    /// included, is taken as 65 536). Size it for the APIs your steps
    /// call. Settlements waiting for the durable commit do not hold a
    /// slot, so the queue stays busy without raising it.
    pub fn max_concurrent_steps(mut self, n: usize) -> Self {
        self.max_concurrent_steps = n.clamp(1, MAX_CONCURRENT_STEPS);
        self
    }

    /// How long an idle worker waits before re-checking the queue (default
    /// 500 ms; at least 1 ms, a shorter interval is taken as 1 ms so an
    /// idle worker never re-claims in a busy loop), and the period of
    /// retention sweeps and dead-letter reconciliation. New work wakes the
    /// worker at once regardless.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(MIN_POLL_INTERVAL);
        self
    }

    /// Remove each terminated run's memo entries, run result record, replay
    /// records and terminal record `retention` after it terminated (default:
    /// kept forever). A zero window removes them at the next sweep. A run id
    /// submitted again after its run terminated keeps them until a window
    /// after its last run's end: the earlier run's window leaves a run id
    /// that is active again, or that ended again since, alone. A group
    /// member's terminal record stays until its group is removed
    /// ([`RunGroup::forget`](crate::RunGroup::forget) or
    /// [`group_retention`](Self::group_retention)): it keeps the member's
    /// run id the group's.
    pub fn memo_retention(mut self, retention: Duration) -> Self {
        self.memo_retention = Some(retention);
        self
    }

    /// Record every step outcome (with its staged effects) before settling
    /// it, and replay a recorded outcome instead of calling the runner when
    /// the same step is delivered again. Costs one object read per delivery
    /// and one write per outcome.
    pub fn step_output_replay(mut self) -> Self {
        self.step_output_replay = true;
        self
    }

    /// The clock of every timestamp and timer (default: the queue's).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Remove a run group's state once more than `retention` has passed
    /// since a [`RunGroup::results`] consumer observed its last termination
    /// (default: kept until [`RunGroup::forget`]). A group submitted or
    /// resumed again after that (members run again) is kept, while they run
    /// and after: its window starts again when a consumer observes the last
    /// termination of the re-run.
    pub fn group_retention(mut self, retention: Duration) -> Self {
        self.group_retention = Some(retention);
        self
    }

    /// The longest one [`TerminalHook::on_termination`] call may take
    /// before it is dropped and counted a transient hook error (retried
    /// per the queue's backoff, dead-lettered on the notification's last
    /// attempt). Default: the runtime queue's lease duration
    /// ([`taquba::QueueConfig::lease_duration`]) less a fifth of it, at
    /// most 5 s less: 25 s for taquba's default 30 s lease; at least 1 s
    /// (for a lease of a second or less, a zero one included). Before each
    /// call the notification's lease is extended to cover the timeout, so
    /// a longer timeout than the lease is safe: the queue never hands a
    /// notification still running here to another slot. At most a year: a
    /// longer timeout (`Duration::MAX` for "no timeout") is taken as a year.
    pub fn hook_timeout(mut self, timeout: Duration) -> Self {
        self.hook_timeout = Some(timeout);
        self
    }

    /// Keep at least the last `entries` entries of each run's history
    /// (default [`DEFAULT_HISTORY_LIMIT`], 100; one entry per settled step,
    /// with its attempts); 0 turns the history off. Every settlement
    /// records its entry in the transaction that commits it
    /// ([`WorkflowView::steps`] reads them): the entries ride on the
    /// run's current-step pointer, which the settlement writes anyway, and
    /// move to a record of their own every 8 entries (deleting the oldest
    /// one beyond the limit), so the history is kept in steps of 8 entries.
    pub fn history_limit(mut self, entries: u32) -> Self {
        self.history_limit = entries;
        self
    }

    /// Keep the payload of each step of at most `bytes` bytes in its history
    /// entry (default [`DEFAULT_STEP_INPUT_LIMIT`](crate::history::DEFAULT_STEP_INPUT_LIMIT),
    /// 1024; at most [`MAX_STEP_INPUT_LIMIT`](crate::history::MAX_STEP_INPUT_LIMIT),
    /// 8192, a larger value is lowered to it; 0 keeps none): the input
    /// [`WorkflowRuntime::fork`] starts a fork from. The signal that woke a
    /// step is kept with it when the two fit the limit together. The payload is written
    /// with the entry, in the settlement's transaction (no extra store
    /// write, but the entry rides on the run's pointer until 8 entries fill
    /// a chunk, so a kept payload of `n` bytes adds about `5 × n` bytes to
    /// the step's writes); a larger or offloaded payload is not copied, its entry names
    /// the step's job, which a fork reads while the queue keeps it (a
    /// failed step's dead job until the dead retention; a done job only
    /// under `taquba::QueueConfig::keep_done_jobs`). With the history off
    /// ([`history_limit`](Self::history_limit) 0) nothing is recorded.
    pub fn step_input_limit(mut self, bytes: usize) -> Self {
        self.step_input_limit = bytes.min(crate::history::MAX_STEP_INPUT_LIMIT);
        self
    }

    /// Keep the record of each applied or rejected inbox command
    /// ([`Inbox`](crate::inbox::Inbox), [`WorkflowView::command`]) this long after
    /// it was recorded (default 7 days); then the maintenance sweep removes
    /// it.
    pub fn command_retention(mut self, retention: Duration) -> Self {
        self.command_retention = retention;
        self
    }

    /// How payloads name their workflow and step (job runners read job
    /// inputs).
    pub(crate) fn naming(mut self, naming: Naming) -> Self {
        self.naming = naming;
        self
    }

    /// The name of a step neither the runner nor its payload names
    /// (default: the runner type's name): the test kit names the runner it
    /// wraps.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) fn runner_label(mut self, label: String) -> Self {
        self.runner_label = Some(label);
        self
    }

    /// Build the runtime. Nothing is written until the first submission or
    /// the first worker loop.
    ///
    /// # Panics
    /// With the `webhooks` feature, when the terminal hook is a
    /// `WebhookTerminalHook` whose delivery
    /// queue is the runtime's [`queue_name`](Self::queue_name): the
    /// runtime's worker would take every delivery for a malformed step, so
    /// no notification could be delivered. A configuration error, caught
    /// before anything runs.
    pub fn build(self) -> WorkflowRuntime<R, H>
    where
        H: 'static,
    {
        #[cfg(feature = "webhooks")]
        crate::hooks::webhook::refuse_delivery_on_runtime_queue(
            &self.terminal_hook,
            &self.queue_name,
        );
        let hook = Arc::new(self.terminal_hook);
        let observer = hook.clone();
        let memo_prefix = self
            .memo_prefix
            .unwrap_or_else(|| format!("{}-memo", self.queue_name));
        let clock = self.clock.unwrap_or_else(|| self.queue.clock());
        let hook_timeout = self
            .hook_timeout
            .unwrap_or_else(|| {
                default_hook_timeout(guard::claim_lease(&self.queue, &self.queue_name))
            })
            .min(MAX_HOOK_TIMEOUT);
        let core = RuntimeCore::new(Settings {
            queue: self.queue,
            object_store: self.object_store,
            queue_name: self.queue_name,
            memo_prefix,
            clock,
            max_concurrent_steps: self.max_concurrent_steps,
            poll_interval: self.poll_interval,
            memo_retention: self.memo_retention,
            group_retention: self.group_retention,
            step_output_replay: self.step_output_replay,
            observes: Arc::new(move |outcome: &RunOutcome| guard::observes(&*observer, outcome)),
            ops: OpsSettings {
                history_limit: self.history_limit,
                step_input_limit: self.step_input_limit,
                runner_label: self.runner_label.unwrap_or_else(runner_label::<R>),
                naming: self.naming,
                command_retention: self.command_retention,
                hosted: self.runner.hosted(),
                code: crate::versioning::CodeTable::new(self.runner.code()),
            },
        });
        WorkflowRuntime {
            inner: Arc::new(RuntimeInner {
                core: Arc::new(core),
                runner: self.runner,
                terminal_hook: hook,
                hook_timeout,
            }),
        }
    }
}
