//! The test kit (`taquba_workflow::testing`) at its public API: steps run
//! only inside `run_until_idle` and every call is counted; `advance` fires
//! timers, signal timeouts and retry backoffs at their due time and not a
//! millisecond before, and everything due inside one window at its own
//! time, in time order (retries, notification retries and leases
//! included); `run_until_ended` and `run_to_completion` skip time, all
//! three bounded by the hop cap; `crash` redelivers a step in flight and
//! keeps what committed (a terminal notification included), and a crash on
//! the last attempt records the interrupted claim; `fail_next` injects one
//! failure per delivery by step name, refuses a name no step has and
//! reports those never used; `NotEnded` says what a run waits for; a step
//! that never returns is reported; jobs share the verbs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use taquba_workflow::jobs::{Job, JobContext};
use taquba_workflow::testing::{TEST_EPOCH_MS, TestError, TestJobs, TestRuntime, Waiting};
use taquba_workflow::workflows::{StepContext, Transition, Workflows};
use taquba_workflow::{
    RunOptions, RunSpec, RunState, Step, StepError, StepErrorKind, StepOutcome, StepRunner,
    TerminalStatus, history::AttemptOutcome, job, workflow,
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
    env.fail_next("done", StepError::transient("flaky"))
        .unwrap();
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

/// A crash on the last attempt: the run fails by reconciliation, and the
/// history records the attempt as interrupted, with its claim time and the
/// retry before it, as the same crash on an earlier attempt is recorded.
#[tokio::test(start_paused = true)]
async fn a_crash_on_the_last_attempt_fails_the_run_and_records_the_interrupted_claim() {
    let env = TestRuntime::builder(Script::default())
        .max_attempts(2)
        .retry_backoff(10 * SECOND, 10 * SECOND)
        .build()
        .await
        .unwrap();
    env.fail_next("block", StepError::transient("warming up"))
        .unwrap();
    env.submit(spec("r", "block,done")).await.unwrap();
    env.run_until_idle().await.unwrap();
    // The retry, 10 s later, blocks; the process dies.
    tokio::select! {
        _ = env.advance(10 * SECOND) => panic!("step 0 blocks"),
        () = env.runner().started.notified() => {}
    }
    env.crash().await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 0);
    let state = state_of(&env, "r").await;
    let RunState::Terminated(termination) = &state else {
        panic!("the run ended: {state:?}");
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    assert_eq!(
        termination.error.as_deref(),
        Some("claim interrupted by process exit")
    );
    let history = env.history(&rid("r")).await.unwrap();
    assert_retried_then_interrupted(&history.steps[0]);
}

/// A step's attempts after a retry at +0 s and a crash on the last attempt
/// at +10 s: the retry, then the interrupted claim with its claim time.
fn assert_retried_then_interrupted(step: &taquba_workflow::history::StepHistory) {
    let attempts: Vec<_> = step
        .attempts
        .iter()
        .map(|a| (a.attempt, a.claimed_at_ms, a.outcome.clone()))
        .collect();
    assert_eq!(
        attempts,
        [
            (
                1,
                Some(TEST_EPOCH_MS),
                AttemptOutcome::Retried {
                    error: "warming up".into()
                }
            ),
            (2, Some(TEST_EPOCH_MS + 10_000), AttemptOutcome::Interrupted),
        ]
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
    env.fail_next("done", StepError::transient("one")).unwrap();
    env.fail_next("done", StepError::transient("two")).unwrap();
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

    env.fail_next("now", StepError::permanent("refused"))
        .unwrap();
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
    assert!(matches!(
        job.output().await,
        Err(TestError::NotEnded { .. })
    ));
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

    env.fail_next(Charge::NAME, StepError::permanent("card declined"))
        .unwrap();
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

/// Fails on its first attempt; hangs on the next (until the process dies),
/// telling the test it started through the state's `Notify`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Hang;

impl Job for Hang {
    const NAME: &'static str = "hang";
    type Output = ();
    type Error = String;

    async fn run(&self, ctx: JobContext<'_>) -> Result<(), String> {
        if ctx.attempts < 2 {
            return Err("warming up".into());
        }
        ctx.state::<Arc<tokio::sync::Notify>>().notify_one();
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_job_crashed_on_its_last_attempt_records_the_interrupted_claim_as_a_workflow_does() {
    let started = Arc::new(tokio::sync::Notify::new());
    let env = TestJobs::builder()
        .register::<Hang>()
        .state(started.clone())
        .max_attempts(2)
        .retry_backoff(10 * SECOND, 10 * SECOND)
        .build()
        .await
        .unwrap();
    let job = env.submit(Hang).await.unwrap();
    env.run_until_idle().await.unwrap();
    tokio::select! {
        _ = env.advance(10 * SECOND) => panic!("the retry hangs"),
        () = started.notified() => {}
    }
    env.crash().await.unwrap();
    env.run_until_idle().await.unwrap();
    match job.output().await {
        Err(TestError::JobFailed { error, .. }) => {
            assert_eq!(error.message, "claim interrupted by process exit");
        }
        other => panic!("expected a failed job, got {other:?}"),
    }
    let steps = job.history().await.unwrap().steps;
    assert_retried_then_interrupted(&steps[0]);
}

// Time skipping: `advance(d)` lets `d` pass, everything due in it running
// at its own time; running until a run ends; the hop cap.

const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

/// Fails transiently on its first two calls (the issue's flaky card job).
#[job(name = "kit.flaky", max_attempts = 5)]
async fn flaky(ctx: JobContext<'_>, card: String) -> Result<String, String> {
    if ctx.attempts < 3 {
        return Err(format!("gateway timeout on attempt {}", ctx.attempts));
    }
    Ok(format!("charged {card}"))
}

/// The claim times of every attempt of every step of a history, in ms
/// after the epoch.
fn claim_offsets(history: &taquba_workflow::history::RunHistory) -> Vec<Vec<Option<u64>>> {
    history
        .steps
        .iter()
        .map(|step| {
            step.attempts
                .iter()
                .map(|a| a.claimed_at_ms.map(|at| at - TEST_EPOCH_MS))
                .collect()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn one_advance_runs_every_retry_that_falls_due_in_it_each_at_its_own_time() {
    let env = TestJobs::builder()
        .register::<Flaky>()
        .build()
        .await
        .unwrap();
    let job = env
        .submit(Flaky {
            card: "4242".into(),
        })
        .await
        .unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    match job.output().await {
        Err(TestError::NotEnded {
            step,
            waiting:
                Waiting::Retry {
                    attempts,
                    error,
                    due_at_ms,
                },
            ..
        }) => {
            assert_eq!(step.as_deref(), Some("kit.flaky"));
            assert_eq!(attempts, 1);
            assert_eq!(error.as_deref(), Some("gateway timeout on attempt 1"));
            assert_eq!(due_at_ms, TEST_EPOCH_MS + 1_000, "the 1 s backoff");
        }
        other => panic!("expected a retry backoff, got {other:?}"),
    }
    // Attempt 2 at +1 s fails, and schedules attempt 3 at +3 s: inside the
    // window, so it runs too.
    assert_eq!(env.advance(600 * SECOND).await.unwrap(), 2);
    assert_eq!(job.output().await.unwrap(), "charged 4242");
    assert_eq!(
        env.now_ms(),
        TEST_EPOCH_MS + 600_000,
        "the clock ends at now + d"
    );
    let history = job.history().await.unwrap();
    assert_eq!(
        claim_offsets(&history),
        [[Some(0), Some(1_000), Some(3_000)]]
    );
}

/// Three one-minute timers, then the run ends with how many fired.
struct Ticks;

#[workflow(name = "kit.ticks", output = u32)]
impl Ticks {
    #[step(start)]
    async fn first(n: u32) -> Result<Transition<TicksStep>, StepError> {
        Ok(Transition::after(TicksStep::Second { n: n + 1 }, MINUTE))
    }

    #[step]
    async fn second(n: u32) -> Result<Transition<TicksStep>, StepError> {
        Ok(Transition::after(TicksStep::Third { n: n + 1 }, MINUTE))
    }

    #[step]
    async fn third(n: u32) -> Result<Transition<TicksStep>, StepError> {
        Ok(Transition::after(TicksStep::Fourth { n: n + 1 }, MINUTE))
    }

    #[step]
    async fn fourth(n: u32) -> Result<Transition<TicksStep>, StepError> {
        Ok(Transition::done(n))
    }
}

#[tokio::test(start_paused = true)]
async fn timers_inside_one_advance_each_fire_at_their_own_due_time() {
    let env = TestRuntime::new(Ticks).await.unwrap();
    let run = env.start(TicksInput { n: 0 }).await.unwrap();
    assert_eq!(env.advance(HOUR).await.unwrap(), 4);
    assert_eq!(run.output().await.unwrap(), 3);
    let history = run.history().await.unwrap();
    let names: Vec<_> = history.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["first", "second", "third", "fourth"]);
    assert_eq!(
        claim_offsets(&history),
        [[Some(0)], [Some(60_000)], [Some(120_000)], [Some(180_000)]],
        "each step is claimed at its timer's due time, not at the window's end"
    );
    assert_eq!(env.now_ms(), TEST_EPOCH_MS + 3_600_000);
}

#[tokio::test(start_paused = true)]
async fn advance_zero_runs_what_is_due_now_and_nothing_later() {
    let env = TestRuntime::new(Ticks).await.unwrap();
    let run = env.start(TicksInput { n: 0 }).await.unwrap();
    assert_eq!(
        env.advance(Duration::ZERO).await.unwrap(),
        1,
        "`first` is due now"
    );
    assert_eq!(env.now_ms(), TEST_EPOCH_MS);
    assert_eq!(env.advance(Duration::ZERO).await.unwrap(), 0);
    assert_eq!(
        env.advance(MINUTE - Duration::from_millis(1))
            .await
            .unwrap(),
        0
    );
    assert_eq!(env.advance(Duration::from_millis(1)).await.unwrap(), 1);
    assert!(matches!(
        run.output().await,
        Err(TestError::NotEnded {
            waiting: Waiting::Timer { .. },
            ..
        })
    ));
}

/// Waits a timer of an hour, then 30 minutes for a signal; ends with
/// whether it came.
struct Reminder;

#[workflow(name = "kit.reminder", output = bool)]
impl Reminder {
    #[step(start)]
    async fn schedule(who: String) -> Result<Transition<ReminderStep>, StepError> {
        Ok(Transition::after(ReminderStep::Remind { who }, HOUR))
    }

    #[step]
    async fn remind(who: String) -> Result<Transition<ReminderStep>, StepError> {
        let key = format!("ack:{who}");
        Ok(Transition::on_signal(
            ReminderStep::Close { who },
            key,
            30 * MINUTE,
        ))
    }

    #[step]
    async fn close(
        ctx: StepContext<'_>,
        who: String,
    ) -> Result<Transition<ReminderStep>, StepError> {
        let _ = who;
        Ok(Transition::done(ctx.signal_value::<bool>()?.is_some()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_timer_and_the_signal_timeout_after_it_both_fire_inside_one_advance() {
    let env = TestRuntime::new(Reminder).await.unwrap();
    let run = env
        .start(ReminderInput { who: "ada".into() })
        .await
        .unwrap();
    env.advance(90 * MINUTE).await.unwrap();
    assert!(!run.output().await.unwrap(), "the wait timed out");
    assert_eq!(
        claim_offsets(&run.history().await.unwrap()),
        [[Some(0)], [Some(3_600_000)], [Some(5_400_000)]],
        "the timer at +3600 s, the 30 min timeout counted from it"
    );
}

#[tokio::test(start_paused = true)]
async fn not_ended_says_what_the_run_waits_for() {
    let env = TestRuntime::new(Reminder).await.unwrap();
    let run = env
        .start(ReminderInput { who: "ada".into() })
        .await
        .unwrap();
    match run.output().await {
        Err(TestError::NotEnded { waiting, .. }) => assert_eq!(waiting, Waiting::Due),
        other => panic!("expected NotEnded, got {other:?}"),
    }
    env.run_until_idle().await.unwrap();
    match run.output().await {
        Err(TestError::NotEnded {
            run_id,
            step,
            waiting,
            now_ms,
        }) => {
            assert_eq!(&run_id, run.id());
            assert_eq!(step.as_deref(), Some("remind"));
            assert_eq!(
                waiting,
                Waiting::Timer {
                    due_at_ms: TEST_EPOCH_MS + 3_600_000
                }
            );
            assert_eq!(now_ms, TEST_EPOCH_MS);
        }
        other => panic!("expected NotEnded, got {other:?}"),
    }
    env.advance(HOUR).await.unwrap();
    let err = run.output().await.unwrap_err();
    let TestError::NotEnded { step, waiting, .. } = &err else {
        panic!("expected NotEnded, got {err:?}");
    };
    assert_eq!(step.as_deref(), Some("close"));
    assert_eq!(
        waiting,
        &Waiting::Signal {
            correlation_key: "ack:ada".into(),
            timeout_at_ms: Some(TEST_EPOCH_MS + 5_400_000)
        }
    );
    let text = err.to_string();
    assert!(
        text.contains("step `close` waits for a signal under `ack:ada`, or its timeout at 1700005400000 ms (in 1800 s)"),
        "{text}"
    );
}

/// Ends when its signal comes or times out, logging the order in which
/// runs reached their last step.
#[derive(Default)]
struct Race {
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

#[workflow(name = "kit.race", output = ())]
impl Race {
    /// `wait`: a signal wait of 10 min; else a 20 min timer.
    #[step(start)]
    async fn begin(kind: String) -> Result<Transition<RaceStep>, StepError> {
        if kind == "wait" {
            Ok(Transition::on_signal(
                RaceStep::Finish { kind },
                "never",
                10 * MINUTE,
            ))
        } else {
            Ok(Transition::after(RaceStep::Finish { kind }, 20 * MINUTE))
        }
    }

    #[step]
    async fn finish(&self, kind: String) -> Result<Transition<RaceStep>, StepError> {
        self.log.lock().unwrap().push(kind);
        Ok(Transition::done(()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_signal_timeout_due_before_a_timer_in_the_same_window_fires_first() {
    let env = TestRuntime::new(Race::default()).await.unwrap();
    // The timer's run first: submission order is not what decides.
    let timer = env
        .start(RaceInput {
            kind: "timer".into(),
        })
        .await
        .unwrap();
    let wait = env
        .start(RaceInput {
            kind: "wait".into(),
        })
        .await
        .unwrap();
    env.advance(HOUR).await.unwrap();
    assert_eq!(*env.runner().log.lock().unwrap(), ["wait", "timer"]);
    assert_eq!(
        claim_offsets(&wait.history().await.unwrap())[1],
        [Some(600_000)]
    );
    assert_eq!(
        claim_offsets(&timer.history().await.unwrap())[1],
        [Some(1_200_000)]
    );
}

#[tokio::test(start_paused = true)]
async fn run_until_ended_skips_from_due_time_to_due_time_until_the_run_ends() {
    let env = TestRuntime::new(Reminder).await.unwrap();
    let run = env
        .start(ReminderInput { who: "bob".into() })
        .await
        .unwrap();
    assert_eq!(env.run_until_ended(run.id()).await.unwrap(), 3);
    assert!(!run.output().await.unwrap());
    assert_eq!(
        env.now_ms(),
        TEST_EPOCH_MS + 5_400_000,
        "the last due instant"
    );
    assert!(matches!(
        env.run_until_ended(&rid("never")).await,
        Err(TestError::UnknownRun(_))
    ));
    // An ended run: nothing to do, the clock stays.
    assert_eq!(env.run_until_ended(run.id()).await.unwrap(), 0);
    assert_eq!(env.now_ms(), TEST_EPOCH_MS + 5_400_000);
}

#[tokio::test(start_paused = true)]
async fn run_to_completion_runs_until_nothing_is_due_at_any_future_time() {
    let env = TestRuntime::new(Script::default()).await.unwrap();
    env.submit(spec("t", "timer,done")).await.unwrap();
    env.submit(spec("w", "wait,done")).await.unwrap();
    assert_eq!(env.run_to_completion().await.unwrap(), 4);
    for id in ["t", "w"] {
        assert_eq!(
            terminated(&state_of(&env, id).await),
            Some(TerminalStatus::Succeeded),
            "{id}"
        );
    }
    assert_eq!(
        env.now_ms(),
        TEST_EPOCH_MS + 600_000,
        "the signal timeout, last"
    );
}

/// Reschedules itself every second, for ever.
struct Ticker;

impl StepRunner for Ticker {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::continue_after(step.payload.clone(), SECOND))
    }
}

#[tokio::test(start_paused = true)]
async fn the_hop_cap_names_the_run_that_keeps_rescheduling_itself() {
    let env = TestRuntime::builder(Ticker)
        .max_hops(20)
        .build()
        .await
        .unwrap();
    env.submit(spec("loop", "")).await.unwrap();
    match env.advance(HOUR).await {
        Err(err @ TestError::TooManyHops { .. }) => {
            let TestError::TooManyHops {
                hops,
                run_id,
                run_hops,
            } = &err
            else {
                unreachable!()
            };
            assert_eq!(*hops, 20);
            assert_eq!(run_id.as_ref(), Some(&rid("loop")));
            assert_eq!(*run_hops, 20);
            assert!(err.to_string().contains("run `loop`"), "{err}");
        }
        other => panic!("expected TooManyHops, got {other:?}"),
    }
    assert_eq!(
        env.now_ms(),
        TEST_EPOCH_MS + 20_000,
        "it stopped at the cap"
    );
    assert!(matches!(
        env.run_to_completion().await,
        Err(TestError::TooManyHops { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_claim_the_test_holds_is_reaped_at_its_lease_expiry_inside_the_window() {
    let env = TestRuntime::builder(Script::default())
        .lease(30 * SECOND)
        .build()
        .await
        .unwrap();
    env.submit(spec("r", "now,done")).await.unwrap();
    let queue = env.queue().unwrap();
    let _held = queue
        .claim("workflow-steps", 30 * SECOND)
        .await
        .unwrap()
        .expect("step 0");
    assert_eq!(env.advance(MINUTE).await.unwrap(), 2);
    let history = env.history(&rid("r")).await.unwrap();
    assert_eq!(
        history.steps[0].attempts[0].outcome,
        AttemptOutcome::LeaseExpired
    );
    assert_eq!(
        claim_offsets(&history),
        [vec![Some(0), Some(30_000)], vec![Some(30_000)]],
        "redelivered when the lease expired, not at the window's end"
    );
}

/// Fails its first notification; records the clock's time of each call.
#[derive(Default)]
struct FlakyHook {
    clock: std::sync::OnceLock<taquba::MockClock>,
    calls: std::sync::Mutex<Vec<u64>>,
}

impl taquba_workflow::TerminalHook for FlakyHook {
    async fn on_termination(
        &self,
        _outcome: &taquba_workflow::RunOutcome,
        _effects: &taquba_workflow::TerminalEffects,
    ) -> Result<(), StepError> {
        let now = self.clock.get().map_or(0, taquba::Clock::now_ms);
        let mut calls = self.calls.lock().unwrap();
        calls.push(now - TEST_EPOCH_MS);
        if calls.len() == 1 {
            return Err(StepError::transient("hook endpoint down"));
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_terminal_notification_retry_fires_at_its_backoff_inside_the_window() {
    let env = TestRuntime::builder(Script::default())
        .hook(FlakyHook::default())
        .retry_backoff(10 * SECOND, 10 * SECOND)
        .build()
        .await
        .unwrap();
    env.hook().clock.set(env.clock().clone()).unwrap();
    env.submit(spec("r", "done")).await.unwrap();
    env.advance(MINUTE).await.unwrap();
    assert_eq!(*env.hook().calls.lock().unwrap(), [0, 10_000]);
}

#[tokio::test(start_paused = true)]
async fn fail_next_refuses_a_name_no_step_has_and_reports_failures_never_used() {
    let env = TestRuntime::new(Ticks).await.unwrap();
    match env.fail_next("Fourth", StepError::transient("x")) {
        Err(TestError::UnknownStep { name, known }) => {
            assert_eq!(name, "Fourth");
            assert_eq!(known, ["first", "fourth", "second", "third"]);
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
    env.fail_next("fourth", StepError::transient("late"))
        .unwrap();
    let run = env.start(TicksInput { n: 0 }).await.unwrap();
    env.advance(MINUTE).await.unwrap();
    let unused: Vec<_> = env
        .unused_failures()
        .into_iter()
        .map(|(step, error)| (step, error.message))
        .collect();
    assert_eq!(unused, [("fourth".to_string(), "late".to_string())]);
    env.run_until_ended(run.id()).await.unwrap();
    assert!(env.unused_failures().is_empty(), "used by `fourth`");
    let attempts = &run.history().await.unwrap().steps[3].attempts;
    assert_eq!(
        attempts[0].outcome,
        AttemptOutcome::Retried {
            error: "late".into()
        }
    );

    // A router knows the steps of every workflow it hosts.
    let router = Workflows::builder()
        .register(Ticks)
        .register(Reminder)
        .build();
    let env = TestRuntime::new(router).await.unwrap();
    env.fail_next("remind", StepError::transient("x")).unwrap();
    env.fail_next("second", StepError::transient("x")).unwrap();
    let err = env
        .fail_next("AwaitApproval", StepError::transient("x"))
        .unwrap_err();
    assert!(err.to_string().contains("`remind`"), "{err}");

    // Jobs: the registered names.
    let env = TestJobs::builder()
        .register::<Flaky>()
        .register::<Charge>()
        .build()
        .await
        .unwrap();
    match env.fail_next("Flaky", StepError::transient("x")) {
        Err(TestError::UnknownStep { known, .. }) => {
            assert_eq!(known, ["billing.charge", "kit.flaky"]);
        }
        other => panic!("expected UnknownStep, got {other:?}"),
    }
}
