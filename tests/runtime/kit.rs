//! The test kit (`taquba_workflow::testing`) at its public API: steps run
//! only inside `run_until_idle` and every call is counted; `advance` fires
//! timers, signal timeouts and retry backoffs at their due time and not a
//! millisecond before; `crash` redelivers a step in flight and keeps what
//! committed (a terminal notification included); `fail_next` injects one
//! failure per delivery by step name; a step that never returns is
//! reported; jobs share the verbs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use taquba_workflow::jobs::{Job, JobContext};
use taquba_workflow::testing::{TEST_EPOCH_MS, TestError, TestJobs, TestRuntime};
use taquba_workflow::{
    AttemptOutcome, RunOptions, RunSpec, RunState, Step, StepError, StepErrorKind, StepOutcome,
    StepRunner, TerminalStatus,
};

use crate::common::{Recorder, rid};

const SECOND: Duration = Duration::from_secs(1);

/// What a run's payload asks of step `n`: a list of step kinds, one per
/// step, as text (`now`, `timer`, `wait`, `block`, `done`).
#[derive(Default)]
struct Script {
    /// Calls of each step number.
    calls: [AtomicU32; 8],
    /// Fired when a `block` step starts.
    started: tokio::sync::Notify,
}

impl Script {
    fn calls(&self, step: usize) -> u32 {
        self.calls[step].load(Ordering::SeqCst)
    }
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let n = step.step_number as usize;
        let call = self.calls[n].fetch_add(1, Ordering::SeqCst) + 1;
        let script = String::from_utf8_lossy(&step.payload).to_string();
        let kind = script.split(',').nth(n).unwrap_or("done").to_string();
        let next = step.payload.clone();
        match kind.as_str() {
            "now" => Ok(StepOutcome::continue_now(next)),
            "timer" => Ok(StepOutcome::continue_after(next, 60 * SECOND)),
            "wait" => Ok(StepOutcome::continue_on_signal(next, "key", 600 * SECOND)),
            // Blocks on its first call only.
            "block" if call == 1 => {
                self.started.notify_one();
                std::future::pending().await
            }
            "block" => Ok(StepOutcome::continue_now(next)),
            _ => Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"none".to_vec()),
            }),
        }
    }

    fn step_name(&self, step_number: u32, payload: &[u8]) -> Option<String> {
        let script = String::from_utf8_lossy(payload).to_string();
        script
            .split(',')
            .nth(step_number as usize)
            .map(str::to_string)
    }
}

fn spec(id: &str, script: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: script.as_bytes().to_vec(),
        ..Default::default()
    }
}

async fn state_of<R: StepRunner + 'static, H: taquba_workflow::TerminalHook + 'static>(
    env: &TestRuntime<R, H>,
    id: &str,
) -> RunState {
    env.runtime()
        .unwrap()
        .status(&rid(id))
        .await
        .unwrap()
        .expect("a known run")
        .state
}

fn terminated(state: &RunState) -> Option<TerminalStatus> {
    match state {
        RunState::Terminated(termination) => Some(termination.status),
        _ => None,
    }
}

#[tokio::test(start_paused = true)]
async fn steps_run_only_inside_run_until_idle_and_every_call_is_counted() {
    let env = TestRuntime::new(Script::default()).await.unwrap();
    env.submit(spec("r", "now,now,done")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(env.runner().calls(0), 0, "nothing runs until asked");
    assert_eq!(env.run_until_idle().await.unwrap(), 3);
    assert_eq!(
        terminated(&state_of(&env, "r").await),
        Some(TerminalStatus::Succeeded)
    );
    assert_eq!(env.run_until_idle().await.unwrap(), 0, "nothing is due");
    let history = env.history(&rid("r")).await.unwrap();
    let names: Vec<_> = history.steps.iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, ["now", "now", "done"]);
    assert!(
        history
            .steps
            .iter()
            .flat_map(|s| &s.attempts)
            .all(|a| a.claimed_at_ms == Some(TEST_EPOCH_MS)),
        "the clock did not move: {history:?}"
    );
    assert!(matches!(
        env.history(&rid("never")).await,
        Err(TestError::UnknownRun(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn advance_fires_timers_signal_timeouts_and_backoffs_when_due_and_not_before() {
    let env = TestRuntime::builder(Script::default())
        .retry_backoff(10 * SECOND, 60 * SECOND)
        .build()
        .await
        .unwrap();
    env.submit(spec("r", "timer,wait,done")).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    assert_eq!(
        env.advance(59 * SECOND).await.unwrap(),
        0,
        "the timer is 60 s"
    );
    assert_eq!(env.advance(SECOND).await.unwrap(), 1, "the timer fired");
    assert_eq!(
        env.advance(599 * SECOND).await.unwrap(),
        0,
        "the signal wait is 600 s"
    );
    // The timeout runs step 2 with no signal; its first delivery fails and
    // retries after the 10 s backoff.
    env.fail_next("done", StepError::transient("flaky"));
    assert_eq!(env.advance(SECOND).await.unwrap(), 1, "the timeout fired");
    assert_eq!(state_of(&env, "r").await, RunState::Pending);
    assert_eq!(env.advance(9 * SECOND).await.unwrap(), 0);
    assert_eq!(env.advance(SECOND).await.unwrap(), 1, "the retry ran");
    let run = env.runtime().unwrap();
    let outcome = run.outcome(&rid("r")).await.unwrap().expect("ended");
    assert_eq!(outcome.result.as_deref(), Some(b"none".as_slice()));
    let history = env.history(&rid("r")).await.unwrap();
    let retried = &history.steps[2].attempts;
    assert_eq!(
        retried[0].outcome,
        AttemptOutcome::Retried {
            error: "flaky".into()
        }
    );
    assert_eq!(retried[1].claimed_at_ms, Some(TEST_EPOCH_MS + 670_000));
}

#[tokio::test(start_paused = true)]
async fn a_signal_wakes_the_waiting_step_at_the_next_run_until_idle() {
    let env = TestRuntime::new(Script::default()).await.unwrap();
    env.submit(spec("r", "wait,done")).await.unwrap();
    env.run_until_idle().await.unwrap();
    env.signal_raw("key", b"yes".to_vec()).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    let outcome = env
        .runtime()
        .unwrap()
        .outcome(&rid("r"))
        .await
        .unwrap()
        .expect("ended");
    assert_eq!(outcome.result.as_deref(), Some(b"yes".as_slice()));
}

#[tokio::test(start_paused = true)]
async fn a_crash_redelivers_the_step_in_flight_and_keeps_what_committed() {
    let env = TestRuntime::new(Script::default()).await.unwrap();
    env.submit(spec("r", "now,block,done")).await.unwrap();
    tokio::select! {
        _ = env.run_until_idle() => panic!("step 1 blocks"),
        () = env.runner().started.notified() => {}
    }
    env.crash().await.unwrap();
    assert_eq!(
        env.run_until_idle().await.unwrap(),
        2,
        "step 1 again, step 2"
    );
    assert_eq!(
        (
            env.runner().calls(0),
            env.runner().calls(1),
            env.runner().calls(2)
        ),
        (1, 2, 1),
        "step 0 committed before the crash and never ran again"
    );
    let history = env.history(&rid("r")).await.unwrap();
    let step1: Vec<_> = history.steps[1]
        .attempts
        .iter()
        .map(|a| (a.attempt, a.outcome.clone()))
        .collect();
    assert_eq!(
        step1,
        [
            (1, AttemptOutcome::Interrupted),
            (
                2,
                AttemptOutcome::Continued {
                    delay_ms: None,
                    signal: None
                }
            )
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_crash_on_the_last_attempt_fails_the_run_by_reconciliation() {
    let env = TestRuntime::builder(Script::default())
        .max_attempts(1)
        .build()
        .await
        .unwrap();
    env.submit(spec("r", "block,done")).await.unwrap();
    tokio::select! {
        _ = env.run_until_idle() => panic!("step 0 blocks"),
        () = env.runner().started.notified() => {}
    }
    env.crash().await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 0);
    assert_eq!(
        terminated(&state_of(&env, "r").await),
        Some(TerminalStatus::Failed)
    );
    let history = env.history(&rid("r")).await.unwrap();
    assert!(
        matches!(
            history.steps[0].attempts.last().map(|a| &a.outcome),
            Some(AttemptOutcome::DeadLettered { .. })
        ),
        "{history:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn what_run_until_idle_committed_survives_a_crash_notifications_included() {
    let env = TestRuntime::with_hook(Script::default(), Recorder::default())
        .await
        .unwrap();
    for id in ["a", "b", "c"] {
        env.submit(spec(id, "now,done")).await.unwrap();
    }
    assert_eq!(env.run_until_idle().await.unwrap(), 6);
    assert_eq!(env.hook().calls().len(), 3, "one notification per run");
    env.crash().await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 0);
    assert_eq!(env.hook().calls().len(), 3, "none is delivered again");
    assert_eq!(env.runner().calls(0), 3);
}

#[tokio::test(start_paused = true)]
async fn fail_next_fails_one_delivery_per_queued_error_by_step_name() {
    let env = TestRuntime::builder(Script::default())
        .retry_backoff(Duration::ZERO, Duration::ZERO)
        .build()
        .await
        .unwrap();
    env.fail_next("done", StepError::transient("one"));
    env.fail_next("done", StepError::transient("two"));
    env.submit(spec("r", "now,done")).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 4);
    assert_eq!(env.runner().calls(1), 1, "two deliveries never reached it");
    let attempts: Vec<_> = env.history(&rid("r")).await.unwrap().steps[1]
        .attempts
        .iter()
        .map(|a| a.outcome.clone())
        .collect();
    assert_eq!(
        attempts,
        [
            AttemptOutcome::Retried {
                error: "one".into()
            },
            AttemptOutcome::Retried {
                error: "two".into()
            },
            AttemptOutcome::Succeeded
        ]
    );

    env.fail_next("now", StepError::permanent("refused"));
    env.submit(spec("p", "now,done")).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    let state = state_of(&env, "p").await;
    let RunState::Terminated(termination) = state else {
        panic!("the run ended: {state:?}");
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    assert_eq!(termination.error.as_deref(), Some("refused"));
    assert_eq!(termination.error_kind, Some(StepErrorKind::Permanent));
}

#[tokio::test(start_paused = true)]
async fn a_step_that_never_returns_is_reported_not_waited_for_forever() {
    let env = TestRuntime::builder(Script::default())
        .idle_timeout(5 * SECOND)
        .build()
        .await
        .unwrap();
    env.submit(spec("r", "block")).await.unwrap();
    match env.run_until_idle().await {
        Err(TestError::NotIdle {
            claimed, pending, ..
        }) => assert_eq!((claimed, pending), (1, 0)),
        other => panic!("expected NotIdle, got {other:?}"),
    }
}

/// Counts its calls in the runner state; fails transiently until `ok_at`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Charge {
    cents: u64,
    ok_at: u32,
}

#[derive(Default)]
struct Charges(AtomicU32);

impl Job for Charge {
    const NAME: &'static str = "billing.charge";
    type Output = String;
    type Error = String;

    async fn run(&self, ctx: JobContext<'_>) -> Result<String, String> {
        ctx.state::<Arc<Charges>>().0.fetch_add(1, Ordering::SeqCst);
        if ctx.attempts < self.ok_at {
            return Err(format!("gateway timeout on attempt {}", ctx.attempts));
        }
        Ok(format!("charged {}", self.cents))
    }
}

#[tokio::test(start_paused = true)]
async fn jobs_retry_after_their_backoff_and_crash_like_workflows() {
    let charges = Arc::new(Charges::default());
    let env = TestJobs::builder()
        .register::<Charge>()
        .state(charges.clone())
        .retry_backoff(5 * SECOND, 60 * SECOND)
        .build()
        .await
        .unwrap();
    let job = env
        .submit(Charge {
            cents: 500,
            ok_at: 2,
        })
        .await
        .unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    assert!(matches!(job.output().await, Err(TestError::NotEnded(_))));
    env.crash().await.unwrap();
    assert_eq!(
        env.advance(4 * SECOND).await.unwrap(),
        0,
        "the backoff survives"
    );
    assert_eq!(env.advance(SECOND).await.unwrap(), 1);
    assert_eq!(job.output().await.unwrap(), "charged 500");
    assert_eq!(
        charges.0.load(Ordering::SeqCst),
        2,
        "state outlives crashes"
    );

    env.fail_next(Charge::NAME, StepError::permanent("card declined"));
    let declined = env
        .submit_with(Charge { cents: 1, ok_at: 1 }, RunOptions::default())
        .await
        .unwrap();
    env.run_until_idle().await.unwrap();
    match declined.output().await {
        Err(TestError::JobFailed { error, .. }) => {
            assert_eq!(error.kind, StepErrorKind::Permanent);
            assert_eq!(error.message, "card declined");
        }
        other => panic!("expected a failed job, got {other:?}"),
    }
    let steps = declined.history().await.unwrap().steps;
    assert_eq!(steps[0].name, Charge::NAME);
}
