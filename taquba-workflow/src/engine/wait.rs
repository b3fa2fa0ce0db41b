//! Waiting for a run's termination: woken in-process by the terminating
//! commit, with a periodic look at the current step for dead letters (less
//! and less often while the step waits its turn here and this process's
//! worker and maintenance run: see [`LookBackoff`]).

use std::time::Duration;

use taquba::JobStatus;

use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::model::{RunEnd, RunOutcome};
use crate::run::watch::RunWatch;
use crate::store::durable::DurableTermination;
use crate::store::keys::RunId;

impl RuntimeCore {
    /// Wait until `run_id` terminates.
    ///
    /// Woken in-process by the commit that terminates the run (see
    /// [`RunWatchers`](crate::run::watch::RunWatchers)), so following a run costs one read however many
    /// steps it takes. Every poll interval the wait also looks at the run's
    /// current step: a step dead-lettered outside the worker (the reaper)
    /// is reconciled here rather than left to the next maintenance round.
    /// While the step waits its turn here (pending or scheduled on this
    /// runtime's queue) and this runtime's periodic maintenance runs, the
    /// looks at it come less often, up to [`LookBackoff`]'s bound:
    /// thousands of waits on parked runs then cost a few reads a second,
    /// not thousands.
    pub(crate) async fn wait_run(&self, run_id: &RunId) -> Result<RunEnd> {
        match self.wait_run_until(run_id, None).await? {
            Some(end) => Ok(end),
            // Without a deadline the wait ends only with the run.
            None => Err(Error::InconsistentRunState(run_id.clone())),
        }
    }

    /// [`wait_run`](Self::wait_run) whose waiting ends at `deadline`
    /// (`Ok(None)`): the deadline bounds the waits between looks at the
    /// run's records, not a look in progress, so a run that terminated
    /// before the call is reported even with a deadline already passed.
    pub(crate) async fn wait_run_until(
        &self,
        run_id: &RunId,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Option<RunEnd>> {
        self.wait_looking(run_id, deadline, None).await
    }

    /// [`wait_run`](Self::wait_run) for a run that `watch` has watched
    /// since before the submission that started it committed (a typed
    /// job's handle), and that has not ended in this process since (the
    /// watch holds no end): every termination this process commits after
    /// that submission reaches the watch, so the wait begins with it alone
    /// and its first look at the run's records comes a poll interval later
    /// (for an end another process committed, or a step dead-lettered
    /// outside the worker), as the second look of a wait that began with a
    /// read does.
    pub(crate) async fn wait_run_watched(&self, run_id: &RunId, watch: RunWatch) -> Result<RunEnd> {
        match self.wait_looking(run_id, None, Some(watch)).await? {
            Some(end) => Ok(end),
            None => Err(Error::InconsistentRunState(run_id.clone())),
        }
    }

    /// The wait of [`wait_run_until`](Self::wait_run_until), beginning with
    /// `first` (see [`wait_run_watched`](Self::wait_run_watched)) when given.
    async fn wait_looking(
        &self,
        run_id: &RunId,
        deadline: Option<tokio::time::Instant>,
        mut first: Option<RunWatch>,
    ) -> Result<Option<RunEnd>> {
        let expired = || async move {
            match deadline {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        // The job a pointer named that was found absent: absent again under
        // the same pointer means the records disagree.
        let mut missing: Option<String> = None;
        let mut look_at_step = false;
        let mut backoff = LookBackoff::new(self.poll_interval);
        loop {
            if let Some(mut watch) = first.take() {
                tokio::select! {
                    end = watch.ended() => return Ok(Some(end)),
                    () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                    () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                    () = expired() => return Ok(None),
                }
                // The next look reads the step's job as well, as the
                // second look of a wait that began with a read does.
                look_at_step = true;
                continue;
            }
            // Registered before the reads: a termination committed after
            // them reaches the watch.
            let mut watch = self.run_watchers.watch(run_id);
            // Enabled before `maintained_here` is read below: a maintenance
            // task stopping after that read ends a backed-off sleep.
            let maintenance_stopped = self.maintenance_stopped.notified();
            tokio::pin!(maintenance_stopped);
            maintenance_stopped.as_mut().enable();
            let Some(pointer) = self.view.current_step_if_active(run_id).await? else {
                if !self.read_termination_is_durable(run_id)? {
                    // The reads show a terminating commit of this process
                    // that is still waiting for its flush, which a takeover
                    // of the store would void: wait for its notification
                    // (or the store's closing), then look again.
                    tokio::select! {
                        end = watch.ended() => return Ok(Some(end)),
                        () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                        () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
                        () = expired() => return Ok(None),
                    }
                    continue;
                }
                return self.ended_run(run_id).await.map(Some);
            };
            // Whether the look found the step waiting its turn here: see
            // `LookBackoff`.
            let mut waiting_its_turn = false;
            if look_at_step {
                // The record alone: the payload may be a large object.
                match self.queue.view().job_record(&pointer.job_id).await? {
                    Some(job) if job.status == JobStatus::Dead => {
                        // The dead record, not one read before, carries the
                        // error the run fails with.
                        missing = None;
                        if crate::engine::sweep::reconcile_job(self, &job).await? == 1 {
                            continue;
                        }
                    }
                    Some(job) => {
                        missing = None;
                        waiting_its_turn = job.queue == self.queue_name.as_str()
                            && matches!(job.status, JobStatus::Pending | JobStatus::Scheduled);
                    }
                    None => {
                        // Settled between the two reads (the pointer moved
                        // with it), or a pointer without its job.
                        if missing.as_deref() == Some(pointer.job_id.as_str()) {
                            return Err(Error::InconsistentRunState(run_id.clone()));
                        }
                        missing = Some(pointer.job_id.clone());
                    }
                }
            }
            look_at_step = true;
            let period = backoff.next(&pointer.job_id, waiting_its_turn && self.maintained_here());
            tokio::select! {
                end = watch.ended() => return Ok(Some(end)),
                () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                () = tokio::time::sleep(period) => {}
                () = &mut maintenance_stopped => {}
                () = expired() => return Ok(None),
            }
        }
    }

    /// The answer of `read` about `run_id`, held back while it shows a
    /// termination (`shows_end`) that this process's commit has applied but
    /// not yet made durable: such a commit may still fail its WAL flush, and
    /// a crash in that window loses it (the run then runs its last step
    /// again and may end otherwise). The read is made again once that
    /// commit reported (at most a flush later on a healthy store; on a
    /// stalled store, when the commit resolves), so what it answers is what
    /// a restart would find. [`wait_run`](Self::wait_run) holds its reads
    /// back the same way. Read-only, so dropping it at any await is safe.
    ///
    /// # Errors
    /// `read`'s errors; the store-closed error once another process opened
    /// the store.
    pub(crate) async fn durable_read<T, F, Fut>(
        &self,
        run_id: &RunId,
        read: F,
        shows_end: impl Fn(&T) -> bool,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        loop {
            // Registered before the read: a termination reported after it
            // reaches the watch.
            let mut watch = self.run_watchers.watch(run_id);
            let answer = read().await?;
            if !shows_end(&answer) || self.read_termination_is_durable(run_id)? {
                return Ok(answer);
            }
            tokio::select! {
                _ = watch.ended() => {}
                () = self.store_closed.cancelled() => return Err(self.store_closed_error()),
                // A commit that failed reports nothing: look again.
                () = tokio::time::sleep(self.poll_interval.max(Duration::from_millis(1))) => {}
            }
        }
    }

    /// Wait until no terminating commit of `run_id` is in flight in this
    /// process (it reported, or failed): a read made after it shows only a
    /// durable end. See [`durable_read`](Self::durable_read). Read-only, so
    /// dropping it at any await is safe.
    ///
    /// # Errors
    /// The store-closed error once another process opened the store.
    pub(crate) async fn termination_reported(&self, run_id: &RunId) -> Result<()> {
        self.durable_read(run_id, || async { Ok(()) }, |()| true)
            .await
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

    /// The end of a run found terminated, from its terminal record and its
    /// result record (kept in memory when the termination was committed
    /// here lately: see `run::recent_ends`).
    async fn ended_run(&self, run_id: &RunId) -> Result<RunEnd> {
        let Some(record) = self.view.terminal_record(run_id).await? else {
            return Err(Error::RunNotFound(run_id.clone()));
        };
        let outcome = self.outcome_of_termination(run_id, &record).await?;
        Ok(RunEnd {
            termination: record.into(),
            outcome,
        })
    }

    /// The outcome of `run_id`'s termination `record` (its terminal
    /// record, just read): from the recent ends when this process committed
    /// it lately (see `run::recent_ends`), else from its run result record,
    /// `None` when that is absent or belongs to another termination.
    ///
    /// # Errors
    /// Storage errors reading the result record.
    pub(crate) async fn outcome_of_termination(
        &self,
        run_id: &RunId,
        record: &DurableTermination,
    ) -> Result<Option<RunOutcome>> {
        match self.recent_ends.outcome_of(run_id, record) {
            Some(outcome) => Ok(Some(outcome)),
            None => self.view.run_result_of(run_id, record).await,
        }
    }
}

/// How long a wait sleeps between its looks at a run's current step.
///
/// One poll interval (at least 1 ms), unless the last look found the step
/// *waiting its turn here*: its job pending or scheduled (a timer, a
/// signal wait, a backlog) on this runtime's own queue, while this
/// runtime's periodic maintenance runs. Such a job can end only once
/// claimed; claimed by this worker, its settlement either commits the
/// run's end (which wakes the wait), moves the run on, or dead-letters the
/// step, which maintenance reconciles within a poll interval (it counts as
/// the worker's own only a dead letter that ended its run in the same
/// commit). So the look is then a safety net, and each one that finds the
/// same job still waiting doubles the sleep, up to [`MAX_LOOK_FACTOR`] poll
/// intervals and at most [`MAX_LOOK_SLEEP`] (never under one poll
/// interval). A claimed step (running here or held by other code, whose
/// lease may expire into the queue's reaper), a step of another queue and
/// a runtime without maintenance (a client, the test kit) keep one look
/// every poll interval; so does every wait once maintenance stops (the
/// sleep under way is cut short). Thousands of waits cost little this way:
/// only the runs that wait their turn can be many (the running ones are
/// bounded by the worker's slots).
///
/// What is left to the backed-off look: a job waiting its turn that other
/// code claims and dead-letters in one sleep, with the queue's dead count
/// unchanged by the time maintenance looks (dead-job retention removing as
/// many): the wait sees it at its next look, at most 16 poll intervals
/// later, and maintenance at its full pass.
#[derive(Debug)]
pub(crate) struct LookBackoff {
    poll_interval: Duration,
    /// The job the last look found current, and the sleep after it.
    last: Option<(String, Duration)>,
}

/// The most poll intervals a wait sleeps between two looks at one step.
pub(crate) const MAX_LOOK_FACTOR: u32 = 16;

/// The longest sleep between two looks at one step (unless the poll
/// interval itself is longer).
pub(crate) const MAX_LOOK_SLEEP: Duration = Duration::from_secs(30);

impl LookBackoff {
    /// A backoff over `poll_interval`, before any look.
    pub(crate) fn new(poll_interval: Duration) -> Self {
        Self {
            poll_interval: poll_interval.max(Duration::from_millis(1)),
            last: None,
        }
    }

    /// The sleep after a look that found `job_id` current; `quiet` when the
    /// look found it waiting its turn here while this runtime's periodic
    /// maintenance runs.
    pub(crate) fn next(&mut self, job_id: &str, quiet: bool) -> Duration {
        let base = self.poll_interval;
        let sleep = match &self.last {
            Some((job, sleep)) if quiet && job == job_id => {
                let cap = (base * MAX_LOOK_FACTOR).min(MAX_LOOK_SLEEP).max(base);
                (*sleep * 2).min(cap)
            }
            _ => base,
        };
        match &mut self.last {
            Some((job, last)) if job == job_id => *last = sleep,
            _ => self.last = Some((job_id.to_string(), sleep)),
        }
        sleep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn looks_at_one_step_double_their_sleep_up_to_sixteen_poll_intervals() {
        let mut backoff = LookBackoff::new(500 * MS);
        let sleeps: Vec<u64> = (0..8)
            .map(|_| backoff.next("job-a", true).as_millis() as u64)
            .collect();
        assert_eq!(sleeps, [500, 1000, 2000, 4000, 8000, 8000, 8000, 8000]);
    }

    #[test]
    fn a_new_step_brings_the_sleep_back_to_one_poll_interval() {
        let mut backoff = LookBackoff::new(100 * MS);
        for _ in 0..5 {
            backoff.next("job-a", true);
        }
        assert_eq!(backoff.next("job-b", true), 100 * MS);
        assert_eq!(backoff.next("job-b", true), 200 * MS);
    }

    #[test]
    fn a_look_that_is_not_quiet_is_one_poll_interval_from_the_next() {
        let mut backoff = LookBackoff::new(100 * MS);
        for _ in 0..5 {
            assert_eq!(backoff.next("job-a", false), 100 * MS);
        }
        // A quiet look later backs off from there.
        assert_eq!(backoff.next("job-a", true), 200 * MS);
        // And one that is not brings the sleep back at once.
        assert_eq!(backoff.next("job-a", false), 100 * MS);
    }

    #[test]
    fn the_sleep_is_bounded_by_thirty_seconds_unless_the_poll_interval_is_longer() {
        let mut backoff = LookBackoff::new(Duration::from_secs(5));
        let last = (0..10).map(|_| backoff.next("job-a", true)).last();
        assert_eq!(last, Some(MAX_LOOK_SLEEP));
        let mut slow = LookBackoff::new(Duration::from_secs(60));
        let last = (0..10).map(|_| slow.next("job-a", true)).last();
        assert_eq!(last, Some(Duration::from_secs(60)));
        let mut zero = LookBackoff::new(Duration::ZERO);
        assert_eq!(zero.next("job-a", false), MS);
    }
}
