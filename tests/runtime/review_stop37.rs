//! Review of two behaviours changed today, attacked at the public API:
//!
//! * `wait` / `wait_timeout` (and what is built on them) looking at an
//!   unchanged step less and less often while this runtime's worker runs:
//!   every kind of ending must still end a wait within a few poll
//!   intervals, in the worker's runtime and in a client's;
//! * a plain submission under a group member's run id answered as a
//!   duplicate while the member is active: it must leave the group whole.
//!
//! The wait tests run on paused time with a 100 ms poll interval (so the
//! backed-off look is 1.6 s apart): several runs end at one moment, each
//! with its own wait started 400 ms after the previous one, so a wait that
//! is only ended by its own backed-off look shows a delay far over the
//! bound (5 poll intervals) for one of them at least.

use crate::common::*;
use crate::fixtures::{HOUR, Scripted, spec};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::TryStreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{Claim, JobStatus, MockClock, Queue, QueueConfig, SettlementEffects};
use taquba_workflow::{
    Error, NoopTerminalHook, RunEnd, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalHook, TerminalStatus, WorkflowRuntime,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The poll interval of every runtime here.
const POLL: Duration = Duration::from_millis(100);
/// How late after a run's end its wait may end: a few poll intervals.
const PROMPT: Duration = Duration::from_millis(500);
/// The gap between the starts of the waits on the runs of one scenario.
const STAGGER: Duration = Duration::from_millis(400);
/// Long enough for every wait to have backed off to its longest sleep
/// (1.6 s: 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of looks at one step).
const BACKED_OFF: Duration = Duration::from_secs(5);

/// Scripted, but `late:<ms>:<then>` sleeps `<ms>` in step 0 first, then
/// does what `<then>` says: `child` starts child `c` (input `ok`) and waits
/// for it; anything else is the Scripted input. `coop` runs until its
/// cancellation reaches it.
#[derive(Clone, Default)]
struct Probe {
    inner: Scripted,
}

impl StepRunner for Probe {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number == 0 && input == "coop" {
            // Runs until the step's cancellation reaches it.
            step.cancel_token.cancelled().await;
            return Err(StepError::transient("interrupted"));
        }
        if step.step_number == 0
            && let Some(rest) = input.strip_prefix("late:")
        {
            let (ms, then) = rest.split_once(':').expect("late:<ms>:<then>");
            let ms: u64 = ms.parse().expect("ms");
            tokio::time::sleep(Duration::from_millis(ms)).await;
            if then == "child" {
                let child = step
                    .delivery
                    .children
                    .start("c", b"ok".to_vec(), RunOptions::default())
                    .map_err(|e| StepError::permanent(e.to_string()))?;
                return Ok(StepOutcome::continue_on_child(
                    b"await".to_vec(),
                    &child,
                    HOUR,
                ));
            }
            let mut inner = step.clone();
            inner.payload = then.as_bytes().to_vec();
            return self.inner.run_step(&inner).await;
        }
        self.inner.run_step(step).await
    }
}

type ProbeRuntime = WorkflowRuntime<Probe, NoopTerminalHook>;

fn runtime(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>) -> ProbeRuntime {
    workflow_builder(queue, store, &Probe::default())
        .poll_interval(POLL)
        .build()
}

fn attempts(n: u32) -> RunOptions {
    RunOptions {
        max_attempts_per_step: Some(n),
        ..Default::default()
    }
}

async fn submit_opts(runtime: &ProbeRuntime, id: &str, input: &str, options: RunOptions) -> String {
    let out = runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: input.as_bytes().to_vec(),
            options,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(out.newly_submitted, "{id}");
    out.job_id
}

type TimedWait = JoinHandle<(Instant, taquba_workflow::Result<RunEnd>)>;

/// A wait on `runtime` for each of `ids`, the next one started `STAGGER`
/// after the previous; each reports when it ended.
async fn staggered_waits<R, H>(runtime: &WorkflowRuntime<R, H>, ids: &[&str]) -> Vec<TimedWait>
where
    R: StepRunner + 'static,
    H: TerminalHook + 'static,
{
    let mut waits = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(STAGGER).await;
        }
        let runtime = runtime.clone();
        let id = rid(id);
        waits.push(tokio::spawn(async move {
            let end = runtime.wait(&id).await;
            (Instant::now(), end)
        }));
    }
    waits
}

/// Every wait's end, asserting that none ended more than `PROMPT` after
/// `since` (the moment the runs ended).
async fn ended_promptly(waits: Vec<TimedWait>, since: Instant, what: &str) -> Vec<RunEnd> {
    let mut delays = Vec::new();
    let mut ends = Vec::new();
    for wait in waits {
        let (at, end) = within(120, wait).await.expect("the wait task");
        delays.push(at.saturating_duration_since(since));
        ends.push(end.unwrap_or_else(|err| panic!("{what}: the wait failed: {err}")));
    }
    assert!(
        delays.iter().all(|d| *d <= PROMPT),
        "{what}: waits ended {delays:?} after the runs ended (poll interval {POLL:?})"
    );
    ends
}

/// Poll (every 5 ms) until every job of `job_ids` is dead; the moment.
async fn all_dead(queue: &Queue, job_ids: &[String]) -> Instant {
    within(60, async {
        loop {
            let mut dead = 0;
            for id in job_ids {
                if let Some(job) = queue.view().job_record(id).await.unwrap()
                    && job.status == JobStatus::Dead
                {
                    dead += 1;
                }
            }
            if dead == job_ids.len() {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Poll (every 5 ms) until run `id` shows terminated; the moment.
async fn terminated_at(runtime: &ProbeRuntime, id: &str) -> Instant {
    within(60, async {
        loop {
            if matches!(
                runtime.status(&rid(id)).await.unwrap().map(|s| s.state),
                Some(RunState::Terminated(_))
            ) {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// Claim `n` step jobs of the default queue directly (as a foreign
/// consumer would), with `lease`.
async fn claim_n(queue: &Queue, name: &str, n: usize, lease: Duration) -> Vec<Claim> {
    let mut claims = Vec::new();
    for _ in 0..n {
        claims.push(
            queue
                .claim(name, lease)
                .await
                .unwrap()
                .expect("a job to claim"),
        );
    }
    claims
}

const VICTIMS: [&str; 4] = ["v0", "v1", "v2", "v3"];
const OLD: [&str; 4] = ["old0", "old1", "old2", "old3"];

fn assert_failed(ends: &[RunEnd], error: &str, what: &str) {
    for end in ends {
        assert_eq!(end.termination.status, TerminalStatus::Failed, "{what}");
        assert_eq!(end.termination.error.as_deref(), Some(error), "{what}");
    }
}

// ---------------------------------------------------------------------------
// 1. Endings that must end a wait in the worker's runtime promptly.

/// Runs whose step a foreign consumer claimed and dead-letters while the
/// worker (and its maintenance) runs: the maintenance reconciles them
/// within a poll interval and that wakes the backed-off waits.
#[tokio::test(start_paused = true)]
async fn external_dead_letters_with_the_worker_running_end_backed_off_waits_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    for id in VICTIMS {
        submit_opts(&rt, id, "ok", attempts(1)).await;
    }
    let claims = claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    assert!(waits.iter().all(|w| !w.is_finished()));
    let since = Instant::now();
    for claim in &claims {
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "external dead letters").await;
    assert_failed(&ends, "foreign", "external dead letters");
    worker.shutdown().await.unwrap();
}

/// Runs whose last attempt outlives its lease on a foreign consumer: the
/// reaper dead-letters them, the maintenance reconciles them.
#[tokio::test(start_paused = true)]
async fn reaper_dead_letters_with_the_worker_running_end_backed_off_waits_promptly() {
    let (queue, store, clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let mut jobs = Vec::new();
    for id in VICTIMS {
        jobs.push(submit_opts(&rt, id, "ok", attempts(1)).await);
    }
    let _claims = claim_n(&queue, STEPS, 4, Duration::from_secs(30)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    clock.advance(Duration::from_secs(31));
    let since = all_dead(&queue, &jobs).await;
    let ends = ended_promptly(waits, since, "reaped").await;
    assert_failed(&ends, "lease expired", "reaped");
    worker.shutdown().await.unwrap();
}

/// The queue's dead retention is an ordinary setting: with it, one reaper
/// pass dead-letters the expired claims and removes as many old dead jobs,
/// so the queue's dead count is unchanged. The maintenance, which looks
/// for foreign dead letters only when that count grew, then leaves the
/// runs active, and each wait ends only at its own backed-off look (up to
/// 16 poll intervals late) instead of within a poll interval or two.
#[tokio::test(start_paused = true)]
async fn reaper_dead_letters_offset_by_dead_retention_end_waits_promptly() {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            options(&clock).queue_config(
                STEPS,
                QueueConfig::default()
                    .retry_backoff_base(Duration::ZERO)
                    .max_attempts(1)
                    .dead_retention(Duration::from_secs(30)),
            ),
        )
        .await
        .unwrap(),
    );
    let rt = runtime(&queue, &store);
    for id in OLD {
        submit_opts(&rt, id, "ok", attempts(1)).await;
    }
    let mut jobs = Vec::new();
    for id in VICTIMS {
        jobs.push(submit_opts(&rt, id, "ok", attempts(1)).await);
    }
    // Old runs dead-lettered at T0 (they expire from the dead letters at
    // T0 + 30 s); the victims claimed with a 30 s lease at T0.
    for claim in claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await {
        queue.dead_letter(&claim, "old").await.unwrap();
    }
    let _claims = claim_n(&queue, STEPS, 4, Duration::from_secs(30)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    for id in OLD {
        until_terminated("the old runs reconciled", &rt, id).await;
    }
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    clock.advance(Duration::from_secs(31));
    let since = all_dead(&queue, &jobs).await;
    let ends = ended_promptly(waits, since, "reaped beside dead retention").await;
    assert_failed(&ends, "lease expired", "reaped beside dead retention");
    worker.shutdown().await.unwrap();
}

/// A foreign tool revives old dead jobs (`Queue::requeue_dead_job`, which
/// the worker then dead-letters again as steps of ended runs) while it
/// dead-letters the steps it holds: the dead count grows only by the
/// worker's own dead letters, so the maintenance leaves the runs active
/// and each wait ends only at its own backed-off look.
#[tokio::test(start_paused = true)]
async fn external_dead_letters_offset_by_revived_dead_jobs_end_waits_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let mut old_jobs = Vec::new();
    for id in OLD {
        old_jobs.push(submit_opts(&rt, id, "ok", attempts(1)).await);
    }
    for id in VICTIMS {
        submit_opts(&rt, id, "ok", attempts(1)).await;
    }
    for claim in claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await {
        queue.dead_letter(&claim, "old").await.unwrap();
    }
    let claims = claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    for id in OLD {
        until_terminated("the old runs reconciled", &rt, id).await;
    }
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    let since = Instant::now();
    for (old, claim) in old_jobs.iter().zip(&claims) {
        queue.requeue_dead_job(old).await.unwrap();
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "dead letters beside revivals").await;
    assert_failed(&ends, "foreign", "dead letters beside revivals");
    worker.shutdown().await.unwrap();
}

/// A step the worker itself dead-letters without ending its run (here: a
/// child whose derived run id a plain run holds, `ChildRunIdTaken`, found
/// when the step settles): the worker counts that dead letter as its own,
/// so the maintenance never reconciles the run, and only the wait's
/// backed-off look (or the maintenance's full pass every 120 rounds) ends
/// it.
#[tokio::test(start_paused = true)]
async fn a_step_the_worker_dead_letters_without_ending_its_run_ends_waits_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    // Plain runs holding each parent's child id.
    for id in VICTIMS {
        let child = taquba_workflow::children::child_run_id(&rid(id), "c").unwrap();
        rt.submit(RunSpec {
            run_id: Some(child.clone()),
            input: b"ok".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
        within(10, rt.wait(&child)).await.unwrap();
    }
    let mut jobs = Vec::new();
    for id in VICTIMS {
        jobs.push(submit_opts(&rt, id, "late:6000:child", attempts(1)).await);
    }
    let waits = staggered_waits(&rt, &VICTIMS).await;
    let since = all_dead(&queue, &jobs).await;
    let ends = ended_promptly(waits, since, "child id taken").await;
    for end in &ends {
        assert_eq!(end.termination.status, TerminalStatus::Failed);
        assert!(
            end.termination
                .error
                .as_deref()
                .is_some_and(|e| e.contains("taken")),
            "{:?}",
            end.termination.error
        );
    }
    worker.shutdown().await.unwrap();
}

/// Runs of another queue name over the same `Arc<Queue>` (a client
/// runtime's, whose steps a foreign consumer takes): the worker runtime's
/// maintenance reconciles only its own queue's dead letters, yet a wait on
/// the worker runtime backs off as if it covered them.
#[tokio::test(start_paused = true)]
async fn waits_on_the_worker_runtime_for_runs_of_another_queue_end_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let other = workflow_builder(&queue, &store, &Probe::default())
        .poll_interval(POLL)
        .queue_name("other-steps")
        .build();
    for id in VICTIMS {
        submit_opts(&other, id, "ok", attempts(1)).await;
    }
    let claims = claim_n(&queue, "other-steps", 4, Duration::from_secs(600)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    let since = Instant::now();
    for claim in &claims {
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "another queue's runs").await;
    assert_failed(&ends, "foreign", "another queue's runs");
    worker.shutdown().await.unwrap();
}

/// Waits pending when the worker shuts down: from then on nothing but the
/// waits' own looks reconciles a foreign dead letter, and they should
/// come every poll interval again ("while this runtime's worker runs").
/// The sleep a wait is in when the worker stops is its backed-off one.
#[tokio::test(start_paused = true)]
async fn waits_pending_across_a_worker_shutdown_notice_a_dead_letter_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    for id in VICTIMS {
        submit_opts(&rt, id, "ok", attempts(1)).await;
    }
    let claims = claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await;
    let worker = rt.spawn(std::future::pending::<()>());
    let waits = staggered_waits(&rt, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    worker.shutdown().await.unwrap();
    let since = Instant::now();
    for claim in &claims {
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "after the shutdown").await;
    assert_failed(&ends, "foreign", "after the shutdown");
}

/// Waits on a runtime whose worker shut down, while a new runtime over the
/// same queue runs the worker (an in-process restart): the new worker's
/// maintenance reconciles a foreign dead letter and wakes them.
#[tokio::test(start_paused = true)]
async fn waits_on_the_old_runtime_after_a_worker_restart_end_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let old = runtime(&queue, &store);
    for id in VICTIMS {
        submit_opts(&old, id, "ok", attempts(1)).await;
    }
    let claims = claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await;
    let worker = old.spawn(std::future::pending::<()>());
    let waits = staggered_waits(&old, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    worker.shutdown().await.unwrap();
    let new = runtime(&queue, &store);
    let worker = new.spawn(std::future::pending::<()>());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let since = Instant::now();
    for claim in &claims {
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "after a restart").await;
    assert_failed(&ends, "foreign", "after a restart");
    worker.shutdown().await.unwrap();
}

/// Every ending the worker commits after a long step (success, permanent
/// error, `Fail` and `Cancel` verdicts, a panic, transient errors on every
/// attempt) wakes the waits at once, though their looks backed off.
#[tokio::test(start_paused = true)]
async fn endings_the_worker_commits_after_long_steps_wake_waits_at_once() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let cases = [
        ("ok", "late:6000:ok", 1, TerminalStatus::Succeeded),
        ("perm", "late:6000:perm", 1, TerminalStatus::Failed),
        ("verdict", "late:6000:verdict", 1, TerminalStatus::Failed),
        ("cancel", "late:6000:cancel", 1, TerminalStatus::Cancelled),
        ("panic", "late:6000:panic", 1, TerminalStatus::Failed),
        ("trans", "late:2000:trans", 3, TerminalStatus::Failed),
    ];
    for (id, input, n, _) in &cases {
        submit_opts(&rt, id, input, attempts(*n)).await;
    }
    let start = Instant::now();
    let worker = rt.spawn(std::future::pending::<()>());
    let ids: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let waits: Vec<TimedWait> = ids
        .iter()
        .map(|id| {
            let rt = rt.clone();
            let id = rid(id);
            tokio::spawn(async move {
                let end = rt.wait(&id).await;
                (Instant::now(), end)
            })
        })
        .collect();
    // Each run ends 6 s after the worker started (three attempts of 2 s
    // for `trans`); the waits' looks were then 1.6 s apart.
    let ends = ended_promptly(waits, start + Duration::from_secs(6), "worker endings").await;
    for ((id, _, _, status), end) in cases.iter().zip(&ends) {
        assert_eq!(end.termination.status, *status, "{id}");
    }
    worker.shutdown().await.unwrap();
}

/// Cancels from a client runtime over the same queue (built without a
/// worker) of a pending (scheduled), a running, a timer-waiting and a
/// signal-waiting run wake the worker runtime's backed-off waits at once.
#[tokio::test(start_paused = true)]
async fn cancels_from_a_client_runtime_wake_backed_off_waits_at_once() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let client = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    submit_opts(
        &rt,
        "pending",
        "ok",
        RunOptions {
            run_at: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(T0) + HOUR),
            ..Default::default()
        },
    )
    .await;
    submit_opts(&rt, "running", "coop", attempts(1)).await;
    submit_opts(&rt, "timer", "timer:3600000", attempts(1)).await;
    submit_opts(&rt, "signal", "signal:review-key", attempts(1)).await;
    until_step("the timer", &rt, "timer", 1).await;
    until_step("the signal wait", &rt, "signal", 1).await;
    let ids = ["pending", "running", "timer", "signal"];
    let waits = staggered_waits(&rt, &ids).await;
    tokio::time::sleep(BACKED_OFF).await;
    let since = Instant::now();
    let cancels: Vec<_> = ids
        .iter()
        .map(|id| {
            let client = client.clone();
            let id = rid(id);
            tokio::spawn(async move { client.cancel(&id).await })
        })
        .collect();
    let ends = ended_promptly(waits, since, "client cancels").await;
    for (id, cancel) in ids.iter().zip(cancels) {
        assert!(within(10, cancel).await.unwrap().unwrap(), "{id}");
    }
    for end in &ends {
        assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    }
    worker.shutdown().await.unwrap();
}

/// A timer firing and a signal arriving end runs whose waits backed off.
#[tokio::test(start_paused = true)]
async fn timers_firing_and_signals_arriving_end_backed_off_waits_at_once() {
    let (queue, store, clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    submit_opts(&rt, "timer", "timer:60000", attempts(1)).await;
    submit_opts(&rt, "signal", "signal:k-arrives", attempts(1)).await;
    until_step("the timer", &rt, "timer", 1).await;
    until_step("the signal wait", &rt, "signal", 1).await;
    let waits = staggered_waits(&rt, &["timer", "signal"]).await;
    tokio::time::sleep(BACKED_OFF).await;
    rt.signal("k-arrives", b"here".to_vec()).await.unwrap();
    let signalled = Instant::now();
    clock.advance(Duration::from_secs(61));
    // The queue promotes due timers once a second: the run ends then.
    let fired = terminated_at(&rt, "timer").await;
    let mut waits = waits.into_iter();
    let timer = ended_promptly(vec![waits.next().unwrap()], fired, "timer").await;
    let signal = ended_promptly(waits.collect(), signalled, "signal").await;
    let ends = [timer, signal].concat();
    assert_eq!(
        ends[0].outcome.as_ref().and_then(|o| o.result.clone()),
        Some(b"timed out".to_vec())
    );
    assert_eq!(
        ends[1].outcome.as_ref().and_then(|o| o.result.clone()),
        Some(b"here".to_vec())
    );
    worker.shutdown().await.unwrap();
}

/// `wait_timeout` returns at its deadline, not at the next backed-off
/// look; a zero timeout on an active run does not wait.
#[tokio::test(start_paused = true)]
async fn wait_timeout_returns_at_its_deadline_while_looks_are_backed_off() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    submit_opts(&rt, "long", "timer:3600000", attempts(1)).await;
    until_step("the timer", &rt, "long", 1).await;
    for timeout in [
        Duration::from_millis(3_250),
        Duration::from_millis(5_050),
        Duration::from_millis(7_777),
    ] {
        let started = Instant::now();
        let got = rt.wait_timeout(&rid("long"), timeout).await.unwrap();
        let took = started.elapsed();
        assert!(got.is_none());
        assert!(
            took >= timeout && took <= timeout + Duration::from_millis(20),
            "wait_timeout({timeout:?}) took {took:?}"
        );
    }
    let started = Instant::now();
    assert!(
        rt.wait_timeout(&rid("long"), Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(started.elapsed() <= Duration::from_millis(5));
    worker.shutdown().await.unwrap();
}

/// A client runtime (no worker in its core) waits with looks one poll
/// interval apart: a foreign dead letter with no worker anywhere, and the
/// ends another runtime's worker commits, end its waits promptly.
#[tokio::test(start_paused = true)]
async fn waits_on_a_client_runtime_notice_dead_letters_and_worker_ends_promptly() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let client = runtime(&queue, &store);
    for id in VICTIMS {
        submit_opts(&rt, id, "ok", attempts(1)).await;
    }
    let claims = claim_n(&queue, STEPS, 4, Duration::from_secs(600)).await;
    // No worker anywhere: only the client's own looks reconcile.
    let waits = staggered_waits(&client, &VICTIMS).await;
    tokio::time::sleep(BACKED_OFF).await;
    let since = Instant::now();
    for claim in &claims {
        queue.dead_letter(claim, "foreign").await.unwrap();
    }
    let ends = ended_promptly(waits, since, "client, no worker").await;
    assert_failed(&ends, "foreign", "client, no worker");

    // The worker runs in the other runtime: its commits wake the client.
    let worker = rt.spawn(std::future::pending::<()>());
    submit_opts(&rt, "late-ok", "late:6000:ok", attempts(1)).await;
    submit_opts(&rt, "late-perm", "late:6000:perm", attempts(1)).await;
    let start = Instant::now();
    let waits = staggered_waits(&client, &["late-ok", "late-perm"]).await;
    let ends = ended_promptly(waits, start + Duration::from_secs(6), "client, worker ends").await;
    assert_eq!(ends[0].termination.status, TerminalStatus::Succeeded);
    assert_eq!(ends[1].termination.status, TerminalStatus::Failed);
    worker.shutdown().await.unwrap();
}

/// Group results and a member's wait are woken by a group cancel and by
/// members ending after long steps; `forget` of a group with a running
/// member ends that member's wait.
#[tokio::test(start_paused = true)]
async fn group_results_are_woken_by_member_ends_cancel_and_forget() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("g-wake"));
    group
        .submit(
            vec![member("a", "late:6000:ok"), member("b", "timer:3600000")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let results = {
        let group = group.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            let mut stream = Box::pin(group.results().await.unwrap());
            while let Some(r) = stream.try_next().await.unwrap() {
                got.push((Instant::now(), r));
            }
            got
        })
    };
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cancel_at = Instant::now();
    assert_eq!(group.cancel().await.unwrap(), 1);
    let got = within(30, results).await.unwrap();
    assert_eq!(got.len(), 2);
    let a = got.iter().find(|(_, r)| r.key == "a").unwrap();
    let b = got.iter().find(|(_, r)| r.key == "b").unwrap();
    assert!(
        a.0 - started <= Duration::from_secs(6) + PROMPT,
        "{:?}",
        a.0 - started
    );
    assert!(b.0 - cancel_at <= PROMPT, "{:?}", b.0 - cancel_at);
    assert_eq!(b.1.termination.status, TerminalStatus::Cancelled);
    assert_eq!(b.1.run_id, member_run_id("g-wake", "b"));

    // forget ends a running member first: its wait ends at once.
    let other = rt.group(rid("g-forget"));
    other
        .submit(vec![member("x", "timer:3600000")], &RunOptions::default())
        .await
        .unwrap();
    let x = member_run_id("g-forget", "x");
    until_step("x waits on its timer", &rt, x.as_str(), 1).await;
    let waits = staggered_waits(&rt, &[x.as_str()]).await;
    tokio::time::sleep(BACKED_OFF).await;
    let since = Instant::now();
    other.forget().await.unwrap();
    let (at, end) = within(30, waits.into_iter().next().unwrap()).await.unwrap();
    // Ended (cancelled) or reported gone, but promptly.
    assert!(at - since <= PROMPT, "{:?}", at - since);
    if let Ok(end) = end {
        assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. Plain submissions under a group member's run id.

/// A plain submission of an active member's run id with the member's own
/// input (and other options, headers and effects of its own) is a
/// duplicate that commits nothing: the group's status, results, the
/// member's wait and outcome, a re-submission of the group and the refusal
/// once the member ended are as if it never happened.
#[tokio::test(start_paused = true)]
async fn a_duplicate_plain_submit_of_an_active_member_leaves_the_group_whole() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let rt = workflow_builder(&queue, &store, &probe)
        .poll_interval(POLL)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("g-dup"));
    let members = vec![member("a", "late:3000:ok"), member("b", "ok")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let a = member_run_id("g-dup", "a");
    let b = member_run_id("g-dup", "b");
    within(10, rt.wait(&b)).await.unwrap();
    let current = rt.status(&a).await.unwrap().unwrap();
    assert_eq!(current.state, RunState::Running);
    let dup = rt
        .submit(RunSpec {
            run_id: Some(a.clone()),
            input: b"late:3000:ok".to_vec(),
            options: RunOptions {
                headers: HashMap::from([("who".to_string(), "plain".to_string())]),
                priority: Some(9),
                max_attempts_per_step: Some(7),
                ..Default::default()
            },
            effects: SettlementEffects::default().kv_put(b"user/dup".to_vec(), b"x".to_vec()),
        })
        .await
        .unwrap();
    assert!(!dup.newly_submitted);
    assert_eq!(dup.run_id, a);
    assert!(!dup.job_id.is_empty());
    assert!(
        queue.view().kv_get(b"user/dup").await.unwrap().is_none(),
        "a duplicate commits nothing of its spec"
    );
    // Another input is refused naming the group.
    match rt.submit(spec(a.as_str(), "other")).await {
        Err(Error::GroupMemberRunId { group_id, key, .. }) => {
            assert_eq!((group_id.as_str(), key.as_str()), ("g-dup", "a"));
        }
        other => panic!("another input: {other:?}"),
    }
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending, status.succeeded), (2, 1, 1));
    let end = within(10, rt.wait(&a)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let outcome = end.outcome.expect("outcome");
    assert!(outcome.headers.is_empty(), "{:?}", outcome.headers);
    let results: Vec<_> = within(10, async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 2);
    for r in &results {
        assert_eq!(r.run_id, member_run_id("g-dup", &r.key));
        assert_eq!(r.termination.status, TerminalStatus::Succeeded);
    }
    let status = group.status().await.unwrap();
    assert_eq!((status.pending, status.succeeded), (0, 2));
    // The member ran once; re-submitting the group runs nothing again.
    group.submit(members, &RunOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(probe.inner.calls_of(a.as_str()), 1);
    // Ended: the same input is refused now.
    assert!(matches!(
        rt.submit(spec(a.as_str(), "late:3000:ok")).await,
        Err(Error::GroupMemberRunId { .. })
    ));
    worker.shutdown().await.unwrap();
}

/// After a duplicate plain submission, the member is still the group's:
/// a group cancel reaches it, results report it cancelled under its run
/// id, and `forget` frees the id.
#[tokio::test(start_paused = true)]
async fn cancel_and_forget_after_a_duplicate_plain_submit_treat_the_member_as_the_groups() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = runtime(&queue, &store);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("g-dup2"));
    group
        .submit(vec![member("a", "timer:3600000")], &RunOptions::default())
        .await
        .unwrap();
    let a = member_run_id("g-dup2", "a");
    until_step("a waits on its timer", &rt, a.as_str(), 1).await;
    let dup = rt.submit(spec(a.as_str(), "timer:3600000")).await.unwrap();
    assert!(!dup.newly_submitted);
    assert_eq!(group.cancel().await.unwrap(), 1);
    let results: Vec<_> = within(10, async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].run_id, a);
    assert_eq!(results[0].termination.status, TerminalStatus::Cancelled);
    assert_eq!(group.status().await.unwrap().cancelled, 1);
    // Resume runs it again as the member.
    group.resume(&RunOptions::default()).await.unwrap();
    until_step("a again", &rt, a.as_str(), 1).await;
    let again = rt.submit(spec(a.as_str(), "timer:3600000")).await.unwrap();
    assert!(!again.newly_submitted);
    assert_eq!(group.status().await.unwrap().pending, 1);
    group.forget().await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    let fresh = rt.submit(spec(a.as_str(), "ok")).await.unwrap();
    assert!(fresh.newly_submitted, "forget frees the member's run id");
    within(10, rt.wait(&a)).await.unwrap();
    worker.shutdown().await.unwrap();
}

/// Plain submissions under members' run ids racing the members' ends
/// (real time, many threads): with the member's input each is answered as
/// a duplicate or refused with `GroupMemberRunId`; with another input
/// each is refused with `GroupMemberRunId` ("the id is the group's,
/// whatever the input"); no plain run ever starts; the group ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_submits_racing_member_ends_answer_duplicate_or_group_member_run_id() {
    let (queue, store) = real_clock_queue().await;
    let probe = Probe::default();
    let rt = workflow_builder(&queue, &store, &probe)
        .poll_interval(Duration::from_millis(20))
        .max_concurrent_steps(16)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut wrong = Vec::new();
    // Four groups, one after the other: each member's end is one chance
    // for a submission to fall between its two reads.
    for round in 0..4 {
        let group_id = format!("g-race-{round}");
        let group = rt.group(rid(&group_id));
        let members: Vec<_> = (0..24)
            .map(|i| member(&format!("m{i}"), &format!("steps:{}", 5 + i * 3)))
            .collect();
        group
            .submit(members.clone(), &RunOptions::default())
            .await
            .unwrap();
        let mut hammers = Vec::new();
        for m in members.clone() {
            let rt = rt.clone();
            let group_id = group_id.clone();
            hammers.push(tokio::spawn(async move {
                let id = member_run_id(&group_id, &m.key);
                let input = String::from_utf8(m.input.clone()).unwrap();
                let mut wrong = Vec::new();
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while std::time::Instant::now() < deadline {
                    match rt.submit(spec(id.as_str(), &input)).await {
                        Ok(out) if !out.newly_submitted => {}
                        Err(Error::GroupMemberRunId { .. }) => {}
                        other => wrong.push(format!("same input: {other:?}")),
                    }
                    match rt.submit(spec(id.as_str(), "another input")).await {
                        Err(Error::GroupMemberRunId { .. }) => {}
                        other => wrong.push(format!("other input: {other:?}")),
                    }
                    if matches!(
                        rt.status(&id).await.unwrap().map(|s| s.state),
                        Some(RunState::Terminated(_))
                    ) {
                        break;
                    }
                }
                wrong
            }));
        }
        for hammer in hammers {
            wrong.extend(hammer.await.unwrap());
        }
        let results: Vec<_> = tokio::time::timeout(Duration::from_secs(30), async {
            group.results().await?.try_collect::<Vec<_>>().await
        })
        .await
        .unwrap()
        .unwrap();
        assert_each_member_once(&results, &members);
        for r in &results {
            assert_eq!(r.run_id, member_run_id(&group_id, &r.key));
            assert_eq!(r.termination.status, TerminalStatus::Succeeded, "{}", r.key);
        }
        assert_eq!(group.status().await.unwrap().succeeded, members.len());
        for m in &members {
            let id = member_run_id(&group_id, &m.key);
            let step0 = probe
                .inner
                .calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(r, s)| r == id.as_str() && *s == 0)
                .count();
            assert_eq!(step0, 1, "{}", m.key);
        }
    }
    worker.shutdown().await.unwrap();
    assert!(
        wrong.is_empty(),
        "{} wrong answers: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}

fn assert_each_member_once(
    results: &[taquba_workflow::MemberResult],
    members: &[taquba_workflow::GroupMember],
) {
    let mut keys: Vec<&str> = results.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    let mut expected: Vec<&str> = members.iter().map(|m| m.key.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(keys, expected);
}
