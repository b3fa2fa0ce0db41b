//! Second round of attacks at the public API, by a tester who read the
//! README and the docs: storage faults held on for a whole call, cancels
//! and signals racing endings, terminal hooks that misbehave, bad input at
//! the edges of the options, and shutdowns and restarts with work in
//! flight. Each finding is a test here (written before its fix); the ones
//! still open are `#[ignore]`d with their reason.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use crate::durable_paths::{queue_over_tokio_clock, spec, state, tokio_clock_queue};
use futures_util::TryStreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::{
    GroupMember, MAX_MEMBER_KEY_LEN, MAX_TERMINATION_ERROR_LEN, MemberResult, RunGroup, RunOptions,
    RunOutcome, RunState, SignalOutcome, Step, StepError, StepOutcome, StepRunner, TerminalEffects,
    TerminalHook, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, INJECTED, Op, TokioClock};

/// The runner of these attacks, driven by the run's input (step 0):
/// `"ok"` succeeds; `"perm"` fails permanently; `"verdict"` returns a
/// `Fail` verdict; `"cancel"` returns a `Cancel` verdict; `"timer:<ms>"`
/// continues after a delay, then succeeds; `"signal:<key>:<ms>"` waits for
/// a signal on `key` for `ms`, then succeeds with the signal's payload (or
/// `"timed out"`); `"sleep:<ms>"` sleeps that long in the runner, then
/// succeeds; anything else is echoed.
#[derive(Clone, Default)]
struct Script {
    /// Every runner call's `(run_id, step_number)`.
    calls: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Script {
    fn calls_of(&self, run_id: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == run_id)
            .count()
    }
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((step.run_id.to_string(), step.step_number));
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"timed out".to_vec()),
            });
        }
        if let Some(ms) = input.strip_prefix("timer:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_after(
                b"fired".to_vec(),
                Duration::from_millis(ms),
            ));
        }
        if let Some(ms) = input.strip_prefix("sleep:") {
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(StepOutcome::Succeed {
                result: b"slept".to_vec(),
            });
        }
        if let Some(rest) = input.strip_prefix("signal:") {
            let (key, ms) = rest.rsplit_once(':').unwrap_or((rest, "3600000"));
            let ms: u64 = ms.parse().map_err(|_| StepError::permanent("bad ms"))?;
            return Ok(StepOutcome::continue_on_signal(
                b"woken".to_vec(),
                key.to_string(),
                Duration::from_millis(ms),
            ));
        }
        match input.as_str() {
            "ok" => Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            }),
            "perm" => Err(StepError::permanent("permanently broken")),
            "verdict" => Ok(StepOutcome::Fail {
                reason: "refused".into(),
            }),
            "cancel" => Ok(StepOutcome::Cancel {
                reason: "the runner cancels".into(),
            }),
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }
}

/// A terminal hook counting its calls per run, optionally hanging or
/// failing as told.
#[derive(Clone, Default)]
struct Counting {
    calls: Arc<Mutex<Vec<(String, TerminalStatus)>>>,
}

impl Counting {
    fn calls_of(&self, run_id: &str) -> Vec<TerminalStatus> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == run_id)
            .map(|(_, s)| *s)
            .collect()
    }
}

impl TerminalHook for Counting {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((outcome.run_id.to_string(), outcome.status));
        Ok(())
    }
}

/// A store with its faults off (`faulty` turns them on), and the store as
/// the runtime takes it.
fn switchable_store() -> (FaultyStore, Arc<dyn ObjectStore>) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
    faulty.set_enabled(false);
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    (faulty, store)
}

/// A queue over `store` on a Tokio clock, with `lease` and retry backoff
/// `backoff` (see `durable_paths::queue_over_tokio_clock`).
async fn queue_with(store: Arc<dyn ObjectStore>, lease: Duration, backoff: Duration) -> Arc<Queue> {
    queue_over_tokio_clock(store, OpenOptions::default(), lease, backoff).await
}

/// The end of run `id` within `secs` s of (paused) time; panics naming
/// `what` and the state it is stuck in otherwise.
async fn ends_within<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    secs: u64,
    what: &str,
) -> taquba_workflow::RunEnd {
    match runtime
        .wait_timeout(&rid(id), Duration::from_secs(secs))
        .await
        .unwrap()
    {
        Some(end) => end,
        None => panic!(
            "{what}: run {id} did not end within {secs}s ({:?})",
            state(runtime, id).await
        ),
    }
}

/// Every member result of `group`, within a minute of (paused) time.
async fn join_all(group: &RunGroup) -> Vec<MemberResult> {
    within(60, async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await
    .unwrap()
}

// ---------------------------------------------------------------------------
// 1. Options at their edges.

/// `hook_timeout(Duration::MAX)`, the obvious spelling of "no timeout":
/// the builder's doc says "Before each call the notification's lease is
/// extended to cover the timeout, so a longer timeout than the lease is
/// safe". The hook must be called, once, and the run's notification
/// acknowledged; nothing may panic.
#[tokio::test(start_paused = true)]
async fn a_hook_timeout_of_duration_max_still_calls_the_hook() {
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
    .hook_timeout(Duration::MAX)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("forever", "ok")).await.unwrap();
    let end = ends_within(&runtime, "forever", 30, "hook_timeout(MAX)").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        !hook.calls_of("forever").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(hook.calls_of("forever"), vec![TerminalStatus::Succeeded]);
    let stats = queue.view().stats(STEPS).await.unwrap();
    assert_eq!(
        (stats.pending, stats.claimed, stats.scheduled, stats.dead),
        (0, 0, 0, 0),
        "{stats:?}"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. Storage faults held on for a whole call.

/// A wait on a run that ended, while every read of the memo prefix (where
/// the run's result record lives) fails: `wait` must answer (an error
/// naming the fault, or the end), never hang; once reads work again it
/// reports the committed result.
#[tokio::test(start_paused = true)]
async fn a_wait_on_an_ended_run_while_memo_reads_fail_answers() {
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
    let script = Script::default();
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

/// `RunGroup::forget` while every delete fails: its doc says "Storage
/// errors; what was removed before the error stays removed, and a later
/// `forget` removes the rest". The call must return the error (not hang);
/// a later `forget` must complete and a new submission under the id must
/// start afresh.
#[tokio::test(start_paused = true)]
async fn a_group_forget_while_deletes_fail_errs_and_a_later_forget_completes() {
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
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
// 3. Races.

/// Two signals sent at once on the key one run waits on: one is
/// delivered, the other buffered ("With no waiter the signal is held
/// durably"); the run ends with one payload and the other is what the
/// next wait on the key gets. Neither may be lost, neither delivered
/// twice.
#[tokio::test(start_paused = true)]
async fn two_signals_at_once_on_one_key_deliver_one_and_buffer_the_other() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for round in 0..20 {
        let key = format!("twice-{round}");
        let first = format!("first-{round}");
        runtime
            .submit(spec(&first, &format!("signal:{key}:3600000")))
            .await
            .unwrap();
        until_step("the wait", &runtime, &first, 1).await;
        let (a, b) = {
            let (r1, r2) = (runtime.clone(), runtime.clone());
            let (k1, k2) = (key.clone(), key.clone());
            let a = tokio::spawn(async move { r1.signal(&k1, b"A".to_vec()).await });
            for _ in 0..round % 4 {
                tokio::task::yield_now().await;
            }
            let b = tokio::spawn(async move { r2.signal(&k2, b"B".to_vec()).await });
            (a.await.unwrap().unwrap(), b.await.unwrap().unwrap())
        };
        let mut outcomes = vec![a, b];
        outcomes.sort_by_key(|o| matches!(o, SignalOutcome::Buffered));
        assert_eq!(
            outcomes,
            vec![SignalOutcome::Delivered, SignalOutcome::Buffered],
            "round {round}"
        );
        let got = ends_within(&runtime, &first, 30, "the woken run")
            .await
            .outcome
            .and_then(|o| o.result)
            .unwrap();
        let expected_other: &[u8] = if got == b"A" { b"B" } else { b"A" };
        let expected_delivered: &[u8] = if a == SignalOutcome::Delivered {
            b"A"
        } else {
            b"B"
        };
        assert_eq!(got, expected_delivered, "round {round}");
        let second = format!("second-{round}");
        runtime
            .submit(spec(&second, &format!("signal:{key}:3600000")))
            .await
            .unwrap();
        let got = ends_within(&runtime, &second, 30, "the buffered one")
            .await
            .outcome
            .and_then(|o| o.result)
            .unwrap();
        assert_eq!(got, expected_other, "round {round}");
    }
    worker.shutdown().await.unwrap();
}

/// A signal sent while the run that will wait on its key is being
/// submitted and runs its first step: delivered or buffered, the run must
/// end with the payload, never time out without it.
#[tokio::test(start_paused = true)]
async fn a_signal_racing_the_start_of_its_waiter_is_never_lost() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default())
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for k in 0..40usize {
        let id = format!("early-{k}");
        let key = format!("early-key-{k}");
        let submitted = {
            let runtime = runtime.clone();
            let input = format!("signal:{key}:60000");
            let id = id.clone();
            tokio::spawn(async move { runtime.submit(spec(&id, &input)).await })
        };
        for _ in 0..k {
            tokio::task::yield_now().await;
        }
        if k % 5 == 0 {
            tokio::time::sleep(Duration::from_millis(k as u64 / 5)).await;
        }
        runtime.signal(&key, b"payload".to_vec()).await.unwrap();
        submitted.await.unwrap().unwrap();
        let end = ends_within(&runtime, &id, 120, "racing signal").await;
        assert_eq!(
            end.outcome.and_then(|o| o.result).as_deref(),
            Some(&b"payload"[..]),
            "{id}: the signal was lost"
        );
    }
    worker.shutdown().await.unwrap();
}

/// A cancel racing the signal wait's timeout, a `Cancel` verdict and a
/// runner that sleeps: one terminal status, `wait`, `status` and
/// `outcome` agree, the hook fires once with that status, `cancel`
/// answered `true` only for a run that ended `Cancelled`, and a later
/// cancel answers `false`.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_timeout_a_cancel_verdict_or_a_sleeping_step_ends_once() {
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
    for ending in ["timeout", "cancel", "sleep"] {
        for k in 0..24usize {
            let id = format!("r2-{ending}-{k}");
            let input = match ending {
                "timeout" => format!("signal:never-{id}:5"),
                "sleep" => "sleep:3".to_string(),
                other => other.to_string(),
            };
            runtime.submit(spec(&id, &input)).await.unwrap();
            for _ in 0..k {
                tokio::task::yield_now().await;
            }
            if k % 3 == 0 {
                tokio::time::sleep(Duration::from_millis(k as u64 / 3)).await;
            }
            let cancelled = within(60, runtime.cancel(&rid(&id))).await.unwrap();
            let end = ends_within(&runtime, &id, 60, "raced").await;
            let status = end.termination.status;
            if cancelled {
                assert_eq!(status, TerminalStatus::Cancelled, "{id}: cancel said true");
            }
            match state(&runtime, &id).await {
                Some(RunState::Terminated(t)) => assert_eq!(t.status, status, "{id}"),
                other => panic!("{id}: status {other:?} after wait returned {status:?}"),
            }
            let outcome = runtime.outcome(&rid(&id)).await.unwrap();
            if let Some(outcome) = outcome {
                assert_eq!(outcome.status, status, "{id}: outcome");
            }
            assert!(
                !runtime.cancel(&rid(&id)).await.unwrap(),
                "{id}: a later cancel"
            );
            expected.push((id, status));
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for (id, status) in &expected {
        assert_eq!(&hook.calls_of(id), &vec![*status], "{id}: hook calls");
    }
    worker.shutdown().await.unwrap();
}

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
        Script::default(),
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

// ---------------------------------------------------------------------------
// 4. Hooks, shutdown and restart.

/// A hook that never returns (default hook timeout), a runner call in
/// flight and a timer pending when `shutdown` is called: the README says
/// "`shutdown` lets the steps in flight finish". It must return within
/// the hook timeout plus a margin; a new runtime over the queue then ends
/// every run, and the hung notification is retried there.
#[tokio::test(start_paused = true)]
async fn a_shutdown_with_a_hung_hook_a_step_and_a_timer_in_flight_returns_and_a_restart_finishes() {
    #[derive(Clone, Default)]
    struct Hangs {
        calls: Arc<AtomicUsize>,
        hang: Arc<std::sync::atomic::AtomicBool>,
    }
    impl TerminalHook for Hangs {
        async fn on_termination(
            &self,
            _outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> Result<(), StepError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Ok(())
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::from_secs(30), Duration::ZERO).await;
    let hook = Hangs::default();
    hook.hang.store(true, Ordering::SeqCst);
    let script = Script::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("hooked", "ok")).await.unwrap();
    ends_within(&runtime, "hooked", 30, "hooked").await;
    eventually("the hung hook call", || async {
        hook.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    runtime.submit(spec("timed", "timer:60000")).await.unwrap();
    runtime
        .submit(spec("sleeping", "sleep:10000"))
        .await
        .unwrap();
    eventually("the sleeping step to run", || async {
        script.calls_of("sleeping") == 1
    })
    .await;
    until_step("the timer", &runtime, "timed", 1).await;
    match tokio::time::timeout(Duration::from_secs(60), worker.shutdown()).await {
        Err(_) => panic!("shutdown hangs on a hung hook"),
        Ok(result) => result.unwrap(),
    }
    // The sleeping step finished and committed during the drain.
    assert_eq!(
        ends_within(&runtime, "sleeping", 1, "drained")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    drop(runtime);
    hook.hang.store(false, Ordering::SeqCst);
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        ends_within(&runtime, "timed", 120, "after the restart")
            .await
            .termination
            .status,
        TerminalStatus::Succeeded
    );
    // hooked: hung once, then retried; sleeping and timed: once each.
    eventually("every notification", || async {
        hook.calls.load(Ordering::SeqCst) >= 4
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(hook.calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        script.calls_of("sleeping"),
        1,
        "a drained step is not run again"
    );
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 5. Whole-store outages.

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
        Script::default(),
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
    let script = Script::default();
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
// 6. Builder options at their edges.

/// `max_concurrent_steps(usize::MAX)`, a plausible spelling of "no
/// bound": the doc says "The most runner (and terminal hook) calls in
/// flight at once (default 8; at least 1)". The worker must run the run,
/// not panic.
#[tokio::test(start_paused = true)]
async fn an_unbounded_max_concurrent_steps_runs_steps() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default())
        .max_concurrent_steps(usize::MAX)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("many", "ok")).await.unwrap();
    let end = ends_within(&runtime, "many", 30, "usize::MAX slots").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

/// A runtime whose queue name the queue refuses (over taquba's 255
/// bytes): `submit` must refuse with an error naming the problem, and the
/// worker loop must end with that error rather than retry forever a claim
/// that can never work.
#[tokio::test(start_paused = true)]
async fn an_invalid_queue_name_is_refused_naming_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default())
        .queue_name("q".repeat(256))
        .build();
    let err = runtime.submit(spec("bad-queue", "ok")).await.unwrap_err();
    assert!(err.to_string().contains("255 bytes"), "unclear: {err}");
    let worker = runtime.spawn(std::future::pending::<()>());
    let ended = tokio::time::timeout(Duration::from_secs(30), worker.wait()).await;
    match ended {
        Ok(Err(err)) => assert!(err.to_string().contains("255 bytes"), "{err}"),
        Ok(Ok(())) => panic!("the worker ended without an error"),
        Err(_) => panic!("the worker loop keeps retrying a queue name that can never work"),
    }
}

/// `poll_interval(Duration::ZERO)`: the doc says it is "How long an idle
/// worker waits before re-checking the queue". An idle worker must still
/// wait (for new work, or a short floor) instead of re-claiming in a loop
/// that keeps a core busy. Under paused time such a loop also keeps the
/// clock from ever moving, so the run's first commit (which waits for a
/// WAL flush on a 1 ms timer) never returns: the test runs the paused
/// runtime on a thread of its own and gives up on it after a minute of
/// real time (it takes milliseconds when nothing spins).
#[test]
fn a_zero_poll_interval_does_not_spin_the_idle_worker() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let status = rt.block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
            let runtime = workflow_builder(&queue, &store, &Script::default())
                .poll_interval(Duration::ZERO)
                .build();
            let worker = runtime.spawn(std::future::pending::<()>());
            tokio::time::sleep(Duration::from_secs(1)).await;
            runtime.submit(spec("zero", "timer:500")).await.unwrap();
            let end = ends_within(&runtime, "zero", 30, "poll interval 0").await;
            worker.shutdown().await.unwrap();
            end.termination.status
        });
        let _ = done.send(status);
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(status) => assert_eq!(status, TerminalStatus::Succeeded),
        Err(_) => panic!(
            "a worker with poll_interval(0) spins: a minute of real time and the paused clock never moved"
        ),
    }
}

// ---------------------------------------------------------------------------
// 7. Runner outcomes at their edges.

/// Runners returning the longest durations (`continue_after(MAX)`,
/// `continue_on_signal(.., MAX)`) and the empty correlation key: nothing
/// panics; the runs are readable (`status`, `view().run`, `view().runs`,
/// `view().steps`) while they wait; the signal wait is woken by a signal
/// on the empty key; the timer run is cancelled.
#[tokio::test(start_paused = true)]
async fn the_longest_delays_and_the_empty_key_are_waited_on_read_and_ended() {
    #[derive(Clone)]
    struct Extremes;
    impl StepRunner for Extremes {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            if step.step_number > 0 {
                return Ok(StepOutcome::Succeed {
                    result: step.signal.clone().unwrap_or_default(),
                });
            }
            Ok(match step.payload.as_slice() {
                b"timer" => StepOutcome::continue_after(b"later".to_vec(), Duration::MAX),
                _ => StepOutcome::continue_on_signal(b"woken".to_vec(), "", Duration::MAX),
            })
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Extremes).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("far-timer", "timer")).await.unwrap();
    runtime.submit(spec("empty-key", "signal")).await.unwrap();
    until_step("the timer", &runtime, "far-timer", 1).await;
    until_step("the wait", &runtime, "empty-key", 1).await;
    for id in ["far-timer", "empty-key"] {
        let details = runtime.view().run(&rid(id)).await.unwrap().unwrap();
        assert!(details.scheduled_at_ms.is_some(), "{id}: {details:?}");
        runtime.view().steps(&rid(id)).await.unwrap();
    }
    let page = runtime
        .view()
        .runs(&taquba_workflow::RunFilter::new())
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 2);
    assert_eq!(
        runtime.signal("", b"hi".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = ends_within(&runtime, "empty-key", 30, "the empty key").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"hi"[..])
    );
    assert!(runtime.cancel(&rid("far-timer")).await.unwrap());
    let end = ends_within(&runtime, "far-timer", 30, "the far timer").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
}

/// Memo keys a step might build from user input, on a local directory:
/// `.`, `..`, `a/b`, `a%2Fb`, a 300-byte key, unicode, a trailing `#1`, a
/// control character. Each `put` succeeds or fails with an error naming
/// the key's trouble (never a panic); each key that was put reads back its
/// own value, and no two keys share an entry.
#[tokio::test]
async fn odd_memo_keys_round_trip_or_are_refused_and_never_alias() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let memos = taquba_workflow::MemoStore::new(store, "memo");
    let memo = memos.new_memo(&rid("odd"), 0);
    let long = "k".repeat(300);
    let keys = [
        ".",
        "..",
        "a/b",
        "a%2Fb",
        "a",
        long.as_str(),
        "ключ-🔑",
        "part#1",
        "tab\tkey",
        " ",
        "run.x",
    ];
    let mut stored = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("value-{i}");
        match memo.put(key, value.as_bytes()).await {
            Ok(()) => stored.push((*key, value)),
            Err(err) => eprintln!("memo key {key:?} refused: {err}"),
        }
    }
    for (key, value) in &stored {
        assert_eq!(
            memo.get(key).await.unwrap().as_deref(),
            Some(value.as_bytes()),
            "key {key:?} reads another key's value"
        );
    }
    assert!(
        stored.len() >= keys.len() - 2,
        "most keys are stored: {stored:?}"
    );
    // A step memo and the run memo of the same run never share a key.
    let run_memo = memos.new_run_memo(&rid("odd"));
    run_memo.put("x", b"run").await.unwrap();
    memo.put("run.x", b"step").await.unwrap();
    assert_eq!(
        run_memo.get("x").await.unwrap().as_deref(),
        Some(&b"run"[..])
    );
}

// ---------------------------------------------------------------------------
// 8. Submissions at their edges.

/// Headers at their edges: an empty name, a 1 MiB value, 5 000 headers.
/// Each submission is refused with an error naming the problem, or it runs
/// to its end with its headers reported to the hook; never a panic, never
/// a run that is accepted and then stuck.
#[tokio::test(start_paused = true)]
async fn headers_at_their_edges_are_refused_or_carried_to_the_end() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Recorder::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Script::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let cases: Vec<(&str, std::collections::HashMap<String, String>)> = vec![
        ("empty-name", [(String::new(), "v".to_string())].into()),
        (
            "huge-value",
            [("big".to_string(), "v".repeat(1 << 20))].into(),
        ),
        (
            "many",
            (0..5_000)
                .map(|i| (format!("h{i}"), format!("{i}")))
                .collect(),
        ),
    ];
    for (id, headers) in cases {
        let mut submission = spec(id, "timer:10");
        submission.options.headers = headers.clone();
        match runtime.submit(submission).await {
            Err(err) => eprintln!("{id}: refused: {err}"),
            Ok(_) => {
                let end = ends_within(&runtime, id, 60, "accepted headers").await;
                assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
                eventually("the hook call", || async {
                    hook.calls().iter().any(|o| o.run_id.as_str() == id)
                })
                .await;
                let seen = hook
                    .calls()
                    .into_iter()
                    .find(|o| o.run_id.as_str() == id)
                    .unwrap();
                assert_eq!(seen.headers, headers, "{id}: headers reported");
            }
        }
    }
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

/// Signals racing the timeout of the wait they are meant for, sent at
/// moments around it. `signal`'s answer must say what happened: a run
/// whose signal was answered `Delivered` ends with its payload, and one
/// answered `Buffered` timed out (its payload then waits for the next
/// waiter). `signal_run` answered `Ok` must have reached the run, and a
/// refusal (`NotWaitingForSignal`) means the run timed out.
#[tokio::test(start_paused = true)]
async fn signals_racing_the_timeout_of_their_wait_answer_what_happened() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default())
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for targeted in [false, true] {
        let mut seen = (0, 0);
        for k in 0..30u64 {
            let id = format!("late-{targeted}-{k}");
            let key = format!("late-key-{targeted}-{k}");
            runtime
                .submit(spec(&id, &format!("signal:{key}:20")))
                .await
                .unwrap();
            until_step("the wait", &runtime, &id, 1).await;
            // Around the moment the 20 ms timeout is acted on (the queue's
            // scheduler promotes due jobs at its own interval).
            tokio::time::sleep(Duration::from_millis(37 * k)).await;
            let delivered = if targeted {
                match runtime.signal_run(&rid(&id), &key, b"sig".to_vec()).await {
                    Ok(()) => true,
                    Err(taquba_workflow::Error::NotWaitingForSignal { .. }) => false,
                    Err(err) => panic!("{id}: {err}"),
                }
            } else {
                runtime.signal(&key, b"sig".to_vec()).await.unwrap() == SignalOutcome::Delivered
            };
            let result = ends_within(&runtime, &id, 30, "raced timeout")
                .await
                .outcome
                .and_then(|o| o.result)
                .unwrap();
            if delivered {
                seen.0 += 1;
                assert_eq!(
                    result, b"sig",
                    "{id}: answered delivered, the run timed out"
                );
            } else {
                seen.1 += 1;
                assert_eq!(
                    result, b"timed out",
                    "{id}: answered not delivered, the run got it"
                );
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "both sides of the race: {seen:?}");
    }
    worker.shutdown().await.unwrap();
}

/// Runners failing with huge messages (1 MiB): a `Fail` verdict's reason,
/// a permanent error, a transient error on every attempt. README: "a
/// permanent error dead-letters the step and fails the run"; the error is
/// what the caller reads. Each run must end `Failed` promptly (no lease
/// expiry in between), its error starting with the runner's message, the
/// runner called once for the verdict and the permanent error, and once
/// per attempt for the transient one. The terminal record's error is cut
/// to `MAX_TERMINATION_ERROR_LEN`, the outcome's is whole.
#[tokio::test(start_paused = true)]
async fn failures_with_huge_messages_end_their_runs_with_the_message() {
    #[derive(Clone, Default)]
    struct Loud {
        calls: Arc<Mutex<Vec<String>>>,
    }
    impl StepRunner for Loud {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            self.calls.lock().unwrap().push(step.run_id.to_string());
            let message = format!("{}:{}", step.run_id, "x".repeat(1 << 20));
            match step.payload.as_slice() {
                b"verdict" => Ok(StepOutcome::Fail { reason: message }),
                b"perm" => Err(StepError::permanent(message)),
                _ => Err(StepError::transient(message)),
            }
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::from_secs(30), Duration::ZERO).await;
    let loud = Loud::default();
    let hook = Recorder::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), loud.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, calls) in [("loud-verdict", 1), ("loud-perm", 1), ("loud-trans", 3)] {
        let input = id.strip_prefix("loud-").unwrap();
        runtime.submit(spec(id, input)).await.unwrap();
        // Well inside one 30 s lease.
        let end = ends_within(&runtime, id, 10, "a huge failure").await;
        assert_eq!(end.termination.status, TerminalStatus::Failed, "{id}");
        let error = end.termination.error.clone().unwrap_or_default();
        assert!(
            error.starts_with(&format!("{id}:xxx")),
            "{id}: error {:.80}",
            error
        );
        assert!(
            error.len() <= MAX_TERMINATION_ERROR_LEN,
            "{id}: {}",
            error.len()
        );
        let whole = end.outcome.and_then(|o| o.error).unwrap_or_default();
        assert_eq!(
            whole.len(),
            id.len() + 1 + (1 << 20),
            "{id}: the outcome's error"
        );
        let made = loud
            .calls
            .lock()
            .unwrap()
            .iter()
            .filter(|r| *r == id)
            .count();
        assert_eq!(made, calls, "{id}: runner calls");
        eventually("the hook call", || async {
            hook.calls().iter().any(|o| o.run_id.as_str() == id)
        })
        .await;
    }
    worker.shutdown().await.unwrap();
}

/// Group member keys of `MAX_MEMBER_KEY_LEN` bytes, 200 KiB and 300 KiB
/// ("The member's key (any text)"), one member of each group succeeding,
/// one failing with a 1 MiB error. A key the runtime cannot carry to the member's end must
/// be refused at submission naming its length; an accepted member must
/// end, and `results` report it. (With 200 KiB keys the submission was
/// accepted, and the failing member's termination, carrying the key twice
/// beside the error, was over the queue's 256 KiB KV value limit: it never
/// committed and `results` failed with `KvValueTooLarge`.)
#[tokio::test(start_paused = true)]
async fn huge_member_keys_are_refused_or_their_members_end() {
    #[derive(Clone)]
    struct Members;
    impl StepRunner for Members {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            match step.payload.as_slice() {
                b"fail" => Err(StepError::permanent("e".repeat(1 << 20))),
                _ => Ok(StepOutcome::Succeed {
                    result: b"ok".to_vec(),
                }),
            }
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Members).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (g, len) in [MAX_MEMBER_KEY_LEN, 200 << 10, 300 << 10]
        .into_iter()
        .enumerate()
    {
        let group = runtime.group(rid(&format!("huge-keys-{g}")));
        let key = |name: &str| format!("{name}{}", "k".repeat(len - name.len()));
        let members = vec![
            GroupMember {
                key: key("ok-"),
                input: b"ok".to_vec(),
            },
            GroupMember {
                key: key("fail-"),
                input: b"fail".to_vec(),
            },
        ];
        match within(60, group.submit(members, &RunOptions::default())).await {
            Err(err) => {
                assert!(len > MAX_MEMBER_KEY_LEN, "{len} bytes refused: {err}");
                assert!(
                    matches!(err, taquba_workflow::Error::MemberKeyTooLong { len: l, .. } if l == len),
                    "{len} bytes: {:.200}",
                    err.to_string()
                );
            }
            Ok(()) => {
                let results = join_all(&group).await;
                let mut statuses: Vec<_> = results.iter().map(|r| r.termination.status).collect();
                statuses.sort_by_key(|s| s.as_str());
                assert_eq!(
                    statuses,
                    vec![TerminalStatus::Failed, TerminalStatus::Succeeded],
                    "{len}-byte keys"
                );
            }
        }
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 9. Typed jobs across a change of their type.

mod drift {
    use serde::{Deserialize, Serialize};
    use taquba_workflow::jobs::{Job, JobContext};

    /// The job as the old deploy submitted it.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SendV1 {
        pub to: String,
    }

    impl Job for SendV1 {
        const NAME: &'static str = "drift.send";
        type Output = String;
        type Error = String;
        fn idempotency_key(&self) -> Option<String> {
            Some(format!("send:{}", self.to))
        }
        async fn run(&self, _ctx: JobContext<'_>) -> Result<String, String> {
            Ok(format!("sent to {}", self.to))
        }
    }

    /// The same job after a deploy added a required field and changed the
    /// output's type.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    pub struct SendV2 {
        pub to: String,
        pub template: String,
    }

    impl Job for SendV2 {
        const NAME: &'static str = "drift.send";
        type Output = u64;
        type Error = String;
        async fn run(&self, _ctx: JobContext<'_>) -> Result<u64, String> {
            Ok(self.template.len() as u64)
        }
    }
}

/// A job submitted by one deploy and run by the next, whose job type gained
/// a required field: the job must fail permanently (one attempt, not
/// three) with an error naming the job, the missing field, the run and the
/// job's key.
#[tokio::test(start_paused = true)]
async fn a_job_whose_type_changed_between_deploys_fails_once_naming_the_field() {
    use taquba_workflow::jobs::JobRunner;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let old = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::SendV1>()
        .poll_interval(Duration::from_millis(20))
        .build();
    // Ran under the old deploy.
    let worker = old.spawn(std::future::pending::<()>());
    let done = old
        .submit(drift::SendV1 { to: "a@b".into() })
        .await
        .unwrap();
    assert_eq!(
        within(30, done.join()).await.unwrap().unwrap(),
        "sent to a@b"
    );
    worker.shutdown().await.unwrap();
    // Submitted by the old deploy, not yet run.
    let waiting = old
        .submit(drift::SendV1 { to: "c@d".into() })
        .await
        .unwrap();
    let new = JobRunner::builder(queue.clone(), store.clone())
        .register::<drift::SendV2>()
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = new.spawn(std::future::pending::<()>());
    let waiting_end = within(60, async {
        loop {
            if let Some(status) = new.view().status(waiting.id()).await.unwrap()
                && let RunState::Terminated(t) = status.state
            {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(waiting_end.status, TerminalStatus::Failed);
    let error = waiting_end.error.unwrap_or_default();
    assert!(
        error.contains("drift.send") && error.contains("template"),
        "unclear: {error}"
    );
    // An operator finds the run from the error alone: it names the run id
    // and the job's key (issue 22).
    assert!(
        error.contains(&format!("run `{}`", waiting.id())) && error.contains("\"send:c@d\""),
        "the error names neither the run nor the key: {error}"
    );
    let history = new.view().steps(waiting.id()).await.unwrap().unwrap();
    let attempts: usize = history.steps.iter().map(|s| s.attempts.len()).sum();
    assert_eq!(
        attempts, 1,
        "a payload that cannot decode is retried: {history:?}"
    );
    worker.shutdown().await.unwrap();
}

/// `wait_timeout(id, Duration::ZERO)` on a run that ended, on a local
/// directory (whose reads complete on a blocking thread): its doc says
/// "`Ok(None)` when the run has not terminated by then", so a run that
/// terminated before the call must be reported, whatever the timeout.
#[tokio::test]
async fn a_zero_wait_timeout_reports_a_run_that_already_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default().flush_interval(Duration::from_millis(1)),
        )
        .await
        .unwrap(),
    );
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("ended-zero", "ok")).await.unwrap();
    runtime.wait(&rid("ended-zero")).await.unwrap();
    for _ in 0..20 {
        let end = runtime
            .wait_timeout(&rid("ended-zero"), Duration::ZERO)
            .await
            .unwrap();
        assert!(
            end.is_some(),
            "a zero timeout reported an ended run as running"
        );
    }
    worker.shutdown().await.unwrap();
}

/// A `wait` pending on a clone of a runtime whose worker is shut down and
/// whose other handles are dropped, while the run waits on a timer: a new
/// runtime over the same queue (a restart of the worker in-process) ends
/// the run, and the pending wait reports that end ("every runtime over
/// the same `Arc<Queue>` there wakes it").
#[tokio::test(start_paused = true)]
async fn a_wait_pending_across_a_worker_restart_in_process_gets_the_end() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("restarted", "timer:5000"))
        .await
        .unwrap();
    until_step("the timer", &runtime, "restarted", 1).await;
    let waiting = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.wait(&rid("restarted")).await })
    };
    tokio::task::yield_now().await;
    worker.shutdown().await.unwrap();
    drop(runtime);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!waiting.is_finished(), "the wait ended without a worker");
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(60, waiting).await.unwrap().unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

/// The largest terminal record a run can have: a group member with a key
/// of `MAX_MEMBER_KEY_LEN` bytes whose last eight steps each took sixteen
/// attempts failing with 2 KiB errors (the history entries riding on the
/// terminal record), ending with a 1 MiB error. It must commit: the run
/// ends `Failed` with its error, its runner not called again.
#[tokio::test(start_paused = true)]
async fn the_largest_terminal_record_still_commits() {
    #[derive(Clone, Default)]
    struct Retries {
        calls: Arc<AtomicUsize>,
    }
    impl StepRunner for Retries {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if step.step_number == 9 {
                return Err(StepError::permanent("z".repeat(1 << 20)));
            }
            if step.attempts < step.max_attempts {
                return Err(StepError::transient("r".repeat(2048)));
            }
            Ok(StepOutcome::continue_now(b"next".to_vec()))
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = OpenOptions::default()
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .lease_duration(Duration::from_secs(30))
                .max_attempts(16),
        );
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options)
            .await
            .unwrap(),
    );
    let retries = Retries::default();
    let runtime = workflow_builder(&queue, &store, &retries).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("largest"));
    let key = "k".repeat(MAX_MEMBER_KEY_LEN);
    group
        .submit(
            vec![GroupMember {
                key,
                input: b"go".to_vec(),
            }],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let results = join_all(&group).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].termination.status, TerminalStatus::Failed);
    assert!(
        results[0]
            .termination
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("zzz")),
        "{:.100?}",
        results[0].termination.error
    );
    assert_eq!(
        retries.calls.load(Ordering::SeqCst),
        9 * 16 + 1,
        "runner calls"
    );
    worker.shutdown().await.unwrap();
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
    let script = Script::default();
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

/// Two submissions of one run id with different inputs at once, after the
/// id's earlier run ended (so each may start a new run: "A run id whose
/// run terminated starts a new run (with any input)"): exactly one starts
/// a run, the other is refused with `InputMismatch` or answers for that
/// same run; the id has one run, which ends once, and its hook fires once.
#[tokio::test(start_paused = true)]
async fn racing_resubmissions_with_different_inputs_start_one_run() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Counting::default();
    let script = Script::default();
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), script.clone(), hook.clone())
            .poll_interval(Duration::from_millis(20))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for k in 0..20usize {
        let id = format!("again-{k}");
        runtime.submit(spec(&id, "ok")).await.unwrap();
        ends_within(&runtime, &id, 30, "the first run").await;
        let (a, b) = {
            let (r1, r2) = (runtime.clone(), runtime.clone());
            let (i1, i2) = (id.clone(), id.clone());
            let a = tokio::spawn(async move { r1.submit(spec(&i1, "timer:50")).await });
            for _ in 0..k % 5 {
                tokio::task::yield_now().await;
            }
            let b = tokio::spawn(async move { r2.submit(spec(&i2, "sleep:50")).await });
            (a.await.unwrap(), b.await.unwrap())
        };
        let started = [&a, &b]
            .iter()
            .filter(|r| matches!(r, Ok(o) if o.newly_submitted))
            .count();
        assert_eq!(started, 1, "{id}: {a:?} {b:?}");
        for answer in [&a, &b] {
            if let Err(err) = answer {
                assert!(
                    matches!(err, taquba_workflow::Error::InputMismatch(_)),
                    "{id}: {err}"
                );
            }
        }
        let end = ends_within(&runtime, &id, 30, "the second run").await;
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        // The first run's step 0 and the second run's steps.
        assert!(
            script.calls_of(&id) <= 3,
            "{id}: {} runner calls",
            script.calls_of(&id)
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for k in 0..20usize {
        let id = format!("again-{k}");
        assert_eq!(hook.calls_of(&id).len(), 2, "{id}: one hook call per run");
    }
    worker.shutdown().await.unwrap();
}

/// A queue whose lease is zero (`QueueConfig::lease_duration(ZERO)`): a
/// nonsensical setting, but one taquba accepts. The runtime must not
/// panic, and a run whose steps are quick must still end; a hook that
/// awaits must still be called (the default hook timeout is derived from
/// the lease).
#[tokio::test(start_paused = true)]
async fn a_zero_lease_does_not_panic_and_quick_runs_end() {
    #[derive(Clone, Default)]
    struct Awaits {
        calls: Arc<AtomicUsize>,
    }
    impl TerminalHook for Awaits {
        async fn on_termination(
            &self,
            _outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> Result<(), StepError> {
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::ZERO, Duration::ZERO).await;
    let hook = Awaits::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Script::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("no-lease", "timer:10")).await.unwrap();
    let end = ends_within(&runtime, "no-lease", 60, "a zero lease").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        hook.calls.load(Ordering::SeqCst) > 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A queue whose lease is `Duration::MAX` (a plausible "never reap"): the
/// runtime must run steps and call the hook, not panic.
#[tokio::test(start_paused = true)]
async fn a_lease_of_duration_max_runs_steps_and_hooks() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::MAX, Duration::ZERO).await;
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
    runtime
        .submit(spec("forever-lease", "timer:10"))
        .await
        .unwrap();
    let end = ends_within(&runtime, "forever-lease", 60, "a MAX lease").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        !hook.calls_of("forever-lease").is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A consumer streaming a group's `results` while the group is forgotten
/// (its members still waiting on hour-long timers): the stream must end
/// (with the members' cancellations, or an error), not wait forever for
/// members whose state is gone.
#[tokio::test(start_paused = true)]
async fn a_results_stream_of_a_group_being_forgotten_ends() {
    use futures_util::StreamExt;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("forgotten-stream"));
    let members: Vec<GroupMember> = (0..3)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"timer:3600000".to_vec(),
        })
        .collect();
    group.submit(members, &RunOptions::default()).await.unwrap();
    let consumer = {
        let group = group.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(group.results().await?);
            let mut seen = Vec::new();
            while let Some(item) = stream.next().await {
                seen.push(item.map(|r| r.termination.status));
            }
            Ok::<_, taquba_workflow::Error>(seen)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    within(60, group.forget()).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(60), consumer).await {
        Err(_) => panic!("the results stream of a forgotten group never ends"),
        Ok(joined) => {
            let seen = joined.unwrap().unwrap();
            assert!(
                seen.iter()
                    .all(|item| matches!(item, Ok(TerminalStatus::Cancelled) | Err(_))),
                "{seen:?}"
            );
        }
    }
    worker.shutdown().await.unwrap();
}

/// A cancel arriving while a succeeded step's run result record is being
/// written again through a memo-store blip (F2's in-lease retry): the
/// runner returned before the request, so the run ends `Succeeded` with
/// its result, the cancel answers `false`, and the hook fires once.
#[tokio::test(start_paused = true)]
async fn a_cancel_during_the_result_record_retry_finds_the_run_succeeded() {
    let (faulty, store) = switchable_store();
    let queue = queue_with(store.clone(), Duration::from_secs(5), Duration::ZERO).await;
    let hook = Counting::default();
    let script = Script::default();
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

/// Inbox commands while every delete of the store fails for 20 s, so the
/// owner cannot remove a command's object once it applied it and sees it
/// again at every round. README: "records its answer in the same
/// transaction as its first effect, then deletes the object: a command is
/// applied once". A signal command woke a waiting run; applied again, it
/// would buffer the signal for the next wait on the key. After the faults
/// the objects are gone and a later wait on the key sees no signal.
#[tokio::test(start_paused = true)]
async fn inbox_commands_whose_objects_cannot_be_deleted_are_applied_once() {
    use taquba_workflow::{Command, CommandState, Inbox};
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("inboxed", "signal:inbox-key:3600000"))
        .await
        .unwrap();
    until_step("the wait", &runtime, "inboxed", 1).await;
    faulty.set_config(FaultConfig {
        rates: [0.0, 0.0, 0.0, 1.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::signal("inbox-key", b"from-afar".to_vec()))
        .await
        .unwrap();
    let end = ends_within(&runtime, "inboxed", 60, "the inbox signal").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"from-afar"[..])
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(faulty.injected(Op::Delete) > 0, "no delete was attempted");
    faulty.set_enabled(false);
    assert!(matches!(
        runtime.view().command(&id).await.unwrap(),
        CommandState::Applied { .. }
    ));
    // A later wait on the key: no signal was buffered by a second apply.
    runtime
        .submit(spec("later", "signal:inbox-key:1000"))
        .await
        .unwrap();
    let end = ends_within(&runtime, "later", 60, "the later wait").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"timed out"[..]),
        "the signal command was applied twice"
    );
    eventually("the command's object to go", || async {
        use futures_util::StreamExt;
        let dir = taquba::object_store::path::Path::from(format!("{MEMO_PREFIX}/inbox/v1"));
        store.list(Some(&dir)).collect::<Vec<_>>().await.is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}
