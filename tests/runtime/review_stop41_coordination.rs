//! Review 41 (a): child workflows, schedules and per-key concurrency at the
//! public API, as a new user reads the README and the item docs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::children::{ChildEnd, child_run_id};
use taquba_workflow::schedule::{CatchUp, ScheduleSpec, tick_run_id};
use taquba_workflow::testing::{TEST_EPOCH_MS, TestRuntime};
use taquba_workflow::{
    Error, NoopTerminalHook, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::TokioClock;

const HOUR: Duration = Duration::from_secs(3600);
const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);
const HOUR_MS: u64 = 3_600_000;

/// A queue over `store` whose clock follows Tokio's (paused) time, with a
/// 1 ms flush, no retry backoff, `attempts` attempts and `lease`.
async fn tokio_queue(store: &Arc<dyn ObjectStore>, attempts: u32, lease: Duration) -> Arc<Queue> {
    Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default()
                .clock(Arc::new(TokioClock::new(T0)))
                .flush_interval(Duration::from_millis(1))
                .default_queue_config(
                    QueueConfig::default()
                        .retry_backoff_base(Duration::ZERO)
                        .max_attempts(attempts)
                        .lease_duration(lease),
                ),
        )
        .await
        .expect("open queue"),
    )
}

fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..RunSpec::default()
    }
}

fn result_text(end: &taquba_workflow::RunEnd) -> String {
    String::from_utf8_lossy(
        end.outcome
            .as_ref()
            .and_then(|o| o.result.as_deref())
            .unwrap_or_default(),
    )
    .into_owned()
}

/// Poll until run `id` exists and is at step `step`.
async fn until_exists_at<R: StepRunner, H: taquba_workflow::TerminalHook>(
    what: &str,
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    step: u32,
) {
    eventually(what, || async {
        runtime
            .status(&rid(id))
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == step)
    })
    .await;
}

// ---------------------------------------------------------------------------
// Child workflows.

/// Step 0's input says what a run does:
/// - `parent:{key}:{child input}` starts child `key` and waits for it a
///   day; step 1 says how it ended;
/// - `ok:{result}` succeeds; `fail:{reason}` fails with a verdict;
///   `perm:{message}` errors permanently; `trans` errors transiently;
/// - `hold` waits a day on a signal nobody sends, then succeeds.
#[derive(Clone, Default)]
struct Kin {
    calls: Calls,
}

/// Each runner call: the run, the step number and the step's input.
type Calls = Arc<Mutex<Vec<(String, u32, String)>>>;

impl Kin {
    fn step0_jobs(&self, run: &str) -> BTreeSet<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, s, _)| r == run && *s == 0)
            .map(|(_, _, job)| job.clone())
            .collect()
    }
}

fn describe_end(end: Option<ChildEnd>) -> String {
    match end {
        None => "timed out".into(),
        Some(end) => match end.status {
            TerminalStatus::Succeeded => format!(
                "succeeded:{}",
                String::from_utf8_lossy(&end.result.unwrap_or_default())
            ),
            TerminalStatus::Failed => format!(
                "failed:{:?}:{}",
                end.error_kind,
                end.error.unwrap_or_default()
            ),
            TerminalStatus::Cancelled => {
                format!("cancelled:{}", end.error.unwrap_or_default())
            }
        },
    }
}

impl StepRunner for Kin {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.lock().unwrap().push((
            step.run_id.to_string(),
            step.step_number,
            step.job_id.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(2)).await;
        let payload = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            if payload == "await" {
                let end = ChildEnd::of_signal(step.signal.as_deref())
                    .map_err(|e| StepError::permanent(e.to_string()))?;
                return Ok(StepOutcome::Succeed {
                    result: describe_end(end).into_bytes(),
                });
            }
            return Ok(StepOutcome::Succeed {
                result: b"released".to_vec(),
            });
        }
        let (kind, rest) = payload.split_once(':').unwrap_or((payload.as_str(), ""));
        match kind {
            "parent" => {
                let (key, input) = rest.split_once(':').unwrap_or((rest, ""));
                let child = step
                    .delivery
                    .children
                    .start(key, input.as_bytes().to_vec(), RunOptions::default())
                    .map_err(|e| StepError::permanent(e.to_string()))?;
                Ok(StepOutcome::continue_on_child(
                    b"await".to_vec(),
                    &child,
                    DAY,
                ))
            }
            "ok" => Ok(StepOutcome::Succeed {
                result: rest.as_bytes().to_vec(),
            }),
            "fail" => Ok(StepOutcome::Fail {
                reason: rest.to_string(),
            }),
            "perm" => Err(StepError::permanent(rest.to_string())),
            "trans" => Err(StepError::transient("always transient")),
            "hold" => Ok(StepOutcome::continue_on_signal(
                b"held".to_vec(),
                format!("hold:{}", step.run_id),
                DAY,
            )),
            other => Err(StepError::permanent(format!("unknown input {other:?}"))),
        }
    }
}

/// A plain run submitted under the id a parent's child would get: the
/// parent's start of that child is refused naming the id (it must not
/// adopt, overwrite or restart the plain run), and the plain run is left
/// as it was.
#[tokio::test(start_paused = true)]
async fn a_child_id_taken_by_a_plain_run_fails_the_parent_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let kin = Kin::default();
    let runtime = workflow_builder(&queue, &store, &kin).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // Ended plain run under `p--c`.
    runtime.submit(spec("p--c", "ok:plain")).await.unwrap();
    within(60, runtime.wait(&rid("p--c"))).await.unwrap();
    runtime
        .submit(spec("p", "parent:c:ok:child"))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("p"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.termination.error.clone().unwrap_or_default();
    assert!(error.contains("p--c"), "{error}");
    let plain = runtime.outcome(&rid("p--c")).await.unwrap().unwrap();
    assert_eq!(plain.result.as_deref(), Some(&b"plain"[..]));
    assert_eq!(kin.step0_jobs("p--c").len(), 1, "the plain run ran once");
    let details = runtime.view().run(&rid("p--c")).await.unwrap().unwrap();
    assert_eq!(details.parent, None);

    // Active plain run under `q--c`: the same.
    runtime.submit(spec("q--c", "hold")).await.unwrap();
    until_step("q--c holds", &runtime, "q--c", 1).await;
    runtime
        .submit(spec("q", "parent:c:ok:child"))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("q"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert!(
        end.termination
            .error
            .clone()
            .unwrap_or_default()
            .contains("q--c")
    );
    let status = runtime.status(&rid("q--c")).await.unwrap().unwrap();
    assert_eq!(status.current_step, 1, "the plain run keeps waiting");
    worker.shutdown().await.unwrap();
}

/// Two parents whose id and key concatenate to one child id (`a` + `b--c`
/// and `a--b` + `c`): the second start is refused naming the id; the first
/// parent gets its own child's end.
#[tokio::test(start_paused = true)]
async fn two_parents_whose_child_ids_collide_do_not_share_a_child() {
    let (queue, store, _clock) = memory_queue().await;
    let kin = Kin::default();
    let runtime = workflow_builder(&queue, &store, &kin).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        child_run_id(&rid("a"), "b--c").unwrap(),
        child_run_id(&rid("a--b"), "c").unwrap()
    );
    runtime.submit(spec("a", "parent:b--c:hold")).await.unwrap();
    until_exists_at("the first child holds", &runtime, "a--b--c", 1).await;
    runtime
        .submit(spec("a--b", "parent:c:ok:second"))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("a--b"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert!(
        end.termination
            .error
            .clone()
            .unwrap_or_default()
            .contains("a--b--c")
    );
    let child = runtime.view().run(&rid("a--b--c")).await.unwrap().unwrap();
    assert_eq!(child.parent, Some(rid("a")));
    assert!(!matches!(child.state, RunState::Terminated(_)));
    runtime.signal("hold:a--b--c", Vec::new()).await.unwrap();
    let end = within(60, runtime.wait(&rid("a"))).await.unwrap();
    assert_eq!(result_text(&end), "succeeded:released");
    worker.shutdown().await.unwrap();
}

/// A child dead-lettered by a permanent error, one failed by a verdict and
/// one cancelled by its own runner: the parent gets each end with its
/// status, kind and message.
#[tokio::test(start_paused = true)]
async fn a_parent_reads_each_way_its_child_can_end() {
    let (queue, store, _clock) = memory_queue().await;
    let kin = Kin::default();
    let runtime = workflow_builder(&queue, &store, &kin).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, input, expected) in [
        ("d1", "parent:c:perm:disk gone", "failed:Some(Permanent):"),
        ("d2", "parent:c:fail:no money", "failed:"),
        ("d3", "parent:c:trans", "failed:"),
        ("d4", "parent:c:ok:fine", "succeeded:fine"),
    ] {
        runtime.submit(spec(id, input)).await.unwrap();
        let end = within(120, runtime.wait(&rid(id))).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
        let said = result_text(&end);
        assert!(said.starts_with(expected), "{id}: {said}");
        let child = within(60, runtime.wait(&rid(&format!("{id}--c"))))
            .await
            .unwrap();
        let child_status = child.termination.status;
        assert_eq!(
            child_status == TerminalStatus::Succeeded,
            id == "d4",
            "{id}"
        );
    }
    let said = result_text(&runtime.wait(&rid("d1")).await.unwrap());
    assert!(said.contains("disk gone"), "{said}");
    let said = result_text(&runtime.wait(&rid("d2")).await.unwrap());
    assert!(said.contains("no money"), "{said}");
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Schedules.

/// A one-step runner that records each run it is called for.
#[derive(Clone, Default)]
struct Ticks {
    calls: Arc<Mutex<Vec<(String, String)>>>,
}

impl Ticks {
    /// Each run's distinct step jobs.
    fn jobs(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut jobs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (run, job) in self.calls.lock().unwrap().iter() {
            jobs.entry(run.clone()).or_default().insert(job.clone());
        }
        jobs
    }

    fn runs_of(&self, name: &str) -> Vec<String> {
        let prefix = format!("schedule-{name}-");
        self.jobs()
            .into_keys()
            .filter(|run| run.starts_with(&prefix))
            .collect()
    }
}

impl StepRunner for Ticks {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((step.run_id.to_string(), step.job_id.clone()));
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

fn tick(name: &str, ms: u64) -> String {
    tick_run_id(name, ms).unwrap().to_string()
}

/// 2024-03-30T12:00:00Z and 2024-10-26T12:00:00Z: the days before Europe/
/// Paris moves its clocks forward (02:00 CET -> 03:00 CEST on March 31)
/// and back (03:00 CEST -> 02:00 CET on October 27).
const MARCH_30_NOON: u64 = 1_711_800_000_000;
const MARCH_31: u64 = 1_711_843_200_000;
const OCTOBER_26_NOON: u64 = 1_729_944_000_000;
const OCTOBER_27: u64 = 1_729_987_200_000;

async fn env_at(ms: u64) -> TestRuntime<Ticks> {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    env.clock()
        .advance(Duration::from_millis(ms - TEST_EPOCH_MS));
    env.run_until_idle().await.unwrap();
    env
}

/// "a fixed time the clocks skip fires right after the gap": 02:30 Paris
/// does not exist on 2024-03-31; the tick at 03:00 CEST (01:00 UTC), which
/// the schedule announces as its next, fires once.
#[tokio::test(start_paused = true)]
async fn a_fixed_time_in_the_daylight_saving_gap_fires_right_after_it() {
    let env = env_at(MARCH_30_NOON).await;
    let runtime = env.runtime().unwrap();
    let spec = ScheduleSpec::cron("30 2 * * *")
        .unwrap()
        .in_zone("Europe/Paris")
        .unwrap();
    let info = runtime.schedule("gap", spec, vec![]).await.unwrap();
    assert_eq!(info.next_fire_ms, Some(MARCH_31 + HOUR_MS));
    env.advance(Duration::from_millis(MARCH_31 + 2 * HOUR_MS - env.now_ms()))
        .await
        .unwrap();
    assert_eq!(
        env.runner().runs_of("gap"),
        [tick("gap", MARCH_31 + HOUR_MS)]
    );
    let info = runtime.view().schedule("gap").await.unwrap().unwrap();
    assert_eq!(info.fired, 1);
    // The next day, 02:30 CEST = 00:30 UTC.
    assert_eq!(info.next_fire_ms, Some(MARCH_31 + DAY_MS + HOUR_MS / 2));
}

const DAY_MS: u64 = 24 * HOUR_MS;

/// "one they repeat fires once": 02:30 Paris happens twice on 2024-10-27
/// (00:30 UTC in summer time, 01:30 UTC in winter time); it fires once.
#[tokio::test(start_paused = true)]
async fn a_fixed_time_the_clocks_repeat_fires_once() {
    let env = env_at(OCTOBER_26_NOON).await;
    let runtime = env.runtime().unwrap();
    let spec = ScheduleSpec::cron("30 2 * * *")
        .unwrap()
        .in_zone("Europe/Paris")
        .unwrap();
    runtime.schedule("twice", spec, vec![]).await.unwrap();
    env.advance(Duration::from_millis(
        OCTOBER_27 + 6 * HOUR_MS - env.now_ms(),
    ))
    .await
    .unwrap();
    let runs = env.runner().runs_of("twice");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let info = runtime.view().schedule("twice").await.unwrap().unwrap();
    // 2024-10-28 02:30 CET = 01:30 UTC.
    assert_eq!(
        info.next_fire_ms,
        Some(OCTOBER_27 + DAY_MS + HOUR_MS + HOUR_MS / 2)
    );
}

/// "wildcard and step fields follow the wall clock (none in the gap, each
/// repeated match in the repeated hour)": every 30 minutes in Paris over
/// the night of 2024-10-27 fires at each UTC half hour, the repeated
/// 02:00 and 02:30 included, each once; and a downtime over the same night
/// with `CatchUp::All` fires the very same ticks.
#[tokio::test(start_paused = true)]
async fn half_hourly_ticks_over_the_repeated_hour_fire_each_once_on_time_or_caught_up() {
    let spec = || {
        ScheduleSpec::cron("*/30 * * * *")
            .unwrap()
            .in_zone("Europe/Paris")
            .unwrap()
            .catch_up(CatchUp::All)
    };
    let start = OCTOBER_27 - 30 * 60_000; // 23:30 UTC, 01:30 CEST
    let end = OCTOBER_27 + 3 * HOUR_MS; // 03:00 UTC, 04:00 CET
    let expected: Vec<String> = (1..=7)
        .map(|k| tick("night", start + k * 30 * 60_000))
        .collect();

    // On time.
    let env = env_at(start).await;
    env.runtime()
        .unwrap()
        .schedule("night", spec(), vec![])
        .await
        .unwrap();
    env.advance(Duration::from_millis(end - env.now_ms()))
        .await
        .unwrap();
    assert_eq!(env.runner().runs_of("night"), expected, "on time");
    assert!(env.runner().jobs().values().all(|j| j.len() == 1));

    // A downtime over the night.
    let env = env_at(start).await;
    env.runtime()
        .unwrap()
        .schedule("night", spec(), vec![])
        .await
        .unwrap();
    env.clock().advance(Duration::from_millis(end - start));
    env.run_until_idle().await.unwrap();
    assert_eq!(env.runner().runs_of("night"), expected, "caught up");
}

/// Runs a 1 s interval schedule under `policy` for 31 s with the worker
/// looking every 3 s; the ticks among the first 24 that never fired.
async fn ticks_missed_by_late_rounds(policy: CatchUp) -> (Vec<String>, usize) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_queue(&store, 3, Duration::from_secs(30)).await;
    let ticks = Ticks::default();
    let runtime = workflow_builder(&queue, &store, &ticks)
        .poll_interval(Duration::from_secs(3))
        .build();
    let info = runtime
        .schedule(
            "fast",
            ScheduleSpec::every(Duration::from_secs(1))
                .unwrap()
                .catch_up(policy),
            vec![],
        )
        .await
        .unwrap();
    let first = info.next_fire_ms.unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    tokio::time::sleep(Duration::from_secs(31)).await;
    worker.shutdown().await.unwrap();
    let runs: BTreeSet<String> = ticks.runs_of("fast").into_iter().collect();
    let missing = (0..24)
        .map(|k| tick("fast", first + k * 1_000))
        .filter(|id| !runs.contains(id))
        .collect();
    (missing, runs.len())
}

/// Under `policy`, with rounds a poll interval late, each of the first 24
/// ticks fired.
async fn every_tick_fires_with_late_rounds(policy: CatchUp) {
    let (missing, runs) = ticks_missed_by_late_rounds(policy).await;
    assert!(
        missing.is_empty(),
        "{} of the first 24 ticks never fired, e.g. {:?} ({runs} runs in all)",
        missing.len(),
        &missing[..missing.len().min(3)],
    );
}

/// `CatchUp::Skip`: "a tick under 60 s late is on time". With a 1 s
/// interval and the worker looking every 3 s ("so a run starts up to that
/// late"), each tick is at most 3 s late: on time, so each fires.
#[tokio::test(start_paused = true)]
async fn skip_fires_every_tick_that_is_only_a_poll_interval_late() {
    every_tick_fires_with_late_rounds(CatchUp::Skip).await;
}

/// The default `CatchUp::One` is for "a downtime"; a maintenance round
/// one poll interval late is none ("so a run starts up to that late",
/// "no tick is lost"): each tick fires.
#[tokio::test(start_paused = true)]
async fn the_default_policy_fires_every_tick_that_is_only_a_poll_interval_late() {
    every_tick_fires_with_late_rounds(CatchUp::One).await;
}

/// A round that finds five on-time ticks (a 1 s interval, the worker 5 s
/// late) under the default `CatchUp::One` fires each in its own commit;
/// dropped after every number of polls and crashed (`kill -9`), then run
/// again before any tick is a minute late: every tick has fired exactly
/// once (one run each, started once), none lost.
#[tokio::test(start_paused = true)]
async fn a_crash_between_the_on_time_ticks_of_one_round_neither_loses_nor_doubles_one() {
    use taquba_workflow_suite::testing::poll_then_drop;
    let mut n = 1;
    loop {
        let env = TestRuntime::new(Ticks::default()).await.unwrap();
        let start = env.now_ms();
        let spec = ScheduleSpec::every(Duration::from_secs(1)).unwrap();
        assert_eq!(spec.catch_up_policy(), CatchUp::One);
        env.runtime()
            .unwrap()
            .schedule("s", spec, vec![])
            .await
            .unwrap();
        env.clock().advance(Duration::from_millis(5_500));
        let completed = poll_then_drop(env.run_until_idle(), n).await.is_some();
        env.crash().await.unwrap();
        env.run_until_idle().await.unwrap();
        let runtime = env.runtime().unwrap();
        runtime.pause_schedule("s").await.unwrap();
        // Past the lease of a step claimed at the crash.
        env.run_to_completion().await.unwrap();

        let expected: BTreeSet<String> = (1..=5).map(|k| tick("s", start + k * 1_000)).collect();
        let jobs = env.runner().jobs();
        assert_eq!(
            jobs.keys().cloned().collect::<BTreeSet<_>>(),
            expected,
            "n = {n}"
        );
        for (run, jobs) in &jobs {
            assert_eq!(jobs.len(), 1, "n = {n}: {run} started more than once");
        }
        let info = runtime.view().schedule("s").await.unwrap().unwrap();
        assert_eq!(info.fired, 5, "n = {n}");
        assert_eq!(info.last_fired_ms, Some(start + 5_000), "n = {n}");
        if completed {
            assert!(n > 5, "completed after {n} polls");
            break;
        }
        n += 1;
        assert!(n < 5_000, "the round never completed on its own");
    }
}

/// `CatchUp::All` fires each tick a late round finds (control).
#[tokio::test(start_paused = true)]
async fn catch_up_all_fires_every_tick_late_rounds_find() {
    every_tick_fires_with_late_rounds(CatchUp::All).await;
}

// ---------------------------------------------------------------------------
// Per-key concurrency.

/// What keyed runs did: the runs of each key between the start of their
/// step 0 and the end of their last step, and the most seen at once.
#[derive(Clone, Default)]
struct Occupancy {
    active: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    max: Arc<Mutex<BTreeMap<String, usize>>>,
    started: Arc<Mutex<Vec<String>>>,
}

impl Occupancy {
    fn enter(&self, key: &str, run: &str) {
        let mut active = self.active.lock().unwrap();
        let runs = active.entry(key.to_string()).or_default();
        if runs.insert(run.to_string()) {
            self.started.lock().unwrap().push(run.to_string());
        }
        let mut max = self.max.lock().unwrap();
        let seen = max.entry(key.to_string()).or_default();
        *seen = (*seen).max(runs.len());
    }

    fn leave(&self, key: &str, run: &str) {
        if let Some(runs) = self.active.lock().unwrap().get_mut(key) {
            runs.remove(run);
        }
    }

    fn max(&self, key: &str) -> usize {
        self.max.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn started(&self) -> Vec<String> {
        self.started.lock().unwrap().clone()
    }
}

/// A keyed run's input is `{key}|{behaviour}`; step 0 enters the key, waits
/// `hold` on the clock (a timer: the slot stays held), then step 1 does
/// what `behaviour` says and leaves the key when that ends the run:
/// `ok`, `fail` (verdict), `perm` (dead letter), `trans` (dead letter
/// after the attempts), `cancel` (the runner's verdict), `wait` (waits a
/// day on a signal).
#[derive(Clone)]
struct Keyed {
    seen: Occupancy,
    hold: Duration,
}

impl Default for Keyed {
    fn default() -> Self {
        Self {
            seen: Occupancy::default(),
            hold: Duration::from_secs(10),
        }
    }
}

impl StepRunner for Keyed {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let payload = String::from_utf8_lossy(&step.payload).into_owned();
        let (key, behaviour) = payload.split_once('|').unwrap_or((payload.as_str(), "ok"));
        let run = step.run_id.to_string();
        if step.step_number == 0 {
            self.seen.enter(key, &run);
            return Ok(StepOutcome::continue_after(step.payload.clone(), self.hold));
        }
        let leave = || self.seen.leave(key, &run);
        match behaviour {
            "ok" => {
                leave();
                Ok(StepOutcome::Succeed { result: Vec::new() })
            }
            "fail" => {
                leave();
                Ok(StepOutcome::Fail {
                    reason: "verdict".into(),
                })
            }
            "cancel" => {
                leave();
                Ok(StepOutcome::Cancel {
                    reason: "runner cancels".into(),
                })
            }
            "perm" => {
                leave();
                Err(StepError::permanent("permanent"))
            }
            "trans" => {
                if step.attempts >= 3 {
                    leave();
                }
                Err(StepError::transient("transient"))
            }
            "wait" if step.step_number == 1 => Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                format!("go:{run}"),
                DAY,
            )),
            _ => {
                leave();
                Ok(StepOutcome::Succeed { result: Vec::new() })
            }
        }
    }
}

fn keyed(id: &str, key: &str, behaviour: &str, limit: Option<u32>) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: format!("{key}|{behaviour}").into_bytes(),
        options: RunOptions {
            concurrency_key: Some(key.to_string()),
            concurrency_limit: limit,
            ..RunOptions::default()
        },
        ..RunSpec::default()
    }
}

async fn holders_and_waiters(
    view: &taquba_workflow::WorkflowView,
    key: &str,
) -> (Vec<String>, Vec<String>) {
    let details = view.concurrency_key(key).await.unwrap();
    (
        details
            .holders
            .into_iter()
            .map(|h| h.run_id.to_string())
            .collect(),
        details
            .waiting
            .into_iter()
            .map(|w| w.run_id.to_string())
            .collect(),
    )
}

/// A keyed run ending each way a run ends (success, a `Fail` verdict, a
/// dead letter from a permanent error and from spent attempts, the
/// runner's `Cancel`, a cancellation from outside while it waits) frees its
/// slot for the next, one run at a time, in submission order, and no slot
/// is left behind.
#[tokio::test(start_paused = true)]
async fn every_way_a_keyed_run_ends_frees_its_slot_for_the_next() {
    let runner = Keyed::default();
    let env = TestRuntime::builder(runner.clone())
        .max_attempts(3)
        .build()
        .await
        .unwrap();
    let runs = [
        ("r-ok", "ok"),
        ("r-fail", "fail"),
        ("r-perm", "perm"),
        ("r-trans", "trans"),
        ("r-cancel", "cancel"),
        ("r-wait", "wait"),
        ("r-last", "ok"),
    ];
    for (id, behaviour) in runs {
        env.submit(keyed(id, "k", behaviour, None)).await.unwrap();
    }
    let runtime = env.runtime().unwrap();
    // Everything before `r-wait` ends on its own; `r-wait` holds the slot.
    env.run_until_ended(&rid("r-cancel")).await.unwrap();
    env.advance(Duration::from_secs(30)).await.unwrap();
    let view = runtime.view().clone();
    assert_eq!(
        holders_and_waiters(&view, "k").await,
        (vec!["r-wait".to_string()], vec!["r-last".to_string()])
    );
    assert!(runtime.cancel(&rid("r-wait")).await.unwrap());
    // Its waiting step was removed: it ended with the call.
    assert!(matches!(
        runtime.status(&rid("r-wait")).await.unwrap().unwrap().state,
        RunState::Terminated(_)
    ));
    runner.seen.leave("k", "r-wait");
    env.run_to_completion().await.unwrap();
    let expected = [
        ("r-ok", TerminalStatus::Succeeded),
        ("r-fail", TerminalStatus::Failed),
        ("r-perm", TerminalStatus::Failed),
        ("r-trans", TerminalStatus::Failed),
        ("r-cancel", TerminalStatus::Cancelled),
        ("r-wait", TerminalStatus::Cancelled),
        ("r-last", TerminalStatus::Succeeded),
    ];
    for (id, status) in expected {
        let end = runtime.wait(&rid(id)).await.unwrap();
        assert_eq!(end.termination.status, status, "{id}");
    }
    assert_eq!(
        runner.seen.started(),
        runs.iter()
            .map(|(id, _)| id.to_string())
            .collect::<Vec<_>>()
    );
    assert_eq!(runner.seen.max("k"), 1);
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

/// "a waiter's limit is its own ..., checked against the runs holding the
/// key when its turn comes, and no later submission overtakes it": a run
/// with limit 1 waits behind holders admitted under limit 3, and a later
/// limit-3 run waits behind it.
#[tokio::test(start_paused = true)]
async fn a_limit_changed_between_submissions_is_each_runs_own_and_nobody_overtakes() {
    let runner = Keyed::default();
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    env.submit(keyed("a", "k", "wait", Some(3))).await.unwrap();
    env.submit(keyed("b", "k", "ok", Some(3))).await.unwrap();
    env.submit(keyed("strict", "k", "ok", Some(1)))
        .await
        .unwrap();
    env.submit(keyed("late", "k", "ok", Some(3))).await.unwrap();
    let runtime = env.runtime().unwrap();
    let view = runtime.view().clone();
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        holders_and_waiters(&view, "k").await,
        (strings(&["a", "b"]), strings(&["strict", "late"]))
    );
    // `b` ends, `a` waits on its signal: one run holds the key, which is
    // `strict`'s limit; `late` (limit 3) does not overtake it.
    env.advance(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        holders_and_waiters(&view, "k").await,
        (strings(&["a"]), strings(&["strict", "late"]))
    );
    runtime.signal("go:a", Vec::new()).await.unwrap();
    env.run_to_completion().await.unwrap();
    assert_eq!(runner.seen.started(), ["a", "b", "strict", "late"]);
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

/// The largest limit admits every run at once; a key of exactly
/// `MAX_CONCURRENCY_KEY_LEN` bytes (multi-byte characters included) works,
/// one byte more is refused naming its length.
#[tokio::test(start_paused = true)]
async fn a_huge_limit_and_the_longest_key_work() {
    let runner = Keyed::default();
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    let max = taquba_workflow::limits::MAX_CONCURRENCY_KEY_LEN;
    // 'é' is two bytes.
    let long = format!(
        "{}{}",
        "é".repeat((max - 1) / 2),
        "x".repeat(max - (max - 1) / 2 * 2)
    );
    assert_eq!(long.len(), max);
    for i in 0..20 {
        env.submit(keyed(&format!("h{i:02}"), &long, "ok", Some(u32::MAX)))
            .await
            .unwrap();
    }
    let view = env.runtime().unwrap().view().clone();
    let (holders, waiters) = holders_and_waiters(&view, &long).await;
    assert_eq!((holders.len(), waiters.len()), (20, 0));
    env.run_to_completion().await.unwrap();
    assert_eq!(runner.seen.max(&long), 20);
    let over = format!("{long}y");
    let refused = env
        .runtime()
        .unwrap()
        .submit(keyed("over", &over, "ok", None))
        .await;
    assert!(
        matches!(&refused, Err(Error::InvalidRunOptions(m)) if m.contains(&format!("{} bytes", max + 1))),
        "{refused:?}"
    );
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

/// The holder's process dies while its step runs; with one attempt per
/// step, the reaper dead-letters the step once its lease expires, the run
/// ends `Failed` and its slot goes to the waiter, in the next process.
#[tokio::test(start_paused = true)]
async fn a_holder_dead_lettered_by_its_lease_after_a_crash_frees_its_slot() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_queue(&store, 1, Duration::from_secs(5)).await;
    let gate = Gate::default();
    let hanging = {
        let gate = gate.clone();
        FnRunner(move |step: Step| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                let _ = step;
                Ok(StepOutcome::Succeed { result: Vec::new() })
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), hanging, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.run(std::future::pending::<()>()).await })
    };
    runtime
        .submit(keyed("holder", "k", "ok", None))
        .await
        .unwrap();
    runtime
        .submit(keyed("next", "k", "ok", None))
        .await
        .unwrap();
    eventually("the holder runs", || async {
        runtime.status(&rid("holder")).await.unwrap().unwrap().state == RunState::Running
    })
    .await;
    worker.abort();
    let _ = worker.await;
    drop(runtime);
    drop(queue);

    let queue = tokio_queue(&store, 1, Duration::from_secs(5)).await;
    let runner = Keyed {
        hold: Duration::from_millis(10),
        ..Keyed::default()
    };
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(120, runtime.wait(&rid("holder"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let end = within(120, runtime.wait(&rid("next"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(runtime.view().concurrency_keys().await.unwrap().is_empty());
    worker.shutdown().await.unwrap();
    gate.open();
}

/// "When a slot frees, the key's waiters are admitted in submission order
/// ... no later submission overtakes it": waiters submitted in successive
/// lifetimes of the process (the test kit's crash, whose clock stays where
/// it was, as a clock does that is behind after a restart or a failover)
/// queue in the order they were submitted.
#[tokio::test(start_paused = true)]
async fn waiters_submitted_across_restarts_are_admitted_in_submission_order() {
    let runner = Keyed::default();
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    env.submit(keyed("holder", "k", "ok", None)).await.unwrap();
    let ids: Vec<String> = (0..8).map(|i| format!("w{i}")).collect();
    for id in &ids {
        env.submit(keyed(id, "k", "ok", None)).await.unwrap();
        env.crash().await.unwrap();
    }
    let view = env.runtime().unwrap().view().clone();
    let (_, waiting) = holders_and_waiters(&view, "k").await;
    assert_eq!(waiting, ids, "the waiters in admission order");
    env.run_to_completion().await.unwrap();
    let mut expected = vec!["holder".to_string()];
    expected.extend(ids.iter().cloned());
    assert_eq!(runner.seen.started(), expected);
}

/// "Cancelling a parent first cancels its active children (and theirs)
/// and waits for their ends, then the parent": a cancel issued at each
/// moment of a parent's first step (before it runs, while it runs, while
/// its settlement starting the child commits, after) returns with the
/// parent ended and no child of it still active.
#[tokio::test(start_paused = true)]
async fn a_cancel_at_each_moment_of_the_step_starting_a_child_leaves_no_child_running() {
    let mut outcomes = BTreeSet::new();
    for delay_ms in 0..80u64 {
        let store: Arc<dyn ObjectStore> =
            Arc::new(taquba_workflow_suite::testing::FaultyStore::new(
                Arc::new(InMemory::new()),
                taquba_workflow_suite::testing::FaultConfig {
                    latency: Some(Duration::from_millis(3)..Duration::from_millis(9)),
                    ..Default::default()
                },
            ));
        let queue = tokio_queue(&store, 3, Duration::from_secs(30)).await;
        let runtime = workflow_builder(&queue, &store, &Kin::default()).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        runtime.submit(spec("p", "parent:c:hold")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        within(60, runtime.cancel(&rid("p"))).await.unwrap();
        let parent = runtime.status(&rid("p")).await.unwrap().unwrap();
        assert!(
            matches!(parent.state, RunState::Terminated(_)),
            "{delay_ms} ms: {parent:?}"
        );
        let child = runtime.status(&rid("p--c")).await.unwrap();
        outcomes.insert(child.as_ref().map(|c| format!("{:?}", c.state)));
        if let Some(child) = child {
            assert!(
                matches!(child.state, RunState::Terminated(_)),
                "{delay_ms} ms: the parent was cancelled, its child is {child:?}"
            );
        }
        worker.shutdown().await.unwrap();
    }
    assert!(
        outcomes.len() >= 2,
        "the cancels hit before and after the child started: {outcomes:?}"
    );
}

/// A child whose step is running when its parent is cancelled: the cancel
/// returns only once the child ended (its step returned), and the parent
/// ends after it.
#[tokio::test(start_paused = true)]
async fn cancelling_a_parent_waits_for_its_running_childs_step() {
    let gate = Gate::default();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |step: Step| {
            let gate = gate.clone();
            async move {
                let payload = String::from_utf8_lossy(&step.payload).into_owned();
                match (step.run_id.as_str(), payload.as_str()) {
                    ("p", "start") => {
                        let child = step
                            .delivery
                            .children
                            .start("c", b"work".to_vec(), RunOptions::default())
                            .map_err(|e| StepError::permanent(e.to_string()))?;
                        Ok(StepOutcome::continue_on_child(
                            b"await".to_vec(),
                            &child,
                            DAY,
                        ))
                    }
                    (_, "work") => {
                        gate.wait().await;
                        Ok(StepOutcome::Succeed {
                            result: b"done".to_vec(),
                        })
                    }
                    _ => Ok(StepOutcome::Succeed { result: Vec::new() }),
                }
            }
        })
    };
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_queue(&store, 3, Duration::from_secs(30)).await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p", "start")).await.unwrap();
    eventually("the child runs", || async {
        runtime
            .status(&rid("p--c"))
            .await
            .unwrap()
            .is_some_and(|s| s.state == RunState::Running)
    })
    .await;
    let cancelling = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.cancel(&rid("p")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!cancelling.is_finished(), "the cancel waits for the child");
    assert!(
        !matches!(
            runtime.status(&rid("p")).await.unwrap().unwrap().state,
            RunState::Terminated(_)
        ),
        "the parent ends after its child"
    );
    gate.open();
    assert!(within(60, cancelling).await.unwrap().unwrap());
    let child = runtime.wait(&rid("p--c")).await.unwrap();
    let parent = runtime.wait(&rid("p")).await.unwrap();
    assert_eq!(child.termination.status, TerminalStatus::Cancelled);
    assert_eq!(parent.termination.status, TerminalStatus::Cancelled);
    assert!(child.termination.terminated_at_ms <= parent.termination.terminated_at_ms);
    worker.shutdown().await.unwrap();
}

/// Bad schedule input is refused naming the value, at once: an expression
/// croner rejects, a date that never comes, a zone outside the database,
/// an interval past the end of time, a name too long; nothing is stored.
#[tokio::test(start_paused = true)]
async fn bad_schedule_input_is_refused_promptly_naming_the_value() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    for expression in [
        "",
        "* * *",
        "0 0 * * * * * *",
        "every day",
        "0 9 * * MON-XYZ",
    ] {
        let err = ScheduleSpec::cron(expression).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidSchedule(m) if m.contains(&format!("{expression:?}"))),
            "{expression:?}: {err}"
        );
    }
    let never = ScheduleSpec::cron("0 0 30 2 *").unwrap();
    let err = within(5, runtime.schedule("never", never, vec![]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("0 0 30 2 *") && m.contains("\"never\"")),
        "{err}"
    );
    for zone in ["Europe/Atlantis", "", "UTC+1"] {
        let err = ScheduleSpec::cron("0 9 * * *")
            .unwrap()
            .in_zone(zone)
            .unwrap_err();
        assert!(
            err.to_string().contains(&format!("{zone:?}")),
            "{zone:?}: {err}"
        );
    }
    let err = ScheduleSpec::every(Duration::MAX).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("too long")),
        "{err}"
    );
    let far = ScheduleSpec::every(Duration::from_millis(u64::MAX - 1)).unwrap();
    let err = runtime.schedule("far", far, vec![]).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("\"far\"") && m.contains("no tick")),
        "{err}"
    );
    let long = "n".repeat(65);
    let err = runtime
        .schedule(&long, ScheduleSpec::every(HOUR).unwrap(), vec![])
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&long), "{err}");
    assert!(runtime.view().schedules().await.unwrap().is_empty());
}

/// "Bad input is refused naming the value" / "schedules ... run without a
/// key": a concurrency key given to `schedule_with` (documented to refuse
/// `InvalidRunOptions` "as for a submission") is not dropped without a
/// word: it is refused with `InvalidRunOptions` naming the key, as a
/// child's is; so is a limit given alone, naming it; nothing is stored.
#[tokio::test(start_paused = true)]
async fn a_concurrency_key_given_to_a_schedule_is_refused_or_applied() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let every = || ScheduleSpec::every(Duration::from_secs(1)).unwrap();
    let keyed = RunOptions {
        concurrency_key: Some("tenant-a".into()),
        concurrency_limit: Some(1),
        ..RunOptions::default()
    };
    let err = runtime
        .schedule_with("keyed", every(), vec![], keyed)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidRunOptions(m)
            if m.contains("concurrency_key") && m.contains("\"tenant-a\"") && m.contains("\"keyed\"")),
        "{err:?}"
    );
    let limited = RunOptions {
        concurrency_limit: Some(7),
        ..RunOptions::default()
    };
    let err = runtime
        .schedule_with("limited", every(), vec![], limited)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidRunOptions(m) if m.contains("concurrency_limit 7")),
        "{err:?}"
    );
    assert!(runtime.view().schedules().await.unwrap().is_empty());
}

/// A changed timer counts from the change: the ticks of the old timer that
/// a downtime left due are not fired, and the new timer's are, once.
#[tokio::test(start_paused = true)]
async fn a_timer_changed_after_a_downtime_does_not_fire_the_old_timers_ticks() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let old = ScheduleSpec::every(HOUR).unwrap().catch_up(CatchUp::All);
    runtime.schedule("job", old, b"v1".to_vec()).await.unwrap();
    env.clock().advance(3 * HOUR + 30 * MINUTE);
    let changed_at = env.now_ms();
    let new = ScheduleSpec::every(10 * MINUTE)
        .unwrap()
        .catch_up(CatchUp::All);
    let info = runtime.schedule("job", new, b"v2".to_vec()).await.unwrap();
    assert_eq!(info.next_fire_ms, Some(changed_at + 600_000));
    env.run_until_idle().await.unwrap();
    assert!(
        env.runner().runs_of("job").is_empty(),
        "{:?}",
        env.runner().runs_of("job")
    );
    env.advance(30 * MINUTE).await.unwrap();
    let expected: Vec<String> = (1..=3)
        .map(|k| tick("job", changed_at + k * 600_000))
        .collect();
    assert_eq!(env.runner().runs_of("job"), expected);
}

/// "a run id that already names a run is never started again": a run the
/// user submitted under a tick's id is left alone and the tick counts as
/// fired; the schedule goes on with its next tick.
#[tokio::test(start_paused = true)]
async fn a_tick_whose_run_id_is_taken_is_counted_fired_and_the_run_left_alone() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let info = runtime
        .schedule("s", ScheduleSpec::every(HOUR).unwrap(), b"tick".to_vec())
        .await
        .unwrap();
    let first = info.next_fire_ms.unwrap();
    env.submit(RunSpec {
        run_id: Some(tick_run_id("s", first).unwrap()),
        input: b"mine".to_vec(),
        ..RunSpec::default()
    })
    .await
    .unwrap();
    env.run_until_idle().await.unwrap();
    env.advance(2 * HOUR).await.unwrap();
    let outcome = runtime
        .outcome(&tick_run_id("s", first).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(outcome.result.as_deref(), Some(&b"mine"[..]));
    assert_eq!(
        env.runner()
            .jobs()
            .get(&tick("s", first))
            .map(BTreeSet::len),
        Some(1)
    );
    let info = runtime.view().schedule("s").await.unwrap().unwrap();
    assert_eq!(info.fired, 2);
    assert_eq!(info.last_fired_ms, Some(first + HOUR_MS));
    let second = runtime
        .outcome(&tick_run_id("s", first + HOUR_MS).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.result.as_deref(), Some(&b"tick"[..]));
}

/// A schedule belongs to its runtime's queue: a runtime of another queue
/// over the same store neither changes, pauses nor deletes it (refused
/// naming both queues) nor fires it.
#[tokio::test(start_paused = true)]
async fn another_queues_runtime_neither_changes_nor_fires_a_schedule() {
    let (queue, store, clock) = memory_queue().await;
    let (ta, tb) = (Ticks::default(), Ticks::default());
    let a = workflow_builder(&queue, &store, &ta)
        .poll_interval(Duration::from_millis(5))
        .build();
    let b = workflow_builder(&queue, &store, &tb)
        .queue_name("other")
        .memo_prefix("other-memo")
        .poll_interval(Duration::from_millis(5))
        .build();
    a.schedule("mine", ScheduleSpec::every(HOUR).unwrap(), vec![])
        .await
        .unwrap();
    let refusals = [
        b.schedule("mine", ScheduleSpec::every(MINUTE).unwrap(), vec![])
            .await
            .map(|_| ()),
        b.pause_schedule("mine").await.map(|_| ()),
        b.delete_schedule("mine").await.map(|_| ()),
    ];
    for refused in refusals {
        let err = refused.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("mine") && text.contains("workflow-steps") && text.contains("other"),
            "{text}"
        );
    }
    let wb = b.spawn(std::future::pending::<()>());
    clock.advance(HOUR);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tb.jobs().is_empty(), "the other queue's worker fired it");
    let wa = a.spawn(std::future::pending::<()>());
    eventually("the owner fires the tick", || async {
        !ta.runs_of("mine").is_empty()
    })
    .await;
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert_eq!(ta.runs_of("mine").len(), 1);
}

/// A parent that starts `n` children in its first step (input `fan:{n}`)
/// and then waits for each in turn, succeeding with the sum of their
/// results; a child (input `child:{i}`) succeeds with `i`; `big:{bytes}`
/// starts one child succeeding with that many bytes and reports what the
/// parent got.
#[derive(Clone, Default)]
struct Fan;

impl StepRunner for Fan {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let payload = String::from_utf8_lossy(&step.payload).into_owned();
        let parts: Vec<&str> = payload.split(':').collect();
        let child_of = |i: usize| child_run_id(&step.run_id, &format!("c{i}")).unwrap();
        match parts.as_slice() {
            ["fan", n] => {
                let n: usize = n.parse().unwrap();
                for i in 0..n {
                    step.delivery
                        .children
                        .start(
                            &format!("c{i}"),
                            format!("child:{i}").into_bytes(),
                            RunOptions::default(),
                        )
                        .map_err(|e| StepError::permanent(e.to_string()))?;
                }
                Ok(StepOutcome::continue_on_child(
                    format!("wait:0:{n}:0").into_bytes(),
                    &child_of(0),
                    DAY,
                ))
            }
            ["wait", i, n, sum] => {
                let (i, n, mut sum): (usize, usize, u64) =
                    (i.parse().unwrap(), n.parse().unwrap(), sum.parse().unwrap());
                let end = ChildEnd::of_signal(step.signal.as_deref())
                    .map_err(|e| StepError::permanent(e.to_string()))?
                    .ok_or_else(|| StepError::permanent(format!("child {i} timed out")))?;
                if end.run_id != child_of(i) || end.status != TerminalStatus::Succeeded {
                    return Err(StepError::permanent(format!("child {i}: {end:?}")));
                }
                let got: u64 = String::from_utf8_lossy(&end.result.unwrap_or_default())
                    .parse()
                    .unwrap();
                sum += got;
                if i + 1 == n {
                    return Ok(StepOutcome::Succeed {
                        result: sum.to_string().into_bytes(),
                    });
                }
                Ok(StepOutcome::continue_on_child(
                    format!("wait:{}:{n}:{sum}", i + 1).into_bytes(),
                    &child_of(i + 1),
                    DAY,
                ))
            }
            ["child", i] => Ok(StepOutcome::Succeed {
                result: i.as_bytes().to_vec(),
            }),
            ["big", bytes] => {
                let child = step
                    .delivery
                    .children
                    .start(
                        "c0",
                        format!("blob:{bytes}").into_bytes(),
                        RunOptions::default(),
                    )
                    .map_err(|e| StepError::permanent(e.to_string()))?;
                Ok(StepOutcome::continue_on_child(b"got".to_vec(), &child, DAY))
            }
            ["blob", bytes] => Ok(StepOutcome::Succeed {
                result: vec![b'x'; bytes.parse().unwrap()],
            }),
            ["got"] => {
                let end = ChildEnd::of_signal(step.signal.as_deref())
                    .map_err(|e| StepError::permanent(e.to_string()))?
                    .ok_or_else(|| StepError::permanent("timed out"))?;
                Ok(StepOutcome::Succeed {
                    result: format!(
                        "{:?} {} {}",
                        end.status,
                        end.result.map_or(-1, |r| r.len() as i64),
                        end.error.unwrap_or_default()
                    )
                    .into_bytes(),
                })
            }
            _ => Err(StepError::permanent(format!("unknown payload {payload}"))),
        }
    }
}

/// "at most 100 children per step": a step starting all 100 commits them
/// with its settlement, and the parent reads every one's end.
#[tokio::test(start_paused = true)]
async fn a_step_starting_the_most_children_commits_them_all() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Fan)
        .max_concurrent_steps(16)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let n = taquba_workflow::children::MAX_CHILDREN_PER_STEP;
    runtime
        .submit(spec("fan", &format!("fan:{n}")))
        .await
        .unwrap();
    let end = within(600, runtime.wait(&rid("fan"))).await.unwrap();
    assert_eq!(
        end.termination.status,
        TerminalStatus::Succeeded,
        "{:?}",
        end.termination.error
    );
    assert_eq!(result_text(&end), ((0..n).sum::<usize>()).to_string());
    let details = runtime.view().run(&rid("fan")).await.unwrap().unwrap();
    assert_eq!(details.children.len(), n);
    // One more is refused naming its key.
    let handle = taquba_workflow::children::ChildrenHandle::detached(rid("x"));
    for i in 0..n {
        handle
            .start(&format!("k{i}"), Vec::new(), RunOptions::default())
            .unwrap();
    }
    let err = handle
        .start("one-more", Vec::new(), RunOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("one-more"), "{err}");
    worker.shutdown().await.unwrap();
}

/// A child result of exactly `MAX_CHILD_RESULT_LEN` bytes reaches the
/// parent whole; one byte more reaches it as `Succeeded` with no result and
/// an error pointing to `WorkflowView::outcome`.
#[tokio::test(start_paused = true)]
async fn a_child_result_at_and_over_the_limit_reaches_the_parent_as_documented() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Fan).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let max = taquba_workflow::children::MAX_CHILD_RESULT_LEN;
    runtime
        .submit(spec("at", &format!("big:{max}")))
        .await
        .unwrap();
    runtime
        .submit(spec("over", &format!("big:{}", max + 1)))
        .await
        .unwrap();
    let at = within(60, runtime.wait(&rid("at"))).await.unwrap();
    assert_eq!(result_text(&at), format!("Succeeded {max} "));
    let over = within(60, runtime.wait(&rid("over"))).await.unwrap();
    let said = result_text(&over);
    assert!(
        said.starts_with("Succeeded -1 ") && said.contains("WorkflowView::outcome"),
        "{said}"
    );
    let child = runtime.outcome(&rid("over--c0")).await.unwrap().unwrap();
    assert_eq!(child.result.map(|r| r.len()), Some(max + 1));
    worker.shutdown().await.unwrap();
}

/// "A child's end committed by a runtime that runs no worker (a client's
/// cancel of a child's waiting step) reaches the parent at the worker's
/// next maintenance round", also when the process died in between; and a
/// parent cancelled with no worker running has its children cancelled
/// first all the same.
#[tokio::test(start_paused = true)]
async fn ends_committed_without_a_worker_reach_the_parent_after_a_restart() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_queue(&store, 3, Duration::from_secs(5)).await;
    let kin = Kin::default();
    let runtime = workflow_builder(&queue, &store, &kin).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("w", "parent:c:hold")).await.unwrap();
    runtime.submit(spec("x", "parent:c:hold")).await.unwrap();
    until_exists_at("w's child holds", &runtime, "w--c", 1).await;
    until_exists_at("x's child holds", &runtime, "x--c", 1).await;
    until_step("w waits", &runtime, "w", 1).await;
    worker.shutdown().await.unwrap();
    // No worker: a client cancels one child, and another parent.
    assert!(runtime.cancel(&rid("w--c")).await.unwrap());
    assert!(within(30, runtime.cancel(&rid("x"))).await.unwrap());
    for id in ["x--c", "x"] {
        let end = runtime.wait(&rid(id)).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Cancelled, "{id}");
    }
    drop(runtime);
    close(queue).await;

    let queue = tokio_queue(&store, 3, Duration::from_secs(5)).await;
    let runtime = workflow_builder(&queue, &store, &kin).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(60, runtime.wait(&rid("w"))).await.unwrap();
    assert_eq!(result_text(&end), "cancelled:");
    assert_eq!(kin.step0_jobs("w--c").len(), 1);
    worker.shutdown().await.unwrap();
}

/// `cancel` of a parent with a child in flight, dropped after each number
/// of polls (a request handler whose client went away): the cancellation
/// completes on its own (child first, then the parent), or nothing was
/// requested and both keep running.
#[tokio::test(start_paused = true)]
async fn a_parents_cancel_dropped_at_any_await_completes_or_leaves_both_running() {
    use taquba_workflow_suite::testing::poll_then_drop;
    let mut n = 1;
    loop {
        let (queue, store, _clock) = memory_queue().await;
        let runtime = workflow_builder(&queue, &store, &Kin::default())
            .poll_interval(Duration::from_secs(3600))
            .build();
        let worker = runtime.spawn(std::future::pending::<()>());
        runtime.submit(spec("p", "parent:c:hold")).await.unwrap();
        until_exists_at("the child holds", &runtime, "p--c", 1).await;
        until_step("the parent waits", &runtime, "p", 1).await;
        let done = poll_then_drop(runtime.cancel(&rid("p")), n).await.is_some();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let state = |id: &'static str| {
            let runtime = runtime.clone();
            async move { runtime.status(&rid(id)).await.unwrap().unwrap().state }
        };
        let (parent, child) = (state("p").await, state("p--c").await);
        let ended = |s: &RunState| matches!(s, RunState::Terminated(_));
        assert!(
            ended(&parent) == ended(&child),
            "n = {n}: parent {parent:?}, child {child:?}"
        );
        if ended(&parent) {
            for id in ["p", "p--c"] {
                let end = runtime.wait(&rid(id)).await.unwrap();
                assert_eq!(
                    end.termination.status,
                    TerminalStatus::Cancelled,
                    "n = {n}: {id}"
                );
            }
        }
        worker.shutdown().await.unwrap();
        if done {
            break;
        }
        n += 1;
        assert!(n < 2_000, "the cancel never completed");
    }
}

/// "A key whose child is still active is not started again; one whose
/// child ended is started anew (a new run of the parent under its id, or
/// the key reused)": a later step of the parent starting the active key
/// again (with another input) gets the running child, whose end it reads;
/// a new run of the parent under its id starts the key anew and reads the
/// new child's end, not the old one's.
#[tokio::test(start_paused = true)]
async fn an_active_childs_key_is_not_started_again_an_ended_ones_is() {
    let calls: Calls = Arc::default();
    let runner = {
        let calls = calls.clone();
        FnRunner(move |step: Step| {
            let calls = calls.clone();
            async move {
                let payload = String::from_utf8_lossy(&step.payload).into_owned();
                calls.lock().unwrap().push((
                    step.run_id.to_string(),
                    step.step_number,
                    payload.clone(),
                ));
                let start = |input: &str| {
                    step.delivery
                        .children
                        .start("c", input.as_bytes().to_vec(), RunOptions::default())
                        .map_err(|e| StepError::permanent(e.to_string()))
                };
                let end = || {
                    ChildEnd::of_signal(step.signal.as_deref())
                        .map_err(|e| StepError::permanent(e.to_string()))
                };
                Ok(match payload.as_str() {
                    "start" => {
                        StepOutcome::continue_on_child(b"again".to_vec(), &start("hold")?, MINUTE)
                    }
                    "again" => {
                        assert!(end()?.is_none(), "the first wait times out");
                        StepOutcome::continue_on_child(b"final".to_vec(), &start("other")?, DAY)
                    }
                    "final" => StepOutcome::Succeed {
                        result: describe_end(end()?).into_bytes(),
                    },
                    "hold" => StepOutcome::continue_on_signal(
                        b"release".to_vec(),
                        format!("go:{}", step.run_id),
                        DAY,
                    ),
                    "release" => StepOutcome::Succeed {
                        result: format!("released at {}", step.step_number).into_bytes(),
                    },
                    other => StepOutcome::Succeed {
                        result: other.as_bytes().to_vec(),
                    },
                })
            }
        })
    };
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_queue(&store, 1, Duration::from_secs(30)).await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let child_inputs = |calls: &Calls| -> Vec<String> {
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(run, step, _)| run == "p--c" && *step == 0)
            .map(|(_, _, input)| input.clone())
            .collect()
    };
    runtime.submit(spec("p", "start")).await.unwrap();
    // The first wait times out after a minute; the parent waits again.
    tokio::time::sleep(2 * MINUTE).await;
    until_step("the parent waits again", &runtime, "p", 2).await;
    runtime.signal("go:p--c", Vec::new()).await.unwrap();
    let end = within(60, runtime.wait(&rid("p"))).await.unwrap();
    assert_eq!(result_text(&end), "succeeded:released at 1");
    assert_eq!(child_inputs(&calls), ["hold"], "started once");

    // A new run of the parent under its id: the key is started anew.
    let again = runtime.submit(spec("p", "start")).await.unwrap();
    assert!(again.newly_submitted);
    eventually("the new child holds", || async {
        runtime
            .status(&rid("p--c"))
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1 && !matches!(s.state, RunState::Terminated(_)))
    })
    .await;
    assert_eq!(child_inputs(&calls), ["hold", "hold"]);
    tokio::time::sleep(2 * MINUTE).await;
    until_step("the new parent waits again", &runtime, "p", 2).await;
    let status = runtime.status(&rid("p")).await.unwrap().unwrap();
    assert!(
        !matches!(status.state, RunState::Terminated(_)),
        "it did not read the old end"
    );
    runtime.signal("go:p--c", Vec::new()).await.unwrap();
    let end = within(60, runtime.wait(&rid("p"))).await.unwrap();
    assert_eq!(result_text(&end), "succeeded:released at 1");
    worker.shutdown().await.unwrap();
}
