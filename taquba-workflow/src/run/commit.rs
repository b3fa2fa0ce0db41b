//! Cancel safety of the runtime's commits: every queue commit, and every
//! public call that commits, runs on a Tokio task of its own whose result
//! its caller awaits ([`detached`], [`Committer`]).
//!
//! Why. taquba 0.14 finishes a commit inside the commit's future, after the
//! WAL flush it waits for: it tells the claim cursor of the new pending
//! jobs (a job it was not told of is not claimed until the process
//! restarts), lowers the scheduled and expiry bounds, wakes the waiting
//! workers and ends a settled claim's lease. A commit future dropped while
//! it waits for the flush (its caller's future was dropped: a client that
//! disconnected, a `tokio::time::timeout`, an aborted task) has committed
//! but skips all of that. A commit on a task of its own is never dropped:
//! dropping the caller's future drops the join handle, which detaches the
//! task, and the commit finishes with its notices. A call that commits
//! more than once (a cancellation records the request, then removes the
//! step; a group submits in chunks) runs whole on one such task, so a drop
//! never stops it halfway either: it completes as if awaited.
//!
//! Besides [`Committer`] and [`detached`]: the group commit of fresh
//! submissions commits on its own tasks (`submit_batch`); the worker's
//! settlement runs whole on a detached task and commits there; and the
//! retention sweeps' expiry passes commit inside `taquba::ExpiryIndex::pass`
//! on the maintenance task, which a stopping worker drops mid-round. Those
//! commits only delete (no job, no expiry entry, so no notice to skip), and
//! a dropped pass leaves the index's bound where it began.

use std::future::Future;
use std::sync::Arc;

use taquba::{CancelOutcome, EnqueueResult, Queue, SettlementEffects, WakeOutcome};
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::model::RunEnd;
use crate::run::record_cache::RecordWrite;
use crate::run::watch::RunWatchers;
use crate::store::keys::RunId;
use crate::store::outage::{OutageExceeded, outage_in};

/// Run `work` on a Tokio task of its own and return its result. The task
/// is spawned at the call, so dropping the returned future (even before its
/// first poll) detaches the task, which runs `work` to its end. A panic of
/// `work` resumes in the caller.
///
/// `work` is boxed before it is spawned: the futures that commit hold the
/// queue's transaction futures, tens of KiB, which the task's cell, its
/// output slot and every move on the way into the scheduler would copy
/// whole; boxed, they are copied once and then moved as one pointer.
///
/// # Errors
/// `work`'s error; [`Error::RuntimeShutdown`] when the Tokio runtime shut
/// down before `work` finished (the only way the task can be cancelled:
/// its handle is never aborted).
pub(crate) fn detached<T, E, F>(work: F) -> impl Future<Output = Result<T>> + Send + 'static
where
    F: Future<Output = std::result::Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    let task = tokio::spawn(Box::pin(work));
    async move {
        match task.await {
            Ok(result) => result.map_err(Into::into),
            Err(err) => match err.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => Err(Error::RuntimeShutdown),
            },
        }
    }
}

/// [`detached`], unless `handed_over`: then `work` runs in the caller's
/// task (boxed, as `detached` boxes it). For work that hands what it
/// commits to a task of its own before its first suspension (a fresh
/// submission joining the group commit, see
/// [`RuntimeCore::joins_group_commit`](crate::engine::RuntimeCore::joins_group_commit)):
/// dropped before that, it committed nothing; after, the commit's task
/// finishes it. A task of its own would cost a spawn and a wake across
/// threads per call and guard nothing more.
///
/// # Errors
/// As [`detached`].
pub(crate) async fn detached_unless_handed_over<T, E, F>(handed_over: bool, work: F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    if handed_over {
        Box::pin(work).await.map_err(Into::into)
    } else {
        detached(work).await
    }
}

/// A run termination that a commit carries, built with its effects
/// ([`terminate_effects`](crate::engine::RuntimeCore::terminate_effects)):
/// what the run's waiters are told, and what this process's coordination
/// learns, once the commit committed it (see [`Committer::run`]). Nothing
/// is told before then, so a termination built and never committed leaves
/// nothing behind.
#[derive(Debug)]
pub(crate) struct Ending {
    /// The run that ends.
    pub(crate) run_id: RunId,
    /// Its end, for its waiters.
    pub(crate) end: RunEnd,
    /// The terminal record the commit writes (its history entries aside),
    /// which the recent ends key the end's outcome by.
    pub(crate) record: crate::store::durable::DurableTermination,
    /// The concurrency key the run held a slot of or waited on, if any:
    /// the key is marked for the admission pump.
    pub(crate) key: Option<String>,
    /// Whether the run is a child (has a parent): its parent is woken.
    pub(crate) child: bool,
}

/// The queue commits of one runtime, each on a task of its own (see the
/// module doc). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Committer {
    queue: Arc<Queue>,
    watchers: RunWatchers,
    store_closed: CancellationToken,
    queue_name: Arc<str>,
    /// The outage that closed the store, when an outage guard did.
    outage: Arc<std::sync::Mutex<Option<OutageExceeded>>>,
    /// Told of every committed termination of a keyed run, so a freed
    /// concurrency slot is given to the key's next waiter.
    keys: crate::coordination::keys::ConcurrencyKeys,
    /// Told of every committed termination of a child, so its parent is
    /// woken at once.
    child_wakes: Arc<crate::coordination::child_wakes::ChildWakes>,
    /// Told of every committed termination's end, so a wait that begins
    /// after it takes the outcome without reading it back.
    recent_ends: crate::run::recent_ends::RecentEnds,
}

impl Committer {
    pub(crate) fn new(
        queue: Arc<Queue>,
        watchers: RunWatchers,
        store_closed: CancellationToken,
        queue_name: &str,
    ) -> Self {
        Self {
            keys: crate::coordination::keys::ConcurrencyKeys::for_queue(&queue),
            child_wakes: Arc::default(),
            recent_ends: crate::run::recent_ends::RecentEnds::for_queue(&queue),
            queue,
            watchers,
            store_closed,
            queue_name: queue_name.into(),
            outage: Arc::default(),
        }
    }

    /// The prompt wakes of parents whose children this runtime's commits
    /// end.
    pub(crate) fn child_wakes(&self) -> &Arc<crate::coordination::child_wakes::ChildWakes> {
        &self.child_wakes
    }

    /// The outage that closed the store to this process, if an
    /// [`OutageGuard`](crate::OutageGuard) did.
    pub(crate) fn outage(&self) -> Option<OutageExceeded> {
        self.outage.lock().ok().and_then(|outage| outage.clone())
    }

    /// The queue, for reads.
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// Fire the store-closed token when `closed`, logging `err`.
    pub(crate) fn note_closed(&self, closed: bool, err: &dyn std::fmt::Display) {
        if closed && !self.store_closed.is_cancelled() {
            tracing::error!(queue = %self.queue_name, "the queue's store is closed to this process (another process opened it, or it was closed): {err}");
            self.store_closed.cancel();
        }
    }

    /// Note an outage past its budget: the store is closed to this process
    /// until its queue is reopened.
    pub(crate) fn note_outage(&self, outage: &OutageExceeded) {
        if let Ok(mut noted) = self.outage.lock()
            && noted.is_none()
        {
            *noted = Some(outage.clone());
        }
        if !self.store_closed.is_cancelled() {
            tracing::error!(queue = %self.queue_name, "the queue's store is closed to this process until its queue is reopened: {outage}");
            self.store_closed.cancel();
        }
    }

    /// Run the commit `commit` builds on the queue, on a task of its own.
    /// When `ending` is given the commit carries that run termination: while
    /// it is in flight the run is marked terminating, and once it returned
    /// with a value `committed` accepts, the termination is told to the
    /// run's waiters in this process, to the admission pump (a keyed run)
    /// and to the child-wake pump (a child). A failed commit, or one that
    /// did not commit the termination, tells nobody. A closed store is
    /// noted.
    ///
    /// # Errors
    /// The commit's error; [`Error::RuntimeShutdown`].
    pub(crate) async fn run<T, Fut>(
        &self,
        ending: Option<Ending>,
        commit: impl FnOnce(Arc<Queue>) -> Fut + Send + 'static,
        committed: impl FnOnce(&T) -> bool + Send + 'static,
    ) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = taquba::Result<T>> + Send + 'static,
    {
        let this = self.clone();
        detached(async move {
            // The commit's future is built here and awaited in place, so
            // the task holds it once (an argument awaited is held twice).
            let terminating = this.terminating(ending.map(Box::new));
            let result = commit(this.queue.clone()).await;
            terminating.finish(result, committed).await
        })
        .await
    }

    /// The termination `ending` (if any) of a commit about to be awaited on
    /// the calling task, for work that already runs whole on a task of its
    /// own (the worker's settlements): the run is marked terminating until
    /// [`Terminating::finish`] is given the commit's result, which tells
    /// the termination as [`run`](Self::run) does. The commit is awaited by
    /// the caller between the two, so its future is held once, in the
    /// caller's own state.
    pub(crate) fn terminating(&self, ending: Option<Box<Ending>>) -> Terminating<'_> {
        Terminating {
            committer: self,
            _marked: ending
                .as_ref()
                .map(|ending| self.watchers.terminating(&ending.run_id)),
            ending,
        }
    }

    /// Tell this process of the committed termination `ending`: the
    /// admission pump of its key, the child-wake pump, the recent ends,
    /// then the run's waiters.
    async fn ended(&self, ending: Box<Ending>) {
        let Ending {
            run_id,
            end,
            record,
            key,
            child,
        } = *ending;
        if let Some(key) = &key {
            self.keys.ended(key);
        }
        if child {
            self.child_wakes.ended(&run_id);
        }
        #[cfg(feature = "metrics")]
        crate::telemetry::metrics::run_ended_on(&self.queue, &self.queue_name, &run_id, &end).await;
        // Moved, not copied: the record into the recent ends, the end to
        // the run's last watcher.
        self.recent_ends.ended(&run_id, record, &end);
        self.watchers.notify(&run_id, end);
    }

    async fn plain<T, Fut>(
        &self,
        commit: impl FnOnce(Arc<Queue>) -> Fut + Send + 'static,
    ) -> Result<T>
    where
        T: Send + 'static,
        Fut: Future<Output = taquba::Result<T>> + Send + 'static,
    {
        self.run(None, commit, |_| false).await
    }

    /// [`Queue::commit_effects`].
    pub(crate) async fn commit(&self, effects: SettlementEffects) -> Result<Vec<EnqueueResult>> {
        self.plain(|queue| async move { queue.commit_effects(effects).await })
            .await
    }

    /// [`Queue::kv_compare_commit`].
    pub(crate) async fn compare_commit(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        effects: SettlementEffects,
    ) -> Result<Option<Vec<EnqueueResult>>> {
        self.compare_commit_holding(key, expected, effects, None)
            .await
    }

    /// [`compare_commit`](Self::compare_commit) of effects that change a
    /// run's record in place: `write` is held by the commit's task until
    /// the commit has finished, even when the caller's future is dropped
    /// (see [`record_cache`](crate::run::record_cache)).
    pub(crate) async fn compare_commit_writing(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        effects: SettlementEffects,
        write: RecordWrite,
    ) -> Result<Option<Vec<EnqueueResult>>> {
        self.compare_commit_holding(key, expected, effects, Some(write))
            .await
    }

    /// [`Queue::kv_compare_commit`], with `write` (if any) moved into the
    /// commit's task and dropped there once the commit finished.
    async fn compare_commit_holding(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        effects: SettlementEffects,
        write: Option<RecordWrite>,
    ) -> Result<Option<Vec<EnqueueResult>>> {
        let (key, expected) = (key.to_vec(), expected.map(<[u8]>::to_vec));
        self.plain(|queue| async move {
            let committed = queue
                .kv_compare_commit(&key, expected.as_deref(), effects)
                .await;
            drop(write);
            committed
        })
        .await
    }

    /// [`compare_commit`](Self::compare_commit) of effects that terminate a
    /// run as `ending` says (see [`run`](Self::run)).
    pub(crate) async fn compare_commit_ending(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        effects: SettlementEffects,
        ending: Ending,
    ) -> Result<Option<Vec<EnqueueResult>>> {
        let (key, expected) = (key.to_vec(), expected.map(<[u8]>::to_vec));
        self.run(
            Some(ending),
            |queue| async move {
                queue
                    .kv_compare_commit(&key, expected.as_deref(), effects)
                    .await
            },
            Option::is_some,
        )
        .await
    }

    /// [`Queue::cancel_with`] of effects that terminate a run as `ending`
    /// says when the job is removed (see [`run`](Self::run)).
    pub(crate) async fn cancel_with(
        &self,
        job_id: &str,
        effects: SettlementEffects,
        ending: Ending,
    ) -> Result<(CancelOutcome, Vec<EnqueueResult>)> {
        let job_id = job_id.to_string();
        self.run(
            Some(ending),
            |queue| async move { queue.cancel_with(&job_id, effects).await },
            |(outcome, _)| *outcome == CancelOutcome::Removed,
        )
        .await
    }

    /// [`Queue::kv_put`].
    pub(crate) async fn kv_put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let (key, value) = (key.to_vec(), value.to_vec());
        self.plain(|queue| async move { queue.kv_put(&key, &value).await })
            .await
    }

    /// [`Queue::kv_compare_delete`].
    pub(crate) async fn kv_compare_delete(&self, key: &[u8], expected: &[u8]) -> Result<bool> {
        let (key, expected) = (key.to_vec(), expected.to_vec());
        self.plain(|queue| async move { queue.kv_compare_delete(&key, &expected).await })
            .await
    }

    /// [`Queue::wake_scheduled`].
    pub(crate) async fn wake_scheduled(
        &self,
        job_id: &str,
        payload: Option<Vec<u8>>,
    ) -> Result<WakeOutcome> {
        let job_id = job_id.to_string();
        self.plain(|queue| async move { queue.wake_scheduled(&job_id, payload).await })
            .await
    }
}

/// A commit carrying a run's termination, in flight on the calling task
/// (see [`Committer::terminating`]): the run stays marked terminating while
/// this lives.
pub(crate) struct Terminating<'a> {
    committer: &'a Committer,
    /// Boxed: this is held beside the commit's future.
    ending: Option<Box<Ending>>,
    _marked: Option<crate::run::watch::TerminatingGuard>,
}

impl Terminating<'_> {
    /// Take the commit's `result`: once it returned a value `committed`
    /// accepts, the termination is told to the run's waiters in this
    /// process, to the admission pump (a keyed run) and to the child-wake
    /// pump (a child); a failed commit, or one that did not commit the
    /// termination, tells nobody. A closed store or an outage is noted.
    /// The run is unmarked when this returns.
    pub(crate) async fn finish<T>(
        self,
        result: taquba::Result<T>,
        committed: impl FnOnce(&T) -> bool,
    ) -> taquba::Result<T> {
        let committer = self.committer;
        match &result {
            Ok(value) => {
                if let Some(ending) = self.ending
                    && committed(value)
                {
                    committer.ended(ending).await;
                }
            }
            Err(err) => match outage_in(err) {
                Some(outage) => committer.note_outage(&outage),
                None => committer.note_closed(Error::is_queue_store_closed(err), err),
            },
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_detached_task_finishes_after_its_caller_is_dropped() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let call = detached(async move {
            let _ = wait.await;
            let _ = tx.send("finished");
            Ok::<_, Error>(())
        });
        // Polled once, then dropped.
        let mut call = Box::pin(call);
        let polled =
            std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        drop(call);
        go.send(()).expect("the task is waiting");
        assert_eq!(rx.await.expect("the task ran to its end"), "finished");
    }

    #[tokio::test]
    async fn a_panic_of_the_work_resumes_in_the_caller() {
        let caught =
            futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(detached(async {
                if std::hint::black_box(true) {
                    panic!("boom");
                }
                Ok::<(), Error>(())
            })))
            .await;
        assert!(caught.is_err());
    }
}
