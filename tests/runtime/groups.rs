//! Run groups at the public API: membership across steps, results in
//! completion order, status counts, re-submission, errors, cancellation,
//! `forget` and the group retention sweep.
//!
//! The promises hold under concurrency and at size, in every interleaving
//! the documentation allows (two runtimes over one queue, a real clock):
//! a member that succeeded never runs again; a failed member runs again
//! only through a submission or resume, never twice at once; `results`
//! yields every manifest member once (terminated members first, behind
//! hundreds of waiting ones); the status counts never exceed the manifest;
//! a group cancel counts the members it cancelled. Member keys are any
//! text (up to `MAX_MEMBER_KEY_LEN` bytes, see `limits`).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{
    Counting, Scripted, Tally, TrackedMembers, assert_each_member_once, join_all,
    tokio_clock_queue, tracked_runtime,
};
use common::*;
use futures_util::{StreamExt, TryStreamExt};
use std::collections::HashSet;
use taquba::OpenOptions;
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::object_store::path::Path;
use taquba_workflow::GroupStatus;
use taquba_workflow::{
    Error, GroupMember, MemberResult, NoopTerminalHook, RunGroup, RunId, RunOptions, Step,
    StepError, StepOutcome, StepRunner, TerminalStatus, WorkflowRuntime,
};

/// Every member runs two steps. Step 0 records the call and a run memo
/// entry, then by its input: `wait:{key}` continues on the signal `key`,
/// `fail` fails permanently while `failing` is set, anything else continues
/// at once. Step 1 succeeds with `{input}@{step}`.
#[derive(Clone, Default)]
struct Members {
    calls: Arc<Mutex<Vec<RunId>>>,
    failing: Arc<AtomicBool>,
}

impl Members {
    fn calls_of(&self, run_id: &RunId) -> usize {
        self.calls
            .lock()
            .expect("calls lock")
            .iter()
            .filter(|id| *id == run_id)
            .count()
    }

    /// The calls of every run of the member whose first run is `first`
    /// (its later runs are `{first}-{n}`).
    fn calls_of_member(&self, first: &RunId) -> usize {
        let later = format!("{first}-");
        self.calls
            .lock()
            .expect("calls lock")
            .iter()
            .filter(|id| *id == first || id.starts_with(&later))
            .count()
    }
}

impl StepRunner for Members {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: format!("{input}@{}", step.step_number).into_bytes(),
            });
        }
        self.calls
            .lock()
            .expect("calls lock")
            .push(step.run_id.clone());
        step.run_memo
            .put("started", b"yes")
            .await
            .map_err(StepError::from)?;
        if let Some(key) = input.strip_prefix("wait:") {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_secs(3600),
            ));
        }
        if input == "fail" && self.failing.load(Ordering::SeqCst) {
            return Err(StepError::permanent(format!("rejected {}", step.run_id)));
        }
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

type Runtime = WorkflowRuntime<Members, NoopTerminalHook>;

fn runtime(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>, runner: &Members) -> Runtime {
    workflow_builder(queue, store, runner).build()
}

/// Wait until the group's counts satisfy `check`.
async fn until_status(
    group: &RunGroup,
    what: &str,
    check: impl Fn(&taquba_workflow::GroupStatus) -> bool,
) {
    within(30, async {
        loop {
            let status = group.status().await.expect("status");
            if check(&status) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let _ = what;
}

async fn all_results(group: &RunGroup) -> Vec<MemberResult> {
    within(30, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap()
}

async fn kv_keys(queue: &Queue, prefix: &[u8]) -> Vec<String> {
    queue
        .view()
        .kv_scan(prefix, .., 1000)
        .await
        .expect("scan")
        .entries
        .into_iter()
        .map(|(key, _)| String::from_utf8_lossy(&key).into_owned())
        .collect()
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list")
}

#[tokio::test(start_paused = true)]
async fn results_stream_in_completion_order_across_the_members_steps() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("g1"));
    let options = RunOptions {
        headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
        ..Default::default()
    };
    group
        .submit(
            vec![
                member("slow/1", "wait:gate-1"),
                member("slow 2", "wait:gate-2"),
                member("fast", "now"),
            ],
            &options,
        )
        .await
        .unwrap();
    until_status(&group, "the fast member", |s| s.succeeded == 1).await;
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending, status.succeeded), (3, 2, 1));

    let mut results = std::pin::pin!(group.results().await.unwrap());
    let first = within(1, results.next()).await.unwrap().unwrap();
    assert_eq!(
        first.key, "fast",
        "an already terminated member comes at once"
    );
    runtime.signal("gate-2", b"go".to_vec()).await.unwrap();
    let second = within(5, results.next()).await.unwrap().unwrap();
    assert_eq!(second.key, "slow 2");
    runtime.signal("gate-1", b"go".to_vec()).await.unwrap();
    let third = within(5, results.next()).await.unwrap().unwrap();
    assert_eq!(third.key, "slow/1");
    assert!(within(5, results.next()).await.is_none());

    for (result, input) in [
        (&first, "now"),
        (&second, "wait:gate-2"),
        (&third, "wait:gate-1"),
    ] {
        assert_eq!(result.run_id, member_run_id("g1", &result.key));
        assert_eq!(result.termination.status, TerminalStatus::Succeeded);
        assert_eq!(
            result.termination.final_step, 1,
            "membership held across steps"
        );
        let outcome = result.outcome.as_ref().expect("recorded outcome");
        assert_eq!(outcome.run_id, result.run_id);
        assert_eq!(
            outcome.result.as_deref(),
            Some(format!("{input}@1").as_bytes())
        );
        assert_eq!(
            outcome.headers.get("tenant").map(String::as_str),
            Some("acme")
        );
    }

    // Once all terminated, every member is yielded at once.
    let again = within(1, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_eq!(again.len(), 3);
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.pending,
            status.succeeded,
            status.failed,
            status.cancelled
        ),
        (3, 0, 3, 0, 0)
    );
    assert_eq!(status.group_id, rid("g1"));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_re_submission_runs_only_the_members_that_did_not_succeed() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    runner.failing.store(true, Ordering::SeqCst);
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("batch"));
    let members = vec![
        member("a", "ok"),
        member("b", "fail"),
        member("c", "wait:gate-c"),
    ];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    until_status(&group, "a and b", |s| s.succeeded == 1 && s.failed == 1).await;
    within(30, async {
        while runner.calls_of(&member_run_id("batch", "c")) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(group.cancel().await.unwrap(), 1, "only c is active");
    assert_eq!(
        group.cancel().await.unwrap(),
        0,
        "nothing is active any more"
    );
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.pending,
            status.succeeded,
            status.failed,
            status.cancelled
        ),
        (3, 0, 1, 1, 1)
    );
    let results = all_results(&group).await;
    let by_key: HashMap<_, _> = results.iter().map(|r| (r.key.as_str(), r)).collect();
    let b = &by_key["b"].termination;
    assert_eq!(b.status, TerminalStatus::Failed);
    assert_eq!(
        b.error.as_deref(),
        Some(format!("rejected {}", member_run_id("batch", "b")).as_str())
    );
    assert_eq!(by_key["c"].termination.status, TerminalStatus::Cancelled);

    // The member set is fixed by the first submission.
    assert!(matches!(
        group.submit(members[..2].to_vec(), &RunOptions::default()).await,
        Err(Error::GroupMismatch(id)) if id == "batch"
    ));
    let changed = vec![
        member("a", "changed"),
        members[1].clone(),
        members[2].clone(),
    ];
    assert!(matches!(
        group.submit(changed, &RunOptions::default()).await,
        Err(Error::GroupMismatch(_))
    ));
    assert!(matches!(
        group.submit(vec![member("x", "1"), member("x", "2")], &RunOptions::default()).await,
        Err(Error::DuplicateMemberKey(key)) if key == "x"
    ));

    runner.failing.store(false, Ordering::SeqCst);
    runtime.signal("gate-c", b"go".to_vec()).await.unwrap();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = all_results(&group).await;
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    assert_eq!(
        runner.calls_of(&member_run_id("batch", "a")),
        1,
        "a is not run again"
    );
    // b and c ran again, each under the member's derived run id (0.13's).
    let by_key: HashMap<_, _> = results.iter().map(|r| (r.key.as_str(), r)).collect();
    for key in ["b", "c"] {
        let run_id = member_run_id("batch", key);
        assert_eq!(by_key[key].run_id, run_id, "{key}");
        assert_eq!(runner.calls_of(&run_id), 2, "{key}");
    }
    assert_eq!(by_key["a"].run_id, member_run_id("batch", "a"));

    // resume from the manifest alone: nothing left to run.
    group.resume(&RunOptions::default()).await.unwrap();
    let status = group.status().await.unwrap();
    assert_eq!((status.succeeded, status.pending), (3, 0));
    assert_eq!(runner.calls.lock().unwrap().len(), 5);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn unknown_groups_and_unsubmitted_members_are_named_errors() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let unknown = runtime.group(rid("nobody"));
    assert!(matches!(unknown.status().await, Err(Error::GroupNotFound(id)) if id == "nobody"));
    assert!(matches!(
        unknown.results().await.err(),
        Some(Error::GroupNotFound(_))
    ));
    assert!(matches!(
        unknown.resume(&RunOptions::default()).await,
        Err(Error::GroupNotFound(_))
    ));
    assert_eq!(unknown.cancel().await.unwrap(), 0);

    // A submission that fails after writing the manifest leaves members
    // without records.
    let group = runtime.group(rid("half"));
    let bad = RunOptions {
        headers: HashMap::from([("workflow.mine".to_string(), "x".to_string())]),
        ..Default::default()
    };
    let submitted = group
        .submit(vec![member("a", "ok"), member("b", "ok")], &bad)
        .await;
    assert!(matches!(submitted, Err(Error::ReservedHeaderInSubmit(h)) if h == "workflow.mine"));
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending), (2, 0));
    let first = std::pin::pin!(group.results().await.unwrap())
        .next()
        .await
        .unwrap();
    match first {
        Err(Error::MemberNotSubmitted { group_id, key }) => {
            assert_eq!(group_id, "half");
            assert!(key == "a" || key == "b", "{key}");
        }
        other => panic!("expected MemberNotSubmitted, got {other:?}"),
    }

    // resume submits them.
    let worker = runtime.spawn(std::future::pending::<()>());
    group.resume(&RunOptions::default()).await.unwrap();
    let results = all_results(&group).await;
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_run_options_apply_to_every_member() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let options = RunOptions {
        priority: Some(3),
        max_attempts_per_step: Some(5),
        headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
        ..Default::default()
    };
    runtime
        .group(rid("opts"))
        .submit(vec![member("a", "ok"), member("b", "ok")], &options)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let job = queue
            .claim("workflow-steps", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("a member's step job");
        assert_eq!(job.priority, 3);
        assert_eq!(job.max_attempts, 5);
        assert_eq!(job.headers.get("tenant").map(String::as_str), Some("acme"));
        seen.push(
            job.headers
                .get("workflow.run_id")
                .cloned()
                .expect("run id header"),
        );
    }
    seen.sort();
    let mut expected = vec![
        member_run_id("opts", "a").to_string(),
        member_run_id("opts", "b").to_string(),
    ];
    expected.sort();
    assert_eq!(seen, expected);
}

#[tokio::test(start_paused = true)]
async fn forget_removes_everything_and_a_later_submission_starts_afresh() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("gone"));
    let members = vec![member("a", "ok"), member("b", "ok")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(all_results(&group).await.len(), 2);
    assert!(
        !objects_under(&store, "workflow-steps-memo")
            .await
            .is_empty()
    );
    assert_eq!(kv_keys(&queue, b"workflow/groups/").await.len(), 2);

    group.forget().await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    assert!(kv_keys(&queue, b"workflow/groups/").await.is_empty());
    assert!(
        kv_keys(&queue, b"workflow/group-submissions/")
            .await
            .is_empty()
    );
    assert!(kv_keys(&queue, b"workflow/outcomes/").await.is_empty());
    assert_eq!(
        objects_under(&store, "workflow-steps-memo").await,
        Vec::<String>::new(),
        "memos, result records and the manifest are gone"
    );
    for key in ["a", "b"] {
        assert!(
            runtime
                .status(&member_run_id("gone", key))
                .await
                .unwrap()
                .is_none()
        );
    }

    group.submit(members, &RunOptions::default()).await.unwrap();
    assert_eq!(all_results(&group).await.len(), 2);
    assert_eq!(
        runner.calls_of(&member_run_id("gone", "a")),
        2,
        "ran again after forget"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn group_retention_removes_a_group_a_window_after_its_results_were_consumed() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = workflow_builder(&queue, &store, &runner)
        .group_retention(Duration::from_secs(1))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("kept"));
    group
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    until_status(&group, "a", |s| s.succeeded == 1).await;

    // Results never consumed: the group is retained.
    clock.advance(Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(group.status().await.unwrap().succeeded, 1);

    assert_eq!(all_results(&group).await.len(), 1);
    assert_eq!(kv_keys(&queue, b"workflow/group-terminals/").await.len(), 1);
    clock.advance(Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        group.status().await.unwrap().succeeded,
        1,
        "the window has not passed"
    );

    clock.advance(Duration::from_millis(1));
    within(30, async {
        while group.status().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    assert!(kv_keys(&queue, b"workflow/groups/").await.is_empty());
    assert!(
        kv_keys(&queue, b"workflow/group-terminals/")
            .await
            .is_empty()
    );
    assert!(kv_keys(&queue, b"workflow/outcomes/").await.is_empty());
    assert!(
        objects_under(&store, "workflow-steps-memo")
            .await
            .is_empty()
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_survives_a_restart_and_cancel_removes_its_members_signal_waits() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let runner = Members::default();
    {
        let queue = open(&store, &clock).await;
        let runtime = runtime(&queue, &store, &runner);
        let worker = runtime.spawn(std::future::pending::<()>());
        let group = runtime.group(rid("durable"));
        group
            .submit(
                vec![
                    member("done", "ok"),
                    member("waits-1", "wait:w-1"),
                    member("waits-2", "wait:w-2"),
                ],
                &RunOptions::default(),
            )
            .await
            .unwrap();
        until_status(&group, "done", |s| s.succeeded == 1).await;
        within(30, async {
            while kv_keys(&queue, b"workflow/signals/waiters/").await.len() < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        worker.shutdown().await.unwrap();
        drop(group);
        drop(runtime);
        match Arc::try_unwrap(queue) {
            Ok(queue) => queue.close().await.unwrap(),
            Err(_) => panic!("the queue is still shared at close"),
        }
    }

    let queue = open(&store, &clock).await;
    let runtime = runtime(&queue, &store, &runner);
    let group = runtime.group(rid("durable"));
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.succeeded, status.pending), (3, 1, 2));
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut results = std::pin::pin!(group.results().await.unwrap());
    assert_eq!(
        within(1, results.next()).await.unwrap().unwrap().key,
        "done"
    );
    runtime.signal("w-1", b"go".to_vec()).await.unwrap();
    let woken = within(5, results.next()).await.unwrap().unwrap();
    assert_eq!(woken.key, "waits-1");
    assert_eq!(woken.termination.status, TerminalStatus::Succeeded);

    assert_eq!(group.cancel().await.unwrap(), 1);
    let cancelled = within(5, results.next()).await.unwrap().unwrap();
    assert_eq!(cancelled.key, "waits-2");
    assert_eq!(cancelled.termination.status, TerminalStatus::Cancelled);
    assert!(within(5, results.next()).await.is_none());
    assert!(
        kv_keys(&queue, b"workflow/signals/").await.is_empty(),
        "the cancelled member's wait is gone"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_member_does_not_hold_back_a_group_larger_than_the_window() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = workflow_builder(&queue, &store, &runner)
        .max_concurrent_steps(64)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("wide"));
    let mut members = vec![member("slow", "wait:wide-gate")];
    members.extend((0..299).map(|i| member(&format!("m{i:03}"), "ok")));
    group.submit(members, &RunOptions::default()).await.unwrap();
    let mut results = std::pin::pin!(group.results().await.unwrap());
    for n in 0..299 {
        let result = within(60, results.next()).await.unwrap().unwrap();
        assert_ne!(
            result.key, "slow",
            "result {n} came before the slow member's signal"
        );
    }
    runtime.signal("wide-gate", b"go".to_vec()).await.unwrap();
    assert_eq!(
        within(5, results.next()).await.unwrap().unwrap().key,
        "slow"
    );
    assert!(within(5, results.next()).await.is_none());
    worker.shutdown().await.unwrap();
}

/// Re-submissions of a group racing with its members' terminations (a
/// real clock, two threads) must leave running members alone and never run
/// a succeeded member again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_re_submitted_while_members_finish_runs_each_member_once() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::default();
    let runtime = WorkflowRuntime::builder(queue, store, runner.clone(), NoopTerminalHook)
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for round in 0..10 {
        let id = format!("race-{round}");
        let group = runtime.group(rid(&id));
        let members: Vec<GroupMember> = (0..20).map(|i| member(&format!("m{i}"), "ok")).collect();
        for _ in 0..15 {
            group
                .submit(members.clone(), &RunOptions::default())
                .await
                .unwrap();
        }
        let results = within(30, async {
            group.results().await.unwrap().try_collect::<Vec<_>>().await
        })
        .await
        .unwrap();
        assert_eq!(results.len(), 20);
        for i in 0..20 {
            let run_id = member_run_id(&id, &format!("m{i}"));
            assert_eq!(runner.calls_of(&run_id), 1, "{id}/m{i} ran more than once");
        }
    }
    worker.shutdown().await.unwrap();
}

/// Submissions of one group racing each other (two tasks on one runtime
/// and one on a second runtime over the same queue, a real clock, two
/// threads), over more members than one submission transaction carries:
/// a member that succeeded is never run again, and one that failed is run
/// again only by a submission, at most once per submission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_of_one_group_never_run_a_succeeded_member_again() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::default();
    runner.failing.store(true, Ordering::SeqCst);
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(5))
    .build();
    let other = WorkflowRuntime::builder(queue, store, runner.clone(), NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let failing = |n: usize| n.is_multiple_of(7);
    let members: Vec<GroupMember> = (0..600)
        .map(|n| member(&format!("m{n:03}"), if failing(n) { "fail" } else { "ok" }))
        .collect();
    let runs = |n: usize| runner.calls_of_member(&member_run_id("crowd", &format!("m{n:03}")));
    let group = runtime.group(rid("crowd"));
    for round in 1..=3 {
        let before: Vec<usize> = (0..600).map(runs).collect();
        let groups = [
            runtime.group(rid("crowd")),
            runtime.group(rid("crowd")),
            other.group(rid("crowd")),
        ];
        let options = RunOptions::default();
        let submits = groups
            .iter()
            .map(|group| group.submit(members.clone(), &options));
        for submitted in within(60, futures_util::future::join_all(submits)).await {
            submitted.expect("submit");
        }
        let results = all_results(&group).await;
        assert_eq!(results.len(), 600, "round {round}");
        for result in &results {
            let n: usize = result.key[1..].parse().unwrap();
            let expected = if failing(n) && round == 1 {
                TerminalStatus::Failed
            } else {
                TerminalStatus::Succeeded
            };
            assert_eq!(
                result.termination.status, expected,
                "round {round}: {}",
                result.key
            );
        }
        for (n, before) in before.into_iter().enumerate() {
            let ran = runs(n) - before;
            match (round, failing(n)) {
                (1, false) => assert_eq!(ran, 1, "m{n:03} ran {ran} times"),
                (1, true) | (2, true) => assert!(
                    (1..=3).contains(&ran),
                    "round {round}: failed m{n:03} ran {ran} times for 3 submissions"
                ),
                _ => assert_eq!(ran, 0, "round {round}: succeeded m{n:03} ran again"),
            }
        }
        runner.failing.store(false, Ordering::SeqCst);
    }
    worker.shutdown().await.unwrap();
}

/// A group forgotten by a release whose `forget` left running members
/// running (set up by removing its records, as that `forget` did):
/// submitting the group again before they finish must not start a second
/// run of them, and the finished members start afresh.
#[tokio::test(start_paused = true)]
async fn a_member_left_running_by_an_earlier_forget_is_not_started_twice() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("amnesia"));
    let members = vec![member("quick", "ok"), member("slow", "wait:amnesia-gate")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let slow = member_run_id("amnesia", "slow");
    within(30, async {
        while runner.calls_of(&slow) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    until_status(&group, "quick done", |s| s.succeeded == 1).await;
    forget_leaving_members_running(&queue, &store, MEMO_PREFIX, "amnesia").await;
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));

    group.submit(members, &RunOptions::default()).await.unwrap();
    runtime
        .signal("amnesia-gate", b"go".to_vec())
        .await
        .unwrap();
    let results = all_results(&group).await;
    assert_eq!(results.len(), 2);
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    assert_eq!(
        runner.calls_of(&slow),
        1,
        "the running member was not started again"
    );
    assert_eq!(
        runner.calls_of(&member_run_id("amnesia", "quick")),
        2,
        "the forgotten finished member starts afresh"
    );
    worker.shutdown().await.unwrap();
}

/// Members whose inputs add up to more than one submission transaction
/// takes (30 inputs of 200 KiB, under the queue's offload threshold so
/// they are inline) are split across transactions and each runs once with
/// its own input.
#[tokio::test(start_paused = true)]
async fn members_with_large_inputs_are_submitted_across_transactions() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let runtime = runtime(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("heavy"));
    let members: Vec<GroupMember> = (0..30u8)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: vec![b'a' + i % 26; 200 * 1024],
        })
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = all_results(&group).await;
    assert_eq!(results.len(), 30);
    for result in results {
        assert_eq!(result.termination.status, TerminalStatus::Succeeded);
        let i: u8 = result.key[1..].parse().unwrap();
        let output = result.outcome.expect("recorded").result.expect("a result");
        assert_eq!(output.len(), 200 * 1024 + 2, "{}", result.key);
        assert!(output.starts_with(&[b'a' + i % 26; 16]), "{}", result.key);
        assert_eq!(runner.calls_of(&member_run_id("heavy", &result.key)), 1);
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Submissions refused whole.

/// The member set is a list: the same members in another order are a
/// different submission (`GroupMismatch`), and the group is left as it was.
#[tokio::test(start_paused = true)]
async fn a_re_submission_listing_the_same_members_in_another_order_is_a_mismatch() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("order"));
    let members = vec![member("a", "ok"), member("b", "ok"), member("c", "ok")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let mut reversed = members.clone();
    reversed.reverse();
    let again = group.submit(reversed, &RunOptions::default()).await;
    assert!(
        matches!(&again, Err(Error::GroupMismatch(id)) if id == "order"),
        "{again:?}"
    );
    let results = within(30, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "order");
    worker.shutdown().await.unwrap();
}

/// A submission rejected for a duplicate key writes nothing, and one
/// rejected as a mismatch submits none of its new members.
#[tokio::test(start_paused = true)]
async fn rejected_submissions_write_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let group = rt.group(rid("strict"));
    let dup = vec![member("x", "ok"), member("y", "ok"), member("x", "ok")];
    assert!(matches!(
        group.submit(dup, &RunOptions::default()).await,
        Err(Error::DuplicateMemberKey(k)) if k == "x"
    ));
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    for key in ["x", "y"] {
        assert!(
            rt.status(&member_run_id("strict", key))
                .await
                .unwrap()
                .is_none()
        );
    }
    // Empty keys are keys too.
    assert!(matches!(
        group.submit(vec![member("", "1"), member("", "2")], &RunOptions::default()).await,
        Err(Error::DuplicateMemberKey(k)) if k.is_empty()
    ));

    group
        .submit(vec![member("x", "ok")], &RunOptions::default())
        .await
        .unwrap();
    let bigger = vec![member("x", "ok"), member("z", "ok")];
    assert!(matches!(
        group.submit(bigger, &RunOptions::default()).await,
        Err(Error::GroupMismatch(_))
    ));
    assert!(
        rt.status(&member_run_id("strict", "z"))
            .await
            .unwrap()
            .is_none(),
        "a mismatched submission submitted a new member"
    );
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending), (1, 1));
}

// ---------------------------------------------------------------------------
// Unusual member keys.

fn unusual_keys() -> Vec<String> {
    vec![
        String::new(),
        "/".into(),
        "//".into(),
        "a".into(),
        "a/".into(),
        "a/b".into(),
        "a/b/".into(),
        "../other-group/x".into(),
        " a".into(),
        "a ".into(),
        "Ünïcödé ключ 鍵 🔑".into(),
        "line\nbreak\ttab".into(),
        "nul\0byte".into(),
        "%2F%00".into(),
        "workflow.group_key".into(),
        "k".repeat(1024),
        "é".repeat(600),
    ]
}

/// Keys are any text: each member keeps its exact key, its run id is the
/// digest of `{group_id}/{key}`, a re-submission matches the manifest and
/// runs nothing again.
#[tokio::test(start_paused = true)]
async fn unusual_member_keys_round_trip() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("odd-keys"));
    let members: Vec<GroupMember> = unusual_keys()
        .iter()
        .enumerate()
        .map(|(i, k)| member(k, if i % 3 == 0 { "flaky" } else { "ok" }))
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(60, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "odd-keys");
    for r in &results {
        assert_eq!(r.run_id, member_run_id("odd-keys", &r.key), "{:?}", r.key);
        let status = rt.status(&r.run_id).await.unwrap();
        assert!(
            status.is_some(),
            "no run under the documented id for {:?}",
            r.key
        );
    }
    let status = group.status().await.unwrap();
    assert_eq!(status.total, members.len());
    assert_eq!(
        status.succeeded + status.failed,
        members.len(),
        "{status:?}"
    );
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(60, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "odd-keys again");
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded),
        "{:?}",
        results
            .iter()
            .map(|r| (&r.key, r.termination.status))
            .collect::<Vec<_>>()
    );
    for (i, m) in members.iter().enumerate() {
        assert_eq!(
            runner.starts(&member_run_id("odd-keys", &m.key)),
            if i % 3 == 0 { 2 } else { 1 },
            "{:?}",
            m.key
        );
    }
    // The key "a" and its prefix-sharing siblings are distinct members;
    // forgetting removes them all.
    group.forget().await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Large groups, and the order of results.

async fn large_group(n: usize) {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = WorkflowRuntime::builder(queue, store, runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(64)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let id = format!("large-{n}");
    let group = rt.group(rid(&id));
    let flaky = |i: usize| i % 97 == 13;
    // Keys out of lexical order, so a key-ordered listing differs from the
    // manifest's order.
    let members: Vec<GroupMember> = (0..n)
        .map(|i| {
            member(
                &format!("k{}", (i * 7919) % n),
                if flaky(i) { "flaky" } else { "ok" },
            )
        })
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(120, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, &id);
    let failed: usize = results
        .iter()
        .filter(|r| r.termination.status == TerminalStatus::Failed)
        .count();
    let n_flaky = (0..n).filter(|i| flaky(*i)).count();
    assert_eq!(failed, n_flaky, "{id}");
    for r in &results {
        assert_eq!(
            r.run_id,
            member_run_id(&id, &r.key),
            "{id}: run id of {}",
            r.key
        );
    }
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.succeeded,
            status.failed,
            status.pending
        ),
        (n, n - n_flaky, n_flaky, 0)
    );

    group.resume(&RunOptions::default()).await.unwrap();
    let results = within(120, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, &id);
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    // A member run again keeps its derived run id.
    for r in &results {
        assert_eq!(r.run_id, member_run_id(&id, &r.key), "{id}: {}", r.key);
    }
    for (i, m) in members.iter().enumerate() {
        let starts = runner.starts(&member_run_id(&id, &m.key));
        assert_eq!(starts, if flaky(i) { 2 } else { 1 }, "{id}: {}", m.key);
    }
    // Nothing left to run.
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    group.resume(&RunOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let total: usize = members
        .iter()
        .map(|m| runner.starts(&member_run_id(&id, &m.key)))
        .sum();
    assert_eq!(total, n + n_flaky, "{id}: a succeeded member ran again");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_of_257_members_resumes_only_its_failures() {
    large_group(257).await;
}

#[tokio::test(start_paused = true)]
async fn a_group_of_1000_members_resumes_only_its_failures() {
    large_group(1000).await;
}

/// `results` yields already terminated members first, even when more than
/// the 256-member window of members ahead of them in the manifest are still
/// waiting.
#[tokio::test(start_paused = true)]
async fn results_yield_terminated_members_first_behind_300_waiting_members() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = WorkflowRuntime::builder(queue, store, runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(64)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("crowded"));
    let mut members: Vec<GroupMember> = (0..300)
        .map(|i| member(&format!("w{i:03}"), &format!("wait:crowded-{i}")))
        .collect();
    members.extend((0..20).map(|i| member(&format!("d{i:02}"), "ok")));
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if group.status().await.unwrap().succeeded == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if settled.is_err() {
        let mut states: HashMap<String, usize> = HashMap::new();
        for m in &members {
            let st = rt.status(&member_run_id("crowded", &m.key)).await.unwrap();
            *states
                .entry(format!(
                    "{}: {:?}",
                    &m.key[..1],
                    st.map(|s| (s.state, s.current_step))
                ))
                .or_default() += 1;
        }
        panic!(
            "the 20 quick members did not all succeed in 60 s: {:?}; runs by state {states:#?}",
            group.status().await
        );
    }
    let mut results = std::pin::pin!(group.results().await.unwrap());
    let first = tokio::time::timeout(Duration::from_secs(2), results.next()).await;
    let first_key = match &first {
        Ok(Some(Ok(r))) => Some(r.key.clone()),
        _ => None,
    };
    // Release everyone so the stream ends either way.
    for i in 0..300 {
        rt.signal(&format!("crowded-{i}"), b"go".to_vec())
            .await
            .unwrap();
    }
    let mut all: Vec<MemberResult> = Vec::new();
    if let Ok(Some(r)) = first {
        all.push(r.unwrap());
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(120), results.next()).await {
            Ok(Some(r)) => all.push(r.unwrap()),
            Ok(None) => break,
            Err(_) => {
                let seen: HashSet<String> = all.iter().map(|r| r.key.clone()).collect();
                let mut missing = Vec::new();
                for m in &members {
                    if !seen.contains(&m.key) {
                        let st = rt.status(&member_run_id("crowded", &m.key)).await.unwrap();
                        missing.push(format!(
                            "{} {:?}",
                            m.key,
                            st.map(|s| (s.state, s.current_step))
                        ));
                    }
                }
                panic!(
                    "results stalled after {} of {} members; missing: {:#?}",
                    all.len(),
                    members.len(),
                    &missing[..missing.len().min(10)]
                );
            }
        }
    }
    assert_each_member_once(&all, &members, "crowded");
    worker.shutdown().await.unwrap();
    assert!(
        first_key.as_deref().is_some_and(|k| k.starts_with('d')),
        "with 20 members terminated behind 300 waiting ones, the first result \
         (within 2 s) was {first_key:?}, not a terminated member"
    );
}

// ---------------------------------------------------------------------------
// Concurrent submissions, resumptions and cancels.

/// `RunGroup::cancel` racing its members' ends: its doc says it "returns
/// how many of those cancellations answered `true` (the requests this
/// call recorded that end their member `Cancelled`)". The count must be
/// the number of members that ended `Cancelled`, and each member ends
/// once.
#[tokio::test(start_paused = true)]
async fn a_group_cancel_racing_its_members_ends_counts_what_it_cancelled() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Counting::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Scripted::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for k in 0..16usize {
        let group = runtime.group(rid(&format!("g-{k}")));
        let members: Vec<GroupMember> = (0..8)
            .map(|i| GroupMember {
                key: format!("m{i}"),
                input: match i % 4 {
                    0 => b"ok".to_vec(),
                    1 => b"sleep:2".to_vec(),
                    2 => b"timer:3".to_vec(),
                    _ => b"verdict".to_vec(),
                },
            })
            .collect();
        group.submit(members, &RunOptions::default()).await.unwrap();
        for _ in 0..k {
            tokio::task::yield_now().await;
        }
        if k % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(k as u64 / 2)).await;
        }
        let counted = within(60, group.cancel()).await.unwrap();
        let results = join_all(&group).await;
        let cancelled = results
            .iter()
            .filter(|r| r.termination.status == TerminalStatus::Cancelled)
            .count();
        assert_eq!(counted, cancelled, "group {k}: {results:?}");
        for result in &results {
            let id = result.run_id.to_string();
            eventually("the member's hook call", || async {
                !hook.calls_of(&id).is_empty()
            })
            .await;
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls = hook.calls.lock().unwrap().clone();
    let mut seen = std::collections::HashMap::new();
    for (id, _) in &calls {
        *seen.entry(id.clone()).or_insert(0usize) += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "hook calls: {seen:?}");
    worker.shutdown().await.unwrap();
}

/// Threads spinning until dropped: CPU contention that preempts the
/// runtime's threads at arbitrary points.
struct CpuLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuLoad {
    fn start(n: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Collect every result of `group`, on the real clock, within `secs`.
async fn collect_results(group: &RunGroup, secs: u64) -> Vec<MemberResult> {
    let collected = tokio::time::timeout(Duration::from_secs(secs), async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await;
    match collected {
        Ok(Ok(results)) => results,
        Ok(Err(err)) => panic!("results of {}: {err:?}", group.id()),
        Err(_) => panic!(
            "results of {} did not finish within {secs} s (status {:?})",
            group.id(),
            group.status().await
        ),
    }
}

fn assert_counts_consistent(status: &GroupStatus, what: &str) {
    let counted = status.pending + status.succeeded + status.failed + status.cancelled;
    assert!(
        counted <= status.total,
        "{what}: counts exceed the manifest: {status:?}"
    );
}

/// Wait (real clock) until `check` holds, up to `secs`.
async fn real_eventually<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Wait until every member's success reached the terminal hook, then give
/// any duplicate a moment to show up.
async fn settle_hooks(tally: &Tally, run_ids: &[RunId]) {
    real_eventually("every member's success hook", 20, || async {
        run_ids
            .iter()
            .all(|id| tally.count(id, TerminalStatus::Succeeded) >= 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Two first submissions of one fresh group with different member sets
/// (from two runtimes over one queue, in parallel): the manifest is written
/// by one of them, so the other must get `GroupMismatch` and none of its
/// members may be submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_submissions_of_different_member_sets_admit_only_one() {
    let (queue, store) = real_clock_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let a = tracked_runtime(&queue, &store, &runner, &tally);
    let b = tracked_runtime(&queue, &store, &runner, &tally);
    // No worker: member records stay pending, so the counts show every
    // member any submission wrote.
    const ROUNDS: usize = 300;
    let mut both_accepted = Vec::new();
    for round in 0..ROUNDS {
        let id = format!("split-{round}");
        let xs: Vec<GroupMember> = (0..10).map(|i| member(&format!("x{i}"), "ok")).collect();
        let ys: Vec<GroupMember> = (0..10).map(|i| member(&format!("y{i}"), "ok")).collect();
        let (ga, gb) = (a.group(rid(&id)), b.group(rid(&id)));
        let (xs2, ys2) = (xs.clone(), ys.clone());
        let ta = tokio::spawn(async move { ga.submit(xs2, &RunOptions::default()).await });
        let tb = tokio::spawn(async move { gb.submit(ys2, &RunOptions::default()).await });
        let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
        let oks = usize::from(ra.is_ok()) + usize::from(rb.is_ok());
        for r in [&ra, &rb] {
            assert!(
                matches!(r, Ok(()) | Err(Error::GroupMismatch(_))),
                "round {round}: unexpected {r:?}"
            );
        }
        assert!(oks >= 1, "round {round}: neither submission was accepted");
        let group = a.group(rid(&id));
        let status = group.status().await.unwrap();
        let mut with_run = 0;
        for key in xs.iter().chain(ys.iter()).map(|m| m.key.clone()) {
            if a.status(&member_run_id(&id, &key)).await.unwrap().is_some() {
                with_run += 1;
            }
        }
        if oks == 2 || with_run > 10 || status.pending > status.total {
            both_accepted.push(format!(
                "round {round}: results ({ra:?}, {rb:?}), runs submitted {with_run}, status {status:?}"
            ));
        }
    }
    assert!(
        both_accepted.is_empty(),
        "two different member sets were both accepted for one group in {} of {ROUNDS} rounds:\n{}",
        both_accepted.len(),
        both_accepted.join("\n")
    );
}

/// Six concurrent submit/resume calls per round (three on each of two
/// runtimes over one queue, both with workers, a real clock), 300 members
/// of which every fifth fails on its first run: every member runs step 0
/// once if it succeeds at once and exactly twice if it failed first; no run
/// executes twice at once; each member's success is committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_and_resumes_from_two_runtimes_run_each_member_as_promised() {
    let (queue, store) = real_clock_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let a = tracked_runtime(&queue, &store, &runner, &tally);
    let b = tracked_runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 300;
    let flaky = |n: usize| n.is_multiple_of(5);
    for g in 0..3 {
        let id = format!("storm-{g}");
        let members: Vec<GroupMember> = (0..N)
            .map(|n| member(&format!("m{n:03}"), if flaky(n) { "flaky" } else { "ok" }))
            .collect();
        let mut done = false;
        for round in 0..6 {
            let mut tasks = tokio::task::JoinSet::new();
            for (i, rt) in [&a, &a, &a, &b, &b, &b].into_iter().enumerate() {
                let group = rt.group(rid(&id));
                let members = members.clone();
                let resume = round > 0 && i % 3 == 2;
                tasks.spawn(async move {
                    if resume {
                        group.resume(&RunOptions::default()).await
                    } else {
                        group.submit(members, &RunOptions::default()).await
                    }
                });
            }
            while let Some(joined) = tasks.join_next().await {
                joined
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{id} round {round}: submit/resume: {e:?}"));
            }
            let group = a.group(rid(&id));
            let results = collect_results(&group, 20).await;
            assert_each_member_once(&results, &members, &format!("{id} round {round}"));
            let status = group.status().await.unwrap();
            assert_counts_consistent(&status, &format!("{id} round {round}"));
            for r in &results {
                let n: usize = r.key[1..].parse().unwrap();
                if !flaky(n) {
                    assert_eq!(
                        r.termination.status,
                        TerminalStatus::Succeeded,
                        "{id} round {round}: {}",
                        r.key
                    );
                }
            }
            if results
                .iter()
                .all(|r| r.termination.status == TerminalStatus::Succeeded)
            {
                assert_eq!(status.succeeded, N, "{id}: {status:?}");
                done = true;
                break;
            }
        }
        assert!(done, "{id}: some member never succeeded");
        let run_ids: Vec<RunId> = (0..N)
            .map(|n| member_run_id(&id, &format!("m{n:03}")))
            .collect();
        settle_hooks(&tally, &run_ids).await;
        let mut wrong = Vec::new();
        for (n, run_id) in run_ids.iter().enumerate() {
            let starts = runner.starts(run_id);
            let expected = if flaky(n) { 2 } else { 1 };
            let successes = tally.count(run_id, TerminalStatus::Succeeded);
            if starts != expected || successes != 1 {
                wrong.push(format!(
                    "m{n:03}: step 0 ran {starts} times (expected {expected}), succeeded {successes} times"
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{id}: {} members broke the promise:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        assert_eq!(
            runner.overlaps(),
            Vec::<RunId>::new(),
            "{id}: concurrent runs"
        );
    }
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
}

/// Members of one step that fail their first run, submitted over and over
/// by six concurrent tasks (four submissions each, two runtimes, a real
/// clock, two spinning threads for contention) while first runs fail and
/// second runs finish: a member whose second run succeeded must not be
/// started a third time by a submission that saw it failed a moment
/// earlier. Each member's step 0 runs exactly twice and its success is
/// committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_resubmissions_never_run_a_member_that_just_succeeded_again() {
    let (queue, store) = real_clock_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let a = tracked_runtime(&queue, &store, &runner, &tally);
    let b = tracked_runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 512;
    const GROUPS: usize = 8;
    const SUBMITTERS: u64 = 6;
    const REPEATS: usize = 4;
    let mut all: Vec<(String, RunId)> = Vec::new();
    for g in 0..GROUPS {
        let id = format!("relapse-{g}");
        let members: Vec<GroupMember> = (0..N)
            .map(|n| member(&format!("m{n:03}"), "flaky-1"))
            .collect();
        // Six submitters at once, staggered by a few milliseconds so later
        // submissions land while first runs fail and second runs finish;
        // two spinning threads preempt the runtime's threads, as a loaded
        // machine does.
        let _load = CpuLoad::start(2);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..SUBMITTERS {
            let group = if i % 2 == 0 { &a } else { &b }.group(rid(&id));
            let members = members.clone();
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 3)).await;
                for _ in 0..REPEATS {
                    group
                        .submit(members.clone(), &RunOptions::default())
                        .await?;
                }
                Ok::<_, Error>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap().unwrap();
        }
        drop(_load);
        // Then resubmit until every member succeeded.
        let mut complete = false;
        for _ in 0..5 {
            let results = collect_results(&a.group(rid(&id)), 20).await;
            assert_each_member_once(&results, &members, &id);
            if results
                .iter()
                .all(|r| r.termination.status == TerminalStatus::Succeeded)
            {
                complete = true;
                break;
            }
            a.group(rid(&id))
                .submit(members.clone(), &RunOptions::default())
                .await
                .unwrap();
        }
        assert!(complete, "{id} never completed");
        all.extend((0..N).map(|n| {
            let key = format!("m{n:03}");
            (format!("{id}/{key}"), member_run_id(&id, &key))
        }));
    }
    let run_ids: Vec<RunId> = all.iter().map(|(_, r)| r.clone()).collect();
    settle_hooks(&tally, &run_ids).await;
    let mut wrong = Vec::new();
    for (name, run_id) in &all {
        let starts = runner.starts(run_id);
        let successes = tally.count(run_id, TerminalStatus::Succeeded);
        if starts != 2 || successes != 1 {
            wrong.push(format!(
                "{name}: step 0 ran {starts} times (1 failure, then 1 success \
                 expected), success committed {successes} times"
            ));
        }
    }
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert!(
        wrong.is_empty(),
        "{} members of {} ran again after succeeding:\n{}",
        wrong.len(),
        GROUPS * N,
        wrong.join("\n")
    );
    assert_eq!(
        runner.overlaps(),
        Vec::<RunId>::new(),
        "a run executed twice at once"
    );
}

/// `cancel` racing submissions (two runtimes, a real clock): members end
/// Succeeded or Cancelled, a later resume completes the group, and no
/// member's success is committed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_submit_never_runs_a_succeeded_member_again() {
    let (queue, store) = real_clock_queue().await;
    let runner = TrackedMembers::with_delay(15);
    let tally = Tally::default();
    let a = tracked_runtime(&queue, &store, &runner, &tally);
    let b = tracked_runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 200;
    let id = "tug";
    let members: Vec<GroupMember> = (0..N).map(|i| member(&format!("m{i:03}"), "ok")).collect();
    a.group(rid(id))
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let mut cancelled = 0;
    let mut cancelled_statuses = 0;
    for round in 0..8u64 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, rt) in [&a, &b, &b, &a].into_iter().enumerate() {
            let group = rt.group(rid(id));
            let members = members.clone();
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_millis(round * 3 % 7)).await;
                if i % 2 == 0 {
                    group
                        .submit(members, &RunOptions::default())
                        .await
                        .map(|()| 0)
                } else {
                    group.cancel().await
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let r = joined.unwrap();
            assert!(r.is_ok(), "round {round}: {r:?}");
            let recorded = r.unwrap();
            assert!(recorded <= N);
            cancelled += recorded;
        }
        let status = a.group(rid(id)).status().await.unwrap();
        assert_counts_consistent(&status, &format!("round {round}"));
        cancelled_statuses += status.cancelled;
    }
    // The race must have happened: cancellations were recorded and seen.
    assert!(
        cancelled > 0 && cancelled_statuses > 0,
        "no cancellation raced the submissions ({cancelled} requests)"
    );
    let group = a.group(rid(id));
    let mut done = false;
    for round in 0..10 {
        let results = collect_results(&group, 20).await;
        assert_each_member_once(&results, &members, &format!("settle {round}"));
        assert!(results.iter().all(|r| matches!(
            r.termination.status,
            TerminalStatus::Succeeded | TerminalStatus::Cancelled
        )));
        if results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
        {
            done = true;
            break;
        }
        group.resume(&RunOptions::default()).await.unwrap();
    }
    assert!(done, "the group never completed");
    let run_ids: Vec<RunId> = (0..N)
        .map(|i| member_run_id(id, &format!("m{i:03}")))
        .collect();
    settle_hooks(&tally, &run_ids).await;
    let twice: Vec<String> = run_ids
        .iter()
        .enumerate()
        .filter_map(|(i, run_id)| {
            let n = tally.count(run_id, TerminalStatus::Succeeded);
            (n != 1).then(|| format!("m{i:03} succeeded {n} times"))
        })
        .collect();
    let overlaps = runner.overlaps();
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert!(twice.is_empty(), "{}", twice.join("\n"));
    assert_eq!(
        overlaps,
        Vec::<RunId>::new(),
        "a run executed twice at once"
    );
}
