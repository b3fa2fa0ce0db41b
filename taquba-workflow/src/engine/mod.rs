//! The runtime's engine: [`RuntimeCore`], shared by every clone of a
//! runtime and by its run groups, with its settings, the building of step
//! jobs and the effects of a run's termination (here), and every part of
//! the engine's work in a child module that extends it:
//!
//! - runs: submission ([`submit`]), processing and settling a claimed
//!   step ([`settle`]), cancellation ([`cancel`]), resuming a dead-lettered
//!   step ([`requeue`]), waiting for a termination ([`wait`]), step-output
//!   replay records ([`replay`]), a step attempt's history entries
//!   ([`attempt`]);
//! - coordination: signals ([`signal`], by run id in [`signal_run`], from
//!   the inbox in [`signal_command`]), group submission ([`group_submit`])
//!   and removal ([`group_forget`]), child workflows ([`children`]),
//!   per-key concurrency ([`keys`]);
//! - upkeep: retention sweeps and dead-letter reconciliation ([`sweep`]),
//!   the runtime and worker records tools read ([`operator`]), applying
//!   inbox commands ([`inbox_apply`]);
//! - the state the public faces share with the worker ([`inner`]).
//!
//! The state each concern keeps (group locks, signal locks, naming, the
//! inbox watch, the history cache, the in-flight registry, ...) is a type
//! of a leaf module outside the engine, which never imports it back.

pub(crate) mod attempt;
pub(crate) mod cancel;
pub(crate) mod children;
pub(crate) mod dead_count;
pub(crate) mod fork;
pub(crate) mod group_forget;
pub(crate) mod group_submit;
pub(crate) mod inbox_apply;
pub(crate) mod inner;
pub(crate) mod keys;
pub(crate) mod operator;
#[cfg(feature = "opentelemetry")]
pub(crate) mod otel;
pub(crate) mod replay;
pub(crate) mod requeue;
pub(crate) mod settle;
pub(crate) mod signal;
pub(crate) mod signal_command;
pub(crate) mod signal_run;
pub(crate) mod submit;
pub(crate) mod sweep;
pub(crate) mod wait;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use taquba::object_store::ObjectStore;
use taquba::{
    Clock, EnqueueOptions, EnqueueRequest, ExpiryIndex, JobRecord, Queue, SettlementEffects,
};
use tokio_util::sync::CancellationToken;

use crate::coordination::group_locks::GroupLocks;
use crate::coordination::members::{GroupStore, Membership, terminated_member};
use crate::coordination::signal::SignalLocks;
use crate::error::{Error, Result};
use crate::model::StepErrorKind;
use crate::model::{MAX_TERMINATION_ERROR_LEN, RunOutcome, TerminalStatus};
use crate::model::{RunEnd, RunTermination};
use crate::run::commit::{Committer, Ending};
use crate::run::ids::IdGenerator;
use crate::run::inflight::InFlightRegistry;
use crate::run::submit_batch::SubmitBatcher;
use crate::run::watch::{RunWatchers, store_closed_token};
use crate::store::durable::{
    self, DurableCurrentStep, DurableRunOutcome, DurableRunRecord, DurableRunResultRef,
    DurableTermination,
};
use crate::store::keys::user_headers;
use crate::store::keys::{
    COMMAND_EXPIRY_PREFIX, GROUP_TERMINALS_PREFIX, HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL,
    RunId, TERMINALS_PREFIX, outcome_kv_key, run_kv_key, step_dedup_key, step_kv_key,
};
use crate::store::memo::{MemoStore, RUN_RESULT_MEMO_KEY};
use crate::view::WorkflowView;

/// Whether a terminal hook wants a notification for an outcome; built over
/// `hooks::guard::observes`, so it never panics.
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
    /// The operator surface: history, naming, commands.
    pub(crate) ops: OpsSettings,
}

/// The settings of the operator surface (run history, step names, inbox
/// commands), kept together so the engine's other settings stay apart.
#[derive(Debug, Clone)]
pub(crate) struct OpsSettings {
    /// Steps of history kept per run; 0 turns history off.
    pub(crate) history_limit: u32,
    /// The largest step payload a history entry keeps, bytes.
    pub(crate) step_input_limit: usize,
    /// The name of a step no runner or payload names: the runner's type.
    pub(crate) runner_label: String,
    /// How step and workflow names are read from payloads.
    pub(crate) naming: crate::history::naming::Naming,
    /// How long a command record is kept after it was recorded.
    pub(crate) command_retention: Duration,
    /// What the runner can run, checked against inbox submits.
    pub(crate) hosted: crate::runner::Hosted,
    /// What code the runner runs (its version and patches), per workflow.
    pub(crate) code: crate::versioning::CodeTable,
}

/// The engine of one runtime.
pub(crate) struct RuntimeCore {
    pub(crate) queue: Arc<Queue>,
    pub(crate) queue_name: String,
    pub(crate) view: WorkflowView,
    pub(crate) memo_store: MemoStore,
    pub(crate) group_store: GroupStore,
    clock: Arc<dyn Clock>,
    pub(crate) max_concurrent_steps: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) memo_retention: Option<Duration>,
    pub(crate) group_retention: Option<Duration>,
    step_output_replay: bool,
    /// Run terminal markers (memo retention).
    terminals: ExpiryIndex,
    /// Group terminal markers (group retention).
    group_terminals: ExpiryIndex,
    /// Operator-surface settings.
    pub(crate) ops: OpsSettings,
    /// Command record expiry entries (command retention).
    command_expiry: ExpiryIndex,
    /// The history entries of committed pointers, by the job they name.
    pub(crate) history_cache: crate::history::cache::HistoryCache,
    /// Active runs' records for the claim path (shared by every runtime
    /// over the queue).
    pub(crate) run_records: crate::run::record_cache::RunRecordCache,
    /// The ends of runs that terminated lately in this process (shared by
    /// every runtime over the queue).
    pub(crate) recent_ends: crate::run::recent_ends::RecentEnds,
    /// When maintenance lists the inbox.
    inbox_watch: crate::engine::inbox_apply::InboxWatch,
    /// Whether this runtime's descriptor was recorded since it was built.
    descriptor_recorded: std::sync::atomic::AtomicBool,
    /// The start its worker record names (ms, runtime clock); 0 before it
    /// is recorded.
    worker_started_at_ms: AtomicU64,
    /// How many periodic maintenance tasks of this runtime run now (each
    /// reconciles dead-lettered steps every poll interval; see
    /// [`maintained_here`](Self::maintained_here)).
    maintainers: std::sync::atomic::AtomicUsize,
    /// Told when a periodic maintenance task of this runtime stops: waits
    /// in a backed-off sleep look again (see `engine::wait`).
    pub(crate) maintenance_stopped: tokio::sync::Notify,
    memo_prefix: String,
    pub(crate) inflight: Arc<InFlightRegistry>,
    /// Waiters on run terminations in this process.
    pub(crate) run_watchers: RunWatchers,
    /// The group commit of submissions under fresh run ids.
    submit_batcher: SubmitBatcher,
    /// The ids of runs submitted without one and of new groups (shared by
    /// every runtime over the queue).
    ids: IdGenerator,
    /// Every other commit, each on a task of its own.
    pub(crate) commits: Committer,
    signal_locks: SignalLocks,
    /// The locks of run groups (shared by every runtime over the queue).
    pub(crate) group_locks: GroupLocks,
    /// The concurrency keys (shared by every runtime over the queue).
    pub(crate) keys: crate::coordination::keys::ConcurrencyKeys,
    observes: Observes,
    /// Dead letters the worker performed since the last reconciliation look.
    /// Signed: a dead letter counted before its settlement and uncounted
    /// after it failed can leave the count below zero for one look.
    own_dead_letters: AtomicI64,
    /// The queue's dead count at the last look; -1 before the first.
    last_dead_count: AtomicI64,
    /// Maintenance rounds done, for the periodic full reconciliation.
    maintenance_rounds: AtomicU64,
    /// When maintenance next reads the queue's dead count.
    pub(crate) dead_count: dead_count::DeadCountSchedule,
    /// Fired once the queue's store is closed to this process for good
    /// (closed, or fenced by another process that opened it): the worker
    /// loop stops and waits fail instead of waiting forever. Shared by
    /// every runtime over the same queue.
    pub(crate) store_closed: CancellationToken,
}

/// What a plain submission does with a run id whose run terminated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OnTerminated {
    /// Start a new run under the id (runs).
    Restart,
    /// Answer with the recorded run (idempotent jobs); the job's
    /// idempotency key, which its step job carries in
    /// [`HEADER_JOB_KEY`](crate::store::keys::HEADER_JOB_KEY).
    Keep(String),
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
        let memo_prefix = settings.memo_prefix.clone();
        let view = WorkflowView::new(settings.queue.view().clone(), memo_store.clone());
        let run_watchers = RunWatchers::for_queue(&settings.queue);
        let store_closed = store_closed_token(&settings.queue);
        let submit_batcher = SubmitBatcher::new(settings.queue.clone());
        let ids = IdGenerator::for_queue(&settings.queue);
        let commits = Committer::new(
            settings.queue.clone(),
            run_watchers,
            store_closed.clone(),
            &settings.queue_name,
        );
        let terminals = ExpiryIndex::new(TERMINALS_PREFIX.as_bytes().to_vec());
        let group_store = GroupStore::new(
            settings.object_store,
            settings.memo_prefix,
            memo_store.clone(),
            commits.clone(),
            terminals.clone(),
        );
        let group_locks = GroupLocks::for_queue(&settings.queue);
        let keys = crate::coordination::keys::ConcurrencyKeys::for_queue(&settings.queue);
        let run_records = crate::run::record_cache::RunRecordCache::for_queue(&settings.queue);
        let recent_ends = crate::run::recent_ends::RecentEnds::for_queue(&settings.queue);
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
            terminals,
            group_terminals: ExpiryIndex::new(GROUP_TERMINALS_PREFIX.as_bytes().to_vec()),
            ops: settings.ops,
            command_expiry: ExpiryIndex::new(COMMAND_EXPIRY_PREFIX.as_bytes().to_vec()),
            history_cache: Default::default(),
            run_records,
            recent_ends,
            inbox_watch: Default::default(),
            descriptor_recorded: std::sync::atomic::AtomicBool::new(false),
            worker_started_at_ms: AtomicU64::new(0),
            maintainers: std::sync::atomic::AtomicUsize::new(0),
            maintenance_stopped: tokio::sync::Notify::new(),
            memo_prefix,
            inflight: Arc::default(),
            run_watchers,
            submit_batcher,
            ids,
            commits,
            signal_locks: SignalLocks::default(),
            group_locks,
            keys,
            observes: settings.observes,
            own_dead_letters: AtomicI64::new(0),
            last_dead_count: AtomicI64::new(-1),
            maintenance_rounds: AtomicU64::new(0),
            dead_count: dead_count::DeadCountSchedule::default(),
            store_closed,
        }
    }

    /// Record an error of the queue: one that says the store is closed to
    /// this process fires [`Self::store_closed`].
    pub(crate) fn note_error(&self, err: &Error) {
        match err {
            Error::StoreOutage(outage) => self.commits.note_outage(outage),
            err => self.note_closed(err.is_store_closed(), err),
        }
    }

    /// Fire [`Self::store_closed`] when `closed`, logging `err`.
    pub(crate) fn note_closed(&self, closed: bool, err: &dyn std::fmt::Display) {
        self.commits.note_closed(closed, err);
    }

    /// The error reported once the store is closed to this process.
    pub(crate) fn store_closed_error(&self) -> Error {
        if let Some(outage) = self.commits.outage() {
            return Error::StoreOutage(outage);
        }
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

    /// A fresh ULID id on the runtime's clock, later than every id
    /// generated before over the queue (in this process).
    pub(crate) fn new_run_id(&self) -> RunId {
        self.ids.next(self.now_ms())
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
        // Sized once for the reserved headers as well (the map would grow
        // at the third).
        let mut headers =
            HashMap::with_capacity(user_headers.len() + 2 + opts.reserved_headers.len());
        headers.extend(
            user_headers
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
        headers.insert(HEADER_RUN_ID.to_string(), run_id.to_string());
        headers.insert(
            HEADER_STEP.to_string(),
            itoa::Buffer::new().format(step_number).to_owned(),
        );
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
            history: None,
        };
        effects
            .enqueue(step.request)
            .kv_put(step_kv_key(run_id), durable::encode(&pointer))
    }
    /// The terminal record of a termination happening now of the run whose
    /// record is `run`, at its step job `job_id`, a member of a group when
    /// `membership` is given.
    pub(crate) fn termination(
        &self,
        outcome: &RunOutcome,
        error_kind: Option<StepErrorKind>,
        run: &DurableRunRecord,
        job_id: &str,
        membership: Option<&Membership>,
    ) -> DurableTermination {
        DurableTermination {
            status: outcome.status.into(),
            error: outcome
                .error
                .as_deref()
                .map(|error| crate::history::cut_to(error, MAX_TERMINATION_ERROR_LEN)),
            error_kind: error_kind.map(Into::into),
            final_step: outcome.final_step,
            terminated_at_ms: self.now_ms(),
            input_hash: run.input_hash.clone(),
            submitted_at_ms: Some(run.submitted_at_ms),
            job_id: Some(job_id.to_string()),
            history: None,
            execution: run.execution.clone(),
            workflow: run.workflow.clone(),
            group: run.group.clone(),
            cancel_reason: run.cancel_reason.clone(),
            member: membership.map(Membership::durable),
            forked_from: run.forked_from.clone(),
            concurrency: run.concurrency.clone(),
            version: run.version.clone(),
            patches: run.patches.clone(),
            parent: run.parent.clone(),
        }
    }

    /// Write the run result record of a worker-performed termination to the
    /// run memo; done before the terminating settlement.
    pub(crate) async fn store_run_result(
        &self,
        outcome: &RunOutcome,
        termination: &DurableTermination,
    ) -> Result<()> {
        let record = DurableRunResultRef {
            termination,
            outcome: outcome.into(),
        };
        self.memo_store
            .new_run_memo(&outcome.run_id)
            .put_reserved(RUN_RESULT_MEMO_KEY, &durable::encode(&record))
            .await
    }

    /// The effects of terminating `outcome.run_id`: remove the run record
    /// and pointer, write the terminal record (and the member record of a
    /// group member), the retention marker when retention is configured,
    /// and the notification job when the hook observes the outcome.
    /// `step` is the terminal step's queue record: the notification inherits
    /// its attempt limit and its priority (the run's, so an urgent run's hook
    /// is not queued behind a backlog of less urgent work). With the effects,
    /// the [`Ending`] their commit carries: the end the run's waiters are
    /// told once they commit (with `outcome` when `recorded`: its run
    /// result record was written), the run's concurrency key and whether
    /// it is a child, for the admission and child-wake pumps.
    pub(crate) fn terminate_effects(
        &self,
        outcome: &RunOutcome,
        termination: DurableTermination,
        membership: Option<&Membership>,
        step: &JobRecord,
        recorded: bool,
    ) -> (SettlementEffects, Ending) {
        let run_id = &outcome.run_id;
        let end = RunEnd {
            termination: RunTermination::from(&termination),
            outcome: recorded.then(|| outcome.clone()),
        };
        let at_ms = termination.terminated_at_ms;
        let mut effects = SettlementEffects::default()
            .kv_delete(run_kv_key(run_id))
            .kv_delete(step_kv_key(run_id))
            .kv_put(outcome_kv_key(run_id), durable::encode(&termination));
        effects = children::child_end_effects(effects, outcome, &termination);
        if let Some(concurrency) = &termination.concurrency {
            // The run's slot (or its waiter record) goes with it.
            effects = keys::release_key_effects(run_id, concurrency, effects);
        }
        if let Some(membership) = membership {
            effects = effects.kv_put(
                membership.kv_key(),
                durable::encode(&terminated_member(membership, run_id, termination.clone())),
            );
        }
        // The record moves into the ending (the run's end and the member
        // record above have what they need of it).
        let ending = Ending {
            run_id: run_id.clone(),
            end,
            key: termination.concurrency.as_ref().map(|c| c.key.clone()),
            child: termination.parent.is_some(),
            record: termination,
        };
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
                    .priority(step.priority)
                    .max_attempts(step.max_attempts),
            });
        }
        (effects, ending)
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
}

impl RuntimeCore {
    /// Write the terminal marker of a group whose last termination a results
    /// consumer observed (group retention only).
    pub(crate) async fn mark_group_terminated(&self, group_id: &RunId) -> Result<()> {
        if self.group_retention.is_some() {
            self.commits
                .commit(SettlementEffects::default().expiry_entry(
                    &self.group_terminals,
                    self.now_ms(),
                    group_id.as_bytes(),
                ))
                .await?;
        }
        Ok(())
    }
}

impl RuntimeCore {
    /// The workflow name recorded for a run submitted with `input`.
    pub(crate) fn workflow_name_of(&self, input: &[u8]) -> Option<String> {
        self.ops
            .naming
            .workflow_of(input)
            .map(|name| crate::history::cut_to(&name, crate::history::naming::MAX_NAME_LEN))
    }
}
