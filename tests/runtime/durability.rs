//! Durable timers, per-run options on every step job, reconciliation of
//! steps dead-lettered outside the worker, restarts over a directory
//! store, a view over a `QueueReader` and the waits; a runtime dropped
//! without shutdown (a crash) at different moments of its runs, whose
//! successor ends every run and delivers the signal sent before the crash.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use crate::fixtures::{Scripted, ends_within, spec, tokio_clock_queue};
use common::*;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{JobStatus, Queue, QueueReader, ReaderOptions};
use taquba_workflow::{
    Error, HEADER_RUN_ID, HEADER_STEP, MAX_RUN_ID_LEN, MemoStore, NoopTerminalHook, RunId,
    RunOptions, RunSpec, RunState, Step, StepOutcome, StepRunner, TerminalStatus, WorkflowRuntime,
    WorkflowView,
};

fn header<'a>(job: &'a taquba::JobRecord, name: &str) -> Option<&'a str> {
    job.headers.get(name).map(String::as_str)
}

#[tokio::test(start_paused = true)]
async fn an_after_trigger_is_a_durable_timer_on_the_queue_clock() {
    let (queue, store, clock) = memory_queue().await;
    let second = Arc::new(AtomicU32::new(0));
    let seen_at = Arc::new(AtomicU64::new(0));
    let runner = {
        let (second, seen_at, clock) = (second.clone(), seen_at.clone(), clock.clone());
        FnRunner(move |step: Step| {
            let (second, seen_at, clock) = (second.clone(), seen_at.clone(), clock.clone());
            async move {
                if step.step_number == 0 {
                    return Ok(StepOutcome::continue_after(
                        b"later".to_vec(),
                        Duration::from_secs(60),
                    ));
                }
                second.fetch_add(1, Ordering::SeqCst);
                seen_at.store(taquba::Clock::now_ms(&clock), Ordering::SeqCst);
                Ok(StepOutcome::Succeed {
                    result: step.payload.clone(),
                })
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "timer").await;
    until_step("step 0 to commit", &runtime, "timer", 1).await;

    // Tokio time passes, the queue clock does not: the step stays put.
    tokio::time::sleep(Duration::from_secs(30)).await;
    queue.promote_scheduled_now().await.unwrap();
    let status = runtime.status(&rid("timer")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Pending);
    assert_eq!(status.current_step, 1);
    assert!(
        claim_step(&queue).await.is_none(),
        "not claimable before the delay"
    );
    clock.advance(Duration::from_millis(59_999));
    queue.promote_scheduled_now().await.unwrap();
    assert!(
        claim_step(&queue).await.is_none(),
        "not claimable before the delay"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(second.load(Ordering::SeqCst), 0);

    clock.advance(Duration::from_millis(1));
    queue.promote_scheduled_now().await.unwrap();
    let end = within(30, runtime.wait(&rid("timer"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 1);
    assert_eq!(second.load(Ordering::SeqCst), 1);
    assert_eq!(seen_at.load(Ordering::SeqCst), T0 + 60_000);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn run_options_apply_to_every_step_job() {
    let (queue, store, clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 {
            Ok(StepOutcome::continue_after(
                vec![1],
                Duration::from_secs(3600),
            ))
        } else {
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let spec = RunSpec {
        run_id: Some(rid("opts")),
        input: b"in".to_vec(),
        options: RunOptions {
            headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
            priority: Some(7),
            max_attempts_per_step: Some(5),
            run_at: Some(UNIX_EPOCH + Duration::from_millis(T0 + 30_000)),
            ..Default::default()
        },
        ..Default::default()
    };
    let submitted = runtime.submit(spec.clone()).await.unwrap();
    let check = |job: &taquba::JobRecord, step: &str| {
        assert_eq!(job.priority, 7, "step {step}");
        assert_eq!(job.max_attempts, 5, "step {step}");
        assert_eq!(header(job, HEADER_RUN_ID), Some("opts"));
        assert_eq!(header(job, HEADER_STEP), Some(step));
        assert_eq!(header(job, "tenant"), Some("acme"));
    };
    let job = job_record(&queue, &submitted.job_id, "step 0").await;
    check(&job, "0");
    assert_eq!(job.status, JobStatus::Scheduled);
    assert_eq!(job.run_at, Some(T0 + 30_000));
    assert_eq!(job.dedup_key.as_deref(), Some("run:opts:0"));
    assert!(
        claim_step(&queue).await.is_none(),
        "run_at holds the first step"
    );

    clock.advance(Duration::from_secs(30));
    queue.promote_scheduled_now().await.unwrap();
    let claim = claim_step(&queue).await.expect("step 0 is due");
    check(&claim, "0");
    assert_eq!(claim.payload, b"in");
    queue.nack(&claim, "inspected").await.unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    until_step("step 0 to commit", &runtime, "opts", 1).await;
    worker.shutdown().await.unwrap();
    let current = runtime.submit(spec).await.unwrap();
    assert!(!current.newly_submitted);
    assert_ne!(
        current.job_id, submitted.job_id,
        "the pointer moved to step 1"
    );
    let job = job_record(&queue, &current.job_id, "step 1").await;
    check(&job, "1");
    assert_eq!(job.dedup_key.as_deref(), Some("run:opts:1"));
    assert_eq!(job.run_at, Some(T0 + 30_000 + 3_600_000));

    clock.advance(Duration::from_secs(3600));
    queue.promote_scheduled_now().await.unwrap();
    let claim = claim_step(&queue).await.expect("step 1 is due");
    check(&claim, "1");
    assert_eq!(claim.payload, vec![1]);
}

/// A runner that fails the test if it is ever called.
fn never_called() -> impl StepRunner + use<> {
    FnRunner(|_step: Step| -> std::future::Ready<_> { panic!("the runner must not be called") })
}

#[tokio::test(start_paused = true)]
async fn the_worker_fails_a_run_whose_step_was_dead_lettered_elsewhere() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, never_called(), NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // Let the worker's first maintenance pass run before the dead letter.
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.shutdown().await.unwrap();

    submit_run(&runtime, "hung").await;
    let claim = claim_step(&queue).await.expect("the step job");
    queue.dead_letter(&claim, "hung").await.unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    until_terminated("reconciliation", &runtime, "hung").await;
    let end = within(5, runtime.wait(&rid("hung"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("hung"));
    assert_eq!(end.termination.error_kind, None);
    assert_eq!(end.termination.final_step, 0);
    assert!(end.outcome.is_none());
    assert!(runtime.outcome(&rid("hung")).await.unwrap().is_none());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn wait_returns_when_the_step_is_dead_lettered_outside_the_worker() {
    let (queue, store, clock) = memory_queue().await;
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store, never_called(), NoopTerminalHook).build();
    submit_run(&runtime, "hung").await;
    let waiting = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.wait(&rid("hung")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    let claim = claim_step(&queue).await.expect("the step job");
    clock.advance(Duration::from_secs(1));
    queue.dead_letter(&claim, "hung").await.unwrap();
    let end = within(10, waiting).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("hung"));
    assert_eq!(end.termination.error_kind, None);
    assert_eq!(end.termination.terminated_at_ms, T0 + 1_000);
    assert!(end.outcome.is_none());
}

/// Counts runner calls per step number.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<u32, u32>>>);

impl Counts {
    fn bump(&self, step: u32) -> u32 {
        let mut counts = self.0.lock().expect("lock");
        let count = counts.entry(step).or_default();
        *count += 1;
        *count
    }

    fn of(&self, step: u32) -> u32 {
        self.0
            .lock()
            .expect("lock")
            .get(&step)
            .copied()
            .unwrap_or(0)
    }
}

/// A four-step run: step `n` continues with `n + 1`, step 3 succeeds. Step
/// 2 blocks forever on its first call when `hang_at_2` is set.
fn four_steps(
    counts: Counts,
    hang_at_2: bool,
    started: tokio::sync::mpsc::UnboundedSender<u32>,
) -> impl StepRunner {
    FnRunner(move |step: Step| {
        let (counts, started) = (counts.clone(), started.clone());
        async move {
            let call = counts.bump(step.step_number);
            started.send(step.step_number).ok();
            if hang_at_2 && step.step_number == 2 && call == 1 {
                std::future::pending::<()>().await;
            }
            if step.step_number == 3 {
                Ok(StepOutcome::Succeed {
                    result: b"done".to_vec(),
                })
            } else {
                Ok(StepOutcome::continue_now(vec![]))
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_restarted_runtime_finishes_the_run_without_repeating_committed_steps() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = taquba::MockClock::new(T0);
    let counts = Counts::default();

    let queue = open(&store, &clock).await;
    let (started, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        four_steps(counts.clone(), true, started),
        NoopTerminalHook,
    )
    .build();
    submit_run(&runtime, "restart").await;
    let task = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.run(std::future::pending::<()>()).await })
    };
    for step in 0..3 {
        assert_eq!(within(30, seen.recv()).await, Some(step));
    }
    // The process dies while step 2 runs.
    task.abort();
    let _ = task.await;
    drop(runtime);
    close(queue).await;

    let queue = open(&store, &clock).await;
    let (started, _seen) = tokio::sync::mpsc::unbounded_channel();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        four_steps(counts.clone(), false, started),
        NoopTerminalHook,
    )
    .build();
    let status = runtime.status(&rid("restart")).await.unwrap().unwrap();
    assert_eq!(
        status.current_step, 2,
        "steps 0 and 1 committed before the crash"
    );
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(60, runtime.wait(&rid("restart"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 3);
    assert_eq!(
        end.outcome.expect("recorded").result.as_deref(),
        Some(b"done".as_slice())
    );
    assert_eq!(counts.of(0), 1, "step 0 committed once and never ran again");
    assert_eq!(counts.of(1), 1, "step 1 committed once and never ran again");
    assert_eq!(counts.of(2), 2, "step 2 was interrupted and ran again");
    assert_eq!(counts.of(3), 1);
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

#[tokio::test(start_paused = true)]
async fn a_durable_timer_survives_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = taquba::MockClock::new(T0);
    let counts = Counts::default();
    // A runtime over `queue` and its worker; step 0 sleeps 600 s.
    let start = |queue: &Arc<Queue>| {
        let counts = counts.clone();
        let runner = FnRunner(move |step: Step| {
            let counts = counts.clone();
            async move {
                counts.bump(step.step_number);
                Ok(match step.step_number {
                    0 => StepOutcome::continue_after(vec![], Duration::from_secs(600)),
                    _ => StepOutcome::Succeed { result: vec![] },
                })
            }
        });
        let runtime =
            WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
                .build();
        let worker = runtime.spawn(std::future::pending::<()>());
        (runtime, worker)
    };

    let queue = open(&store, &clock).await;
    let (runtime, worker) = start(&queue);
    submit_run(&runtime, "sleepy").await;
    until_step("step 0 to commit", &runtime, "sleepy", 1).await;
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;

    clock.advance(Duration::from_secs(600));
    let queue = open(&store, &clock).await;
    let (runtime, worker) = start(&queue);
    queue.promote_scheduled_now().await.unwrap();
    let end = within(60, runtime.wait(&rid("sleepy"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!((counts.of(0), counts.of(1)), (1, 1));
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

#[tokio::test(start_paused = true)]
async fn a_view_over_a_queue_reader_reports_status_and_outcome() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 {
            Ok(StepOutcome::continue_now(step.payload.clone()))
        } else {
            Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            })
        }
    });
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook).build();
    runtime
        .submit(RunSpec {
            run_id: Some(rid("seen")),
            input: b"payload".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    let reader = QueueReader::open_with_options(
        store.clone(),
        "db",
        ReaderOptions::default().manifest_poll_interval(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let view = WorkflowView::new(
        reader.view().clone(),
        MemoStore::new(store.clone(), MEMO_PREFIX),
    );
    eventually("the reader to see the pending run", || async {
        view.status(&rid("seen")).await.unwrap().map(|s| s.state) == Some(RunState::Pending)
    })
    .await;
    assert!(view.outcome(&rid("seen")).await.unwrap().is_none());
    assert!(view.status(&rid("other")).await.unwrap().is_none());

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(30, runtime.wait(&rid("seen"))).await.unwrap();
    eventually("the reader to see the termination", || async {
        matches!(
            view.status(&rid("seen")).await.unwrap().map(|s| s.state),
            Some(RunState::Terminated(_))
        )
    })
    .await;
    let status = view.status(&rid("seen")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Terminated(end.termination.clone()));
    assert_eq!(status.current_step, 1);
    let outcome = view
        .outcome(&rid("seen"))
        .await
        .unwrap()
        .expect("the outcome");
    assert_eq!(outcome.status, TerminalStatus::Succeeded);
    assert_eq!(outcome.result.as_deref(), Some(b"payload".as_slice()));
    assert_eq!(outcome.final_step, 1);
    worker.shutdown().await.unwrap();
    reader.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waits_time_out_and_unknown_runs_are_not_found() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue, store, never_called(), NoopTerminalHook).build();
    submit_run(&runtime, "idle").await;
    let waited = within(
        10,
        runtime.wait_timeout(&rid("idle"), Duration::from_secs(2)),
    )
    .await
    .unwrap();
    assert!(waited.is_none(), "no worker, so no termination");
    assert!(runtime.cancel(&rid("idle")).await.unwrap());
    let waited = runtime
        .wait_timeout(&rid("idle"), Duration::from_secs(2))
        .await
        .unwrap()
        .expect("terminated");
    assert_eq!(waited.termination.status, TerminalStatus::Cancelled);

    match runtime.wait(&rid("ghost")).await {
        Err(Error::RunNotFound(id)) => assert_eq!(id, "ghost"),
        other => panic!("expected RunNotFound, got {other:?}"),
    }
    assert!(matches!(
        runtime
            .wait_timeout(&rid("ghost"), Duration::from_secs(1))
            .await,
        Err(Error::RunNotFound(_))
    ));
    assert!(runtime.status(&rid("ghost")).await.unwrap().is_none());
}

#[test]
fn run_id_errors_name_the_value() {
    for bad in [
        "",
        "has space",
        "slash/y",
        "ü",
        &"x".repeat(MAX_RUN_ID_LEN + 1),
    ] {
        match RunId::new(bad) {
            Err(err @ Error::InvalidRunId { .. }) => {
                let Error::InvalidRunId { run_id, .. } = &err else {
                    unreachable!()
                };
                assert_eq!(run_id, bad);
                assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
            }
            other => panic!("{bad:?} was accepted: {other:?}"),
        }
    }
    let longest = "a".repeat(MAX_RUN_ID_LEN);
    assert_eq!(RunId::new(longest.clone()).unwrap().as_str(), longest);
    assert_eq!(RunId::new("Az09_-").unwrap(), "Az09_-");
    assert!("has space".parse::<RunId>().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_step_that_fails_after_the_reaper_dead_lettered_it_is_still_reconciled() {
    let clock = taquba::MockClock::new(T0);
    let store: Arc<dyn taquba::object_store::ObjectStore> =
        Arc::new(taquba::object_store::memory::InMemory::new());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            options(&clock).queue_config(
                STEPS,
                taquba::QueueConfig::default().lease_duration(Duration::from_secs(10)),
            ),
        )
        .await
        .unwrap(),
    );
    let gate = Gate::default();
    let (started, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |_step: Step| {
            let (gate, started) = (gate.clone(), started.clone());
            async move {
                started.send(()).ok();
                gate.wait().await;
                Err(taquba_workflow::StepError::permanent("late failure"))
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("late")),
            options: RunOptions {
                max_attempts_per_step: Some(1),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    within(10, seen.recv()).await.expect("the step started");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The step outlives its only lease: the reaper dead-letters it, and
    // then the runner fails, so the worker's own dead letter finds the
    // claim lost.
    clock.advance(Duration::from_secs(11));
    queue.reap_now().await.unwrap();
    gate.open();
    until_terminated("the worker to terminate the run", &runtime, "late").await;
    let status = runtime.status(&rid("late")).await.unwrap().unwrap();
    let RunState::Terminated(termination) = status.state else {
        unreachable!()
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    assert_eq!(termination.error_kind, None, "terminated by reconciliation");
    assert!(
        runtime.outcome(&rid("late")).await.unwrap().is_none(),
        "the lost settlement's record does not describe this termination"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_interrupted_on_its_last_attempt_fails_its_run_after_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = taquba::MockClock::new(T0);
    let queue = open(&store, &clock).await;
    let (started, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let hanging = FnRunner(move |_step: Step| {
        let started = started.clone();
        async move {
            started.send(()).ok();
            std::future::pending::<Result<StepOutcome, taquba_workflow::StepError>>().await
        }
    });
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), hanging, Recorder::default())
            .build();
    runtime
        .submit(RunSpec {
            run_id: Some(rid("last-try")),
            options: RunOptions {
                max_attempts_per_step: Some(1),
                headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    let task = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.run(std::future::pending::<()>()).await })
    };
    within(30, seen.recv()).await.expect("the step started");
    task.abort();
    let _ = task.await;
    drop(runtime);
    close(queue).await;

    // Opening the queue dead-letters the interrupted last attempt; the new
    // worker reconciles the run.
    let queue = open(&store, &clock).await;
    assert_eq!(dead_jobs(&queue).await.len(), 1);
    let hook = Recorder::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), never_called(), hook.clone())
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    eventually("the run to be reconciled and notified", || async {
        !hook.calls().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, TerminalStatus::Failed);
    assert_eq!(
        calls[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let end = within(5, runtime.wait(&rid("last-try"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error, calls[0].error);
    assert_eq!(end.termination.error_kind, None);
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;
}

/// Runs of several steps, timers and signal waits; the runtime is dropped
/// without shutdown at different moments and a new one opened on the same
/// store (which fences the old): every run ends as without the crash, the
/// signal sent before the crash is delivered, and `submit` of the same id
/// answers `newly_submitted = false` only for runs that are really there.
#[tokio::test(start_paused = true)]
async fn a_crash_at_different_moments_resumes_every_run() {
    for crash_after_ms in [0u64, 1, 2, 3, 5, 8, 13, 21, 34, 55] {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
        let worker = {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.run(std::future::pending::<()>()).await })
        };
        let runs = [
            ("c-steps", "steps:20".to_string()),
            ("c-timer", "timer:30".to_string()),
            ("c-signal", "signal:c-key".to_string()),
            ("c-ok", "ok".to_string()),
        ];
        for (id, input) in &runs {
            runtime.submit(spec(id, input)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(crash_after_ms)).await;
        let signalled = runtime.signal("c-key", b"sig".to_vec()).await;
        // Crash: abort the worker (dropping a `RunnerHandle` would detach
        // it, leaving the old writer running beside the new one) and drop
        // every handle without shutdown.
        worker.abort();
        let _ = worker.await;
        drop(runtime);
        drop(queue);
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        for (id, input) in &runs {
            // Resubmitting the same id and input is idempotent while the run
            // is active; a run that terminated before the crash is reported
            // as terminated (a re-submission would start it again, as the
            // seeds say).
            if !matches!(
                runtime.view().run(&rid(id)).await.unwrap().map(|d| d.state),
                Some(RunState::Terminated(_))
            ) {
                let again = runtime.submit(spec(id, input)).await.unwrap();
                assert!(!again.newly_submitted, "{id}: submitted before the crash");
            }
            let details = runtime.view().run(&rid(id)).await.unwrap();
            let what = format!(
                "crash after {crash_after_ms} ms (signal answered {signalled:?}; {:?})",
                details.map(|d| (d.waiting_for_signal, d.current_step))
            );
            assert_eq!(
                ends_within(&runtime, id, 120, &what)
                    .await
                    .termination
                    .status,
                TerminalStatus::Succeeded,
                "{id} {what}"
            );
        }
        let end = runtime.wait(&rid("c-signal")).await.unwrap();
        let result = end.outcome.and_then(|o| o.result);
        assert_eq!(
            result.as_deref(),
            Some(&b"sig"[..]),
            "crash after {crash_after_ms} ms: the signal result"
        );
        worker.shutdown().await.unwrap();
    }
}
