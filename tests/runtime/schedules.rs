//! Schedules at the public API: a scheduled run fires on virtual time in
//! the test kit (cron in a zone, fixed interval); the catch-up policies
//! after a downtime (skip, one, all and its bound); pause, resume, change
//! and delete; bad input refused naming the value; a crash at every await
//! of the firing round (each commit boundary included) neither loses nor
//! doubles a tick; two runtimes of one queue over one store fire each tick
//! once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taquba::{Clock, MockClock, Queue};
use taquba_workflow::schedule::{CatchUp, MAX_CATCH_UP_TICKS, ScheduleSpec, tick_run_id};
use taquba_workflow::testing::{TEST_EPOCH_MS, TestRuntime};
use taquba_workflow::{
    Error, NoopTerminalHook, RunOptions, Step, StepError, StepOutcome, StepRunner, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{drop_at_each_poll, no_setup, poll_then_drop};

use crate::common::options;

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const HOUR_MS: u64 = 3_600_000;

/// One runner call: the run, its step job, its input.
type Call = (String, String, Vec<u8>);

/// A one-step runner that records every call; it succeeds with the input.
#[derive(Clone, Default)]
struct Ticks {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Ticks {
    /// The runs called, in call order (repeats removed).
    fn runs(&self) -> Vec<String> {
        let mut seen = BTreeSet::new();
        self.calls()
            .into_iter()
            .filter(|(run, _, _)| seen.insert(run.clone()))
            .map(|(run, _, _)| run)
            .collect()
    }

    /// Each run's distinct step-0 jobs: a run started twice under one id
    /// has two.
    fn jobs_by_run(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut jobs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (run, job, _) in self.calls() {
            jobs.entry(run).or_default().insert(job);
        }
        jobs
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls lock").clone()
    }
}

impl StepRunner for Ticks {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.lock().expect("calls lock").push((
            step.delivery.run_id.to_string(),
            step.delivery.job_id.clone(),
            step.payload.clone(),
        ));
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

fn tick_id(name: &str, tick_ms: u64) -> String {
    tick_run_id(name, tick_ms)
        .expect("valid tick run id")
        .to_string()
}

#[tokio::test(start_paused = true)]
async fn a_scheduled_run_fires_on_virtual_time() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    // TEST_EPOCH_MS is 22:13:20 UTC: the next tick of every 10 minutes is
    // 22:20:00, 6 min 40 s later.
    let first = TEST_EPOCH_MS + 400_000;
    let info = runtime
        .schedule(
            "report",
            ScheduleSpec::cron("*/10 * * * *").unwrap(),
            b"r".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(info.next_fire_ms, Some(first));
    assert_eq!(
        info.next_fire_utc().as_deref(),
        Some("2023-11-14T22:20:00Z")
    );

    assert_eq!(
        env.advance(Duration::from_millis(399_999)).await.unwrap(),
        0
    );
    assert_eq!(
        env.advance(Duration::from_millis(1)).await.unwrap(),
        1,
        "the tick fired"
    );
    assert_eq!(env.runner().runs(), [tick_id("report", first)]);
    let run = runtime.view().schedule("report").await.unwrap().unwrap();
    assert_eq!(run.fired, 1);
    assert_eq!(run.last_fired_ms, Some(first));
    assert_eq!(
        run.last_run_id.as_deref(),
        Some(tick_id("report", first).as_str())
    );
    assert_eq!(run.next_fire_ms, Some(first + 600_000));
    let outcome = runtime
        .outcome(&tick_run_id("report", first).unwrap())
        .await
        .unwrap()
        .expect("the tick's run ended");
    assert_eq!(outcome.result.as_deref(), Some(&b"r"[..]));

    // An hour more: the six ticks of the hour, each at its own time.
    assert_eq!(env.advance(HOUR).await.unwrap(), 6);
    let expected: Vec<String> = (0..7)
        .map(|k| tick_id("report", first + k * 600_000))
        .collect();
    assert_eq!(env.runner().runs(), expected);

    // A fixed interval counts from its creation.
    let created = env.now_ms();
    runtime
        .schedule(
            "sweep",
            ScheduleSpec::every(15 * MINUTE).unwrap(),
            b"s".to_vec(),
        )
        .await
        .unwrap();
    env.advance(HOUR).await.unwrap();
    let sweeps: Vec<String> = env
        .runner()
        .runs()
        .into_iter()
        .filter(|run| run.starts_with("schedule-sweep-"))
        .collect();
    let expected: Vec<String> = (1..=4)
        .map(|k| tick_id("sweep", created + k * 15 * 60_000))
        .collect();
    assert_eq!(sweeps, expected);
}

#[tokio::test(start_paused = true)]
async fn a_cron_expression_fires_in_its_time_zone() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let spec = ScheduleSpec::cron("0 9 * * *")
        .unwrap()
        .in_zone("America/New_York")
        .unwrap();
    let info = runtime.schedule("morning", spec, vec![]).await.unwrap();
    // 09:00 EST on 2023-11-15 is 14:00 UTC.
    assert_eq!(
        info.next_fire_utc().as_deref(),
        Some("2023-11-15T14:00:00Z")
    );
    assert_eq!(
        info.next_fire_local().as_deref(),
        Some("2023-11-15T09:00:00-05:00")
    );
    assert_eq!(info.spec.zone(), Some("America/New_York"));
    let due = info.next_fire_ms.unwrap();
    env.advance(Duration::from_millis(due - env.now_ms()))
        .await
        .unwrap();
    assert_eq!(env.runner().runs(), [tick_id("morning", due)]);
}

#[tokio::test(start_paused = true)]
async fn catch_up_policies_after_a_downtime() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let start = env.now_ms();
    for (name, policy) in [
        ("skip", CatchUp::Skip),
        ("one", CatchUp::One),
        ("all", CatchUp::All),
    ] {
        let spec = ScheduleSpec::every(HOUR).unwrap().catch_up(policy);
        runtime.schedule(name, spec, vec![]).await.unwrap();
    }
    assert_eq!(
        runtime
            .view()
            .schedule("one")
            .await
            .unwrap()
            .unwrap()
            .spec
            .catch_up_policy(),
        CatchUp::One
    );
    // Down for 5 h 30 min: no worker runs while the clock moves.
    env.clock().advance(5 * HOUR + 30 * MINUTE);
    env.run_until_idle().await.unwrap();
    let ticks = |name: &str| -> Vec<String> {
        env.runner()
            .runs()
            .into_iter()
            .filter(|run| run.starts_with(&format!("schedule-{name}-")))
            .collect()
    };
    assert!(
        ticks("skip").is_empty(),
        "skip fires none of the missed ticks"
    );
    assert_eq!(
        ticks("one"),
        [tick_id("one", start + 5 * HOUR_MS)],
        "one fires the latest"
    );
    let all: Vec<String> = (1..=5)
        .map(|k| tick_id("all", start + k * HOUR_MS))
        .collect();
    assert_eq!(ticks("all"), all, "all fires each, oldest first");
    for name in ["skip", "one", "all"] {
        let info = runtime.view().schedule(name).await.unwrap().unwrap();
        assert_eq!(info.next_fire_ms, Some(start + 6 * HOUR_MS), "{name}");
    }
    // Back on time: each fires its next tick once.
    env.advance(30 * MINUTE).await.unwrap();
    for name in ["skip", "one", "all"] {
        assert_eq!(
            ticks(name).last(),
            Some(&tick_id(name, start + 6 * HOUR_MS)),
            "{name}"
        );
    }
    assert_eq!(ticks("skip").len(), 1);
    assert_eq!(ticks("one").len(), 2);
    assert_eq!(ticks("all").len(), 6);
}

#[tokio::test(start_paused = true)]
async fn catch_up_all_is_bounded() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let start = env.now_ms();
    let spec = ScheduleSpec::every(MINUTE).unwrap().catch_up(CatchUp::All);
    runtime.schedule("often", spec, vec![]).await.unwrap();
    env.clock().advance(150 * MINUTE);
    env.run_until_idle().await.unwrap();
    let expected: Vec<String> = (51..=150)
        .map(|k| tick_id("often", start + k * 60_000))
        .collect();
    assert_eq!(expected.len(), MAX_CATCH_UP_TICKS);
    assert_eq!(env.runner().runs(), expected, "the latest 100 missed ticks");
}

#[tokio::test(start_paused = true)]
async fn pause_resume_change_and_delete() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let start = env.now_ms();
    runtime
        .schedule("job", ScheduleSpec::every(HOUR).unwrap(), b"v1".to_vec())
        .await
        .unwrap();
    let paused = runtime.pause_schedule("job").await.unwrap();
    assert!(paused.paused);
    assert_eq!(paused.next_fire_ms, None);
    assert!(
        runtime.pause_schedule("job").await.unwrap().paused,
        "twice is once"
    );
    env.advance(3 * HOUR + 30 * MINUTE).await.unwrap();
    assert!(env.runner().runs().is_empty(), "no tick fires while paused");

    // Resumed, it fires at its next tick after now (the paused-over ticks
    // are not caught up), with the input as changed meanwhile.
    runtime
        .schedule("job", ScheduleSpec::every(HOUR).unwrap(), b"v2".to_vec())
        .await
        .unwrap();
    assert!(
        runtime
            .view()
            .schedule("job")
            .await
            .unwrap()
            .unwrap()
            .paused,
        "a change keeps the pause"
    );
    let resumed = runtime.resume_schedule("job").await.unwrap();
    assert_eq!(resumed.next_fire_ms, Some(start + 4 * HOUR_MS));
    env.advance(30 * MINUTE).await.unwrap();
    let calls = env.runner().calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, tick_id("job", start + 4 * HOUR_MS));
    assert_eq!(calls[0].2, b"v2");

    // A changed timer counts from the change.
    let changed_at = env.now_ms();
    let changed = runtime
        .schedule(
            "job",
            ScheduleSpec::every(10 * MINUTE).unwrap(),
            b"v3".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(changed.next_fire_ms, Some(changed_at + 600_000));
    assert_eq!(changed.fired, 1, "what it fired is kept");

    // Deleted, it fires no more; its runs stay.
    assert!(runtime.delete_schedule("job").await.unwrap());
    assert!(!runtime.delete_schedule("job").await.unwrap());
    env.advance(HOUR).await.unwrap();
    assert_eq!(env.runner().calls().len(), 1);
    assert!(runtime.view().schedules().await.unwrap().is_empty());
    assert!(matches!(
        runtime.pause_schedule("job").await,
        Err(Error::ScheduleNotFound(name)) if name == "job"
    ));
}

#[tokio::test(start_paused = true)]
async fn bad_input_is_refused_naming_the_value() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let every = || ScheduleSpec::every(HOUR).unwrap();
    let err = runtime
        .schedule("no spaces", every(), vec![])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("\"no spaces\"")),
        "{err}"
    );
    let err = ScheduleSpec::cron("0 25 * * *").unwrap_err();
    assert!(err.to_string().contains("\"0 25 * * *\""), "{err}");
    let err = ScheduleSpec::cron("0 9 * * *")
        .unwrap()
        .in_zone("Europe/Atlantis")
        .unwrap_err();
    assert!(err.to_string().contains("\"Europe/Atlantis\""), "{err}");
    let err = ScheduleSpec::every(Duration::ZERO).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("interval 0ns")),
        "{err}"
    );
    let reserved = RunOptions {
        headers: [("workflow.step".to_string(), "9".to_string())].into(),
        ..RunOptions::default()
    };
    let err = runtime
        .schedule_with("h", every(), vec![], reserved)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::ReservedHeaderInSubmit(h) if h == "workflow.step"),
        "{err}"
    );
    let delayed = RunOptions {
        run_at: Some(std::time::SystemTime::UNIX_EPOCH),
        ..RunOptions::default()
    };
    let err = runtime
        .schedule_with("d", every(), vec![], delayed)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("run_at"), "{err}");
    let err = runtime
        .schedule("big", every(), vec![0; taquba::MAX_KV_VALUE_SIZE])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidSchedule(m) if m.contains("\"big\"")),
        "{err}"
    );
    assert!(
        runtime.view().schedules().await.unwrap().is_empty(),
        "nothing was committed"
    );
}

/// For every n: a downtime leaves five ticks to catch up (`All`), the
/// round that fires them is dropped after n polls and the process crashes
/// (`kill -9`); after the restart every tick has fired exactly once: one
/// run per tick, started once (one step-0 job), none lost.
#[tokio::test(start_paused = true)]
async fn a_crash_at_every_await_of_a_firing_round_neither_loses_nor_doubles_a_tick() {
    let mut n = 1;
    loop {
        let env = TestRuntime::new(Ticks::default()).await.unwrap();
        let start = env.now_ms();
        let spec = ScheduleSpec::every(HOUR).unwrap().catch_up(CatchUp::All);
        env.runtime()
            .unwrap()
            .schedule("tick", spec, vec![])
            .await
            .unwrap();
        env.clock().advance(5 * HOUR + 30 * MINUTE);
        let completed = poll_then_drop(env.run_until_idle(), n).await.is_some();
        env.crash().await.unwrap();
        // Past the lease of a step claimed at the crash, well before the
        // next tick.
        env.run_to_completion().await.unwrap();
        env.run_until_idle().await.unwrap();

        let expected: BTreeSet<String> = (1..=5)
            .map(|k| tick_id("tick", start + k * HOUR_MS))
            .collect();
        let jobs = env.runner().jobs_by_run();
        assert_eq!(
            jobs.keys().cloned().collect::<BTreeSet<_>>(),
            expected,
            "n = {n}"
        );
        for (run, jobs) in &jobs {
            assert_eq!(jobs.len(), 1, "n = {n}: {run} started more than once");
        }
        let runtime = env.runtime().unwrap();
        let info = runtime.view().schedule("tick").await.unwrap().unwrap();
        assert_eq!(info.fired, 5, "n = {n}");
        assert_eq!(info.next_fire_ms, Some(start + 6 * HOUR_MS), "n = {n}");
        for run in &expected {
            let run_id = run.parse().unwrap();
            assert!(
                runtime.outcome(&run_id).await.unwrap().is_some(),
                "n = {n}: {run}"
            );
        }
        if completed {
            // The round spread over many awaits: the drops fell between
            // its commits, not only before the first.
            assert!(n > 5, "completed after {n} polls");
            break;
        }
        n += 1;
        assert!(n < 5_000, "the round never completed on its own");
    }
}

/// `schedule` dropped at each await (a request handler whose client went
/// away): the schedule is written whole, once, and fires once per tick.
#[tokio::test(start_paused = true)]
async fn a_schedule_call_dropped_at_any_await_is_written_whole() {
    let env = TestRuntime::new(Ticks::default()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let created_at = env.now_ms();
    let last = drop_at_each_poll(
        50,
        no_setup,
        |n| {
            let runtime = runtime.clone();
            async move {
                let name = format!("s{n}");
                let spec = ScheduleSpec::every(HOUR).unwrap();
                runtime.schedule(&name, spec, vec![0]).await
            }
        },
        |n, _| {
            let runtime = runtime.clone();
            async move {
                // The call ran on, detached: the record is there, whole.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let info = runtime
                    .view()
                    .schedule(&format!("s{n}"))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("s{n} was lost"));
                assert_eq!(info.input_len, 1);
                assert_eq!(info.next_fire_ms, Some(created_at + HOUR_MS));
            }
        },
    )
    .await;
    env.advance(HOUR).await.unwrap();
    let jobs = env.runner().jobs_by_run();
    assert_eq!(jobs.len(), last, "one run per schedule");
    assert!(jobs.values().all(|jobs| jobs.len() == 1));
}

/// Two runtimes of one queue over one store (one process) race for every
/// tick: the schedule record's compare-and-commit lets one of them fire
/// it, so each tick has one run.
#[tokio::test(start_paused = true)]
async fn two_runtimes_over_one_store_fire_each_tick_once() {
    let clock = MockClock::new(TEST_EPOCH_MS);
    let store = Arc::new(taquba::object_store::memory::InMemory::new());
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "q", options(&clock))
            .await
            .unwrap(),
    );
    let runner = Ticks::default();
    let build = || {
        WorkflowRuntime::builder(
            queue.clone(),
            store.clone(),
            runner.clone(),
            NoopTerminalHook,
        )
        .poll_interval(Duration::from_millis(5))
        .build()
    };
    let (a, b) = (build(), build());
    let start = clock.now_ms();
    a.schedule(
        "both",
        ScheduleSpec::every(Duration::from_secs(1)).unwrap(),
        vec![],
    )
    .await
    .unwrap();
    let workers = [
        a.spawn(std::future::pending()),
        b.spawn(std::future::pending()),
    ];
    for _ in 0..20 {
        clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for worker in workers {
        worker.shutdown().await.unwrap();
    }
    let jobs = runner.jobs_by_run();
    let expected: BTreeSet<String> = (1..=20)
        .map(|k| tick_id("both", start + k * 1_000))
        .collect();
    assert_eq!(jobs.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(jobs.values().all(|jobs| jobs.len() == 1), "{jobs:?}");
    assert_eq!(a.view().schedule("both").await.unwrap().unwrap().fired, 20);
}
