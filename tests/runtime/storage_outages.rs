//! Storage faults held for a whole call or a window of time: a blip of
//! memo writes while a step's result or replay record is written, an
//! outage of every write (the queue's WAL included) with runs mid-way,
//! failing reads and deletes, a group submitted while its manifest cannot
//! be written. A call answers (an error naming the fault, or its result)
//! instead of hanging, a blip neither runs a step again nor spends its
//! attempts, nothing half done is left behind, and once the store answers
//! again every run ends without a restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use crate::fixtures::{
    Counting, Scripted, ends_within, join_all, queue_with, spec, switchable_store,
    tokio_clock_queue,
};
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::{
    GroupMember, Memo, MemoStore, RunOptions, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, INJECTED, Op};

// ---------------------------------------------------------------------------
// A blip of memo-prefix writes while steps settle.

/// Every write under the memo prefix fails for 3 s (shorter than the
/// step's 5 s lease) while a run's only step returns `Succeed`, so its
/// result record cannot be written at first. The worker docs: "storage
/// errors are logged and retried at the poll interval, so the loop keeps
/// serving runs through an outage". The run must end `Succeeded` with its
/// result, its runner called once: a blip of the store is not a reason to
/// run a step's side effects again, nor to spend its attempts (the queue's
/// backoff, 0.5 s then 1 s, is shorter than the blip, so three attempts
/// used to be spent and the run failed with the runtime's own error).
#[tokio::test(start_paused = true)]
async fn a_success_during_a_memo_write_blip_is_recorded_without_running_the_step_again() {
    let (faulty, store) = switchable_store();
    let queue = queue_with(
        store.clone(),
        Duration::from_secs(5),
        Duration::from_millis(500),
    )
    .await;
    let script = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    runtime.submit(spec("blip", "ok")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    faulty.set_enabled(false);
    assert!(faulty.injected(Op::Put) > 0, "the blip hit no write");
    let end = ends_within(&runtime, "blip", 120, "after the blip").await;
    assert_eq!(
        end.termination.status,
        TerminalStatus::Succeeded,
        "{:?} after {} runner calls",
        end.termination,
        script.calls_of("blip")
    );
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"ok"[..])
    );
    assert_eq!(script.calls_of("blip"), 1, "the step ran again");
    worker.shutdown().await.unwrap();
}

/// With `step_output_replay`, every step writes its replay record before
/// it settles. A 3 s blip of memo-prefix writes (shorter than the 5 s
/// lease) while a run goes through three steps must not spend the steps'
/// attempts nor call a runner twice: the builder doc promises a replay
/// "instead of calling the runner when the same step is delivered again",
/// and the worker's "storage errors are logged and retried".
#[tokio::test(start_paused = true)]
async fn a_replay_record_write_blip_does_not_run_steps_again() {
    #[derive(Clone, Default)]
    struct Steps {
        calls: Arc<Mutex<Vec<u32>>>,
    }
    impl StepRunner for Steps {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            self.calls.lock().unwrap().push(step.step_number);
            Ok(if step.step_number < 2 {
                StepOutcome::continue_now(b"next".to_vec())
            } else {
                StepOutcome::Succeed {
                    result: b"done".to_vec(),
                }
            })
        }
    }
    let (faulty, store) = switchable_store();
    let queue = queue_with(
        store.clone(),
        Duration::from_secs(5),
        Duration::from_millis(500),
    )
    .await;
    let steps = Steps::default();
    let runtime = workflow_builder(&queue, &store, &steps)
        .step_output_replay()
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    runtime.submit(spec("replayed", "go")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    faulty.set_enabled(false);
    assert!(faulty.injected(Op::Put) > 0, "the blip hit no write");
    let end = ends_within(&runtime, "replayed", 120, "after the blip").await;
    assert_eq!(
        end.termination.status,
        TerminalStatus::Succeeded,
        "{:?}, runner calls {:?}",
        end.termination,
        steps.calls.lock().unwrap()
    );
    assert_eq!(
        *steps.calls.lock().unwrap(),
        vec![0, 1, 2],
        "a step ran again"
    );
    worker.shutdown().await.unwrap();
}

/// A cancel arriving while a succeeded step's run result record is being
/// written again through a memo-store blip (the in-lease retry of the
/// test above; finding F2 of the second round of attacks): the
/// runner returned before the request, so the run ends `Succeeded` with
/// its result, the cancel answers `false`, and the hook fires once.
#[tokio::test(start_paused = true)]
async fn a_cancel_during_the_result_record_retry_finds_the_run_succeeded() {
    let (faulty, store) = switchable_store();
    let queue = queue_with(store.clone(), Duration::from_secs(5), Duration::ZERO).await;
    let hook = Counting::default();
    let script = Scripted::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    runtime.submit(spec("raced-retry", "ok")).await.unwrap();
    eventually("the runner call", || async {
        script.calls_of("raced-retry") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancelling = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.cancel(&rid("raced-retry")).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    faulty.set_enabled(false);
    let cancelled = within(60, cancelling).await.unwrap().unwrap();
    let end = ends_within(&runtime, "raced-retry", 60, "the raced retry").await;
    assert!(
        !cancelled,
        "cancel answered true for a step that had returned"
    );
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"ok"[..])
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        hook.calls_of("raced-retry"),
        vec![TerminalStatus::Succeeded]
    );
    assert_eq!(script.calls_of("raced-retry"), 1);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Writes failing for a whole call, or a whole window.

/// Every put to the memo prefix fails while a memo write is made: the call
/// returns an error naming the fault; what was written before is intact;
/// after the faults stop, the same memo and runtime work without a restart.
#[tokio::test(start_paused = true)]
async fn a_memo_put_under_failing_puts_errs_clearly_and_leaves_the_old_value() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner, FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    let memo: Memo = memos.new_run_memo(&rid("memo-run"));
    memo.put("k", b"old").await.unwrap();
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        ..FaultConfig::default()
    });
    let err = within(30, memo.put("k", b"new")).await.unwrap_err();
    assert!(err.to_string().contains(INJECTED), "unclear error: {err}");
    assert_eq!(memo.get("k").await.unwrap().as_deref(), Some(&b"old"[..]));
    faulty.set_enabled(false);
    memo.put("k", b"new").await.unwrap();
    assert_eq!(memo.get("k").await.unwrap().as_deref(), Some(&b"new"[..]));
}

/// `RunGroup::submit` while every write of the memo prefix (where the
/// group's manifest lives) fails, then `status`, `cancel` and `results`
/// of the group: each answers (an error naming the fault, or
/// `GroupNotFound`), none hangs; once writes work again the same
/// submission runs every member once.
#[tokio::test(start_paused = true)]
async fn a_group_submitted_while_manifest_writes_fail_errs_and_runs_once_later() {
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let script = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("unwritten"));
    let members: Vec<GroupMember> = (0..4)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"ok".to_vec(),
        })
        .collect();
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    let err = within(30, group.submit(members.clone(), &RunOptions::default()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains(INJECTED), "unclear: {err}");
    match within(30, group.status()).await {
        Err(taquba_workflow::Error::GroupNotFound(_)) => {}
        other => panic!("status of an unwritten group: {other:?}"),
    }
    assert_eq!(within(30, group.cancel()).await.unwrap_or(0), 0);
    faulty.set_enabled(false);
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = join_all(&group).await;
    assert_eq!(results.len(), 4);
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    for result in &results {
        assert_eq!(script.calls_of(result.run_id.as_str()), 1, "{}", result.key);
    }
    worker.shutdown().await.unwrap();
}

/// Every write of the whole store (the queue's WAL included) fails for
/// 30 s while runs are mid-way; then the store recovers. The worker docs:
/// "storage errors are logged and retried at the poll interval, so the
/// loop keeps serving runs through an outage". Without a restart every
/// run must end `Succeeded`, its hook called once, and the queue left
/// with nothing pending, claimed or dead.
#[tokio::test(start_paused = true)]
async fn a_whole_store_write_outage_mid_run_then_every_run_ends_once() {
    let (faulty, store) = switchable_store();
    let queue = queue_with(
        store.clone(),
        Duration::from_secs(5),
        Duration::from_millis(100),
    )
    .await;
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
    let ids: Vec<String> = (0..6).map(|i| format!("outage-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let input = match i % 3 {
            0 => "timer:2000",
            1 => "sleep:1000",
            _ => "ok",
        };
        runtime.submit(spec(id, input)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    tokio::time::sleep(Duration::from_secs(30)).await;
    faulty.set_enabled(false);
    assert!(faulty.injected(Op::Put) > 0, "the outage hit no write");
    for id in &ids {
        let end = ends_within(&runtime, id, 120, "after the outage").await;
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
    }
    eventually("every hook call", || async {
        ids.iter().all(|id| !hook.calls_of(id).is_empty())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    for id in &ids {
        assert_eq!(hook.calls_of(id), vec![TerminalStatus::Succeeded], "{id}");
    }
    let stats = queue.view().stats(STEPS).await.unwrap();
    assert_eq!(
        (stats.pending, stats.claimed, stats.scheduled, stats.dead),
        (0, 0, 0, 0),
        "{stats:?}"
    );
    worker.shutdown().await.unwrap();
}

/// Every put of the whole store fails while a run is submitted (the queue's
/// WAL cannot be written): the submission must not claim success for a run
/// that was never committed, and once the faults stop the runtime serves
/// runs again without a restart, and a submission that was answered ends.
/// The README ("Storage outages") says which: SlateDB retries the write
/// until the store answers, so the call waits instead of failing, and is
/// still waiting when its 20 s timeout cuts it short.
#[tokio::test(start_paused = true)]
async fn a_submission_while_every_put_fails_then_recovers_without_restart() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner, FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("before", "ok")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "before", 30, "before the faults")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        ..FaultConfig::default()
    });
    let during = tokio::time::timeout(
        Duration::from_secs(20),
        runtime.submit(spec("during", "steps:3")),
    )
    .await;
    faulty.set_enabled(false);
    // Still waiting after 20 s, as the README says: neither an answer for
    // a run whose commit could not be written, nor an error.
    if let Ok(answer) = during {
        panic!("the submission answered during the outage instead of waiting: {answer:?}");
    }
    assert!(faulty.injected(Op::Put) > 0, "the outage hit no write");
    // The committed run is intact.
    assert_eq!(
        runtime
            .outcome(&rid("before"))
            .await
            .unwrap()
            .and_then(|o| o.result)
            .as_deref(),
        Some(&b"ok"[..])
    );
    // Recovery without restart: a new run runs, the dropped one converges.
    runtime.submit(spec("after", "steps:3")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "after", 60, "after the faults")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    runtime.submit(spec("during", "steps:3")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "during", 60, "resubmitted")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    worker.shutdown().await.unwrap();
}

/// `shutdown`, and a submission, while every write of the store fails
/// and a step's settlement waits to commit. SlateDB retries the queue's
/// writes until the store answers, so neither can finish during the
/// outage; the README ("Storage outages") says so and says to bound them
/// with `tokio::time::timeout`. Bounded and dropped, they must leave
/// nothing half done: once the store recovers, the step (whose lease
/// expired meanwhile) runs to its end under a new worker, the dropped
/// submission runs or never existed, and new runs are served.
#[tokio::test(start_paused = true)]
async fn a_shutdown_and_a_submission_bounded_during_a_write_outage_leave_every_run_to_end() {
    let (faulty, store) = switchable_store();
    let queue = queue_with(store.clone(), Duration::from_secs(5), Duration::ZERO).await;
    let script = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("stuck", "sleep:1000")).await.unwrap();
    eventually("the step to run", || async {
        script.calls_of("stuck") == 1
    })
    .await;
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    let submitted = tokio::time::timeout(
        Duration::from_secs(10),
        runtime.submit(spec("during", "ok")),
    )
    .await;
    let stopped = tokio::time::timeout(Duration::from_secs(10), worker.shutdown()).await;
    assert!(faulty.injected(Op::Put) > 0, "the outage hit no write");
    faulty.set_enabled(false);
    assert!(
        stopped.is_err(),
        "shutdown returned during the outage: the README's \"Storage outages\" is wrong"
    );
    // The drained step's lease expired during the outage, so the queue
    // delivers it again: to a new worker, since the old one has stopped.
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = ends_within(&runtime, "stuck", 60, "the drained step").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(script.calls_of("stuck") <= 2, "one redelivery at most");
    if let Ok(answer) = submitted {
        assert!(answer.unwrap().newly_submitted);
    }
    runtime.submit(spec("during", "ok")).await.unwrap();
    let end = ends_within(&runtime, "during", 60, "the bounded submission").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Reads and deletes failing for a whole call.

/// A wait on a run that ended, while every read of the memo prefix (where
/// the run's result record lives) fails: `wait` must answer (an error
/// naming the fault, or the end), never hang; once reads work again it
/// reports the committed result.
#[tokio::test(start_paused = true)]
async fn a_wait_on_an_ended_run_while_memo_reads_fail_answers() {
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("ended", "ok")).await.unwrap();
    ends_within(&runtime, "ended", 30, "before the faults").await;
    faulty.set_config(FaultConfig {
        rates: [0.0, 1.0, 1.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    match tokio::time::timeout(Duration::from_secs(30), runtime.wait(&rid("ended"))).await {
        Err(_) => panic!("wait on an ended run hangs while memo reads fail"),
        Ok(Err(err)) => assert!(err.to_string().contains(INJECTED), "unclear: {err}"),
        Ok(Ok(end)) => assert_eq!(end.termination.status, TerminalStatus::Succeeded),
    }
    faulty.set_enabled(false);
    let end = ends_within(&runtime, "ended", 30, "after the faults").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"ok"[..])
    );
    worker.shutdown().await.unwrap();
}

/// Every get fails (memo prefix) while a run that reads its memo goes on:
/// status/wait still answer, and after the faults stop the run ends.
#[tokio::test(start_paused = true)]
async fn reads_under_failing_gets_err_clearly_and_the_runtime_recovers() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner, FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("done", "ok")).await.unwrap();
    ends_within(&runtime, "done", 30, "before").await;
    faulty.set_config(FaultConfig {
        rates: [0.0, 1.0, 0.0, 0.0],
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::default()
    });
    // The outcome lives in the memo prefix: a clear error, not a hang or a
    // wrong `None`.
    match within(30, runtime.outcome(&rid("done"))).await {
        Err(err) => assert!(err.to_string().contains(INJECTED), "unclear: {err}"),
        Ok(outcome) => assert!(
            outcome.is_some(),
            "outcome answered None for a committed run while gets fail"
        ),
    }
    runtime.submit(spec("while", "steps:2")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    faulty.set_enabled(false);
    assert_eq!(
        ends_within(&runtime, "while", 60, "after the faults")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    assert_eq!(
        runtime
            .outcome(&rid("done"))
            .await
            .unwrap()
            .and_then(|o| o.result)
            .as_deref(),
        Some(&b"ok"[..])
    );
    worker.shutdown().await.unwrap();
}

/// `RunGroup::forget` while every delete fails: its doc says "Storage
/// errors; what was removed before the error stays removed, and a later
/// `forget` removes the rest". The call must return the error (not hang);
/// a later `forget` must complete and a new submission under the id must
/// start afresh.
#[tokio::test(start_paused = true)]
async fn a_group_forget_while_deletes_fail_errs_and_a_later_forget_completes() {
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("forgetful"));
    let members: Vec<GroupMember> = (0..5)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"ok".to_vec(),
        })
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    join_all(&group).await;
    faulty.set_config(FaultConfig {
        rates: [0.0, 0.0, 0.0, 1.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    match tokio::time::timeout(Duration::from_secs(60), group.forget()).await {
        Err(_) => panic!("forget hangs while deletes fail"),
        Ok(Ok(())) => {}
        Ok(Err(err)) => assert!(err.to_string().contains(INJECTED), "unclear: {err}"),
    }
    faulty.set_enabled(false);
    within(60, group.forget()).await.unwrap();
    group.submit(members, &RunOptions::default()).await.unwrap();
    join_all(&group).await;
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// The outage budget.

/// A queue opened on an `OutageGuard`: a whole-store write outage longer
/// than the budget makes a submission and the worker's shutdown fail with
/// `Error::StoreOutage` (naming its length and the budget) instead of
/// waiting; everything committed before is still there, and a queue
/// reopened once the store is back resumes every run to its end.
#[tokio::test(start_paused = true)]
async fn an_outage_past_its_budget_fails_calls_and_a_reopened_queue_resumes_every_run() {
    use taquba_workflow::{Error, OutageGuard};

    let (faulty, store) = switchable_store();
    let guarded: Arc<dyn ObjectStore> =
        Arc::new(OutageGuard::new(store.clone(), Duration::from_secs(30)));
    let queue = queue_with(guarded.clone(), Duration::from_secs(5), Duration::ZERO).await;
    let script = Scripted::default();
    let runtime = workflow_builder(&queue, &guarded, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("done", "ok")).await.unwrap();
    ends_within(&runtime, "done", 30, "a run before the outage").await;
    runtime.submit(spec("timer", "timer:120000")).await.unwrap();
    eventually("the timer run to wait", || async {
        script.calls_of("timer") == 1
    })
    .await;

    // Every write fails from now on.
    faulty.set_config(FaultConfig {
        rates: [1.0, 0.0, 0.0, 0.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    let submitted = tokio::time::timeout(
        Duration::from_secs(600),
        runtime.submit(spec("during", "ok")),
    )
    .await
    .expect("the submission answers within the budget and a retry");
    let err = submitted.expect_err("no write can commit");
    assert!(matches!(err, Error::StoreOutage(_)), "{err:?}");
    assert!(err.is_store_closed(), "{err}");
    let text = err.to_string();
    assert!(text.contains("outage budget of 30000 ms"), "{text}");
    let stopped = tokio::time::timeout(Duration::from_secs(600), worker.shutdown())
        .await
        .expect("the worker stops instead of waiting for the store");
    assert!(
        matches!(&stopped, Err(Error::StoreOutage(outage)) if outage.budget_ms == 30_000),
        "{stopped:?}"
    );
    // Every call of the runtime now says so.
    let again = runtime.submit(spec("later", "ok")).await.unwrap_err();
    assert!(matches!(again, Error::StoreOutage(_)), "{again:?}");
    drop(runtime);

    // The store comes back: a queue reopened on it resumes every run.
    faulty.set_enabled(false);
    drop(queue);
    let queue = queue_with(guarded.clone(), Duration::from_secs(5), Duration::ZERO).await;
    let runtime = workflow_builder(&queue, &guarded, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = ends_within(&runtime, "done", 30, "the run ended before").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let end = ends_within(&runtime, "timer", 300, "the timer run").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    runtime.submit(spec("after", "ok")).await.unwrap();
    let end = ends_within(&runtime, "after", 30, "a run after").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(script.calls_of("done"), 1);
    worker.shutdown().await.unwrap();
}
