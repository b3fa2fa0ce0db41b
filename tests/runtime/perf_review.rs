//! Review of the performance changes at the public API: waits and job
//! handles report the run's current end (after requeues, after
//! `clear_memos_for_run`, across runtimes and a reopen); fresh submissions
//! dropped at each poll are all-or-nothing; cancellations racing fresh
//! submissions are never lost; group members still complete once.

use crate::common;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba_workflow::jobs::{Job, JobContext, JobRunner, JoinError};
use taquba_workflow::view::RunFilter;
use taquba_workflow::{
    MemoStore, RunEnd, RunId, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};

// ---------------------------------------------------------------------------
// A runner scripted by the run's input.
// ---------------------------------------------------------------------------

/// * `ok:TEXT` succeeds with `TEXT`;
/// * `big` succeeds with 70 KiB;
/// * `fail` a `Fail` verdict; `verdict-cancel` a `Cancel` verdict;
/// * `perm:MSG` a permanent error `MSG`;
/// * `once` fails permanently on its first call, then succeeds with `second`;
/// * `steps:N` continues to step `N`, then succeeds with `{run}@{N}`;
/// * `slow` sleeps 5 ms ignoring its token, then succeeds with `slow`;
/// * anything else succeeds with its input.
#[derive(Clone, Default)]
struct Probe {
    calls: Arc<Mutex<HashMap<String, u32>>>,
    /// Run ids whose step started while the cancel token was already fired
    /// or fired by its end, per run: (started cancelled, ended cancelled).
    tokens: Arc<Mutex<HashMap<String, (bool, bool)>>>,
    once: Arc<AtomicU32>,
    /// Calls per `(run, step)`.
    steps: Arc<Mutex<HashMap<(String, u32), u32>>>,
}

impl Probe {
    fn calls_of(&self, id: &str) -> u32 {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }
    fn all(&self) -> HashMap<String, u32> {
        self.calls.lock().unwrap().clone()
    }
    /// The most calls any one step of `id` had.
    fn max_step_calls(&self, id: &str) -> u32 {
        self.steps
            .lock()
            .unwrap()
            .iter()
            .filter(|((run, _), _)| run == id)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }
}

impl StepRunner for Probe {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        *self
            .calls
            .lock()
            .unwrap()
            .entry(step.run_id.to_string())
            .or_default() += 1;
        *self
            .steps
            .lock()
            .unwrap()
            .entry((step.run_id.to_string(), step.step_number))
            .or_default() += 1;
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(text) = input.strip_prefix("ok:") {
            return Ok(StepOutcome::Succeed {
                result: text.as_bytes().to_vec(),
            });
        }
        if let Some(msg) = input.strip_prefix("perm:") {
            return Err(StepError::permanent(msg.to_string()));
        }
        if let Some(n) = input.strip_prefix("steps:") {
            let last: u32 = n.parse().unwrap();
            if step.step_number < last {
                return Ok(StepOutcome::continue_now(step.payload.clone()));
            }
            return Ok(StepOutcome::Succeed {
                result: format!("{}@{}", step.run_id, step.step_number).into_bytes(),
            });
        }
        match input.as_str() {
            "big" => Ok(StepOutcome::Succeed {
                result: vec![b'x'; 70 << 10],
            }),
            "fail" => Ok(StepOutcome::Fail {
                reason: "nope".into(),
            }),
            "verdict-cancel" => Ok(StepOutcome::Cancel {
                reason: "changed my mind".into(),
            }),
            "once" => {
                if self.once.fetch_add(1, Ordering::SeqCst) == 0 {
                    Err(StepError::permanent("first"))
                } else {
                    Ok(StepOutcome::Succeed {
                        result: b"second".to_vec(),
                    })
                }
            }
            "slow" => {
                let started = step.cancel_token.is_cancelled();
                tokio::time::sleep(Duration::from_millis(5)).await;
                let ended = step.cancel_token.is_cancelled();
                self.tokens
                    .lock()
                    .unwrap()
                    .insert(step.run_id.to_string(), (started, ended));
                Ok(StepOutcome::Succeed {
                    result: b"slow".to_vec(),
                })
            }
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }
}

fn result_of(end: &RunEnd) -> Option<Vec<u8>> {
    end.outcome.as_ref().and_then(|o| o.result.clone())
}

async fn submit_input<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    input: &str,
    options: RunOptions,
) {
    let out = runtime
        .submit(RunSpec {
            run_id: Some(rid(id)),
            input: input.as_bytes().to_vec(),
            options,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(out.newly_submitted);
}

fn one_attempt() -> RunOptions {
    RunOptions {
        max_attempts_per_step: Some(1),
        ..Default::default()
    }
}

/// Poll `fut` at most `n` times (letting other tasks run between polls),
/// then drop it. `Some` if it finished. Between polls, other tasks run and
/// (paused) time moves on by `gap`.
async fn poll_n_then_drop<T>(fut: impl Future<Output = T>, n: usize) -> Option<T> {
    poll_n_gap_then_drop(fut, n, Duration::from_micros(250)).await
}

async fn poll_n_gap_then_drop<T>(
    fut: impl Future<Output = T>,
    n: usize,
    gap: Duration,
) -> Option<T> {
    let mut fut: Pin<Box<_>> = Box::pin(fut);
    for _ in 0..n {
        let polled = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        if let Poll::Ready(value) = polled {
            return Some(value);
        }
        if gap.is_zero() {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(gap).await;
        }
    }
    None
}

// ---------------------------------------------------------------------------
// 1. Waits report the current end.
// ---------------------------------------------------------------------------

/// Every kind of ending: the end a wait reports (here, from a second
/// runtime over the same queue, after the end and while it was pending)
/// equals the end a fresh process reads back from the store, and the
/// outcome equals `outcome()`.
#[tokio::test(start_paused = true)]
async fn waits_report_the_same_end_as_the_store_for_every_kind_of_ending() {
    let (queue, store, clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let other = workflow_builder(&queue, &store, &probe).build();
    let long = "e".repeat(20_000);
    let cases: Vec<(&str, String, RunOptions)> = vec![
        (
            "ok-headers",
            "ok:hello".into(),
            RunOptions {
                headers: HashMap::from([("tenant".into(), "acme".into())]),
                ..Default::default()
            },
        ),
        ("big", "big".into(), RunOptions::default()),
        ("fail", "fail".into(), RunOptions::default()),
        (
            "verdict-cancel",
            "verdict-cancel".into(),
            RunOptions::default(),
        ),
        ("perm-long", format!("perm:{long}"), one_attempt()),
        ("steps", "steps:3".into(), RunOptions::default()),
    ];
    // Waits begun before the worker ran anything.
    let mut early = Vec::new();
    for (id, input, options) in &cases {
        submit_input(&runtime, id, input, options.clone()).await;
        let other = other.clone();
        let id = rid(id);
        early.push(tokio::spawn(async move { other.wait(&id).await }));
    }
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut seen = HashMap::new();
    for ((id, _, _), waiting) in cases.iter().zip(early) {
        let pending_end = within(30, waiting).await.unwrap().unwrap();
        let after = within(5, runtime.wait(&rid(id))).await.unwrap();
        let after_other = within(5, other.wait(&rid(id))).await.unwrap();
        assert_eq!(pending_end, after, "{id}: pending wait vs later wait");
        assert_eq!(after, after_other, "{id}: two runtimes");
        assert_eq!(
            runtime.outcome(&rid(id)).await.unwrap(),
            after.outcome,
            "{id}: wait vs outcome()"
        );
        seen.insert(id.to_string(), after);
    }
    assert_eq!(
        result_of(&seen["ok-headers"]).as_deref(),
        Some(b"hello".as_slice())
    );
    assert_eq!(
        seen["ok-headers"]
            .outcome
            .as_ref()
            .unwrap()
            .headers
            .get("tenant"),
        Some(&"acme".to_string())
    );
    assert_eq!(
        seen["big"]
            .outcome
            .as_ref()
            .unwrap()
            .result
            .as_ref()
            .unwrap()
            .len(),
        70 << 10
    );
    assert_eq!(seen["fail"].termination.status, TerminalStatus::Failed);
    assert_eq!(
        seen["verdict-cancel"].termination.status,
        TerminalStatus::Cancelled
    );
    assert_eq!(seen["perm-long"].termination.status, TerminalStatus::Failed);
    assert_eq!(seen["steps"].termination.final_step, 3);
    worker.shutdown().await.unwrap();
    drop((runtime, other));

    // A fresh process over the same store reads the same ends.
    close(queue).await;
    let queue = open(&store, &clock).await;
    let fresh = workflow_builder(&queue, &store, &probe).build();
    for (id, _, _) in &cases {
        let reread = within(5, fresh.wait(&rid(id))).await.unwrap();
        assert_eq!(reread, seen[*id], "{id}: this process vs a fresh one");
    }
    drop(fresh);
    close(queue).await;
}

/// After `clear_memos_for_run`, a wait (from either runtime over the
/// queue) reports the same termination and no outcome, like `outcome()`;
/// after a requeue ends the run again otherwise, the new end.
#[tokio::test(start_paused = true)]
async fn wait_after_clear_memos_then_requeue_reports_the_current_end() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let other = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());

    // A success, then its memos cleared.
    submit_input(&runtime, "cleared", "ok:kept?", RunOptions::default()).await;
    let first = within(10, runtime.wait(&rid("cleared"))).await.unwrap();
    assert_eq!(result_of(&first).as_deref(), Some(b"kept?".as_slice()));
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    assert!(memos.clear_memos_for_run(&rid("cleared")).await.unwrap() >= 1);
    assert_eq!(runtime.outcome(&rid("cleared")).await.unwrap(), None);
    for rt in [&runtime, &other] {
        let end = within(5, rt.wait(&rid("cleared"))).await.unwrap();
        assert_eq!(end.termination, first.termination);
        assert_eq!(end.outcome, None, "a wait after clear_memos_for_run");
        let end = rt
            .wait_timeout(&rid("cleared"), Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            end.outcome, None,
            "a zero wait_timeout after clear_memos_for_run"
        );
    }

    // A failure, cleared, requeued, succeeding: the new end everywhere;
    // then cleared again: no outcome again.
    submit_input(&runtime, "twice", "once", one_attempt()).await;
    let failed = within(10, runtime.wait(&rid("twice"))).await.unwrap();
    assert_eq!(failed.termination.status, TerminalStatus::Failed);
    memos.clear_memos_for_run(&rid("twice")).await.unwrap();
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move {
            // Wait until the requeue made it active, then wait for its end.
            loop {
                match other.status(&rid("twice")).await.unwrap().map(|s| s.state) {
                    Some(RunState::Terminated(t)) if t.status == TerminalStatus::Succeeded => break,
                    Some(RunState::Terminated(_)) => {}
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            other.wait(&rid("twice")).await
        })
    };
    runtime.requeue(&rid("twice")).await.unwrap();
    let second = within(10, runtime.wait(&rid("twice"))).await.unwrap();
    assert_eq!(second.termination.status, TerminalStatus::Succeeded);
    assert_eq!(result_of(&second).as_deref(), Some(b"second".as_slice()));
    assert_eq!(within(10, waiting).await.unwrap().unwrap(), second);
    assert_eq!(within(5, other.wait(&rid("twice"))).await.unwrap(), second);
    assert_eq!(
        runtime.outcome(&rid("twice")).await.unwrap(),
        second.outcome
    );
    memos.clear_memos_for_run(&rid("twice")).await.unwrap();
    let end = within(5, other.wait(&rid("twice"))).await.unwrap();
    assert_eq!(end.termination, second.termination);
    assert_eq!(end.outcome, None);
    assert_eq!(probe.calls_of("twice"), 2);
    worker.shutdown().await.unwrap();
}

/// A run id submitted again after its run ended (same mock time, same final
/// step, same status, another result): waits report the second result.
#[tokio::test(start_paused = true)]
async fn a_rerun_under_the_same_id_at_the_same_instant_reports_its_own_result() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let other = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_input(&runtime, "again", "ok:one", RunOptions::default()).await;
    let first = within(10, runtime.wait(&rid("again"))).await.unwrap();
    assert_eq!(result_of(&first).as_deref(), Some(b"one".as_slice()));
    submit_input(&runtime, "again", "ok:two", RunOptions::default()).await;
    let second = within(10, other.wait(&rid("again"))).await.unwrap();
    assert_eq!(result_of(&second).as_deref(), Some(b"two".as_slice()));
    assert_eq!(
        within(5, runtime.wait(&rid("again"))).await.unwrap(),
        second
    );
    assert_eq!(
        runtime.outcome(&rid("again")).await.unwrap(),
        second.outcome
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Jobs.
// ---------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
#[error("job error: {0}")]
struct JobErr(String);

/// Doubles `n`; fails permanently on its first call when `fail_first`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Double {
    n: i64,
    label: String,
    fail_first: bool,
}

#[derive(Clone, Default)]
struct JobCalls(Arc<Mutex<HashMap<String, u32>>>);

impl JobCalls {
    fn bump(&self, label: &str) -> u32 {
        let mut calls = self.0.lock().unwrap();
        let n = calls.entry(label.to_string()).or_default();
        *n += 1;
        *n
    }
    fn of(&self, label: &str) -> u32 {
        self.0.lock().unwrap().get(label).copied().unwrap_or(0)
    }
    fn total(&self) -> u32 {
        self.0.lock().unwrap().values().sum()
    }
}

impl Job for Double {
    const NAME: &'static str = "review.double";
    type Output = i64;
    type Error = JobErr;

    async fn run(&self, ctx: JobContext<'_>) -> Result<i64, JobErr> {
        let call = ctx.state::<JobCalls>().bump(&self.label);
        if self.fail_first && call == 1 {
            return Err(JobErr("first".into()));
        }
        Ok(self.n * 2)
    }

    fn classify(&self, _error: &JobErr) -> taquba_workflow::StepErrorKind {
        taquba_workflow::StepErrorKind::Permanent
    }

    fn max_attempts(&self) -> Option<u32> {
        Some(1)
    }
}

fn double(n: i64, label: &str) -> Double {
    Double {
        n,
        label: label.into(),
        fail_first: false,
    }
}

fn job_runner(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>, calls: &JobCalls) -> JobRunner {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Double>()
        .state(calls.clone())
        .poll_interval(Duration::from_millis(50))
        .build()
}

/// Handles awaited before the job ran (no worker yet), right after it
/// ended, and hours after it ended all report its output.
#[tokio::test(start_paused = true)]
async fn handles_awaited_before_during_and_long_after_the_job() {
    let (queue, store, clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let before = runner.submit(double(1, "before")).await.unwrap();
    let before_clone = before.clone();
    let waiting = tokio::spawn(before.into_future());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished());
    let worker = runner.spawn(std::future::pending::<()>());
    assert_eq!(within(10, waiting).await.unwrap().unwrap(), 2);
    assert_eq!(within(5, before_clone.join()).await.unwrap().unwrap(), 2);

    let late = runner.submit(double(5, "late")).await.unwrap();
    until_job_ended(&late).await;
    clock.advance(Duration::from_secs(6 * 3600));
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(within(5, late.clone().into_future()).await.unwrap(), 10);
    assert_eq!(within(5, late.join()).await.unwrap().unwrap(), 10);
    assert_eq!((calls.of("before"), calls.of("late")), (1, 1));
    worker.shutdown().await.unwrap();
}

async fn until_job_ended<J: Job>(handle: &taquba_workflow::jobs::JobHandle<J>) {
    within(10, async {
        loop {
            if let Some(RunState::Terminated(_)) = handle.status().await.unwrap().map(|s| s.state) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A job that ended, whose memos `clear_memos_for_run` then removed: its
/// handle's await agrees with a runtime wait and `fetch_result`, which
/// report no outcome (the output is gone); a handle must not answer the
/// removed output.
#[tokio::test(start_paused = true)]
async fn a_handle_after_clear_memos_agrees_with_wait_and_fetch_result() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner.submit(double(4, "cleared")).await.unwrap();
    until_job_ended(&handle).await;
    let memos = MemoStore::new(store.clone(), "jobs-memo");
    assert!(memos.clear_memos_for_run(handle.id()).await.unwrap() >= 1);
    // What the store says now.
    assert!(handle.fetch_result().await.unwrap().is_none());
    let waiter = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Probe::default(),
        taquba_workflow::NoopTerminalHook,
    )
    .queue_name("jobs")
    .memo_prefix("jobs-memo")
    .build();
    let end = within(5, waiter.wait(handle.id())).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.outcome, None);
    // The handle: the output is gone, so no output.
    let joined = within(5, handle.join()).await;
    assert!(
        !matches!(joined, Ok(Ok(8))),
        "the handle answered the removed output: {joined:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A job handle held across a failure and a requeue (from the inbox)
/// that succeeds: awaited after, the second end.
#[tokio::test(start_paused = true)]
async fn a_handle_held_across_a_requeue_answers_the_second_end() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let worker = runner.spawn(std::future::pending::<()>());
    let handle = runner
        .submit(Double {
            n: 21,
            label: "rq".into(),
            fail_first: true,
        })
        .await
        .unwrap();
    until_job_ended(&handle).await;
    // A clone joined now sees the failure.
    match within(5, handle.clone().into_future()).await {
        Err(JoinError::Job(e)) => assert!(e.message.contains("first"), "{}", e.message),
        other => panic!("expected the first failure, got {other:?}"),
    }
    let inbox = taquba_workflow::inbox::Inbox::new(store.clone(), "jobs-memo");
    inbox
        .send(taquba_workflow::inbox::Command::requeue(
            handle.id().clone(),
        ))
        .await
        .unwrap();
    within(10, async {
        loop {
            if let Some(RunState::Terminated(t)) = handle.status().await.unwrap().map(|s| s.state)
                && t.status == TerminalStatus::Succeeded
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert_eq!(within(5, handle.join()).await.unwrap().unwrap(), 42);
    assert_eq!(calls.of("rq"), 2);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. Submission cancel safety.
// ---------------------------------------------------------------------------

/// Every run the store lists: terminated `Succeeded`, run exactly once by
/// the runner, waitable; returns how many.
async fn assert_all_ran_once<
    R: StepRunner + 'static,
    H: taquba_workflow::TerminalHook + 'static,
>(
    queue: &Queue,
    runtime: &WorkflowRuntime<R, H>,
    probe: &Probe,
) -> usize {
    let page = runtime
        .view()
        .runs(&RunFilter::new().limit(1000))
        .await
        .unwrap();
    for run in &page.runs {
        let end = within(10, runtime.wait(&run.run_id)).await.unwrap();
        assert_eq!(
            end.termination.status,
            TerminalStatus::Succeeded,
            "{}: {:?}",
            run.run_id,
            end
        );
        assert_eq!(
            probe.calls_of(run.run_id.as_str()),
            1,
            "{} ran other than once",
            run.run_id
        );
    }
    // Every run the runner ran is listed.
    let listed: std::collections::HashSet<String> =
        page.runs.iter().map(|r| r.run_id.to_string()).collect();
    for (id, n) in probe.all() {
        assert_eq!(n, 1, "{id} ran {n} times");
        assert!(listed.contains(&id), "{id} ran but is not listed");
    }
    assert!(dead_jobs(queue).await.is_empty());
    page.runs.len()
}

#[tokio::test(start_paused = true)]
async fn a_fresh_submission_dropped_at_each_poll_is_all_or_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut finished = 0;
    let mut answered = Vec::new();
    for n in 0..25 {
        // Also with concurrent fresh submissions, so batches form.
        let mut others = Vec::new();
        for _ in 0..(n % 4) {
            let runtime = runtime.clone();
            others.push(tokio::spawn(async move {
                runtime.submit(RunSpec::default()).await.unwrap()
            }));
        }
        if let Some(done) = poll_n_then_drop(runtime.submit(RunSpec::default()), n).await {
            let out = done.unwrap();
            assert!(out.newly_submitted);
            answered.push(out.run_id);
            finished += 1;
        }
        for other in others {
            let out = other.await.unwrap();
            assert!(out.newly_submitted);
            answered.push(out.run_id);
        }
    }
    // Timed out submissions.
    for ms in [0u64, 1, 2, 5] {
        let _ = tokio::time::timeout(
            Duration::from_millis(ms),
            runtime.submit(RunSpec::default()),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listed = assert_all_ran_once(&queue, &runtime, &probe).await;
    for id in &answered {
        assert_eq!(
            probe.calls_of(id.as_str()),
            1,
            "{id} answered but did not run once"
        );
    }
    assert!(listed >= answered.len());
    assert!(finished > 0, "no submission finished within 25 polls");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_job_submission_dropped_at_each_poll_is_all_or_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let worker = runner.spawn(std::future::pending::<()>());
    let mut answered = Vec::new();
    for n in 0..25usize {
        let label = format!("drop-{n}");
        if let Some(done) = poll_n_then_drop(runner.submit(double(n as i64, &label)), n).await {
            answered.push((label, n as i64, done.unwrap()));
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (label, n, handle) in &answered {
        assert_eq!(within(10, handle.join()).await.unwrap().unwrap(), n * 2);
        assert_eq!(calls.of(label), 1, "{label}");
    }
    let page = runner
        .view()
        .runs(&RunFilter::new().limit(1000))
        .await
        .unwrap();
    for run in &page.runs {
        match &run.state {
            RunState::Terminated(t) => assert_eq!(t.status, TerminalStatus::Succeeded, "{run:?}"),
            other => panic!("{} not ended: {other:?}", run.run_id),
        }
    }
    // Each label ran at most once; as many runs as job calls.
    for n in 0..25usize {
        assert!(calls.of(&format!("drop-{n}")) <= 1);
    }
    assert_eq!(page.runs.len() as u32, calls.total());
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 3. Cancellation racing a fresh submission.
// ---------------------------------------------------------------------------

/// Checks one raced run: the cancel's answer, `wait`, `status` and
/// `outcome` agree, and the runner ran at most once.
async fn check_raced<R: StepRunner + 'static, H: taquba_workflow::TerminalHook + 'static>(
    runtime: &WorkflowRuntime<R, H>,
    probe: &Probe,
    id: &RunId,
    cancelled: bool,
    what: &str,
) {
    let end = within(30, runtime.wait(id)).await.unwrap();
    let status = runtime.status(id).await.unwrap().unwrap();
    let RunState::Terminated(t) = status.state else {
        panic!("{what}: ended but status {:?}", status.state);
    };
    assert_eq!(t, end.termination, "{what}: status vs wait");
    assert_eq!(runtime.outcome(id).await.unwrap(), end.outcome, "{what}");
    let calls = probe.max_step_calls(id.as_str());
    assert!(calls <= 1, "{what}: a step ran {calls} times");
    if cancelled {
        assert_eq!(
            end.termination.status,
            TerminalStatus::Cancelled,
            "{what}: cancel answered true but the run ended {:?}",
            end
        );
    } else {
        // A cancel answering false on a fresh active run that was running
        // is allowed only when the run's end was already committing.
        assert_eq!(
            end.termination.status,
            TerminalStatus::Succeeded,
            "{what}: {end:?}"
        );
        assert_eq!(calls, 1, "{what}");
    }
}

#[tokio::test(start_paused = true)]
async fn cancels_racing_fresh_submissions_are_never_lost() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let canceller = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut answers = [0usize; 2];
    for i in 0..60u64 {
        let input = match i % 3 {
            0 => "slow",
            1 => "ok:fast",
            _ => "steps:2",
        };
        let out = runtime
            .submit(RunSpec {
                input: input.as_bytes().to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        match i % 4 {
            0 => {}
            1 => {
                for _ in 0..(i % 7) {
                    tokio::task::yield_now().await;
                }
            }
            2 => tokio::time::sleep(Duration::from_micros(500 * (i % 9))).await,
            _ => tokio::time::sleep(Duration::from_millis(i % 6)).await,
        }
        let rt = if i % 2 == 0 { &runtime } else { &canceller };
        let cancelled = rt.cancel(&out.run_id).await.unwrap();
        answers[cancelled as usize] += 1;
        check_raced(
            &runtime,
            &probe,
            &out.run_id,
            cancelled,
            &format!("run {i} ({input})"),
        )
        .await;
        if input == "slow" && cancelled {
            // A step that ran and saw no cancellation by its end, yet the
            // run ends Cancelled: allowed ("whatever it returned"); a step
            // that started after the cancel answered must see its token.
            let tokens = probe
                .tokens
                .lock()
                .unwrap()
                .get(out.run_id.as_str())
                .copied();
            if let Some((_, ended)) = tokens {
                assert!(ended, "run {i}: the cancelled step's token never fired");
            }
        }
    }
    assert!(answers[1] > 0, "no cancel won: {answers:?}");
    worker.shutdown().await.unwrap();
}

/// The same race on several threads with the real clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancels_racing_fresh_submissions_on_threads() {
    let (queue, store) = real_clock_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let (runtime, probe, stop) = (runtime.clone(), probe.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut won = 0;
            for i in 0..40u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let input = if (i + t) % 2 == 0 { "slow" } else { "ok:x" };
                let out = runtime
                    .submit(RunSpec {
                        input: input.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                for _ in 0..((i * 7 + t) % 5) {
                    tokio::task::yield_now().await;
                }
                if i % 3 == 0 {
                    tokio::time::sleep(Duration::from_micros(100 * (i % 10))).await;
                }
                let cancelled = runtime.cancel(&out.run_id).await.unwrap();
                won += cancelled as usize;
                check_raced(
                    &runtime,
                    &probe,
                    &out.run_id,
                    cancelled,
                    &format!("t{t} run {i}"),
                )
                .await;
            }
            won
        }));
    }
    let deadline = tokio::time::sleep(Duration::from_secs(8));
    tokio::pin!(deadline);
    let mut won = 0;
    for task in tasks {
        tokio::select! {
            res = task => won += res.unwrap(),
            () = &mut deadline => { stop.store(true, Ordering::Relaxed); panic!("race test took too long"); }
        }
    }
    let _ = won;
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 4. Groups.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn group_members_complete_once_with_their_outputs() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let members: Vec<_> = (0..40)
        .map(|i| member(&format!("m{i}"), &format!("ok:out-{i}")))
        .collect();
    let group = runtime.group(rid("g"));
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    // A second group at once, members with several steps.
    let group2 = runtime.group(rid("g2"));
    let members2: Vec<_> = (0..10)
        .map(|i| member(&format!("s{i}"), "steps:2"))
        .collect();
    group2
        .submit(members2, &RunOptions::default())
        .await
        .unwrap();
    let results: Vec<_> = within(30, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 40);
    for r in &results {
        let i: usize = r.key[1..].parse().unwrap();
        assert_eq!(r.run_id, member_run_id("g", &r.key));
        assert_eq!(r.termination.status, TerminalStatus::Succeeded);
        assert_eq!(
            r.outcome.as_ref().and_then(|o| o.result.clone()),
            Some(format!("out-{i}").into_bytes()),
            "{}",
            r.key
        );
        let end = within(5, runtime.wait(&r.run_id)).await.unwrap();
        assert_eq!(end.outcome, r.outcome);
        assert_eq!(probe.calls_of(r.run_id.as_str()), 1, "{}", r.key);
    }
    let results2: Vec<_> = within(30, async {
        group2
            .results()
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .unwrap();
    assert_eq!(results2.len(), 10);
    for r in &results2 {
        assert_eq!(
            r.outcome.as_ref().and_then(|o| o.result.clone()),
            Some(format!("{}@2", r.run_id).into_bytes())
        );
        assert_eq!(probe.calls_of(r.run_id.as_str()), 3, "{}", r.key);
    }
    // Submitting the same group again runs nothing again.
    group.submit(members, &RunOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for r in &results {
        assert_eq!(probe.calls_of(r.run_id.as_str()), 1, "{} ran again", r.key);
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn job_group_members_complete_once_with_their_outputs() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Double>(rid("jg"));
    let jobs: Vec<_> = (0..30).map(|i| double(i, &format!("jg-{i}"))).collect();
    group.submit(jobs).await.unwrap();
    let joined = within(30, group.join()).await.unwrap();
    assert_eq!(joined.len(), 30);
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(*r.result.as_ref().unwrap(), (i as i64) * 2, "{}", r.key);
        assert_eq!(calls.of(&format!("jg-{i}")), 1);
    }
    worker.shutdown().await.unwrap();
}

/// As above, with the handle's submission returning before the job ran
/// (the worker starts after it), so the handle watched the job's end: after
/// `clear_memos_for_run`, `fetch_result()` and `wait` report no outcome,
/// so the handle must not answer the removed output either, and two
/// clones of one handle must agree.
#[tokio::test(start_paused = true)]
async fn a_handle_that_watched_its_job_end_forgets_the_output_clear_memos_removed() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = JobCalls::default();
    let runner = job_runner(&queue, &store, &calls);
    let handle = runner.submit(double(4, "cleared")).await.unwrap();
    let clone = handle.clone();
    let worker = runner.spawn(std::future::pending::<()>());
    until_job_ended(&handle).await;
    let memos = MemoStore::new(store.clone(), "jobs-memo");
    assert_eq!(memos.clear_memos_for_run(handle.id()).await.unwrap(), 1);
    assert!(handle.fetch_result().await.unwrap().is_none());
    let first = within(5, handle.join()).await;
    let second = within(5, clone.join()).await;
    assert!(
        !matches!(first, Ok(Ok(8))),
        "the handle answered the removed output ({first:?}); its clone answers {second:?}"
    );
    assert_eq!(
        format!("{first:?}"),
        format!("{second:?}"),
        "two clones of one handle"
    );
    worker.shutdown().await.unwrap();
}
