//! The operator queries of [`WorkflowView`]: the runtimes a store holds,
//! run listings, one run described, a run's step history, groups, and the
//! state of inbox commands. Every query reads through the view's
//! `QueueView`, so it works over a writer's `Queue::view` and over a
//! `taquba::QueueReader` in another process alike.

use std::cmp::Ordering;
use std::ops::Bound;

use futures_util::future::Either;
use futures_util::{Stream, TryStreamExt};
use taquba::{JobRecord, JobStatus, QueueView};

use crate::coordination::members::{self as group, GroupStatus, Manifest};
use crate::error::Result;
use crate::history::naming::step_of_named_run;
use crate::history::record::{DurableStepEntry, PendingHistory, decode_entries, earlier_attempts};
use crate::history::{RunHistory, StepAttempt, StepHistory, read};
use crate::inbox::objects::InboxObjects;
use crate::inbox::record::DurableCommandRecord;
use crate::inbox::{CommandId, CommandState, command_path};
use crate::model::{RunState, RunTermination};
use crate::store::durable::{self, DurableCurrentStep, DurableRunRecord, DurableTermination};
use crate::store::keys::user_headers;
use crate::store::keys::{
    GROUP_SUBMISSIONS_PREFIX, HEADER_GROUP, HEADER_GROUP_KEY, HEADER_SIGNAL_WAIT, OUTCOMES_PREFIX,
    RUNS_PREFIX, RUNTIMES_PREFIX, RunId, command_kv_key, signal_delivered_kv_key, worker_kv_key,
};
use crate::view::WorkflowView;
use crate::view::types::{
    GroupPage, MAX_PAGE_LIMIT, RunDetails, RunFilter, RunPage, RunSummary, RuntimeInfo, SignalWait,
    StatusFilter,
};

/// Records read per page of a listing's scan.
const SCAN_PAGE: usize = 256;

/// The descriptor of a runtime, under `workflow/runtimes/{queue_name}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct DurableRuntimeInfo {
    pub(crate) queue_name: String,
    pub(crate) memo_prefix: String,
    pub(crate) format: u32,
    pub(crate) crate_version: String,
    pub(crate) started_at_ms: u64,
}

/// A runtime worker's last start and clean stop, under
/// `workflow/workers/{queue_name}`: written with the descriptor when the
/// worker starts (no stop) and again when its loop returns cleanly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct DurableWorkerRecord {
    /// The start, as the descriptor written with it says.
    pub(crate) started_at_ms: u64,
    /// The lease its steps are claimed with, ms.
    pub(crate) claim_lease_ms: u64,
    /// When the loop returned cleanly.
    #[serde(default)]
    pub(crate) stopped_at_ms: Option<u64>,
}

impl RuntimeInfo {
    /// The descriptor `record` with what its worker record says of the
    /// same start.
    fn from_records(record: DurableRuntimeInfo, worker: Option<DurableWorkerRecord>) -> Self {
        let worker = worker.filter(|w| w.started_at_ms == record.started_at_ms);
        RuntimeInfo {
            queue_name: record.queue_name,
            memo_prefix: record.memo_prefix,
            format: record.format,
            crate_version: record.crate_version,
            started_at_ms: record.started_at_ms,
            claim_lease_ms: worker.as_ref().map(|w| w.claim_lease_ms),
            stopped_at_ms: worker.and_then(|w| w.stopped_at_ms),
        }
    }
}

/// A row of a listing's scan: an active run's record or a terminated run's.
enum Row {
    Active(DurableRunRecord),
    Terminated(DurableTermination),
}

impl Row {
    fn workflow(&self) -> Option<&str> {
        match self {
            Row::Active(record) => record.workflow.as_deref(),
            Row::Terminated(record) => record.workflow.as_deref(),
        }
    }

    fn group(&self) -> Option<&RunId> {
        match self {
            Row::Active(record) => record.group.as_ref(),
            Row::Terminated(record) => record.group.as_ref(),
        }
    }

    fn version(&self) -> Option<&str> {
        match self {
            Row::Active(record) => record.version.as_deref(),
            Row::Terminated(record) => record.version.as_deref(),
        }
    }

    fn patches(&self) -> &[String] {
        match self {
            Row::Active(record) => &record.patches,
            Row::Terminated(record) => &record.patches,
        }
    }

    fn submitted_at_ms(&self) -> Option<u64> {
        match self {
            Row::Active(record) => Some(record.submitted_at_ms),
            Row::Terminated(record) => record.submitted_at_ms,
        }
    }

    fn matches(&self, filter: &RunFilter) -> bool {
        filter
            .workflow
            .as_deref()
            .is_none_or(|name| self.workflow() == Some(name))
            && filter
                .group
                .as_ref()
                .is_none_or(|group| self.group() == Some(group))
            && filter
                .submitted_since_ms
                .is_none_or(|since| self.submitted_at_ms().is_some_and(|at| at >= since))
            && filter
                .version
                .as_deref()
                // A version is kept cut to its limit: so is the one asked for.
                .is_none_or(|version| {
                    self.version()
                        == Some(&*crate::history::cut_cow(
                            version,
                            crate::versioning::MAX_VERSION_LEN,
                        ))
                })
            && filter
                .lacks_patch
                .as_deref()
                .is_none_or(|patch| !self.patches().iter().any(|p| p == patch))
    }
}

/// The rows under `prefix` after `after`, in run-id order; a key or record
/// that does not decode is skipped.
fn rows<'a>(
    view: &'a QueueView,
    prefix: &'static str,
    after: Option<&RunId>,
    active: bool,
) -> impl Stream<Item = Result<(RunId, Row)>> + 'a {
    let start = match after {
        Some(after) => {
            let mut key = prefix.as_bytes().to_vec();
            key.extend_from_slice(after.as_bytes());
            Bound::Excluded(key)
        }
        None => Bound::Unbounded,
    };
    let range = (start, Bound::<Vec<u8>>::Unbounded);
    view.kv_entries(prefix.as_bytes(), range, SCAN_PAGE)
        .map_err(crate::error::Error::from)
        .try_filter_map(move |(key, value)| async move {
            let Some(run_id) = std::str::from_utf8(&key[prefix.len()..])
                .ok()
                .and_then(|id| RunId::new(id).ok())
            else {
                return Ok(None);
            };
            let row = if active {
                durable::decode_or_absent::<DurableRunRecord>(&value, "run record", &run_id)
                    .map(Row::Active)
            } else {
                durable::decode_or_absent::<DurableTermination>(&value, "terminal record", &run_id)
                    .map(Row::Terminated)
            };
            Ok(row.map(|row| (run_id, row)))
        })
}

impl WorkflowView {
    /// The runtimes recorded in the store `queue` reads (a writer's
    /// [`taquba::Queue::view`] or a reader's
    /// [`taquba::QueueReader::view`]), in queue-name order: each runtime's
    /// worker records its queue name, memo prefix, version, start time and
    /// claim lease when it starts, and its clean stop when its loop
    /// returns. With one, a tool needs only the store to open a
    /// view of it: `WorkflowView::new(queue, MemoStore::new(store,
    /// info.memo_prefix))`.
    ///
    /// # Errors
    /// Storage errors (a descriptor that does not decode is skipped).
    pub async fn runtimes(queue: &QueueView) -> Result<Vec<RuntimeInfo>> {
        let entries: Vec<_> = queue
            .kv_entries(RUNTIMES_PREFIX.as_bytes(), .., SCAN_PAGE)
            .try_collect()
            .await?;
        let mut runtimes = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            let whose = String::from_utf8_lossy(&key).into_owned();
            let Some(record) = durable::decode_or_absent::<DurableRuntimeInfo>(
                &value,
                "runtime descriptor",
                &whose,
            ) else {
                continue;
            };
            let worker_key = worker_kv_key(&record.queue_name);
            let worker = match queue.kv_get(&worker_key).await? {
                Some(bytes) => durable::decode_or_absent::<DurableWorkerRecord>(
                    &bytes,
                    "runtime worker record",
                    &record.queue_name,
                ),
                None => None,
            };
            runtimes.push(RuntimeInfo::from_records(record, worker));
        }
        Ok(runtimes)
    }

    /// The queue view this view reads through (for the queue's own
    /// queries: [`QueueView::stats`], dead jobs, attempt histories).
    pub fn queue(&self) -> &QueueView {
        &self.queue
    }

    /// One page of runs matching `filter`, in run-id order. Active runs come
    /// from their run records (`workflow/runs/`), terminated ones from their
    /// terminal records (`workflow/outcomes/`); a run id active again after
    /// it terminated is listed once, as active. The filters on workflow,
    /// group and submission time apply to what the records say; a page
    /// reads on until it holds `filter.limit` runs and knows whether one
    /// more follows, so a selective filter over a large store scans it.
    /// Each listed active run costs two more point reads (its pointer and
    /// step job), each terminated one one (its final step's history).
    ///
    /// # Errors
    /// Storage errors (a record that does not decode is skipped).
    pub async fn runs(&self, filter: &RunFilter) -> Result<RunPage> {
        let limit = filter.limit.clamp(1, MAX_PAGE_LIMIT);
        let after = filter.after.as_ref();
        let want_active = filter.status != StatusFilter::Terminated;
        let want_terminated = filter.status != StatusFilter::Active;
        // A status not asked for reads nothing.
        let active = match want_active {
            true => Either::Left(rows(&self.queue, RUNS_PREFIX, after, true)),
            false => Either::Right(futures_util::stream::empty()),
        };
        let terminated = match want_terminated {
            true => Either::Left(rows(&self.queue, OUTCOMES_PREFIX, after, false)),
            false => Either::Right(futures_util::stream::empty()),
        };
        let mut active = std::pin::pin!(active);
        let mut terminated = std::pin::pin!(terminated);
        let mut next_active = active.try_next().await?;
        let mut next_terminated = terminated.try_next().await?;
        let mut runs = Vec::new();
        loop {
            let (run_id, row) = match (next_active.take(), next_terminated.take()) {
                (None, None) => break,
                (Some(a), None) => {
                    next_active = active.try_next().await?;
                    a
                }
                (None, Some(t)) => {
                    next_terminated = terminated.try_next().await?;
                    t
                }
                (Some(a), Some(t)) => match a.0.cmp(&t.0) {
                    Ordering::Less => {
                        next_terminated = Some(t);
                        next_active = active.try_next().await?;
                        a
                    }
                    Ordering::Greater => {
                        next_active = Some(a);
                        next_terminated = terminated.try_next().await?;
                        t
                    }
                    // Active again after it terminated: listed as active.
                    Ordering::Equal => {
                        next_active = active.try_next().await?;
                        next_terminated = terminated.try_next().await?;
                        a
                    }
                },
            };
            if !row.matches(filter) {
                continue;
            }
            if runs.len() == limit {
                let next = runs.last().map(|run: &RunSummary| run.run_id.clone());
                return Ok(RunPage { runs, next });
            }
            if let Some(summary) = self.summary(run_id, row).await? {
                runs.push(summary);
            }
        }
        Ok(RunPage { runs, next: None })
    }

    async fn summary(&self, run_id: RunId, row: Row) -> Result<Option<RunSummary>> {
        match row {
            Row::Active(record) => {
                let Some((pointer, job)) = self.current_job(&run_id).await? else {
                    // Terminated since the scan read its record.
                    return match self.terminal_record(&run_id).await? {
                        Some(termination) => {
                            self.terminated_summary(run_id, termination).await.map(Some)
                        }
                        None => Ok(None),
                    };
                };
                let step_name = match &record.workflow {
                    Some(_) => inline_step_name(&job),
                    None => None,
                };
                let step_name = step_name.or_else(|| {
                    entry_of(pointer.history.as_ref(), pointer.step_number).map(|e| e.name)
                });
                Ok(Some(RunSummary {
                    state: active_state(&record, &job),
                    run_id,
                    workflow: record.workflow,
                    group: record.group,
                    current_step: pointer.step_number,
                    step_name,
                    attempts: job.attempts,
                    submitted_at_ms: Some(record.submitted_at_ms),
                    ended_at_ms: None,
                    version: record.version,
                    patches: record.patches,
                }))
            }
            Row::Terminated(termination) => {
                self.terminated_summary(run_id, termination).await.map(Some)
            }
        }
    }

    async fn terminated_summary(
        &self,
        run_id: RunId,
        termination: DurableTermination,
    ) -> Result<RunSummary> {
        let last = entry_of(termination.history.as_ref(), termination.final_step);
        Ok(RunSummary {
            run_id,
            workflow: termination.workflow.clone(),
            group: termination.group.clone(),
            current_step: termination.final_step,
            step_name: last.as_ref().map(|record| record.name.clone()),
            attempts: last
                .as_ref()
                .and_then(|record| record.attempts.last())
                .map_or(0, |attempt| attempt.attempt),
            submitted_at_ms: termination.submitted_at_ms,
            ended_at_ms: Some(termination.terminated_at_ms),
            version: termination.version.clone(),
            patches: termination.patches.clone(),
            state: RunState::Terminated(termination.into()),
        })
    }

    /// `run_id` described: where it is, its current step with its name and
    /// attempts, when that step becomes claimable, the signal it waits for,
    /// the last error, its headers, when it was submitted and ended. `None`
    /// for a run never submitted or whose records retention removed.
    ///
    /// # Errors
    /// Storage and decoding errors; [`Error::InconsistentRunState`](crate::Error::InconsistentRunState)
    /// when the pointer names a job that does not exist on two reads.
    pub async fn run(&self, run_id: &RunId) -> Result<Option<RunDetails>> {
        if let Some(record) = self.run_record(run_id).await?
            && let Some((pointer, job)) = self.current_job(run_id).await?
        {
            return self
                .active_details(run_id, record, pointer, job)
                .await
                .map(Some);
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Ok(None);
        };
        self.terminated_details(run_id, termination).await.map(Some)
    }

    async fn active_details(
        &self,
        run_id: &RunId,
        record: DurableRunRecord,
        pointer: DurableCurrentStep,
        job: JobRecord,
    ) -> Result<RunDetails> {
        let mut step_name =
            entry_of(pointer.history.as_ref(), pointer.step_number).map(|entry| entry.name);
        if step_name.is_none() && record.workflow.is_some() {
            step_name = match inline_step_name(&job) {
                Some(name) => Some(name),
                // An offloaded payload is fetched for its name.
                None if job.payload_ref.is_some() => self
                    .queue
                    .get_job(&job.id)
                    .await?
                    .and_then(|job| step_of_named_run(&job.payload)),
                None => None,
            };
        }
        let scheduled_at_ms = match job.status {
            JobStatus::Scheduled => job.run_at,
            _ => None,
        };
        let mut waiting_for_signal = job.headers.get(HEADER_SIGNAL_WAIT).and_then(|key| {
            (job.status == JobStatus::Scheduled && job.woken_at.is_none()).then(|| SignalWait {
                correlation_key: key.clone(),
                timeout_at_ms: job.run_at,
            })
        });
        // A signal delivered from the inbox whose wake is still to come.
        if waiting_for_signal.is_some()
            && self
                .queue
                .kv_get(&signal_delivered_kv_key(run_id, pointer.step_number))
                .await?
                .is_some()
        {
            waiting_for_signal = None;
        }
        Ok(RunDetails {
            run_id: run_id.clone(),
            state: active_state(&record, &job),
            workflow: record.workflow,
            group: record.group.or_else(|| {
                job.headers
                    .get(HEADER_GROUP)
                    .and_then(|g| RunId::parse_ref(g).ok())
            }),
            group_key: job.headers.get(HEADER_GROUP_KEY).cloned(),
            current_step: pointer.step_number,
            step_name,
            job_id: Some(job.id.clone()),
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            scheduled_at_ms,
            waiting_for_signal,
            last_error: job.last_error.clone(),
            headers: user_headers(&job.headers),
            submitted_at_ms: Some(record.submitted_at_ms),
            ended_at_ms: None,
            cancel_requested: record.cancel_requested,
            cancel_reason: record.cancel_reason,
            forked_from: record.forked_from.map(Into::into),
            version: record.version,
            patches: record.patches,
            parent: record.parent,
            children: crate::engine::children::list_children(&self.queue, run_id).await?,
            concurrency: record
                .concurrency
                .map(|c| crate::view::keys::run_concurrency(c, job.queue.as_str())),
        })
    }

    async fn terminated_details(
        &self,
        run_id: &RunId,
        termination: DurableTermination,
    ) -> Result<RunDetails> {
        let last = entry_of(termination.history.as_ref(), termination.final_step);
        let outcome = self.run_result_of(run_id, &termination).await?;
        let public = RunTermination::from(&termination);
        Ok(RunDetails {
            run_id: run_id.clone(),
            workflow: termination.workflow,
            group: termination.group,
            group_key: None,
            current_step: termination.final_step,
            step_name: last.as_ref().map(|record| record.name.clone()),
            job_id: termination.job_id,
            attempts: last
                .as_ref()
                .and_then(|record| record.attempts.last())
                .map_or(0, |attempt| attempt.attempt),
            max_attempts: 0,
            scheduled_at_ms: None,
            waiting_for_signal: None,
            last_error: public.error.clone(),
            headers: outcome.map(|outcome| outcome.headers).unwrap_or_default(),
            submitted_at_ms: termination.submitted_at_ms,
            ended_at_ms: Some(termination.terminated_at_ms),
            // Cancelled from outside: the cancellation carries no runner's
            // reason as its error.
            cancel_requested: termination.cancel_reason.is_some()
                || (public.status == crate::model::TerminalStatus::Cancelled
                    && public.error.is_none()),
            cancel_reason: termination.cancel_reason,
            forked_from: termination.forked_from.map(Into::into),
            version: termination.version,
            patches: termination.patches,
            parent: termination.parent,
            children: crate::engine::children::list_children(&self.queue, run_id).await?,
            concurrency: termination
                .concurrency
                .map(|c| crate::view::keys::run_concurrency(c, "")),
            state: RunState::Terminated(public),
        })
    }

    /// The step history of `run_id` (its current execution): one entry per
    /// step that settled, each with its settled attempts, for the last
    /// [`history_limit`](crate::WorkflowRuntimeBuilder::history_limit)
    /// steps. `None` for a run never submitted or whose records retention
    /// removed.
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn steps(&self, run_id: &RunId) -> Result<Option<RunHistory>> {
        if let Some(record) = self.run_record(run_id).await? {
            let current = self.current_job(run_id).await?;
            let step = current
                .as_ref()
                .map_or(0, |(pointer, _)| pointer.step_number);
            let pending = current
                .as_ref()
                .and_then(|(pointer, _)| pointer.history.as_ref());
            let history = read::run_history(
                &self.queue,
                run_id,
                record.execution.as_deref(),
                pending,
                step,
            )
            .await?;
            let mut history = read::with_version(history, record.version.as_deref());
            if let Some((_, job)) = current {
                self.add_attempts_in_progress(&mut history, step, &job)
                    .await?;
            }
            return Ok(Some(history));
        }
        let Some(termination) = self.terminal_record(run_id).await? else {
            return Ok(None);
        };
        read::run_history(
            &self.queue,
            run_id,
            termination.execution.as_deref(),
            termination.history.as_ref(),
            termination.final_step,
        )
        .await
        .map(|history| Some(read::with_version(history, termination.version.as_deref())))
    }

    /// Add the attempts of the current step's job that the queue recorded
    /// and the step's history has not taken in yet (retries, expired
    /// leases: they join it when the step settles).
    async fn add_attempts_in_progress(
        &self,
        history: &mut RunHistory,
        step: u32,
        job: &JobRecord,
    ) -> Result<()> {
        if matches!(job.status, JobStatus::Done | JobStatus::Dead) {
            // Settled: its attempts are in the step's record.
            return Ok(());
        }
        let entries = self.queue.attempt_history(&job.id).await?;
        let earlier = earlier_attempts(&entries, u32::MAX);
        if earlier.is_empty() {
            return Ok(());
        }
        let attempts = earlier.into_iter().map(|attempt| StepAttempt {
            attempt: attempt.attempt,
            claimed_at_ms: attempt.claimed_at_ms,
            settled_at_ms: attempt.settled_at_ms,
            outcome: attempt.outcome.into(),
        });
        match history.steps.last_mut() {
            Some(last) if last.step == step => last.attempts.extend(attempts),
            _ => {
                history.steps.push(StepHistory {
                    step,
                    name: inline_step_name(job).unwrap_or_default(),
                    attempts: attempts.collect(),
                    attempts_dropped: 0,
                    version: history.version.clone(),
                });
                if history.steps.len() == 1 {
                    history.steps_dropped = step;
                }
            }
        }
        Ok(())
    }

    /// One page of the run groups in the store, in group-id order, each with
    /// its member counts (from its manifest and member records), starting
    /// after the group `after`, at most `limit` (clamped to
    /// `1..=`[`MAX_PAGE_LIMIT`]). A group whose manifest is gone (forgotten
    /// while listed) is skipped.
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn groups(&self, after: Option<&RunId>, limit: usize) -> Result<GroupPage> {
        let limit = limit.clamp(1, MAX_PAGE_LIMIT);
        let start = match after {
            Some(after) => {
                let mut key = GROUP_SUBMISSIONS_PREFIX.as_bytes().to_vec();
                key.extend_from_slice(after.as_bytes());
                Bound::Excluded(key)
            }
            None => Bound::Unbounded,
        };
        let mut ids = std::pin::pin!(
            self.queue
                .kv_entries(
                    GROUP_SUBMISSIONS_PREFIX.as_bytes(),
                    (start, Bound::<Vec<u8>>::Unbounded),
                    SCAN_PAGE
                )
                .map_ok(|(key, _)| key)
        );
        let mut groups = Vec::new();
        while let Some(key) = ids.try_next().await? {
            let Some(group_id) = std::str::from_utf8(&key[GROUP_SUBMISSIONS_PREFIX.len()..])
                .ok()
                .and_then(|id| RunId::new(id).ok())
            else {
                continue;
            };
            if groups.len() == limit {
                let next = groups.last().map(|g: &GroupStatus| g.group_id.clone());
                return Ok(GroupPage { groups, next });
            }
            if let Some(status) = self.group(&group_id).await? {
                groups.push(status);
            }
        }
        Ok(GroupPage { groups, next: None })
    }

    /// The member counts of group `group_id`, as
    /// [`RunGroup::status`](crate::RunGroup::status) reports them; `None`
    /// for a group never submitted (or forgotten).
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn group(&self, group_id: &RunId) -> Result<Option<GroupStatus>> {
        let objects = self.memos.objects();
        let Some(bytes) = objects
            .get(&group::manifest_path(objects, group_id))
            .await?
        else {
            return Ok(None);
        };
        let manifest: Manifest = durable::decode(&bytes)?;
        let members = group::members_in(&self.queue, group_id).await?;
        Ok(Some(group::group_status(
            group_id,
            manifest.members.len(),
            &members,
        )))
    }

    /// The state of inbox command `id`
    /// ([`Inbox::send`](crate::inbox::Inbox::send)): its record when the owner
    /// recorded one, else [`CommandState::Pending`] while its object is in
    /// the inbox, else [`CommandState::Unknown`]. On a local-directory
    /// store only a regular file counts as the object, and nothing is
    /// opened to find out (whatever is planted under the command's name,
    /// a FIFO or a link, is answered `Unknown` at once).
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn command(&self, id: &CommandId) -> Result<CommandState> {
        let key = command_kv_key(&id.to_string());
        if let Some(record) = durable::kv_record::<DurableCommandRecord>(&self.queue, &key).await? {
            return Ok(record.into());
        }
        let objects = self.memos.objects();
        // Only a regular file in the inbox is a command the owner applies
        // (on a local store nothing is opened to find out).
        if InboxObjects::new(objects)
            .holds(&command_path(objects, id))
            .await?
        {
            return Ok(CommandState::Pending);
        }
        // Applied between the two reads: the record is committed before the
        // object is deleted.
        Ok(
            match durable::kv_record::<DurableCommandRecord>(&self.queue, &key).await? {
                Some(record) => record.into(),
                None => CommandState::Unknown,
            },
        )
    }
}

/// The state of an active run from its record and current step job.
fn active_state(record: &DurableRunRecord, job: &JobRecord) -> RunState {
    if record.cancel_requested {
        RunState::Cancelling
    } else if job.status == JobStatus::Claimed {
        RunState::Running
    } else {
        RunState::Pending
    }
}

/// The step name of a named run's job from its inline payload.
fn inline_step_name(job: &JobRecord) -> Option<String> {
    if job.payload_ref.is_some() {
        return None;
    }
    step_of_named_run(&job.payload)
}

/// The last pending history entry of step `step`.
fn entry_of(pending: Option<&PendingHistory>, step: u32) -> Option<DurableStepEntry> {
    decode_entries(&pending?.entries)
        .into_iter()
        .rev()
        .find(|entry| entry.step == step)
}
