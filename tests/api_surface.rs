//! The published `taquba-workflow` 0.13 public interface, checked at compile
//! time: every item of `api-0.13.md` and `jobs.md` named at its 0.13 path
//! with its listed shape (fields, variants, traits, signatures). The checks
//! live in functions that are never run; the compiler checks them. The four
//! places where this implementation extends the listing in a way 0.13 code
//! can notice (README, "Compatibility with 0.13") are kept, commented out,
//! in blocks marked `// KNOWN DIFFERENCE:` with the compiler's error.
//!
//! Two tests run a tiny end-to-end call through a `WorkflowRuntime` and a
//! `JobRunner` on an in-memory store.

#![allow(dead_code, unused_variables, unused_imports, unused_mut)]
#![allow(clippy::unwrap_used, clippy::no_effect_underscore_binding)]
#![allow(clippy::let_underscore_future, clippy::diverging_sub_expression)]
#![allow(unreachable_code, clippy::match_single_binding)]
// The trait impls spell out the listed `-> impl Future` signatures on purpose.
#![allow(clippy::manual_async_fn, clippy::cmp_owned, clippy::type_complexity)]

use std::any::Any;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt::{Debug, Display};
use std::future::{Future, IntoFuture};
use std::hash::Hash;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{
    Clock, EnqueueRequest, LeaseHandle, Queue, QueueView, SettlementEffects, WorkerHandle,
};

use taquba_workflow::jobs::{
    GroupResult, Job, JobContext, JobError, JobGroup, JobHandle, JobRunner, JobRunnerBuilder,
    JoinError,
};
use taquba_workflow::{
    Delivery, EffectsHandle, Error, GroupMember, GroupStatus, KvReadHandle, MemberResult, Memo,
    MemoStore, NoopTerminalHook, RunEnd, RunGroup, RunId, RunOptions, RunOutcome, RunSpec,
    RunState, RunStatus, RunTermination, RunnerHandle, SignalOutcome, Step, StepError,
    StepErrorKind, StepOutcome, StepRunner, SubmitOutcome, TerminalEffects, TerminalHook,
    TerminalStatus, Trigger, WorkflowRuntime, WorkflowRuntimeBuilder, WorkflowView,
};

/// `taquba_workflow::Result<T>` (the crate's alias).
type WResult<T> = taquba_workflow::Result<T>;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn same_type<T>(_: &T, _: &T) {}
fn is_send<T: Send>(_: &T) {}
fn is_static<T: 'static>(_: &T) {}

fn clone_debug<T: Clone + Debug>() {}
fn clone_debug_default<T: Clone + Debug + Default>() {}
fn clone_debug_eq<T: Clone + Debug + PartialEq + Eq>() {}
fn clone_debug_copy_eq<T: Clone + Debug + Copy + PartialEq + Eq>() {}
fn error_traits<T: Debug + Display + std::error::Error>() {}

// ---------------------------------------------------------------------------
// User types implementing the 0.13 traits with their exact signatures
// ---------------------------------------------------------------------------

/// A step runner: returns its payload as the run's result.
struct EchoRunner;

impl StepRunner for EchoRunner {
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send {
        let payload = step.payload.clone();
        async move { Ok(StepOutcome::Succeed { result: payload }) }
    }
}

/// A terminal hook that implements both listed methods.
struct CountingHook;

impl TerminalHook for CountingHook {
    fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> impl Future<Output = Result<(), StepError>> + Send {
        let _: &RunOutcome = outcome;
        let _: &TerminalEffects = effects;
        async { Ok(()) }
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        outcome.status == TerminalStatus::Succeeded
    }
}

/// A hook implementing only the required method (the provided one is kept).
struct MinimalHook;

impl TerminalHook for MinimalHook {
    fn on_termination(
        &self,
        _outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> impl Future<Output = Result<(), StepError>> + Send {
        async { Ok(()) }
    }
}

#[derive(Debug)]
struct AddError(String);

impl Display for AddError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AddError {}

/// A typed job implementing every listed item of `Job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct AddJob {
    a: u32,
    b: u32,
}

impl Job for AddJob {
    type Output = u32;
    type Error = AddError;

    const NAME: &'static str = "api_surface.add";

    fn run(
        &self,
        ctx: JobContext<'_>,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send {
        let sum = self.a + self.b;
        let _: Option<&Offset> = ctx.try_state::<Offset>();
        let offset = ctx.try_state::<Offset>().map_or(0, |o| o.0);
        async move { Ok(sum + offset) }
    }

    fn idempotency_key(&self) -> Option<String> {
        Some(format!("add:{}:{}", self.a, self.b))
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(2)
    }

    fn classify(&self, _error: &Self::Error) -> StepErrorKind {
        StepErrorKind::Permanent
    }
}

/// A job implementing only the required items.
#[derive(Debug, Serialize, Deserialize)]
struct PlainJob;

impl Job for PlainJob {
    type Output = ();
    type Error = AddError;
    const NAME: &'static str = "api_surface.plain";

    fn run(
        &self,
        _ctx: JobContext<'_>,
    ) -> impl Future<Output = Result<Self::Output, Self::Error>> + Send {
        async { Ok(()) }
    }
}

/// Application state registered on the job runner.
struct Offset(u32);

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

#[test]
fn constants_have_their_0_13_types_and_values() {
    let header_run_id: &str = taquba_workflow::HEADER_RUN_ID;
    let header_signal_delivered: &str = taquba_workflow::HEADER_SIGNAL_DELIVERED;
    let header_signal_wait: &str = taquba_workflow::HEADER_SIGNAL_WAIT;
    let header_step: &str = taquba_workflow::HEADER_STEP;
    let header_terminal: &str = taquba_workflow::HEADER_TERMINAL;
    let max_run_id_len: usize = taquba_workflow::MAX_RUN_ID_LEN;
    let reserved_header_prefix: &str = taquba_workflow::RESERVED_HEADER_PREFIX;
    let reserved_kv_prefix: &str = taquba_workflow::RESERVED_KV_PREFIX;
    // Also usable in constant contexts, as `pub const` items.
    const _C: (&str, &str, &str, &str, &str, usize, &str, &str) = (
        taquba_workflow::HEADER_RUN_ID,
        taquba_workflow::HEADER_SIGNAL_DELIVERED,
        taquba_workflow::HEADER_SIGNAL_WAIT,
        taquba_workflow::HEADER_STEP,
        taquba_workflow::HEADER_TERMINAL,
        taquba_workflow::MAX_RUN_ID_LEN,
        taquba_workflow::RESERVED_HEADER_PREFIX,
        taquba_workflow::RESERVED_KV_PREFIX,
    );
    assert_eq!(header_run_id, "workflow.run_id");
    assert_eq!(header_signal_delivered, "workflow.signal_delivered");
    assert_eq!(header_signal_wait, "workflow.signal_wait");
    assert_eq!(header_step, "workflow.step");
    assert_eq!(header_terminal, "workflow.terminal");
    assert_eq!(max_run_id_len, 128);
    assert_eq!(reserved_header_prefix, "workflow.");
    assert_eq!(reserved_kv_prefix, "workflow/");
}

// ---------------------------------------------------------------------------
// enum.Error
// ---------------------------------------------------------------------------

fn error_enum(e: Error) {
    // Listed methods and traits.
    let _: fn(&Error) -> bool = Error::is_permanent;
    error_traits::<Error>();
    fn from_queue(e: taquba::Error) -> Error {
        Error::from(e)
    }
    fn from_store(e: taquba::object_store::Error) -> Error {
        Error::from(e)
    }
    fn from_encode(e: rmp_serde::encode::Error) -> Error {
        Error::from(e)
    }
    fn from_decode(e: rmp_serde::decode::Error) -> Error {
        Error::from(e)
    }
    fn into_join(e: Error) -> JoinError {
        JoinError::from(e)
    }
    fn into_step(e: Error) -> StepError {
        StepError::from(e)
    }

    // KNOWN DIFFERENCE: `Error` is not exhaustive as listed: the spec lists 18
    // variants (and no `#[non_exhaustive]`); the implementation adds
    // InvalidChildKey, ChildRunIdTaken, StoreOutage, GroupMemberRunId,
    // MemberRunIdTaken, InvalidMemoKey, NotWaitingForSignal,
    // InvalidCorrelationKey, MemberKeyTooLong, RuntimeShutdown,
    // InvalidRunOptions, InvalidCommand, CommandRefused, RunActive,
    // StepNotForkable, ForkRunIdTaken, InvalidSchedule, ScheduleNotFound,
    // InvalidCode.
    // A 0.13 exhaustive match fails with:
    //   error[E0004]: non-exhaustive patterns: `Error::InvalidChildKey { .. }`,
    //   `Error::ChildRunIdTaken { .. }`, `Error::StoreOutage(_)` and 16 more
    //   not covered
    //
    // match &e {
    //     Error::MissingHeader(_) => {}
    //     Error::InvalidStepHeader { .. } => {}
    //     Error::ReservedHeaderInSubmit(_) => {}
    //     Error::InvalidRunId { .. } => {}
    //     Error::InputMismatch(_) => {}
    //     Error::InconsistentRunState(_) => {}
    //     Error::ReservedKvKey(_) => {}
    //     Error::ConflictingKvEffect(_) => {}
    //     Error::EffectsSealed => {}
    //     Error::Queue(_) => {}
    //     Error::Store(_) => {}
    //     Error::Serialization(_) => {}
    //     Error::Deserialization(_) => {}
    //     Error::RunNotFound(_) => {}
    //     Error::MemberNotSubmitted { .. } => {}
    //     Error::DuplicateMemberKey(_) => {}
    //     Error::GroupMismatch(_) => {}
    //     Error::GroupNotFound(_) => {}
    // }

    // Every listed variant's payload shape (with a catch-all, see above).
    match e {
        Error::MissingHeader(h) => {
            let _: &'static str = h;
        }
        Error::InvalidStepHeader { header, value } => {
            let _: &'static str = header;
            let _: String = value;
        }
        Error::ReservedHeaderInSubmit(h) => {
            let _: String = h;
        }
        Error::InvalidRunId { run_id, reason } => {
            let _: String = run_id;
            let _: &'static str = reason;
        }
        Error::InputMismatch(id) => {
            let _: RunId = id;
        }
        Error::InconsistentRunState(id) => {
            let _: RunId = id;
        }
        Error::ReservedKvKey(k) => {
            let _: String = k;
        }
        Error::ConflictingKvEffect(k) => {
            let _: String = k;
        }
        Error::EffectsSealed => {}
        Error::Queue(q) => {
            let _: taquba::Error = q;
        }
        Error::Store(s) => {
            let _: taquba::object_store::Error = s;
        }
        Error::Serialization(s) => {
            let _: rmp_serde::encode::Error = s;
        }
        Error::Deserialization(d) => {
            let _: rmp_serde::decode::Error = d;
        }
        Error::RunNotFound(id) => {
            let _: RunId = id;
        }
        Error::MemberNotSubmitted { group_id, key } => {
            let _: RunId = group_id;
            let _: String = key;
        }
        Error::DuplicateMemberKey(k) => {
            let _: String = k;
        }
        Error::GroupMismatch(id) => {
            let _: RunId = id;
        }
        Error::GroupNotFound(id) => {
            let _: RunId = id;
        }
        _ => {}
    }

    // Every listed variant can be built.
    let id = RunId::new("r").unwrap();
    let _ = [
        Error::MissingHeader("h"),
        Error::InvalidStepHeader {
            header: "h",
            value: String::new(),
        },
        Error::ReservedHeaderInSubmit(String::new()),
        Error::InvalidRunId {
            run_id: String::new(),
            reason: "r",
        },
        Error::InputMismatch(id.clone()),
        Error::InconsistentRunState(id.clone()),
        Error::ReservedKvKey(String::new()),
        Error::ConflictingKvEffect(String::new()),
        Error::EffectsSealed,
        Error::RunNotFound(id.clone()),
        Error::MemberNotSubmitted {
            group_id: id.clone(),
            key: String::new(),
        },
        Error::DuplicateMemberKey(String::new()),
        Error::GroupMismatch(id.clone()),
        Error::GroupNotFound(id),
    ];
}

// ---------------------------------------------------------------------------
// Other enums
// ---------------------------------------------------------------------------

fn enums(
    state: RunState,
    signal: SignalOutcome,
    kind: StepErrorKind,
    outcome: StepOutcome,
    status: TerminalStatus,
    trigger: Trigger,
    join: JoinError,
) {
    clone_debug_eq::<RunState>();
    match state {
        RunState::Pending => {}
        RunState::Running => {}
        RunState::Cancelling => {}
        RunState::Terminated(t) => {
            let _: RunTermination = t;
        }
    }

    clone_debug_copy_eq::<SignalOutcome>();
    match signal {
        SignalOutcome::Delivered => {}
        SignalOutcome::Buffered => {}
    }

    clone_debug_copy_eq::<StepErrorKind>();
    match kind {
        StepErrorKind::Transient => {}
        StepErrorKind::Permanent => {}
    }

    clone_debug::<StepOutcome>();
    let _: fn(Vec<u8>) -> StepOutcome = StepOutcome::continue_now;
    let _: fn(Vec<u8>, Duration) -> StepOutcome = StepOutcome::continue_after;
    let _: StepOutcome = StepOutcome::continue_on_signal(vec![], "key", Duration::ZERO);
    let _: StepOutcome =
        StepOutcome::continue_on_signal(vec![], String::from("key"), Duration::ZERO);
    match outcome {
        StepOutcome::Continue { payload, when } => {
            let _: Vec<u8> = payload;
            let _: Trigger = when;
        }
        StepOutcome::Succeed { result } => {
            let _: Vec<u8> = result;
        }
        StepOutcome::Fail { reason } => {
            let _: String = reason;
        }
        StepOutcome::Cancel { reason } => {
            let _: String = reason;
        }
    }

    clone_debug_copy_eq::<TerminalStatus>();
    fn display<T: Display>() {}
    display::<TerminalStatus>();
    let _: fn(&TerminalStatus) -> &'static str = TerminalStatus::as_str;
    match status {
        TerminalStatus::Succeeded => {}
        TerminalStatus::Failed => {}
        TerminalStatus::Cancelled => {}
    }

    clone_debug::<Trigger>();
    match trigger {
        Trigger::Immediate => {}
        Trigger::After(d) => {
            let _: Duration = d;
        }
        Trigger::OnSignal {
            correlation_key,
            timeout,
        } => {
            let _: String = correlation_key;
            let _: Duration = timeout;
        }
    }

    error_traits::<JoinError>();
    fn join_from_error(e: Error) -> JoinError {
        e.into()
    }
    fn join_from_job(e: JobError) -> JoinError {
        e.into()
    }
    match join {
        JoinError::Infra(e) => {
            let _: Error = e;
        }
        JoinError::Job(e) => {
            let _: JobError = e;
        }
    }
}

// ---------------------------------------------------------------------------
// Structs with public fields
// ---------------------------------------------------------------------------

fn delivery(d: Delivery, lease: LeaseHandle) {
    clone_debug::<Delivery>();
    let _: fn(&Delivery) -> bool = Delivery::is_last_attempt;
    let _: fn() -> Delivery = Delivery::detached;

    // `cancel_token` is tokio-util's `CancellationToken` (the type taquba's
    // lease hands out).
    same_type(&d.cancel_token, lease.cancel_token());

    // KNOWN DIFFERENCE: `Delivery` has public fields beyond the listed eleven
    // (`children: ChildrenHandle`, `code: RunCode`), so a 0.13 exhaustive
    // destructuring (or struct literal) of it fails:
    //   error[E0027]: pattern does not mention fields `children`, `code`
    //   (struct literal: error[E0063]: missing fields `children` and `code`
    //   in initializer of `Delivery`)
    //
    // let Delivery {
    //     run_id, headers, job_id, attempts, max_attempts, cancel_token,
    //     lease, memo, run_memo, effects, kv,
    // } = d.clone();

    let Delivery {
        run_id,
        headers,
        job_id,
        attempts,
        max_attempts,
        cancel_token,
        lease,
        memo,
        run_memo,
        effects,
        kv,
        ..
    } = d;
    let _: RunId = run_id;
    let _: HashMap<String, String> = headers;
    let _: String = job_id;
    let _: u32 = attempts;
    let _: u32 = max_attempts;
    let _: LeaseHandle = lease;
    let _: Memo = memo;
    let _: Memo = run_memo;
    let _: EffectsHandle = effects;
    let _: KvReadHandle = kv;
}

fn group_structs(member: GroupMember, status: GroupStatus, result: MemberResult) {
    clone_debug_eq::<GroupMember>();
    fn serde_traits<T: Serialize + DeserializeOwned>() {}
    serde_traits::<GroupMember>();
    let GroupMember { key, input } = member;
    let _: String = key;
    let _: Vec<u8> = input;
    let _ = GroupMember {
        key: String::new(),
        input: Vec::new(),
    };

    clone_debug_eq::<GroupStatus>();
    let GroupStatus {
        group_id,
        total,
        pending,
        succeeded,
        failed,
        cancelled,
    } = status;
    let _: RunId = group_id;
    let _: usize = total;
    let _: usize = pending;
    let _: usize = succeeded;
    let _: usize = failed;
    let _: usize = cancelled;

    clone_debug::<MemberResult>();
    let MemberResult {
        key,
        run_id,
        termination,
        outcome,
    } = result;
    let _: String = key;
    let _: RunId = run_id;
    let _: RunTermination = termination;
    let _: Option<RunOutcome> = outcome;
}

fn run_structs(
    end: RunEnd,
    outcome: RunOutcome,
    status: RunStatus,
    termination: RunTermination,
    submit: SubmitOutcome,
) {
    clone_debug::<RunEnd>();
    let RunEnd {
        termination: t,
        outcome: o,
    } = end.clone();
    let _: RunTermination = t;
    let _: Option<RunOutcome> = o;
    let _: u32 = end.termination.final_step;
    let _ = RunEnd {
        termination: termination.clone(),
        outcome: None,
    };

    clone_debug::<RunOutcome>();
    let RunOutcome {
        run_id,
        status: s,
        result,
        error,
        headers,
        final_step,
    } = outcome.clone();
    let _: RunId = run_id;
    let _: TerminalStatus = s;
    let _: Option<Vec<u8>> = result;
    let _: Option<String> = error;
    let _: HashMap<String, String> = headers;
    let _: u32 = final_step;
    let _ = RunOutcome {
        run_id: RunId::new("r").unwrap(),
        status: TerminalStatus::Succeeded,
        result: None,
        error: None,
        headers: HashMap::new(),
        final_step: 0,
    };

    clone_debug::<RunStatus>();
    let RunStatus {
        run_id,
        state,
        current_step,
    } = status;
    let _: RunId = run_id;
    let _: RunState = state;
    let _: u32 = current_step;

    clone_debug_eq::<RunTermination>();
    let RunTermination {
        status: ts,
        error,
        error_kind,
        final_step,
        terminated_at_ms,
    } = termination;
    let _: TerminalStatus = ts;
    let _: Option<String> = error;
    let _: Option<StepErrorKind> = error_kind;
    let _: u32 = final_step;
    let _: u64 = terminated_at_ms;
    let _ = RunTermination {
        status: TerminalStatus::Failed,
        error: None,
        error_kind: None,
        final_step: 0,
        terminated_at_ms: 0,
    };

    clone_debug::<SubmitOutcome>();
    let SubmitOutcome {
        run_id,
        newly_submitted,
        job_id,
    } = submit;
    let _: RunId = run_id;
    let _: bool = newly_submitted;
    let _: String = job_id;
}

fn options_and_spec(options: RunOptions, spec: RunSpec) {
    clone_debug_default::<RunOptions>();

    // KNOWN DIFFERENCE: `RunOptions` has public fields beyond the listed four
    // (`concurrency_key: Option<String>`, `concurrency_limit: Option<u32>`),
    // so a 0.13 struct literal naming the listed fields (or an exhaustive
    // destructuring) fails:
    //   error[E0063]: missing fields `concurrency_key` and `concurrency_limit`
    //   in initializer of `RunOptions`
    //   (pattern: error[E0027]: pattern does not mention fields
    //   `concurrency_key`, `concurrency_limit`)
    //
    // let _ = RunOptions {
    //     headers: HashMap::new(),
    //     priority: None,
    //     max_attempts_per_step: None,
    //     run_at: None,
    // };
    // let RunOptions { headers, priority, max_attempts_per_step, run_at } = options.clone();

    let RunOptions {
        headers,
        priority,
        max_attempts_per_step,
        run_at,
        ..
    } = options;
    let _: HashMap<String, String> = headers;
    let _: Option<u32> = priority;
    let _: Option<u32> = max_attempts_per_step;
    let _: Option<SystemTime> = run_at;
    let _ = RunOptions {
        headers: HashMap::new(),
        priority: Some(1),
        max_attempts_per_step: Some(3),
        run_at: Some(SystemTime::UNIX_EPOCH),
        ..RunOptions::default()
    };

    clone_debug_default::<RunSpec>();
    let RunSpec {
        run_id,
        input,
        options,
        effects,
    } = spec;
    let _: Option<RunId> = run_id;
    let _: Vec<u8> = input;
    let _: RunOptions = options;
    let _: SettlementEffects = effects;
    let _ = RunSpec {
        run_id: None,
        input: Vec::new(),
        options: RunOptions::default(),
        effects: SettlementEffects::default(),
    };
}

fn step_and_errors(step: Step, error: StepError, job_error: JobError) {
    clone_debug::<Step>();
    fn deref_delivery<T: Deref<Target = Delivery> + DerefMut>() {}
    deref_delivery::<Step>();
    let _: Step = Step::detached(vec![1u8]);
    let _: Step = Step::detached(b"x".as_slice());
    let _: fn(&Step) -> bool = Step::is_last_attempt;
    let Step {
        delivery,
        step_number,
        payload,
        signal,
    } = step;
    let _: Delivery = delivery;
    let _: u32 = step_number;
    let _: Vec<u8> = payload;
    let _: Option<Vec<u8>> = signal;
    let _ = Step {
        delivery: Delivery::detached(),
        step_number: 0,
        payload: Vec::new(),
        signal: None,
    };

    clone_debug::<StepError>();
    error_traits::<StepError>();
    let _: StepError = StepError::transient("t");
    let _: StepError = StepError::permanent(String::from("p"));
    let StepError { message, kind } = error;
    let _: String = message;
    let _: StepErrorKind = kind;
    let _ = StepError {
        message: String::new(),
        kind: StepErrorKind::Transient,
    };

    clone_debug::<JobError>();
    error_traits::<JobError>();
    let JobError { kind, message } = job_error;
    let _: StepErrorKind = kind;
    let _: String = message;
    let _ = JobError {
        kind: StepErrorKind::Permanent,
        message: String::new(),
    };
}

fn group_result(r: GroupResult<AddJob>) {
    fn debug<T: Debug>() {}
    debug::<GroupResult<AddJob>>();
    let GroupResult { key, result } = r;
    let _: String = key;
    let _: Result<u32, JobError> = result;
    let _ = GroupResult::<AddJob> {
        key: String::new(),
        result: Ok(1),
    };
}

// ---------------------------------------------------------------------------
// Handles: effects, kv, memo, memo store
// ---------------------------------------------------------------------------

async fn handles(store: Arc<dyn ObjectStore>, request: EnqueueRequest) -> WResult<()> {
    clone_debug::<EffectsHandle>();
    let _: fn() -> EffectsHandle = EffectsHandle::detached;
    let effects = EffectsHandle::detached();
    let _: WResult<()> = effects.put(b"k".to_vec(), b"v".to_vec());
    let _: WResult<()> = effects.put("k", "v");
    let _: WResult<()> = effects.delete("k");
    let _: WResult<()> = effects.delete(vec![1u8]);

    clone_debug::<TerminalEffects>();
    let _: fn() -> TerminalEffects = TerminalEffects::detached;
    let _: fn(&TerminalEffects, EnqueueRequest) -> WResult<()> = TerminalEffects::enqueue;
    let terminal = TerminalEffects::detached();
    let _: WResult<()> = terminal.enqueue(request);
    let _: WResult<()> = terminal.put("k", b"v".to_vec());
    let _: WResult<()> = terminal.delete(b"k".to_vec());

    clone_debug::<KvReadHandle>();
    let _: fn() -> KvReadHandle = KvReadHandle::detached;
    let kv = KvReadHandle::detached();
    let _: WResult<Option<Bytes>> = kv.get(b"k").await;

    clone_debug::<MemoStore>();
    let memos: MemoStore = MemoStore::new(store.clone(), "prefix");
    let _: MemoStore = MemoStore::new(store, String::from("prefix"));
    let _: fn(&MemoStore, &RunId, u32) -> Memo = MemoStore::new_memo;
    let _: fn(&MemoStore, &RunId) -> Memo = MemoStore::new_run_memo;
    let id = RunId::new("r")?;
    let _: WResult<usize> = memos.clear_memos_for_run(&id).await;

    clone_debug::<Memo>();
    let memo = memos.new_memo(&id, 0);
    let _: fn(&Memo) -> &RunId = Memo::run_id;
    let _: fn(&Memo) -> Option<u32> = Memo::step_number;
    let _: WResult<Option<Vec<u8>>> = memo.get("k").await;
    let _: WResult<()> = memo.put("k", b"v").await;
    // `memoized` with the crate's error, and with an error converting from it.
    let _: Result<u32, Error> = memo.memoized("k", async { Ok::<u32, Error>(1) }).await;
    let _: Result<String, StepError> = memo
        .memoized("k", async { Ok::<String, StepError>(String::new()) })
        .await;
    let _: Result<u32, Error> = memo
        .memoized_by_content(&("op", 1u32), async { Ok::<u32, Error>(1) })
        .await;
    // `K: ?Sized`.
    let _: Result<u32, JoinError> = memo
        .memoized_by_content("unsized", async { Ok::<u32, JoinError>(1) })
        .await;
    let _: WResult<String> = Memo::content_key(&1u32);
    let _: WResult<String> = Memo::content_key("unsized");
    let _: WResult<String> = Memo::content_key::<[u8]>(b"bytes".as_slice());
    let _: WResult<Option<Vec<u8>>> = memo.content_get(&1u32).await;
    let _: WResult<Option<Vec<u8>>> = memo.content_get("unsized").await;
    let _: WResult<()> = memo.content_put(&1u32, b"v").await;
    let _: WResult<()> = memo.content_put("unsized", b"v").await;
    Ok(())
}

// ---------------------------------------------------------------------------
// RunId, Result, RunnerHandle, NoopTerminalHook
// ---------------------------------------------------------------------------

fn run_id_traits<
    T: AsRef<str>
        + Borrow<str>
        + Clone
        + Debug
        + Deref<Target = str>
        + Display
        + Into<String>
        + FromStr
        + Hash
        + Ord
        + PartialEq<&'static str>
        + PartialEq<String>
        + PartialEq<str>
        + PartialEq
        + PartialOrd
        + Serialize
        + Eq,
>() {
}

fn run_id_and_aliases() {
    run_id_traits::<RunId>();
    let _: WResult<RunId> = RunId::new("a");
    let _: WResult<RunId> = RunId::new(String::from("a"));
    let _: fn(&RunId) -> &str = RunId::as_str;
    let _: fn(RunId) -> String = RunId::into_string;
    let id: RunId = "abc".parse().unwrap();
    // `&str` methods through `Deref<Target = str>`.
    let _: usize = id.len();
    let _: bool = id.starts_with("a");
    let _: bool = id == "abc";
    let _: bool = id == *"abc";
    let _: bool = id == String::from("abc");
    let _: String = String::from(id);

    // `Result<T>` is `Result<T, Error>`.
    fn result_alias(r: taquba_workflow::Result<u8>) -> Result<u8, taquba_workflow::Error> {
        r
    }
    fn result_alias_back(r: Result<u8, taquba_workflow::Error>) -> taquba_workflow::Result<u8> {
        r
    }

    // `RunnerHandle` is `WorkerHandle<Result<()>>`.
    fn runner_handle(h: RunnerHandle) -> WorkerHandle<WResult<()>> {
        h
    }
    fn runner_handle_back(h: WorkerHandle<WResult<()>>) -> RunnerHandle {
        h
    }

    fn hook<H: TerminalHook + Clone + Copy + Debug + Default>() {}
    hook::<NoopTerminalHook>();
    let _: NoopTerminalHook = NoopTerminalHook;
}

// ---------------------------------------------------------------------------
// Traits: supertraits and callable signatures
// ---------------------------------------------------------------------------

fn runner_supertraits<R: StepRunner>() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<R>();
}

fn hook_supertraits<H: TerminalHook>() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<H>();
}

async fn call_runner<R: StepRunner>(runner: &R, step: &Step) {
    let fut = runner.run_step(step);
    is_send(&fut);
    let _: Result<StepOutcome, StepError> = fut.await;
}

async fn call_hook<H: TerminalHook>(hook: &H, outcome: &RunOutcome, effects: &TerminalEffects) {
    let _: bool = hook.observes(outcome);
    let fut = hook.on_termination(outcome, effects);
    is_send(&fut);
    let _: Result<(), StepError> = fut.await;
}

fn job_bounds<J: Job>(job: &J, error: &J::Error) {
    fn supers<T: Serialize + DeserializeOwned + Send + Sync + 'static>() {}
    supers::<J>();
    fn output<T: Serialize + DeserializeOwned + Send + 'static>() {}
    output::<J::Output>();
    fn err<T: Debug + Display + Send + Sync + 'static>() {}
    err::<J::Error>();
    let _: &'static str = J::NAME;
    let _: Option<String> = job.idempotency_key();
    let _: Option<u32> = job.max_attempts();
    let _: StepErrorKind = job.classify(error);

    // KNOWN DIFFERENCE: `Job::Error` is bounded `Debug + Display + Send + Sync +
    // 'static` instead of the listed `Error + Send + Sync + 'static`
    // (std::error::Error), so 0.13 generic code relying on the bound
    // through `J: Job` fails:
    //   error[E0277]: the trait bound `<J as Job>::Error: std::error::Error`
    //   is not satisfied
    //
    // fn std_error<T: std::error::Error + Send + Sync + 'static>() {}
    // std_error::<J::Error>();
}

async fn call_job<J: Job>(job: &J, ctx: JobContext<'_>) {
    let fut = job.run(ctx);
    is_send(&fut);
    let _: Result<J::Output, J::Error> = fut.await;
}

fn job_context<'a>(ctx: &JobContext<'a>) {
    fn deref_delivery<T: Deref<Target = Delivery>>() {}
    deref_delivery::<JobContext<'static>>();
    let _: &Offset = ctx.state::<Offset>();
    let _: Option<&Offset> = ctx.try_state::<Offset>();
    let _: bool = ctx.is_last_attempt();
    let _: for<'b> fn(&'b JobContext<'a>) -> &'b Offset = JobContext::<'a>::state::<Offset>;
    let _: for<'b> fn(&'b JobContext<'a>) -> Option<&'b Offset> =
        JobContext::<'a>::try_state::<Offset>;
    let _: for<'b> fn(&'b JobContext<'a>) -> bool = JobContext::<'a>::is_last_attempt;
    // Delivery fields through the context.
    let _: &RunId = &ctx.run_id;
    let _: u32 = ctx.attempts;
    let _: &Memo = &ctx.memo;
}

// ---------------------------------------------------------------------------
// WorkflowRuntime, its builder, the view, groups
// ---------------------------------------------------------------------------

fn builder_chain(
    queue: Arc<Queue>,
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
) -> WorkflowRuntime<EchoRunner, CountingHook> {
    let _: fn(
        Arc<Queue>,
        Arc<dyn ObjectStore>,
        EchoRunner,
        NoopTerminalHook,
    ) -> WorkflowRuntimeBuilder<EchoRunner, NoopTerminalHook> =
        WorkflowRuntime::<EchoRunner, NoopTerminalHook>::builder;
    let builder: WorkflowRuntimeBuilder<EchoRunner, CountingHook> =
        WorkflowRuntime::builder(queue, store, EchoRunner, CountingHook);
    let _: fn(
        WorkflowRuntimeBuilder<EchoRunner, CountingHook>,
    ) -> WorkflowRuntime<EchoRunner, CountingHook> = WorkflowRuntimeBuilder::build;
    builder
        .queue_name("steps")
        .queue_name(String::from("steps"))
        .memo_prefix("memo")
        .memo_prefix(String::from("memo"))
        .max_concurrent_steps(4usize)
        .poll_interval(Duration::from_millis(10))
        .memo_retention(Duration::from_secs(60))
        .step_output_replay()
        .clock(clock)
        .group_retention(Duration::from_secs(60))
        .build()
}

async fn runtime_surface(rt: WorkflowRuntime<EchoRunner, NoopTerminalHook>) -> WResult<()> {
    fn clone<T: Clone>() {}
    clone::<WorkflowRuntime<EchoRunner, NoopTerminalHook>>();
    let id = RunId::new("r")?;
    let _: WResult<SubmitOutcome> = rt.submit(RunSpec::default()).await;
    let _: fn(&WorkflowRuntime<EchoRunner, NoopTerminalHook>) -> &WorkflowView =
        WorkflowRuntime::view;
    let _: &WorkflowView = rt.view();
    let _: WResult<Option<RunStatus>> = rt.status(&id).await;
    let _: WResult<Option<RunOutcome>> = rt.outcome(&id).await;
    let _: WResult<RunEnd> = rt.wait(&id).await;
    let _: WResult<Option<RunEnd>> = rt.wait_timeout(&id, Duration::from_secs(1)).await;
    let _: WResult<bool> = rt.cancel(&id).await;
    let _: fn(&WorkflowRuntime<EchoRunner, NoopTerminalHook>, RunId) -> RunGroup =
        WorkflowRuntime::group;
    let _: fn(&WorkflowRuntime<EchoRunner, NoopTerminalHook>) -> RunGroup =
        WorkflowRuntime::new_group;
    let _: RunGroup = rt.group(id.clone());
    let _: RunGroup = rt.new_group();
    // `spawn` takes a `Send + 'static` future.
    let handle: RunnerHandle = rt.spawn(async {});
    let _: RunnerHandle = rt.spawn(std::future::pending::<()>());
    let _: WResult<()> = handle.shutdown().await;
    // `run` takes any future (not necessarily `Send` or `'static`).
    let local = std::rc::Rc::new(());
    let _: WResult<()> = rt
        .run(async move {
            let _keep = local;
        })
        .await;
    let _: WResult<SignalOutcome> = rt.signal("key", vec![1]).await;
    let _: WResult<bool> = rt.clear_signal("key").await;
    Ok(())
}

async fn view_surface(view: WorkflowView, queue_view: QueueView, memos: MemoStore) {
    fn clone<T: Clone>() {}
    clone::<WorkflowView>();
    let _: fn(QueueView, MemoStore) -> WorkflowView = WorkflowView::new;
    let _: WorkflowView = WorkflowView::new(queue_view, memos);
    let id = RunId::new("r").unwrap();
    let _: WResult<Option<RunStatus>> = view.status(&id).await;
    let _: WResult<Option<RunOutcome>> = view.outcome(&id).await;
}

async fn run_group_surface(rt: WorkflowRuntime<EchoRunner, NoopTerminalHook>) -> WResult<()> {
    fn clone<T: Clone>() {}
    clone::<RunGroup>();
    let group = rt.new_group();
    let _: fn(&RunGroup) -> &RunId = RunGroup::id;
    let members: Vec<GroupMember> = Vec::new();
    let options = RunOptions::default();
    let _: WResult<()> = group.submit(members, &options).await;
    let _: WResult<()> = group.resume(&options).await;
    // `results` borrows nothing from the group (`+ use<>`).
    let stream = {
        let g = rt.group(RunId::new("g")?);
        g.results().await?
    };
    is_static(&stream);
    fn stream_item<S: Stream<Item = WResult<MemberResult>>>(_: &S) {}
    stream_item(&stream);
    let mut stream = Box::pin(stream);
    let _: Option<WResult<MemberResult>> = stream.next().await;
    let _: WResult<GroupStatus> = group.status().await;
    let _: WResult<usize> = group.cancel().await;
    let _: WResult<()> = group.forget().await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Jobs: runner, builder, handle, group, payload key
// ---------------------------------------------------------------------------

fn job_runner_builder(
    queue: Arc<Queue>,
    queue_plain: Queue,
    store: Arc<dyn ObjectStore>,
    clock: Arc<dyn Clock>,
) -> JobRunner {
    // `queue: impl Into<Arc<Queue>>`: a `Queue` or an `Arc<Queue>`.
    let _: JobRunnerBuilder = JobRunner::builder(queue_plain, store.clone());
    let builder: JobRunnerBuilder = JobRunner::builder(queue, store);
    let _: fn(JobRunnerBuilder) -> JobRunner = JobRunnerBuilder::build;
    let _: fn(JobRunnerBuilder) -> JobRunnerBuilder = JobRunnerBuilder::register::<AddJob>;
    builder
        .register::<AddJob>()
        .register::<PlainJob>()
        .queue_name("jobs")
        .queue_name(String::from("jobs"))
        .memo_prefix("jobs-memo")
        .memo_prefix(String::from("jobs-memo"))
        .state(Offset(0))
        .max_concurrent_jobs(4usize)
        .poll_interval(Duration::from_millis(10))
        .retention(Duration::from_secs(60))
        .group_retention(Duration::from_secs(60))
        .clock(clock)
        .build()
}

async fn job_runner_surface(runner: JobRunner) -> WResult<()> {
    fn clone<T: Clone>() {}
    clone::<JobRunner>();
    let _: WResult<JobHandle<AddJob>> = runner.submit(AddJob { a: 1, b: 2 }).await;
    let _: WResult<JobHandle<AddJob>> = runner
        .submit_with(AddJob { a: 1, b: 2 }, RunOptions::default())
        .await;
    let _: fn(&JobRunner, RunId) -> JobGroup<AddJob> = JobRunner::group::<AddJob>;
    let _: fn(&JobRunner) -> JobGroup<AddJob> = JobRunner::new_group::<AddJob>;
    let _: JobGroup<AddJob> = runner.group(RunId::new("g")?);
    let _: JobGroup<AddJob> = runner.new_group();
    let handle: RunnerHandle = runner.spawn(async {});
    let _: WResult<()> = handle.shutdown().await;

    let _: fn(&AddJob) -> WResult<String> =
        taquba_workflow::jobs::payload_idempotency_key::<AddJob>;
    let _: WResult<String> = taquba_workflow::jobs::payload_idempotency_key(&PlainJob);
    Ok(())
}

async fn job_handle_surface(handle: JobHandle<AddJob>) -> WResult<()> {
    fn clone<T: Clone>() {}
    clone::<JobHandle<AddJob>>();
    // `impl<J: Job> Clone`: no `J: Clone` needed (`PlainJob` is not `Clone`).
    clone::<JobHandle<PlainJob>>();
    fn into_future<T: IntoFuture<Output = Result<u32, JoinError>>>() {}
    into_future::<JobHandle<AddJob>>();
    let _: fn(&JobHandle<AddJob>) -> &RunId = JobHandle::id;
    let _: fn(&JobHandle<AddJob>) -> bool = JobHandle::newly_submitted;
    let _: WResult<Option<RunStatus>> = handle.status().await;
    let _: WResult<Option<Result<u32, JobError>>> = handle.fetch_result().await;
    let _: WResult<Result<u32, JobError>> = handle.join().await;
    let _: WResult<Option<Result<u32, JobError>>> =
        handle.join_timeout(Duration::from_secs(1)).await;
    let _: Result<u32, JoinError> = handle.await;
    Ok(())
}

async fn job_group_surface(runner: JobRunner) -> WResult<()> {
    let group: JobGroup<AddJob> = runner.new_group();
    let _: fn(&JobGroup<AddJob>) -> &RunId = JobGroup::id;
    let _: WResult<()> = group.submit(vec![AddJob { a: 1, b: 1 }]).await;
    let _: WResult<()> = group.submit([AddJob { a: 1, b: 1 }]).await;
    let _: WResult<()> = group
        .submit_with(
            std::iter::once(AddJob { a: 1, b: 1 }),
            RunOptions::default(),
        )
        .await;
    let _: WResult<()> = group.resume().await;
    let _: WResult<()> = group.resume_with(RunOptions::default()).await;
    // `results` borrows nothing from the group (`+ use<J>`).
    let stream = {
        let g = runner.group::<AddJob>(RunId::new("g")?);
        g.results().await?
    };
    is_static(&stream);
    fn stream_item<S: Stream<Item = WResult<GroupResult<AddJob>>>>(_: &S) {}
    stream_item(&stream);
    let mut stream = Box::pin(stream);
    let _: Option<WResult<GroupResult<AddJob>>> = stream.next().await;
    let _: WResult<Vec<GroupResult<AddJob>>> = group.join().await;
    let _: WResult<GroupStatus> = group.status().await;
    let _: WResult<usize> = group.cancel().await;
    let _: WResult<()> = group.forget().await;
    Ok(())
}

/// Every generic check, instantiated with the types of this file.
fn instantiate_generics() {
    runner_supertraits::<EchoRunner>();
    hook_supertraits::<CountingHook>();
    hook_supertraits::<MinimalHook>();
    hook_supertraits::<NoopTerminalHook>();
    let _ = call_runner::<EchoRunner>;
    let _ = call_hook::<CountingHook>;
    let _ = call_hook::<MinimalHook>;
    let _ = call_hook::<NoopTerminalHook>;
    let _ = job_bounds::<AddJob>;
    let _ = job_bounds::<PlainJob>;
    let _ = call_job::<AddJob>;
    let _ = call_job::<PlainJob>;
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn the_0_13_surface_compiles() {
    instantiate_generics();
    run_id_and_aliases();
}

async fn memory_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = taquba::OpenOptions::default().flush_interval(Duration::from_millis(1));
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("open queue");
    (Arc::new(queue), store)
}

#[tokio::test]
async fn a_run_submits_runs_and_ends_through_the_0_13_calls() {
    let (queue, store) = memory_queue().await;
    let rt = WorkflowRuntime::builder(queue, store, EchoRunner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = rt.spawn(std::future::pending());
    let id = RunId::new("surface-1").unwrap();
    let submitted = rt
        .submit(RunSpec {
            run_id: Some(id.clone()),
            input: b"hello".to_vec(),
            ..RunSpec::default()
        })
        .await
        .unwrap();
    assert!(submitted.newly_submitted);
    assert_eq!(submitted.run_id, id);
    let end = tokio::time::timeout(Duration::from_secs(30), rt.wait(&id))
        .await
        .expect("run ended in time")
        .unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let outcome = end.outcome.expect("outcome recorded");
    assert_eq!(outcome.result.as_deref(), Some(b"hello".as_slice()));
    let status = rt.status(&id).await.unwrap().expect("status");
    assert!(matches!(status.state, RunState::Terminated(_)));
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_job_runs_and_joins_through_the_0_13_calls() {
    let (queue, store) = memory_queue().await;
    let runner = JobRunner::builder(queue, store)
        .register::<AddJob>()
        .state(Offset(10))
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runner.spawn(std::future::pending());
    let handle = runner.submit(AddJob { a: 1, b: 2 }).await.unwrap();
    assert!(handle.newly_submitted());
    let output = tokio::time::timeout(Duration::from_secs(30), handle.clone())
        .await
        .expect("job ended in time")
        .unwrap();
    assert_eq!(output, 13);
    assert_eq!(handle.fetch_result().await.unwrap().unwrap().unwrap(), 13);
    worker.shutdown().await.unwrap();
}
