//! Review 41 (c): behaviours of the 0.13 API a drop-in user relies on, each
//! checked against the seed documents under `/work/shared/spec/`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::{
    Error, HEADER_RUN_ID, HEADER_STEP, MemoStore, NoopTerminalHook, RunOptions, RunSpec, RunState,
    Step, StepError, StepErrorKind, StepOutcome, TerminalStatus, WorkflowRuntime, WorkflowView,
};

/// A shared log of what runners observed.
type Log<T> = Arc<Mutex<Vec<T>>>;

/// A delivery's step, job id, headers, attempts and attempt limit.
type Seen = (u32, String, HashMap<String, String>, u32, u32);

fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..Default::default()
    }
}

// seed-lib.rs.txt: "removing the memo entries, ... the terminal record and
// the marker of every run whose marker is at least a window old", and
// "a run's state is removed within a poll interval of the end of its
// window".
#[tokio::test(start_paused = true)]
async fn memo_retention_removes_a_run_exactly_a_window_after_its_end() {
    let (queue, store, clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        step.run_memo.put("note", b"kept").await?;
        Ok(StepOutcome::Succeed {
            result: b"r".to_vec(),
        })
    });
    let rt = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .memo_retention(Duration::from_secs(60))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("edge", "x")).await.unwrap();
    let end = within(10, rt.wait(&rid("edge"))).await.unwrap();
    assert_eq!(end.termination.terminated_at_ms, T0);
    clock.advance(Duration::from_secs(60));
    // A few poll intervals of (paused) time, with the clock at exactly the
    // end of the window.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        rt.status(&rid("edge")).await.unwrap().is_none(),
        "a marker exactly a window old is swept"
    );
    let memos = MemoStore::new(store, MEMO_PREFIX);
    assert!(
        memos
            .new_run_memo(&rid("edge"))
            .get("note")
            .await
            .unwrap()
            .is_none()
    );
    worker.shutdown().await.unwrap();
}

// seed-group.rs.txt: `status`, `resume` and `results` return
// `Error::GroupNotFound` "for a group never submitted"; `cancel` counts
// "the number of members whose request was recorded" (it reads the member
// records only) and `forget` of a group without a manifest "has its member
// records removed and nothing else".
#[tokio::test(start_paused = true)]
async fn a_group_never_submitted_is_not_found_and_cancels_or_forgets_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        FnRunner(ok_runner),
        NoopTerminalHook,
    )
    .build();
    let group = rt.group(rid("nothing"));
    assert!(matches!(
        group.status().await,
        Err(Error::GroupNotFound(id)) if id == "nothing"
    ));
    assert!(matches!(
        group.resume(&RunOptions::default()).await,
        Err(Error::GroupNotFound(id)) if id == "nothing"
    ));
    assert!(matches!(
        group.results().await.map(|_| ()),
        Err(Error::GroupNotFound(id)) if id == "nothing"
    ));
    assert_eq!(group.cancel().await.unwrap(), 0);
    group.forget().await.unwrap();
}

async fn ok_runner(step: Step) -> Result<StepOutcome, StepError> {
    Ok(StepOutcome::Succeed {
        result: step.payload.clone(),
    })
}

// seed-group.rs.txt: "a later one with a different member set is rejected
// with [`Error::GroupMismatch`]" (the manifest holds "the members' keys and
// inputs").
#[tokio::test(start_paused = true)]
async fn a_group_resubmitted_with_another_input_for_a_key_is_a_mismatch() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        FnRunner(ok_runner),
        NoopTerminalHook,
    )
    .build();
    let group = rt.group(rid("gm"));
    group
        .submit(
            vec![member("a", "1"), member("b", "2")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let err = group
        .submit(
            vec![member("a", "1"), member("b", "changed")],
            &RunOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::GroupMismatch(id) if id == "gm"),
        "{err:?}"
    );
    let err = group
        .submit(vec![member("a", "1")], &RunOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::GroupMismatch(id) if id == "gm"),
        "{err:?}"
    );
    assert_eq!(group.status().await.unwrap().total, 2);
}

// seed-group.rs.txt: an empty member list is a manifest like any other;
// `results` yields every member of the manifest (none) and `status` counts
// `total: 0`.
#[tokio::test(start_paused = true)]
async fn an_empty_group_has_no_results_and_counts_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        FnRunner(ok_runner),
        NoopTerminalHook,
    )
    .build();
    let group = rt.group(rid("empty"));
    group
        .submit(Vec::new(), &RunOptions::default())
        .await
        .unwrap();
    let results: Vec<_> = within(5, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert!(results.is_empty());
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.pending,
            status.succeeded,
            status.failed,
            status.cancelled
        ),
        (0, 0, 0, 0, 0)
    );
}

// seed-lib.rs.txt: "Everything staged is applied in the settlement
// transaction that commits the outcome the runner returned, whichever
// outcome that is (`Continue`, `Succeed`, `Fail` or `Cancel`)" and "No
// effects are applied when the runner returns a [`StepError`]".
#[tokio::test(start_paused = true)]
async fn effects_commit_with_continue_and_fail_but_not_with_a_retried_error() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        match (step.step_number, step.attempts) {
            (0, _) => {
                step.effects.put("app/continued", "yes")?;
                Ok(StepOutcome::continue_now(b"next".to_vec()))
            }
            (_, 1) => {
                step.effects.put("app/errored", "yes")?;
                Err(StepError::transient("once"))
            }
            _ => {
                step.effects.put("app/failed", "yes")?;
                step.effects.delete("app/continued")?;
                Ok(StepOutcome::Fail {
                    reason: "no".into(),
                })
            }
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("fx", "x")).await.unwrap();
    let end = within(30, rt.wait(&rid("fx"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.final_step, 1);
    let view = queue.view();
    assert!(view.kv_get(b"app/errored").await.unwrap().is_none());
    assert_eq!(
        view.kv_get(b"app/failed").await.unwrap().as_deref(),
        Some(b"yes".as_slice())
    );
    assert!(
        view.kv_get(b"app/continued").await.unwrap().is_none(),
        "the Fail verdict's delete applied"
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "The returned [`SubmitOutcome`] identifies the run and
// the queue job that currently represents it"; "[`HEADER_RUN_ID`] and
// [`HEADER_STEP`] are set by the runtime on every step"; the delivery
// carries "the submitter's headers, the queue job id, the attempt count and
// limit".
#[tokio::test(start_paused = true)]
async fn the_delivery_names_the_submitted_job_and_only_the_submitters_headers() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Log<Seen> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((
                step.step_number,
                step.job_id.clone(),
                step.headers.clone(),
                step.attempts,
                step.max_attempts,
            ));
            Ok(if step.step_number == 0 {
                StepOutcome::continue_now(b"1".to_vec())
            } else {
                StepOutcome::Succeed {
                    result: b"done".to_vec(),
                }
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let mut s = spec("dl", "x");
    s.options
        .headers
        .insert("tenant".to_string(), "acme".to_string());
    s.options.max_attempts_per_step = Some(7);
    let submitted = rt.submit(s).await.unwrap();
    assert!(submitted.newly_submitted);
    assert_eq!(submitted.run_id, "dl");
    let record = job_record(&queue, &submitted.job_id, "step 0's job").await;
    assert_eq!(
        record.headers.get(HEADER_RUN_ID).map(String::as_str),
        Some("dl")
    );
    assert_eq!(
        record.headers.get(HEADER_STEP).map(String::as_str),
        Some("0")
    );
    assert_eq!(record.payload, b"x");
    let worker = rt.spawn(std::future::pending::<()>());
    let end = within(10, rt.wait(&rid("dl"))).await.unwrap();
    let outcome = end.outcome.expect("recorded");
    assert_eq!(outcome.result.as_deref(), Some(b"done".as_slice()));
    assert_eq!(outcome.final_step, 1);
    assert_eq!(
        outcome.headers,
        HashMap::from([("tenant".to_string(), "acme".to_string())])
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].1, submitted.job_id, "step 0 runs the submitted job");
    assert_ne!(seen[1].1, submitted.job_id);
    for (step, _, headers, attempts, max) in &seen {
        assert_eq!(
            headers,
            &HashMap::from([("tenant".to_string(), "acme".to_string())]),
            "step {step}"
        );
        assert_eq!((*attempts, *max), (1, 7), "step {step}");
    }
    worker.shutdown().await.unwrap();
}

// seed-view.rs.txt: an active run reports `Pending` or `Running` by its
// job's state with its current step; "A run with a pending cancellation
// request reports [`RunState::Cancelling`] at every lifecycle position of
// its step"; a terminated run reports `current_step: record.final_step`.
#[tokio::test(start_paused = true)]
async fn status_follows_the_run_through_its_lifecycle() {
    let (queue, store, clock) = memory_queue().await;
    let gate = Gate::default();
    let g = gate.clone();
    let runner = FnRunner(move |step: Step| {
        let g = g.clone();
        async move {
            if step.step_number == 0 {
                return Ok(StepOutcome::continue_now(b"1".to_vec()));
            }
            g.wait().await;
            Ok(StepOutcome::Succeed {
                result: b"late".to_vec(),
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let mut s = spec("life", "x");
    s.options.run_at =
        Some(std::time::UNIX_EPOCH + Duration::from_millis(T0) + Duration::from_secs(10));
    rt.submit(s).await.unwrap();
    let worker = rt.spawn(std::future::pending::<()>());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = rt.status(&rid("life")).await.unwrap().unwrap();
    assert_eq!(status.run_id, "life");
    assert_eq!((status.state, status.current_step), (RunState::Pending, 0));
    clock.advance(Duration::from_secs(10));
    eventually("step 1 running", || async {
        let s = rt.status(&rid("life")).await.unwrap().unwrap();
        s.state == RunState::Running && s.current_step == 1
    })
    .await;
    assert!(rt.cancel(&rid("life")).await.unwrap());
    let status = rt.status(&rid("life")).await.unwrap().unwrap();
    assert_eq!(
        (status.state, status.current_step),
        (RunState::Cancelling, 1)
    );
    gate.open();
    let end = within(10, rt.wait(&rid("life"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    assert_eq!(end.termination.final_step, 1);
    let outcome = end.outcome.expect("the worker recorded the cancellation");
    assert_eq!(outcome.status, TerminalStatus::Cancelled);
    assert_eq!(
        outcome.error, None,
        "an external cancellation has no reason"
    );
    assert_eq!(outcome.result, None, "the runner's success was discarded");
    let status = rt.status(&rid("life")).await.unwrap().unwrap();
    assert_eq!(status.current_step, 1);
    assert_eq!(status.state, RunState::Terminated(end.termination.clone()));
    assert!(!rt.cancel(&rid("life")).await.unwrap());
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: the hook receives "the submitter's headers and the
// runner's result or error"; "Runs terminated without an acknowledging
// settlement (... a step that dead-letters) settle their notification the
// same way ... so the notification job is created exactly once".
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_run_reaches_the_hook_once_with_its_error_and_headers() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 {
            Ok(StepOutcome::continue_now(b"1".to_vec()))
        } else {
            Err(StepError::transient(format!("flaky {}", step.attempts)))
        }
    });
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("dead", "x");
    s.options.headers.insert("who".into(), "me".into());
    rt.submit(s).await.unwrap();
    let end = within(30, rt.wait(&rid("dead"))).await.unwrap();
    assert_eq!(end.termination.error.as_deref(), Some("flaky 3"));
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Transient));
    assert_eq!(end.termination.final_step, 1);
    eventually("the hook ran", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    assert_eq!(call.run_id, "dead");
    assert_eq!(call.status, TerminalStatus::Failed);
    assert_eq!(call.error.as_deref(), Some("flaky 3"));
    assert_eq!(call.result, None);
    assert_eq!(call.final_step, 1);
    assert_eq!(
        call.headers,
        HashMap::from([("who".to_string(), "me".to_string())])
    );
    assert_eq!(dead_jobs(&queue).await.len(), 1);
    worker.shutdown().await.unwrap();
}

// api-0.13.md: `Memo::run_id`, `Memo::step_number` (`Option<u32>`): the
// per-step memo is "scoped to `(run_id, step_number)`", the run memo is
// "one namespace shared by every step of the run".
#[tokio::test(start_paused = true)]
async fn memos_name_their_run_and_step() {
    let (queue, store, _clock) = memory_queue().await;
    let seen: Log<(String, Option<u32>, String, Option<u32>)> = Arc::default();
    let log = seen.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((
                step.memo.run_id().to_string(),
                step.memo.step_number(),
                step.run_memo.run_id().to_string(),
                step.run_memo.step_number(),
            ));
            Ok(if step.step_number < 2 {
                StepOutcome::continue_now(Vec::new())
            } else {
                StepOutcome::Succeed { result: Vec::new() }
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("m", "x")).await.unwrap();
    within(10, rt.wait(&rid("m"))).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<_> = (0..3)
        .map(|n| ("m".to_string(), Some(n), "m".to_string(), None))
        .collect();
    assert_eq!(seen, expected);
    let memos = MemoStore::new(store, MEMO_PREFIX);
    assert_eq!(memos.new_memo(&rid("m"), 4).step_number(), Some(4));
    assert_eq!(memos.new_run_memo(&rid("m")).step_number(), None);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Typed jobs.

#[derive(Debug, thiserror::Error)]
#[error("doubling failed: {0}")]
struct DoubleError(String);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Double {
    n: u64,
    key: Option<String>,
    fail_first: u32,
    attempts: Option<u32>,
}

impl Double {
    fn plain(n: u64) -> Self {
        Self {
            n,
            key: None,
            fail_first: 0,
            attempts: None,
        }
    }
}

#[derive(Clone, Default)]
struct Attempts(Log<(u64, u32, u32, bool)>);

impl Job for Double {
    const NAME: &'static str = "review.double";
    type Output = u64;
    type Error = DoubleError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u64, DoubleError> {
        ctx.state::<Attempts>().0.lock().unwrap().push((
            self.n,
            ctx.attempts,
            ctx.max_attempts,
            ctx.is_last_attempt(),
        ));
        if ctx.attempts <= self.fail_first {
            return Err(DoubleError(format!("attempt {}", ctx.attempts)));
        }
        Ok(self.n * 2)
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }

    fn max_attempts(&self) -> Option<u32> {
        self.attempts
    }
}

async fn jobs() -> (
    JobRunner,
    Attempts,
    Arc<taquba::Queue>,
    Arc<dyn taquba::object_store::ObjectStore>,
) {
    let (queue, store, _clock) = memory_queue().await;
    let attempts = Attempts::default();
    let runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Double>()
        .state(attempts.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    (runner, attempts, queue, store)
}

// jobs.md: "`Job::max_attempts` overrides the queue's attempt limit for
// that type", and `Job::classify` (default: transient) decides
// "retry-with-backoff up to the attempt limit".
#[tokio::test(start_paused = true)]
async fn a_jobs_own_attempt_limit_replaces_the_queues() {
    let (runner, attempts, _queue, _store) = jobs().await;
    let worker = runner.spawn(std::future::pending::<()>());
    let job = Double {
        fail_first: 4,
        attempts: Some(5),
        ..Double::plain(21)
    };
    let handle = runner.submit(job).await.unwrap();
    assert!(handle.newly_submitted());
    let out = within(60, handle.join()).await.unwrap();
    assert_eq!(out.unwrap(), 42);
    let seen = attempts.0.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (21, 1, 5, false),
            (21, 2, 5, false),
            (21, 3, 5, false),
            (21, 4, 5, false),
            (21, 5, 5, true),
        ]
    );
    worker.shutdown().await.unwrap();
}

// jobs.md: "`Job::idempotency_key` (default `None`: every submission is a
// new job with a fresh id)"; `join_timeout` is `None` while the job runs;
// `JobHandle::status` is the run's status.
#[tokio::test(start_paused = true)]
async fn unkeyed_jobs_are_new_jobs_and_a_handle_reports_status() {
    let (runner, _attempts, _queue, _store) = jobs().await;
    let a = runner.submit(Double::plain(1)).await.unwrap();
    let b = runner.submit(Double::plain(1)).await.unwrap();
    assert!(a.newly_submitted() && b.newly_submitted());
    assert_ne!(a.id(), b.id());
    let status = a.status().await.unwrap().expect("submitted");
    assert_eq!(&status.run_id, a.id());
    assert_eq!((status.state, status.current_step), (RunState::Pending, 0));
    assert!(
        a.join_timeout(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none()
    );
    let worker = runner.spawn(std::future::pending::<()>());
    let out = within(10, a.join()).await.unwrap().unwrap();
    assert_eq!(out, 2);
    let status = a.status().await.unwrap().expect("terminated");
    match status.state {
        RunState::Terminated(t) => {
            assert_eq!(t.status, TerminalStatus::Succeeded);
            assert_eq!(t.final_step, 0);
        }
        other => panic!("expected terminated, found {other:?}"),
    }
    assert_eq!(
        within(10, b.join_timeout(Duration::from_secs(5)))
            .await
            .unwrap()
            .map(|r| r.unwrap()),
        Some(2)
    );
    worker.shutdown().await.unwrap();
}

// jobs.md: "Members are keyed by the job's idempotency key, else
// `item-{i}` by position", and seed-group.rs.txt: a member's run id is "the
// hex SHA-256 digest of `{group_id}/{key}`".
#[tokio::test(start_paused = true)]
async fn job_group_members_run_under_the_group_digest_of_their_keys() {
    let (runner, _attempts, queue, store) = jobs().await;
    let group = runner.group::<Double>(rid("jg"));
    let keyed = Double {
        key: Some("the-key".into()),
        ..Double::plain(5)
    };
    group
        .submit(vec![Double::plain(1), keyed, Double::plain(3)])
        .await
        .unwrap();
    let view = WorkflowView::new(queue.view().clone(), MemoStore::new(store, "jobs-memo"));
    for key in ["item-0", "the-key", "item-2"] {
        let status = view
            .status(&member_run_id("jg", key))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("member {key} runs under the digest of jg/{key}"));
        assert_eq!(status.state, RunState::Pending);
    }
    let worker = runner.spawn(std::future::pending::<()>());
    let joined = within(10, group.join()).await.unwrap();
    let got: Vec<(String, u64)> = joined
        .into_iter()
        .map(|r| (r.key, r.result.unwrap()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("item-0".to_string(), 2),
            ("the-key".to_string(), 10),
            ("item-2".to_string(), 6)
        ]
    );
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded), (3, 3));
    worker.shutdown().await.unwrap();
}

// jobs.md: "A job cancelled or terminated outside its handler reports
// `StepErrorKind::Transient`"; a group's `cancel` is the run group's.
#[tokio::test(start_paused = true)]
async fn a_cancelled_job_group_joins_with_transient_job_errors() {
    let (runner, _attempts, _queue, _store) = jobs().await;
    let group = runner.group::<Double>(rid("jc"));
    group
        .submit(vec![Double::plain(1), Double::plain(2)])
        .await
        .unwrap();
    assert_eq!(group.cancel().await.unwrap(), 2);
    let joined = within(10, group.join()).await.unwrap();
    assert_eq!(joined.len(), 2);
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(r.key, format!("item-{i}"));
        let err = r.result.as_ref().expect_err("cancelled");
        assert_eq!(err.kind, StepErrorKind::Transient);
    }
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.cancelled), (2, 2));
}

// seed-group.rs.txt: `submit` compares the manifest's members (keys and
// inputs, "in submission order") with the stored one: `existing.members !=
// manifest.members` rejects the submission with `Error::GroupMismatch`;
// and a key "can contain characters a run id rejects".
#[tokio::test(start_paused = true)]
async fn a_group_resubmitted_in_another_order_is_a_mismatch_and_keys_are_free_text() {
    let (queue, store, _clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        FnRunner(ok_runner),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .build();
    let group = rt.group(rid("go"));
    group
        .submit(
            vec![member("x/y ü", "1"), member("b", "2")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let run = member_run_id("go", "x/y ü");
    assert!(rt.status(&run).await.unwrap().is_some());
    let err = group
        .submit(
            vec![member("b", "2"), member("x/y ü", "1")],
            &RunOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::GroupMismatch(id) if id == "go"),
        "{err:?}"
    );
}

// seed-group.rs.txt: `results` yields the members "as each one terminates,
// in completion order; a member already terminated is yielded at once".
#[tokio::test(start_paused = true)]
async fn group_results_come_in_completion_order() {
    let (queue, store, clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 && step.payload == b"slow" {
            return Ok(StepOutcome::continue_after(
                b"late".to_vec(),
                Duration::from_secs(30),
            ));
        }
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("order"));
    group
        .submit(
            vec![member("first", "slow"), member("second", "quick")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let mut results = Box::pin(group.results().await.unwrap());
    let one = within(10, results.try_next()).await.unwrap().unwrap();
    assert_eq!(one.key, "second");
    assert_eq!(one.run_id, member_run_id("order", "second"));
    assert_eq!(
        one.outcome.and_then(|o| o.result).as_deref(),
        Some(b"quick".as_slice())
    );
    clock.advance(Duration::from_secs(30));
    let two = within(10, results.try_next()).await.unwrap().unwrap();
    assert_eq!(two.key, "first");
    assert_eq!(two.termination.final_step, 1);
    assert_eq!(two.termination.terminated_at_ms, T0 + 30_000);
    assert!(within(10, results.try_next()).await.unwrap().is_none());
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "One buffered signal is held per correlation key" and
// "A signal with no registered waiter is buffered durably under its
// correlation key and consumed by the next waiter registered for it"; a
// delivered signal wakes its one waiter.
#[tokio::test(start_paused = true)]
async fn a_second_signal_after_a_delivery_is_buffered_for_the_next_waiter() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        if step.step_number == 0 {
            return Ok(StepOutcome::continue_on_signal(
                Vec::new(),
                "k",
                Duration::from_secs(3600),
            ));
        }
        Ok(StepOutcome::Succeed {
            result: step.signal.clone().unwrap_or_else(|| b"none".to_vec()),
        })
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("w1", "x")).await.unwrap();
    until_step("w1 waits", &rt, "w1", 1).await;
    assert_eq!(
        rt.signal("k", b"a".to_vec()).await.unwrap(),
        taquba_workflow::SignalOutcome::Delivered
    );
    assert_eq!(
        rt.signal("k", b"b".to_vec()).await.unwrap(),
        taquba_workflow::SignalOutcome::Buffered
    );
    let end = within(10, rt.wait(&rid("w1"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"a".as_slice())
    );
    rt.submit(spec("w2", "x")).await.unwrap();
    let end = within(10, rt.wait(&rid("w2"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"b".as_slice())
    );
    assert!(!rt.clear_signal("k").await.unwrap(), "consumed");
    worker.shutdown().await.unwrap();
}

// seed-group.rs.txt: a second submission of the same set "submits every
// member whose last recorded termination is not a success"; for a member
// "still active" the submission is the run's duplicate: it "continues".
#[tokio::test(start_paused = true)]
async fn resubmitting_a_group_with_an_active_member_leaves_it_running_once() {
    let (queue, store, clock) = memory_queue().await;
    let calls: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let log = calls.clone();
    let runner = FnRunner(move |step: Step| {
        let log = log.clone();
        async move {
            log.lock()
                .unwrap()
                .push((step.run_id.to_string(), step.step_number));
            if step.step_number == 0 {
                return Ok(StepOutcome::continue_after(
                    Vec::new(),
                    Duration::from_secs(10),
                ));
            }
            Ok(StepOutcome::Succeed {
                result: b"done".to_vec(),
            })
        }
    });
    let rt = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("act"));
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let run = member_run_id("act", "a");
    until_step("a waits", &rt, run.as_str(), 1).await;
    group.resume(&RunOptions::default()).await.unwrap();
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending), (1, 1));
    assert_eq!(rt.status(&run).await.unwrap().unwrap().current_step, 1);
    clock.advance(Duration::from_secs(10));
    let results: Vec<_> = within(10, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].termination.status, TerminalStatus::Succeeded);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![(run.to_string(), 0), (run.to_string(), 1)],
        "step 0 ran once"
    );
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "[`WorkflowRuntime::run`] sweeps the markers on startup
// and at every poll interval"; a terminated run is reported at once by
// `wait_timeout`.
#[tokio::test(start_paused = true)]
async fn a_runtime_sweeps_expired_runs_on_startup() {
    let (queue, store, clock) = memory_queue().await;
    let first = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        FnRunner(ok_runner),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .memo_retention(Duration::from_secs(60))
    .build();
    let worker = first.spawn(std::future::pending::<()>());
    first.submit(spec("old", "x")).await.unwrap();
    within(10, first.wait(&rid("old"))).await.unwrap();
    worker.shutdown().await.unwrap();
    let end = first
        .wait_timeout(&rid("old"), Duration::ZERO)
        .await
        .unwrap()
        .expect("a terminated run is reported at once");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    drop(first);
    clock.advance(Duration::from_secs(61));
    let second = WorkflowRuntime::builder(queue, store, FnRunner(ok_runner), NoopTerminalHook)
        .poll_interval(Duration::from_secs(3600))
        .memo_retention(Duration::from_secs(60))
        .build();
    let worker = second.spawn(std::future::pending::<()>());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        second.status(&rid("old")).await.unwrap().is_none(),
        "swept on startup, well before the first poll interval"
    );
    worker.shutdown().await.unwrap();
}

// seed-group.rs.txt (its sweep test): with `group_retention(1s)` and the
// marker written at 10_000, a sweep at 11_000 "is not yet expired" and one
// at 11_001 removes the group.
#[tokio::test(start_paused = true)]
async fn a_consumed_group_is_kept_for_its_whole_window() {
    let (queue, store, clock) = memory_queue().await;
    let rt = WorkflowRuntime::builder(queue, store, FnRunner(ok_runner), NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .group_retention(Duration::from_secs(60))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("kept"));
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let results: Vec<_> = within(10, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(results.len(), 1);
    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        group.status().await.unwrap().succeeded,
        1,
        "exactly a window after the marker the group is still kept"
    );
    clock.advance(Duration::from_millis(1));
    eventually("swept", || async {
        matches!(group.status().await, Err(Error::GroupNotFound(_)))
    })
    .await;
    worker.shutdown().await.unwrap();
}

// seed-lib.rs.txt: "If the current step is pending or scheduled, the queued
// step job is removed and the run's notification job is enqueued before the
// call returns"; a run "terminated without a worker (a cancellation of a
// pending step ...) has no record". A step waiting out its retry backoff is
// such a step.
#[tokio::test(start_paused = true)]
async fn cancelling_a_step_in_retry_backoff_ends_the_run_before_returning() {
    let clock = taquba::MockClock::new(T0);
    let store: Arc<dyn taquba::object_store::ObjectStore> =
        Arc::new(taquba::object_store::memory::InMemory::new());
    let opts = taquba::OpenOptions::default()
        .clock(Arc::new(clock.clone()))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            taquba::QueueConfig::default()
                .retry_backoff_base(Duration::from_secs(600))
                .max_attempts(3),
        );
    let queue = Arc::new(
        taquba::Queue::open_with_options(store.clone(), "db", opts)
            .await
            .unwrap(),
    );
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let c = calls.clone();
    let runner = FnRunner(move |_step: Step| {
        let c = c.clone();
        async move {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Err::<StepOutcome, _>(StepError::transient("later"))
        }
    });
    let hook = Recorder::default();
    let rt = WorkflowRuntime::builder(queue.clone(), store, runner, hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let mut s = spec("backoff", "x");
    s.options.headers.insert("h".into(), "v".into());
    let submitted = rt.submit(s).await.unwrap();
    eventually("the first attempt failed", || async {
        calls.load(std::sync::atomic::Ordering::SeqCst) == 1
            && queue
                .view()
                .job_record(&submitted.job_id)
                .await
                .unwrap()
                .is_some_and(|j| j.status != taquba::JobStatus::Claimed && j.attempts == 1)
    })
    .await;
    assert_eq!(
        rt.status(&rid("backoff")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    assert!(rt.cancel(&rid("backoff")).await.unwrap());
    let status = rt.status(&rid("backoff")).await.unwrap().unwrap();
    match status.state {
        RunState::Terminated(t) => {
            assert_eq!(t.status, TerminalStatus::Cancelled);
            assert_eq!((t.error, t.error_kind, t.final_step), (None, None, 0));
            assert_eq!(t.terminated_at_ms, T0);
        }
        other => panic!("terminated before cancel returned, found {other:?}"),
    }
    assert!(rt.outcome(&rid("backoff")).await.unwrap().is_none());
    eventually("hooked", || async { !hook.calls().is_empty() }).await;
    let call = &hook.calls()[0];
    assert_eq!(call.status, TerminalStatus::Cancelled);
    assert_eq!(call.error, None);
    assert_eq!(
        call.headers,
        HashMap::from([("h".to_string(), "v".to_string())])
    );
    clock.advance(Duration::from_secs(3600));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the removed step never runs again"
    );
    worker.shutdown().await.unwrap();
}

/// A hook that fails permanently.
#[derive(Clone, Default)]
struct Broken(Arc<Mutex<u32>>);

impl taquba_workflow::TerminalHook for Broken {
    async fn on_termination(
        &self,
        _outcome: &taquba_workflow::RunOutcome,
        _effects: &taquba_workflow::TerminalEffects,
    ) -> Result<(), StepError> {
        *self.0.lock().unwrap() += 1;
        Err(StepError::permanent("hook broken"))
    }
}

// seed-lib.rs.txt: "a permanent error dead-letters [the notification]"; the
// hook "observes only outcomes that committed", so the run's own outcome
// stands.
#[tokio::test(start_paused = true)]
async fn a_dead_lettered_notification_leaves_the_runs_outcome_alone() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Broken::default();
    let rt = WorkflowRuntime::builder(queue.clone(), store, FnRunner(ok_runner), hook.clone())
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    rt.submit(spec("fine", "x")).await.unwrap();
    within(10, rt.wait(&rid("fine"))).await.unwrap();
    eventually("the notification dead-lettered", || async {
        dead_jobs(&queue).await.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(*hook.0.lock().unwrap(), 1);
    let status = rt.status(&rid("fine")).await.unwrap().unwrap();
    match status.state {
        RunState::Terminated(t) => {
            assert_eq!(t.status, TerminalStatus::Succeeded);
            assert_eq!(t.error, None);
        }
        other => panic!("{other:?}"),
    }
    let outcome = rt.outcome(&rid("fine")).await.unwrap().unwrap();
    assert_eq!(outcome.result.as_deref(), Some(b"x".as_slice()));
    // A later run is unaffected by the dead notification.
    rt.submit(spec("next", "y")).await.unwrap();
    let end = within(10, rt.wait(&rid("next"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}
