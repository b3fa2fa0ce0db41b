//! Review (stop 40) of `#[workflow]` state machines and the
//! `WorkflowRuntime` calls around them, attacked as a user relying on the
//! docs would: typed step fields and a memoized call across a takeover of
//! the store (a second queue fencing the first) mid-step; looping runs
//! killed and taken over again and again (each step committed once);
//! durable timers and signal waits across kills on a mock clock; a
//! replayed timer's schedule and staged KV effects (`step_output_replay`)
//! after a crash between the replay record and the settlement; memo and KV
//! effects of a retried step; signals sent before a run exists, twice,
//! after it ended, and replayed through the inbox; one waiter per
//! correlation key against cancelled and timed-out waits; cancellations
//! racing signals and every ending; calls dropped at each await; a store
//! write outage held for a whole call; idempotent typed starts; retention
//! of a run id submitted again; 1 MiB values, `Duration::MAX` timers and
//! malformed payloads. Every test runs on paused Tokio time with the queue
//! on a `MockClock`.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Gate, Recorder, T0, eventually, rid, within};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use taquba::object_store::memory::InMemory;
use taquba::object_store::path::Path as ObjectPath;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba::{Clock, MockClock, OpenOptions, PRIORITY_HIGH, PRIORITY_LOW, Queue};
use taquba_workflow::inbox::{Command, Inbox};
use taquba_workflow::workflows::{
    StepContext, Transition, Workflow, WorkflowError, WorkflowInput, WorkflowOf, WorkflowRun,
};
use taquba_workflow::{
    Error, RunEnd, RunHistory, RunOptions, RunSpec, RunState, SignalOutcome, StepError, StepRunner,
    TerminalStatus, WorkflowRuntime, WorkflowRuntimeBuilder, workflow,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, poll_then_drop};
use tokio::task::JoinHandle;

// ---------------------------------------------------------------------------
// Shared set-up.

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);
/// The runtime's default memo prefix.
const MEMO: &str = "workflow-steps-memo";

/// `common::options` (mock clock, 1 ms flush, no backoff, 3 attempts) with
/// a fast scheduler and reaper.
fn open_options(clock: &MockClock) -> OpenOptions {
    common::options(clock)
        .scheduler_interval(Duration::from_millis(20))
        .reaper_interval(Duration::from_millis(50))
}

/// Open (or take over) the queue `db` of `store` on `clock`.
async fn open_queue(store: &Arc<dyn ObjectStore>, clock: &MockClock) -> Arc<Queue> {
    Arc::new(
        Queue::open_with_options(store.clone(), "db", open_options(clock))
            .await
            .expect("open queue"),
    )
}

/// A runtime builder of `workflow` over `queue` and `store`, told to
/// `hook`, polling every 20 ms.
fn builder<W: StepRunner>(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    workflow: W,
    hook: &Recorder,
) -> WorkflowRuntimeBuilder<W, Recorder> {
    WorkflowRuntime::builder(queue.clone(), store.clone(), workflow, hook.clone())
        .poll_interval(Duration::from_millis(20))
}

type Runtime<W> = WorkflowRuntime<W, Recorder>;

/// A worker loop's task.
type Worker = JoinHandle<taquba_workflow::Result<()>>;

/// The worker loop on a task of its own: abort it to kill the process.
fn worker<W: StepRunner + 'static>(rt: &Runtime<W>) -> Worker {
    let rt = rt.clone();
    tokio::spawn(async move { rt.run(std::future::pending::<()>()).await })
}

/// What the processes of a test share: a mock clock at `T0`, the store,
/// and the hook every runtime over the store tells.
struct Host {
    clock: MockClock,
    store: Arc<dyn ObjectStore>,
    hook: Recorder,
}

impl Host {
    /// Over a fresh in-memory store.
    fn in_memory() -> Self {
        Self::over(Arc::new(InMemory::new()))
    }

    fn over(store: Arc<dyn ObjectStore>) -> Self {
        Self {
            clock: MockClock::new(T0),
            store,
            hook: Recorder::default(),
        }
    }

    /// Open (or take over) the store's queue.
    async fn open(&self) -> Arc<Queue> {
        open_queue(&self.store, &self.clock).await
    }

    /// A runtime builder of `workflow` over `queue` and the store (see
    /// [`builder`]).
    fn builder<W: StepRunner>(
        &self,
        queue: &Arc<Queue>,
        workflow: W,
    ) -> WorkflowRuntimeBuilder<W, Recorder> {
        builder(queue, &self.store, workflow, &self.hook)
    }

    /// A process running `workflow`: the queue it opens (taking the store
    /// over), its runtime of the builder's defaults, and its worker.
    async fn process<W: StepRunner + 'static>(
        &self,
        workflow: W,
    ) -> (Arc<Queue>, Runtime<W>, Worker) {
        let queue = self.open().await;
        let rt = self.builder(&queue, workflow).build();
        let worker = worker(&rt);
        (queue, rt, worker)
    }
}

/// Kill a worker task (as `kill -9` kills its runner calls).
async fn kill(task: Worker) {
    task.abort();
    let _ = task.await;
}

/// The end of run `id` within 30 s of paused time.
async fn end_of<W: StepRunner>(rt: &Runtime<W>, id: &str) -> RunEnd {
    within(30, rt.wait(&rid(id)))
        .await
        .expect("the run is read")
}

/// The result a run ended with, decoded as a `T`.
fn decoded<T: DeserializeOwned>(end: RunEnd) -> T {
    rmp_serde::from_slice(&end.outcome.and_then(|o| o.result).expect("a result")).expect("decodes")
}

/// Start run `id` with `input` and default options.
async fn start<W: StepRunner, I: WorkflowInput>(
    rt: &Runtime<W>,
    id: &str,
    input: I,
) -> WorkflowRun<WorkflowOf<I>, W, Recorder> {
    rt.start_as(rid(id), input, RunOptions::default())
        .await
        .expect("starts")
}

/// The output of typed run `run`, which succeeds within 30 s of paused
/// time.
async fn succeeded<W: Workflow, R: StepRunner>(run: &WorkflowRun<W, R, Recorder>) -> W::Output {
    within(30, run.wait())
        .await
        .expect("read")
        .expect("succeeds")
}

/// The step history of run `id` (which must have one).
async fn history_of<W: StepRunner>(rt: &Runtime<W>, id: &str) -> RunHistory {
    rt.view()
        .steps(&rid(id))
        .await
        .expect("history")
        .expect("recorded")
}

/// How many terminal notifications the hook got for run `id`.
fn told(hook: &Recorder, id: &str) -> usize {
    hook.calls().iter().filter(|o| o.run_id == *id).count()
}

/// The hook is told of run `id` exactly once (also after 300 ms more).
async fn told_once(hook: &Recorder, id: &str) {
    eventually(&format!("the hook is told of {id}"), || async {
        told(hook, id) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(told(hook, id), 1, "run {id} told once: {:?}", hook.calls());
}

/// The state of run `id` (which must exist).
async fn state_of<W: StepRunner>(rt: &Runtime<W>, id: &str) -> (RunState, u32) {
    let status = rt.status(&rid(id)).await.expect("status").expect("known");
    (status.state, status.current_step)
}

/// Wait until run `id` is at step `step` in state `state`.
async fn until_at<W: StepRunner>(rt: &Runtime<W>, id: &str, step: u32, state: RunState) {
    eventually(&format!("{id} at step {step} ({state:?})"), || async {
        state_of(rt, id).await == (state.clone(), step)
    })
    .await;
}

/// Let 200 ms of paused time pass: run `id` is still pending at step
/// `step` (`what` says why).
async fn not_yet<W: StepRunner>(rt: &Runtime<W>, id: &str, step: u32, what: &str) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(state_of(rt, id).await, (RunState::Pending, step), "{what}");
}

/// Bytes (a KV value, a memo entry) as text.
fn as_text<B: AsRef<[u8]>>(bytes: Option<B>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(b.as_ref()).into_owned())
}

/// The caller KV value under `key`, as text.
async fn kv_text(queue: &Queue, key: &str) -> Option<String> {
    as_text(queue.view().kv_get(key.as_bytes()).await.expect("kv get"))
}

/// Move `clock` forward to `ms`.
fn advance_to(clock: &MockClock, ms: u64) {
    let now = clock.now_ms();
    assert!(ms >= now, "the clock is at {now}, past {ms}");
    clock.advance(Duration::from_millis(ms - now));
}

/// Options with a priority.
fn priority(p: u32) -> RunOptions {
    RunOptions {
        priority: Some(p),
        ..Default::default()
    }
}

/// A signal payload as `signal_value` encodes it.
fn encoded(value: &str) -> Vec<u8> {
    rmp_serde::to_vec_named(value).expect("encodes")
}

// ---------------------------------------------------------------------------
// `Relay`: waits on a signal, or holds a worker slot at a gate.

/// What a `Relay` run does first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Plan {
    /// Wait up to `timeout_ms` on `key`, then end with what came.
    Wait { key: String, timeout_ms: u64 },
    /// Hold the step (and its worker slot) until gate `gate` opens.
    Hold { gate: usize },
}

/// Waits on a signal and ends `{key}={signal or <timeout>}` (staging the
/// same under `app/got/{run}`), or holds its step at a gate.
#[derive(Clone)]
pub struct Relay {
    gates: Arc<Vec<Gate>>,
}

impl Relay {
    fn new(gates: usize) -> Self {
        Self {
            gates: Arc::new((0..gates).map(|_| Gate::default()).collect()),
        }
    }
}

#[workflow(name = "relay", output = String)]
impl Relay {
    #[step(start)]
    async fn route(&self, plan: Plan) -> Result<Transition<RelayStep>, StepError> {
        match plan {
            Plan::Wait { key, timeout_ms } => Ok(Transition::on_signal(
                RelayStep::Got { key: key.clone() },
                key,
                Duration::from_millis(timeout_ms),
            )),
            Plan::Hold { gate } => {
                self.gates[gate].wait().await;
                Ok(Transition::done(format!("held {gate}")))
            }
        }
    }

    #[step]
    async fn got(ctx: StepContext<'_>, key: String) -> Result<Transition<RelayStep>, StepError> {
        let seen = ctx
            .signal_value::<String>()?
            .unwrap_or_else(|| "<timeout>".to_string());
        ctx.effects
            .put(format!("app/got/{}", ctx.run_id), seen.clone())?;
        Ok(Transition::done(format!("{key}={seen}")))
    }
}

/// Start `Relay` run `id` with `plan` and `options`.
async fn relay(rt: &Runtime<Relay>, id: &str, plan: Plan, options: RunOptions) {
    rt.start_as(rid(id), RelayInput { plan }, options)
        .await
        .expect("starts");
}

fn wait_on(key: &str, timeout: Duration) -> Plan {
    Plan::Wait {
        key: key.to_string(),
        timeout_ms: timeout.as_millis() as u64,
    }
}

/// Start `Relay` run `id` waiting up to `timeout` on `key` (with
/// `options`), and wait until it waits (pending at step 1).
async fn parked(rt: &Runtime<Relay>, id: &str, key: &str, timeout: Duration, options: RunOptions) {
    relay(rt, id, wait_on(key, timeout), options).await;
    until_at(rt, id, 1, RunState::Pending).await;
}

/// A `Relay` runtime (with `gates` gates) over a fresh in-memory queue,
/// running at most one step at a time; with its host and queue.
async fn one_slot_relay(gates: usize) -> (Host, Arc<Queue>, Relay, Runtime<Relay>) {
    let host = Host::in_memory();
    let queue = host.open().await;
    let relay = Relay::new(gates);
    let rt = host
        .builder(&queue, relay.clone())
        .max_concurrent_steps(1)
        .build();
    (host, queue, relay, rt)
}

// ---------------------------------------------------------------------------
// Typed fields and a memoized call across a takeover.

/// Every shape of field a user might carry between steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Kind {
    Plain,
    Tagged(u8),
    Weighted { weight: f64 },
}

/// A step field with maps, sets, enums, extremes and text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    tags: BTreeMap<String, Vec<u8>>,
    hashed: HashMap<u32, String>,
    set: HashSet<String>,
    kinds: Vec<Kind>,
    big: u64,
    small: i64,
    ratio: f64,
    letter: char,
    pair: (u32, u32),
    text: String,
    empty: Vec<String>,
    some: Option<u32>,
    none: Option<u32>,
}

fn sample_meta() -> Meta {
    Meta {
        tags: [("a".to_string(), vec![0, 255]), ("".to_string(), vec![])]
            .into_iter()
            .collect(),
        hashed: [(1, "one".to_string()), (u32::MAX, "max".to_string())]
            .into_iter()
            .collect(),
        set: ["x", "y", "z"].iter().map(|s| s.to_string()).collect(),
        kinds: vec![
            Kind::Plain,
            Kind::Tagged(7),
            Kind::Weighted { weight: -0.5 },
        ],
        big: u64::MAX,
        small: i64::MIN,
        ratio: std::f64::consts::PI,
        letter: '🦀',
        pair: (0, u32::MAX),
        text: "zürich\0tab\there \u{202e}rtl ✓".to_string(),
        empty: Vec::new(),
        some: Some(0),
        none: None,
    }
}

/// What `Carry` ends with: its fields as carried, and the memoized stamp.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Carried {
    label: String,
    ids: Vec<u64>,
    meta: Meta,
    path: PathBuf,
    note: Option<String>,
    stamp: String,
}

#[derive(Default)]
pub struct CarryState {
    /// Calls of the memoized "stamp" computation.
    stamps: AtomicUsize,
    /// The first attempt of `stamp` dies (hangs) after its memoized call.
    die_once: AtomicBool,
    died: tokio::sync::Notify,
}

/// Stamps once (memoized), then carries every field through a 10-minute
/// durable timer into `finish`.
#[derive(Clone, Default)]
pub struct Carry {
    state: Arc<CarryState>,
}

#[workflow(name = "carry", output = Carried, derive(Debug, Clone))]
impl Carry {
    #[step(start)]
    async fn stamp(
        &self,
        ctx: StepContext<'_>,
        label: &str,
        ids: &[u64],
        meta: Meta,
        path: &Path,
        note: Option<String>,
    ) -> Result<Transition<CarryStep>, StepError> {
        let state = self.state.clone();
        let stamp: String = ctx
            .memo
            .memoized("stamp", async move {
                let n = state.stamps.fetch_add(1, Ordering::SeqCst);
                Ok::<_, StepError>(format!("stamp-{label}-{n}"))
            })
            .await?;
        if self.state.die_once.swap(false, Ordering::SeqCst) {
            self.state.died.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(Transition::after(
            CarryStep::Finish {
                label: label.to_string(),
                ids: ids.to_vec(),
                meta,
                path: path.to_path_buf(),
                note,
                stamp,
            },
            10 * MINUTE,
        ))
    }

    #[step]
    async fn finish(
        label: String,
        ids: Vec<u64>,
        meta: Meta,
        path: PathBuf,
        note: Option<String>,
        stamp: String,
    ) -> Result<Transition<CarryStep>, StepError> {
        Ok(Transition::done(Carried {
            label,
            ids,
            meta,
            path,
            note,
            stamp,
        }))
    }
}

/// A process dies inside the start step after its memoized call; another
/// process opens the same store (fencing the first) and finishes the run:
/// every typed field arrives as sent, the memoized call ran once, the
/// 10-minute timer fires at its time and not before, the hook is told once,
/// and the fenced process's calls fail with the store-closed error instead
/// of hanging.
///
/// Promised by the README ("a crash, a deploy or a Ctrl-C resumes each run
/// at its last committed step"; "record expensive side effects with the
/// memo"; "`Transition::after` ... a durable timer ... survives restarts")
/// and `Error::is_store_closed` ("another process opened the same store
/// and fenced this one ... No retry can succeed").
#[tokio::test(start_paused = true)]
async fn typed_fields_and_a_memoized_call_survive_a_takeover_mid_step() {
    let host = Host::in_memory();
    let carry = Carry::default();
    carry.state.die_once.store(true, Ordering::SeqCst);

    let (_q1, rt1, w1) = host.process(carry.clone()).await;
    let input = CarryInput {
        label: "lbl/é".to_string(),
        ids: vec![0, 1, u64::MAX],
        meta: sample_meta(),
        path: PathBuf::from("/tmp/a b/ç.txt"),
        note: None,
    };
    let run = start(&rt1, "carry-1", input.clone()).await;
    assert!(run.newly_submitted());
    within(10, carry.state.died.notified()).await;

    // Another process takes the store over; the first one's worker dies.
    let q2 = host.open().await;
    kill(w1).await;
    let fenced = within(10, rt1.signal("after-takeover", b"x".to_vec())).await;
    match fenced {
        Err(e) => assert!(e.is_store_closed(), "fenced writer: {e}"),
        Ok(answer) => panic!("the fenced process committed a signal: {answer:?}"),
    }

    let rt2 = host.builder(&q2, carry.clone()).build();
    let _w2 = worker(&rt2);
    // The dead process's lease runs out; step 0 runs again and commits.
    host.clock.advance(Duration::from_secs(31));
    until_at(&rt2, "carry-1", 1, RunState::Pending).await;
    let at_commit = host.clock.now_ms();
    host.clock.advance(10 * MINUTE - Duration::from_secs(1));
    let early = format!("the timer does not fire a second early (committed at {at_commit})");
    not_yet(&rt2, "carry-1", 1, &early).await;
    host.clock.advance(Duration::from_secs(2));
    let typed = rt2.workflow_run::<Carry>(rid("carry-1"));
    let carried = succeeded(&typed).await;
    assert_eq!(
        carried,
        Carried {
            label: input.label.clone(),
            ids: input.ids.clone(),
            meta: input.meta.clone(),
            path: input.path.clone(),
            note: None,
            stamp: "stamp-lbl/é-0".to_string(),
        }
    );
    assert_eq!(
        carry.state.stamps.load(Ordering::SeqCst),
        1,
        "memoized once"
    );
    assert_eq!(
        typed.outcome().await.expect("read"),
        Some(Ok(carried)),
        "the durable record says the same"
    );
    told_once(&host.hook, "carry-1").await;
}

// ---------------------------------------------------------------------------
// Timers and signal waits across crashes.

/// Sleeps a day, then waits two hours for `approved:{order}`.
#[derive(Clone, Default)]
pub struct Courier;

#[workflow(name = "courier", output = String)]
impl Courier {
    #[step(start)]
    async fn book(order: String) -> Result<Transition<CourierStep>, StepError> {
        Ok(Transition::after(CourierStep::Ask { order }, DAY))
    }

    #[step]
    async fn ask(order: String) -> Result<Transition<CourierStep>, StepError> {
        let key = format!("approved:{order}");
        Ok(Transition::on_signal(
            CourierStep::Deliver { order },
            key,
            2 * HOUR,
        ))
    }

    #[step]
    async fn deliver(
        ctx: StepContext<'_>,
        order: String,
    ) -> Result<Transition<CourierStep>, StepError> {
        let answer = ctx.signal_value::<String>()?;
        Ok(Transition::done(format!(
            "{order}:{}",
            answer.as_deref().unwrap_or("no answer")
        )))
    }
}

/// A process over a directory store killed while its run sleeps on a
/// day-long timer, then again while the run waits on a signal: each
/// successor (opening the store, fencing the dead one) fires the timer
/// exactly at its time on the mock clock, and the signal wait's timeout
/// after its two hours, once, with the hook told once.
///
/// Promised by `Transition::after` ("a durable timer: no worker is held
/// while it runs, and it survives restarts") and the spec ("The waiting
/// step is a scheduled job in the store, so the wait survives restarts";
/// "`None` when the timeout fired").
#[tokio::test(start_paused = true)]
async fn a_timer_and_a_signal_timeout_fire_at_their_time_across_kills() {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = Host::over(common::dir_store(dir.path()));

    let (_q1, rt1, w1) = host.process(Courier).await;
    let order = CourierInput {
        order: "o-7".into(),
    };
    start(&rt1, "courier-1", order).await;
    until_at(&rt1, "courier-1", 1, RunState::Pending).await;
    host.clock.advance(HOUR);
    kill(w1).await;

    // Second process: the timer is due at T0 + 1 day.
    let (_q2, rt2, w2) = host.process(Courier).await;
    host.clock.advance(DAY - HOUR - Duration::from_millis(1));
    not_yet(&rt2, "courier-1", 1, "the timer is due in 1 ms").await;
    host.clock.advance(Duration::from_millis(1));
    until_at(&rt2, "courier-1", 2, RunState::Pending).await;
    let history = history_of(&rt2, "courier-1").await;
    let ask = history.steps.iter().find(|s| s.step == 1).expect("step 1");
    assert_eq!(
        ask.attempts[0].claimed_at_ms,
        Some(T0 + DAY.as_millis() as u64),
        "the timer fired at its millisecond"
    );
    kill(w2).await;

    // Third process: the signal wait times out two hours after it began.
    let (_q3, rt3, _w3) = host.process(Courier).await;
    host.clock.advance(2 * HOUR - Duration::from_millis(1));
    not_yet(&rt3, "courier-1", 2, "the wait times out in 1 ms").await;
    host.clock.advance(Duration::from_millis(1));
    let end = end_of(&rt3, "courier-1").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(decoded::<String>(end), "o-7:no answer");
    told_once(&host.hook, "courier-1").await;
}

// ---------------------------------------------------------------------------
// Step-output replay of a timer and KV effects.

#[derive(Default)]
pub struct RemindState {
    calls: AtomicUsize,
    /// Turned on by the first attempt of `schedule` as it returns: the
    /// queue's writes fail from then on (the settlement cannot commit).
    store: Mutex<Option<FaultyStore>>,
    /// What the first attempt waits for before it breaks the store.
    go: Gate,
    clock: Mutex<Option<MockClock>>,
}

/// Schedules a reminder ten minutes out, staging a KV row; `fire` ends
/// with the note and the clock's time.
#[derive(Clone, Default)]
pub struct Remind {
    state: Arc<RemindState>,
}

#[workflow(name = "remind", output = (String, u64))]
impl Remind {
    #[step(start)]
    async fn schedule(
        &self,
        ctx: StepContext<'_>,
        note: String,
    ) -> Result<Transition<RemindStep>, StepError> {
        self.state.calls.fetch_add(1, Ordering::SeqCst);
        ctx.effects
            .put(format!("app/remind/{}", ctx.run_id), note.clone())?;
        let faulty = self.state.store.lock().expect("lock").take();
        if let Some(store) = faulty {
            self.state.go.wait().await;
            store.set_config(FaultConfig {
                rates: [1.0, 0.0, 0.0, 0.0],
                only_under: vec!["db/".to_string()],
                ..FaultConfig::default()
            });
            store.set_enabled(true);
        }
        Ok(Transition::after(RemindStep::Fire { note }, 10 * MINUTE))
    }

    #[step]
    async fn fire(&self, note: String) -> Result<Transition<RemindStep>, StepError> {
        let now = self
            .state
            .clock
            .lock()
            .expect("lock")
            .as_ref()
            .map(MockClock::now_ms)
            .unwrap_or_default();
        Ok(Transition::done((note, now)))
    }
}

/// With `step_output_replay`, a step returns a 10-minute timer and stages
/// a KV row, its replay record is written, and the process dies before the
/// settlement commits (the queue's writes fail). Four minutes later a new
/// process redelivers the step: the recorded outcome is replayed without
/// calling the runner, the staged row is applied, and the timer keeps its
/// original schedule (T0 + 10 min, not redelivery + 10 min).
///
/// Promised by the spec ("Step-output replay": "If the same step is
/// delivered again after a crash before its acknowledgement, the stored
/// outcome is replayed without invoking the runner. The record includes
/// the effects staged ... A replayed `StepOutcome::Continue` with a
/// `Trigger::After` delay reduces the delay by the time already elapsed
/// since the outcome was stored, preserving the original schedule").
#[tokio::test(start_paused = true)]
async fn a_replayed_timer_keeps_its_schedule_and_its_staged_effects() {
    let clock = MockClock::new(T0);
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner.clone(), FaultConfig::default());
    let faulty_dyn: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let remind = Remind::default();
    *remind.state.store.lock().expect("lock") = Some(faulty.clone());
    *remind.state.clock.lock().expect("lock") = Some(clock.clone());
    let hook = Recorder::default();

    let q1 = open_queue(&faulty_dyn, &clock).await;
    let rt1 = builder(&q1, &faulty_dyn, remind.clone(), &hook)
        .step_output_replay()
        .build();
    let w1 = worker(&rt1);
    let reminder = RemindInput {
        note: "call ada".into(),
    };
    start(&rt1, "remind-1", reminder).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    remind.state.go.open();
    let replay_dir = ObjectPath::from(format!("{MEMO}/runs/remind-1/replay/0"));
    eventually("the replay record is written", || async {
        inner
            .list(Some(&replay_dir))
            .next()
            .await
            .is_some_and(|meta| meta.is_ok())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    kill(w1).await;

    // Four minutes on, a new process (on the store itself, faults gone)
    // takes over and redelivers the step once its lease ran out.
    clock.advance(4 * MINUTE);
    let q2 = open_queue(&inner, &clock).await;
    let rt2 = builder(&q2, &inner, remind.clone(), &hook)
        .step_output_replay()
        .build();
    let _w2 = worker(&rt2);
    until_at(&rt2, "remind-1", 1, RunState::Pending).await;
    assert_eq!(
        remind.state.calls.load(Ordering::SeqCst),
        1,
        "replayed, not run again"
    );
    assert_eq!(
        kv_text(&q2, "app/remind/remind-1").await.as_deref(),
        Some("call ada"),
        "the staged row is applied by the replay"
    );
    // Due at T0 + 10 min: a millisecond before, it has not run.
    advance_to(&clock, T0 + (10 * MINUTE).as_millis() as u64 - 1);
    not_yet(&rt2, "remind-1", 1, "not before its time").await;
    clock.advance(Duration::from_millis(1));
    let end = within(5, rt2.wait(&rid("remind-1")))
        .await
        .expect("the timer keeps its original schedule (T0 + 10 min), not 10 min after the replay");
    let (note, fired_at) = decoded::<(String, u64)>(end);
    assert_eq!(note, "call ada");
    assert_eq!(fired_at, T0 + (10 * MINUTE).as_millis() as u64);
    told_once(&hook, "remind-1").await;
}

// ---------------------------------------------------------------------------
// One waiter per key, against cancelled and timed-out waits.

/// Hold the only worker slot with `Hold` run `id` at gate `gate` (of
/// priority `p`), and wait until its step runs.
async fn hold_slot(rt: &Runtime<Relay>, id: &str, gate: usize, p: u32) {
    relay(rt, id, Plan::Hold { gate }, priority(p)).await;
    until_at(rt, id, 0, RunState::Running).await;
}

/// Run `x` waits up to `timeout` on key `k`, then run `busy` holds the
/// only worker slot at gate 0 (both of low priority).
async fn x_waits_on_k_behind(rt: &Runtime<Relay>, busy: &str, timeout: Duration) {
    parked(rt, "x", "k", timeout, priority(PRIORITY_LOW)).await;
    hold_slot(rt, busy, 0, PRIORITY_LOW).await;
}

/// Run X waits on key `k`; a signal wakes it, but its woken step waits for
/// the only worker slot (low priority, behind a busy step). Meanwhile run Y
/// starts waiting on `k` (its wait is registered: X's was consumed). X is
/// then cancelled while its woken step is still queued. Y is the run
/// waiting on `k`, so the next signal on `k` must wake Y (`Delivered`), and
/// Y must end with it, not time out.
///
/// Promised by `WorkflowRuntime::signal` ("A run waiting on the key ... is
/// woken ... With no waiter the signal is held durably") and `cancel`
/// (only the cancelled run's own "signal waiter the job registered" is
/// cleaned up: "the cleanup of a signal waiter the job registered").
/// Found by this review: the cancel deleted Y's waiter record.
#[tokio::test(start_paused = true)]
async fn cancelling_a_woken_run_does_not_erase_the_next_runs_wait_on_its_key() {
    let (host, _queue, relay_wf, rt) = one_slot_relay(2).await;
    let _w = worker(&rt);
    x_waits_on_k_behind(&rt, "busy-1", HOUR).await;
    assert_eq!(
        rt.signal_value("k", "for x").await.expect("signal"),
        SignalOutcome::Delivered
    );
    // Y (high priority) runs its first step before X's woken step; a second
    // busy run (high priority too) then holds the slot.
    relay(&rt, "y", wait_on("k", HOUR), priority(PRIORITY_HIGH)).await;
    relay(
        &rt,
        "busy-2",
        Plan::Hold { gate: 1 },
        priority(PRIORITY_HIGH),
    )
    .await;
    relay_wf.gates[0].open();
    until_at(&rt, "busy-2", 0, RunState::Running).await;
    assert_eq!(state_of(&rt, "y").await, (RunState::Pending, 1), "y waits");
    assert_eq!(
        state_of(&rt, "x").await,
        (RunState::Pending, 1),
        "x's woken step is still queued"
    );

    let waits_on = || async {
        rt.view()
            .run(&rid("y"))
            .await
            .expect("details")
            .and_then(|d| d.waiting_for_signal)
            .map(|w| w.correlation_key)
    };
    assert_eq!(waits_on().await.as_deref(), Some("k"), "y's wait on `k`");

    assert!(
        rt.cancel(&rid("x")).await.expect("cancel"),
        "x is cancelled"
    );
    assert_eq!(
        end_of(&rt, "x").await.termination.status,
        TerminalStatus::Cancelled
    );
    assert_eq!(
        waits_on().await.as_deref(),
        Some("k"),
        "y still shows its wait"
    );
    let answer = rt.signal_value("k", "for y").await.expect("signal");
    relay_wf.gates[1].open();
    assert_eq!(
        answer,
        SignalOutcome::Delivered,
        "y is the run waiting on `k`"
    );
    assert_eq!(decoded::<String>(end_of(&rt, "y").await), "k=for y");
    told_once(&host.hook, "y").await;
}

/// Run X's wait on key `k` times out, but its next step waits for the only
/// worker slot. Meanwhile run Y starts waiting on `k`. X's wait is over (a
/// signal sent now is buffered, not delivered to X), so Y's wait is the
/// only one on `k`: Y must wait, and the next signal wake it.
///
/// Promised by `signal_run` ("The run is waiting when its step that
/// continued on the key has settled and its timeout has not fired") and
/// `signal` ("A buffered signal outlives the wait it was meant for: one
/// sent after that wait timed out ... wakes the next wait on key, whoever's
/// it is"): a timed-out wait no longer holds its key, so a second run's
/// wait on it is not "a second waiter on a correlation key".
/// Found by this review: Y failed, its key taken by X's stale record.
#[tokio::test(start_paused = true)]
async fn a_timed_out_wait_does_not_fail_the_next_run_waiting_on_its_key() {
    let (host, _queue, relay_wf, rt) = one_slot_relay(1).await;
    let _w = worker(&rt);
    x_waits_on_k_behind(&rt, "busy", MINUTE).await;
    host.clock.advance(MINUTE + Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // X timed out: its wait no longer takes signals.
    assert_eq!(
        rt.signal_run(&rid("x"), "k", encoded("late"))
            .await
            .map_err(|e| matches!(e, Error::NotWaitingForSignal { .. })),
        Err(true),
        "x's wait timed out"
    );

    relay(&rt, "y", wait_on("k", HOUR), priority(PRIORITY_HIGH)).await;
    relay_wf.gates[0].open();
    let x = end_of(&rt, "x").await;
    assert_eq!(x.termination.status, TerminalStatus::Succeeded);
    let y = rt.status(&rid("y")).await.expect("status").expect("known");
    assert_eq!(
        (y.state.clone(), y.current_step),
        (RunState::Pending, 1),
        "y waits on `k`: {y:?}"
    );
    assert_eq!(
        rt.signal_value("k", "for y").await.expect("signal"),
        SignalOutcome::Delivered
    );
    let end = end_of(&rt, "y").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    told_once(&host.hook, "y").await;
}

// ---------------------------------------------------------------------------
// Signals: before the run exists, twice, after its end, through the inbox.

/// Two signals sent on `k` before any run exists are buffered, the second
/// replacing the first; the run that then waits on `k` consumes the second
/// at once. A signal after the run ended is buffered again (and can be
/// cleared); `signal_run` to the ended run or to an unknown one is refused
/// and buffers nothing.
///
/// Promised by `signal` ("With no waiter the signal is held durably and
/// consumed by the next waiter ...; a later signal replaces a buffered
/// one") and `signal_run` ("`Error::NotWaitingForSignal` when the run is
/// not waiting on the key; `Error::RunNotFound` for a run never
/// submitted ... nothing is delivered or buffered").
#[tokio::test(start_paused = true)]
async fn signals_before_the_run_twice_and_after_its_end_are_buffered_as_documented() {
    let (host, queue, _relay, rt) = one_slot_relay(0).await;
    let _w = worker(&rt);
    for value in ["first", "second"] {
        assert_eq!(
            rt.signal_value("early", value).await.expect("signal"),
            SignalOutcome::Buffered
        );
    }
    relay(
        &rt,
        "early-run",
        wait_on("early", HOUR),
        RunOptions::default(),
    )
    .await;
    assert_eq!(
        decoded::<String>(end_of(&rt, "early-run").await),
        "early=second",
        "the later signal replaced the earlier one"
    );
    assert_eq!(
        kv_text(&queue, "app/got/early-run").await.as_deref(),
        Some("second")
    );
    assert!(
        !rt.clear_signal("early").await.expect("clear"),
        "the buffered signal was consumed"
    );

    // After the end.
    assert!(matches!(
        rt.signal_run(&rid("early-run"), "early", encoded("late"))
            .await,
        Err(Error::NotWaitingForSignal { .. })
    ));
    assert!(matches!(
        rt.signal_run(&rid("never-submitted"), "early", encoded("late")).await,
        Err(Error::RunNotFound(id)) if id == "never-submitted"
    ));
    assert!(
        !rt.clear_signal("early").await.expect("clear"),
        "signal_run buffered nothing"
    );
    assert_eq!(
        rt.signal_value("early", "after the end")
            .await
            .expect("signal"),
        SignalOutcome::Buffered
    );
    assert!(rt.clear_signal("early").await.expect("clear"));
    told_once(&host.hook, "early-run").await;
}

/// A signal sent through the inbox (the command's id its idempotency key)
/// wakes the waiting run once. The command object found again in the
/// inbox after it was applied (the owner crashed between recording the
/// answer and deleting the object, or the sender's retried write landed
/// late) is not applied a second time: no second signal is buffered for
/// the next wait on the key.
///
/// Promised by `taquba_workflow::inbox` ("applies it once and records the
/// answer ... in the same transaction as the command's first effect, then
/// deletes the object: a crash at any point leaves either the command
/// unapplied with its object in place, or applied with its record, and a
/// command with a record is never applied again").
#[tokio::test(start_paused = true)]
async fn an_inbox_signal_found_again_after_it_was_applied_is_not_applied_twice() {
    let host = Host::in_memory();
    let (_queue, rt, w) = host.process(Relay::new(0)).await;
    parked(&rt, "inboxed", "ibx", HOUR, RunOptions::default()).await;
    kill(w).await;

    let inbox = Inbox::new(host.store.clone(), MEMO);
    let id = inbox
        .send(Command::signal("ibx", encoded("once")))
        .await
        .expect("sent");
    let path = inbox.command_path(&id);
    let bytes = host
        .store
        .get(&path)
        .await
        .expect("the command object")
        .bytes()
        .await
        .expect("read");
    assert_eq!(rt.apply_inbox().await.expect("applied"), 1);
    let end_task = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.wait(&rid("inboxed")).await })
    };

    // The object is back in the inbox.
    host.store
        .put(&path, PutPayload::from(bytes))
        .await
        .expect("put back");
    rt.apply_inbox().await.expect("applied again");
    assert!(
        !rt.clear_signal("ibx").await.expect("clear"),
        "the replayed command buffered a second signal"
    );
    let _w = worker(&rt);
    let end = within(30, end_task)
        .await
        .expect("joined")
        .expect("the run ends");
    assert_eq!(decoded::<String>(end), "ibx=once");
    // The next wait on the key gets no phantom signal: it times out.
    parked(&rt, "next-waiter", "ibx", MINUTE, RunOptions::default()).await;
    host.clock.advance(MINUTE);
    assert_eq!(
        decoded::<String>(end_of(&rt, "next-waiter").await),
        "ibx=<timeout>"
    );
}

// ---------------------------------------------------------------------------
// Cancellations racing signals and endings.

/// `cancel` and `other` run together, the second of them (`other` when `n`
/// is even, else `cancel`) after a sleep of `n / 2` ms.
async fn race<C: Future, O: Future>(n: u64, cancel: C, other: O) -> (C::Output, O::Output) {
    let (cancel_first, gap) = (n.is_multiple_of(2), Duration::from_millis(n / 2));
    tokio::join!(
        async {
            if !cancel_first {
                tokio::time::sleep(gap).await;
            }
            cancel.await
        },
        async {
            if cancel_first {
                tokio::time::sleep(gap).await;
            }
            other.await
        },
    )
}

/// A run waiting on a signal, cancelled while the signal is sent, at many
/// offsets between the two calls: the run ends once (the hook told once);
/// `cancel` answers `true` exactly when it ends `Cancelled`; a signal
/// answered `Delivered` to a run that then ends `Cancelled` leaves no
/// buffered copy, one answered `Buffered` stays buffered; the woken
/// step's staged KV row exists only when the run succeeded with the
/// signal.
///
/// Promised by `cancel` ("`Ok(true)` means this call's request ends the
/// run `Cancelled` ... There is one termination and one terminal
/// notification however many calls race"; a running step's "outcome is
/// discarded") and the spec ("No effects are applied ... when an external
/// `WorkflowRuntime::cancel` overrides the outcome").
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_signal_ends_the_run_once_as_it_answers() {
    let host = Host::in_memory();
    let (queue, rt, _w) = host.process(Relay::new(0)).await;
    let mut cancelled = 0;
    for n in 0..12u64 {
        let id = format!("race-{n}");
        let key = format!("race-key-{n}");
        parked(&rt, &id, &key, HOUR, RunOptions::default()).await;
        let (was_cancelled, signalled) = race(
            n,
            async { rt.cancel(&rid(&id)).await.expect("cancel") },
            async { rt.signal_value(&key, "go").await.expect("signal") },
        )
        .await;
        let end = end_of(&rt, &id).await;
        let status = end.termination.status;
        assert_eq!(
            was_cancelled,
            status == TerminalStatus::Cancelled,
            "{id}: cancel answered {was_cancelled}, the run ended {status}"
        );
        let row = kv_text(&queue, &format!("app/got/{id}")).await;
        match status {
            TerminalStatus::Cancelled => {
                cancelled += 1;
                assert_eq!(row, None, "{id}: a cancelled step's row is not applied");
                assert_eq!(
                    rt.clear_signal(&key).await.expect("clear"),
                    signalled == SignalOutcome::Buffered,
                    "{id}: signal answered {signalled:?}"
                );
            }
            TerminalStatus::Succeeded => {
                assert_eq!(signalled, SignalOutcome::Delivered, "{id}");
                assert_eq!(row.as_deref(), Some("go"), "{id}");
                assert!(!rt.clear_signal(&key).await.expect("clear"), "{id}");
            }
            TerminalStatus::Failed => panic!("{id} failed: {:?}", end.termination),
        }
        told_once(&host.hook, &id).await;
    }
    assert!(cancelled > 0, "some cancel won the race");
}

/// How a `Finale` step ends once its gate opens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Ending {
    Done,
    Fail,
    Cancel,
    Permanent,
}

/// One step: stages `app/finale/{run}`, waits for the run's gate (ignoring
/// its cancel token), then ends as told.
#[derive(Clone, Default)]
pub struct Finale {
    gates: Arc<Mutex<HashMap<String, Gate>>>,
}

impl Finale {
    fn gate(&self, run: &str) -> Gate {
        self.gates
            .lock()
            .expect("lock")
            .entry(run.to_string())
            .or_default()
            .clone()
    }
}

#[workflow(name = "finale", output = String)]
impl Finale {
    #[step(start)]
    async fn decide(
        &self,
        ctx: StepContext<'_>,
        ending: Ending,
    ) -> Result<Transition<FinaleStep>, StepError> {
        ctx.effects
            .put(format!("app/finale/{}", ctx.run_id), "staged")?;
        self.gate(&ctx.run_id).wait().await;
        match ending {
            Ending::Done => Ok(Transition::done("done".to_string())),
            Ending::Fail => Ok(Transition::fail("verdict: fail")),
            Ending::Cancel => Ok(Transition::cancel("verdict: cancel")),
            Ending::Permanent => Err(StepError::permanent("broken")),
        }
    }
}

/// A running step released while a cancel arrives, for each way a step
/// can end (done, a `Fail` verdict, a `Cancel` verdict, a permanent
/// error) at many offsets: the run ends once; a cancel answering `true`
/// ends the run `Cancelled`; one answering `false` leaves the run to end
/// as the step said; the step's staged row is applied with its
/// verdicts and never with an external cancellation or a step error; the
/// typed `wait` agrees with the status.
///
/// Promised by `cancel` ("`Ok(true)` means this call's request ends the
/// run `Cancelled`"; "Returns `Ok(false)` ... when the run's terminating
/// settlement was already committing") and the spec ("Everything staged
/// is applied in the settlement transaction that commits the outcome the
/// runner returned ... No effects are applied when the runner returns a
/// `StepError` ... or when an external `WorkflowRuntime::cancel`
/// overrides the outcome. A runner-issued `StepOutcome::Cancel` keeps its
/// effects").
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_each_ending_ends_the_run_once_as_answered() {
    let host = Host::in_memory();
    let finale = Finale::default();
    let (queue, rt, _w) = host.process(finale.clone()).await;
    let mut wins = HashMap::new();
    for ending in [
        Ending::Done,
        Ending::Fail,
        Ending::Cancel,
        Ending::Permanent,
    ] {
        for n in 0..8u64 {
            let id = format!("{ending:?}-{n}").to_lowercase();
            let gate = finale.gate(&id);
            let run = start(&rt, &id, FinaleInput { ending }).await;
            until_at(&rt, &id, 0, RunState::Running).await;
            let (was_cancelled, ()) = race(
                n,
                async { rt.cancel(&rid(&id)).await.expect("cancel") },
                async { gate.open() },
            )
            .await;
            let typed = within(30, run.wait()).await.expect("read");
            let end = end_of(&rt, &id).await;
            let status = end.termination.status;
            if was_cancelled {
                assert_eq!(
                    status,
                    TerminalStatus::Cancelled,
                    "{id}: cancel answered true, the run ended {:?}",
                    end.termination
                );
            }
            let external = status == TerminalStatus::Cancelled
                && end.termination.error.as_deref() != Some("verdict: cancel");
            if !was_cancelled {
                let expected = match ending {
                    Ending::Done => TerminalStatus::Succeeded,
                    Ending::Fail | Ending::Permanent => TerminalStatus::Failed,
                    Ending::Cancel => TerminalStatus::Cancelled,
                };
                assert_eq!(status, expected, "{id}");
            } else {
                *wins.entry(format!("{ending:?}")).or_insert(0) += 1;
            }
            let row = kv_text(&queue, &format!("app/finale/{id}")).await;
            let applied = !external && ending != Ending::Permanent;
            assert_eq!(
                row.is_some(),
                applied,
                "{id}: staged row {row:?} with {:?}",
                end.termination
            );
            match (&typed, status) {
                (Ok(out), TerminalStatus::Succeeded) => assert_eq!(out, "done"),
                (Err(WorkflowError { status: s, .. }), st) if *s == st => {}
                other => panic!("{id}: typed wait {other:?} disagrees with {status}"),
            }
            told_once(&host.hook, &id).await;
        }
    }
    assert!(!wins.is_empty(), "some cancel won: {wins:?}");
}

// ---------------------------------------------------------------------------
// Calls dropped at each await, and a store outage held for a whole call.

/// `start_as`, `signal` and `cancel` of `#[workflow]` runs, each dropped
/// after 1, 2, 3, ... polls (as a request handler's future is when its
/// client disconnects) until the call completes on its own: a dropped
/// start either did nothing or runs its run (starting again answers for
/// it, the start step runs once); a dropped signal is delivered or not at
/// all (`signal_run` afterwards tells which, and the run ends with exactly
/// one of the two payloads); a dropped cancel is applied or not (a second
/// cancel tells which); every run ends once.
///
/// Promised by the README ("Cancel safety": "a dropped `submit`/`start*`
/// ... `cancel` ... `signal` ... either did nothing or completes as if
/// awaited ... Submit the same run id (or job key) again to find out
/// which").
#[tokio::test(start_paused = true)]
async fn start_signal_and_cancel_dropped_at_each_await_do_all_or_nothing() {
    let host = Host::in_memory();
    let (_queue, rt, _w) = host.process(Relay::new(0)).await;

    let mut n = 0;
    loop {
        n += 1;
        assert!(n < 200, "the calls never completed on their own");
        let (start_id, key) = (format!("drop-start-{n}"), format!("drop-key-{n}"));
        let start = || {
            let plan = wait_on(&key, HOUR);
            rt.start_as(rid(&start_id), RelayInput { plan }, RunOptions::default())
        };
        let started = poll_then_drop(start(), n).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let again = start().await.expect("starts again");
        assert!(rt.status(&rid(&start_id)).await.expect("status").is_some());
        if let Some(answer) = &started {
            assert!(answer.as_ref().expect("started").newly_submitted());
            assert!(
                !again.newly_submitted(),
                "{start_id}: answered for the first"
            );
        }
        until_at(&rt, &start_id, 1, RunState::Pending).await;

        // The signal, dropped after n polls.
        let signalled = poll_then_drop(rt.signal_value(&key, "dropped"), n).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = rt.signal_run_value(&rid(&start_id), &key, "second").await;
        let expected = match &second {
            Ok(()) => "second",
            Err(Error::NotWaitingForSignal { .. }) => "dropped",
            Err(e) => panic!("{start_id}: {e}"),
        };
        if let Some(answer) = &signalled {
            assert_eq!(answer.as_ref().expect("signal"), &SignalOutcome::Delivered);
            assert_eq!(expected, "dropped");
        }
        assert_eq!(
            decoded::<String>(end_of(&rt, &start_id).await),
            format!("{key}={expected}")
        );
        assert!(!rt.clear_signal(&key).await.expect("clear"), "nothing left");
        told_once(&host.hook, &start_id).await;

        // The cancel, dropped after n polls.
        let cancel_id = format!("drop-cancel-{n}");
        let cancel_key = format!("{key}-c");
        parked(&rt, &cancel_id, &cancel_key, HOUR, RunOptions::default()).await;
        let cancelled = poll_then_drop(rt.cancel(&rid(&cancel_id)), n).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = rt.cancel(&rid(&cancel_id)).await.expect("cancel");
        if let Some(answer) = &cancelled {
            assert!(*answer.as_ref().expect("cancel"));
            assert!(!second, "{cancel_id}: cancelled once");
        }
        assert_eq!(
            end_of(&rt, &cancel_id).await.termination.status,
            TerminalStatus::Cancelled
        );
        told_once(&host.hook, &cancel_id).await;

        if started.is_some() && signalled.is_some() && cancelled.is_some() {
            break;
        }
    }
}

/// Every write to the queue's part of the store fails for the whole of a
/// `cancel` of a parked run and of a `start_as` (each bounded by a 2 s
/// timeout, as a caller would): neither call reports success it did not
/// have, neither panics, and once the store is back the cancellation and
/// the submission each take effect at most once: the parked run ends
/// `Cancelled` (a later cancel answers `false`), the submitted run runs
/// its start step once, and each run is told to the hook once.
///
/// Promised by the README ("During a write outage of the whole store,
/// commits wait (bound a call with `tokio::time::timeout`; a dropped call
/// leaves nothing half done)"; "a dropped `submit`/`start*` ... `cancel`
/// ... either did nothing or completes as if awaited").
#[tokio::test(start_paused = true)]
async fn a_write_outage_held_for_a_whole_call_leaves_nothing_half_done() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    let host = Host::over(Arc::new(faulty.clone()));
    let (_queue, rt, _w) = host.process(Relay::new(0)).await;
    parked(&rt, "parked", "never", DAY, RunOptions::default()).await;
    let start_run = || {
        let plan = wait_on("outage-key", MINUTE);
        rt.start_as(
            rid("during-outage"),
            RelayInput { plan },
            RunOptions::default(),
        )
    };

    let outage = FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        only_under: vec!["db/".to_string()],
        ..FaultConfig::default()
    };
    let (cancel, start) = faulty
        .during(outage, async {
            let cancel =
                tokio::time::timeout(Duration::from_secs(2), rt.cancel(&rid("parked"))).await;
            let start = tokio::time::timeout(Duration::from_secs(2), start_run()).await;
            (cancel, start)
        })
        .await;
    assert!(
        faulty.injected(taquba_workflow_suite::testing::Op::Put) > 0,
        "the outage was felt"
    );
    // Neither call may claim a success it did not have.
    if let Ok(Ok(answer)) = &cancel {
        assert!(*answer, "a cancel that completed during the outage applied");
    }
    let start_completed = matches!(&start, Ok(Ok(_)));

    // The store is back.
    let end = end_of(&rt, "parked").await;
    assert_eq!(
        end.termination.status,
        TerminalStatus::Cancelled,
        "{cancel:?}"
    );
    assert!(!rt.cancel(&rid("parked")).await.expect("cancel"));
    told_once(&host.hook, "parked").await;
    let again = start_run().await.expect("starts once the store is back");
    if start_completed {
        assert!(!again.newly_submitted());
    }
    until_at(&rt, "during-outage", 1, RunState::Pending).await;
    rt.signal_value("outage-key", "back").await.expect("signal");
    let end = end_of(&rt, "during-outage").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    told_once(&host.hook, "during-outage").await;
}

// ---------------------------------------------------------------------------
// Bad input.

/// An output whose `Serialize` always fails.
#[derive(Debug)]
pub struct Unencodable;

impl Serialize for Unencodable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("refused by its Serialize impl"))
    }
}

impl<'de> Deserialize<'de> for Unencodable {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Unencodable)
    }
}

/// Ends with an output that cannot be encoded, or asks for a patch.
#[derive(Clone, Default)]
pub struct Strict {
    calls: Arc<AtomicUsize>,
}

#[workflow(name = "strict", output = Unencodable, patches = ["p1"])]
impl Strict {
    #[step(start)]
    async fn check(
        &self,
        ctx: StepContext<'_>,
        patch: Option<String>,
        count: u32,
    ) -> Result<Transition<StrictStep>, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(patch) = patch {
            ctx.patched(&patch)?;
        }
        let _ = count;
        Ok(Transition::done(Unencodable))
    }
}

/// A raw `strict` payload whose `count` field is a string.
#[derive(Serialize)]
struct RawStrict<'a> {
    workflow: &'a str,
    step: BTreeMap<&'a str, BTreeMap<&'a str, &'a str>>,
}

/// The end of run `id`, failed with a permanent error: its error.
async fn permanent_error<W: StepRunner>(rt: &Runtime<W>, id: &str) -> String {
    let end = end_of(rt, id).await;
    assert_eq!(end.termination.status, TerminalStatus::Failed, "{id}");
    assert_eq!(
        end.termination.error_kind,
        Some(taquba_workflow::StepErrorKind::Permanent),
        "{id}"
    );
    end.termination.error.expect("an error")
}

/// The failed end of run `id`: its permanent error, checked to start with
/// the run (an error of the runtime's own).
async fn failure<W: StepRunner>(rt: &Runtime<W>, id: &str) -> String {
    let error = permanent_error(rt, id).await;
    assert!(
        error.starts_with(&format!("run `{id}`: ")),
        "{id}: the runtime's error starts with the run: {error}"
    );
    error
}

/// `error` names every one of `parts`.
fn assert_names(error: &str, parts: &[&str]) {
    assert!(parts.iter().all(|part| error.contains(part)), "{error}");
}

/// Bad values each end their run once, permanently, with an error that
/// starts with the run and names the value: stored fields that do not
/// decode (naming the field), an output that cannot be encoded (the step
/// is not retried), a patch the code does not declare, a correlation key
/// over 4096 bytes (also refused by `signal`, with its length), a signal
/// that does not decode as the step's type (naming the step and the
/// type); a second `start_as` of an active run with another input is
/// refused naming the run.
///
/// Promised by the README ("When the runtime itself ends a run with a
/// permanent error (a typed job or a `#[workflow]` step whose stored
/// fields no longer decode ..., an output that does not encode, ...),
/// the error starts with the run, ``run `{run_id}`: ``"; "a field that no
/// longer decodes ... fails the run once, naming the field"; "Asking for
/// a patch the running code does not declare is a permanent step error
/// naming it"; "A key is at most `MAX_CORRELATION_KEY_LEN` (4096) bytes: a
/// longer one is refused with `Error::InvalidCorrelationKey`, and a step
/// continuing on one fails its run with that error"),
/// `StepContext::signal_value` ("A permanent `StepError` when the signal
/// does not decode as `T`") and `start_as` ("`Error::InputMismatch` when
/// the run is active with another input").
#[tokio::test(start_paused = true)]
async fn bad_values_end_their_run_once_with_an_error_naming_them() {
    let host = Host::in_memory();
    let strict = Strict::default();
    let (queue, rt, _w) = host.process(strict.clone()).await;

    // Stored fields that do not decode.
    let raw = rmp_serde::to_vec_named(&RawStrict {
        workflow: "strict",
        step: [("check", [("count", "seven")].into_iter().collect())]
            .into_iter()
            .collect(),
    })
    .expect("encodes");
    rt.submit(RunSpec {
        run_id: Some(rid("bad-fields")),
        input: raw,
        ..Default::default()
    })
    .await
    .expect("submits");
    let error = failure(&rt, "bad-fields").await;
    assert_names(&error, &["step `check`", "field `count`"]);

    // An output that cannot be encoded: not retried.
    let checked = |patch: Option<&str>| StrictInput {
        patch: patch.map(str::to_string),
        count: 1,
    };
    start(&rt, "bad-output", checked(None)).await;
    let error = failure(&rt, "bad-output").await;
    assert_names(
        &error,
        &["cannot encode the output", "refused by its Serialize"],
    );
    // A patch the code does not declare.
    start(&rt, "bad-patch", checked(Some("p2-typo"))).await;
    let error = permanent_error(&rt, "bad-patch").await;
    assert!(error.contains("p2-typo"), "{error}");
    assert_eq!(
        strict.calls.load(Ordering::SeqCst),
        2,
        "each permanent failure ran its step once"
    );

    // A correlation key over the limit, and a signal of the wrong type.
    let relay_rt = host
        .builder(&queue, Relay::new(0))
        .queue_name("relay-steps")
        .build();
    let _rw = worker(&relay_rt);
    let long_key = "κ".repeat(2049);
    match relay_rt.signal(&long_key, b"x".to_vec()).await {
        Err(Error::InvalidCorrelationKey { len, max, .. }) => {
            assert_eq!((len, max), (4098, 4096))
        }
        other => panic!("a long key is refused: {other:?}"),
    }
    relay(
        &relay_rt,
        "long-key",
        wait_on(&long_key, HOUR),
        RunOptions::default(),
    )
    .await;
    let error = failure(&relay_rt, "long-key").await;
    assert!(error.contains("4098 bytes"), "{error}");

    parked(
        &relay_rt,
        "typed-signal",
        "typed",
        HOUR,
        RunOptions::default(),
    )
    .await;
    let refused = relay_rt
        .start_as(
            rid("typed-signal"),
            RelayInput {
                plan: wait_on("other", HOUR),
            },
            RunOptions::default(),
        )
        .await
        .map(|run| run.newly_submitted());
    match refused {
        Err(e @ Error::InputMismatch(_)) => {
            assert!(e.to_string().contains("typed-signal"), "{e}")
        }
        other => panic!("another input is refused: {other:?}"),
    }
    relay_rt
        .signal_value("typed", &42u64)
        .await
        .expect("signal");
    let end = end_of(&relay_rt, "typed-signal").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.expect("an error");
    assert_names(&error, &["step `got` of workflow `relay`", "String"]);
    for id in ["bad-fields", "bad-output", "bad-patch"] {
        told_once(&host.hook, id).await;
    }
}

// ---------------------------------------------------------------------------
// Extreme durations and sizes.

/// Sleeps `Duration::MAX`, or waits `Duration::MAX` on a key.
#[derive(Clone, Default)]
pub struct Nap;

#[workflow(name = "nap", output = String)]
impl Nap {
    #[step(start)]
    async fn doze(key: Option<String>) -> Result<Transition<NapStep>, StepError> {
        Ok(match key {
            None => Transition::after(NapStep::Wake {}, Duration::MAX),
            Some(key) => Transition::on_signal(NapStep::Wake {}, key, Duration::MAX),
        })
    }

    #[step]
    async fn wake(ctx: StepContext<'_>) -> Result<Transition<NapStep>, StepError> {
        Ok(Transition::done(
            ctx.signal_value::<String>()?
                .unwrap_or_else(|| "no signal".into()),
        ))
    }
}

/// A step returning `Transition::after(_, Duration::MAX)` or
/// `Transition::on_signal(_, key, Duration::MAX)` (a user's "forever"):
/// the run parks without a panic; its status, details, history and the
/// run listing read; a zero `wait_timeout` looks without waiting; ten
/// years on it still sleeps; a cancel ends it once; the signal wait is
/// woken by its signal.
///
/// Promised by `Transition::after` / `on_signal` (any `Duration`; "Run
/// `step` next, once `delay` has passed"), `wait_timeout` ("`wait_timeout(id,
/// Duration::ZERO)` is a look that does not wait") and `cancel`.
#[tokio::test(start_paused = true)]
async fn duration_max_timers_and_timeouts_park_the_run_without_panicking() {
    let host = Host::in_memory();
    let (_queue, rt, _w) = host.process(Nap).await;
    for (id, key) in [("forever-timer", None), ("forever-wait", Some("wake-me"))] {
        let nap = NapInput {
            key: key.map(str::to_string),
        };
        start(&rt, id, nap).await;
        until_at(&rt, id, 1, RunState::Pending).await;
        let details = rt
            .view()
            .run(&rid(id))
            .await
            .expect("details read")
            .expect("known");
        assert_eq!(details.current_step, 1, "{details:?}");
        assert_eq!(
            details
                .waiting_for_signal
                .map(|w| w.correlation_key)
                .as_deref(),
            key
        );
        let history = rt.view().steps(&rid(id)).await.expect("history reads");
        assert!(history.is_some_and(|h| h.steps.len() == 1));
        assert!(
            rt.wait_timeout(&rid(id), Duration::ZERO)
                .await
                .expect("a look")
                .is_none()
        );
    }
    let listed = rt
        .view()
        .runs(&taquba_workflow::view::RunFilter::new())
        .await
        .expect("the listing reads");
    assert_eq!(listed.runs.len(), 2);

    host.clock.advance(10 * 365 * DAY);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(state_of(&rt, "forever-timer").await, (RunState::Pending, 1));
    assert_eq!(state_of(&rt, "forever-wait").await, (RunState::Pending, 1));

    assert!(rt.cancel(&rid("forever-timer")).await.expect("cancel"));
    assert_eq!(
        end_of(&rt, "forever-timer").await.termination.status,
        TerminalStatus::Cancelled
    );
    assert_eq!(
        rt.signal_value("wake-me", "hi").await.expect("signal"),
        SignalOutcome::Delivered
    );
    assert_eq!(decoded::<String>(end_of(&rt, "forever-wait").await), "hi");
    told_once(&host.hook, "forever-timer").await;
    told_once(&host.hook, "forever-wait").await;
}

/// Carries a large field into its second step and ends with a large output.
#[derive(Clone, Default)]
pub struct Bulk;

/// The blob `fill` makes and the output `echo` makes of it.
fn blob(size: u32) -> Vec<u8> {
    (0..size).map(|i| (i % 251) as u8).collect()
}

fn echoed(blob: &[u8]) -> String {
    blob.iter().map(|b| char::from(b'a' + b % 26)).collect()
}

#[workflow(name = "bulk", output = String)]
impl Bulk {
    #[step(start)]
    async fn fill(size: u32) -> Result<Transition<BulkStep>, StepError> {
        Ok(Transition::next(BulkStep::Echo { blob: blob(size) }))
    }

    #[step]
    async fn echo(blob: &[u8]) -> Result<Transition<BulkStep>, StepError> {
        Ok(Transition::done(echoed(blob)))
    }
}

/// A step field of 1 MiB (well over the queue's 256 KiB inline payload)
/// and an output of 1 MiB (over the 64 KiB kept in memory for waits)
/// arrive whole: through `wait`, `outcome`, the typed handle and the
/// terminal hook, and, after another process took the store over, through
/// its `outcome` and `wait`.
///
/// Promised by the README ("An error (or `Fail` reason) of any length ...";
/// `wait`: "the outcome of a run that ended lately in this process (...
/// up to 64 KiB each ...) is taken from memory instead of its result
/// record") and `WorkflowRun::outcome` ("Works from any process over the
/// same store").
#[tokio::test(start_paused = true)]
async fn a_one_mib_field_and_output_arrive_whole_in_every_reader() {
    const SIZE: u32 = 1024 * 1024;
    let host = Host::in_memory();
    let (_q1, rt1, w1) = host.process(Bulk).await;
    let expected = echoed(&blob(SIZE));
    let run = start(&rt1, "bulk", BulkInput { size: SIZE }).await;
    let output = succeeded(&run).await;
    assert!(
        output == expected,
        "the output arrives whole ({} bytes)",
        output.len()
    );
    let outcome = rt1
        .outcome(&rid("bulk"))
        .await
        .expect("read")
        .expect("ended");
    let stored: String =
        rmp_serde::from_slice(outcome.result.as_deref().expect("a result")).expect("decodes");
    assert!(stored == expected);
    told_once(&host.hook, "bulk").await;
    let told_result = host.hook.calls()[0]
        .result
        .clone()
        .expect("the hook gets the result");
    assert_eq!(told_result, outcome.result.expect("a result"));
    kill(w1).await;

    let q2 = host.open().await;
    let rt2 = host.builder(&q2, Bulk).build();
    let typed = rt2.workflow_run::<Bulk>(rid("bulk"));
    match typed.outcome().await.expect("read") {
        Some(Ok(output)) => assert!(output == expected, "after the takeover"),
        other => panic!(
            "the run's outcome after the takeover: {:?}",
            other.map(|r| r.map(|o| o.len()))
        ),
    }
    let end = within(5, rt2.wait(&rid("bulk"))).await.expect("read");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(decoded::<String>(end) == expected);
}

// ---------------------------------------------------------------------------
// Retention of a run id submitted again.

/// What a `Journal` run read from its run memo before and after its wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journalled {
    before: Option<String>,
    after: Option<String>,
}

/// Writes its text to the run memo, waits on `key` for a day, then reads
/// the run memo back.
#[derive(Clone, Default)]
pub struct Journal;

#[workflow(name = "journal", output = Journalled)]
impl Journal {
    #[step(start)]
    async fn write(
        ctx: StepContext<'_>,
        text: String,
        key: String,
    ) -> Result<Transition<JournalStep>, StepError> {
        let before = as_text(ctx.run_memo.get("journal").await?);
        ctx.run_memo.put("journal", text.as_bytes()).await?;
        Ok(Transition::on_signal(
            JournalStep::Read { before },
            key,
            DAY,
        ))
    }

    #[step]
    async fn read(
        ctx: StepContext<'_>,
        before: Option<String>,
    ) -> Result<Transition<JournalStep>, StepError> {
        let after = as_text(ctx.run_memo.get("journal").await?);
        Ok(Transition::done(Journalled { before, after }))
    }
}

/// With `memo_retention(1 h)`, run id `j` ends, is submitted again (its
/// memo is shared with the earlier run) and its second run waits two hours
/// on a signal, past the first run's window, while sweeps run: the second
/// run's memo entry is kept. An hour after the second run ends, its state
/// is gone: `status` and the typed `outcome` answer `None` and `wait`
/// answers `RunNotFound` naming the run.
///
/// Promised by `memo_retention` ("A run id submitted again after its run
/// terminated keeps them until a window after its last run's end: the
/// earlier run's window leaves a run id that is active again, or that
/// ended again since, alone"), `submit` ("Its memo entries ... are shared
/// with the earlier run") and `status` / `wait` ("`None` for a run ...
/// whose records retention removed"; "`Error::RunNotFound` for a run that
/// is neither active nor recorded as terminated").
#[tokio::test(start_paused = true)]
async fn retention_of_an_ended_run_spares_its_id_running_again() {
    let host = Host::in_memory();
    let queue = host.open().await;
    let rt = host.builder(&queue, Journal).memo_retention(HOUR).build();
    let _w = worker(&rt);
    let start = |text: &str, key: &str| {
        rt.start_as(
            rid("j"),
            JournalInput {
                text: text.into(),
                key: key.into(),
            },
            RunOptions::default(),
        )
    };

    let first = start("first", "j-1").await.expect("starts");
    until_at(&rt, "j", 1, RunState::Pending).await;
    rt.signal_value("j-1", "go").await.expect("signal");
    assert_eq!(
        succeeded(&first).await,
        Journalled {
            before: None,
            after: Some("first".into()),
        }
    );

    let second = start("second", "j-2").await.expect("starts again");
    assert!(second.newly_submitted());
    until_at(&rt, "j", 1, RunState::Pending).await;
    host.clock.advance(2 * HOUR);
    tokio::time::sleep(Duration::from_millis(300)).await;
    rt.signal_value("j-2", "go").await.expect("signal");
    assert_eq!(
        succeeded(&second).await,
        Journalled {
            before: Some("first".into()),
            after: Some("second".into()),
        },
        "the second run's memo outlived the first run's window"
    );

    host.clock.advance(HOUR + MINUTE);
    eventually("the run's state is swept", || async {
        rt.status(&rid("j")).await.expect("status").is_none()
    })
    .await;
    assert!(matches!(second.outcome().await, Ok(None)));
    match within(5, rt.wait(&rid("j"))).await {
        Err(Error::RunNotFound(id)) => assert_eq!(id, "j"),
        other => panic!("a swept run is not found: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Idempotent typed starts.

/// A `Meta` with 32-entry hash maps and sets, built afresh (so with its
/// own hasher seeds: the maps iterate in an order of their own).
fn meta_with_maps() -> Meta {
    Meta {
        hashed: (0..32).map(|i| (i, format!("v{i}"))).collect(),
        set: (0..32).map(|i| format!("s{i}")).collect(),
        ..sample_meta()
    }
}

/// `start_as` of a run that is active, again with an equal typed input
/// (equal by `==`) whose `HashMap` and `HashSet` fields iterate in another
/// order, answers for the run (`newly_submitted: false`), as a retry after
/// a dropped or timed-out start must.
///
/// Promised by `start_as` ("idempotent on `(run_id, input)` as
/// `WorkflowRuntime::submit` is"; "dropped at any await, the run was
/// never committed, or it is and runs; starting the same id and input
/// again answers for it") and the README ("the payload comparison of a
/// re-submission ... digest a canonical encoding: map entries and
/// `HashSet` elements are sorted at every depth, so equal values are one
/// key whatever order they iterate in"). Found by this review: typed
/// starts compared raw bytes, and refused the equal input.
#[tokio::test(start_paused = true)]

async fn starting_an_active_run_again_with_an_equal_input_holding_maps_answers_for_it() {
    let host = Host::in_memory();
    let queue = host.open().await;
    let rt = host.builder(&queue, Carry::default()).build();
    let input = |meta: Meta| CarryInput {
        label: "maps".into(),
        ids: vec![1],
        meta,
        path: PathBuf::from("/x"),
        note: None,
    };
    let (first, second) = (meta_with_maps(), meta_with_maps());
    assert_eq!(first, second, "equal inputs");
    let orders_differ = rmp_serde::to_vec_named(&first).expect("encodes")
        != rmp_serde::to_vec_named(&second).expect("encodes");
    let run = start(&rt, "maps", input(first)).await;
    assert!(run.newly_submitted());
    let again = rt
        .start_as(rid("maps"), input(second), RunOptions::default())
        .await
        .map(|run| run.newly_submitted());
    assert!(
        matches!(again, Ok(false)),
        "the same input answers for the run (maps encoded in another order: {orders_differ}): {again:?}"
    );
}

// ---------------------------------------------------------------------------
// Memo and KV effects across a retried step.

/// What `Tally`'s first step saw on its last attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tallied {
    recomputed: u32,
    committed_before: Option<String>,
    staged_visible: Option<String>,
    reserved: String,
    conflict: String,
    flaky: u32,
    committed_after: Option<String>,
}

/// Its first attempt plants an undecodable memo entry, stages a KV row and
/// fails (through a memoized computation that errs); its second attempt
/// reports what it sees; the next step reads the row as committed.
#[derive(Clone, Default)]
pub struct Tally;

#[workflow(name = "tally", output = Tallied)]
impl Tally {
    #[step(start)]
    async fn count(ctx: &StepContext<'_>) -> Result<Transition<TallyStep>, StepError> {
        let attempt = ctx.attempts;
        if attempt == 1 {
            ctx.memo.put("decoded", &[0xc1]).await?;
        }
        let recomputed: u32 = ctx
            .memo
            .memoized("decoded", async { Ok::<_, StepError>(7) })
            .await?;
        let committed_before = as_text(ctx.kv.get(b"app/tally").await?);
        ctx.effects.put("app/tally", format!("attempt-{attempt}"))?;
        let staged_visible = as_text(ctx.kv.get(b"app/tally").await?);
        let reserved = ctx
            .effects
            .put("workflow/mine", "v")
            .expect_err("reserved prefix")
            .to_string();
        ctx.effects.delete("app/both")?;
        let conflict = ctx
            .effects
            .put("app/both", "v")
            .expect_err("written and deleted")
            .to_string();
        let flaky: u32 = ctx
            .memo
            .memoized("flaky", async move {
                match attempt {
                    1 => Err(StepError::transient("the first attempt's call fails")),
                    n => Ok(n),
                }
            })
            .await?;
        Ok(Transition::next(TallyStep::Report {
            seen: Tallied {
                recomputed,
                committed_before,
                staged_visible,
                reserved,
                conflict,
                flaky,
                committed_after: None,
            },
        }))
    }

    #[step]
    async fn report(
        ctx: StepContext<'_>,
        mut seen: Tallied,
    ) -> Result<Transition<TallyStep>, StepError> {
        seen.committed_after = as_text(ctx.kv.get(b"app/tally").await?);
        Ok(Transition::done(seen))
    }
}

/// A `#[workflow]` step retried after a transient error: its first
/// attempt's staged KV row is not applied; a step reads committed KV state
/// only (not what it staged); a memo entry that does not decode is
/// recomputed and overwritten; a memoized computation that fails stores
/// nothing, so the retry computes again; staging under `workflow/` and
/// staging one key for a write and a delete are refused naming the key.
///
/// Promised by the spec ("No effects are applied when the runner returns
/// a `StepError`"; `Delivery::kv` "answering from committed state, so
/// effects staged by the running step are excluded"; "An entry that fails
/// to decode is treated as absent and is overwritten by the recomputed
/// value; an error from the computation stores nothing"; "the `workflow/`
/// prefix is reserved ... a key cannot be staged for both a write and a
/// delete within one step").
#[tokio::test(start_paused = true)]
async fn a_retried_step_sees_memo_and_kv_effects_as_documented() {
    let host = Host::in_memory();
    let (_queue, rt, _w) = host.process(Tally).await;
    let run = start(&rt, "tally", TallyInput {}).await;
    let seen = succeeded(&run).await;
    assert_eq!(seen.recomputed, 7, "an undecodable entry is recomputed");
    assert_eq!(
        seen.committed_before, None,
        "attempt 1's row was not applied"
    );
    assert_eq!(seen.staged_visible, None, "staged rows are not read back");
    assert!(seen.reserved.contains("workflow/mine"), "{}", seen.reserved);
    assert!(seen.conflict.contains("app/both"), "{}", seen.conflict);
    assert_eq!(seen.flaky, 2, "a failed computation stored nothing");
    assert_eq!(seen.committed_after.as_deref(), Some("attempt-2"));
    let history = history_of(&rt, "tally").await;
    assert_eq!(history.steps[0].attempts.len(), 2, "{history:?}");
    told_once(&host.hook, "tally").await;
}

// ---------------------------------------------------------------------------
// Exactly-once commits under repeated takeovers.

/// A state machine looping on one step: each step adds `step + 1` to the
/// carried sum and stages it (an absolute value) under `app/acc/{run}`;
/// the step after the last ends with the sum. Counts its calls.
#[derive(Clone, Default)]
pub struct Chain {
    calls: Arc<AtomicUsize>,
}

#[workflow(name = "chain", output = u64)]
impl Chain {
    #[step(start)]
    async fn add(
        &self,
        ctx: StepContext<'_>,
        left: u32,
        acc: u64,
    ) -> Result<Transition<ChainStep>, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ctx.effects
            .put(format!("app/acc/{}", ctx.run_id), acc.to_string())?;
        if left == 0 {
            return Ok(Transition::done(acc));
        }
        Ok(Transition::next(ChainStep::Add {
            left: left - 1,
            acc: acc + u64::from(ctx.step_number) + 1,
        }))
    }
}

/// Eight `Chain` runs of 30 steps over a store whose calls take 1 to
/// 4 ms; again and again, a few task switches after its start, the
/// process is killed (its worker task
/// aborted) and a new one takes the store over (fencing the old one),
/// moving the clock past the dead process's leases. Every run ends with
/// the exact sum (a step committed twice or lost would change it), its
/// history lists each step once, its last committed row is the sum, and
/// the hook is told of it (at least once: a crash may repeat a
/// notification, which the spec allows).
///
/// Promised by the README ("Every transition (the acknowledgement of a
/// step, the enqueue of the next, the run's current-step pointer, its
/// terminal record, the KV effects the step staged) is **one** queue
/// transaction"; "a crash ... resumes each run at its last committed
/// step"; "A store has one writer process: opening it fences the previous
/// owner").
#[tokio::test(start_paused = true)]
async fn looping_runs_commit_each_step_once_across_repeated_takeovers() {
    const STEPS: u32 = 30;
    const RUNS: usize = 8;
    let expected = u64::from(STEPS) * u64::from(STEPS + 1) / 2;
    let host = Host::over(Arc::new(FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            seed: 40,
            latency: Some(Duration::from_millis(1)..Duration::from_millis(4)),
            ..FaultConfig::default()
        },
    )));
    let chain = Chain::default();
    let ids: Vec<String> = (0..RUNS).map(|i| format!("chain-{i}")).collect();
    let mut takeovers_mid_run = 0;
    for round in 0..40u64 {
        let queue = host.open().await;
        let rt = host
            .builder(&queue, chain.clone())
            .max_concurrent_steps(2)
            .build();
        if round == 0 {
            for id in &ids {
                rt.start_as(
                    rid(id),
                    ChainInput {
                        left: STEPS,
                        acc: 0,
                    },
                    RunOptions {
                        // Each kill mid-step spends an attempt.
                        max_attempts_per_step: Some(1_000),
                        ..Default::default()
                    },
                )
                .await
                .expect("starts");
            }
        }
        let w = worker(&rt);
        for _ in 0..(1 + round % 8) * 8 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(round % 3)).await;
        kill(w).await;
        let mut active = 0;
        for id in &ids {
            if let Some(status) = rt.view().status(&rid(id)).await.expect("status")
                && !matches!(status.state, RunState::Terminated(_))
            {
                active += 1;
            }
        }
        host.clock.advance(Duration::from_secs(31));
        if active == 0 {
            break;
        }
        takeovers_mid_run += 1;
    }
    assert!(
        takeovers_mid_run >= 5,
        "{takeovers_mid_run} takeovers mid-run"
    );
    let (queue, rt, _w) = host.process(chain.clone()).await;
    host.clock.advance(Duration::from_secs(31));
    for id in &ids {
        let end = end_of(&rt, id).await;
        assert_eq!(
            end.termination.status,
            TerminalStatus::Succeeded,
            "{id}: {:?}",
            end.termination
        );
        assert_eq!(end.termination.final_step, STEPS, "{id}");
        let typed = rt.workflow_run::<Chain>(rid(id));
        assert_eq!(
            typed.outcome().await.expect("read"),
            Some(Ok(expected)),
            "{id}: the exact sum"
        );
        let history = history_of(&rt, id).await;
        let steps: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
        assert_eq!(
            steps,
            (0..=STEPS).collect::<Vec<_>>(),
            "{id}: each step once"
        );
        assert_eq!(
            kv_text(&queue, &format!("app/acc/{id}")).await,
            Some(expected.to_string()),
            "{id}"
        );
    }
    assert!(
        chain.calls.load(Ordering::SeqCst) >= RUNS * (STEPS as usize + 1),
        "every step ran"
    );
    for id in &ids {
        eventually(&format!("the hook is told of {id}"), || async {
            told(&host.hook, id) >= 1
        })
        .await;
    }
}
