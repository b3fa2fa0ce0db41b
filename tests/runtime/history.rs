//! Run history at the public API: every settlement records its attempt
//! (continued now / after a delay / on a signal, retried, succeeded,
//! failed, cancelled, dead-lettered) in the run's step log, with the
//! step's name; long runs keep their last steps; a run id that runs again
//! starts a fresh log; retention removes the log with the run.

use crate::common;

use std::time::Duration;

use common::*;
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::testing::{TEST_EPOCH_MS, TestRuntime};
use taquba_workflow::{
    NoopTerminalHook, RunSpec, RunState, Step, StepError, StepErrorKind, StepOutcome, StepRunner,
    TerminalStatus, WorkflowRuntime, history::AttemptOutcome, history::RunHistory,
    limits::MAX_HISTORY_TEXT_LEN,
};

const HOUR: Duration = Duration::from_secs(3600);

/// A runtime over `queue` with `runner`, no hook and a 50 ms poll interval.
fn builder<R: StepRunner>(
    queue: &std::sync::Arc<taquba::Queue>,
    store: &std::sync::Arc<dyn taquba::object_store::ObjectStore>,
    runner: R,
) -> taquba_workflow::WorkflowRuntimeBuilder<R, NoopTerminalHook> {
    WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
}

/// A runner that fails the test if it is ever called.
fn never_called() -> impl StepRunner + use<> {
    FnRunner(|_step: Step| -> std::future::Ready<_> { panic!("the runner must not be called") })
}

fn outcomes(history: &RunHistory) -> Vec<(u32, Vec<AttemptOutcome>)> {
    history
        .steps
        .iter()
        .map(|s| {
            (
                s.step,
                s.attempts.iter().map(|a| a.outcome.clone()).collect(),
            )
        })
        .collect()
}

async fn history_of<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> RunHistory {
    runtime
        .view()
        .steps(&rid(id))
        .await
        .unwrap()
        .expect("a known run")
}

/// Step 0 continues at once, step 1 after 5 s, step 2 fails once and then
/// waits on signal `k`, step 3 succeeds.
fn four_steps() -> impl StepRunner {
    FnRunner(|step: Step| async move {
        match step.step_number {
            0 => Ok(StepOutcome::continue_now(vec![])),
            1 => Ok(StepOutcome::continue_after(vec![], Duration::from_secs(5))),
            2 if step.attempts == 1 => Err(StepError::transient("503 from upstream")),
            2 => Ok(StepOutcome::continue_on_signal(
                vec![],
                "k",
                Duration::from_secs(10),
            )),
            _ => Ok(StepOutcome::Succeed {
                result: b"done".to_vec(),
            }),
        }
    })
}

/// On the test kit: each step runs when the test says, so the history is
/// read at exact points, and its times are exact on the clock.
#[tokio::test(start_paused = true)]
async fn each_attempt_is_recorded_with_what_it_led_to() {
    let env = TestRuntime::builder(four_steps())
        .retry_backoff(Duration::ZERO, Duration::ZERO)
        .build()
        .await
        .unwrap();
    env.submit(RunSpec {
        run_id: Some(rid("r")),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 2, "steps 0 and 1");
    // Step 1 is on its 5 s timer: its entry is there, step 2 has none yet.
    let history = env.history(&rid("r")).await.unwrap();
    assert_eq!(history.steps.len(), 2, "{history:?}");
    assert_eq!(
        env.advance(Duration::from_secs(5)).await.unwrap(),
        2,
        "step 2 fails once, then waits on its signal"
    );
    assert_eq!(env.history(&rid("r")).await.unwrap().steps.len(), 3);
    env.signal_raw("k", b"go".to_vec()).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);

    let history = env.history(&rid("r")).await.unwrap();
    let continued = |delay_ms| AttemptOutcome::Continued {
        delay_ms,
        signal: None,
    };
    assert_eq!(
        outcomes(&history),
        vec![
            (0, vec![continued(None)]),
            (1, vec![continued(Some(5000))]),
            (2, outcomes(&history)[2].1.clone()),
            (3, vec![AttemptOutcome::Succeeded]),
        ]
    );
    let step2 = &outcomes(&history)[2].1;
    assert_eq!(
        step2[0],
        AttemptOutcome::Retried {
            error: "503 from upstream".into()
        }
    );
    assert!(
        matches!(
            &step2[1],
            AttemptOutcome::Continued { delay_ms: None, signal: Some(wait) }
                if wait.correlation_key == "k" && wait.timeout_ms == 10_000
        ),
        "{step2:?}"
    );
    assert_eq!(step2.len(), 2);
    assert_eq!(history.steps_taken, 4);
    assert_eq!(history.steps_dropped, 0);
    let step2 = &history.steps[2];
    assert_eq!(step2.name, "FnRunner", "a hand-written runner's label");
    assert_eq!(
        step2.attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [1, 2]
    );
    // Steps 0 and 1 ran at the start, the rest once the timer fired.
    let claimed: Vec<Option<u64>> = history
        .steps
        .iter()
        .flat_map(|s| &s.attempts)
        .map(|a| a.claimed_at_ms)
        .collect();
    let (t0, t5) = (Some(TEST_EPOCH_MS), Some(TEST_EPOCH_MS + 5000));
    assert_eq!(claimed, [t0, t0, t5, t5, t5]);
    for attempt in history.steps.iter().flat_map(|s| &s.attempts) {
        assert_eq!(
            Some(attempt.settled_at_ms),
            attempt.claimed_at_ms,
            "{attempt:?}"
        );
    }
}

/// A `#[workflow]` payload: `{workflow, step: {name: fields}}`, as the
/// macro encodes it (written by hand here: the macro suites have their own
/// binaries).
fn envelope(workflow: &str, step: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        workflow: &'a str,
        step: std::collections::BTreeMap<&'a str, std::collections::BTreeMap<&'a str, u32>>,
    }
    rmp_serde::to_vec_named(&Envelope {
        workflow,
        step: [(step, [("n", 1)].into())].into(),
    })
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn workflow_steps_are_named_by_their_step_and_runs_by_their_workflow() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        match step.step_number {
            0 => Ok(StepOutcome::continue_now(envelope("order", "ship"))),
            _ => Ok(StepOutcome::Succeed { result: vec![] }),
        }
    });
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("o")),
            input: envelope("order", "charge"),
            ..Default::default()
        })
        .await
        .unwrap();
    until_terminated("the run", &runtime, "o").await;
    let history = history_of(&runtime, "o").await;
    let names: Vec<&str> = history.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["charge", "ship"]);
    let details = runtime.view().run(&rid("o")).await.unwrap().unwrap();
    assert_eq!(details.workflow.as_deref(), Some("order"));
    assert_eq!(details.step_name.as_deref(), Some("ship"));
    worker.shutdown().await.unwrap();
}

struct Named;

impl StepRunner for Named {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number < 2 {
            Ok(StepOutcome::continue_now(vec![
                b'a' + step.step_number as u8 + 1,
            ]))
        } else {
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    }

    fn step_name(&self, step_number: u32, payload: &[u8]) -> Option<String> {
        (step_number != 1).then(|| format!("stage-{}", String::from_utf8_lossy(payload)))
    }
}

#[tokio::test(start_paused = true)]
async fn a_runner_names_its_steps_and_the_rest_get_its_type_name() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = builder(&queue, &store, Named).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("n")),
            input: b"a".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    until_terminated("the run", &runtime, "n").await;
    let history = history_of(&runtime, "n").await;
    let names: Vec<&str> = history.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["stage-a", "Named", "stage-c"]);
    worker.shutdown().await.unwrap();
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Add {
    a: i64,
    b: i64,
}

#[derive(Debug, thiserror::Error)]
#[error("overflow")]
struct Overflow;

impl Job for Add {
    const NAME: &'static str = "math.add";
    type Output = i64;
    type Error = Overflow;

    async fn run(&self, _ctx: JobContext<'_>) -> Result<i64, Overflow> {
        self.a.checked_add(self.b).ok_or(Overflow)
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_is_one_step_named_by_the_job_name() {
    let (queue, store, _clock) = memory_queue().await;
    let jobs = JobRunner::builder(queue.clone(), store.clone())
        .register::<Add>()
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = jobs.spawn(std::future::pending::<()>());
    let handle = jobs.submit(Add { a: 2, b: 3 }).await.unwrap();
    assert_eq!(handle.join().await.unwrap().unwrap(), 5);
    let view = jobs.view();
    let history = view.steps(handle.id()).await.unwrap().unwrap();
    assert_eq!(history.steps.len(), 1);
    assert_eq!(history.steps[0].name, "math.add");
    assert_eq!(
        history.steps[0].attempts[0].outcome,
        AttemptOutcome::Succeeded
    );
    let page = view
        .runs(&taquba_workflow::view::RunFilter::new().workflow("math.add"))
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 1);
    assert_eq!(page.runs[0].run_id, *handle.id());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_long_run_keeps_its_last_steps_and_counts_the_rest() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number < 19 {
            Ok(StepOutcome::continue_now(vec![]))
        } else {
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    // At least the last 8 entries are kept, in chunks of 8: after 20 steps,
    // the chunk of steps 8..=15 and the last four on the terminal record.
    let runtime = builder(&queue, &store, runner).history_limit(8).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "long").await;
    until_terminated("the run", &runtime, "long").await;
    let history = history_of(&runtime, "long").await;
    let steps: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
    assert_eq!(steps, (8..20).collect::<Vec<_>>());
    assert_eq!(history.steps_taken, 20);
    assert_eq!(history.steps_dropped, 8);
    // The older chunk is gone from the store.
    let stored = queue
        .view()
        .kv_scan(b"workflow/history/long/", .., 100)
        .await
        .unwrap();
    assert_eq!(stored.entries.len(), 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_history_limit_of_zero_records_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = builder(&queue, &store, four_steps())
        .history_limit(0)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "quiet").await;
    until_step("step 1", &runtime, "quiet", 2).await;
    let history = history_of(&runtime, "quiet").await;
    assert!(history.steps.is_empty());
    assert_eq!(history.steps_dropped, history.steps_taken);
    let stored = queue
        .view()
        .kv_scan(b"workflow/history/", .., 10)
        .await
        .unwrap();
    assert!(stored.entries.is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn errors_are_cut_to_the_documented_length_and_failures_keep_their_kind() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.attempts == 1 {
            Err(StepError::transient("é".repeat(3000)))
        } else {
            Err(StepError::permanent("bad input"))
        }
    });
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "err").await;
    until_terminated("the run", &runtime, "err").await;
    let history = history_of(&runtime, "err").await;
    let attempts = &history.steps[0].attempts;
    let AttemptOutcome::Retried { error } = &attempts[0].outcome else {
        panic!("{attempts:?}");
    };
    assert!(error.len() <= MAX_HISTORY_TEXT_LEN, "{}", error.len());
    assert!(error.ends_with('…') && error.starts_with("éé"));
    assert_eq!(
        attempts[1].outcome,
        AttemptOutcome::Failed {
            kind: StepErrorKind::Permanent,
            error: "bad input".into()
        }
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiting_step_is_recorded_with_the_reason() {
    let (queue, store, _clock) = memory_queue().await;
    let runner =
        FnRunner(|_step: Step| async move { Ok(StepOutcome::continue_after(vec![], HOUR)) });
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "c").await;
    until_step("the timer", &runtime, "c", 1).await;
    assert!(
        runtime
            .cancel_with_reason(&rid("c"), "customer asked")
            .await
            .unwrap()
    );
    let history = history_of(&runtime, "c").await;
    assert_eq!(history.steps.len(), 2);
    let cancelled = &history.steps[1].attempts[0];
    assert_eq!(cancelled.attempt, 0, "never delivered");
    assert_eq!(cancelled.claimed_at_ms, None);
    assert_eq!(
        cancelled.outcome,
        AttemptOutcome::Cancelled {
            reason: Some("customer asked".into())
        }
    );
    let details = runtime.view().run(&rid("c")).await.unwrap().unwrap();
    assert_eq!(details.cancel_reason.as_deref(), Some("customer asked"));
    let RunState::Terminated(termination) = &details.state else {
        panic!("{details:?}");
    };
    assert_eq!(termination.status, TerminalStatus::Cancelled);
    assert_eq!(termination.error, None, "an external cancel has no error");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_running_step_cancelled_from_outside_records_the_reason() {
    let (queue, store, _clock) = memory_queue().await;
    let gate = Gate::default();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |_step: Step| {
            let gate = gate.clone();
            async move {
                gate.wait().await;
                Ok(StepOutcome::continue_now(vec![]))
            }
        })
    };
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "busy").await;
    eventually("the step to run", || async {
        runtime.status(&rid("busy")).await.unwrap().unwrap().state == RunState::Running
    })
    .await;
    assert!(
        runtime
            .cancel_with_reason(&rid("busy"), "stop")
            .await
            .unwrap()
    );
    gate.open();
    until_terminated("the run", &runtime, "busy").await;
    let history = history_of(&runtime, "busy").await;
    assert_eq!(
        outcomes(&history),
        vec![(
            0,
            vec![AttemptOutcome::Cancelled {
                reason: Some("stop".into())
            }]
        )]
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dead_letter_outside_the_worker_is_recorded_by_reconciliation() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = builder(&queue, &store, never_called()).build();
    submit_run(&runtime, "dl").await;
    let claim = claim_step(&queue).await.expect("the step");
    queue
        .dead_letter(&claim, "lease lost for good")
        .await
        .unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    until_terminated("reconciliation", &runtime, "dl").await;
    let history = history_of(&runtime, "dl").await;
    assert_eq!(
        outcomes(&history),
        vec![(
            0,
            vec![AttemptOutcome::DeadLettered {
                error: "lease lost for good".into()
            }]
        )]
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_run_id_that_runs_again_starts_a_fresh_history() {
    let (queue, store, _clock) = memory_queue().await;
    // `long` runs three steps, `short` one.
    let runner = FnRunner(|step: Step| async move {
        if step.payload == b"long" && step.step_number < 2 {
            Ok(StepOutcome::continue_now(step.payload.clone()))
        } else {
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for input in ["long", "short"] {
        runtime
            .submit(RunSpec {
                run_id: Some(rid("again")),
                input: input.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        within(30, runtime.wait(&rid("again"))).await.unwrap();
    }
    let history = history_of(&runtime, "again").await;
    assert_eq!(
        outcomes(&history),
        vec![(0, vec![AttemptOutcome::Succeeded])],
        "the first execution's steps 1 and 2 are not this run's"
    );
    assert_eq!(history.steps_taken, 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn retention_removes_the_history_with_the_run() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = builder(&queue, &store, four_steps())
        .memo_retention(Duration::ZERO)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "gone").await;
    until_step("step 2", &runtime, "gone", 2).await;
    assert!(runtime.cancel(&rid("gone")).await.unwrap());
    eventually("the sweep to remove the run", || async {
        runtime.status(&rid("gone")).await.unwrap().is_none()
    })
    .await;
    let stored = queue
        .view()
        .kv_scan(b"workflow/history/", .., 10)
        .await
        .unwrap();
    assert!(stored.entries.is_empty(), "{:?}", stored.entries);
    assert!(runtime.view().steps(&rid("gone")).await.unwrap().is_none());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn retries_in_progress_show_before_the_step_settles_and_join_it_after() {
    let (queue, store, _clock) = memory_queue().await;
    let gate = Gate::default();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |step: Step| {
            let gate = gate.clone();
            async move {
                if step.attempts < 3 {
                    return Err(StepError::transient(format!("try {}", step.attempts)));
                }
                gate.wait().await;
                Ok(StepOutcome::Succeed { result: vec![] })
            }
        })
    };
    let runtime = builder(&queue, &store, runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "flaky").await;
    eventually("the third attempt to run", || async {
        runtime.status(&rid("flaky")).await.unwrap().unwrap().state == RunState::Running
            && job_attempts(&runtime, "flaky").await == 3
    })
    .await;
    let history = history_of(&runtime, "flaky").await;
    assert_eq!(
        outcomes(&history),
        vec![(
            0,
            vec![
                AttemptOutcome::Retried {
                    error: "try 1".into()
                },
                AttemptOutcome::Retried {
                    error: "try 2".into()
                },
            ]
        )],
        "the queue's record of the retries, before the step settles"
    );
    gate.open();
    until_terminated("the run", &runtime, "flaky").await;
    let history = history_of(&runtime, "flaky").await;
    let attempts = &history.steps[0].attempts;
    assert_eq!(
        attempts.iter().map(|a| a.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(attempts[2].outcome, AttemptOutcome::Succeeded);
    assert_eq!(history.steps[0].name, "FnRunner");
    worker.shutdown().await.unwrap();
}

async fn job_attempts<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> u32 {
    runtime
        .view()
        .run(&rid(id))
        .await
        .unwrap()
        .map_or(0, |details| details.attempts)
}

#[tokio::test(start_paused = true)]
async fn an_attempt_whose_lease_expired_is_recorded_as_lost() {
    let (queue, store, clock) = memory_queue().await;
    let runner = FnRunner(|_step: Step| async move { Ok(StepOutcome::Succeed { result: vec![] }) });
    let runtime = builder(&queue, &store, runner).build();
    submit_run(&runtime, "lost").await;
    // A claim that is never settled: its lease expires.
    let claim = queue
        .claim(STEPS, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the step");
    clock.advance(Duration::from_secs(2));
    queue.reap_now().await.unwrap();
    drop(claim);
    let worker = runtime.spawn(std::future::pending::<()>());
    until_terminated("the run", &runtime, "lost").await;
    let history = history_of(&runtime, "lost").await;
    assert_eq!(
        outcomes(&history),
        vec![(
            0,
            vec![AttemptOutcome::LeaseExpired, AttemptOutcome::Succeeded]
        )]
    );
    worker.shutdown().await.unwrap();
}
