//! Run groups at the public API: membership across steps, results in
//! completion order, status counts, re-submission, errors, cancellation,
//! `forget` and the group retention sweep.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::{StreamExt, TryStreamExt};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;
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
