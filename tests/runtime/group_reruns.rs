//! Group members run again, notifications at their run's priority, and
//! the runtime's own errors naming the run (issue 22):
//!
//! 1. A group member run again (it failed or was cancelled; `submit` of the
//!    same set, `resume`, a job group submitted again) keeps its run id (hex
//!    SHA-256 of `{group_id}/{key}`), runs its runner again and sees none of
//!    the earlier run's memo entries or replay records.
//! 2. A run's terminal-hook notification is enqueued at the run's priority.
//! 3. When the runtime itself fails a run permanently, the error starts with
//!    ``run `<id>`:`` (`` (key "<key>")`` for a keyed job or a member).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{HOUR, Seen, queue_with};
use common::*;
use futures_util::TryStreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{JobRecord, MockClock};
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::{
    Error, MemberResult, MemoStore, RunGroup, RunId, RunOptions, RunOutcome, RunSpec, RunState,
    Step, StepError, StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus,
    WorkflowRuntime, workflow,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore};

// ---------------------------------------------------------------------------
// The probe runner.

/// Step 0 notes the step memo entry `draft` and run memo entry `paid` it
/// finds, writes a fresh generation `{run_id}#{n}` to both, then: fails (a
/// `Fail` verdict, which replay records) while `failing` is set; else by its
/// input `park:{key}` continues on the signal `key`, `timer:{ms}` continues
/// after `ms`, anything else succeeds with the generation. Step 1 succeeds
/// with the run memo entry `paid` it reads, and fails `memo gone` without
/// one.
#[derive(Clone, Default)]
struct Probe {
    seen: Arc<Mutex<Vec<Seen>>>,
    failing: Arc<AtomicBool>,
    generation: Arc<AtomicU64>,
}

impl Probe {
    fn failing() -> Self {
        let probe = Self::default();
        probe.failing.store(true, Ordering::SeqCst);
        probe
    }

    fn seen_of(&self, run_id: &RunId) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| &s.run_id == run_id)
            .cloned()
            .collect()
    }
}

impl StepRunner for Probe {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number > 0 {
            return Ok(match step.run_memo.get("paid").await? {
                Some(paid) => StepOutcome::Succeed { result: paid },
                None => StepOutcome::Fail {
                    reason: "memo gone".into(),
                },
            });
        }
        let seen = Seen {
            run_id: step.run_id.clone(),
            step_memo: step.memo.get("draft").await?,
            run_memo: step.run_memo.get("paid").await?,
        };
        self.seen.lock().unwrap().push(seen);
        let generation = format!(
            "{}#{}",
            step.run_id,
            self.generation.fetch_add(1, Ordering::SeqCst) + 1
        );
        step.memo.put("draft", generation.as_bytes()).await?;
        step.run_memo.put("paid", generation.as_bytes()).await?;
        if self.failing.load(Ordering::SeqCst) {
            return Ok(StepOutcome::Fail {
                reason: format!("failed {generation}"),
            });
        }
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(key) = input.strip_prefix("park:") {
            return Ok(StepOutcome::continue_on_signal(b"next".to_vec(), key, HOUR));
        }
        if let Some(ms) = input.strip_prefix("timer:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_after(
                b"next".to_vec(),
                Duration::from_millis(ms),
            ));
        }
        Ok(StepOutcome::Succeed {
            result: generation.into_bytes(),
        })
    }
}

/// Every result of `group`, sorted by key.
async fn results(group: &RunGroup) -> Vec<MemberResult> {
    let mut results: Vec<MemberResult> = within(60, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap();
    results.sort_by(|a, b| a.key.cmp(&b.key));
    results
}

/// The terminal state of run `id`, panicking when it is not terminated.
async fn terminated<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &RunId,
) -> taquba_workflow::RunTermination {
    match runtime.status(id).await.unwrap().map(|s| s.state) {
        Some(RunState::Terminated(t)) => t,
        other => panic!("run {id} is not terminated: {other:?}"),
    }
}

/// The re-run's step 0 saw nothing of an earlier run.
fn assert_clean(seen: &Seen, what: &str) {
    assert_eq!(
        seen.step_memo, None,
        "{what}: the step memo is the earlier run's"
    );
    assert_eq!(
        seen.run_memo, None,
        "{what}: the run memo is the earlier run's"
    );
}

// ---------------------------------------------------------------------------
// Claim 1: a member run again keeps its id and starts clean.

/// A member that fails twice in a row and is submitted again each time runs
/// three times under its derived run id, each run starting clean (with
/// step-output replay on, so a recorded `Fail` would otherwise replay).
#[tokio::test(start_paused = true)]
async fn a_member_run_again_twice_in_a_row_starts_clean_each_time() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("twice"));
    let id = member_run_id("twice", "a");
    let set = || vec![member("a", "x")];

    group.submit(set(), &RunOptions::default()).await.unwrap();
    let first = results(&group).await;
    assert_eq!(first[0].termination.status, TerminalStatus::Failed);
    assert_eq!(first[0].run_id, id);

    // Second run: fails again.
    group.submit(set(), &RunOptions::default()).await.unwrap();
    let second = within(30, async {
        loop {
            let ended = matches!(
                runtime.status(&id).await.unwrap().map(|s| s.state),
                Some(RunState::Terminated(_))
            );
            if probe.seen_of(&id).len() == 2 && ended {
                return results(&group).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(second[0].run_id, id);
    assert_eq!(
        second[0].termination.error.as_deref(),
        Some(format!("failed {id}#2").as_str()),
        "the second run's own failure is reported"
    );
    assert_eq!(
        second[0].outcome.as_ref().and_then(|o| o.error.clone()),
        Some(format!("failed {id}#2"))
    );

    // Third run: succeeds.
    probe.failing.store(false, Ordering::SeqCst);
    group.resume(&RunOptions::default()).await.unwrap();
    let end = within(30, runtime.wait(&id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let third = results(&group).await;
    assert_eq!(third[0].run_id, id);
    assert_eq!(
        third[0].outcome.as_ref().and_then(|o| o.result.clone()),
        Some(format!("{id}#3").into_bytes())
    );
    let seen = probe.seen_of(&id);
    assert_eq!(seen.len(), 3, "the runner ran once per run: {seen:?}");
    assert_clean(&seen[1], "second run");
    assert_clean(&seen[2], "third run");
    worker.shutdown().await.unwrap();
}

/// One hook call: the run, its status and its error.
type HookCall = (RunId, TerminalStatus, Option<String>);

/// A hook that fails (transiently) while `failing` is set, recording each
/// successful call's run, status and error.
#[derive(Clone, Default)]
struct FlakyHook {
    failing: Arc<AtomicBool>,
    attempts: Arc<AtomicUsize>,
    calls: Arc<Mutex<Vec<HookCall>>>,
}

impl TerminalHook for FlakyHook {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(StepError::transient("hook endpoint down"));
        }
        self.calls.lock().unwrap().push((
            outcome.run_id.clone(),
            outcome.status,
            outcome.error.clone(),
        ));
        Ok(())
    }
}

/// A member run again while its earlier run's terminal notification is
/// still failing and waiting for its retry: the re-run runs and ends, and
/// the hook eventually gets both the earlier run's failure (its own outcome)
/// and the re-run's success.
#[tokio::test(start_paused = true)]
async fn a_member_run_again_while_the_earlier_runs_hook_is_still_retrying() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(
        store.clone(),
        Duration::from_secs(5),
        Duration::from_secs(30),
    )
    .await;
    let probe = Probe::failing();
    let hook = FlakyHook::default();
    hook.failing.store(true, Ordering::SeqCst);
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), probe.clone(), hook.clone())
            .poll_interval(Duration::from_millis(50))
            .step_output_replay()
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("hooked"));
    let id = member_run_id("hooked", "a");
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        results(&group).await[0].termination.status,
        TerminalStatus::Failed
    );
    eventually("the first notification attempt failed", || async {
        hook.attempts.load(Ordering::SeqCst) >= 1
    })
    .await;
    assert!(
        hook.calls.lock().unwrap().is_empty(),
        "no notification got through yet"
    );

    probe.failing.store(false, Ordering::SeqCst);
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let end = within(20, runtime.wait(&id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result),
        Some(format!("{id}#2").into_bytes())
    );
    let seen = probe.seen_of(&id);
    assert_eq!(seen.len(), 2);
    assert_clean(&seen[1], "re-run with a pending notification");

    hook.failing.store(false, Ordering::SeqCst);
    eventually("both notifications delivered", || async {
        hook.calls.lock().unwrap().len() >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    let mut calls = hook.calls.lock().unwrap().clone();
    calls.sort_by_key(|(_, status, _)| status.as_str().to_string());
    assert_eq!(
        calls,
        vec![
            (
                id.clone(),
                TerminalStatus::Failed,
                Some(format!("failed {id}#1"))
            ),
            (id.clone(), TerminalStatus::Succeeded, None),
        ],
        "each run's notification exactly once, with its own outcome"
    );
    // The group reports the re-run.
    let after = results(&group).await;
    assert_eq!(after[0].termination.status, TerminalStatus::Succeeded);
    assert_eq!(after[0].run_id, id);
    worker.shutdown().await.unwrap();
}

/// A group forgotten after its member failed, then submitted again under
/// the same id: the member's run id is the derived one and its run starts
/// clean.
#[tokio::test(start_paused = true)]
async fn a_member_submitted_again_after_forget_starts_clean() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("forgot"));
    let id = member_run_id("forgot", "a");
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        results(&group).await[0].termination.status,
        TerminalStatus::Failed
    );
    group.forget().await.unwrap();
    assert!(runtime.status(&id).await.unwrap().is_none());

    probe.failing.store(false, Ordering::SeqCst);
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let again = results(&group).await;
    assert_eq!(again[0].run_id, id);
    assert_eq!(again[0].termination.status, TerminalStatus::Succeeded);
    let seen = probe.seen_of(&id);
    assert_eq!(seen.len(), 2);
    assert_clean(&seen[1], "after forget");
    worker.shutdown().await.unwrap();
}

/// The process dies after a re-submission removed the earlier run's memo
/// entries and before its transaction committed (its queue's writes fail
/// for good, then another process opens the store). The member is still
/// failed; the next submission runs it exactly once more, clean, and it
/// ends.
#[tokio::test(start_paused = true)]
async fn a_crash_between_the_memo_clearing_and_the_reruns_commit() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(
        inner.clone(),
        FaultConfig {
            rates: [1.0, 0.0, 0.0, 0.0],
            only_under: vec!["db/".into()],
            ..FaultConfig::default()
        },
    );
    faulty.set_enabled(false);
    let store_a: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let clock = MockClock::new(T0);
    let probe = Probe::failing();
    let id = member_run_id("crash", "a");
    let memos = MemoStore::new(inner.clone(), MEMO_PREFIX);

    let queue_a = open(&store_a, &clock).await;
    let runtime_a = workflow_builder(&queue_a, &store_a, &probe)
        .step_output_replay()
        .build();
    let worker_a = runtime_a.spawn(std::future::pending::<()>());
    let group_a = runtime_a.group(rid("crash"));
    group_a
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        results(&group_a).await[0].termination.status,
        TerminalStatus::Failed
    );
    assert!(memos.new_run_memo(&id).get("paid").await.unwrap().is_some());

    // The queue's writes now fail for good: the re-submission clears the
    // memo entries and then never commits.
    faulty.set_enabled(true);
    let resubmit = tokio::spawn({
        let group = group_a.clone();
        async move {
            group
                .submit(vec![member("a", "x")], &RunOptions::default())
                .await
        }
    });
    eventually("the earlier run's memo entries are cleared", || async {
        memos.new_run_memo(&id).get("paid").await.unwrap().is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !resubmit.is_finished(),
        "the re-run's commit must not have landed"
    );
    // "kill -9".
    resubmit.abort();
    drop(worker_a);
    drop(group_a);
    drop(runtime_a);

    // Another process opens the store (the dead one's writes never land).
    let queue_b = open(&inner, &clock).await;
    probe.failing.store(false, Ordering::SeqCst);
    let runtime_b = workflow_builder(&queue_b, &inner, &probe)
        .step_output_replay()
        .build();
    let worker_b = runtime_b.spawn(std::future::pending::<()>());
    let group_b = runtime_b.group(rid("crash"));
    let status = group_b.status().await.unwrap();
    assert_eq!(status.failed, 1, "the member is still failed: {status:?}");
    let before = results(&group_b).await;
    assert_eq!(before[0].termination.status, TerminalStatus::Failed);
    assert_eq!(
        probe.seen_of(&id).len(),
        1,
        "nothing ran the member meanwhile"
    );

    group_b
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    let end = within(30, runtime_b.wait(&id)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = probe.seen_of(&id);
    assert_eq!(seen.len(), 2, "the member ran exactly once more: {seen:?}");
    assert_clean(&seen[1], "re-run after the crash");
    let after = results(&group_b).await;
    assert_eq!(after[0].run_id, id);
    assert_eq!(after[0].termination.status, TerminalStatus::Succeeded);
    worker_b.shutdown().await.unwrap();
}

/// With memo retention, the earlier run's marker falls due while the re-run
/// is parked on a timer: the re-run's memo entries must survive it, so its
/// later step reads what its first step wrote.
#[tokio::test(start_paused = true)]
async fn the_earlier_runs_retention_marker_does_not_remove_the_reruns_memo() {
    let (queue, store, clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe)
        .memo_retention(Duration::from_secs(10))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("kept"));
    let id = member_run_id("kept", "a");
    let set = || vec![member("a", "timer:60000")];
    group.submit(set(), &RunOptions::default()).await.unwrap();
    assert_eq!(
        results(&group).await[0].termination.status,
        TerminalStatus::Failed
    );

    clock.advance(Duration::from_secs(1));
    probe.failing.store(false, Ordering::SeqCst);
    group.submit(set(), &RunOptions::default()).await.unwrap();
    until_step("the re-run parks on its timer", &runtime, id.as_str(), 1).await;

    // Past the earlier run's window (T0 + 10 s), well before the timer.
    clock.advance(Duration::from_secs(15));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    assert_eq!(
        memos.new_run_memo(&id).get("paid").await.unwrap(),
        Some(format!("{id}#2").into_bytes()),
        "the earlier run's marker removed the re-run's memo entry"
    );
    assert!(
        matches!(
            runtime.status(&id).await.unwrap().map(|s| s.state),
            Some(RunState::Pending | RunState::Running)
        ),
        "the re-run is still waiting on its timer"
    );

    clock.advance(Duration::from_secs(60));
    let end = within(30, runtime.wait(&id)).await.unwrap();
    assert_eq!(
        end.termination.status,
        TerminalStatus::Succeeded,
        "{:?}",
        end.termination.error
    );
    assert_eq!(
        end.outcome.and_then(|o| o.result),
        Some(format!("{id}#2").into_bytes())
    );
    worker.shutdown().await.unwrap();
}

/// `wait`, `status` and `outcome` of the member's run id across its
/// re-run: once re-submitted they report the re-run (active, then its end),
/// never the earlier run's failure.
#[tokio::test(start_paused = true)]
async fn wait_status_and_outcome_follow_the_rerun() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("follow"));
    let id = member_run_id("follow", "a");
    let set = || vec![member("a", "park:p22-follow")];
    group.submit(set(), &RunOptions::default()).await.unwrap();
    let first = within(30, runtime.wait(&id)).await.unwrap();
    assert_eq!(first.termination.status, TerminalStatus::Failed);
    assert!(runtime.outcome(&id).await.unwrap().is_some());

    probe.failing.store(false, Ordering::SeqCst);
    group.submit(set(), &RunOptions::default()).await.unwrap();
    until_step("the re-run parks on its signal", &runtime, id.as_str(), 1).await;
    assert!(
        matches!(
            runtime.status(&id).await.unwrap().map(|s| s.state),
            Some(RunState::Pending | RunState::Running)
        ),
        "status reports the re-run as active"
    );
    assert!(
        runtime
            .wait_timeout(&id, Duration::from_millis(200))
            .await
            .unwrap()
            .is_none(),
        "wait answered with the earlier run's end while the re-run is active"
    );
    assert!(
        runtime.outcome(&id).await.unwrap().is_none(),
        "outcome reports the earlier run while the re-run is active"
    );
    assert_eq!(group.status().await.unwrap().failed, 0);

    let waiter = tokio::spawn({
        let runtime = runtime.clone();
        let id = id.clone();
        async move { runtime.wait(&id).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    runtime.signal("p22-follow", b"go".to_vec()).await.unwrap();
    let end = within(30, waiter).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        runtime.outcome(&id).await.unwrap().and_then(|o| o.result),
        Some(format!("{id}#2").into_bytes())
    );
    worker.shutdown().await.unwrap();
}

/// A plain `submit` under a member's run id is refused, whether the member
/// failed or is running again.
#[tokio::test(start_paused = true)]
async fn a_plain_submit_of_a_member_run_id_is_refused() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("owned"));
    let id = member_run_id("owned", "a");
    let set = || vec![member("a", "park:p22-owned")];
    group.submit(set(), &RunOptions::default()).await.unwrap();
    within(30, runtime.wait(&id)).await.unwrap();
    let plain = || RunSpec {
        run_id: Some(id.clone()),
        input: b"x".to_vec(),
        ..Default::default()
    };
    let err = runtime.submit(plain()).await.unwrap_err();
    assert!(
        matches!(&err, Error::GroupMemberRunId { key, .. } if key == "a"),
        "failed member: {err:?}"
    );

    probe.failing.store(false, Ordering::SeqCst);
    group.submit(set(), &RunOptions::default()).await.unwrap();
    until_step("the re-run parks", &runtime, id.as_str(), 1).await;
    let err = runtime.submit(plain()).await.unwrap_err();
    assert!(
        matches!(&err, Error::GroupMemberRunId { key, .. } if key == "a"),
        "re-running member: {err:?}"
    );
    assert_eq!(probe.seen_of(&id).len(), 2);
    worker.shutdown().await.unwrap();
}

/// The same after memo retention removed the failed member's memo entries
/// while the group (its member records and manifest) is still there: the
/// run id still belongs to the group (found by a tester: the sweep removed
/// the member's terminal record, and a plain run took the id).
#[tokio::test(start_paused = true)]
async fn a_plain_submit_of_a_member_run_id_is_refused_after_memo_retention() {
    let (queue, store, clock) = memory_queue().await;
    let probe = Probe::failing();
    let runtime = workflow_builder(&queue, &store, &probe)
        .memo_retention(Duration::from_secs(10))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("swept"));
    let id = member_run_id("swept", "a");
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        results(&group).await[0].termination.status,
        TerminalStatus::Failed
    );
    MemoStore::new(store.clone(), MEMO_PREFIX)
        .new_run_memo(&id)
        .put("paid", b"yes")
        .await
        .unwrap();
    clock.advance(Duration::from_secs(11));
    eventually("memo retention swept the member's memo entries", || async {
        MemoStore::new(store.clone(), MEMO_PREFIX)
            .new_run_memo(&id)
            .get("paid")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    // The group still knows its member.
    assert_eq!(group.status().await.unwrap().failed, 1);

    let submitted = runtime
        .submit(RunSpec {
            run_id: Some(id.clone()),
            input: b"a plain run".to_vec(),
            ..Default::default()
        })
        .await;
    assert!(
        matches!(&submitted, Err(Error::GroupMemberRunId { key, .. }) if key == "a"),
        "a plain run took the member's run id: {submitted:?}"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Claim 1 for job groups.

/// Whether `Billing` jobs fail, and what each execution saw.
#[derive(Clone, Default)]
struct BillingState {
    failing: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Billing {
    order: String,
}

impl Job for Billing {
    const NAME: &'static str = "p22.billing";
    type Output = String;
    type Error = String;
    fn idempotency_key(&self) -> Option<String> {
        Some(format!("bill:{}", self.order))
    }
    fn classify(&self, _error: &String) -> taquba_workflow::StepErrorKind {
        taquba_workflow::StepErrorKind::Permanent
    }
    async fn run(&self, ctx: JobContext<'_>) -> Result<String, String> {
        let state = ctx.state::<BillingState>();
        let seen = Seen {
            run_id: ctx.run_id.clone(),
            step_memo: ctx.memo.get("draft").await.map_err(|e| e.to_string())?,
            run_memo: ctx.run_memo.get("paid").await.map_err(|e| e.to_string())?,
        };
        state.seen.lock().unwrap().push(seen);
        ctx.memo
            .put("draft", b"charged")
            .await
            .map_err(|e| e.to_string())?;
        ctx.run_memo
            .put("paid", b"charged")
            .await
            .map_err(|e| e.to_string())?;
        if state.failing.load(Ordering::SeqCst) {
            return Err(format!("declined {}", self.order));
        }
        Ok(format!("billed {}", self.order))
    }
}

/// A job group whose keyed job failed, submitted again: the member keeps
/// the run id derived from the group and its key (not the plain keyed job's
/// id), runs again and sees none of the earlier run's memo entries.
#[tokio::test(start_paused = true)]
async fn a_job_group_keyed_member_that_failed_runs_again_clean() {
    let (queue, store, _clock) = memory_queue().await;
    let state = BillingState::default();
    state.failing.store(true, Ordering::SeqCst);
    let runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Billing>()
        .state(state.clone())
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Billing>(rid("bills"));
    let jobs = || {
        vec![
            Billing {
                order: "o-1".into(),
            },
            Billing {
                order: "o-2".into(),
            },
        ]
    };
    group.submit(jobs()).await.unwrap();
    let first = within(30, group.join()).await.unwrap();
    assert!(first.iter().all(|r| r.result.is_err()));
    assert_eq!(first[0].key, "bill:o-1");

    state.failing.store(false, Ordering::SeqCst);
    group.submit(jobs()).await.unwrap();
    let second = within(30, group.join()).await.unwrap();
    assert_eq!(
        second
            .iter()
            .map(|r| r.result.as_ref().ok().cloned())
            .collect::<Vec<_>>(),
        vec![
            Some("billed o-1".to_string()),
            Some("billed o-2".to_string())
        ]
    );
    for key in ["bill:o-1", "bill:o-2"] {
        let id = member_run_id("bills", key);
        let seen: Vec<Seen> = state
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.run_id == id)
            .cloned()
            .collect();
        assert_eq!(
            seen.len(),
            2,
            "{key}: ran under the member's run id twice: {seen:?}"
        );
        assert_clean(&seen[1], key);
        let status = runner
            .view()
            .status(&id)
            .await
            .unwrap()
            .expect("the member's run");
        assert!(
            matches!(status.state, RunState::Terminated(ref t) if t.status == TerminalStatus::Succeeded),
            "{key}: {status:?}"
        );
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Claim 2: the notification has the run's priority.

/// A hook that refuses every notification for good, so each lands in the
/// dead letters where its queue record can be read.
#[derive(Clone, Default)]
struct RefusingHook;

impl TerminalHook for RefusingHook {
    async fn on_termination(
        &self,
        _outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        Err(StepError::permanent("refused"))
    }
}

/// The dead notification jobs, by run id.
async fn dead_notifications(queue: &taquba::Queue) -> Vec<(String, JobRecord)> {
    dead_jobs(queue)
        .await
        .into_iter()
        .filter(|job| job.headers.contains_key("workflow.terminal"))
        .map(|job| (job.headers["workflow.run_id"].clone(), job))
        .collect()
}

/// Group members submitted at priority 7 (one succeeding, one woken by a
/// signal, one cancelled on its timer) and plain runs at priority 0 and at
/// the default: each notification has its run's priority.
#[tokio::test(start_paused = true)]
async fn terminal_notifications_have_their_runs_priority() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), probe.clone(), RefusingHook)
            .poll_interval(Duration::from_millis(50))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("urgent"));
    let urgent = RunOptions {
        priority: Some(7),
        ..Default::default()
    };
    group
        .submit(
            vec![
                member("done", "x"),
                member("woken", "park:p22-prio"),
                member("cancelled", "timer:3600000"),
            ],
            &urgent,
        )
        .await
        .unwrap();
    until_step(
        "woken parks",
        &runtime,
        member_run_id("urgent", "woken").as_str(),
        1,
    )
    .await;
    until_step(
        "cancelled parks",
        &runtime,
        member_run_id("urgent", "cancelled").as_str(),
        1,
    )
    .await;
    runtime.signal("p22-prio", b"go".to_vec()).await.unwrap();
    within(30, runtime.wait(&member_run_id("urgent", "woken")))
        .await
        .unwrap();
    assert!(
        runtime
            .cancel(&member_run_id("urgent", "cancelled"))
            .await
            .unwrap()
    );
    for (id, priority) in [("zero", Some(0)), ("default", None)] {
        runtime
            .submit(RunSpec {
                run_id: Some(rid(id)),
                input: b"x".to_vec(),
                options: RunOptions {
                    priority,
                    ..Default::default()
                },
                ..Default::default()
            })
            .await
            .unwrap();
    }
    eventually("five dead notifications", || async {
        dead_notifications(&queue).await.len() == 5
    })
    .await;
    let dead = dead_notifications(&queue).await;
    let priority_of = |id: &str| {
        dead.iter()
            .find(|(run, _)| run == id)
            .map(|(_, job)| job.priority)
            .unwrap_or_else(|| panic!("no notification of {id}"))
    };
    for key in ["done", "woken", "cancelled"] {
        assert_eq!(
            priority_of(member_run_id("urgent", key).as_str()),
            7,
            "member {key}'s notification"
        );
    }
    assert_eq!(priority_of("zero"), 0);
    assert_eq!(priority_of("default"), taquba::PRIORITY_NORMAL);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Claim 3: the runtime's own errors start with the run.

mod drift {
    use serde::{Deserialize, Serialize};
    use taquba_workflow::jobs::{Job, JobContext};

    /// The job as the old deploy submitted it.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct NoteV1 {
        pub key: Option<String>,
        pub text: String,
    }

    impl Job for NoteV1 {
        const NAME: &'static str = "p22.note";
        type Output = String;
        type Error = String;
        fn idempotency_key(&self) -> Option<String> {
            self.key.clone()
        }
        async fn run(&self, _ctx: JobContext<'_>) -> Result<String, String> {
            Ok(self.text.clone())
        }
    }

    /// The next deploy: a required field more.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct NoteV2 {
        pub key: Option<String>,
        pub text: String,
        pub channel: String,
    }

    impl Job for NoteV2 {
        const NAME: &'static str = "p22.note";
        type Output = String;
        type Error = String;
        fn idempotency_key(&self) -> Option<String> {
            self.key.clone()
        }
        async fn run(&self, _ctx: JobContext<'_>) -> Result<String, String> {
            Ok(self.channel.clone())
        }
    }
}

/// The error of the run `id`, which must have failed.
async fn failure_of(view: &taquba_workflow::WorkflowView, id: &RunId) -> String {
    within(60, async {
        loop {
            if let Some(status) = view.status(id).await.unwrap()
                && let RunState::Terminated(t) = status.state
            {
                assert_eq!(t.status, TerminalStatus::Failed, "{id}: {t:?}");
                return t.error.unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// Jobs submitted by one deploy whose payloads the next cannot decode: a
/// keyed member and an unkeyed member of a job group, and a plain keyed
/// job. Each error starts with the run, and the key (the member key for a
/// member).
#[tokio::test(start_paused = true)]
async fn undecodable_job_payloads_fail_naming_the_run_and_key_first() {
    let (queue, store, _clock) = memory_queue().await;
    let old = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::NoteV1>()
        .poll_interval(Duration::from_millis(20))
        .build();
    // Submitted by the old deploy, never run by it.
    let group = old.group::<drift::NoteV1>(rid("notes"));
    group
        .submit(vec![
            drift::NoteV1 {
                key: Some("order-7".into()),
                text: "a".into(),
            },
            drift::NoteV1 {
                key: None,
                text: "b".into(),
            },
        ])
        .await
        .unwrap();
    let solo = old
        .submit(drift::NoteV1 {
            key: Some("solo".into()),
            text: "c".into(),
        })
        .await
        .unwrap();
    let solo_id = solo.id().clone();

    let new = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::NoteV2>()
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = new.spawn(std::future::pending::<()>());
    let cases = [
        (member_run_id("notes", "order-7"), "order-7"),
        (member_run_id("notes", "item-1"), "item-1"),
        (solo_id, "solo"),
    ];
    for (id, key) in cases {
        let error = failure_of(new.view(), &id).await;
        let prefix = format!("run `{id}` (key \"{key}\"): ");
        assert!(
            error.starts_with(&prefix),
            "expected the error to start with {prefix:?}: {error:?}"
        );
        assert!(error.contains("p22.note"), "{error}");
    }
    worker.shutdown().await.unwrap();
}

/// Two members waiting on one correlation key: the second waiter is failed
/// by the runtime, and its error starts with its run and member key.
#[tokio::test(start_paused = true)]
async fn a_second_member_waiting_on_a_key_fails_naming_its_run_and_key_first() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime = workflow_builder(&queue, &store, &probe).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("dup"));
    group
        .submit(
            vec![member("a", "park:p22-dup"), member("b", "park:p22-dup")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let (failed, parked) = within(30, async {
        loop {
            let status = group.status().await.unwrap();
            if status.failed == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let a = member_run_id("dup", "a");
        match runtime.status(&a).await.unwrap().map(|s| s.state) {
            Some(RunState::Terminated(_)) => (("a", a), member_run_id("dup", "b")),
            _ => (("b", member_run_id("dup", "b")), a),
        }
    })
    .await;
    let (key, id) = failed;
    let t = terminated(&runtime, &id).await;
    assert_eq!(t.status, TerminalStatus::Failed);
    let error = t.error.unwrap_or_default();
    let prefix = format!("run `{id}` (key \"{key}\"): ");
    assert!(error.starts_with(&prefix), "expected {prefix:?}: {error:?}");
    assert!(
        error.contains(parked.as_str()),
        "the error names the waiting run: {error}"
    );
    // The outcome (what the hook gets) carries the same text.
    assert_eq!(
        runtime.outcome(&id).await.unwrap().and_then(|o| o.error),
        Some(error.clone())
    );
    worker.shutdown().await.unwrap();
}

mod wf_old {
    use super::*;

    /// The deploy that submitted the runs: a timer, then `later`.
    #[derive(Clone)]
    pub struct Drift;

    #[workflow(name = "p22.drift", output = u32, vis = pub(crate))]
    impl Drift {
        #[step(start)]
        async fn begin(n: u32) -> Result<Transition<DriftStep>, StepError> {
            Ok(Transition::after(DriftStep::Later { n }, super::HOUR))
        }

        #[step]
        async fn later(n: u32) -> Result<Transition<DriftStep>, StepError> {
            Ok(Transition::done(n))
        }
    }
}

mod wf_gone {
    use super::*;

    /// The next deploy: `later` is gone.
    #[derive(Clone)]
    pub struct Drift;

    #[workflow(name = "p22.drift", output = u32)]
    impl Drift {
        #[step(start)]
        async fn begin(n: u32) -> Result<Transition<DriftStep>, StepError> {
            Ok(Transition::done(n))
        }

        #[step]
        async fn finish(n: u32) -> Result<Transition<DriftStep>, StepError> {
            Ok(Transition::done(n))
        }
    }
}

mod wf_changed {
    use super::*;

    /// Another next deploy: `later`'s field changed type.
    #[derive(Clone)]
    pub struct Drift;

    #[workflow(name = "p22.drift", output = u32)]
    impl Drift {
        #[step(start)]
        async fn begin(n: u32) -> Result<Transition<DriftStep>, StepError> {
            Ok(Transition::done(n))
        }

        #[step]
        async fn later(
            ctx: StepContext<'_>,
            n: Vec<String>,
        ) -> Result<Transition<DriftStep>, StepError> {
            let _ = ctx;
            Ok(Transition::done(n.len() as u32))
        }
    }
}

/// `#[workflow]` runs parked at a step by one deploy and resumed by the
/// next, where the step is gone or its fields no longer decode: a group
/// member and a plain run each fail with an error starting with the run
/// (and the member's key).
async fn workflow_drift<R: StepRunner + Clone + 'static>(next: R, what: &str) {
    let (queue, store, clock) = memory_queue().await;
    let input = || taquba_workflow::workflows::encode_input(wf_old::DriftInput { n: 3 }).unwrap();
    let old = workflow_builder(&queue, &store, &wf_old::Drift).build();
    let worker = old.spawn(std::future::pending::<()>());
    old.group(rid("drifting"))
        .submit(
            vec![taquba_workflow::GroupMember {
                key: "m-1".into(),
                input: input(),
            }],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    old.submit(RunSpec {
        run_id: Some(rid("plain-drift")),
        input: input(),
        ..Default::default()
    })
    .await
    .unwrap();
    let member_id = member_run_id("drifting", "m-1");
    until_step("the member parks", &old, member_id.as_str(), 1).await;
    until_step("the plain run parks", &old, "plain-drift", 1).await;
    worker.shutdown().await.unwrap();
    drop(old);

    let new = workflow_builder(&queue, &store, &next).build();
    let worker = new.spawn(std::future::pending::<()>());
    clock.advance(HOUR + Duration::from_secs(1));
    for (id, prefix) in [
        (
            member_id.clone(),
            format!("run `{member_id}` (key \"m-1\"): "),
        ),
        (rid("plain-drift"), "run `plain-drift`: ".to_string()),
    ] {
        let error = failure_of(new.view(), &id).await;
        assert!(
            error.starts_with(&prefix),
            "{what}: expected {prefix:?}: {error:?}"
        );
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_workflow_step_that_no_longer_exists_fails_naming_the_run_first() {
    workflow_drift(wf_gone::Drift, "step gone").await;
}

#[tokio::test(start_paused = true)]
async fn a_workflow_step_whose_fields_no_longer_decode_fails_naming_the_run_first() {
    workflow_drift(wf_changed::Drift, "fields changed").await;
}
