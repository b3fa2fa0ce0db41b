//! Schedules: submit a run on a cron expression (in a time zone) or a
//! fixed interval, durably.
//!
//! A schedule is a record in the runtime's KV namespace
//! (`workflow/schedules/{name}`): its [`ScheduleSpec`], the run input and
//! options every tick submits, whether it is paused, and its next tick.
//! [`WorkflowRuntime::schedule`](crate::WorkflowRuntime::schedule) creates
//! or changes one; `pause_schedule`, `resume_schedule` and
//! `delete_schedule` manage it; [`WorkflowView::schedules`](crate::WorkflowView::schedules)
//! and [`WorkflowView::schedule`](crate::WorkflowView::schedule) read them.
//!
//! The worker fires the ticks: every maintenance round (every
//! [`poll_interval`](crate::WorkflowRuntimeBuilder::poll_interval), 500 ms
//! by default, so a tick starts its run up to that late) it reads its
//! queue's schedules and fires the due ones on the runtime's clock (a
//! [`taquba::MockClock`] in tests: the test kit's `TestRuntime::advance`
//! (feature `testing`) fires ticks on virtual time). A tick's run has the run id `schedule-{name}-{tick ms}`
//! ([`tick_run_id`]) and is committed in one transaction with the schedule's
//! record advanced past the tick, guarded by the record as read: a crash
//! between two commits neither loses nor repeats a tick, and a run id that
//! already names a run is never started again.
//!
//! A tick a round finds under [`MISFIRE_THRESHOLD`] (60 s) past its time
//! is on time and fires, whatever the policy. A tick found the threshold
//! or more past its time (after a downtime) is missed, and the
//! [`CatchUp`] policy decides what the missed ticks do: [`CatchUp::Skip`]
//! none of them, [`CatchUp::One`] (the default) one run as of the latest,
//! [`CatchUp::All`] each of them; a round fires at most the latest
//! [`MAX_CATCH_UP_TICKS`] due ticks.
//!
//! Another process pauses and resumes a schedule through the store's inbox
//! ([`Command::PauseSchedule`](crate::inbox::Command::PauseSchedule),
//! [`Command::ResumeSchedule`](crate::inbox::Command::ResumeSchedule)).
//!
//! One writer: a store has one process that writes it, and its worker
//! fires the schedules. A cluster is many stores: a schedule lives in the
//! shard its name routes to, whose owner fires it
//! ([`ClusterRuntime::schedule`](crate::cluster::ClusterRuntime::schedule)).

pub(crate) mod fire;
mod manage;
mod record;
mod spec;

pub use fire::tick_run_id;
pub use record::ScheduleInfo;
pub(crate) use spec::check_name;
pub use spec::{
    CatchUp, MAX_CATCH_UP_TICKS, MAX_SCHEDULE_NAME_LEN, MIN_SCHEDULE_INTERVAL, MISFIRE_THRESHOLD,
    ScheduleSpec,
};

use crate::error::Result;
use crate::hooks::terminal::TerminalHook;
use crate::model::RunOptions;
use crate::run::commit::detached;
use crate::runner::StepRunner;
use crate::runtime::WorkflowRuntime;

impl<R: StepRunner, H: TerminalHook> WorkflowRuntime<R, H> {
    /// Create the schedule `name` (1 to [`MAX_SCHEDULE_NAME_LEN`] bytes of
    /// `[A-Za-z0-9_-]`): every tick of `spec` submits a run with `input`
    /// (for a `#[workflow]`, [`encode_input`](crate::workflows::encode_input)
    /// of its generated input). Called again with the name of an existing
    /// schedule it changes it: its input, and its spec (a changed timer
    /// starts from now; ticks of the old one not yet fired are not caught
    /// up). A paused schedule stays paused. Returns the schedule as stored.
    ///
    /// # Cancel safety
    ///
    /// One compare-and-commit on a task of its own; dropped, the schedule
    /// is written or not, whole.
    ///
    /// # Errors
    /// Nothing is committed on an error.
    /// - [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) naming
    ///   the value: a bad name, a schedule of another runtime's queue, a
    ///   record over [`taquba::MAX_KV_VALUE_SIZE`] bytes (a large input), a
    ///   timer with no tick after now (an interval past the end of time,
    ///   a cron date that never comes, such as `0 0 30 2 *`).
    /// - Storage errors; [`Error::RuntimeShutdown`](crate::Error::RuntimeShutdown).
    pub async fn schedule(
        &self,
        name: &str,
        spec: ScheduleSpec,
        input: Vec<u8>,
    ) -> Result<ScheduleInfo> {
        self.schedule_with(name, spec, input, RunOptions::default())
            .await
    }

    /// [`schedule`](Self::schedule) with the run options of every tick's
    /// run (headers, priority, attempt limit; `run_at` is refused: the tick
    /// is the start; a concurrency key or limit is refused: scheduled runs
    /// run without a key).
    ///
    /// # Cancel safety
    ///
    /// As [`schedule`](Self::schedule).
    ///
    /// # Errors
    /// As [`schedule`](Self::schedule);
    /// [`Error::ReservedHeaderInSubmit`](crate::Error::ReservedHeaderInSubmit),
    /// [`Error::InvalidRunOptions`](crate::Error::InvalidRunOptions) as for
    /// a submission, and naming the value for a
    /// [`concurrency_key`](RunOptions::concurrency_key) or
    /// [`concurrency_limit`](RunOptions::concurrency_limit);
    /// [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) for a
    /// `run_at`.
    pub async fn schedule_with(
        &self,
        name: &str,
        spec: ScheduleSpec,
        input: Vec<u8>,
        options: RunOptions,
    ) -> Result<ScheduleInfo> {
        let (core, name) = (self.inner.core.clone(), name.to_string());
        detached(async move { core.put_schedule(&name, spec, input, options).await }).await
    }

    /// Pause the schedule `name`: no tick fires until it is resumed. Pausing
    /// a paused schedule changes nothing.
    ///
    /// # Cancel safety
    ///
    /// One compare-and-commit on a task of its own.
    ///
    /// # Errors
    /// [`Error::ScheduleNotFound`](crate::Error::ScheduleNotFound) naming
    /// it; [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) for
    /// another runtime's schedule; storage errors.
    pub async fn pause_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        let (core, name) = (self.inner.core.clone(), name.to_string());
        detached(async move { core.set_schedule_paused(&name, true).await }).await
    }

    /// Resume the paused schedule `name`: it fires next at its first tick
    /// after now (the ticks it was paused over are not caught up).
    /// Resuming a schedule that is not paused changes nothing.
    ///
    /// # Cancel safety
    ///
    /// One compare-and-commit on a task of its own.
    ///
    /// # Errors
    /// As [`pause_schedule`](Self::pause_schedule).
    pub async fn resume_schedule(&self, name: &str) -> Result<ScheduleInfo> {
        let (core, name) = (self.inner.core.clone(), name.to_string());
        detached(async move { core.set_schedule_paused(&name, false).await }).await
    }

    /// Delete the schedule `name`; `Ok(false)` when there is none. The runs
    /// its ticks submitted are left alone.
    ///
    /// # Cancel safety
    ///
    /// One compare-and-delete on a task of its own.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`](crate::Error::InvalidSchedule) for
    /// another runtime's schedule; storage errors.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let (core, name) = (self.inner.core.clone(), name.to_string());
        detached(async move { core.delete_schedule(&name).await }).await
    }
}
