//! Attacks on the public API, as a service would hit it: calls dropped at
//! each await, storage faults held for a whole call, cancels racing every
//! ending, panicking runners, bad input (run ids, payloads, inbox objects)
//! and crashes mid-run, written by a tester who read only the README and
//! the docs. Each finding became a test here before its fix; the one still
//! open is `#[ignore]`d with its reason.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use crate::durable_paths::{HOUR, MAX_POLLS, slow_store_queue, spec, state, tokio_clock_queue};
use taquba::OpenOptions;
use taquba::object_store::memory::InMemory;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba_workflow::{
    Command, CommandAnswer, CommandId, CommandState, Error, Inbox, MAX_RUN_ID_LEN, Memo, MemoStore,
    RunId, RunOptions, RunSpec, RunState, SignalOutcome, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus, WorkflowRuntime, WorkflowView,
};
use taquba_workflow_suite::testing::{
    FaultConfig, FaultyStore, INJECTED, drop_at_each_poll, poll_then_drop,
};

/// The runner of most attacks, driven by the run's input (step 0):
/// `"ok"` succeeds; `"perm"` fails permanently; `"trans"` fails
/// transiently on every attempt; `"verdict"` returns a `Fail` verdict;
/// `"timer:<ms>"` continues after a delay, then succeeds; `"signal:<key>"`
/// waits for a signal on `key` (an hour), then succeeds with it; `"wait"`
/// waits an hour then succeeds; `"panic"` panics on every attempt;
/// `"steps:<n>"` counts down n steps; anything else is echoed.
#[derive(Clone, Default)]
struct Script {
    /// Every attempt's `(run_id, step_number)`.
    attempts: Arc<Mutex<Vec<(String, u32)>>>,
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.attempts
            .lock()
            .unwrap()
            .push((step.run_id.to_string(), step.step_number));
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 && !input.starts_with("steps:") {
            return Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"after".to_vec()),
            });
        }
        if let Some(n) = input.strip_prefix("steps:") {
            let n: u32 = n.parse().map_err(|_| StepError::permanent("bad count"))?;
            return Ok(if n == 0 {
                StepOutcome::Succeed {
                    result: b"counted".to_vec(),
                }
            } else {
                StepOutcome::continue_now(format!("steps:{}", n - 1).into_bytes())
            });
        }
        if let Some(ms) = input.strip_prefix("timer:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_after(
                b"fired".to_vec(),
                Duration::from_millis(ms),
            ));
        }
        if let Some(key) = input.strip_prefix("signal:") {
            return Ok(StepOutcome::continue_on_signal(
                b"woken".to_vec(),
                key.to_string(),
                HOUR,
            ));
        }
        match input.as_str() {
            "ok" => Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            }),
            "perm" => Err(StepError::permanent("permanently broken")),
            "trans" => Err(StepError::transient("always flaky")),
            "verdict" => Ok(StepOutcome::Fail {
                reason: "refused".into(),
            }),
            "wait" => Ok(StepOutcome::continue_after(b"done".to_vec(), HOUR)),
            "panic" => panic!("the runner panics on purpose"),
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }
}

/// The status run `id` ends with within `secs` s of (paused) time; panics
/// naming `what` with the state it is stuck in otherwise.
async fn ends_within<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    secs: u64,
    what: &str,
) -> TerminalStatus {
    match runtime
        .wait_timeout(&rid(id), Duration::from_secs(secs))
        .await
        .unwrap()
    {
        Some(end) => end.termination.status,
        None => panic!(
            "{what}: run {id} did not end within {secs}s ({:?})",
            state(runtime, id).await
        ),
    }
}

// ---------------------------------------------------------------------------
// 1. Calls dropped at each await.

/// `cancel_with_reason` commits like `cancel` (it records the request and
/// removes the waiting step). README, "Cancel safety": "Every call that
/// commits is safe to drop at any await ... a dropped ... `cancel` ...
/// either did nothing or completes as if awaited". Dropped at each poll,
/// the run must end `Cancelled` (or be left untouched, then a new call
/// cancels it), never stay `Cancelling` with its timer step still waiting.
#[tokio::test(start_paused = true)]
async fn a_cancel_with_reason_dropped_at_any_poll_cancels_the_run_or_leaves_it_alone() {
    let (queue, store, _clock) = slow_store_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |n| {
            let runtime = &runtime;
            async move {
                let id = format!("requeue-{n}");
                runtime.submit(spec(&id, "perm")).await.unwrap();
                assert_eq!(
                    ends_within(runtime, &id, 60, "dead letter").await,
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
                    ends_within(runtime, &id, 60, &what).await,
                    TerminalStatus::Failed
                );
            }
        },
    )
    .await;
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. A storage fault held for a whole call.

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

/// Every put of the whole store fails while a run is submitted (the queue's
/// WAL cannot be written): the submission must not claim success for a run
/// that was never committed, and once the faults stop the runtime serves
/// runs again without a restart, and a submission that was answered ends.
#[tokio::test(start_paused = true)]
async fn a_submission_while_every_put_fails_then_recovers_without_restart() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(inner, FaultConfig::default());
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("before", "ok")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "before", 30, "before the faults").await,
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
    match during {
        Ok(Ok(outcome)) => {
            assert!(outcome.newly_submitted);
            assert_eq!(
                ends_within(&runtime, "during", 60, "answered during faults").await,
                TerminalStatus::Succeeded
            );
        }
        Ok(Err(err)) => eprintln!("submission during faults: {err}"),
        Err(_) => eprintln!("submission during faults still hanging after 20 s"),
    }
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
        ends_within(&runtime, "after", 60, "after the faults").await,
        TerminalStatus::Succeeded
    );
    runtime.submit(spec("during", "steps:3")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "during", 60, "resubmitted").await,
        TerminalStatus::Succeeded
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
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
        ends_within(&runtime, "while", 60, "after the faults").await,
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

// ---------------------------------------------------------------------------
// 3. A cancel racing every ending.

/// A terminal hook counting its calls per run.
#[derive(Clone, Default)]
struct Counting {
    calls: Arc<Mutex<Vec<(String, TerminalStatus)>>>,
}

impl taquba_workflow::TerminalHook for Counting {
    async fn on_termination(
        &self,
        outcome: &taquba_workflow::RunOutcome,
        _effects: &taquba_workflow::TerminalEffects,
    ) -> Result<(), StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((outcome.run_id.to_string(), outcome.status));
        Ok(())
    }
}

/// For each ending (success, permanent failure, `Fail` verdict, last retry
/// dead-lettering, a timer firing, a signal arriving), a cancel is sent
/// after 0..K yields so it lands at different points of the ending. Each
/// run: one terminal status, `wait` reports it, `status` agrees, the hook
/// is called exactly once with it, and `cancel` answered `true` only when
/// the run ended `Cancelled`.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_every_ending_leaves_one_termination_and_one_hook_call() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Counting::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Script::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut expected = Vec::new();
    for ending in ["ok", "perm", "verdict", "trans", "timer:5", "signal"] {
        for k in 0..24usize {
            let id = format!("race-{}-{k}", ending.replace(':', ""));
            let input = if ending == "signal" {
                format!("signal:key-{id}")
            } else {
                ending.to_string()
            };
            runtime.submit(spec(&id, &input)).await.unwrap();
            if ending == "signal" {
                until_step("the signal wait", &runtime, &id, 1).await;
            }
            let signaller = {
                let runtime = runtime.clone();
                let key = format!("key-{id}");
                tokio::spawn(async move {
                    if ending == "signal" {
                        runtime.signal(&key, b"sig".to_vec()).await.map(|_| ())
                    } else {
                        Ok(())
                    }
                })
            };
            for _ in 0..k {
                tokio::task::yield_now().await;
            }
            if k % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(k as u64 / 3)).await;
            }
            let cancelled = within(60, runtime.cancel(&rid(&id))).await.unwrap();
            signaller.await.unwrap().unwrap();
            let end = within(60, runtime.wait(&rid(&id))).await.unwrap();
            let status = end.termination.status;
            if cancelled {
                assert_eq!(status, TerminalStatus::Cancelled, "{id}: cancel said true");
            }
            match state(&runtime, &id).await {
                Some(RunState::Terminated(t)) => assert_eq!(t.status, status, "{id}"),
                other => panic!("{id}: status {other:?} after wait returned {status:?}"),
            }
            expected.push((id, status));
        }
    }
    eventually("every hook call", || async {
        hook.calls.lock().unwrap().len() >= expected.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = hook.calls.lock().unwrap().clone();
    for (id, status) in &expected {
        let mine: Vec<_> = calls.iter().filter(|(r, _)| r == id).collect();
        assert_eq!(mine.len(), 1, "{id}: hook calls {mine:?}");
        assert_eq!(&mine[0].1, status, "{id}: hook status");
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 4. Runners that panic.

/// README: "A panicking step is treated as a transient error naming the
/// panic." A step that panics on every attempt ends the run `Failed` after
/// the attempts, with an error naming the panic, and the worker goes on.
#[tokio::test(start_paused = true)]
async fn a_runner_that_always_panics_fails_the_run_and_the_worker_goes_on() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runner = Script::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("panics", "panic")).await.unwrap();
    let end = within(120, runtime.wait(&rid("panics"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    let error = end.outcome.and_then(|o| o.error).unwrap_or_default();
    assert!(
        error.contains("on purpose"),
        "error does not name the panic: {error:?}"
    );
    let attempts = runner
        .attempts
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| r == "panics")
        .count();
    assert_eq!(attempts, 3, "attempts of a panicking step");
    runtime.submit(spec("after-panic", "ok")).await.unwrap();
    assert_eq!(
        ends_within(&runtime, "after-panic", 30, "after a panic").await,
        TerminalStatus::Succeeded
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 5. Bad input.

/// `RunId`: 1..=128 bytes of `[A-Za-z0-9_-]`, refused with `InvalidRunId`.
#[test]
fn run_ids_are_validated_at_their_bounds() {
    assert!(RunId::new("a".repeat(MAX_RUN_ID_LEN)).is_ok());
    for bad in [
        String::new(),
        "a".repeat(MAX_RUN_ID_LEN + 1),
        "a/b".into(),
        "a.b".into(),
        "..".into(),
        "é".into(),
        "a b".into(),
        "a\0".into(),
    ] {
        match RunId::new(bad.clone()) {
            Err(Error::InvalidRunId { run_id, .. }) => assert_eq!(run_id, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // Deserializing validates too.
    let bytes = rmp_serde::to_vec(&"../etc").unwrap();
    assert!(rmp_serde::from_slice::<RunId>(&bytes).is_err());
}

/// A group over a 128-byte id, its members and a re-run of a failed member
/// (`{digest}-{n}`) stay valid.
#[tokio::test(start_paused = true)]
async fn a_group_with_the_longest_id_runs_and_reruns_its_members() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid(&"g".repeat(MAX_RUN_ID_LEN)));
    within(
        60,
        group.submit(
            vec![member("a", "ok"), member("b", "verdict")],
            &RunOptions::default(),
        ),
    )
    .await
    .unwrap();
    eventually("members end", || async {
        let s = group.status().await.unwrap();
        s.succeeded + s.failed + s.cancelled == 2
    })
    .await;
    within(60, group.resume(&RunOptions::default()))
        .await
        .unwrap();
    eventually("re-run ends", || async {
        let s = group.status().await.unwrap();
        s.succeeded + s.failed + s.cancelled == 2 && s.pending == 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// Reserved header names are refused wherever they are given, including
/// case variants that a case-insensitive header store would take for them.
#[tokio::test(start_paused = true)]
async fn reserved_headers_are_refused_in_a_submission() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    for name in ["workflow.run_id", "workflow.", "workflow.step"] {
        let mut spec = spec("hdr", "ok");
        spec.options.headers.insert(name.to_string(), "x".into());
        match runtime.submit(spec).await {
            Err(Error::ReservedHeaderInSubmit(_)) => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(runtime.status(&rid("hdr")).await.unwrap().is_none());
}

/// An input of several MiB (larger than a queue payload usually is) runs
/// and comes back whole.
#[tokio::test(start_paused = true)]
async fn a_multi_mebibyte_input_runs_and_is_echoed_whole() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let input: Vec<u8> = (0..(5 * 1024 * 1024))
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let outcome = runtime
        .submit(RunSpec {
            run_id: Some(rid("big")),
            input: input.clone(),
            ..Default::default()
        })
        .await;
    match outcome {
        Ok(_) => {
            let end = within(120, runtime.wait(&rid("big"))).await.unwrap();
            assert_eq!(end.termination.status, TerminalStatus::Succeeded);
            assert_eq!(end.outcome.and_then(|o| o.result), Some(input));
        }
        Err(err) => panic!("a 5 MiB input was refused: {err}"),
    }
    worker.shutdown().await.unwrap();
}

/// Write `bytes` at `{MEMO_PREFIX}/inbox/v1/{name}` and touch the inbox.
async fn drop_in_inbox(store: &Arc<dyn ObjectStore>, name: &str, bytes: Vec<u8>) {
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/v1/{name}")),
            PutPayload::from(bytes),
        )
        .await
        .unwrap();
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/touch")),
            PutPayload::from(name.as_bytes().to_vec()),
        )
        .await
        .unwrap();
}

async fn inbox_names(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    use futures_util::StreamExt;
    let dir = Path::from(format!("{MEMO_PREFIX}/inbox/v1"));
    store
        .list(Some(&dir))
        .map(|m| m.unwrap().location.to_string())
        .collect::<Vec<_>>()
        .await
}

async fn settled(view: &WorkflowView, id: &CommandId, secs: u64) -> CommandState {
    let mut state = CommandState::Pending;
    for _ in 0..(secs * 100) {
        state = view.command(id).await.unwrap();
        if matches!(
            state,
            CommandState::Applied { .. } | CommandState::Rejected { .. }
        ) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    state
}

/// Garbage objects of every kind in the inbox (zero bytes, random bytes,
/// a wrong name, an oversized one, valid MessagePack of the wrong shape)
/// are rejected or removed, and a real command sent after them is applied.
#[tokio::test(start_paused = true)]
async fn garbage_in_the_inbox_is_removed_and_the_inbox_goes_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    submit_run(&runtime, "garbage-target").await;
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("g-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "g-wait", 1).await;
    let mut ids = Vec::new();
    for (i, bytes) in [
        Vec::new(),
        vec![0xc1; 100],
        rmp_serde::to_vec(&42u32).unwrap(),
        rmp_serde::to_vec_named(&serde_json::json!({"format": 99, "command": {"kind": "nuke"}}))
            .unwrap(),
        vec![0u8; 2 * 1024 * 1024],
    ]
    .into_iter()
    .enumerate()
    {
        let id: CommandId = format!("01JAZ3NDEKTSV4RRFFQ69G5FA{i}").parse().unwrap();
        drop_in_inbox(&store, &format!("{id}.msgpack"), bytes).await;
        ids.push(id);
    }
    for name in ["notes.txt", "NOT-A-ULID.msgpack", ".msgpack"] {
        drop_in_inbox(&store, name, b"junk".to_vec()).await;
    }
    for id in &ids {
        match settled(runtime.view(), id, 120).await {
            CommandState::Rejected { .. } => {}
            other => panic!("{id}: {other:?}"),
        }
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let real = inbox
        .send(Command::cancel(rid("g-wait"), Some("real".into())))
        .await
        .unwrap();
    match settled(runtime.view(), &real, 120).await {
        CommandState::Applied { answer, .. } => assert_eq!(
            answer,
            CommandAnswer::Cancelled {
                run_id: rid("g-wait"),
                cancelled: true
            }
        ),
        other => panic!("real command: {other:?}"),
    }
    eventually("the inbox empties", || async {
        inbox_names(&store).await.is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A command written by another tool under a lowercase ULID (Crockford
/// base 32 is case-insensitive; the id parses) is applied or rejected,
/// and its object removed; it must not sit in the inbox unanswered.
#[tokio::test(start_paused = true)]
async fn a_command_named_by_a_lowercase_ulid_is_answered_and_removed() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("lc-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "lc-wait", 1).await;
    #[derive(serde::Serialize)]
    struct Foreign<'a> {
        format: u32,
        id: &'a str,
        sent_at_ms: u64,
        sender: &'a str,
        command: Kind<'a>,
    }
    #[derive(serde::Serialize)]
    struct Kind<'a> {
        kind: &'a str,
        run_id: &'a str,
        reason: &'a str,
    }
    let lower = "01jaz3ndektsv4rrffq69g5fav";
    let id: CommandId = lower.parse().unwrap();
    let bytes = rmp_serde::to_vec_named(&Foreign {
        format: 1,
        id: lower,
        sent_at_ms: 1,
        sender: "a go tool",
        command: Kind {
            kind: "cancel",
            run_id: "lc-wait",
            reason: "lowercase",
        },
    })
    .unwrap();
    drop_in_inbox(&store, &format!("{lower}.msgpack"), bytes).await;
    let state = settled(runtime.view(), &id, 130).await;
    let left = inbox_names(&store).await;
    assert!(
        !matches!(state, CommandState::Pending),
        "still pending after two minutes; inbox: {left:?}; run: {:?}",
        state_of(&runtime, "lc-wait").await
    );
    assert!(left.is_empty(), "inbox objects left: {left:?}");
    worker.shutdown().await.unwrap();
}

async fn state_of<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> Option<RunState> {
    state(runtime, id).await
}

/// Objects in a sub-directory of the inbox (a tool that wrote
/// `inbox/v1/<sender>/<ulid>.msgpack`, a stray copy) sort before every
/// command. 64 of them (a round's share) must not keep the real commands
/// after them from being applied.
#[tokio::test(start_paused = true)]
async fn nested_inbox_objects_do_not_block_later_commands() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("n-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "n-wait", 1).await;
    for i in 0..64u32 {
        let id = format!("01JAZ3NDEKTSV4RRFFQ69G{i:04}");
        let _: CommandId = id.parse().unwrap();
        drop_in_inbox(&store, &format!("0/{id}.msgpack"), b"junk".to_vec()).await;
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let real = inbox
        .send(Command::cancel(rid("n-wait"), None))
        .await
        .unwrap();
    let state = settled(runtime.view(), &real, 130).await;
    let left = inbox_names(&store).await.len();
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the real command is {state:?} after two minutes; {left} inbox objects left"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 6. Crash mid-run.

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
        let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
        let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
                ends_within(&runtime, id, 120, &what).await,
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
        let runtime = workflow_builder(&queue, &store, &Script::default()).build();
        let id = format!("phantom-{n}");
        let _ = poll_then_drop(runtime.submit(spec(&id, "ok")), n).await;
        // Crash right away, before the detached submission had time.
        drop(runtime);
        drop(queue);
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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

/// `signal` answered `Delivered`/`Buffered` before a crash is not lost.
#[tokio::test(start_paused = true)]
async fn a_signal_answered_before_a_crash_is_delivered_after_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let outcome = runtime.signal("early", b"first".to_vec()).await.unwrap();
    assert!(matches!(outcome, SignalOutcome::Buffered), "{outcome:?}");
    drop(runtime);
    drop(queue);
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("late", "signal:early")).await.unwrap();
    let end = within(60, runtime.wait(&rid("late"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"first"[..])
    );
    worker.shutdown().await.unwrap();
}

/// A step that waits on a correlation key far larger than a KV key can be
/// (70 000 bytes; keys are stored as `workflow/signals/waiters/{key}`) must
/// not leave the run `Running` forever or the worker spinning: the run
/// fails with an error, or waits and is woken by the same key.
#[tokio::test(start_paused = true)]
async fn a_step_waiting_on_an_oversized_signal_key_fails_or_waits() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runner = Script::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let key = "k".repeat(70_000);
    runtime
        .submit(spec("huge-key", &format!("signal:{key}")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let now = state(&runtime, "huge-key").await;
    match now {
        Some(RunState::Terminated(t)) => {
            assert_eq!(t.status, TerminalStatus::Failed);
        }
        Some(RunState::Pending) => {
            let outcome = within(30, runtime.signal(&key, b"x".to_vec())).await;
            match outcome {
                Ok(_) => {
                    ends_within(&runtime, "huge-key", 30, "woken").await;
                }
                Err(err) => panic!("the run waits on a key no signal can reach: {err}"),
            }
        }
        other => panic!(
            "run on a 70 KB key is {other:?} after 30 s ({} attempts)",
            runner.attempts.lock().unwrap().len()
        ),
    }
    // The worker still serves other runs.
    runtime.submit(spec("after-huge", "ok")).await.unwrap();
    ends_within(&runtime, "after-huge", 30, "after the huge key").await;
    worker.shutdown().await.unwrap();
}

/// A signal sent on an oversized key answers a clear error (or works);
/// it must not hang.
#[tokio::test(start_paused = true)]
async fn a_signal_on_an_oversized_key_errs_or_is_buffered() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let key = "k".repeat(70_000);
    let refused = |result: taquba_workflow::Result<_>| match result {
        Err(taquba_workflow::Error::InvalidCorrelationKey { len, max, start }) => {
            assert_eq!(
                (len, max),
                (70_000, taquba_workflow::MAX_CORRELATION_KEY_LEN)
            );
            assert_eq!(start, "k".repeat(64));
        }
        other => panic!("expected InvalidCorrelationKey, got {other:?}"),
    };
    refused(runtime.signal(&key, b"x".to_vec()).await.map(|_| ()));
    refused(runtime.clear_signal(&key).await.map(|_| ()));
    refused(
        runtime
            .signal_run(&rid("after-sig"), &key, b"x".to_vec())
            .await,
    );
    // The runtime still works, and a step continuing on such a key fails
    // its run with the error instead of waiting on a key no signal can
    // reach.
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("after-sig", "ok")).await.unwrap();
    ends_within(&runtime, "after-sig", 30, "after the huge signal").await;
    runtime
        .submit(spec("huge-wait", &format!("signal:{key}")))
        .await
        .unwrap();
    assert_eq!(
        ends_within(&runtime, "huge-wait", 30, "waiting on a huge key").await,
        TerminalStatus::Failed
    );
    let error = runtime
        .outcome(&rid("huge-wait"))
        .await
        .unwrap()
        .and_then(|o| o.error)
        .unwrap_or_default();
    assert!(error.contains("70000 bytes long"), "{error}");
    worker.shutdown().await.unwrap();
}

/// An attempt limit of 0 is refused by the inbox ("an attempt limit of 0"
/// is an `InvalidCommand`), and the owner "validates each command as the
/// in-process API validates its arguments": `submit` refuses it too, or the
/// run still ends. It must not be accepted and then never run.
#[tokio::test(start_paused = true)]
async fn an_attempt_limit_of_zero_is_refused_or_the_run_ends() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut zero = spec("zero-attempts", "ok");
    zero.options.max_attempts_per_step = Some(0);
    match runtime.submit(zero).await {
        Err(err) => eprintln!("refused: {err}"),
        Ok(_) => {
            ends_within(&runtime, "zero-attempts", 30, "zero attempts").await;
        }
    }
    worker.shutdown().await.unwrap();
}

/// The same oversized key sent through the inbox, as the CLI's
/// `runs signal KEY` would: the owner rejects the command with its error
/// and keeps applying the commands after it.
#[tokio::test(start_paused = true)]
async fn an_inbox_signal_on_an_oversized_key_is_rejected_and_the_inbox_goes_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("after-big-key", "wait")).await.unwrap();
    until_step("timer", &runtime, "after-big-key", 1).await;
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let big = match inbox
        .send(Command::signal("k".repeat(70_000), b"x".to_vec()))
        .await
    {
        Ok(id) => Some(id),
        Err(err) => {
            eprintln!("the sender refused it: {err}");
            None
        }
    };
    if let Some(big) = &big {
        let state = settled(runtime.view(), big, 130).await;
        assert!(
            !matches!(state, CommandState::Pending),
            "the oversized-key signal command is still pending"
        );
    }
    let next = inbox
        .send(Command::cancel(rid("after-big-key"), None))
        .await
        .unwrap();
    let state = settled(runtime.view(), &next, 130).await;
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the command after it: {state:?}"
    );
    worker.shutdown().await.unwrap();
}
