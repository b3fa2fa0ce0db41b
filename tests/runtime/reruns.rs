//! A run started again under a run id or group member key whose earlier run
//! ended (issue 12, points 6 and 7; issue 22): a group member run again
//! keeps its derived run id and sees nothing of the earlier run (no replay
//! records, no memo entries); a plain run id submitted again runs its steps
//! afresh (the earlier run's replay records are not replayed) and shares
//! the earlier run's memo entries, as the seeds describe, which memo
//! retention keeps for the new run's own window.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::Seen;
use common::*;
use futures_util::TryStreamExt;
use taquba_workflow::{
    MemberResult, MemoStore, RunGroup, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus,
};

/// Step 0 notes what it sees, writes its run id to the step memo entry
/// `draft` and the run memo entry `paid`, then by its input: `park:{key}`
/// continues on the signal `key`; anything else fails (a `Fail` verdict,
/// which step-output replay records) while `failing` is set and succeeds
/// otherwise.
#[derive(Clone, Default)]
struct Drafts {
    seen: Arc<Mutex<Vec<Seen>>>,
    failing: Arc<AtomicBool>,
}

impl Drafts {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl StepRunner for Drafts {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            });
        }
        let seen = Seen {
            run_id: step.run_id.clone(),
            step_memo: step.memo.get("draft").await?,
            run_memo: step.run_memo.get("paid").await?,
        };
        self.seen.lock().unwrap().push(seen);
        step.memo.put("draft", step.run_id.as_bytes()).await?;
        step.run_memo.put("paid", step.run_id.as_bytes()).await?;
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(key) = input.strip_prefix("park:") {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_secs(3600),
            ));
        }
        if self.failing.load(Ordering::SeqCst) {
            return Ok(StepOutcome::Fail {
                reason: format!("failed in {}", step.run_id),
            });
        }
        Ok(StepOutcome::Succeed {
            result: step.run_id.as_bytes().to_vec(),
        })
    }
}

async fn results(group: &RunGroup) -> Vec<MemberResult> {
    let mut results: Vec<MemberResult> = within(30, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap();
    results.sort_by(|a, b| a.key.cmp(&b.key));
    results
}

/// Fail one member and cancel another (parked on a signal), with
/// step-output replay on; return the group's first results, sorted by key.
async fn fail_and_cancel<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &taquba_workflow::WorkflowRuntime<R, H>,
    drafts: &Drafts,
) -> Vec<MemberResult> {
    let group = runtime.group(rid("drafts"));
    group
        .submit(
            vec![member("fails", "x"), member("parks", "park:drafts-gate")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    eventually("both ran", || async { drafts.seen().len() == 2 }).await;
    eventually("the failing member failed", || async {
        group.status().await.unwrap().failed == 1
    })
    .await;
    // Let the parked member's signal wait commit.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(group.cancel().await.unwrap(), 1);
    let first = results(&group).await;
    assert_eq!(first[0].termination.status, TerminalStatus::Failed);
    assert_eq!(first[1].termination.status, TerminalStatus::Cancelled);
    first
}

/// Resume the group and check its re-runs: each member keeps its derived
/// run id (0.13's), runs its step again (the earlier `Fail` verdict's
/// replay record is not replayed) and reads none of the earlier run's memo
/// entries.
async fn resume_and_check<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &taquba_workflow::WorkflowRuntime<R, H>,
    drafts: &Drafts,
    first: &[MemberResult],
) {
    let group = runtime.group(rid("drafts"));
    drafts.failing.store(false, Ordering::SeqCst);
    group.resume(&RunOptions::default()).await.unwrap();
    runtime.signal("drafts-gate", b"go".to_vec()).await.unwrap();
    let second = within(30, async {
        loop {
            let results = results(&group).await;
            if results
                .iter()
                .all(|r| r.termination.status == TerminalStatus::Succeeded)
            {
                return results;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let seen = drafts.seen();
    assert_eq!(seen.len(), 4, "each member's step ran again: {seen:?}");
    for (earlier, now) in first.iter().zip(&second) {
        assert_eq!(
            now.run_id,
            member_run_id("drafts", &now.key),
            "{}: the member's derived run id",
            now.key
        );
        assert_eq!(now.run_id, earlier.run_id, "{}: the same run id", now.key);
        let outcome = now.outcome.as_ref().expect("recorded");
        assert_eq!(outcome.run_id, now.run_id);
        if now.key == "fails" {
            // Its result is what its step returned this time.
            assert_eq!(outcome.result.as_deref(), Some(now.run_id.as_bytes()));
        }
        let rerun = seen
            .iter()
            .filter(|s| s.run_id == now.run_id)
            .nth(1)
            .expect("the member's step ran a second time");
        assert_eq!(rerun.step_memo, None, "{}: a clean step memo", now.key);
        assert_eq!(rerun.run_memo, None, "{}: a clean run memo", now.key);
        let Some(RunState::Terminated(t)) =
            runtime.status(&now.run_id).await.unwrap().map(|s| s.state)
        else {
            panic!("{}: the re-run is not terminated", now.key);
        };
        assert_eq!(t.status, TerminalStatus::Succeeded);
    }

    // `forget` removes the member's runs and memo entries.
    group.forget().await.unwrap();
    for result in &second {
        assert!(runtime.status(&result.run_id).await.unwrap().is_none());
    }
}

/// A member that failed and one that was cancelled, run again by `resume`
/// (with step-output replay on): each keeps its derived run id, which
/// `MemberResult::run_id` reports, runs its step afresh and sees none of
/// the earlier run's memo entries (issue 22).
#[tokio::test(start_paused = true)]
async fn a_member_run_again_keeps_its_run_id_and_starts_clean() {
    let (queue, store, _clock) = memory_queue().await;
    let drafts = Drafts::default();
    drafts.failing.store(true, Ordering::SeqCst);
    let runtime = workflow_builder(&queue, &store, &drafts)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let first = fail_and_cancel(&runtime, &drafts).await;
    // The earlier run's outcome is readable until the member runs again.
    assert_eq!(
        runtime
            .outcome(&first[0].run_id)
            .await
            .unwrap()
            .expect("the earlier run's outcome")
            .error,
        Some(format!("failed in {}", first[0].run_id))
    );
    resume_and_check(&runtime, &drafts, &first).await;
    assert!(
        MemoStore::new(store.clone(), MEMO_PREFIX)
            .new_run_memo(&first[0].run_id)
            .get("paid")
            .await
            .unwrap()
            .is_none()
    );
    worker.shutdown().await.unwrap();
}

/// The same with the process restarted between the two submissions: the
/// re-run's isolation does not depend on anything held in memory.
#[tokio::test(start_paused = true)]
async fn a_member_run_again_after_a_restart_keeps_its_run_id_and_starts_clean() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let clock = taquba::MockClock::new(T0);
    let drafts = Drafts::default();
    drafts.failing.store(true, Ordering::SeqCst);

    let queue = open(&store, &clock).await;
    let runtime = workflow_builder(&queue, &store, &drafts)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let first = fail_and_cancel(&runtime, &drafts).await;
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;

    let queue = open(&store, &clock).await;
    let runtime = workflow_builder(&queue, &store, &drafts)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    resume_and_check(&runtime, &drafts, &first).await;
    worker.shutdown().await.unwrap();
}

fn spec(id: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: b"x".to_vec(),
        ..Default::default()
    }
}

/// A plain run id submitted again after its run ended (with step-output
/// replay on) is a new run: its step runs again instead of replaying the
/// earlier run's recorded `Fail`, and it reads the memo entries the earlier
/// run wrote (shared by the runs of a run id, as the seeds describe).
#[tokio::test(start_paused = true)]
async fn a_plain_run_id_submitted_again_runs_afresh_and_shares_its_memo() {
    let (queue, store, _clock) = memory_queue().await;
    let drafts = Drafts::default();
    drafts.failing.store(true, Ordering::SeqCst);
    let runtime = workflow_builder(&queue, &store, &drafts)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("again")).await.unwrap();
    let first = within(30, runtime.wait(&rid("again"))).await.unwrap();
    assert_eq!(first.termination.status, TerminalStatus::Failed);

    drafts.failing.store(false, Ordering::SeqCst);
    let resubmitted = runtime.submit(spec("again")).await.unwrap();
    assert!(resubmitted.newly_submitted);
    let second = within(30, runtime.wait(&rid("again"))).await.unwrap();
    assert_eq!(
        second.termination.status,
        TerminalStatus::Succeeded,
        "the earlier run's recorded Fail was replayed"
    );
    let seen = drafts.seen();
    assert_eq!(seen.len(), 2, "the step ran again");
    assert_eq!(seen[1].step_memo.as_deref(), Some(b"again".as_slice()));
    assert_eq!(seen[1].run_memo.as_deref(), Some(b"again".as_slice()));
    worker.shutdown().await.unwrap();
}

/// With memo retention, a plain run id that ended, was submitted again and
/// ended again keeps the second run's state for the second run's window:
/// the first run's marker, due earlier, does not remove it.
#[tokio::test(start_paused = true)]
async fn a_plain_run_ended_twice_keeps_its_state_for_the_last_window() {
    let (queue, store, clock) = memory_queue().await;
    let drafts = Drafts::default();
    let runtime = workflow_builder(&queue, &store, &drafts)
        .memo_retention(Duration::from_secs(10))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("twice")).await.unwrap();
    within(30, runtime.wait(&rid("twice"))).await.unwrap();
    clock.advance(Duration::from_secs(5));
    runtime.submit(spec("twice")).await.unwrap();
    within(30, runtime.wait(&rid("twice"))).await.unwrap();

    clock.advance(Duration::from_secs(6));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        runtime.outcome(&rid("twice")).await.unwrap().is_some(),
        "the second run's outcome was removed by the first run's marker"
    );
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    assert!(
        memos
            .new_run_memo(&rid("twice"))
            .get("paid")
            .await
            .unwrap()
            .is_some()
    );

    clock.advance(Duration::from_secs(5));
    eventually("the second run's state is removed", || async {
        runtime.status(&rid("twice")).await.unwrap().is_none()
    })
    .await;
    assert!(
        memos
            .new_run_memo(&rid("twice"))
            .get("paid")
            .await
            .unwrap()
            .is_none()
    );
    worker.shutdown().await.unwrap();
}
