//! Runner verdicts, external cancellation and terminal hooks at the public
//! API. A cancel racing each way a run ends (success, permanent and
//! transient failures, verdicts, a timer, a signal or its timeout, a
//! sleeping step) leaves one termination that `wait`, `status` and
//! `outcome` agree on, answers `true` only for a run that ended
//! `Cancelled`, and is followed by one hook call.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{Counting, Scripted, ends_within, spec, state, tokio_clock_queue};
use common::*;
use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{EnqueueOptions, EnqueueRequest, JobRecord, Queue};
use taquba_workflow::{
    HEADER_RUN_ID, HEADER_TERMINAL, NoopTerminalHook, RunEnd, RunOptions, RunOutcome, RunSpec,
    RunState, RunTermination, Step, StepError, StepErrorKind, StepOutcome, StepRunner,
    TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime,
};

/// Submit `input` as run `id` with a `tenant` header.
fn tenant_spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        options: RunOptions {
            headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The terminal state of `status`, or a panic naming the state found.
fn terminated(state: &RunState) -> &RunTermination {
    match state {
        RunState::Terminated(termination) => termination,
        other => panic!("expected a terminated run, found {other:?}"),
    }
}

fn run_of(job: &JobRecord) -> Option<&str> {
    job.headers.get(HEADER_RUN_ID).map(String::as_str)
}

/// A runner whose verdict is its payload: `permanent`, `fail`, `cancel`,
/// anything else succeeds. Counts its calls.
fn verdicts(calls: Arc<AtomicU32>) -> impl StepRunner + use<> {
    FnRunner(move |step: Step| {
        calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(match step.payload.as_slice() {
            b"permanent" => Err(StepError::permanent("boom")),
            b"fail" => Ok(StepOutcome::Fail {
                reason: "nope".into(),
            }),
            b"cancel" => Ok(StepOutcome::Cancel {
                reason: "stop".into(),
            }),
            other => Ok(StepOutcome::Succeed {
                result: other.to_vec(),
            }),
        })
    })
}

/// A runtime over `queue` with the [`verdicts`] runner counting into
/// `calls`, and `hook`.
fn verdicts_runtime<H: TerminalHook + 'static>(
    queue: Arc<Queue>,
    store: Arc<dyn taquba::object_store::ObjectStore>,
    calls: Arc<AtomicU32>,
    hook: H,
) -> WorkflowRuntime<impl StepRunner + use<H>, H> {
    WorkflowRuntime::builder(queue, store, verdicts(calls), hook).build()
}

/// Submit [`spec`]`(id, input)` and wait (30 s at most) for the run's end.
async fn submit_and_wait<R: StepRunner, H: TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
    input: &str,
) -> RunEnd {
    runtime.submit(tenant_spec(id, input)).await.unwrap();
    within(30, runtime.wait(&rid(id))).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_permanent_step_error_dead_letters_at_once_and_fails_the_run() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let runtime = verdicts_runtime(queue.clone(), store, calls.clone(), NoopTerminalHook);
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = submit_and_wait(&runtime, "perm", "permanent").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("boom"));
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Permanent));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no retry of a permanent error"
    );
    let dead = dead_jobs(&queue).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(run_of(&dead[0]), Some("perm"));
    assert_eq!(dead[0].last_error.as_deref(), Some("boom"));
    assert_eq!(dead[0].attempts, 1);
    let outcome = end.outcome.expect("the worker recorded the failure");
    assert_eq!(outcome.error.as_deref(), Some("boom"));
    assert_eq!(
        outcome.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_fail_verdict_acknowledges_the_step_and_fails_the_run() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let runtime = verdicts_runtime(queue.clone(), store, calls.clone(), NoopTerminalHook);
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = submit_and_wait(&runtime, "f", "fail").await;
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error.as_deref(), Some("nope"));
    assert_eq!(end.termination.error_kind, Some(StepErrorKind::Permanent));
    assert!(
        dead_jobs(&queue).await.is_empty(),
        "a verdict is not a dead letter"
    );
    assert_eq!(queue.view().stats(STEPS).await.unwrap().done, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancel_verdict_ends_cancelled_with_its_reason() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = Recorder::default();
    let runtime = verdicts_runtime(queue.clone(), store, Arc::default(), hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = submit_and_wait(&runtime, "c", "cancel").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error.as_deref(), Some("stop"));
    assert_eq!(end.termination.error_kind, None);
    let outcome = end.outcome.expect("recorded");
    assert_eq!(outcome.status, TerminalStatus::Cancelled);
    assert_eq!(outcome.error.as_deref(), Some("stop"));
    assert!(dead_jobs(&queue).await.is_empty());
    eventually("the hook", || async { hook.calls().len() == 1 }).await;
    assert_eq!(hook.calls()[0].error.as_deref(), Some("stop"));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_pending_step_terminates_the_run_before_cancel_returns() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let hook = Recorder::default();
    let runtime = verdicts_runtime(queue.clone(), store, calls.clone(), hook.clone());
    runtime.submit(tenant_spec("p", "x")).await.unwrap();
    assert_eq!(
        runtime.status(&rid("p")).await.unwrap().unwrap().state,
        RunState::Pending
    );
    assert!(runtime.cancel(&rid("p")).await.unwrap());
    let status = runtime.status(&rid("p")).await.unwrap().unwrap();
    let termination = terminated(&status.state);
    assert_eq!(termination.status, TerminalStatus::Cancelled);
    assert_eq!(termination.error, None);
    assert_eq!(termination.error_kind, None);
    assert_eq!(termination.final_step, 0);
    assert_eq!(termination.terminated_at_ms, T0);
    let stats = queue.view().stats(STEPS).await.unwrap();
    assert_eq!(
        (stats.pending, stats.scheduled),
        (1, 0),
        "the step job is gone and the notification job is queued"
    );
    let end = within(5, runtime.wait(&rid("p"))).await.unwrap();
    assert_eq!(end.termination, *termination);
    assert!(end.outcome.is_none(), "no worker recorded an outcome");
    assert!(runtime.outcome(&rid("p")).await.unwrap().is_none());

    // The notification is processed once a worker runs; the runner never is.
    let worker = runtime.spawn(std::future::pending::<()>());
    eventually("the hook", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls_seen = hook.calls();
    assert_eq!(calls_seen.len(), 1, "notified exactly once");
    assert_eq!(calls_seen[0].status, TerminalStatus::Cancelled);
    assert_eq!(calls_seen[0].error, None);
    assert_eq!(calls_seen[0].final_step, 0);
    assert_eq!(
        calls_seen[0].headers,
        HashMap::from([("tenant".to_string(), "acme".to_string())])
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_step_waiting_on_a_timer_removes_it() {
    let (queue, store, clock) = memory_queue().await;
    let later = Arc::new(AtomicU32::new(0));
    let runner = {
        let later = later.clone();
        FnRunner(move |step: Step| {
            let later = later.clone();
            async move {
                if step.step_number == 0 {
                    Ok(StepOutcome::continue_after(
                        vec![],
                        Duration::from_secs(3600),
                    ))
                } else {
                    later.fetch_add(1, Ordering::SeqCst);
                    Ok(StepOutcome::Succeed { result: vec![] })
                }
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("t", "x")).await.unwrap();
    until_step("step 1 to be scheduled", &runtime, "t", 1).await;
    assert_eq!(queue.view().stats(STEPS).await.unwrap().scheduled, 1);
    assert!(runtime.cancel(&rid("t")).await.unwrap());
    let status = runtime.status(&rid("t")).await.unwrap().unwrap();
    let termination = terminated(&status.state);
    assert_eq!(termination.status, TerminalStatus::Cancelled);
    assert_eq!(termination.final_step, 1);
    assert_eq!(termination.error, None);
    assert_eq!(queue.view().stats(STEPS).await.unwrap().scheduled, 0);

    clock.advance(Duration::from_secs(7200));
    queue.promote_scheduled_now().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(later.load(Ordering::SeqCst), 0, "the timer never fired");
    worker.shutdown().await.unwrap();
}

/// What a blocking runner reports: its step started, and whether its
/// cancellation token had fired when it returned.
#[derive(Debug, PartialEq)]
enum Event {
    Started(u32),
    Returned { token_fired: bool },
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_running_step_fires_its_token_and_discards_the_outcome() {
    let (queue, store, _clock) = memory_queue().await;
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runner = FnRunner(move |step: Step| {
        let events = events.clone();
        async move {
            events.send(Event::Started(step.step_number)).ok();
            step.cancel_token.cancelled().await;
            step.effects.put("app/cooperative", "staged").unwrap();
            events.send(Event::Returned { token_fired: true }).ok();
            Ok(StepOutcome::Succeed {
                result: b"ignored".to_vec(),
            })
        }
    });
    let hook = Recorder::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, hook.clone()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("run", "x")).await.unwrap();
    assert_eq!(within(10, seen.recv()).await, Some(Event::Started(0)));
    assert_eq!(
        runtime.status(&rid("run")).await.unwrap().unwrap().state,
        RunState::Running
    );
    assert!(runtime.cancel(&rid("run")).await.unwrap());
    assert_eq!(
        within(10, seen.recv()).await,
        Some(Event::Returned { token_fired: true })
    );
    let end = within(10, runtime.wait(&rid("run"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    let outcome = end.outcome.expect("the worker recorded the cancellation");
    assert_eq!(outcome.result, None, "the runner's result is discarded");
    assert!(
        queue
            .view()
            .kv_get(b"app/cooperative")
            .await
            .unwrap()
            .is_none(),
        "the effects staged for a discarded outcome are not applied"
    );
    eventually("the hook", || async { hook.calls().len() == 1 }).await;
    assert_eq!(hook.calls()[0].status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_running_step_that_ignores_its_token_is_settled_cancelled_when_it_returns() {
    let (queue, store, _clock) = memory_queue().await;
    let gate = Gate::default();
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runner = {
        let gate = gate.clone();
        FnRunner(move |step: Step| {
            let (gate, events) = (gate.clone(), events.clone());
            async move {
                events.send(Event::Started(step.step_number)).ok();
                gate.wait().await;
                step.effects.put("app/ignored", "staged").unwrap();
                events
                    .send(Event::Returned {
                        token_fired: step.cancel_token.is_cancelled(),
                    })
                    .ok();
                Ok(StepOutcome::continue_now(vec![]))
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("stubborn", "x")).await.unwrap();
    assert_eq!(within(10, seen.recv()).await, Some(Event::Started(0)));
    assert!(within(10, runtime.cancel(&rid("stubborn"))).await.unwrap());
    for _ in 0..3 {
        let status = runtime.status(&rid("stubborn")).await.unwrap().unwrap();
        assert_eq!(status.state, RunState::Cancelling);
        assert_eq!(status.current_step, 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    gate.open();
    assert_eq!(
        within(10, seen.recv()).await,
        Some(Event::Returned { token_fired: true })
    );
    let end = within(10, runtime.wait(&rid("stubborn"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    assert_eq!(end.termination.final_step, 0, "the Continue was discarded");
    assert!(queue.view().kv_get(b"app/ignored").await.unwrap().is_none());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        seen.try_recv().is_err(),
        "no next step ran after the cancellation"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_claimed_after_the_request_is_settled_without_running() {
    let (queue, store, _clock) = memory_queue().await;
    let calls = Arc::new(AtomicU32::new(0));
    let runtime = verdicts_runtime(queue.clone(), store, calls.clone(), NoopTerminalHook);
    runtime.submit(tenant_spec("late", "x")).await.unwrap();
    // Another holder has the step claimed when the request arrives.
    let claim = claim_step(&queue).await.expect("the step job");
    assert_eq!(
        runtime.status(&rid("late")).await.unwrap().unwrap().state,
        RunState::Running
    );
    // The request cannot know whether that holder honours it, so it waits
    // for the step to settle.
    let cancelling = {
        let runtime = runtime.clone();
        tokio::spawn(async move { runtime.cancel(&rid("late")).await })
    };
    eventually("the request to reach the claim", || async {
        claim.cancel_token().is_cancelled()
    })
    .await;
    assert_eq!(
        runtime.status(&rid("late")).await.unwrap().unwrap().state,
        RunState::Cancelling
    );
    assert!(!cancelling.is_finished());
    queue.nack(&claim, "handed back").await.unwrap();
    assert_eq!(
        runtime.status(&rid("late")).await.unwrap().unwrap().state,
        RunState::Cancelling,
        "a pending step of a cancelling run reports Cancelling"
    );

    let worker = runtime.spawn(std::future::pending::<()>());
    assert!(within(30, cancelling).await.unwrap().unwrap());
    let end = within(30, runtime.wait(&rid("late"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    assert_eq!(end.termination.error, None);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the runner was never called"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cancelling_an_unknown_or_terminated_run_is_false() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = verdicts_runtime(queue, store, Arc::default(), NoopTerminalHook);
    assert!(!runtime.cancel(&rid("nobody")).await.unwrap());
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = submit_and_wait(&runtime, "done", "ok").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(!runtime.cancel(&rid("done")).await.unwrap());
    let status = runtime.status(&rid("done")).await.unwrap().unwrap();
    assert_eq!(terminated(&status.state).status, TerminalStatus::Succeeded);
    // A cancelled run cannot be cancelled again either.
    submit_and_wait(&runtime, "twice", "cancel").await;
    assert!(!runtime.cancel(&rid("twice")).await.unwrap());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancel_racing_the_settlement_reports_how_the_run_ended() {
    let (queue, store, _clock) = memory_queue().await;
    let (returning, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Each run's runner announces it is about to return, then yields a
    // run-specific number of times before returning `Succeed` (or, for the
    // odd runs, `Continue` into a second step), so the cancellation lands
    // at a different point of the settlement each time.
    let runner = FnRunner(move |step: Step| {
        let returning = returning.clone();
        async move {
            let n: u32 = std::str::from_utf8(&step.payload)
                .expect("utf-8")
                .parse()
                .expect("number");
            if step.step_number == 0 {
                returning.send(step.run_id.to_string()).ok();
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
                if n % 2 == 1 {
                    return Ok(StepOutcome::continue_now(step.payload.clone()));
                }
            }
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut endings = HashMap::new();
    for n in 0..24u32 {
        let id = format!("race-{n}");
        runtime
            .submit(tenant_spec(&id, &n.to_string()))
            .await
            .unwrap();
        assert_eq!(within(10, seen.recv()).await.as_deref(), Some(id.as_str()));
        let cancelled = within(10, runtime.cancel(&rid(&id))).await.unwrap();
        let end = within(10, runtime.wait(&rid(&id))).await.unwrap();
        assert_eq!(
            cancelled,
            end.termination.status == TerminalStatus::Cancelled,
            "run {id}: cancel returned {cancelled} but the run ended {:?}",
            end.termination
        );
        if cancelled {
            assert_eq!(end.termination.error, None);
        }
        *endings.entry(cancelled).or_insert(0) += 1;
    }
    assert_eq!(endings.len(), 2, "both endings were exercised: {endings:?}");
    worker.shutdown().await.unwrap();
}

/// Decides a hook call from its index, the outcome and the effects.
type Script =
    Arc<dyn Fn(usize, &RunOutcome, &TerminalEffects) -> Result<(), StepError> + Send + Sync>;

/// A scripted terminal hook: `script(call_index, outcome, effects)` decides
/// each call; `observe` decides which outcomes are notified.
#[derive(Clone)]
struct ScriptedHook {
    calls: Arc<Mutex<Vec<RunOutcome>>>,
    script: Script,
    observe: Arc<dyn Fn(&RunOutcome) -> bool + Send + Sync>,
}

impl ScriptedHook {
    fn new(
        script: impl Fn(usize, &RunOutcome, &TerminalEffects) -> Result<(), StepError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            calls: Arc::default(),
            script: Arc::new(script),
            observe: Arc::new(|_| true),
        }
    }

    fn observing(mut self, observe: impl Fn(&RunOutcome) -> bool + Send + Sync + 'static) -> Self {
        self.observe = Arc::new(observe);
        self
    }

    fn calls(&self) -> Vec<RunOutcome> {
        self.calls.lock().expect("lock").clone()
    }
}

impl TerminalHook for ScriptedHook {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let index = {
            let mut calls = self.calls.lock().expect("lock");
            calls.push(outcome.clone());
            calls.len() - 1
        };
        (self.script)(index, outcome, effects)
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        (self.observe)(outcome)
    }
}

/// Runs the hook runtime over `queue` with the verdicts runner.
fn hooked(
    queue: Arc<Queue>,
    store: Arc<dyn taquba::object_store::ObjectStore>,
    hook: ScriptedHook,
) -> WorkflowRuntime<impl StepRunner + use<>, ScriptedHook> {
    verdicts_runtime(queue, store, Arc::default(), hook)
}

#[tokio::test(start_paused = true)]
async fn the_hook_sees_each_termination_once_with_its_headers_result_and_error() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|_, _, _| Ok(()));
    let runtime = hooked(queue, store, hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, input) in [("ok", "result"), ("failed", "fail"), ("perm", "permanent")] {
        submit_and_wait(&runtime, id, input).await;
    }
    eventually("three notifications", || async { hook.calls().len() >= 3 }).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut calls = hook.calls();
    assert_eq!(
        calls.len(),
        3,
        "one notification per termination: {calls:?}"
    );
    calls.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    let tenant = HashMap::from([("tenant".to_string(), "acme".to_string())]);
    assert_eq!(
        calls[0],
        RunOutcome {
            run_id: rid("failed"),
            status: TerminalStatus::Failed,
            result: None,
            error: Some("nope".into()),
            headers: tenant.clone(),
            final_step: 0,
        }
    );
    assert_eq!(calls[1].run_id, rid("ok"));
    assert_eq!(calls[1].status, TerminalStatus::Succeeded);
    assert_eq!(calls[1].result.as_deref(), Some(b"result".as_slice()));
    assert_eq!(calls[1].error, None);
    assert_eq!(calls[1].headers, tenant);
    assert_eq!(calls[2].run_id, rid("perm"));
    assert_eq!(calls[2].status, TerminalStatus::Failed);
    assert_eq!(calls[2].error.as_deref(), Some("boom"));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_does_not_observe_an_outcome_gets_no_notification_job() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|_, _, _| Ok(()))
        .observing(|outcome| outcome.headers.get("notify").map(String::as_str) != Some("no"));
    let runtime = hooked(queue.clone(), store, hook.clone());
    let quiet = |id: &str| RunSpec {
        options: RunOptions {
            headers: HashMap::from([("notify".to_string(), "no".to_string())]),
            ..Default::default()
        },
        ..tenant_spec(id, "x")
    };
    // A cancellation of a pending step commits the termination without a
    // worker, so the queue shows whether a notification job was created.
    runtime.submit(quiet("quiet")).await.unwrap();
    assert!(runtime.cancel(&rid("quiet")).await.unwrap());
    assert_eq!(queue.view().stats(STEPS).await.unwrap().pending, 0);
    runtime.submit(tenant_spec("loud", "x")).await.unwrap();
    assert!(runtime.cancel(&rid("loud")).await.unwrap());
    assert_eq!(queue.view().stats(STEPS).await.unwrap().pending, 1);

    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(quiet("quiet-run")).await.unwrap();
    within(30, runtime.wait(&rid("quiet-run"))).await.unwrap();
    eventually("the observed notification", || async {
        !hook.calls().is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].run_id, rid("loud"));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_transient_hook_error_is_retried_until_the_hook_succeeds() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|call, outcome, effects| {
        if call == 0 {
            effects.put("app/too-early", "x")?;
            return Err(StepError::transient("webhook down"));
        }
        effects.put(format!("app/notified/{}", outcome.run_id), "yes")?;
        Ok(())
    });
    let runtime = hooked(queue.clone(), store, hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("r", "x")).await.unwrap();
    eventually("the notification to commit", || async {
        queue
            .view()
            .kv_get(b"app/notified/r")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(hook.calls().len(), 2);
    assert!(
        queue
            .view()
            .kv_get(b"app/too-early")
            .await
            .unwrap()
            .is_none(),
        "a failed attempt's effects are not applied"
    );
    assert!(dead_jobs(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_permanent_hook_error_dead_letters_the_notification() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|_, _, _| Err(StepError::permanent("bad callback url")));
    let runtime = hooked(queue.clone(), store, hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    let end = submit_and_wait(&runtime, "r", "x").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the notification to dead-letter", || async {
        !dead_jobs(&queue).await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let dead = dead_jobs(&queue).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].headers.get(HEADER_TERMINAL).map(String::as_str),
        Some("succeeded")
    );
    assert_eq!(dead[0].last_error.as_deref(), Some("bad callback url"));
    assert_eq!(hook.calls().len(), 1, "no retry of a permanent error");
    let status = runtime.status(&rid("r")).await.unwrap().unwrap();
    assert_eq!(
        terminated(&status.state).status,
        TerminalStatus::Succeeded,
        "a dead notification does not change the run"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn terminal_effects_commit_with_the_notification() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|_, outcome, effects| {
        effects.put(
            format!("app/outcome/{}", outcome.run_id),
            outcome.status.as_str(),
        )?;
        effects.delete("app/pending")?;
        effects.enqueue(EnqueueRequest {
            queue: "followups".into(),
            payload: outcome.run_id.as_bytes().to_vec(),
            options: EnqueueOptions::default(),
        })?;
        Ok(())
    });
    let runtime = hooked(queue.clone(), store, hook.clone());
    queue.kv_put(b"app/pending", b"1").await.unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("r", "x")).await.unwrap();
    eventually("the notification to commit", || async {
        queue
            .view()
            .kv_get(b"app/outcome/r")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    assert_eq!(
        queue
            .view()
            .kv_get(b"app/outcome/r")
            .await
            .unwrap()
            .as_deref(),
        Some(b"succeeded".as_slice())
    );
    assert!(queue.view().kv_get(b"app/pending").await.unwrap().is_none());
    let followup = queue
        .claim("followups", Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the follow-up job");
    assert_eq!(followup.payload, b"r");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_hook_is_retried() {
    let (queue, store, _clock) = memory_queue().await;
    let hook = ScriptedHook::new(|call, _, effects| {
        if call == 0 {
            panic!("the hook fell over");
        }
        effects.put("app/hooked", "1")?;
        Ok(())
    });
    let runtime = hooked(queue.clone(), store, hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(tenant_spec("r", "x")).await.unwrap();
    eventually("the retried notification to commit", || async {
        queue.view().kv_get(b"app/hooked").await.unwrap().is_some()
    })
    .await;
    assert_eq!(hook.calls().len(), 2);
    assert!(dead_jobs(&queue).await.is_empty());
    // The worker still serves runs.
    submit_and_wait(&runtime, "after", "x").await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_dead_lettered_by_the_reaper_notifies_once() {
    let (queue, store, clock) = memory_queue().await;
    let hook = ScriptedHook::new(|_, _, _| Ok(()));
    let runtime = hooked(queue.clone(), store, hook.clone());
    runtime
        .submit(RunSpec {
            options: RunOptions {
                max_attempts_per_step: Some(1),
                headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
                ..Default::default()
            },
            ..tenant_spec("reaped", "x")
        })
        .await
        .unwrap();
    // A holder that stops renewing its lease on the last attempt.
    let claim = queue
        .claim(STEPS, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the step job");
    clock.advance(Duration::from_secs(2));
    queue.reap_now().await.unwrap();
    drop(claim);
    assert_eq!(dead_jobs(&queue).await.len(), 1);

    let worker = runtime.spawn(std::future::pending::<()>());
    let end = within(30, runtime.wait(&rid("reaped"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert_eq!(end.termination.error_kind, None);
    assert!(end.termination.error.is_some());
    assert!(end.outcome.is_none());
    eventually("the notification", || async { !hook.calls().is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let calls = hook.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, TerminalStatus::Failed);
    assert_eq!(calls[0].error, end.termination.error);
    assert_eq!(
        calls[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_notification_retries_up_to_the_terminal_steps_attempt_limit() {
    let (queue, store, _clock) = memory_queue().await;
    // The queue's default is three attempts; the run's steps have five.
    let hook = ScriptedHook::new(|call, _, effects| {
        if call < 4 {
            return Err(StepError::transient(format!("down {call}")));
        }
        effects.put("app/finally", "1")?;
        Ok(())
    });
    let runtime = hooked(queue.clone(), store, hook.clone());
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            options: RunOptions {
                max_attempts_per_step: Some(5),
                ..Default::default()
            },
            ..tenant_spec("patient", "x")
        })
        .await
        .unwrap();
    eventually("the fifth attempt to commit", || async {
        queue.view().kv_get(b"app/finally").await.unwrap().is_some()
    })
    .await;
    assert_eq!(hook.calls().len(), 5);
    assert!(dead_jobs(&queue).await.is_empty());
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_external_cancel_overrides_a_step_error() {
    let (queue, store, _clock) = memory_queue().await;
    let gate = Gate::default();
    let calls = Arc::new(AtomicU32::new(0));
    let (events, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let runner = {
        let (gate, calls) = (gate.clone(), calls.clone());
        FnRunner(move |step: Step| {
            let (gate, calls, events) = (gate.clone(), calls.clone(), events.clone());
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                events.send(Event::Started(step.step_number)).ok();
                gate.wait().await;
                step.effects.put(format!("app/{}", step.run_id), "x")?;
                match step.payload.as_slice() {
                    b"transient" => Err(StepError::transient("would retry")),
                    _ => Err(StepError::permanent("would dead-letter")),
                }
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for id in ["transient", "permanent"] {
        runtime.submit(tenant_spec(id, id)).await.unwrap();
        assert_eq!(within(10, seen.recv()).await, Some(Event::Started(0)));
        assert!(runtime.cancel(&rid(id)).await.unwrap());
        assert!(
            runtime.outcome(&rid(id)).await.unwrap().is_none(),
            "still active"
        );
        gate.open();
        let end = within(10, runtime.wait(&rid(id))).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Cancelled, "{id}");
        assert_eq!(end.termination.error, None, "{id}");
        assert_eq!(end.termination.error_kind, None, "{id}");
        assert!(
            queue
                .view()
                .kv_get(format!("app/{id}").as_bytes())
                .await
                .unwrap()
                .is_none()
        );
        gate.close();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "no retry after the cancellation"
    );
    assert!(dead_jobs(&queue).await.is_empty(), "no dead letter either");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancel_from_another_runtime_reports_how_the_run_ended() {
    let (queue, store, _clock) = memory_queue().await;
    let (returning, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    let runner = FnRunner(move |step: Step| {
        let returning = returning.clone();
        async move {
            returning.send(step.run_id.to_string()).ok();
            let n: u32 = std::str::from_utf8(&step.payload)
                .expect("utf-8")
                .parse()
                .expect("number");
            tokio::time::sleep(Duration::from_millis(u64::from(n / 10))).await;
            for _ in 0..n % 10 {
                tokio::task::yield_now().await;
            }
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    let worker_runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook).build();
    // A second runtime over the same queue: it submits and cancels, and
    // runs no worker.
    let front = verdicts_runtime(queue, store, Arc::default(), NoopTerminalHook);
    let worker = worker_runtime.spawn(std::future::pending::<()>());
    let mut endings = HashMap::new();
    for n in 0..40u32 {
        let id = format!("front-{n}");
        front
            .submit(tenant_spec(&id, &n.to_string()))
            .await
            .unwrap();
        // The runner returns after a run-specific delay, so the request
        // lands before, during and after the step's settlement.
        assert_eq!(within(10, seen.recv()).await.as_deref(), Some(id.as_str()));
        let cancelled = within(10, front.cancel(&rid(&id))).await.unwrap();
        let end = within(10, worker_runtime.wait(&rid(&id))).await.unwrap();
        assert_eq!(
            cancelled,
            end.termination.status == TerminalStatus::Cancelled,
            "run {id}: cancel returned {cancelled} but the run ended {:?}",
            end.termination
        );
        *endings.entry(cancelled).or_insert(0) += 1;
    }
    assert_eq!(endings.len(), 2, "both endings were exercised: {endings:?}");
    worker.shutdown().await.unwrap();
}

/// An urgent run's terminal notification has the run's priority: with a
/// backlog of less urgent runs queued before it ends, its hook is called
/// before the backlog's steps run, not after them (issue 22).
#[tokio::test(start_paused = true)]
async fn a_notification_has_the_priority_of_its_run() {
    let (queue, store, _clock) = memory_queue().await;
    // What ran, in order: `step:{run}` for each runner call,
    // `hook:{run}` for each hook call.
    let order = Arc::new(Mutex::new(Vec::<String>::new()));
    let steps = order.clone();
    let runner = FnRunner(move |step: Step| {
        steps
            .lock()
            .expect("order lock")
            .push(format!("step:{}", step.run_id));
        async move {
            // A backlog step takes a while, so the urgent run's settlement
            // (and its notification) commits while the backlog waits.
            if step.run_id.starts_with("backlog") {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(StepOutcome::Succeed { result: vec![] })
        }
    });
    struct OrderHook(Arc<Mutex<Vec<String>>>);
    impl TerminalHook for OrderHook {
        async fn on_termination(
            &self,
            outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> Result<(), StepError> {
            self.0
                .lock()
                .expect("order lock")
                .push(format!("hook:{}", outcome.run_id));
            Ok(())
        }
    }
    let runtime = WorkflowRuntime::builder(queue, store, runner, OrderHook(order.clone()))
        .max_concurrent_steps(1)
        .build();
    // The backlog, at the queue's default priority, queued first.
    for n in 0..20 {
        runtime
            .submit(tenant_spec(&format!("backlog-{n:02}"), "ok"))
            .await
            .expect("submit backlog");
    }
    let mut urgent = tenant_spec("urgent", "ok");
    urgent.options.priority = Some(0);
    runtime.submit(urgent).await.expect("submit urgent");

    let worker = runtime.spawn(std::future::pending::<()>());
    within(60, runtime.wait(&rid("urgent")))
        .await
        .expect("urgent ends");
    eventually("the urgent run's hook ran", || async {
        order
            .lock()
            .expect("order lock")
            .iter()
            .any(|e| e == "hook:urgent")
    })
    .await;
    let order = order.lock().expect("order lock").clone();
    let hook_at = order
        .iter()
        .position(|e| e == "hook:urgent")
        .expect("the urgent run's hook ran");
    let backlog_before = order[..hook_at]
        .iter()
        .filter(|e| e.starts_with("step:backlog"))
        .count();
    // The urgent run's step runs first (priority 0); its notification,
    // at the same priority, is claimed before the 20 queued backlog steps.
    // A backlog step or two may be claimed while the urgent run's
    // settlement commits.
    assert!(
        backlog_before <= 2,
        "{backlog_before} backlog steps ran before the urgent run's hook: {order:?}"
    );
    worker.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------------------
// A cancel racing every ending.

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
        Scripted::default(),
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
        Scripted::default(),
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
