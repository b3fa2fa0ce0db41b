//! Per-key concurrency (`RunOptions::concurrency_key`): a key's limit held
//! under load (1,000 runs over 10 keys), limits above one, admission in
//! submission order, waiting runs listed and cancelled, a running and a
//! timer-waiting holder cancelled, the options refused naming the value,
//! and a crash at each await of a keyed run's life never leaking or
//! double-counting a slot.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{
    Error, NoopTerminalHook, RunId, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime, WorkflowView,
};

/// What the runners saw: the runs of each key between their step 0 and
/// their last step, the most seen at once, and the order step 0s started.
#[derive(Clone, Default)]
struct Seen {
    active: Arc<Mutex<HashMap<String, HashSet<RunId>>>>,
    max: Arc<Mutex<HashMap<String, usize>>>,
    started: Arc<Mutex<Vec<(String, RunId)>>>,
}

impl Seen {
    fn enter(&self, key: &str, run: &RunId) {
        let mut active = self.active.lock().unwrap();
        let runs = active.entry(key.to_string()).or_default();
        if runs.insert(run.clone()) {
            self.started
                .lock()
                .unwrap()
                .push((key.to_string(), run.clone()));
        }
        let mut max = self.max.lock().unwrap();
        let seen = max.entry(key.to_string()).or_default();
        *seen = (*seen).max(runs.len());
    }

    fn leave(&self, key: &str, run: &RunId) {
        if let Some(runs) = self.active.lock().unwrap().get_mut(key) {
            runs.remove(run);
        }
    }

    fn max(&self, key: &str) -> usize {
        self.max.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    fn started(&self, key: &str) -> Vec<RunId> {
        self.started
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, run)| run.clone())
            .collect()
    }
}

/// Runs of two steps whose payload is their key: step 0 enters the key,
/// continues (after `delay` when given), step 1 leaves it and succeeds.
#[derive(Clone, Default)]
struct TwoSteps {
    seen: Seen,
    delay: Option<Duration>,
}

impl StepRunner for TwoSteps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let key = String::from_utf8(step.payload.clone()).unwrap();
        let run = &step.delivery.run_id;
        if step.step_number == 0 {
            self.seen.enter(&key, run);
            tokio::time::sleep(Duration::from_millis(1)).await;
            return Ok(match self.delay {
                Some(delay) => StepOutcome::continue_after(step.payload.clone(), delay),
                None => StepOutcome::continue_now(step.payload.clone()),
            });
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.seen.leave(&key, run);
        Ok(StepOutcome::Succeed { result: Vec::new() })
    }
}

fn keyed(id: &str, key: &str, limit: Option<u32>) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: key.as_bytes().to_vec(),
        options: RunOptions {
            concurrency_key: Some(key.to_string()),
            concurrency_limit: limit,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The slots and waiters of `key` as the view lists them.
async fn listed(view: &WorkflowView, key: &str) -> (Vec<RunId>, Vec<RunId>) {
    let details = view.concurrency_key(key).await.unwrap();
    (
        details.holders.into_iter().map(|h| h.run_id).collect(),
        details.waiting.into_iter().map(|w| w.run_id).collect(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_limit_of_one_per_key_holds_under_a_thousand_runs_over_ten_keys() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TwoSteps::default();
    let runtime = workflow_builder(&queue, &store, &runner)
        .max_concurrent_steps(64)
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let submissions = (0..1000).map(|i| {
        let runtime = runtime.clone();
        async move {
            runtime
                .submit(keyed(&format!("r{i:04}"), &format!("k{}", i % 10), None))
                .await
                .unwrap()
        }
    });
    futures_util::future::join_all(submissions).await;
    for i in 0..1000 {
        let end = within(600, runtime.wait(&rid(&format!("r{i:04}"))))
            .await
            .unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "r{i:04}");
    }
    for k in 0..10 {
        let key = format!("k{k}");
        assert_eq!(runner.seen.max(&key), 1, "{key}");
        assert_eq!(runner.seen.started(&key).len(), 100, "{key}");
    }
    assert!(runtime.view().concurrency_keys().await.unwrap().is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_limit_above_one_is_reached_and_never_passed() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TwoSteps::default();
    let runtime = workflow_builder(&queue, &store, &runner)
        .max_concurrent_steps(16)
        .poll_interval(Duration::from_millis(5))
        .build();
    let submissions = (0..60).map(|i| {
        let runtime = runtime.clone();
        async move {
            runtime
                .submit(keyed(&format!("t{i:02}"), "tenant", Some(3)))
                .await
                .unwrap()
        }
    });
    futures_util::future::join_all(submissions).await;
    // Three admitted at once, the rest waiting in submission order.
    let details = runtime.view().concurrency_key("tenant").await.unwrap();
    assert_eq!((details.holders.len(), details.waiting.len()), (3, 57));
    assert!(details.waiting.iter().all(|w| w.limit == 3));
    let worker = runtime.spawn(std::future::pending::<()>());
    for i in 0..60 {
        let end = within(120, runtime.wait(&rid(&format!("t{i:02}"))))
            .await
            .unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    }
    assert_eq!(runner.seen.max("tenant"), 3);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_submission_order_and_other_keys_are_not_held_up() {
    let runner = TwoSteps {
        delay: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    let ids: Vec<String> = [7, 3, 9, 1, 5, 0, 8, 2, 6, 4]
        .iter()
        .map(|n| format!("c{n}"))
        .collect();
    for id in &ids {
        env.submit(keyed(id, "customer", None)).await.unwrap();
    }
    env.submit(keyed("other", "elsewhere", None)).await.unwrap();
    let view = env.runtime().unwrap().view().clone();
    let (holders, waiting) = listed(&view, "customer").await;
    assert_eq!(holders, vec![rid("c7")]);
    assert_eq!(
        waiting,
        ids[1..].iter().map(|id| rid(id)).collect::<Vec<_>>()
    );
    let keys = view.concurrency_keys().await.unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        (keys[0].key.as_str(), keys[0].active, keys[0].waiting),
        ("customer", 1, 9)
    );
    // The holder waits on its timer, holding its slot: the other key's run
    // starts, no waiter does.
    env.run_until_idle().await.unwrap();
    assert_eq!(runner.seen.started("elsewhere"), vec![rid("other")]);
    assert_eq!(runner.seen.started("customer"), vec![rid("c7")]);
    let waiting_run = view.run(&rid("c3")).await.unwrap().unwrap();
    assert_eq!(waiting_run.state, RunState::Pending);
    let concurrency = waiting_run.concurrency.expect("keyed");
    assert!(concurrency.waiting && concurrency.key == "customer" && concurrency.limit == 1);
    let holder = view.run(&rid("c7")).await.unwrap().unwrap();
    assert!(!holder.concurrency.expect("keyed").waiting);

    env.run_to_completion().await.unwrap();
    assert_eq!(
        runner.seen.started("customer"),
        ids.iter().map(|id| rid(id)).collect::<Vec<_>>()
    );
    assert_eq!(runner.seen.max("customer"), 1);
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_waiting_or_a_holding_run_releases_its_place() {
    let runner = TwoSteps {
        delay: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    for id in ["a", "b", "c", "d"] {
        env.submit(keyed(id, "k", None)).await.unwrap();
    }
    let runtime = env.runtime().unwrap();
    let view = runtime.view().clone();
    // A waiting run is cancelled: it ends, the others keep their places.
    assert!(runtime.cancel(&rid("c")).await.unwrap());
    let end = runtime.wait(&rid("c")).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(
        listed(&view, "k").await,
        (vec![rid("a")], vec![rid("b"), rid("d")])
    );
    // The holder waits on its timer; cancelled, its slot goes to `b`.
    env.run_until_idle().await.unwrap();
    assert!(runtime.cancel(&rid("a")).await.unwrap());
    env.run_until_idle().await.unwrap();
    assert_eq!(listed(&view, "k").await, (vec![rid("b")], vec![rid("d")]));
    assert_eq!(runner.seen.started("k"), vec![rid("a"), rid("b")]);
    env.run_to_completion().await.unwrap();
    for (id, status) in [
        ("a", TerminalStatus::Cancelled),
        ("b", TerminalStatus::Succeeded),
        ("c", TerminalStatus::Cancelled),
        ("d", TerminalStatus::Succeeded),
    ] {
        let end = runtime.wait(&rid(id)).await.unwrap();
        assert_eq!(end.termination.status, status, "{id}");
    }
    assert_eq!(runner.seen.started("k"), vec![rid("a"), rid("b"), rid("d")]);
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_running_holder_admits_the_next_run() {
    let gate = Gate::default();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |step: Step| {
            let gate = gate.clone();
            async move {
                if step.delivery.run_id.as_str() == "slow" {
                    gate.wait().await;
                }
                Ok(StepOutcome::Succeed { result: Vec::new() })
            }
        })
    };
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(keyed("slow", "k", None)).await.unwrap();
    runtime.submit(keyed("next", "k", None)).await.unwrap();
    eventually("the holder to run", || async {
        runtime.status(&rid("slow")).await.unwrap().unwrap().state == RunState::Running
    })
    .await;
    assert_eq!(
        runtime.status(&rid("next")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    // The runner ignores the token; its step's end is the run's.
    let cancelling = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.cancel(&rid("slow")).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    gate.open();
    cancelling.await.unwrap().unwrap();
    within(30, runtime.wait(&rid("slow"))).await.unwrap();
    let end = within(30, runtime.wait(&rid("next"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(runtime.view().concurrency_keys().await.unwrap().is_empty());
    worker.shutdown().await.unwrap();
}

/// A freed slot goes to the key's next waiter as soon as the termination
/// that freed it commits, whether a cancellation removed the holder's
/// parked step or a settlement ended it, not at the next maintenance round
/// (an hour away here).
#[tokio::test(start_paused = true)]
async fn a_freed_slot_is_given_when_its_termination_commits_not_at_the_next_maintenance_round() {
    let runner = FnRunner(|step: Step| async move {
        Ok(match step.delivery.run_id.as_str() {
            // The first holder waits an hour on its timer.
            "first" if step.step_number == 0 => {
                StepOutcome::continue_after(Vec::new(), Duration::from_secs(3600))
            }
            _ => StepOutcome::Succeed { result: Vec::new() },
        })
    });
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_secs(3600))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for id in ["first", "second", "third"] {
        runtime.submit(keyed(id, "k", None)).await.unwrap();
    }
    within(60, async {
        eventually("the holder to wait on its timer", || async {
            let status = runtime.status(&rid("first")).await.unwrap().unwrap();
            status.state == RunState::Pending && status.current_step == 1
        })
        .await;
    })
    .await;
    // The cancellation frees the slot; `second` runs and its settlement
    // frees it for `third`.
    assert!(runtime.cancel(&rid("first")).await.unwrap());
    let end = within(60, runtime.wait(&rid("third"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let end = within(60, runtime.wait(&rid("second"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(runtime.view().concurrency_keys().await.unwrap().is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn bad_keys_and_limits_are_refused_naming_the_value() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TwoSteps::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let refused = |options: RunOptions| {
        let runtime = runtime.clone();
        async move {
            match runtime
                .submit(RunSpec {
                    options,
                    ..Default::default()
                })
                .await
            {
                Err(Error::InvalidRunOptions(message)) => message,
                other => panic!("not refused: {other:?}"),
            }
        }
    };
    let key = |k: &str| RunOptions {
        concurrency_key: Some(k.to_string()),
        ..Default::default()
    };
    assert!(refused(key("")).await.contains("empty"));
    assert!(refused(key("a/b")).await.contains("\"a/b\""));
    assert!(refused(key("a\tb")).await.contains("control"));
    assert!(refused(key(&"x".repeat(300))).await.contains("300 bytes"));
    let zero = RunOptions {
        concurrency_limit: Some(0),
        ..key("k")
    };
    assert!(refused(zero).await.contains("at least 1"));
    let no_key = RunOptions {
        concurrency_limit: Some(4),
        ..Default::default()
    };
    assert!(refused(no_key).await.contains("concurrency_limit is 4"));
    let group = runtime
        .new_group()
        .submit(vec![member("m", "k")], &key("k"))
        .await;
    assert!(
        matches!(&group, Err(Error::InvalidRunOptions(m)) if m.contains("group")),
        "{group:?}"
    );
    assert!(runtime.view().concurrency_keys().await.unwrap().is_empty());
}

/// The key's records agree with its runs: every holder is an active run of
/// the key, at most `limit` of them, and every active keyed run holds a
/// slot or waits.
async fn consistent(view: &WorkflowView, key: &str, ids: &[String], limit: usize) {
    let (holders, waiting) = listed(view, key).await;
    assert!(holders.len() <= limit, "{holders:?}");
    for id in ids {
        let run = rid(id);
        let Some(details) = view.run(&run).await.unwrap() else {
            assert!(!holders.contains(&run) && !waiting.contains(&run), "{id}");
            continue;
        };
        let active = !matches!(details.state, RunState::Terminated(_));
        let listed = holders.contains(&run) as u8 + waiting.contains(&run) as u8;
        assert_eq!(listed, active as u8, "{id}: {details:?}");
        if active {
            let waits = details.concurrency.expect("keyed").waiting;
            assert_eq!(waits, waiting.contains(&run), "{id}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_at_each_await_of_keyed_runs_never_leaks_or_double_counts_a_slot() {
    for polls in 1..=40 {
        let runner = TwoSteps {
            delay: Some(Duration::from_millis(5)),
            ..Default::default()
        };
        let env = TestRuntime::new(runner.clone()).await.unwrap();
        let ids: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
        for id in &ids[..3] {
            env.submit(keyed(id, "k", None)).await.unwrap();
        }
        // A submission and a cancellation dropped midway, the worker
        // running, then the process killed.
        let runtime = env.runtime().unwrap();
        let cancelled = rid(&ids[1]);
        let late = taquba_workflow_suite::testing::poll_then_drop(
            runtime.submit(keyed(&ids[3], "k", None)),
            polls,
        );
        let cancel = taquba_workflow_suite::testing::poll_then_drop(
            runtime.cancel(&cancelled),
            polls / 2 + 1,
        );
        let running = taquba_workflow_suite::testing::poll_then_drop(
            env.advance(Duration::from_millis(7)),
            polls,
        );
        tokio::join!(late, cancel, running);
        drop(runtime);
        env.crash().await.unwrap();
        let view = env.runtime().unwrap().view().clone();
        consistent(&view, "k", &ids, 1).await;
        // Submitted again (it may have committed), the late run is one run.
        env.runtime()
            .unwrap()
            .submit(keyed(&ids[3], "k", None))
            .await
            .unwrap();
        consistent(&view, "k", &ids, 1).await;
        env.run_to_completion().await.unwrap();
        consistent(&view, "k", &ids, 1).await;
        assert!(view.concurrency_keys().await.unwrap().is_empty(), "{polls}");
        for id in &ids {
            let end = view.outcome(&rid(id)).await.unwrap();
            let status = view.status(&rid(id)).await.unwrap().unwrap().state;
            assert!(
                matches!(status, RunState::Terminated(_)),
                "{polls} {id}: {status:?} {end:?}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_between_a_termination_and_its_admission_only_delays_the_admission() {
    let runner = TwoSteps {
        delay: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    env.submit(keyed("a", "k", None)).await.unwrap();
    env.submit(keyed("b", "k", None)).await.unwrap();
    env.run_until_idle().await.unwrap();
    // No worker runs between the kit's calls, so nothing admits `b` after
    // `a`'s termination commits: the slot is free, `b` still waits.
    let runtime = env.runtime().unwrap();
    assert!(runtime.cancel(&rid("a")).await.unwrap());
    let view = runtime.view().clone();
    assert_eq!(listed(&view, "k").await, (vec![], vec![rid("b")]));
    drop(runtime);
    env.crash().await.unwrap();
    let view = env.runtime().unwrap().view().clone();
    assert_eq!(listed(&view, "k").await, (vec![], vec![rid("b")]));
    // The restarted worker's maintenance admits it, once.
    env.run_until_idle().await.unwrap();
    assert_eq!(listed(&view, "k").await, (vec![rid("b")], vec![]));
    assert_eq!(runner.seen.started("k"), vec![rid("a"), rid("b")]);
    env.run_to_completion().await.unwrap();
    assert!(view.concurrency_keys().await.unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_requeued_keyed_run_takes_a_slot_again_or_is_refused() {
    let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let healed = healed.clone();
        FnRunner(move |step: Step| {
            let healed = healed.clone();
            async move {
                if step.delivery.run_id.as_str() == "b" {
                    return Ok(StepOutcome::continue_after(
                        Vec::new(),
                        Duration::from_secs(3600),
                    ));
                }
                if !healed.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err(StepError::permanent("broken"));
                }
                Ok(StepOutcome::Succeed { result: Vec::new() })
            }
        })
    };
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(5))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(keyed("a", "k", None)).await.unwrap();
    let end = within(30, runtime.wait(&rid("a"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    // The dead letter released the slot: `b` takes it and holds it.
    runtime.submit(keyed("b", "k", None)).await.unwrap();
    until_step("b to wait on its timer", &runtime, "b", 1).await;
    healed.store(true, std::sync::atomic::Ordering::SeqCst);
    let refused = runtime.requeue(&rid("a")).await;
    assert!(
        matches!(&refused, Err(Error::CommandRefused(m)) if m.contains("`k`") && m.contains("limit")),
        "{refused:?}"
    );
    assert!(runtime.cancel(&rid("b")).await.unwrap());
    within(30, runtime.wait(&rid("b"))).await.unwrap();
    runtime.requeue(&rid("a")).await.unwrap();
    let view = runtime.view().clone();
    let (holders, _) = listed(&view, "k").await;
    assert!(
        holders.is_empty() || holders == vec![rid("a")],
        "{holders:?}"
    );
    let end = within(30, runtime.wait(&rid("a"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(view.concurrency_keys().await.unwrap().is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn runtimes_of_two_queues_share_a_key_and_each_runs_its_own_runs() {
    let (queue, store, _clock) = memory_queue().await;
    let (alpha, beta) = (TwoSteps::default(), TwoSteps::default());
    let build = |name: &str, runner: &TwoSteps| {
        workflow_builder(&queue, &store, runner)
            .queue_name(name)
            .memo_prefix(format!("{name}-memo"))
            .poll_interval(Duration::from_millis(5))
            .build()
    };
    let (a, b) = (build("alpha", &alpha), build("beta", &beta));
    a.submit(keyed("a1", "shared", None)).await.unwrap();
    b.submit(keyed("b1", "shared", None)).await.unwrap();
    a.submit(keyed("a2", "shared", None)).await.unwrap();
    let details = a.view().concurrency_key("shared").await.unwrap();
    assert_eq!((details.holders.len(), details.waiting.len()), (1, 2));
    let workers = [
        a.spawn(std::future::pending::<()>()),
        b.spawn(std::future::pending::<()>()),
    ];
    for (runtime, id) in [(&a, "a1"), (&b, "b1"), (&a, "a2")] {
        let end = within(30, runtime.wait(&rid(id))).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
    }
    assert_eq!(alpha.seen.started("shared"), vec![rid("a1"), rid("a2")]);
    assert_eq!(beta.seen.started("shared"), vec![rid("b1")]);
    assert_eq!(alpha.seen.max("shared").max(beta.seen.max("shared")), 1);
    for worker in workers {
        worker.shutdown().await.unwrap();
    }
}
