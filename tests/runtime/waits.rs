//! Waiting for runs at the public API: `WorkflowRuntime::wait` and
//! `wait_timeout`, `JobHandle` awaits and group `results()`, woken in-process
//! by the commit that terminates a run (through a registry shared by every
//! runtime over one `Arc<Queue>`), with a poll of the current step that
//! reconciles a step the queue's reaper dead-lettered; and the group commit
//! of submissions under fresh run ids.
//!
//! Waiting runtimes are often given a poll interval of an hour: a wait on
//! them that ends within seconds of (paused) time was woken by the
//! terminating commit, not by its own poll.
//!
//! A zero timeout reports a run that already ended, and a wait pending
//! across an in-process restart of the worker gets the run's end.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use crate::fixtures::{Scripted, spec, tokio_clock_queue};
use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{MockClock, Queue, SettlementEffects};
use taquba_workflow::jobs::{Job, JobContext, JobError, JobRunner, JoinError};
use taquba_workflow::{
    Error, GroupMember, NoopTerminalHook, RunEnd, RunId, RunOptions, RunOutcome, RunSpec, RunState,
    RunTermination, Step, StepError, StepErrorKind, StepOutcome, StepRunner, TerminalHook,
    TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, Op};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A poll interval no test outlives: waits on a runtime with it end
/// promptly only when a terminating commit wakes them.
const HOUR: Duration = Duration::from_secs(3600);

/// A runner scripted by the run's input, counting its calls per run id:
///
/// * `steps:N` continues with the same payload until step `N`, then
///   succeeds with `{run_id}@{step}`;
/// * `gate` waits for the gate (or the step's cancellation, which it
///   reports as a transient error), then succeeds with `{run_id}@{step}`;
/// * `timer` sleeps an hour on a durable timer after step 0, then succeeds;
/// * `signal` waits for the signal named by the run id (an hour at most),
///   then succeeds with the signal's payload;
/// * `perm` fails permanently with `boom`; `panic` panics on every attempt;
/// * `fail` returns a `Fail` verdict, `cancel` a `Cancel` verdict;
/// * anything else succeeds at once with the input as its result.
#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<HashMap<String, u32>>>,
    gate: Gate,
}

impl Script {
    fn calls_of(&self, run_id: &str) -> u32 {
        self.calls
            .lock()
            .expect("calls lock")
            .get(run_id)
            .copied()
            .unwrap_or(0)
    }

    fn all_calls(&self) -> HashMap<String, u32> {
        self.calls.lock().expect("calls lock").clone()
    }
}

fn done(step: &Step) -> Result<StepOutcome, StepError> {
    Ok(StepOutcome::Succeed {
        result: format!("{}@{}", step.run_id, step.step_number).into_bytes(),
    })
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        *self
            .calls
            .lock()
            .expect("calls lock")
            .entry(step.run_id.to_string())
            .or_default() += 1;
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(n) = input.strip_prefix("steps:") {
            let last: u32 = n.parse().expect("a step count");
            if step.step_number < last {
                return Ok(StepOutcome::continue_now(step.payload.clone()));
            }
            return done(step);
        }
        match input.as_str() {
            "gate" => {
                tokio::select! {
                    () = self.gate.wait() => done(step),
                    () = step.cancel_token.cancelled() => Err(StepError::transient("interrupted")),
                }
            }
            "timer" if step.step_number == 0 => {
                Ok(StepOutcome::continue_after(step.payload.clone(), HOUR))
            }
            "signal" if step.step_number == 0 => Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                step.run_id.as_str(),
                HOUR,
            )),
            "signal" => Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"timed out".to_vec()),
            }),
            "perm" => Err(StepError::permanent("boom")),
            "panic" => panic!("kaboom in {}", step.run_id),
            "fail" => Ok(StepOutcome::Fail {
                reason: "nope".into(),
            }),
            "cancel" => Ok(StepOutcome::Cancel {
                reason: "changed my mind".into(),
            }),
            "timer" => done(step),
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }
}

/// The runner of runtimes that only submit, wait and cancel: never called.
#[derive(Clone)]
struct Idle;

impl StepRunner for Idle {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        panic!("no worker runs on this runtime, yet it ran {}", step.run_id)
    }
}

/// A runtime over `queue` that runs no worker, polling every `poll`.
fn waiter(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    poll: Duration,
) -> WorkflowRuntime<Idle, NoopTerminalHook> {
    WorkflowRuntime::builder(queue.clone(), store.clone(), Idle, NoopTerminalHook)
        .poll_interval(poll)
        .build()
}

/// Spawn `runtime.wait(id)`.
fn spawn_wait<R, H>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> JoinHandle<taquba_workflow::Result<RunEnd>>
where
    R: StepRunner + 'static,
    H: TerminalHook + 'static,
{
    let runtime = runtime.clone();
    let id = rid(id);
    tokio::spawn(async move { runtime.wait(&id).await })
}

/// Submit run `id` with `input` and `options`.
async fn submit_with<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    input: &str,
    options: RunOptions,
) {
    let submitted = runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: input.as_bytes().to_vec(),
            options,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(submitted.newly_submitted, "{id} is new");
}

fn tenant() -> HashMap<String, String> {
    HashMap::from([("tenant".to_string(), "acme".to_string())])
}

fn one_attempt() -> RunOptions {
    RunOptions {
        max_attempts_per_step: Some(1),
        ..Default::default()
    }
}

/// Await every wait in `waits`, within `secs` seconds in all.
async fn ends(secs: u64, waits: Vec<JoinHandle<taquba_workflow::Result<RunEnd>>>) -> Vec<RunEnd> {
    within(secs, async move {
        let mut ends = Vec::new();
        for wait in waits {
            ends.push(wait.await.expect("the wait task").expect("the wait"));
        }
        ends
    })
    .await
}

async fn terminated_as<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    end: &RunEnd,
) {
    let status = runtime.status(&rid(id)).await.unwrap().expect("known");
    assert_eq!(
        status.state,
        RunState::Terminated(end.termination.clone()),
        "{id}"
    );
    assert_eq!(status.current_step, end.termination.final_step, "{id}");
    assert_eq!(
        runtime.outcome(&rid(id)).await.unwrap(),
        end.outcome,
        "{id}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_before_the_submission_is_not_found_and_one_right_after_it_gets_the_end() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();

    match runtime.wait(&rid("early")).await {
        Err(Error::RunNotFound(id)) => assert_eq!(id, "early"),
        other => panic!("expected RunNotFound before the submission, got {other:?}"),
    }
    assert!(matches!(
        runtime
            .wait_timeout(&rid("early"), Duration::from_secs(5))
            .await,
        Err(Error::RunNotFound(_))
    ));

    submit_with(
        &runtime,
        "early",
        "steps:3",
        RunOptions {
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;
    let waiting = spawn_wait(&runtime, "early");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "no worker runs the run yet");

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(10, waiting).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 3);
    assert_eq!(end.termination.error, None);
    assert_eq!(end.termination.error_kind, None);
    assert_eq!(end.termination.terminated_at_ms, T0);
    assert_eq!(
        end.outcome,
        Some(RunOutcome {
            run_id: rid("early"),
            status: TerminalStatus::Succeeded,
            result: Some(b"early@3".to_vec()),
            error: None,
            headers: tenant(),
            final_step: 3,
        })
    );
    assert_eq!(script.calls_of("early"), 4);
    // A wait after the termination reads the same end from the records.
    assert_eq!(runtime.wait(&rid("early")).await.unwrap(), end);
    terminated_as(&runtime, "early", &end).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fresh_submission_is_waitable_as_soon_as_submit_returns() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = waiter(&queue, &store, HOUR);
    // Concurrent submissions under fresh ids are committed in batches: each
    // must be durable and visible when its `submit` returns, so a wait
    // started right then finds the run (no worker: it times out).
    let mut tasks = Vec::new();
    for i in 0..64 {
        let runtime = runtime.clone();
        tasks.push(tokio::spawn(async move {
            let submitted = runtime
                .submit(RunSpec {
                    input: format!("in-{i}").into_bytes(),
                    ..Default::default()
                })
                .await
                .unwrap();
            let waited = runtime
                .wait_timeout(&submitted.run_id, Duration::from_millis(20))
                .await;
            (submitted, waited)
        }));
    }
    let mut ids = HashSet::new();
    for task in tasks {
        let (submitted, waited) = within(30, task).await.unwrap();
        assert!(submitted.newly_submitted);
        assert!(
            matches!(waited, Ok(None)),
            "{}: {waited:?}",
            submitted.run_id
        );
        let status = runtime.status(&submitted.run_id).await.unwrap();
        assert_eq!(status.map(|s| s.state), Some(RunState::Pending));
        ids.insert(submitted.run_id);
    }
    assert_eq!(ids.len(), 64);
}

#[tokio::test(start_paused = true)]
async fn concurrent_waits_on_two_runtimes_all_get_the_same_end() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    // Another runtime over the same queue, with another runner type.
    let other = waiter(&queue, &store, HOUR);
    submit_with(
        &runtime,
        "crowd",
        "gate",
        RunOptions {
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;
    let worker = runtime.spawn(std::future::pending::<()>());
    eventually("the gated step to start", || async {
        script.calls_of("crowd") == 1
    })
    .await;

    // Waits that time out before the run ends, on both runtimes.
    for _ in 0..100 {
        let waited = other
            .wait_timeout(&rid("crowd"), Duration::from_millis(1))
            .await
            .unwrap();
        assert!(waited.is_none());
    }
    let mut timing_out = Vec::new();
    for i in 0..40 {
        let runtime = runtime.clone();
        let other = other.clone();
        timing_out.push(tokio::spawn(async move {
            let timeout = Duration::from_millis(100 + i);
            if i % 2 == 0 {
                runtime.wait_timeout(&rid("crowd"), timeout).await
            } else {
                other.wait_timeout(&rid("crowd"), timeout).await
            }
        }));
    }
    let mut waits = Vec::new();
    for i in 0..60 {
        waits.push(if i % 2 == 0 {
            spawn_wait(&runtime, "crowd")
        } else {
            spawn_wait(&other, "crowd")
        });
    }
    for task in timing_out {
        assert!(
            within(5, task).await.unwrap().unwrap().is_none(),
            "the run has not ended yet"
        );
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        waits.iter().all(|w| !w.is_finished()),
        "nothing ended a wait before the gate opened"
    );

    let opened = Instant::now();
    script.gate.open();
    let all = ends(10, waits).await;
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "the termination woke the waits ({:?})",
        opened.elapsed()
    );
    let first = all[0].clone();
    assert!(all.iter().all(|end| *end == first), "{all:?}");
    assert_eq!(first.termination.status, TerminalStatus::Succeeded);
    let outcome = first.outcome.clone().expect("recorded by the worker");
    assert_eq!(outcome.result.as_deref(), Some(b"crowd@0".as_slice()));
    assert_eq!(outcome.headers, tenant());
    // Waits started after the end, and timed ones, report it from the
    // records, equal to what the notified waits got.
    assert_eq!(runtime.wait(&rid("crowd")).await.unwrap(), first);
    assert_eq!(other.wait(&rid("crowd")).await.unwrap(), first);
    assert_eq!(
        other
            .wait_timeout(&rid("crowd"), Duration::ZERO)
            .await
            .unwrap(),
        Some(first.clone())
    );
    terminated_as(&other, "crowd", &first).await;
    assert_eq!(script.calls_of("crowd"), 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancel_of_a_waiting_step_wakes_waiters_on_another_runtime() {
    let (queue, store, clock) = memory_queue().await;
    let script = Script::default();
    let worker_runtime = workflow_builder(&queue, &store, &script).build();
    let canceller = waiter(&queue, &store, Duration::from_millis(50));
    let waiting_runtime = waiter(&queue, &store, HOUR);

    // `sleeping` waits on a durable timer at step 1.
    submit_with(&worker_runtime, "sleeping", "timer", RunOptions::default()).await;
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    until_step("the timer step", &worker_runtime, "sleeping", 1).await;
    worker.shutdown().await.unwrap();
    // `pending` is claimable, `scheduled` starts tomorrow; no worker runs.
    submit_with(&canceller, "pending", "ok", RunOptions::default()).await;
    submit_with(
        &canceller,
        "scheduled",
        "ok",
        RunOptions {
            run_at: Some(UNIX_EPOCH + Duration::from_millis(T0 + 86_400_000)),
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;

    let runs = [("pending", 0), ("scheduled", 0), ("sleeping", 1)];
    let mut waits = HashMap::new();
    for (id, _) in runs {
        let w: Vec<_> = (0..3).map(|_| spawn_wait(&waiting_runtime, id)).collect();
        waits.insert(id, w);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(waits.values().flatten().all(|w| !w.is_finished()));

    clock.advance(Duration::from_secs(7));
    for (id, final_step) in runs {
        let cancelled_at = Instant::now();
        assert!(canceller.cancel(&rid(id)).await.unwrap(), "{id}");
        let all = ends(5, waits.remove(id).unwrap()).await;
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(5),
            "{id}: the cancel woke the waits"
        );
        for end in &all {
            assert_eq!(end.termination.status, TerminalStatus::Cancelled, "{id}");
            assert_eq!(end.termination.error, None, "{id}");
            assert_eq!(end.termination.error_kind, None, "{id}");
            assert_eq!(end.termination.final_step, final_step, "{id}");
            assert_eq!(end.termination.terminated_at_ms, T0 + 7_000, "{id}");
            assert_eq!(end.outcome, None, "{id}: no worker recorded an outcome");
        }
        assert!(all.iter().all(|end| *end == all[0]));
        assert_eq!(waiting_runtime.wait(&rid(id)).await.unwrap(), all[0]);
        terminated_as(&worker_runtime, id, &all[0]).await;
        assert!(!canceller.cancel(&rid(id)).await.unwrap(), "{id}: ended");
    }
    assert_eq!(script.calls_of("pending"), 0);
    assert_eq!(script.calls_of("scheduled"), 0);
    assert_eq!(script.calls_of("sleeping"), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_of_a_running_step_from_another_runtime_wakes_the_waiters() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let worker_runtime = workflow_builder(&queue, &store, &script).build();
    let canceller = waiter(&queue, &store, Duration::from_millis(50));
    let waiting_runtime = waiter(&queue, &store, HOUR);
    submit_with(
        &worker_runtime,
        "busy",
        "gate",
        RunOptions {
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    eventually("the gated step to start", || async {
        script.calls_of("busy") == 1
    })
    .await;
    let waits = vec![
        spawn_wait(&waiting_runtime, "busy"),
        spawn_wait(&worker_runtime, "busy"),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The step honours its cancellation token, so the cancel needs no gate.
    let cancelled_at = Instant::now();
    let cancelled = within(10, canceller.cancel(&rid("busy"))).await.unwrap();
    assert!(cancelled);
    let all = ends(5, waits).await;
    assert!(cancelled_at.elapsed() < Duration::from_secs(5));
    assert_eq!(all[0], all[1]);
    let end = &all[0];
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    let outcome = end
        .outcome
        .clone()
        .expect("the worker recorded the outcome");
    assert_eq!(outcome.status, TerminalStatus::Cancelled);
    assert_eq!(outcome.headers, tenant());
    terminated_as(&waiting_runtime, "busy", end).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failures_and_runner_verdicts_wake_waiters_with_the_error() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let other = waiter(&queue, &store, HOUR);
    let runs = ["perm", "panic", "fail", "cancel"];
    for id in runs {
        submit_with(&runtime, id, id, RunOptions::default()).await;
    }
    let mut waits = HashMap::new();
    for id in runs {
        waits.insert(id, vec![spawn_wait(&other, id), spawn_wait(&runtime, id)]);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut got = HashMap::new();
    for id in runs {
        let all = ends(10, waits.remove(id).unwrap()).await;
        assert_eq!(all[0], all[1], "{id}");
        got.insert(id, all[0].clone());
    }
    assert!(started.elapsed() < Duration::from_secs(5));

    let perm = &got["perm"].termination;
    assert_eq!(perm.status, TerminalStatus::Failed);
    assert_eq!(perm.error.as_deref(), Some("boom"));
    assert_eq!(perm.error_kind, Some(StepErrorKind::Permanent));
    assert_eq!(
        script.calls_of("perm"),
        1,
        "a permanent error is not retried"
    );

    let panic = &got["panic"].termination;
    assert_eq!(panic.status, TerminalStatus::Failed);
    let message = panic.error.clone().unwrap_or_default();
    assert!(
        message.contains("panicked") && message.contains("kaboom in panic"),
        "{message}"
    );
    assert_eq!(panic.error_kind, Some(StepErrorKind::Transient));
    assert_eq!(script.calls_of("panic"), 3, "every attempt ran");

    let fail = &got["fail"].termination;
    assert_eq!(fail.status, TerminalStatus::Failed);
    assert_eq!(fail.error.as_deref(), Some("nope"));
    assert_eq!(fail.error_kind, Some(StepErrorKind::Permanent));

    let cancel = &got["cancel"].termination;
    assert_eq!(cancel.status, TerminalStatus::Cancelled);
    assert_eq!(cancel.error.as_deref(), Some("changed my mind"));
    assert_eq!(cancel.error_kind, None);

    for id in runs {
        let end = &got[id];
        let outcome = end.outcome.clone().expect("recorded by the worker");
        assert_eq!(outcome.status, end.termination.status, "{id}");
        assert_eq!(outcome.error, end.termination.error, "{id}");
        assert_eq!(outcome.result, None, "{id}");
        assert_eq!(outcome.final_step, 0, "{id}");
        assert_eq!(other.wait(&rid(id)).await.unwrap(), *end, "{id}");
        terminated_as(&runtime, id, end).await;
    }
    assert_eq!(dead_jobs(&queue).await.len(), 2, "perm and panic");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_the_reaper_dead_letters_ends_waits_on_every_runtime() {
    let (queue, store, clock) = memory_queue().await;
    let script = Script::default();
    // The worker's runtime reconciles dead letters only once an hour.
    let worker_runtime = workflow_builder(&queue, &store, &script)
        .poll_interval(HOUR)
        .build();
    let waiting_runtime = waiter(&queue, &store, Duration::from_millis(50));
    submit_with(
        &worker_runtime,
        "reaped",
        "ok",
        RunOptions {
            max_attempts_per_step: Some(1),
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;
    // A worker that claimed the step (60 s lease) and hung.
    let claim = claim_step(&queue).await.expect("the step job");
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    let polling = spawn_wait(&waiting_runtime, "reaped");
    let notified = spawn_wait(&worker_runtime, "reaped");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!polling.is_finished() && !notified.is_finished());

    clock.advance(Duration::from_secs(61));
    let expired = Instant::now();
    let end = within(30, polling).await.unwrap().unwrap();
    assert!(
        expired.elapsed() < Duration::from_secs(10),
        "the reaper runs every 5 s and the wait looks every 50 ms ({:?})",
        expired.elapsed()
    );
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("lease expired"));
    assert_eq!(end.termination.error_kind, None);
    assert_eq!(end.termination.final_step, 0);
    assert_eq!(end.termination.terminated_at_ms, T0 + 61_000);
    assert_eq!(end.outcome, None);
    // The worker runtime's own wait polls hourly: the reconciliation's
    // commit woke it.
    assert_eq!(within(5, notified).await.unwrap().unwrap(), end);
    assert_eq!(worker_runtime.wait(&rid("reaped")).await.unwrap(), end);
    terminated_as(&worker_runtime, "reaped", &end).await;
    assert_eq!(dead_jobs(&queue).await.len(), 1);
    assert!(
        queue.ack(&claim).await.is_err(),
        "the hung claim was reaped"
    );
    assert_eq!(script.calls_of("reaped"), 0);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_outliving_its_lease_on_the_worker_ends_the_wait_as_failed() {
    let clock = MockClock::new(T0);
    let (queue, store) =
        crate::fixtures::memory_queue_with_lease(&clock, STEPS, Duration::from_secs(10)).await;
    let script = Script::default();
    let worker_runtime = workflow_builder(&queue, &store, &script)
        .poll_interval(HOUR)
        .build();
    let waiting_runtime = waiter(&queue, &store, Duration::from_millis(50));
    submit_with(&worker_runtime, "stuck", "gate", one_attempt()).await;
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    eventually("the step to start", || async {
        script.calls_of("stuck") == 1
    })
    .await;
    let waits = vec![
        spawn_wait(&waiting_runtime, "stuck"),
        spawn_wait(&worker_runtime, "stuck"),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(waits.iter().all(|w| !w.is_finished()));

    clock.advance(Duration::from_secs(11));
    let expired = Instant::now();
    let all = ends(30, waits).await;
    assert!(expired.elapsed() < Duration::from_secs(10));
    assert_eq!(all[0], all[1]);
    let end = all[0].clone();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("lease expired"));
    assert_eq!(end.termination.error_kind, None);
    assert_eq!(end.outcome, None);

    // The runner returns late: its settlement finds the claim lost and
    // changes nothing the waits reported.
    script.gate.open();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(waiting_runtime.wait(&rid("stuck")).await.unwrap(), end);
    terminated_as(&worker_runtime, "stuck", &end).await;
    assert_eq!(script.calls_of("stuck"), 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waits_after_a_restart_report_runs_ended_before_and_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = MockClock::new(T0);
    let script = Script::default();

    let queue = open(&store, &clock).await;
    let runtime = workflow_builder(&queue, &store, &script).build();
    submit_with(
        &runtime,
        "before",
        "steps:2",
        RunOptions {
            headers: tenant(),
            ..Default::default()
        },
    )
    .await;
    let worker = runtime.spawn(std::future::pending::<()>());
    let before = within(10, runtime.wait(&rid("before"))).await.unwrap();
    assert_eq!(before.termination.status, TerminalStatus::Succeeded);
    assert!(before.outcome.is_some());
    worker.shutdown().await.unwrap();
    submit_with(&runtime, "after", "steps:3", RunOptions::default()).await;
    let fresh = runtime
        .submit(RunSpec {
            input: b"fresh".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    drop(runtime);
    close(queue).await;

    let queue = open(&store, &clock).await;
    let runtime = workflow_builder(&queue, &store, &script).build();
    assert_eq!(
        within(5, runtime.wait(&rid("before"))).await.unwrap(),
        before,
        "the end recorded before the restart"
    );
    let after = spawn_wait(&runtime, "after");
    let fresh_wait = {
        let runtime = runtime.clone();
        let id = fresh.run_id.clone();
        tokio::spawn(async move { runtime.wait(&id).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!after.is_finished() && !fresh_wait.is_finished());
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(10, after).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 3);
    assert_eq!(
        end.outcome.as_ref().and_then(|o| o.result.as_deref()),
        Some(b"after@3".as_slice())
    );
    let fresh_end = within(10, fresh_wait).await.unwrap().unwrap();
    assert_eq!(
        fresh_end.outcome.and_then(|o| o.result),
        Some(b"fresh".to_vec())
    );
    assert_eq!(script.calls_of("after"), 4);
    assert_eq!(script.calls_of("before"), 3);
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

#[tokio::test(start_paused = true)]
async fn a_termination_wakes_only_the_waiters_of_its_own_queue() {
    let (first_queue, first_store, _c1) = memory_queue().await;
    let (second_queue, second_store, _c2) = memory_queue().await;
    let script = Script::default();
    let first = workflow_builder(&first_queue, &first_store, &script).build();
    let second = waiter(&second_queue, &second_store, HOUR);
    submit_with(&first, "twin", "ok", RunOptions::default()).await;
    submit_with(&second, "twin", "ok", RunOptions::default()).await;
    let first_wait = spawn_wait(&first, "twin");
    let second_wait = spawn_wait(&second, "twin");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let worker = first.spawn(std::future::pending::<()>());
    let end = within(10, first_wait).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        !second_wait.is_finished(),
        "the run of the other queue has not ended"
    );
    assert_eq!(
        second.status(&rid("twin")).await.unwrap().map(|s| s.state),
        Some(RunState::Pending)
    );
    assert!(second.cancel(&rid("twin")).await.unwrap());
    let end = within(5, second_wait).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fast_polling_waits_follow_fast_moving_runs_to_their_end() {
    // Real time: each wait looks at the current step every millisecond
    // while the worker moves the pointer step after step.
    let (queue, store) = real_clock_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script)
        .max_concurrent_steps(16)
        .build();
    let polling = waiter(&queue, &store, Duration::from_millis(1));
    let ids: Vec<String> = (0..16).map(|i| format!("busy-{i}")).collect();
    for id in &ids {
        submit_with(&runtime, id, "steps:25", RunOptions::default()).await;
    }
    submit_with(&runtime, "signalled", "signal", RunOptions::default()).await;
    let mut waits = Vec::new();
    for id in &ids {
        for _ in 0..4 {
            waits.push((id.clone(), spawn_wait(&polling, id)));
        }
    }
    let signal_wait = spawn_wait(&polling, "signalled");
    let worker = runtime.spawn(std::future::pending::<()>());
    let results = tokio::time::timeout(Duration::from_secs(30), async move {
        let mut results = Vec::new();
        for (id, wait) in waits {
            results.push((id, wait.await.expect("wait task")));
        }
        results
    })
    .await
    .expect("the waits ended");
    for (id, result) in results {
        let end = result.unwrap_or_else(|err| panic!("{id}: {err}"));
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
        assert_eq!(end.termination.final_step, 25, "{id}");
    }
    // A run waiting on a signal for many polls stays waitable.
    eventually_real("the signal wait", || async {
        polling
            .status(&rid("signalled"))
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!signal_wait.is_finished());
    polling
        .signal("signalled", b"hello".to_vec())
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), signal_wait)
        .await
        .expect("the signalled run ended")
        .unwrap()
        .unwrap();
    assert_eq!(end.outcome.and_then(|o| o.result), Some(b"hello".to_vec()));
    worker.shutdown().await.unwrap();
}

/// [`eventually`] in real time (10 s at most).
async fn eventually_real<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..1_000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_concurrent_fresh_submissions_each_run_once_to_their_own_end() {
    const N: usize = 500;
    const NAMED: usize = 40;
    let (queue, store) = real_clock_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script)
        .max_concurrent_steps(64)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut tasks = Vec::new();
    for i in 0..N + NAMED {
        let runtime = runtime.clone();
        tasks.push(tokio::spawn(async move {
            let input = format!("in-{i}").into_bytes();
            // Runs under explicit ids with effects (not batched) interleave
            // with the fresh ones.
            let spec = if i >= N {
                RunSpec {
                    run_id: Some(rid(&format!("named-{i}"))),
                    input: input.clone(),
                    effects: SettlementEffects::default()
                        .kv_put(format!("app/{i}").into_bytes(), b"x".to_vec()),
                    ..Default::default()
                }
            } else {
                RunSpec {
                    input: input.clone(),
                    ..Default::default()
                }
            };
            let submitted = runtime.submit(spec).await.expect("submit");
            let end = runtime.wait(&submitted.run_id).await.expect("wait");
            (input, submitted, end)
        }));
    }
    let done = join_within(60, tasks, "every run ended").await;

    let mut run_ids = HashSet::new();
    let mut job_ids = HashSet::new();
    for (input, submitted, end) in &done {
        assert!(submitted.newly_submitted);
        assert!(
            run_ids.insert(submitted.run_id.to_string()),
            "{submitted:?}"
        );
        assert!(job_ids.insert(submitted.job_id.clone()), "{submitted:?}");
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        let outcome = end.outcome.as_ref().expect("recorded");
        assert_eq!(outcome.run_id, submitted.run_id);
        assert_eq!(
            outcome.result.as_ref(),
            Some(input),
            "{}: the run of this submission's input",
            submitted.run_id
        );
    }
    assert_eq!(run_ids.len(), N + NAMED);
    let calls = script.all_calls();
    assert_eq!(calls.len(), N + NAMED, "a call for every run, no other");
    for id in &run_ids {
        assert_eq!(calls.get(id), Some(&1), "{id} ran once");
    }
    for i in N..N + NAMED {
        let key = format!("app/{i}");
        assert!(
            queue.view().kv_get(key.as_bytes()).await.unwrap().is_some(),
            "{key}"
        );
    }
    worker.shutdown().await.unwrap();
}

/// Squares a number, counting its runs per number.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Square {
    n: u64,
}

#[derive(Clone, Default)]
struct Runs(Arc<Mutex<HashMap<u64, u32>>>);

#[derive(Debug, thiserror::Error)]
#[error("square error")]
struct SquareError;

impl Job for Square {
    const NAME: &'static str = "waits.square";
    type Output = u64;
    type Error = SquareError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u64, SquareError> {
        if let Some(runs) = ctx.try_state::<Runs>() {
            *runs.0.lock().expect("runs lock").entry(self.n).or_default() += 1;
        }
        Ok(self.n * self.n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hundreds_of_concurrent_job_submissions_each_resolve_to_their_own_output() {
    const N: u64 = 500;
    let (queue, store) = real_clock_queue().await;
    let runs = Runs::default();
    let worker_runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Square>()
        .state(runs.clone())
        .max_concurrent_jobs(64)
        .poll_interval(Duration::from_millis(50))
        .build();
    // Half the jobs are submitted and awaited through a runner that runs no
    // worker and polls hourly: their handles are woken by the worker's
    // commits.
    let submitter = JobRunner::builder(queue.clone(), store.clone())
        .register::<Square>()
        .poll_interval(HOUR)
        .build();
    let worker = worker_runner.spawn(std::future::pending::<()>());
    let mut tasks = Vec::new();
    for n in 0..N {
        let runner = if n % 2 == 0 {
            worker_runner.clone()
        } else {
            submitter.clone()
        };
        tasks.push(tokio::spawn(async move {
            let handle = runner.submit(Square { n }).await.expect("submit");
            assert!(handle.newly_submitted());
            let id = handle.id().clone();
            let output = handle.into_future().await.expect("the job's output");
            (n, id, output)
        }));
    }
    let done = join_within(60, tasks, "every job ended").await;
    let mut ids = HashSet::new();
    for (n, id, output) in done {
        assert_eq!(output, n * n, "job {id}");
        assert!(ids.insert(id));
    }
    assert_eq!(ids.len() as u64, N);
    let runs = runs.0.lock().expect("runs lock").clone();
    assert_eq!(runs.len() as u64, N);
    assert!(runs.values().all(|count| *count == 1), "{runs:?}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn group_results_and_job_joins_on_another_runner_are_woken_by_commits() {
    let (queue, store, _clock) = memory_queue().await;
    let worker_runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Square>()
        .poll_interval(Duration::from_millis(50))
        .build();
    let reader = JobRunner::builder(queue.clone(), store.clone())
        .register::<Square>()
        .poll_interval(HOUR)
        .build();

    let group = reader.group::<Square>(rid("squares"));
    group.submit((0..20).map(|n| Square { n })).await.unwrap();
    let handle = reader.submit(Square { n: 12 }).await.unwrap();
    let collected = {
        let group = group.clone();
        tokio::spawn(async move {
            let stream = group.results().await?;
            stream.try_collect::<Vec<_>>().await
        })
    };
    let joined = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.join_timeout(Duration::from_secs(600)).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!collected.is_finished() && !joined.is_finished());

    let started = Instant::now();
    let worker = worker_runner.spawn(std::future::pending::<()>());
    let results = within(30, collected).await.unwrap().unwrap();
    assert_eq!(
        within(5, joined).await.unwrap().unwrap().map(|r| r.ok()),
        Some(Some(144))
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let mut by_key: HashMap<String, u64> = HashMap::new();
    for result in results {
        let output = result.result.expect("a square");
        assert!(by_key.insert(result.key, output).is_none());
    }
    assert_eq!(by_key.len(), 20);
    for n in 0..20u64 {
        assert_eq!(by_key.get(&format!("item-{n}")), Some(&(n * n)));
    }

    // Members scheduled for tomorrow: the group's cancel ends the results
    // stream waiting on them.
    let later = reader.group::<Square>(rid("later"));
    later
        .submit_with(
            (0..5).map(|n| Square { n }),
            RunOptions {
                run_at: Some(UNIX_EPOCH + Duration::from_millis(T0 + 86_400_000)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let collected = {
        let later = later.clone();
        tokio::spawn(async move { later.results().await?.try_collect::<Vec<_>>().await })
    };
    let job = reader
        .submit_with(
            Square { n: 3 },
            RunOptions {
                run_at: Some(UNIX_EPOCH + Duration::from_millis(T0 + 86_400_000)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let awaited = tokio::spawn(job.clone().into_future());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!collected.is_finished() && !awaited.is_finished());
    let cancelled_at = Instant::now();
    assert_eq!(
        worker_runner
            .group::<Square>(rid("later"))
            .cancel()
            .await
            .unwrap(),
        5
    );
    let results = within(5, collected).await.unwrap().unwrap();
    assert_eq!(results.len(), 5);
    for result in results {
        let err = result.result.expect_err("cancelled");
        assert_eq!(
            err,
            JobError {
                kind: StepErrorKind::Transient,
                message: "job cancelled".into()
            },
            "{}",
            result.key
        );
    }
    // The lone job: cancelled through a workflow runtime over the queue
    // (another queue name, the same run records and wake-ups).
    let canceller = waiter(&queue, &store, HOUR);
    assert!(canceller.cancel(job.id()).await.unwrap());
    match within(5, awaited).await.unwrap() {
        Err(JoinError::Job(err)) => assert_eq!(err.message, "job cancelled"),
        other => panic!("expected the cancelled job's error, got {other:?}"),
    }
    assert!(cancelled_at.elapsed() < Duration::from_secs(10));
    worker.shutdown().await.unwrap();
}

fn fast_flush() -> taquba::OpenOptions {
    taquba::OpenOptions::default().flush_interval(Duration::from_millis(1))
}

/// A queue flushing every millisecond over a store in a new temp dir.
async fn fast_dir_queue() -> (tempfile::TempDir, Arc<dyn ObjectStore>, Arc<Queue>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir_store(dir.path());
    let queue = Queue::open_with_options(store.clone(), "db", fast_flush())
        .await
        .expect("open");
    (dir, store, Arc::new(queue))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_a_runtime_without_the_worker_fails_once_the_store_is_taken_over() {
    let (_dir, store, queue) = fast_dir_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let other = waiter(&queue, &store, Duration::from_millis(50));
    let worker = runtime.spawn(std::future::pending::<()>());
    // A run that starts tomorrow: nothing happens to it meanwhile.
    submit_with(
        &runtime,
        "idle",
        "ok",
        RunOptions {
            run_at: Some(std::time::SystemTime::now() + Duration::from_secs(86_400)),
            ..Default::default()
        },
    )
    .await;
    let waiting = spawn_wait(&other, "idle");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());

    // Another writer opens the store: this process is fenced.
    let second = Queue::open_with_options(store, "db", fast_flush())
        .await
        .expect("the second writer opens the store");
    let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait())
        .await
        .expect("the fenced worker stopped");
    assert!(stopped.expect_err("fenced").is_store_closed());
    let waited = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the wait on the other runtime ended instead of hanging")
        .unwrap();
    let err = waited.expect_err("no termination can be observed any more");
    assert!(err.is_store_closed(), "{err}");
    assert_eq!(script.calls_of("idle"), 0);
    second.close().await.expect("close");
}

/// A store in a temp dir whose worker (polling every millisecond) runs a
/// step held at the script's gate, for takeover tests.
struct Takeover {
    _dir: tempfile::TempDir,
    store: Arc<dyn ObjectStore>,
    queue: Arc<Queue>,
    script: Script,
    runtime: WorkflowRuntime<Script, NoopTerminalHook>,
    worker: Option<taquba_workflow::RunnerHandle>,
}

impl Takeover {
    async fn new() -> Self {
        let (dir, store, queue) = fast_dir_queue().await;
        let script = Script::default();
        let runtime = workflow_builder(&queue, &store, &script)
            .poll_interval(Duration::from_millis(1))
            .build();
        let worker = runtime.spawn(std::future::pending::<()>());
        Self {
            _dir: dir,
            store,
            queue,
            script,
            runtime,
            worker: Some(worker),
        }
    }

    async fn until_started(&self, run_id: &RunId) {
        let run_id = run_id.to_string();
        eventually_real("the step to start", || async {
            self.script.calls_of(&run_id) == 1
        })
        .await;
    }

    /// Another writer opens the store, then the held step returns: its
    /// terminating settlement cannot commit any more. Returns the new
    /// writer once the fenced worker stopped.
    async fn take_over(&mut self) -> Arc<Queue> {
        let second = Arc::new(
            Queue::open_with_options(self.store.clone(), "db", fast_flush())
                .await
                .expect("the second writer opens the store"),
        );
        self.script.gate.open();
        let worker = self.worker.take().expect("taken over once");
        let stopped = tokio::time::timeout(Duration::from_secs(30), worker.wait())
            .await
            .expect("the fenced worker stopped");
        assert!(stopped.expect_err("fenced").is_store_closed());
        second
    }

    /// The state of `run_id` as `second`, the new writer, reads it; closes
    /// everything.
    async fn durable_state(self, second: Arc<Queue>, run_id: &RunId) -> RunState {
        let now_owner = waiter(&second, &self.store, Duration::from_millis(50));
        let durable = now_owner
            .status(run_id)
            .await
            .unwrap()
            .expect("the run is known")
            .state;
        drop((now_owner, self.runtime, self.queue));
        close(second).await;
        durable
    }
}

/// One takeover while a terminating settlement is in flight: four waits
/// (polling every millisecond, on the worker's runtime or on another) on a run
/// whose step returns just after another writer opened the store. Returns
/// what each wait reported and the run's state as the new writer reads it.
async fn takeover_during_a_termination(
    on_the_worker_runtime: bool,
) -> (Vec<taquba_workflow::Result<RunEnd>>, RunState) {
    let mut scene = Takeover::new().await;
    let other = waiter(&scene.queue, &scene.store, Duration::from_millis(1));
    submit_with(&scene.runtime, "held", "gate", RunOptions::default()).await;
    scene.until_started(&rid("held")).await;
    let waits: Vec<_> = (0..4)
        .map(|_| {
            if on_the_worker_runtime {
                spawn_wait(&scene.runtime, "held")
            } else {
                spawn_wait(&other, "held")
            }
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(waits.iter().all(|w| !w.is_finished()));

    let second = scene.take_over().await;
    let mut reported = Vec::new();
    for wait in waits {
        reported.push(
            tokio::time::timeout(Duration::from_secs(30), wait)
                .await
                .expect("the wait ended")
                .unwrap(),
        );
    }
    drop(other);
    let durable = scene.durable_state(second, &rid("held")).await;
    (reported, durable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_does_not_report_a_termination_lost_to_a_takeover() {
    for round in 0..6 {
        let (reported, durable) = takeover_during_a_termination(round % 2 == 1).await;
        for waited in reported {
            match waited {
                Err(err) => assert!(err.is_store_closed(), "round {round}: {err}"),
                Ok(end) => assert_eq!(
                    durable,
                    RunState::Terminated(end.termination.clone()),
                    "round {round}: the wait reported {end:?}, which the store does not hold"
                ),
            }
        }
    }
}

/// A takeover while a terminating settlement is in flight, observed by
/// fresh looks started over and over (each abandoned after 2 ms) from
/// before the takeover until well after the fenced worker stopped: a fresh
/// `wait` on the run, or a fresh `results` stream of the run's group.
/// Returns what the looks reported and the run's state as the new writer
/// reads it.
async fn fresh_looks_across_a_takeover(group: bool) -> (Vec<RunTermination>, Vec<Error>, RunState) {
    let mut scene = Takeover::new().await;
    let runtime = scene.runtime.clone();
    let run_id = if group {
        let members = vec![GroupMember {
            key: "held".into(),
            input: b"gate".to_vec(),
        }];
        runtime
            .group(rid("g"))
            .submit(members, &RunOptions::default())
            .await
            .expect("group submit");
        member_run_id("g", "held")
    } else {
        submit_with(&runtime, "held", "gate", RunOptions::default()).await;
        rid("held")
    };
    scene.until_started(&run_id).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let looks: Vec<_> = (0..4)
        .map(|_| {
            let (runtime, run_id, stop) = (runtime.clone(), run_id.clone(), stop.clone());
            tokio::spawn(async move {
                let (mut ended, mut errors) = (Vec::new(), Vec::new());
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let look = async {
                        if group {
                            let mut results = runtime.group(rid("g")).results().await?;
                            match futures_util::StreamExt::next(&mut results).await {
                                Some(result) => result.map(|r| r.termination),
                                None => panic!("a group of one member ended without it"),
                            }
                        } else {
                            runtime.wait(&run_id).await.map(|end| end.termination)
                        }
                    };
                    match tokio::time::timeout(Duration::from_millis(2), look).await {
                        Ok(Ok(end)) => ended.push(end),
                        // A closed store is the expected answer; any other
                        // error is kept for the assertion.
                        Ok(Err(err)) if err.is_store_closed() => {}
                        Ok(Err(err)) => errors.push(err),
                        Err(_) => {}
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                (ended, errors)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = scene.take_over().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut ended, mut errors) = (Vec::new(), Vec::new());
    for look in looks {
        let (e, r) = look.await.unwrap();
        ended.extend(e);
        errors.extend(r);
    }
    drop(runtime);
    let durable = scene.durable_state(second, &run_id).await;
    (ended, errors, durable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_waits_and_group_results_do_not_report_a_termination_lost_to_a_takeover() {
    for round in 0..4 {
        let group = round % 2 == 1;
        let (ended, errors, durable) = fresh_looks_across_a_takeover(group).await;
        for end in ended {
            assert_eq!(
                durable,
                RunState::Terminated(end.clone()),
                "round {round} (group: {group}): a look reported {end:?}, which the store does not hold"
            );
        }
        assert!(errors.is_empty(), "round {round}: {errors:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_does_not_read_the_steps_offloaded_payload_at_every_poll() {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let payloads = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            options(&clock).payload_store(Arc::new(payloads.clone()) as Arc<dyn ObjectStore>),
        )
        .await
        .unwrap(),
    );
    let runtime = waiter(&queue, &store, Duration::from_millis(50));
    // An input over the queue's offload threshold (256 KiB) is stored as
    // an object of the payload store.
    runtime
        .submit(RunSpec {
            run_id: Some(rid("large")),
            input: vec![7; 300 * 1024],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(payloads.calls(Op::Put) >= 1, "the payload was offloaded");
    let gets = payloads.calls(Op::Get);
    // About 100 looks at the current step.
    let waited = runtime
        .wait_timeout(&rid("large"), Duration::from_secs(5))
        .await
        .unwrap();
    assert!(waited.is_none());
    let read = payloads.calls(Op::Get) - gets;
    assert!(
        read <= 1,
        "a 5 s wait polling every 50 ms downloaded the 300 KiB step payload {read} times"
    );
}

/// The outputs of `tasks` in order, all finished within `secs` seconds.
async fn join_within<T>(secs: u64, tasks: Vec<tokio::task::JoinHandle<T>>, what: &str) -> Vec<T> {
    tokio::time::timeout(Duration::from_secs(secs), async move {
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.expect("task"));
        }
        done
    })
    .await
    .unwrap_or_else(|_| panic!("{what} in time"))
}

/// `wait_timeout(id, Duration::ZERO)` on a run that ended, on a local
/// directory (whose reads complete on a blocking thread): its doc says
/// "`Ok(None)` when the run has not terminated by then", so a run that
/// terminated before the call must be reported, whatever the timeout.
#[tokio::test]
async fn a_zero_wait_timeout_reports_a_run_that_already_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default().flush_interval(Duration::from_millis(1)),
        )
        .await
        .unwrap(),
    );
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("ended-zero", "ok")).await.unwrap();
    runtime.wait(&rid("ended-zero")).await.unwrap();
    for _ in 0..20 {
        let end = runtime
            .wait_timeout(&rid("ended-zero"), Duration::ZERO)
            .await
            .unwrap();
        assert!(
            end.is_some(),
            "a zero timeout reported an ended run as running"
        );
    }
    worker.shutdown().await.unwrap();
}

/// A `wait` pending on a clone of a runtime whose worker is shut down and
/// whose other handles are dropped, while the run waits on a timer: a new
/// runtime over the same queue (a restart of the worker in-process) ends
/// the run, and the pending wait reports that end ("every runtime over
/// the same `Arc<Queue>` there wakes it").
#[tokio::test(start_paused = true)]
async fn a_wait_pending_across_a_worker_restart_in_process_gets_the_end() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("restarted", "timer:5000"))
        .await
        .unwrap();
    until_step("the timer", &runtime, "restarted", 1).await;
    let waiting = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.wait(&rid("restarted")).await })
    };
    tokio::task::yield_now().await;
    worker.shutdown().await.unwrap();
    drop(runtime);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!waiting.is_finished(), "the wait ended without a worker");
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(60, waiting).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

/// Fails its first call permanently (`first`), then succeeds with
/// `second`: a run requeued after its dead letter ends otherwise.
#[derive(Clone, Default)]
struct FailOnce {
    calls: Arc<Mutex<u32>>,
}

impl StepRunner for FailOnce {
    async fn run_step(&self, _step: &Step) -> Result<StepOutcome, StepError> {
        let mut calls = self.calls.lock().expect("calls lock");
        *calls += 1;
        if *calls == 1 {
            Err(StepError::permanent("first"))
        } else {
            Ok(StepOutcome::Succeed {
                result: b"second".to_vec(),
            })
        }
    }
}

/// The GETs of run result records (`{memo prefix}/runs/...`) counted so far.
fn result_record_gets(store: &taquba_workflow_suite::measure::calls::CountingStore) -> u64 {
    store
        .counts()
        .iter()
        .filter(|((kind, op), _)| kind.ends_with("-memo/runs") && *op == "get")
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_wait_after_a_run_ended_here_takes_its_outcome_without_reading_its_result_record() {
    use taquba_workflow_suite::measure::calls::CountingStore;
    let counting = CountingStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = Arc::new(counting.clone());
    let clock = MockClock::new(T0);
    let queue = open(&store, &clock).await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_with(&runtime, "ended", "steps:2", RunOptions::default()).await;
    let first = within(10, runtime.wait(&rid("ended"))).await.unwrap();
    assert_eq!(
        first.outcome.as_ref().and_then(|o| o.result.as_deref()),
        Some(b"ended@2".as_slice())
    );
    // Waits that begin after the end: the same end, outcome included, with
    // no read of the result record (another runtime over the queue too).
    counting.reset();
    assert_eq!(within(5, runtime.wait(&rid("ended"))).await.unwrap(), first);
    let other = waiter(&queue, &store, HOUR);
    assert_eq!(within(5, other.wait(&rid("ended"))).await.unwrap(), first);
    assert_eq!(result_record_gets(&counting), 0, "{:?}", counting.counts());
    // The store agrees.
    assert_eq!(runtime.outcome(&rid("ended")).await.unwrap(), first.outcome);

    // Once the result record is removed, a wait reports what the store
    // holds: no outcome.
    let memos = taquba_workflow::MemoStore::new(store.clone(), "workflow-steps-memo");
    assert_eq!(memos.clear_memos_for_run(&rid("ended")).await.unwrap(), 1);
    let cleared = within(5, runtime.wait(&rid("ended"))).await.unwrap();
    assert_eq!(cleared.termination, first.termination);
    assert_eq!(cleared.outcome, None);
    worker.shutdown().await.unwrap();
    drop((runtime, other));
    close(queue).await;
}

#[tokio::test(start_paused = true)]
async fn a_wait_after_a_requeued_run_ended_again_reports_its_second_outcome() {
    let (queue, store, _clock) = common::memory_queue().await;
    let runner = FailOnce::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_with(&runtime, "twice", "x", one_attempt()).await;
    let failed = within(10, runtime.wait(&rid("twice"))).await.unwrap();
    assert_eq!(failed.termination.status, TerminalStatus::Failed);
    runtime.requeue(&rid("twice")).await.unwrap();
    let second = within(10, runtime.wait(&rid("twice"))).await.unwrap();
    assert_eq!(second.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        second.outcome.as_ref().and_then(|o| o.result.as_deref()),
        Some(b"second".as_slice())
    );
    // Again after the end: the second end, not the first kept one.
    assert_eq!(
        within(5, runtime.wait(&rid("twice"))).await.unwrap(),
        second
    );
    assert_eq!(
        runtime.outcome(&rid("twice")).await.unwrap(),
        second.outcome
    );
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

/// A step that outlives its lease and returns after its retry ended the
/// run writes no run result record: the committed run's outcome (its
/// result) stays what the retry recorded, for a wait and for `outcome`,
/// whether the late attempt returns later or in the same millisecond of
/// the queue's clock. Before, the late
/// attempt replaced the record before its acknowledgement failed on the
/// lost claim.
#[tokio::test(start_paused = true)]
async fn a_late_attempt_after_its_lease_leaves_the_committed_outcome() {
    for later_ms in [0, 1_000] {
        let clock = MockClock::new(T0);
        let (queue, store) =
            crate::fixtures::memory_queue_with_lease(&clock, STEPS, Duration::from_secs(10)).await;
        let gate = Arc::new(tokio::sync::Notify::new());
        let runner = {
            let gate = gate.clone();
            FnRunner(move |step: Step| {
                let gate = gate.clone();
                async move {
                    let attempt = step.delivery.attempts;
                    if attempt == 1 {
                        gate.notified().await;
                    }
                    Ok(StepOutcome::Succeed {
                        result: format!("attempt {attempt}").into_bytes(),
                    })
                }
            })
        };
        let runtime = workflow_builder(&queue, &store, &Arc::new(runner)).build();
        submit_with(&runtime, "late", "in", RunOptions::default()).await;
        let worker = runtime.spawn(std::future::pending::<()>());
        let waiting = spawn_wait(&runtime, "late");
        tokio::time::sleep(Duration::from_millis(200)).await;
        clock.advance(Duration::from_secs(11));
        let end = within(30, waiting).await.unwrap().unwrap();
        let committed = end.outcome.expect("the retry recorded its outcome");
        assert_eq!(committed.result.as_deref(), Some(&b"attempt 2"[..]));

        // The first attempt returns: its settlement finds its claim lost.
        clock.advance(Duration::from_millis(later_ms));
        gate.notify_one();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let outcome = runtime.outcome(&rid("late")).await.unwrap();
        assert_eq!(
            outcome.and_then(|o| o.result).as_deref(),
            Some(&b"attempt 2"[..]),
            "late by {later_ms} ms"
        );
        let again = runtime.wait(&rid("late")).await.unwrap();
        assert_eq!(
            again.outcome.and_then(|o| o.result).as_deref(),
            Some(&b"attempt 2"[..])
        );
        worker.shutdown().await.unwrap();
    }
}
