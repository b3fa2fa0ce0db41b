//! A review of the claim path's in-memory copy of active runs' records
//! (`run/record_cache.rs`): the record carries the cancellation flag, so a
//! stale copy would let a step run after `cancel` answered, or end a run
//! wrongly. Attacked at the public API: cancels racing a runner's
//! `Continue`, a timer's expiry and the next step's claim (from the
//! worker's runtime and from a second runtime over the queue), many runs
//! cancelled at random moments while steps flow (on two threads), a cancel
//! whose caller is dropped, a run id submitted again after it ended,
//! requeue, fork and restart of cancelled runs, and a signal after a
//! cancel.
//!
//! The invariant every test checks: a run whose `cancel` answered `true`
//! ends `Cancelled`, and no step of it starts after the answer unless its
//! cancellation token had already fired (a step registered before the
//! request reached it is told through its token; one claimed after reads
//! the request and does not run).

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{spec, tokio_clock_queue};
use common::*;
use futures_util::FutureExt;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::{
    Error, ForkOptions, NoopTerminalHook, RunState, SignalOutcome, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore};

/// One call of the runner.
#[derive(Debug, Clone)]
struct Start {
    run: String,
    step: u32,
    /// The probe's logical time when the runner was called.
    seq: u64,
    /// Whether the step's cancellation token had fired when it was called.
    token_fired: bool,
    /// The run's input, as every step of it carries it.
    input: String,
}

/// A logical clock shared by the runner and the test, and every step start.
#[derive(Clone, Default)]
struct Probe {
    seq: Arc<AtomicU64>,
    starts: Arc<Mutex<Vec<Start>>>,
}

impl Probe {
    /// The next logical instant (taken by the test after `cancel` answered).
    fn tick(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    fn start(&self, step: &Step) {
        let seq = self.tick();
        self.starts.lock().unwrap().push(Start {
            run: step.run_id.to_string(),
            step: step.step_number,
            seq,
            token_fired: step.cancel_token.is_cancelled(),
            input: String::from_utf8_lossy(&step.payload).into_owned(),
        });
    }

    fn starts_of(&self, run: &str) -> Vec<Start> {
        self.starts
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.run == run)
            .cloned()
            .collect()
    }

    fn total(&self) -> usize {
        self.starts.lock().unwrap().len()
    }

    /// Panics when a step of `run` started after the instant `answered`
    /// without its token fired.
    fn assert_none_unwarned_after(&self, run: &str, answered: u64, what: &str) {
        let late: Vec<Start> = self
            .starts_of(run)
            .into_iter()
            .filter(|s| s.seq > answered && !s.token_fired)
            .collect();
        assert!(
            late.is_empty(),
            "{what}: run {run}: steps started after cancel answered true, token not fired: {late:?}"
        );
    }
}

/// The input `limit:yields`: the run continues (at once) until step
/// `limit`, which succeeds; each step yields `yields + step % 3` times
/// before it returns. Every step carries the input on as its payload.
fn looping(probe: Probe) -> impl StepRunner + Clone + use<> {
    let runner = move |step: Step| {
        let probe = probe.clone();
        async move {
            probe.start(&step);
            let text = String::from_utf8_lossy(&step.payload).into_owned();
            let (limit, yields) = parse(&text);
            for _ in 0..yields + step.step_number % 3 {
                tokio::task::yield_now().await;
            }
            if step.step_number >= limit {
                Ok(StepOutcome::Succeed { result: vec![] })
            } else {
                Ok(StepOutcome::continue_now(step.payload.clone()))
            }
        }
    };
    Shared(Arc::new(FnRunner(runner)))
}

/// A runner shared by the runtimes over one queue.
struct Shared<R>(Arc<R>);

impl<R> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<R: StepRunner> StepRunner for Shared<R> {
    fn run_step(
        &self,
        step: &Step,
    ) -> impl std::future::Future<Output = Result<StepOutcome, StepError>> + Send {
        self.0.run_step(step)
    }
}

/// `limit:yields[:anything]` of an input.
fn parse(text: &str) -> (u32, u32) {
    let mut parts = text.split(':');
    let limit = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let yields = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (limit, yields)
}

/// xorshift64*, so the random moments repeat from a seed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// The status of the end of `id`, within `secs` s.
async fn end_status<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    secs: u64,
) -> TerminalStatus {
    crate::fixtures::ends_within(runtime, id, secs, "the run's end")
        .await
        .termination
        .status
}

/// Many runs with steps flowing on two threads, each cancelled at a random
/// moment (some after they succeeded); every third cancel's caller is
/// dropped after its first poll and the cancel asked again later. When
/// `front` is set a second runtime over the same queue, running no
/// worker, sends the cancels; when `slow` is set every store call takes
/// 0.1 to 1 ms, which widens each window between a read and a commit.
async fn cancels_at_random_moments(front: bool, slow: bool, seed: u64) {
    let (queue, store) = if slow {
        let store: Arc<dyn ObjectStore> = Arc::new(FaultyStore::new(
            Arc::new(InMemory::new()),
            FaultConfig {
                latency: Some(Duration::from_micros(100)..Duration::from_millis(1)),
                ..FaultConfig::default()
            },
        ));
        let queue = taquba::Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default().flush_interval(Duration::from_millis(1)),
        )
        .await
        .unwrap();
        (Arc::new(queue), store)
    } else {
        real_clock_queue().await
    };
    let probe = Probe::default();
    let runner = looping(probe.clone());
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let canceller = if front {
        WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build()
    } else {
        runtime.clone()
    };
    let worker = runtime.spawn(std::future::pending::<()>());
    const RUNS: u64 = 24;
    let mut rng = seed;
    for n in 0..RUNS {
        // A few short runs, which may succeed before their cancel.
        let limit = if n % 6 == 5 { 3 } else { 100_000 };
        let input = format!("{limit}:{}", next(&mut rng) % 4);
        runtime
            .submit(spec(&format!("r{n}"), &input))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for n in 0..RUNS {
        let delay = Duration::from_micros(next(&mut rng) % 300_000);
        let (canceller, probe) = (canceller.clone(), probe.clone());
        tasks.push(tokio::spawn(async move {
            let id = rid(&format!("r{n}"));
            tokio::time::sleep(delay).await;
            if n % 3 == 0 {
                // Dropped after its first poll: the request goes on.
                let dropped = tokio::time::timeout(Duration::ZERO, canceller.cancel(&id)).await;
                tokio::time::sleep(Duration::from_micros(delay.as_micros() as u64 % 5_000)).await;
                let again = canceller.cancel(&id).await.unwrap();
                let answered = probe.tick();
                (n, dropped.ok().map(Result::unwrap), again, answered)
            } else {
                let cancelled = canceller.cancel(&id).await.unwrap();
                let answered = probe.tick();
                (n, None, cancelled, answered)
            }
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let mut seen = HashMap::new();
    for (n, dropped, cancelled, answered) in answers {
        let id = format!("r{n}");
        let status = end_status(&runtime, &id, 30).await;
        let limit = if n % 6 == 5 { 3 } else { 100_000 };
        if dropped.is_some() || n % 3 == 0 {
            // The dropped request was recorded, or the run ended before it.
            if limit > 3 {
                assert_eq!(
                    status,
                    TerminalStatus::Cancelled,
                    "run {id}: a long run whose (dropped) cancel was sent ends Cancelled"
                );
            }
            if dropped == Some(true) || cancelled {
                assert_eq!(status, TerminalStatus::Cancelled, "run {id}");
            }
        } else {
            assert_eq!(
                cancelled,
                status == TerminalStatus::Cancelled,
                "run {id}: cancel answered {cancelled}, the run ended {status:?}"
            );
        }
        if status == TerminalStatus::Cancelled {
            probe.assert_none_unwarned_after(&id, answered, "random cancels");
        }
        *seen.entry(format!("{status:?}")).or_insert(0) += 1;
    }
    assert!(
        seen.get("Cancelled").copied().unwrap_or(0) >= (RUNS as usize) * 2 / 3,
        "the long runs were cancelled: {seen:?}"
    );
    // Every run ended: no step starts any more.
    let total = probe.total();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(probe.total(), total, "no step starts after every run ended");
    assert!(
        probe.starts.lock().unwrap().len() > RUNS as usize * 3,
        "steps flowed while the cancels landed"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_cancelled_at_random_moments_end_cancelled_and_start_no_step_after() {
    cancels_at_random_moments(false, false, 0x9E37_79B9_7F4A_7C15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancels_over_a_slow_store_from_both_runtimes() {
    cancels_at_random_moments(false, true, 0x94D0_49BB_1331_11EB).await;
    cancels_at_random_moments(true, true, 0xBF58_476D_1CE4_E5B9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_from_a_second_runtime_over_the_queue_at_random_moments() {
    cancels_at_random_moments(true, false, 0xD1B5_4A32_D192_ED03).await;
}

/// A cancel racing a runner that returns `Continue` (after `n` yields,
/// `n` in 0..30), sent by the worker's runtime and by a second one over
/// the queue: `true` only for a run that ends `Cancelled`, and then no
/// later step starts without its token fired. Both answers occur.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_continue_lets_no_step_start_after_it_answered() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let (announce, mut announced) = tokio::sync::mpsc::unbounded_channel::<String>();
    let runner = {
        let probe = probe.clone();
        Shared(Arc::new(FnRunner(move |step: Step| {
            let (probe, announce) = (probe.clone(), announce.clone());
            async move {
                probe.start(&step);
                let (limit, yields) = parse(&String::from_utf8_lossy(&step.payload));
                if step.step_number == 0 {
                    announce.send(step.run_id.to_string()).ok();
                }
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                if step.step_number >= limit {
                    Ok(StepOutcome::Succeed { result: vec![] })
                } else {
                    Ok(StepOutcome::continue_now(step.payload.clone()))
                }
            }
        })))
    };
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .build();
    let front = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut endings: HashMap<bool, u32> = HashMap::new();
    for n in 0..60u32 {
        let id = format!("cont-{n}");
        // One step or two; every step yields `n / 2` times.
        runtime
            .submit(spec(&id, &format!("{}:{}", n % 2, n / 2)))
            .await
            .unwrap();
        assert_eq!(
            within(10, announced.recv()).await.as_deref(),
            Some(id.as_str())
        );
        let by = if n % 2 == 0 { &runtime } else { &front };
        let cancelled = within(10, by.cancel(&rid(&id))).await.unwrap();
        let answered = probe.tick();
        let status = end_status(&runtime, &id, 10).await;
        assert_eq!(
            cancelled,
            status == TerminalStatus::Cancelled,
            "run {id}: cancel answered {cancelled}, the run ended {status:?}"
        );
        if cancelled {
            probe.assert_none_unwarned_after(&id, answered, "cancel racing Continue");
        } else {
            assert_eq!(
                probe.starts_of(&id).len() as u32,
                n % 2 + 1,
                "run {id} ran all its steps"
            );
        }
        *endings.entry(cancelled).or_insert(0) += 1;
    }
    assert_eq!(endings.len(), 2, "both answers occurred: {endings:?}");
    worker.shutdown().await.unwrap();
}

/// A cancel racing a durable timer's expiry and the claim of the step it
/// wakes: the runs wait 100 ms between steps, and the cancel is sent from
/// 60 to 140 ms after a step started (queue time follows paused tokio
/// time), by the worker's runtime and by a second runtime.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_a_timers_expiry_lets_no_step_start_after_it_answered() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    // Scheduled jobs promoted every 5 ms (not every second), so the cancel
    // lands around the promotion and the claim.
    let queue = tokio_clock_queue(
        store.clone(),
        OpenOptions::default().scheduler_interval(Duration::from_millis(5)),
    )
    .await;
    let probe = Probe::default();
    let (announce, mut announced) = tokio::sync::mpsc::unbounded_channel::<(String, u32)>();
    let runner = {
        let probe = probe.clone();
        Shared(Arc::new(FnRunner(move |step: Step| {
            let (probe, announce) = (probe.clone(), announce.clone());
            async move {
                probe.start(&step);
                announce
                    .send((step.run_id.to_string(), step.step_number))
                    .ok();
                if step.step_number >= 5 {
                    Ok(StepOutcome::Succeed { result: vec![] })
                } else {
                    Ok(StepOutcome::continue_after(
                        step.payload.clone(),
                        Duration::from_millis(100),
                    ))
                }
            }
        })))
    };
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(7))
    .build();
    let front = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut endings: HashMap<bool, u32> = HashMap::new();
    for n in 0..40u64 {
        let id = format!("timer-{n}");
        runtime.submit(spec(&id, "x")).await.unwrap();
        // Let the run pass `n % 3` timers, then cancel around the next
        // one's expiry.
        loop {
            let (run, step) = within(10, announced.recv()).await.unwrap();
            assert_eq!(run, id);
            if u64::from(step) == n % 3 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(60 + (n * 37) % 121)).await;
        let by = if n % 2 == 0 { &runtime } else { &front };
        let cancelled = within(10, by.cancel(&rid(&id))).await.unwrap();
        let answered = probe.tick();
        let status = end_status(&runtime, &id, 10).await;
        while announced.try_recv().is_ok() {}
        assert!(cancelled, "run {id}: its last step is 100 ms or more away");
        assert_eq!(status, TerminalStatus::Cancelled, "run {id}");
        probe.assert_none_unwarned_after(&id, answered, "cancel racing a timer");
        let steps = probe.starts_of(&id).len() as u64;
        assert!(
            (n % 3 + 1..=n % 3 + 2).contains(&steps),
            "run {id}: {steps} steps started"
        );
        *endings.entry(steps == n % 3 + 1).or_insert(0) += 1;
    }
    assert_eq!(
        endings.len(),
        2,
        "cancels landed both before and after the timer's step started: {endings:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A run id submitted again right after its run ended (succeeded, or
/// cancelled while its steps flowed): the new run is not treated as
/// cancelled (it runs every step with its own input, tokens unfired), and
/// the old one is not resurrected (no step of it starts after it ended).
#[tokio::test(start_paused = true)]
async fn a_run_id_submitted_again_after_it_ended_is_neither_cancelled_nor_resurrected() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runner = looping(probe.clone());
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut ended_at: Vec<(String, u64)> = Vec::new();
    for round in 0..12u32 {
        let cancelled_round = round % 2 == 1;
        let limit = if cancelled_round { 100_000 } else { 4 };
        let input = format!("{limit}:{}:gen-{round}", round % 3);
        let submitted = runtime.submit(spec("again", &input)).await.unwrap();
        assert!(submitted.newly_submitted, "round {round}: a new run");
        if cancelled_round {
            eventually("steps flowing", || async {
                probe
                    .starts_of("again")
                    .iter()
                    .filter(|s| s.input == input)
                    .count()
                    > 3 + round as usize
            })
            .await;
            assert!(runtime.cancel(&rid("again")).await.unwrap());
            assert_eq!(
                end_status(&runtime, "again", 10).await,
                TerminalStatus::Cancelled
            );
        } else {
            assert_eq!(
                end_status(&runtime, "again", 10).await,
                TerminalStatus::Succeeded,
                "round {round}: the run after a cancelled one is not cancelled"
            );
            let of_round: Vec<Start> = probe
                .starts_of("again")
                .into_iter()
                .filter(|s| s.input == input)
                .collect();
            assert_eq!(
                of_round.iter().map(|s| s.step).collect::<Vec<_>>(),
                (0..=limit).collect::<Vec<_>>(),
                "round {round}: every step once, with its own input"
            );
            assert!(of_round.iter().all(|s| !s.token_fired));
        }
        ended_at.push((input, probe.tick()));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let starts = probe.starts_of("again");
    for (input, ended) in ended_at {
        let late: Vec<&Start> = starts
            .iter()
            .filter(|s| s.input == input && s.seq > ended)
            .collect();
        assert!(
            late.is_empty(),
            "an ended run {input} resurrected: {late:?}"
        );
    }
    worker.shutdown().await.unwrap();
}

/// Requeue, fork and restart around cancellation: a cancelled run cannot
/// be requeued; a requeued run (its step dead-lettered, then requeued) is
/// cancelled like any other; a restart of a cancelled run and a fork with
/// `cancel_active` run to the end without being taken for cancelled.
#[tokio::test(start_paused = true)]
async fn requeue_fork_and_restart_around_a_cancelled_run() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let gate = Gate::default();
    // `block`: every step waits for the gate; `die-once`: step 1 fails
    // permanently the first time it runs.
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let (probe, gate, failed_once) = (probe.clone(), gate.clone(), failed_once.clone());
        Shared(Arc::new(FnRunner(move |step: Step| {
            let (probe, gate, failed_once) = (probe.clone(), gate.clone(), failed_once.clone());
            async move {
                probe.start(&step);
                let text = String::from_utf8_lossy(&step.payload).into_owned();
                if text.contains("die-once")
                    && step.step_number == 1
                    && !failed_once.swap(true, Ordering::SeqCst)
                {
                    return Err(StepError::permanent("first time"));
                }
                if text.contains("block") && step.step_number >= 1 {
                    tokio::select! {
                        () = gate.wait() => {}
                        () = step.cancel_token.cancelled() => {
                            return Ok(StepOutcome::Succeed { result: vec![] });
                        }
                    }
                }
                if step.step_number >= 3 {
                    Ok(StepOutcome::Succeed { result: vec![] })
                } else {
                    Ok(StepOutcome::continue_now(step.payload.clone()))
                }
            }
        })))
    };
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());

    // A run cancelled at step 1 is not requeued.
    runtime.submit(spec("c", "block")).await.unwrap();
    until_step("step 1", &runtime, "c", 1).await;
    assert!(runtime.cancel(&rid("c")).await.unwrap());
    let answered = probe.tick();
    assert_eq!(
        end_status(&runtime, "c", 10).await,
        TerminalStatus::Cancelled
    );
    assert!(matches!(
        runtime.requeue(&rid("c")).await,
        Err(Error::CommandRefused(_))
    ));
    // Restarted (step 0 again, new id): not cancelled, runs to the end.
    gate.open();
    let restarted = runtime
        .restart(&rid("c"), ForkOptions::new().run_id(rid("c-restart")))
        .await
        .unwrap();
    assert!(restarted.newly_submitted);
    assert_eq!(
        end_status(&runtime, "c-restart", 10).await,
        TerminalStatus::Succeeded
    );
    assert_eq!(probe.starts_of("c-restart").len(), 4);
    probe.assert_none_unwarned_after("c", answered, "after restart");
    assert!(probe.starts_of("c").iter().all(|s| s.step <= 1));
    // Forked from step 2 of the cancelled run, which never reached it:
    // refused.
    assert!(matches!(
        runtime.fork(&rid("c"), 2, ForkOptions::new()).await,
        Err(Error::StepNotForkable { .. })
    ));
    gate.close();

    // A run failed by a dead letter, requeued, then cancelled at the
    // requeued step; then requeue is refused (it was cancelled).
    runtime.submit(spec("d", "die-once block")).await.unwrap();
    assert_eq!(end_status(&runtime, "d", 10).await, TerminalStatus::Failed);
    runtime.requeue(&rid("d")).await.unwrap();
    eventually("the requeued step to run", || async {
        probe.starts_of("d").iter().filter(|s| s.step == 1).count() == 2
    })
    .await;
    assert!(runtime.cancel(&rid("d")).await.unwrap());
    let answered = probe.tick();
    assert_eq!(
        end_status(&runtime, "d", 10).await,
        TerminalStatus::Cancelled
    );
    probe.assert_none_unwarned_after("d", answered, "requeued then cancelled");
    assert!(probe.starts_of("d").iter().all(|s| s.step <= 1));
    assert!(matches!(
        runtime.requeue(&rid("d")).await,
        Err(Error::CommandRefused(_))
    ));

    // A fork with `cancel_active` of a running run: the original ends
    // Cancelled, the fork (from step 1) runs to the end.
    runtime.submit(spec("e", "block")).await.unwrap();
    until_step("step 1", &runtime, "e", 1).await;
    let forked = within(
        10,
        runtime.fork(
            &rid("e"),
            1,
            ForkOptions::new().run_id(rid("e-fork")).cancel_active(true),
        ),
    )
    .await
    .unwrap();
    assert!(forked.newly_submitted);
    assert_eq!(
        end_status(&runtime, "e", 10).await,
        TerminalStatus::Cancelled
    );
    let answered = probe.tick();
    gate.open();
    assert_eq!(
        end_status(&runtime, "e-fork", 10).await,
        TerminalStatus::Succeeded
    );
    assert_eq!(
        probe
            .starts_of("e-fork")
            .iter()
            .map(|s| s.step)
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    probe.assert_none_unwarned_after("e", answered, "forked with cancel_active");
    worker.shutdown().await.unwrap();
}

/// A cancel whose caller is dropped at its first poll (`now_or_never`)
/// while the run's steps flow still ends the run `Cancelled`, within a few
/// steps (at most two start after the request was sent: a stale cached
/// record would let the run go on until the detached cancel reaches its
/// current step); asked again it answers `false` (the request was
/// recorded), and no step starts after the run ended. Repeated with the
/// drop after 0 to 23 steps.
#[tokio::test(start_paused = true)]
async fn a_dropped_cancel_still_ends_a_flowing_run() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runtime =
        WorkflowRuntime::builder(queue, store, looping(probe.clone()), NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for n in 0..24u32 {
        let id = format!("drop-{n}");
        runtime
            .submit(spec(&id, &format!("100000:{}", n % 4)))
            .await
            .unwrap();
        eventually("steps flowing", || async {
            probe.starts_of(&id).len() > n as usize
        })
        .await;
        let sent = probe.tick();
        let first = runtime.cancel(&rid(&id)).now_or_never();
        assert!(
            first.is_none(),
            "a cancel does not finish at its first poll"
        );
        let status = end_status(&runtime, &id, 10).await;
        assert_eq!(status, TerminalStatus::Cancelled, "run {id}");
        let ended = probe.tick();
        assert!(!runtime.cancel(&rid(&id)).await.unwrap());
        let ran = probe.starts_of(&id).iter().filter(|s| s.seq > sent).count();
        // A step already claimed when the request was sent may still
        // start; a step claimed after it reads the request (0 is what
        // the current code gives).
        assert!(
            ran <= 2,
            "run {id}: {ran} steps started after the dropped request was sent"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            probe.starts_of(&id).iter().all(|s| s.seq < ended),
            "run {id}: a step started after the run ended"
        );
    }
    worker.shutdown().await.unwrap();
}

/// A run waiting on a signal, cancelled, then signalled: the signal finds
/// no waiter (it is buffered), no step runs, and the run stays
/// `Cancelled`. A run submitted again under the id then takes the buffered
/// signal and runs to the end.
#[tokio::test(start_paused = true)]
async fn a_signal_after_a_cancel_wakes_no_step_of_the_cancelled_run() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runner = {
        let probe = probe.clone();
        Shared(Arc::new(FnRunner(move |step: Step| {
            let probe = probe.clone();
            async move {
                probe.start(&step);
                if step.step_number == 0 {
                    Ok(StepOutcome::continue_on_signal(
                        step.payload.clone(),
                        format!("key-{}", step.run_id),
                        Duration::from_secs(3600),
                    ))
                } else {
                    Ok(StepOutcome::Succeed { result: vec![] })
                }
            }
        })))
    };
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("s", "first")).await.unwrap();
    eventually("waiting on the signal", || async {
        probe.starts_of("s").len() == 1
            && runtime
                .status(&rid("s"))
                .await
                .unwrap()
                .unwrap()
                .current_step
                == 1
    })
    .await;
    assert!(runtime.cancel(&rid("s")).await.unwrap());
    let answered = probe.tick();
    assert_eq!(
        end_status(&runtime, "s", 10).await,
        TerminalStatus::Cancelled
    );
    assert_eq!(
        runtime.signal("key-s", b"late".to_vec()).await.unwrap(),
        SignalOutcome::Buffered
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(probe.starts_of("s").len(), 1, "no step woke");
    probe.assert_none_unwarned_after("s", answered, "signal after cancel");
    assert!(matches!(
        runtime.status(&rid("s")).await.unwrap().unwrap().state,
        RunState::Terminated(_)
    ));
    // Submitted again: a new run, not cancelled, woken by the buffered
    // signal.
    assert!(
        runtime
            .submit(spec("s", "second"))
            .await
            .unwrap()
            .newly_submitted
    );
    assert_eq!(
        end_status(&runtime, "s", 10).await,
        TerminalStatus::Succeeded
    );
    let second: Vec<u32> = probe
        .starts_of("s")
        .iter()
        .filter(|s| s.input == "second")
        .map(|s| s.step)
        .collect();
    assert_eq!(second, vec![0, 1]);
    worker.shutdown().await.unwrap();
}

/// A run group whose members' steps flow, cancelled as a group: every
/// member ends `Cancelled` with no step started after the answer; the
/// group submitted again under the same keys (the same member run ids)
/// runs every member afresh to success, none taken for cancelled.
#[tokio::test(start_paused = true)]
async fn a_cancelled_group_submitted_again_runs_its_members_afresh() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let short = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runner = {
        let (probe, short) = (probe.clone(), short.clone());
        FnRunner(move |step: Step| {
            let (probe, short) = (probe.clone(), short.clone());
            async move {
                probe.start(&step);
                tokio::task::yield_now().await;
                let limit = if short.load(Ordering::SeqCst) {
                    3
                } else {
                    100_000
                };
                if step.step_number >= limit {
                    Ok(StepOutcome::Succeed { result: vec![] })
                } else {
                    Ok(StepOutcome::continue_now(step.payload.clone()))
                }
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.new_group();
    let members: Vec<taquba_workflow::GroupMember> = (0..10)
        .map(|i| taquba_workflow::GroupMember {
            key: format!("m{i}"),
            input: format!("member-{i}").into_bytes(),
        })
        .collect();
    group
        .submit(members.clone(), &taquba_workflow::RunOptions::default())
        .await
        .unwrap();
    let runs = || {
        let mut runs: Vec<String> = probe
            .starts
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.run.clone())
            .collect();
        runs.sort();
        runs.dedup();
        runs
    };
    eventually("every member's steps flowing", || async {
        let runs = runs();
        runs.len() == 10 && runs.iter().all(|r| probe.starts_of(r).len() > 3)
    })
    .await;
    assert_eq!(within(10, group.cancel()).await.unwrap(), 10);
    let answered = probe.tick();
    for run in runs() {
        assert_eq!(
            end_status(&runtime, &run, 10).await,
            TerminalStatus::Cancelled
        );
        probe.assert_none_unwarned_after(&run, answered, "group cancel");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = probe.total();
    let again = probe.tick();
    short.store(true, Ordering::SeqCst);
    group
        .submit(members, &taquba_workflow::RunOptions::default())
        .await
        .unwrap();
    for run in runs() {
        assert_eq!(
            end_status(&runtime, &run, 10).await,
            TerminalStatus::Succeeded,
            "member {run} submitted again"
        );
        let fresh: Vec<(u32, bool)> = probe
            .starts_of(&run)
            .iter()
            .filter(|s| s.seq > again)
            .map(|s| (s.step, s.token_fired))
            .collect();
        assert_eq!(
            fresh,
            (0..=3).map(|s| (s, false)).collect::<Vec<_>>(),
            "member {run}: every step once, afresh"
        );
    }
    assert_eq!(probe.total(), before + 40);
    worker.shutdown().await.unwrap();
}

/// A keyed job that waits for the gate (its state) or its cancellation.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Held {
    key: String,
}

/// Calls of [`Held`], and the gate it waits on.
#[derive(Clone, Default)]
struct HeldState {
    calls: Arc<AtomicU64>,
    gate: Gate,
}

#[derive(Debug, thiserror::Error)]
#[error("held")]
struct HeldError;

impl taquba_workflow::jobs::Job for Held {
    const NAME: &'static str = "review.held";
    type Output = String;
    type Error = HeldError;

    async fn run(&self, ctx: taquba_workflow::jobs::JobContext<'_>) -> Result<String, HeldError> {
        let state = ctx.state::<HeldState>();
        let call = state.calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::select! {
            () = state.gate.wait() => {}
            () = ctx.cancel_token.cancelled() => {}
        }
        Ok(format!("{}#{call}", self.key))
    }

    fn idempotency_key(&self) -> Option<String> {
        Some(self.key.clone())
    }
}

/// A typed job with an idempotency key, cancelled while it runs by a second
/// runtime over the queue (the job runner's own runtime runs the worker),
/// then submitted again under the key: the cancellation is the recorded
/// end (jobs/mod.rs: a keyed job that terminated is answered by its
/// record), so the job is neither run again nor resurrected. Another key
/// submitted right after runs once and succeeds, not taken for cancelled.
#[tokio::test(start_paused = true)]
async fn a_keyed_job_cancelled_then_submitted_again_keeps_its_cancelled_end() {
    let (queue, store, _clock) = memory_queue().await;
    let state = HeldState::default();
    let jobs = taquba_workflow::jobs::JobRunner::builder(queue.clone(), store.clone())
        .register::<Held>()
        .state(state.clone())
        .build();
    let front = WorkflowRuntime::builder(
        queue,
        store,
        FnRunner(|_: Step| async { Ok(StepOutcome::Succeed { result: vec![] }) }),
        NoopTerminalHook,
    )
    .build();
    let worker = jobs.spawn(std::future::pending::<()>());
    let held = Held { key: "k1".into() };
    let first = jobs.submit(held.clone()).await.unwrap();
    assert!(first.newly_submitted());
    eventually("the job running", || async {
        state.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(within(10, front.cancel(first.id())).await.unwrap());
    assert_eq!(
        end_status(&front, first.id().as_str(), 10).await,
        TerminalStatus::Cancelled
    );
    assert!(
        first.join().await.unwrap().is_err(),
        "the cancelled job has no output"
    );

    let second = jobs.submit(held.clone()).await.unwrap();
    assert_eq!(second.id(), first.id(), "the key names the run");
    assert!(!second.newly_submitted(), "a terminated keyed job is kept");
    assert!(within(10, second.join()).await.unwrap().is_err());
    assert_eq!(
        end_status(&front, first.id().as_str(), 10).await,
        TerminalStatus::Cancelled
    );
    state.gate.open();
    let other = jobs.submit(Held { key: "k2".into() }).await.unwrap();
    assert!(other.newly_submitted());
    assert_eq!(within(10, other.join()).await.unwrap().unwrap(), "k2#2");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        state.calls.load(Ordering::SeqCst),
        2,
        "k1 ran once, k2 once"
    );
    worker.shutdown().await.unwrap();
}

/// A cancel racing the signal that wakes a waiting run's last step (sent
/// a few yields or up to 30 ms of paused time apart, either first), from the worker's runtime and a second
/// one: `true` only for a run that ends `Cancelled`, then no step of it
/// starts after the answer with its token unfired; both answers occur.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_the_signal_that_wakes_a_run() {
    let (queue, store, _clock) = memory_queue().await;
    let probe = Probe::default();
    let runner = {
        let probe = probe.clone();
        Shared(Arc::new(FnRunner(move |step: Step| {
            let probe = probe.clone();
            async move {
                probe.start(&step);
                match step.step_number {
                    0 => Ok(StepOutcome::continue_on_signal(
                        step.payload.clone(),
                        format!("wake-{}", step.run_id),
                        Duration::from_secs(3600),
                    )),
                    _ => Ok(StepOutcome::Succeed { result: vec![] }),
                }
            }
        })))
    };
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .build();
    let front = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut endings: HashMap<bool, u32> = HashMap::new();
    for n in 0..32u32 {
        let id = format!("sig-{n}");
        runtime.submit(spec(&id, "x")).await.unwrap();
        eventually("waiting on its signal", || async {
            runtime
                .status(&rid(&id))
                .await
                .unwrap()
                .unwrap()
                .current_step
                == 1
        })
        .await;
        let by = if n % 2 == 0 {
            runtime.clone()
        } else {
            front.clone()
        };
        let key = format!("wake-{id}");
        let signal = {
            let runtime = runtime.clone();
            async move {
                if n % 4 >= 2 {
                    for _ in 0..n % 8 {
                        tokio::task::yield_now().await;
                    }
                }
                runtime.signal(&key, b"go".to_vec()).await.unwrap()
            }
        };
        let cancel = {
            let (probe, id) = (probe.clone(), rid(&id));
            async move {
                if n % 4 < 2 {
                    for _ in 0..n % 8 {
                        tokio::task::yield_now().await;
                    }
                    tokio::time::sleep(Duration::from_millis(u64::from(n % 16) * 2)).await;
                }
                let cancelled = by.cancel(&id).await.unwrap();
                (cancelled, probe.tick())
            }
        };
        let (_, (cancelled, answered)) =
            within(10, futures_util::future::join(signal, cancel)).await;
        let status = end_status(&runtime, &id, 10).await;
        assert_eq!(
            cancelled,
            status == TerminalStatus::Cancelled,
            "run {id}: cancel answered {cancelled}, the run ended {status:?}"
        );
        if cancelled {
            probe.assert_none_unwarned_after(&id, answered, "cancel racing a signal");
        } else {
            assert_eq!(probe.starts_of(&id).len(), 2, "run {id} ran both its steps");
        }
        *endings.entry(cancelled).or_insert(0) += 1;
    }
    assert_eq!(endings.len(), 2, "both answers occurred: {endings:?}");
    worker.shutdown().await.unwrap();
}
