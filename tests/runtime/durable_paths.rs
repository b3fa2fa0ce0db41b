//! Durable on every path (issue 11): futures dropped at every await point
//! (a request handler whose client disconnects, a `tokio::time::timeout`),
//! a worker loop dropped mid-settlement, storage errors for the whole of a
//! group submission, dead letters racing cancels, concurrent cancels,
//! reserved memo keys and run ids shared by a plain run and a group
//! member.
//!
//! Cancel safety is checked with `drop_at_each_poll`: each call is dropped
//! after 1, 2, … polls until it completes on its own, and after every drop
//! what it left must be nothing or something that completes within
//! bounded (paused) time, and calling again must converge.
//!
//! The calls checked include `cancel_with_reason` and `requeue`, and a
//! submission dropped at any poll right before a crash (`#[ignore]`d: an
//! open upstream race, see its reason).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{
    HOUR, MAX_POLLS, Scripted, ends_within, slow_store_queue, spec, state, tokio_clock_queue,
};
use common::*;
use futures_util::{FutureExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue};
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::{
    Error, GroupMember, Memo, MemoStore, RunGroup, RunOptions, RunSpec, RunState, SignalOutcome,
    Step, StepError, StepOutcome, StepRunner, TerminalHook, TerminalStatus, WorkflowRuntime,
    workflow,
};
use taquba_workflow_suite::testing::{
    FaultConfig, FaultyStore, drop_at_each_poll, no_setup, poll_then_drop,
};

/// The step runner of most tests, driven by the run's input:
/// `"<n>"` counts down through n more steps, `"wait"` waits an hour then
/// succeeds, `"signal:<key>"` waits for a signal on `key` and succeeds
/// with its payload, `"gate"` waits for the gate, `"flaky"` fails
/// permanently while `fail_flaky` is set; anything else succeeds with its
/// input.
#[derive(Clone, Default)]
struct Script {
    gate: Gate,
    fail_flaky: Arc<AtomicBool>,
    /// The run memos of the runs that went through a `"stash"` step.
    stashed: Arc<Mutex<Vec<Memo>>>,
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Ok(n) = input.parse::<u32>() {
            return Ok(match n {
                0 => StepOutcome::Succeed {
                    result: b"counted".to_vec(),
                },
                n => StepOutcome::continue_now((n - 1).to_string().into_bytes()),
            });
        }
        match input.as_str() {
            "wait" => Ok(StepOutcome::continue_after(b"done".to_vec(), HOUR)),
            "gate" => {
                self.gate.wait().await;
                Ok(StepOutcome::Succeed {
                    result: b"passed".to_vec(),
                })
            }
            "flaky" if self.fail_flaky.load(Ordering::SeqCst) => {
                Err(StepError::permanent("flaky member failed"))
            }
            "stash" => {
                self.stashed
                    .lock()
                    .expect("stash lock")
                    .push(step.run_memo.clone());
                Ok(StepOutcome::Succeed {
                    result: b"stashed".to_vec(),
                })
            }
            "woken" => match &step.signal {
                Some(payload) => Ok(StepOutcome::Succeed {
                    result: payload.clone(),
                }),
                None => Ok(StepOutcome::Fail {
                    reason: "no signal".into(),
                }),
            },
            other => match other.strip_prefix("signal:") {
                Some(key) => Ok(StepOutcome::continue_on_signal(
                    b"woken".to_vec(),
                    key,
                    HOUR,
                )),
                None => Ok(StepOutcome::Succeed {
                    result: step.payload.clone(),
                }),
            },
        }
    }
}

/// Let what a dropped call left behind on its own tasks move on.
async fn settle_down() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// The end of run `id` within a minute; panics naming `what` otherwise.
async fn ends<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    what: &str,
) -> TerminalStatus {
    match runtime
        .wait_timeout(&rid(id), Duration::from_secs(60))
        .await
        .unwrap()
    {
        Some(end) => end.termination.status,
        None => panic!(
            "{what}: run {id} did not end ({:?})",
            state(runtime, id).await
        ),
    }
}

/// After a dropped submission of `id`: the run never existed, or it ends
/// within a minute; either way a re-submission ends within a minute.
async fn submission_converges<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: String,
    n: usize,
) {
    settle_down().await;
    let what = format!("submission dropped after {n} polls");
    if state(runtime, &id).await.is_some() {
        assert_eq!(ends(runtime, &id, &what).await, TerminalStatus::Succeeded);
    }
    runtime.submit(spec(&id, "x")).await.unwrap();
    assert_eq!(ends(runtime, &id, &what).await, TerminalStatus::Succeeded);
}

// ---------------------------------------------------------------------------
// 1. Every public call that commits is cancel-safe.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_submission_under_an_explicit_id_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| runtime.submit(spec(&format!("explicit-{n}"), "x")),
        |n, _| submission_converges(&runtime, format!("explicit-{n}"), n),
    )
    .await;
    worker.shutdown().await.unwrap();
}

/// Under `tokio::time::timeout`, as a request handler would call it. The
/// limits (0.1 to 2 ms) are shorter than a submission takes over this
/// store (2 to 4 ms: its commit waits for a WAL flush whose object write
/// takes 0.2 to 2 ms), so the calls are cut short after their commit was
/// written, while it waits for its flush: the run's record is in the queue
/// at the moment of the cut. A commit future dropped there used to skip
/// telling the claim cursor of its job (20 of 20 such runs were never
/// claimed). At least one call is cut short after its commit; every run a
/// cut-short call committed runs to its end without being submitted again;
/// a call that never committed leaves no run, and a re-submission runs.
#[tokio::test(start_paused = true)]
async fn a_submission_cut_short_by_a_timeout_still_runs() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut cut_after_commit = Vec::new();
    for i in 0..20u64 {
        let id = format!("timed-{i}");
        let limit = Duration::from_micros(100 * (i + 1));
        let answered = tokio::time::timeout(limit, runtime.submit(spec(&id, "x"))).await;
        // The run's record at the moment of the cut: a read of the queue's
        // memory that completes without awaiting, so no task ran between
        // the cut and the read (`None` if it would have to wait).
        let at_cut = queue
            .view()
            .kv_get(format!("workflow/runs/{id}").as_bytes())
            .now_or_never()
            .map(|read| read.unwrap().is_some());
        let cut = match answered {
            Ok(submitted) => {
                assert!(submitted.unwrap().newly_submitted, "{id}: answered");
                false
            }
            Err(_) => true,
        };
        if cut && at_cut == Some(true) {
            cut_after_commit.push(id.clone());
        }
        settle_down().await;
        let what =
            format!("{id}, cut short after {limit:?}: {cut}, committed at the cut: {at_cut:?}");
        if state(&runtime, &id).await.is_some() {
            // Committed by the call alone: it runs, with no re-submission.
            assert_eq!(ends(&runtime, &id, &what).await, TerminalStatus::Succeeded);
        } else {
            assert!(cut, "{what}: an answered submission left no run");
            assert_ne!(at_cut, Some(true), "{what}: a written commit was lost");
            runtime.submit(spec(&id, "x")).await.unwrap();
            assert_eq!(ends(&runtime, &id, &what).await, TerminalStatus::Succeeded);
        }
    }
    assert!(
        !cut_after_commit.is_empty(),
        "no submission was cut short after its commit was written: the limits no longer fall \
         inside the commit's wait for its flush"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_submission_under_a_fresh_id_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |_| {
            runtime.submit(RunSpec {
                input: b"fresh".to_vec(),
                ..Default::default()
            })
        },
        |n, submitted| {
            let runtime = &runtime;
            async move {
                if let Some(submitted) = submitted {
                    let id = submitted.unwrap().run_id;
                    let what = format!("fresh submission after {n} polls");
                    ends(runtime, id.as_str(), &what).await;
                }
            }
        },
    )
    .await;
    // A dropped fresh submission leaves no id to look at: every run any of
    // them left behind must end.
    eventually("every run to end", || async {
        let stats = queue.view().stats(STEPS).await.unwrap();
        stats.pending == 0 && stats.claimed == 0 && stats.scheduled == 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

#[derive(Default)]
pub struct Ping;

#[workflow(output = String)]
impl Ping {
    #[step(start)]
    async fn ping(ctx: StepContext<'_>, name: String) -> Result<Transition<PingStep>, StepError> {
        let _ = ctx.step_name();
        Ok(Transition::next(PingStep::Pong { name }))
    }

    #[step]
    async fn pong(name: String) -> Result<Transition<PingStep>, StepError> {
        Ok(Transition::done(format!("pong {name}")))
    }
}

#[tokio::test(start_paused = true)]
async fn a_typed_workflow_start_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let router = taquba_workflow::workflows::Workflows::builder()
        .register(Ping)
        .build();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        router,
        taquba_workflow::NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let input = || PingInput { name: "ada".into() };
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| runtime.start_as(rid(&format!("ping-{n}")), input(), RunOptions::default()),
        |n, _| {
            let runtime = &runtime;
            async move {
                settle_down().await;
                let id = format!("ping-{n}");
                let what = format!("start_as dropped after {n} polls");
                if state(runtime, &id).await.is_some() {
                    ends(runtime, &id, &what).await;
                }
                let run = runtime
                    .start_as(rid(&id), input(), RunOptions::default())
                    .await
                    .unwrap();
                let result = run.wait_timeout(Duration::from_secs(60)).await.unwrap();
                assert!(result.is_some(), "{what}: the re-start did not end");
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

/// Adds two numbers; keyed when `key` is set.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Add {
    a: i64,
    b: i64,
    key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("add failed")]
struct AddError;

impl Job for Add {
    const NAME: &'static str = "durable.add";
    type Output = i64;
    type Error = AddError;

    async fn run(&self, _ctx: JobContext<'_>) -> Result<i64, AddError> {
        Ok(self.a + self.b)
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

fn job_runner(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>) -> JobRunner {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Add>()
        .poll_interval(Duration::from_millis(50))
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_keyed_job_submission_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let jobs = job_runner(&queue, &store);
    let worker = jobs.spawn(std::future::pending::<()>());
    let job = |n: usize| Add {
        a: 1,
        b: 2,
        key: Some(format!("add-{n}")),
    };
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| jobs.submit(job(n)),
        |n, _| {
            let jobs = &jobs;
            async move {
                settle_down().await;
                // The same key answers for whatever the dropped call left.
                let handle = jobs.submit(job(n)).await.unwrap();
                let result = handle.join_timeout(Duration::from_secs(60)).await.unwrap();
                assert!(
                    matches!(result, Some(Ok(3))),
                    "keyed job dropped after {n} polls: {result:?}"
                );
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unkeyed_job_submission_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let jobs = job_runner(&queue, &store);
    let worker = jobs.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |_| {
            jobs.submit(Add {
                a: 2,
                b: 2,
                key: None,
            })
        },
        |n, handle| async move {
            if let Some(handle) = handle {
                let result = handle.unwrap().join_timeout(Duration::from_secs(60)).await;
                assert!(matches!(result, Ok(Some(Ok(4)))), "after {n} polls");
            }
        },
    )
    .await;
    eventually("every job to end", || async {
        let stats = queue.view().stats("jobs").await.unwrap();
        stats.pending == 0 && stats.claimed == 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// After a dropped call reached a waiting run: the run ends `Cancelled`
/// within a minute, or nothing was requested and a new call cancels it.
#[tokio::test(start_paused = true)]
async fn a_cancel_dropped_at_any_poll_cancels_the_run_or_leaves_it_alone() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let id = format!("cancel-{n}");
                runtime.submit(spec(&id, "wait")).await.unwrap();
                until_step("the timer step", runtime, &id, 1).await;
            }
        },
        |n| {
            let runtime = runtime.clone();
            async move { runtime.cancel(&rid(&format!("cancel-{n}"))).await }
        },
        |n, _| {
            let runtime = &runtime;
            async move {
                settle_down().await;
                let id = format!("cancel-{n}");
                let what = format!("cancel dropped after {n} polls");
                match state(runtime, &id).await {
                    Some(RunState::Pending) => {
                        assert!(runtime.cancel(&rid(&id)).await.unwrap(), "{what}");
                    }
                    Some(RunState::Terminated(_)) | Some(RunState::Cancelling) => {}
                    other => panic!("{what}: {other:?}"),
                }
                assert_eq!(ends(runtime, &id, &what).await, TerminalStatus::Cancelled);
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_signal_dropped_at_any_poll_is_delivered_or_not_sent() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let id = format!("sig-{n}");
                runtime
                    .submit(spec(&id, &format!("signal:key-{n}")))
                    .await
                    .unwrap();
                until_step("the signal wait", runtime, &id, 1).await;
            }
        },
        |n| {
            let runtime = runtime.clone();
            async move { runtime.signal(&format!("key-{n}"), b"first".to_vec()).await }
        },
        |n, _| {
            let runtime = &runtime;
            async move {
                settle_down().await;
                let id = format!("sig-{n}");
                let what = format!("signal dropped after {n} polls");
                let end = runtime
                    .wait_timeout(&rid(&id), Duration::from_secs(5))
                    .await
                    .unwrap();
                let end = match end {
                    Some(end) => end,
                    None => {
                        // Not delivered: the run still waits, and a new
                        // signal wakes it.
                        assert_eq!(state(runtime, &id).await, Some(RunState::Pending), "{what}");
                        let sent = runtime
                            .signal(&format!("key-{n}"), b"second".to_vec())
                            .await
                            .unwrap();
                        assert_eq!(sent, SignalOutcome::Delivered, "{what}");
                        runtime
                            .wait_timeout(&rid(&id), Duration::from_secs(60))
                            .await
                            .unwrap()
                            .unwrap_or_else(|| panic!("{what}: never woken"))
                    }
                };
                assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{what}");
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn clearing_a_signal_dropped_at_any_poll_clears_it_or_leaves_it() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let sent = runtime
                    .signal(&format!("clear-{n}"), b"stale".to_vec())
                    .await
                    .unwrap();
                assert_eq!(sent, SignalOutcome::Buffered);
            }
        },
        |n| {
            let runtime = runtime.clone();
            async move { runtime.clear_signal(&format!("clear-{n}")).await }
        },
        |n, _| {
            let runtime = &runtime;
            async move {
                settle_down().await;
                let key = format!("clear-{n}");
                // Cleared now either way, and a waiter does not see it.
                runtime.clear_signal(&key).await.unwrap();
                let id = format!("clear-run-{n}");
                runtime
                    .submit(spec(&id, &format!("signal:{key}")))
                    .await
                    .unwrap();
                until_step("the signal wait", runtime, &id, 1).await;
                assert_eq!(state(runtime, &id).await, Some(RunState::Pending));
                runtime.signal(&key, b"fresh".to_vec()).await.unwrap();
                let end = runtime
                    .wait_timeout(&rid(&id), Duration::from_secs(60))
                    .await
                    .unwrap()
                    .expect("woken");
                let outcome = end.outcome.expect("recorded");
                assert_eq!(
                    outcome.result.as_deref(),
                    Some(&b"fresh"[..]),
                    "after {n} polls"
                );
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

fn members(prefix: &str, input: &str, count: usize) -> Vec<GroupMember> {
    (0..count)
        .map(|i| member(&format!("{prefix}{i}"), input))
        .collect()
}

/// Every member of `group` ends with `status` within a minute.
async fn group_ends(group: &RunGroup, status: TerminalStatus, what: &str) {
    let results: Vec<_> = tokio::time::timeout(Duration::from_secs(60), async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{what}: the group's results did not end ({:?})",
            futures_util::FutureExt::now_or_never(group.status())
        )
    })
    .unwrap();
    assert!(
        results.iter().all(|r| r.termination.status == status),
        "{what}: {results:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_group_submission_dropped_at_any_poll_completes_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let options = RunOptions::default();
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| {
            let group = runtime.group(rid(&format!("g-{n}")));
            let options = &options;
            async move { group.submit(members("m", "x", 6), options).await }
        },
        |n, _| {
            let group = runtime.group(rid(&format!("g-{n}")));
            let options = &options;
            async move {
                settle_down().await;
                let what = format!("group submission dropped after {n} polls");
                match group.status().await {
                    Err(Error::GroupNotFound(_)) => {}
                    Ok(_) => {
                        // Submitted whole, on its own.
                        eventually(&what, || async {
                            group.status().await.unwrap().succeeded == 6
                        })
                        .await;
                    }
                    Err(err) => panic!("{what}: {err}"),
                }
                group.submit(members("m", "x", 6), options).await.unwrap();
                group_ends(&group, TerminalStatus::Succeeded, &what).await;
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_resume_dropped_at_any_poll_completes_or_leaves_the_group_as_it_was() {
    let (queue, store, _clock) = slow_store_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let options = RunOptions::default();
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let group = runtime.group(rid(&format!("resume-{n}")));
            let (options, script) = (&options, &script);
            async move {
                script.fail_flaky.store(true, Ordering::SeqCst);
                group
                    .submit(members("m", "flaky", 4), options)
                    .await
                    .unwrap();
                group_ends(&group, TerminalStatus::Failed, "first submission").await;
                script.fail_flaky.store(false, Ordering::SeqCst);
            }
        },
        |n| {
            let group = runtime.group(rid(&format!("resume-{n}")));
            let options = &options;
            async move { group.resume(options).await }
        },
        |n, _| {
            let group = runtime.group(rid(&format!("resume-{n}")));
            let options = &options;
            async move {
                settle_down().await;
                let what = format!("resume dropped after {n} polls");
                let status = group.status().await.unwrap();
                if status.failed != 4 {
                    eventually(&what, || async {
                        group.status().await.unwrap().succeeded == 4
                    })
                    .await;
                }
                group.resume(options).await.unwrap();
                group_ends(&group, TerminalStatus::Succeeded, &what).await;
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_cancel_dropped_at_any_poll_cancels_every_member_or_none() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let options = RunOptions::default();
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            let options = &options;
            async move {
                let group = runtime.group(rid(&format!("gc-{n}")));
                group
                    .submit(members("m", "wait", 4), options)
                    .await
                    .unwrap();
                for i in 0..4 {
                    let run = member_run_id(&format!("gc-{n}"), &format!("m{i}"));
                    until_step("the timer step", runtime, run.as_str(), 1).await;
                }
            }
        },
        |n| {
            let group = runtime.group(rid(&format!("gc-{n}")));
            async move { group.cancel().await }
        },
        |n, _| {
            let runtime = &runtime;
            let group = runtime.group(rid(&format!("gc-{n}")));
            async move {
                settle_down().await;
                let what = format!("group cancel dropped after {n} polls");
                let mut states = Vec::new();
                for i in 0..4 {
                    let run = member_run_id(&format!("gc-{n}"), &format!("m{i}"));
                    states.push(state(runtime, run.as_str()).await);
                }
                let cancelled = states
                    .iter()
                    .filter(|s| {
                        matches!(s, Some(RunState::Terminated(t)) if t.status == TerminalStatus::Cancelled)
                    })
                    .count();
                let untouched = states
                    .iter()
                    .filter(|s| **s == Some(RunState::Pending))
                    .count();
                assert!(
                    cancelled == 4 || untouched == 4,
                    "{what}: every member cancelled or none: {states:?}"
                );
                if untouched == 4 {
                    assert_eq!(group.cancel().await.unwrap(), 4, "{what}");
                }
                group_ends(&group, TerminalStatus::Cancelled, &what).await;
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_forget_dropped_at_any_poll_forgets_the_group_or_keeps_it() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let options = RunOptions::default();
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let group = runtime.group(rid(&format!("gf-{n}")));
            let options = &options;
            async move {
                group.submit(members("m", "x", 4), options).await.unwrap();
                group_ends(&group, TerminalStatus::Succeeded, "before forget").await;
            }
        },
        |n| {
            let group = runtime.group(rid(&format!("gf-{n}")));
            async move { group.forget().await }
        },
        |n, _| {
            let group = runtime.group(rid(&format!("gf-{n}")));
            let options = &options;
            async move {
                settle_down().await;
                let what = format!("forget dropped after {n} polls");
                match group.status().await {
                    Err(Error::GroupNotFound(_)) => {}
                    Ok(status) => assert_eq!(status.succeeded, 4, "{what}: {status:?}"),
                    Err(err) => panic!("{what}: {err}"),
                }
                group.forget().await.unwrap();
                assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
                // Forgotten whole: the group starts afresh.
                group.submit(members("m", "x", 4), options).await.unwrap();
                group_ends(&group, TerminalStatus::Succeeded, &what).await;
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_job_group_submission_dropped_at_any_poll_completes_or_never_existed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let jobs = job_runner(&queue, &store);
    let worker = jobs.spawn(std::future::pending::<()>());
    let adds = || {
        (0..5)
            .map(|i| Add {
                a: i,
                b: 1,
                key: None,
            })
            .collect::<Vec<_>>()
    };
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| {
            let group = jobs.group::<Add>(rid(&format!("jg-{n}")));
            async move { group.submit(adds()).await }
        },
        |n, _| {
            let group = jobs.group::<Add>(rid(&format!("jg-{n}")));
            async move {
                settle_down().await;
                let what = format!("job group submission dropped after {n} polls");
                if group.status().await.is_ok() {
                    eventually(&what, || async {
                        group.status().await.unwrap().succeeded == 5
                    })
                    .await;
                }
                group.submit(adds()).await.unwrap();
                let joined = tokio::time::timeout(Duration::from_secs(60), group.join())
                    .await
                    .unwrap_or_else(|_| panic!("{what}: join did not end"))
                    .unwrap();
                let sums: Vec<i64> = joined.into_iter().map(|r| r.result.unwrap()).collect();
                assert_eq!(sums, vec![1, 2, 3, 4, 5], "{what}");
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn memo_writes_dropped_at_any_poll_leave_the_old_value_or_the_new_one() {
    let faulty = FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            latency: Some(Duration::from_millis(1)..Duration::from_millis(4)),
            ..FaultConfig::default()
        },
    );
    let memos = MemoStore::new(Arc::new(faulty), "m");
    let computed = AtomicUsize::new(0);
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| {
            let memo = memos.new_run_memo(&rid(&format!("put-{n}")));
            async move { memo.put("k", b"new").await }
        },
        |n, _| {
            let memo = memos.new_run_memo(&rid(&format!("put-{n}")));
            async move {
                let value = memo.get("k").await.unwrap();
                assert!(
                    value.is_none() || value.as_deref() == Some(&b"new"[..]),
                    "put dropped after {n} polls: {value:?}"
                );
            }
        },
    )
    .await;
    drop_at_each_poll(
        MAX_POLLS,
        no_setup,
        |n| {
            let memo = memos.new_memo(&rid(&format!("memoized-{n}")), 0);
            let computed = &computed;
            async move {
                memo.memoized("k", async {
                    computed.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(7u32)
                })
                .await
            }
        },
        |n, _| {
            let memo = memos.new_memo(&rid(&format!("memoized-{n}")), 0);
            async move {
                // Recorded whole or not at all: a retry reads 7 or computes it.
                let value: u32 = memo
                    .memoized("k", async { Ok::<_, Error>(7u32) })
                    .await
                    .unwrap();
                assert_eq!(value, 7, "memoized dropped after {n} polls");
            }
        },
    )
    .await;
    assert!(computed.load(Ordering::SeqCst) > 0);
}

/// The worker loop driven on the caller's task (`WorkflowRuntime::run`)
/// and dropped at any poll: runner calls in flight are delivered again
/// after their leases, settlements in flight complete, and a new worker
/// ends every run.
#[tokio::test(start_paused = true)]
async fn a_worker_loop_dropped_at_any_poll_leaves_every_run_to_end() {
    let queue = tokio_clock_queue(Arc::new(InMemory::new()), OpenOptions::default()).await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    for n in 1..=60 {
        let ids: Vec<String> = (0..4).map(|i| format!("loop-{n}-{i}")).collect();
        for id in &ids {
            runtime.submit(spec(id, "3")).await.unwrap();
        }
        let stopped = poll_then_drop(runtime.run(std::future::pending::<()>()), n).await;
        assert!(stopped.is_none(), "the loop runs until shut down");
        let worker = runtime.spawn(std::future::pending::<()>());
        for id in &ids {
            let what = format!("worker loop dropped after {n} polls");
            assert_eq!(ends(&runtime, id, &what).await, TerminalStatus::Succeeded);
        }
        worker.shutdown().await.unwrap();
    }
}

// ---------------------------------------------------------------------------
// 2. A storage error in a batch never abandons commits already in flight.
// ---------------------------------------------------------------------------

/// Payloads over 16 bytes go to the payload store (`db-payloads/`), whose
/// writes fail at random for the whole of the submission; the members
/// whose commits were in flight when the first one failed must still run.
#[tokio::test(start_paused = true)]
async fn a_group_submitted_through_a_failing_payload_store_completes_on_resume() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    faulty.set_enabled(false);
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let queue = tokio_clock_queue(
        store.clone(),
        OpenOptions::default().payload_offload_threshold(16),
    )
    .await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("faulty-group"));
    let input = "a member input long enough to be offloaded";
    let members = members("m", input, 64);
    let faults = FaultConfig {
        seed: 11,
        rates: [0.3, 0.0, 0.0, 0.0],
        only_under: vec!["db-payloads".to_string()],
        ..FaultConfig::default()
    };
    let submitted = faulty
        .during(
            faults,
            group.submit(members.clone(), &RunOptions::default()),
        )
        .await;
    assert!(
        submitted.is_err(),
        "some payload writes failed, so the submission reports an error"
    );
    assert!(faulty.injected_total() > 0);
    group.resume(&RunOptions::default()).await.unwrap();
    let results: Vec<_> = within(120, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 64);
    for result in &results {
        assert_eq!(result.termination.status, TerminalStatus::Succeeded);
        let outcome = result.outcome.as_ref().expect("recorded");
        assert_eq!(outcome.result.as_deref(), Some(input.as_bytes()));
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 3. A dead letter is a failure, even when a cancel arrives after it.
// ---------------------------------------------------------------------------

/// Submits `id` with one attempt per step and lets a holder's lease on it
/// expire so the reaper dead-letters it; the dead job's last error.
async fn dead_lettered_by_the_reaper<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    queue: &Queue,
    clock: &taquba::MockClock,
    id: &str,
) -> String {
    runtime
        .submit(RunSpec {
            options: RunOptions {
                max_attempts_per_step: Some(1),
                ..Default::default()
            },
            ..spec(id, "x")
        })
        .await
        .unwrap();
    let claim = queue
        .claim(STEPS, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the step job");
    clock.advance(Duration::from_secs(2));
    queue.reap_now().await.unwrap();
    drop(claim);
    let dead = dead_jobs(queue).await;
    assert_eq!(dead.len(), 1);
    dead[0].last_error.clone().expect("the reaper's error")
}

#[tokio::test(start_paused = true)]
async fn a_cancel_after_the_reaper_dead_lettered_the_step_fails_the_run() {
    let (queue, store, clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let error = dead_lettered_by_the_reaper(&runtime, &queue, &clock, "reaped").await;
    assert!(
        !runtime.cancel(&rid("reaped")).await.unwrap(),
        "the dead letter ended the run, not the cancel"
    );
    let Some(RunState::Terminated(termination)) = state(&runtime, "reaped").await else {
        panic!("not terminated");
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    assert_eq!(termination.error.as_deref(), Some(error.as_str()));
    // A cancel of the terminated run is still `false`.
    assert!(!runtime.cancel(&rid("reaped")).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_cancel_waiting_on_a_foreign_holder_whose_step_dead_letters_fails_the_run() {
    let (queue, store, clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    runtime
        .submit(RunSpec {
            options: RunOptions {
                max_attempts_per_step: Some(1),
                ..Default::default()
            },
            ..spec("held", "x")
        })
        .await
        .unwrap();
    // A holder outside this runtime, whose lease runs out.
    let claim = queue
        .claim(STEPS, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the step job");
    let cancel = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.cancel(&rid("held")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!cancel.is_finished(), "the cancel waits for the holder");
    clock.advance(Duration::from_secs(2));
    queue.reap_now().await.unwrap();
    drop(claim);
    let cancelled = within(60, cancel).await.unwrap().unwrap();
    assert!(!cancelled);
    let Some(RunState::Terminated(termination)) = state(&runtime, "held").await else {
        panic!("not terminated");
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    let dead = dead_jobs(&queue).await;
    assert_eq!(termination.error, dead[0].last_error);
}

// ---------------------------------------------------------------------------
// 4. One cancel wins.
// ---------------------------------------------------------------------------

const CANCELLERS: usize = 16;

/// `CANCELLERS` concurrent cancels of `id`: exactly one answers `true`,
/// the run ends `Cancelled` once, and the hook hears of it once.
async fn one_cancel_wins<R: StepRunner + Clone + 'static>(
    runtime: &WorkflowRuntime<R, Recorder>,
    hook: &Recorder,
    id: &str,
    before_wait: impl std::future::Future<Output = ()>,
) {
    let calls: Vec<_> = (0..CANCELLERS)
        .map(|_| {
            let runtime = runtime.clone();
            let id = rid(id);
            tokio::spawn(async move { runtime.cancel(&id).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(within(60, call).await.unwrap().unwrap());
    }
    before_wait.await;
    assert_eq!(
        answers.iter().filter(|a| **a).count(),
        1,
        "{id}: exactly one cancel answers true: {answers:?}"
    );
    assert_eq!(ends(runtime, id, id).await, TerminalStatus::Cancelled);
    eventually("the notification", || async {
        hook.calls().iter().any(|o| o.run_id == rid(id))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let heard = hook.calls().iter().filter(|o| o.run_id == rid(id)).count();
    assert_eq!(heard, 1, "{id}: one terminal notification");
}

fn recorded_runtime(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    script: &Script,
    hook: &Recorder,
) -> WorkflowRuntime<Script, Recorder> {
    WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build()
}

#[tokio::test(start_paused = true)]
async fn of_concurrent_cancels_of_a_pending_run_one_answers_true() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let runtime = recorded_runtime(&queue, &store, &Script::default(), &hook);
    runtime.submit(spec("pending", "x")).await.unwrap();
    // No worker yet: the step stays pending.
    assert_eq!(state(&runtime, "pending").await, Some(RunState::Pending));
    let worker = std::cell::OnceCell::new();
    one_cancel_wins(&runtime, &hook, "pending", async {
        worker.get_or_init(|| runtime.spawn(std::future::pending::<()>()));
    })
    .await;
    worker.into_inner().unwrap().shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn of_concurrent_cancels_of_a_scheduled_run_one_answers_true() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let runtime = recorded_runtime(&queue, &store, &Script::default(), &hook);
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("scheduled", "wait")).await.unwrap();
    until_step("the timer step", &runtime, "scheduled", 1).await;
    one_cancel_wins(&runtime, &hook, "scheduled", async {}).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn of_concurrent_cancels_of_a_signal_waiting_run_one_answers_true() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let runtime = recorded_runtime(&queue, &store, &Script::default(), &hook);
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("waiting", "signal:k")).await.unwrap();
    until_step("the signal wait", &runtime, "waiting", 1).await;
    one_cancel_wins(&runtime, &hook, "waiting", async {}).await;
    // The waiter went with the run: a signal now is buffered.
    assert_eq!(
        runtime.signal("k", b"late".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn of_concurrent_cancels_of_a_running_run_one_answers_true() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let script = Script::default();
    let runtime = recorded_runtime(&queue, &store, &script, &hook);
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("running", "gate")).await.unwrap();
    eventually("the step to run", || async {
        state(&runtime, "running").await == Some(RunState::Running)
    })
    .await;
    // The runner ignores its token: it returns once the gate opens.
    one_cancel_wins(&runtime, &hook, "running", async { script.gate.open() }).await;
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 5. The run result record cannot be erased or forged.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn memos_refuse_the_reserved_run_result_key() {
    let memos = MemoStore::new(Arc::new(InMemory::new()), "m");
    let run = rid("r");
    for memo in [memos.new_run_memo(&run), memos.new_memo(&run, 0)] {
        let err = memo.put(Memo::RESERVED_KEY, b"x").await.unwrap_err();
        assert!(is_invalid_memo_key(&err, "workflow.outcome"), "{err}");
        assert!(err.to_string().contains("workflow.outcome"), "{err}");
        let computed = AtomicBool::new(false);
        let err = memo
            .memoized::<u32, _, Error>("workflow.outcome", async {
                computed.store(true, Ordering::SeqCst);
                Ok(1)
            })
            .await
            .unwrap_err();
        assert!(is_invalid_memo_key(&err, "workflow.outcome"), "{err}");
        assert!(!computed.load(Ordering::SeqCst), "refused before computing");
        // The empty key would be the step memo's directory.
        let err = memo.put("", b"x").await.unwrap_err();
        assert!(is_invalid_memo_key(&err, ""), "{err}");
        // Other keys, `workflow.`-prefixed ones included, are the caller's.
        memo.put("workflow.outcome2", b"ok").await.unwrap();
    }
}

/// A handler that keeps its run memo and writes the reserved key after the
/// run ended cannot erase the committed outcome.
#[tokio::test(start_paused = true)]
async fn a_late_write_to_the_reserved_key_leaves_the_outcome() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("kept", "stash")).await.unwrap();
    assert_eq!(
        ends(&runtime, "kept", "stash").await,
        TerminalStatus::Succeeded
    );
    let memo = script.stashed.lock().unwrap().pop().expect("stashed");
    let late = memo.put("workflow.outcome", b"").await;
    assert!(late.is_err(), "the reserved key is refused");
    let late = memo
        .memoized::<Vec<u8>, _, Error>("workflow.outcome", async { Ok(Vec::new()) })
        .await;
    assert!(late.is_err(), "the reserved key is refused");
    let outcome = runtime.outcome(&rid("kept")).await.unwrap();
    assert_eq!(
        outcome.and_then(|o| o.result).as_deref(),
        Some(&b"stashed"[..]),
        "the committed outcome is intact"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 6. A plain run never aliases a group member.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_plain_submission_under_a_terminated_members_run_id_is_refused() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("g"));
    group
        .submit(vec![member("a", "member input")], &RunOptions::default())
        .await
        .unwrap();
    group_ends(&group, TerminalStatus::Succeeded, "member").await;
    let member_id = member_run_id("g", "a");
    // Another input (the result would differ) and the member's own one.
    for input in ["forged", "member input"] {
        let refused = runtime.submit(spec(member_id.as_str(), input)).await;
        match refused {
            Err(err) => {
                assert!(is_member_run_id(&err, "g", "a"), "{err}");
                assert!(err.to_string().contains("`g`"), "{err}");
            }
            Ok(submitted) => {
                // Let the aliasing run end, to show what it did.
                ends(&runtime, submitted.run_id.as_str(), "alias").await;
                panic!("a plain run was started under member a's run id");
            }
        }
    }
    let results: Vec<_> = group.results().await.unwrap().try_collect().await.unwrap();
    assert_eq!(results.len(), 1);
    let outcome = results[0]
        .outcome
        .as_ref()
        .expect("the member's own outcome");
    assert_eq!(outcome.result.as_deref(), Some(&b"member input"[..]));
    worker.shutdown().await.unwrap();
}

/// A plain submission under an active member's run id: with the member's
/// own input it is a duplicate that commits nothing (the seed's group test
/// expects `newly_submitted == false`), and the member still ends as the
/// group's; with another input it is refused, naming the group and key.
#[tokio::test(start_paused = true)]
async fn a_plain_submission_under_an_active_members_run_id_is_a_duplicate_or_refused() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("g"));
    group
        .submit(vec![member("b", "gate")], &RunOptions::default())
        .await
        .unwrap();
    let member_id = member_run_id("g", "b");
    eventually("the member to run", || async {
        state(&runtime, member_id.as_str()).await == Some(RunState::Running)
    })
    .await;
    let duplicate = runtime
        .submit(spec(member_id.as_str(), "gate"))
        .await
        .expect("a duplicate of the active member");
    assert!(!duplicate.newly_submitted);
    assert_eq!(duplicate.run_id, member_id);
    let refused = runtime.submit(spec(member_id.as_str(), "other")).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|err| is_member_run_id(err, "g", "b")),
        "{refused:?}"
    );
    script.gate.open();
    group_ends(&group, TerminalStatus::Succeeded, "member").await;
    worker.shutdown().await.unwrap();
}

/// The other way round: a plain run that holds a member's run id before
/// the group is submitted is not taken for the member (its end would
/// never write the member's record, and the group's results would wait
/// forever).
#[tokio::test(start_paused = true)]
async fn a_group_does_not_take_a_plain_run_under_a_members_run_id_for_the_member() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let member_id = member_run_id("g", "c");
    runtime
        .submit(spec(member_id.as_str(), "gate"))
        .await
        .unwrap();
    eventually("the plain run to run", || async {
        state(&runtime, member_id.as_str()).await == Some(RunState::Running)
    })
    .await;
    let group = runtime.group(rid("g"));
    let refused = group
        .submit(vec![member("c", "gate")], &RunOptions::default())
        .await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|err| is_member_run_id_taken(err, "c")),
        "{refused:?}"
    );
    script.gate.open();
    assert_eq!(
        ends(&runtime, member_id.as_str(), "plain").await,
        TerminalStatus::Succeeded
    );
    // Once the plain run is gone, the member is submitted as itself.
    group
        .submit(vec![member("c", "gate")], &RunOptions::default())
        .await
        .unwrap();
    group_ends(&group, TerminalStatus::Succeeded, "member").await;
    worker.shutdown().await.unwrap();
}

// The error variants the tests above expect.

fn is_invalid_memo_key(err: &Error, expected: &str) -> bool {
    matches!(err, Error::InvalidMemoKey { key, .. } if key == expected)
}

fn is_member_run_id(err: &Error, group: &str, expected_key: &str) -> bool {
    matches!(err, Error::GroupMemberRunId { group_id, key, .. } if group_id.as_str() == group && key == expected_key)
}

fn is_member_run_id_taken(err: &Error, expected_key: &str) -> bool {
    matches!(err, Error::MemberRunIdTaken { key, .. } if key == expected_key)
}

/// `cancel_with_reason` commits like `cancel` (it records the request and
/// removes the waiting step). README, "Cancel safety": "Every call that
/// commits is safe to drop at any await ... a dropped ... `cancel` ...
/// either did nothing or completes as if awaited". Dropped at each poll,
/// the run must end `Cancelled` (or be left untouched, then a new call
/// cancels it), never stay `Cancelling` with its timer step still waiting.
#[tokio::test(start_paused = true)]
async fn a_cancel_with_reason_dropped_at_any_poll_cancels_the_run_or_leaves_it_alone() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let stuck = Arc::new(Mutex::new(Vec::new()));
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let id = format!("reason-{n}");
                runtime.submit(spec(&id, "wait")).await.unwrap();
                until_step("the timer step", runtime, &id, 1).await;
            }
        },
        |n| {
            let runtime = runtime.clone();
            async move {
                runtime
                    .cancel_with_reason(&rid(&format!("reason-{n}")), "client went away")
                    .await
            }
        },
        |n, _| {
            let runtime = &runtime;
            let stuck = stuck.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let id = format!("reason-{n}");
                if let Some(RunState::Pending) = state(runtime, &id).await {
                    assert!(runtime.cancel(&rid(&id)).await.unwrap());
                }
                if runtime
                    .wait_timeout(&rid(&id), Duration::from_secs(10))
                    .await
                    .unwrap()
                    .is_none()
                {
                    let now = state(runtime, &id).await;
                    stuck.lock().unwrap().push((n, now));
                }
            }
        },
    )
    .await;
    let stuck = stuck.lock().unwrap().clone();
    assert!(
        stuck.is_empty(),
        "runs never ended after a dropped cancel_with_reason (polls, state): {stuck:?}"
    );
    worker.shutdown().await.unwrap();
}

/// `requeue` commits (it re-enqueues a dead-lettered run's step). Dropped at
/// each poll, the run is either still failed (and a new requeue works) or
/// active again and ends.
#[tokio::test(start_paused = true)]
async fn a_requeue_dropped_at_any_poll_requeues_or_leaves_the_run_failed() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let id = format!("requeue-{n}");
                runtime.submit(spec(&id, "perm")).await.unwrap();
                assert_eq!(
                    ends_within(runtime, &id, 60, "dead letter")
                        .await
                        .termination
                        .status,
                    TerminalStatus::Failed
                );
            }
        },
        |n| {
            let runtime = runtime.clone();
            async move { runtime.requeue(&rid(&format!("requeue-{n}"))).await }
        },
        |n, _| {
            let runtime = &runtime;
            async move {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let id = format!("requeue-{n}");
                let what = format!("requeue dropped after {n} polls");
                match state(runtime, &id).await {
                    Some(RunState::Terminated(_)) => {
                        // Failed again after the requeue, or never requeued:
                        // another requeue must be accepted.
                        runtime.requeue(&rid(&id)).await.unwrap();
                    }
                    other => assert!(other.is_some(), "{what}: the run is gone"),
                }
                assert_eq!(
                    ends_within(runtime, &id, 60, &what)
                        .await
                        .termination
                        .status,
                    TerminalStatus::Failed
                );
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

/// A submission dropped at any poll, then a crash: a re-submission of the
/// same id answers for a run that ends, never for a phantom one.
#[tokio::test(start_paused = true)]
#[ignore = "open, upstream (intermittent): taquba 0.14 registers a claim's lease before the claim commits, and its reaper drops a due lease whose claimed record it does not find yet; under paused time the clock can pass the 5 s lease while the new queue's first claim commits, so the job stays claimed with no lease and no attempt redelivers it until the queue is next opened (the driver logs an error naming the job). With a 600 s lease it passes every time; not reproduced with a real crash (tests/runtime/kill9.rs)"]
async fn a_submission_dropped_at_any_poll_then_a_crash_never_answers_for_a_phantom_run() {
    let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            latency: Some(Duration::from_micros(200)..Duration::from_millis(2)),
            ..FaultConfig::default()
        },
    ));
    let phantom = Arc::new(AtomicUsize::new(0));
    for n in [1usize, 2, 3, 5, 8, 13, 21, 34] {
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
        let id = format!("phantom-{n}");
        let _ = poll_then_drop(runtime.submit(spec(&id, "ok")), n).await;
        // Crash right away, before the detached submission had time.
        drop(runtime);
        drop(queue);
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        let again = runtime.submit(spec(&id, "ok")).await.unwrap();
        let end = runtime
            .wait_timeout(&rid(&id), Duration::from_secs(60))
            .await
            .unwrap();
        if end.is_none() {
            phantom.fetch_add(1, Ordering::SeqCst);
            panic!(
                "{id}: resubmitted (newly_submitted={}) but never ends: {:?}",
                again.newly_submitted,
                state(&runtime, &id).await
            );
        }
        worker.shutdown().await.unwrap();
        drop(runtime);
        close(queue).await;
    }
}
