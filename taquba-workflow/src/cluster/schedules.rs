//! Schedules over a cluster: a schedule lives in one shard, the shard its
//! name routes to ([`shard_of`](super::shard_of) of the name, the hash run
//! ids and group ids route by), and that shard's owner fires its ticks
//! into its own store, exactly as a single runtime does (see
//! [`schedule`](crate::schedule)). A handover of the shard hands the
//! schedule over with it: the next owner fires the ticks due since, under
//! the schedule's catch-up policy, and a tick's run id is idempotent, so no
//! tick starts twice across the handover.
//!
//! A tick's run (`schedule-{name}-{tick_ms}`) is committed in the
//! schedule's shard, whatever shard its id would route to; the cluster's
//! calls about a run find it there (they locate a run id in every shard
//! when its home shard does not hold it), as they find a group's members.
//!
//! Creating, changing and deleting a schedule commit on the owner: a
//! process that does not host the schedule's shard is refused with
//! [`ClusterError::NotHosted`] (the inbox carries no schedule spec), as
//! for a run group. Pausing and resuming go to the owner's inbox from any
//! process.

use super::ClusterError;
use super::runtime::{ClusterRuntime, Routed, shard_left};
use crate::hooks::terminal::TerminalHook;
use crate::inbox::Command;
use crate::model::RunOptions;
use crate::runner::StepRunner;
use crate::schedule::{ScheduleInfo, ScheduleSpec};

impl<R, H> ClusterRuntime<R, H>
where
    R: StepRunner + Clone + 'static,
    H: TerminalHook + Clone + 'static,
{
    /// The shard the schedule `name` lives in.
    pub fn shard_of_schedule(&self, name: &str) -> u32 {
        self.record().shard_of(name)
    }

    /// [`WorkflowRuntime::schedule`](crate::WorkflowRuntime::schedule) in
    /// the schedule's shard ([`shard_of_schedule`](Self::shard_of_schedule)),
    /// on this process's runtime of it.
    ///
    /// # Cancel safety
    ///
    /// As the runtime's: written whole or not at all.
    ///
    /// # Errors
    /// [`ClusterError::NotHosted`] when another process hosts the shard;
    /// [`ClusterError::Runtime`] with the runtime's errors.
    pub async fn schedule(
        &self,
        name: &str,
        spec: ScheduleSpec,
        input: Vec<u8>,
    ) -> Result<ScheduleInfo, ClusterError> {
        self.schedule_with(name, spec, input, RunOptions::default())
            .await
    }

    /// [`schedule`](Self::schedule) with the run options of every tick's
    /// run, as
    /// [`WorkflowRuntime::schedule_with`](crate::WorkflowRuntime::schedule_with).
    ///
    /// # Cancel safety
    ///
    /// As [`schedule`](Self::schedule).
    ///
    /// # Errors
    /// As [`schedule`](Self::schedule).
    pub async fn schedule_with(
        &self,
        name: &str,
        spec: ScheduleSpec,
        input: Vec<u8>,
        options: RunOptions,
    ) -> Result<ScheduleInfo, ClusterError> {
        let shard = self.shard_of_schedule(name);
        if let Some(local) = self.local(shard) {
            match local
                .runtime
                .schedule_with(name, spec, input, options)
                .await
            {
                Err(err) if shard_left(&err) => {}
                done => return Ok(done?),
            }
        }
        Err(ClusterError::NotHosted {
            shard,
            what: format!("the schedule `{name}`"),
        })
    }

    /// Pause the schedule `name`: on its owner directly when this process
    /// hosts its shard, else as a [`Command::PauseSchedule`] in the
    /// shard's inbox ([`Routed::Sent`]).
    ///
    /// # Cancel safety
    ///
    /// As [`WorkflowRuntime::pause_schedule`](crate::WorkflowRuntime::pause_schedule);
    /// a command is written whole or not at all, and pausing again is
    /// harmless.
    ///
    /// # Errors
    /// [`ClusterError::Runtime`] with the runtime's errors
    /// ([`Error::ScheduleNotFound`](crate::Error::ScheduleNotFound) for an
    /// unknown name on a hosted shard; a sent command is rejected instead)
    /// or the inbox's.
    pub async fn pause_schedule(&self, name: &str) -> Result<Routed<ScheduleInfo>, ClusterError> {
        self.set_paused(name, true).await
    }

    /// Resume the schedule `name`, as [`pause_schedule`](Self::pause_schedule)
    /// routes.
    ///
    /// # Cancel safety
    ///
    /// As [`pause_schedule`](Self::pause_schedule).
    ///
    /// # Errors
    /// As [`pause_schedule`](Self::pause_schedule).
    pub async fn resume_schedule(&self, name: &str) -> Result<Routed<ScheduleInfo>, ClusterError> {
        self.set_paused(name, false).await
    }

    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> Result<Routed<ScheduleInfo>, ClusterError> {
        let shard = self.shard_of_schedule(name);
        if let Some(local) = self.local(shard) {
            let done = if paused {
                local.runtime.pause_schedule(name).await
            } else {
                local.runtime.resume_schedule(name).await
            };
            match done {
                Err(err) if shard_left(&err) => {}
                done => return Ok(Routed::Applied(done?)),
            }
        }
        let name = name.to_string();
        let command = if paused {
            Command::PauseSchedule { name }
        } else {
            Command::ResumeSchedule { name }
        };
        self.send(shard, command, None).await
    }

    /// Delete the schedule `name` on its owner; `Ok(false)` when there is
    /// none, as
    /// [`WorkflowRuntime::delete_schedule`](crate::WorkflowRuntime::delete_schedule).
    ///
    /// # Cancel safety
    ///
    /// As the runtime's.
    ///
    /// # Errors
    /// [`ClusterError::NotHosted`] when another process hosts the shard;
    /// [`ClusterError::Runtime`] with the runtime's errors.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, ClusterError> {
        let shard = self.shard_of_schedule(name);
        if let Some(local) = self.local(shard) {
            match local.runtime.delete_schedule(name).await {
                Err(err) if shard_left(&err) => {}
                done => return Ok(done?),
            }
        }
        Err(ClusterError::NotHosted {
            shard,
            what: format!("the deletion of the schedule `{name}`"),
        })
    }

    /// The schedule `name`, read in its shard (through a reader when
    /// another process hosts it); `None` when there is none.
    ///
    /// # Errors
    /// The errors of the read and of opening a reader.
    pub async fn schedule_info(&self, name: &str) -> Result<Option<ScheduleInfo>, ClusterError> {
        match self.view(self.shard_of_schedule(name)).await? {
            Some(view) => Ok(view.schedule(name).await?),
            None => Ok(None),
        }
    }

    /// Every schedule of the cluster with its shard, by shard then name
    /// (each shard read as [`schedule_info`](Self::schedule_info) reads).
    ///
    /// # Errors
    /// The errors of the reads and of opening readers.
    pub async fn schedules(&self) -> Result<Vec<(u32, ScheduleInfo)>, ClusterError> {
        let mut all = Vec::new();
        for shard in 0..self.record().shard_count().get() {
            if let Some(view) = self.view(shard).await? {
                all.extend(view.schedules().await?.into_iter().map(|s| (shard, s)));
            }
        }
        Ok(all)
    }
}
