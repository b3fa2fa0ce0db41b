//! Review 41 (b): changing code under running workflows (versions and
//! patches), the test kit, and fork / history, at the public API.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::rid;
use taquba_workflow::history::{AttemptOutcome, RunHistory};
use taquba_workflow::testing::{TestError, TestRuntime, Waiting};
use taquba_workflow::versioning::{CodeInfo, HostedCode};
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::{
    Error, ForkOptions, RunSpec, RunState, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus, workflow,
};

const HOUR: Duration = Duration::from_secs(3600);

/// Every answer of `patched("p")`: (run, step, attempt, answer).
type Answers = Arc<Mutex<Vec<(String, u32, u32, bool)>>>;

/// A hand-written runner whose code is "deployed" by changing `code` and
/// rebuilding the runtime (the kit's `crash` rebuilds it). Step 0 waits
/// for `go:{run}`; step 1 asks for the patch `p`, fails transiently on its
/// first attempt, then succeeds with the answer.
#[derive(Clone, Default)]
struct Deployable {
    code: Arc<Mutex<CodeInfo>>,
    answers: Answers,
}

impl Deployable {
    fn deploy(&self, code: CodeInfo) {
        *self.code.lock().unwrap() = code;
    }

    fn answers_of(&self, run: &str) -> Vec<(u32, u32, bool)> {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, ..)| r == run)
            .map(|(_, s, a, p)| (*s, *a, *p))
            .collect()
    }
}

impl StepRunner for Deployable {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number == 0 {
            return Ok(StepOutcome::continue_on_signal(
                b"one".to_vec(),
                format!("go:{}", step.run_id),
                HOUR,
            ));
        }
        let answer = step.patched("p")?;
        self.answers.lock().unwrap().push((
            step.run_id.to_string(),
            step.step_number,
            step.attempts,
            answer,
        ));
        if step.attempts == 1 {
            return Err(StepError::transient("flaky on the first attempt"));
        }
        Ok(StepOutcome::Succeed {
            result: answer.to_string().into_bytes(),
        })
    }

    fn code(&self) -> HostedCode {
        HostedCode::all(self.code.lock().unwrap().clone())
    }
}

fn plain(id: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: b"zero".to_vec(),
        ..Default::default()
    }
}

async fn result_of<R: StepRunner + 'static>(
    env: &TestRuntime<R>,
    id: &str,
) -> (TerminalStatus, String) {
    let end = env.runtime().unwrap().wait(&rid(id)).await.unwrap();
    let text = end
        .outcome
        .as_ref()
        .and_then(|o| o.result.clone())
        .map(|r| String::from_utf8_lossy(&r).to_string())
        .or_else(|| end.outcome.as_ref().and_then(|o| o.error.clone()))
        .unwrap_or_default();
    (end.termination.status, text)
}

#[tokio::test(start_paused = true)]
async fn a_deploy_in_the_kit_keeps_each_runs_patch_answer_across_retries() {
    let runner = Deployable::default();
    runner.deploy(CodeInfo::new().version("1").patch("p0"));
    let env = TestRuntime::builder(runner.clone())
        .retry_backoff(Duration::from_secs(1), Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    env.submit(plain("old")).await.unwrap();
    env.run_until_idle().await.unwrap();

    // Version 2 declares `p`: a new process with the new code.
    runner.deploy(CodeInfo::new().version("2").patch("p0").patch("p"));
    env.crash().await.unwrap();
    env.submit(plain("new")).await.unwrap();
    env.run_until_idle().await.unwrap();
    for id in ["old", "new"] {
        env.signal_raw(&format!("go:{id}"), Vec::new())
            .await
            .unwrap();
    }
    env.advance(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        result_of(&env, "old").await,
        (TerminalStatus::Succeeded, "false".into())
    );
    assert_eq!(
        result_of(&env, "new").await,
        (TerminalStatus::Succeeded, "true".into())
    );
    assert_eq!(runner.answers_of("old"), [(1, 1, false), (1, 2, false)]);
    assert_eq!(runner.answers_of("new"), [(1, 1, true), (1, 2, true)]);

    // Versions: the run's start, and each step's.
    let view = env.runtime().unwrap().view().clone();
    let old = view.run(&rid("old")).await.unwrap().unwrap();
    assert_eq!(old.version.as_deref(), Some("1"));
    assert_eq!(old.patches, ["p0"]);
    let history = env.history(&rid("old")).await.unwrap();
    let versions: Vec<Option<&str>> = history.steps.iter().map(|s| s.version.as_deref()).collect();
    assert_eq!(versions, [Some("1"), Some("2")]);
    let new = view.run(&rid("new")).await.unwrap().unwrap();
    assert_eq!(new.patches, ["p", "p0"]);
}

#[tokio::test(start_paused = true)]
async fn a_patch_removed_under_a_run_that_recorded_it_fails_the_run_once_naming_it() {
    let runner = Deployable::default();
    runner.deploy(CodeInfo::new().version("2").patch("p"));
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    env.submit(plain("run-a")).await.unwrap();
    env.run_until_idle().await.unwrap();
    // Version 3 drops the declaration but the step still asks for it.
    runner.deploy(CodeInfo::new().version("3"));
    env.crash().await.unwrap();
    env.signal_raw("go:run-a", Vec::new()).await.unwrap();
    let calls = env.run_until_idle().await.unwrap();
    assert_eq!(calls, 1, "a permanent error: no retry loop");
    let (status, error) = result_of(&env, "run-a").await;
    assert_eq!(status, TerminalStatus::Failed);
    assert!(error.contains("\"p\""), "{error}");
    assert!(error.contains("not declared"), "{error}");
    let history = env.history(&rid("run-a")).await.unwrap();
    assert!(
        matches!(
            &history.steps[1].attempts[..],
            [a] if matches!(&a.outcome, AttemptOutcome::Failed { kind: taquba_workflow::StepErrorKind::Permanent, .. })
        ),
        "{history:?}"
    );
}

/// Four steps: step n continues with `p{n+1}`, step 2 asks for patch `p`
/// (when the code declares it) and fails while `broken`; step 3 succeeds
/// with `{patched}`.
#[derive(Clone, Default)]
struct Forkable {
    code: Arc<Mutex<CodeInfo>>,
    broken: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// One call of a [`Forkable`]: the run, the step number, the payload and
/// the signal.
type Seen = (String, u32, Vec<u8>, Option<Vec<u8>>);

impl StepRunner for Forkable {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.seen.lock().unwrap().push((
            step.run_id.to_string(),
            step.step_number,
            step.payload.clone(),
            step.signal.clone(),
        ));
        let next = format!("p{}", step.step_number + 1).into_bytes();
        match step.step_number {
            0 => Ok(StepOutcome::continue_now(next)),
            1 => Ok(StepOutcome::continue_on_signal(
                next,
                format!("sig:{}", step.run_id),
                HOUR,
            )),
            2 if self.broken.load(Ordering::SeqCst) => Err(StepError::permanent("bug in step 2")),
            2 => {
                let patched = match self.code.lock().unwrap().patches.contains("p") {
                    true => step.patched("p")?.to_string(),
                    false => "undeclared".into(),
                };
                Ok(StepOutcome::continue_now(patched.into_bytes()))
            }
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            }),
        }
    }

    fn code(&self) -> HostedCode {
        HostedCode::all(self.code.lock().unwrap().clone())
    }
}

impl Forkable {
    fn seen_of(&self, run: &str) -> Vec<(u32, Vec<u8>, Option<Vec<u8>>)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, ..)| r == run)
            .map(|(_, s, p, g)| (*s, p.clone(), g.clone()))
            .collect()
    }
}

/// Run `id` of a `Forkable` to its failure at step 2 (signalled `sig`).
async fn fail_at_step_2(env: &TestRuntime<Forkable>, id: &str, sig: &[u8]) {
    env.submit(plain(id)).await.unwrap();
    env.run_until_idle().await.unwrap();
    env.signal_raw(&format!("sig:{id}"), sig.to_vec())
        .await
        .unwrap();
    env.run_until_ended(&rid(id)).await.unwrap();
    assert_eq!(result_of(env, id).await.0, TerminalStatus::Failed);
}

#[tokio::test(start_paused = true)]
async fn a_fork_keeps_the_originals_patches_and_a_restart_takes_the_new_code() {
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    *runner.code.lock().unwrap() = CodeInfo::new().version("1");
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    fail_at_step_2(&env, "orig", b"hello").await;

    // The fix ships with the patch `p`.
    runner.broken.store(false, Ordering::SeqCst);
    *runner.code.lock().unwrap() = CodeInfo::new().version("2").patch("p");
    env.crash().await.unwrap();
    let runtime = env.runtime().unwrap();
    let fork = runtime
        .fork(&rid("orig"), 2, ForkOptions::new().run_id(rid("fork")))
        .await
        .unwrap();
    env.run_until_ended(&fork.run_id).await.unwrap();
    assert_eq!(
        result_of(&env, "fork").await,
        (TerminalStatus::Succeeded, "false".into()),
        "a fork goes on as the original started"
    );
    // The fork's step 2 got the payload and the signal step 2 got.
    let seen = runner.seen_of("fork");
    assert_eq!(seen[0], (2, b"p2".to_vec(), Some(b"hello".to_vec())));
    let restart = runtime
        .restart(&rid("orig"), ForkOptions::new().run_id(rid("again")))
        .await
        .unwrap();
    env.run_until_idle().await.unwrap();
    env.signal_raw("sig:again", b"x".to_vec()).await.unwrap();
    env.run_until_ended(&restart.run_id).await.unwrap();
    assert_eq!(
        result_of(&env, "again").await,
        (TerminalStatus::Succeeded, "true".into())
    );
    let details = runtime.view().run(&rid("again")).await.unwrap().unwrap();
    assert_eq!(details.version.as_deref(), Some("2"));
}

/// A snapshot of what a reader sees of run `id`.
async fn snapshot<R: StepRunner + 'static>(env: &TestRuntime<R>, id: &str) -> String {
    let runtime = env.runtime().unwrap();
    let view = runtime.view();
    let details = view.run(&rid(id)).await.unwrap();
    let history = view.steps(&rid(id)).await.unwrap();
    let outcome = view.outcome(&rid(id)).await.unwrap();
    let status = view.status(&rid(id)).await.unwrap();
    format!("{details:?}\n{history:?}\n{outcome:?}\n{status:?}")
}

#[tokio::test(start_paused = true)]
async fn a_fork_leaves_the_original_as_it_was() {
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    fail_at_step_2(&env, "orig", b"s").await;
    let before = snapshot(&env, "orig").await;
    runner.broken.store(false, Ordering::SeqCst);
    let runtime = env.runtime().unwrap();
    for (n, step) in [0u32, 1, 2].into_iter().enumerate() {
        let fork = runtime
            .fork(
                &rid("orig"),
                step,
                ForkOptions::new().run_id(rid(&format!("f{n}"))),
            )
            .await
            .unwrap();
        env.run_until_idle().await.unwrap();
        let _ = env
            .signal_raw(&format!("sig:f{n}"), b"t".to_vec())
            .await
            .unwrap();
        env.run_until_ended(&fork.run_id).await.unwrap();
        assert_eq!(
            result_of(&env, &format!("f{n}")).await.0,
            TerminalStatus::Succeeded
        );
        let history = env.history(&fork.run_id).await.unwrap();
        let steps: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
        assert_eq!(steps, (step..4).collect::<Vec<_>>(), "f{n}");
    }
    env.crash().await.unwrap();
    assert_eq!(snapshot(&env, "orig").await, before);
}

#[tokio::test(start_paused = true)]
async fn a_fork_dropped_at_any_await_is_made_once_or_not_at_all() {
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    fail_at_step_2(&env, "orig", b"s").await;
    runner.broken.store(false, Ordering::SeqCst);
    let runtime = env.runtime().unwrap();
    for budget_us in [0u64, 1, 10, 100, 1_000, 5_000] {
        let id = format!("drop-{budget_us}");
        let dropped = tokio::time::timeout(
            Duration::from_micros(budget_us),
            runtime.fork(&rid("orig"), 2, ForkOptions::new().run_id(rid(&id))),
        )
        .await;
        if let Ok(made) = dropped {
            made.unwrap();
        }
        // Let a detached fork finish, then ask again.
        env.run_until_idle().await.unwrap();
        let again = runtime
            .fork(&rid("orig"), 2, ForkOptions::new().run_id(rid(&id)))
            .await
            .unwrap();
        assert_eq!(again.run_id.as_str(), id);
        env.run_until_ended(&again.run_id).await.unwrap();
        assert_eq!(
            result_of(&env, &id).await,
            (TerminalStatus::Succeeded, "undeclared".into())
        );
        let steps2 = runner.seen_of(&id).iter().filter(|(s, ..)| *s == 2).count();
        assert_eq!(steps2, 1, "{id}: one fork ran step 2 once");
    }
    let forks = runtime
        .view()
        .runs(&taquba_workflow::view::RunFilter::new())
        .await
        .unwrap();
    assert_eq!(forks.runs.len(), 7, "{:?}", forks.runs);
}

#[tokio::test(start_paused = true)]
async fn fork_refusals_name_the_run_and_the_step() {
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    fail_at_step_2(&env, "orig", b"s").await;
    let runtime = env.runtime().unwrap();
    // Out of range.
    let err = runtime
        .fork(&rid("orig"), u32::MAX, ForkOptions::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("step {} of run `orig`", u32::MAX))
            && text.contains("ended at step 2"),
        "{text}"
    );
    // Unknown.
    let err = runtime
        .fork(&rid("ghost"), 0, ForkOptions::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("`ghost`") && text.contains("not known"),
        "{text}"
    );
    // Running (waiting on its signal).
    env.submit(plain("busy")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let err = runtime
        .fork(&rid("busy"), 1, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RunActive(ref id) if id.as_str() == "busy"),
        "{err}"
    );
    assert!(err.to_string().contains("`busy`"), "{err}");
    // Refusals commit nothing.
    let runs = runtime
        .view()
        .runs(&taquba_workflow::view::RunFilter::new())
        .await
        .unwrap();
    assert_eq!(runs.runs.len(), 2);
    // The fork under the original's own id.
    let err = runtime
        .fork(&rid("orig"), 1, ForkOptions::new().run_id(rid("orig")))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ForkRunIdTaken(ref id) if id.as_str() == "orig"),
        "{err}"
    );
    // The run still waits on its signal, untouched.
    assert!(matches!(
        runtime.status(&rid("busy")).await.unwrap().unwrap().state,
        RunState::Pending
    ));
}

/// Counts down: step n continues to n+1 until `steps`, then succeeds.
struct Countdown {
    steps: u32,
    flaky_at: Option<u32>,
    calls: AtomicU32,
}

impl StepRunner for Countdown {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if Some(step.step_number) == self.flaky_at && step.attempts < 3 {
            return Err(StepError::transient(format!("flaky {}", step.attempts)));
        }
        if step.step_number + 1 >= self.steps {
            return Ok(StepOutcome::Succeed { result: Vec::new() });
        }
        Ok(StepOutcome::continue_now(
            format!("s{}", step.step_number + 1).into_bytes(),
        ))
    }
}

fn assert_contiguous(history: &RunHistory, limit: u32, what: &str) {
    let steps: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
    let kept = steps.len() as u32;
    assert!(
        kept >= limit.min(history.steps_taken),
        "{what}: kept {kept} of {} with limit {limit}: {steps:?}",
        history.steps_taken
    );
    if let Some(first) = steps.first() {
        let expected: Vec<u32> = (*first..*first + kept).collect();
        assert_eq!(steps, expected, "{what}: in order, once each");
        assert_eq!(history.steps_dropped, *first, "{what}");
    }
    assert_eq!(
        history.steps_dropped + kept,
        history.steps_taken,
        "{what}: dropped + kept = taken"
    );
}

#[tokio::test(start_paused = true)]
async fn a_history_limit_keeps_at_least_the_last_entries_for_any_limit() {
    for limit in [1u32, 3, 7, 8, 9, 17] {
        let env = TestRuntime::builder(Countdown {
            steps: 30,
            flaky_at: Some(25),
            calls: AtomicU32::new(0),
        })
        .retry_backoff(Duration::ZERO, Duration::ZERO)
        .configure(move |b| b.history_limit(limit))
        .build()
        .await
        .unwrap();
        env.submit(plain("long")).await.unwrap();
        env.run_until_ended(&rid("long")).await.unwrap();
        let history = env.history(&rid("long")).await.unwrap();
        assert_eq!(history.steps_taken, 30);
        assert_contiguous(&history, limit, &format!("limit {limit}"));
        assert_eq!(history.steps.last().unwrap().step, 29);
        env.crash().await.unwrap();
        assert_eq!(
            env.history(&rid("long")).await.unwrap(),
            history,
            "limit {limit}"
        );
    }
}

/// A workflow with a timer, a signal wait and a flaky step.
struct Order;

static ORDER_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

#[workflow(name = "review41b-order", output = String)]
impl Order {
    #[step(start)]
    async fn reserve(order: String) -> Result<Transition<OrderStep>, StepError> {
        Ok(Transition::after(OrderStep::Ask { order }, HOUR))
    }

    #[step]
    async fn ask(order: String) -> Result<Transition<OrderStep>, StepError> {
        let key = format!("ship:{order}");
        Ok(Transition::on_signal(OrderStep::Ship { order }, key, HOUR))
    }

    #[step]
    async fn ship(ctx: StepContext<'_>, order: String) -> Result<Transition<OrderStep>, StepError> {
        ORDER_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
        if ctx.attempts < 2 {
            return Err(StepError::transient("warehouse busy"));
        }
        let tracking = ctx.signal_value::<String>()?.unwrap_or_default();
        Ok(Transition::done(format!("{order}: {tracking}")))
    }
}

/// The same scenario, start to end, with a crash while `ask` waits.
async fn order_scenario() -> (String, RunHistory, u64) {
    let env = TestRuntime::new(Order).await.unwrap();
    let run = env
        .start_as(
            rid("o-1"),
            OrderInput {
                order: "o-1".into(),
            },
            Default::default(),
        )
        .await
        .unwrap();
    env.run_until_idle().await.unwrap();
    env.advance(HOUR).await.unwrap();
    env.crash().await.unwrap();
    env.signal("ship:o-1", "t-9").await.unwrap();
    env.advance(Duration::from_secs(30)).await.unwrap();
    let output = run.output().await.unwrap();
    (output, run.history().await.unwrap(), env.now_ms())
}

#[tokio::test(start_paused = true)]
async fn the_kit_is_deterministic_run_after_run() {
    let first = order_scenario().await;
    let second = order_scenario().await;
    assert_eq!(first.0, "o-1: t-9");
    assert_eq!(first, second);
}

/// A run that waits on a signal "for ever" (`Duration::MAX`).
struct Forever;

#[workflow(name = "review41b-forever", output = bool)]
impl Forever {
    #[step(start)]
    async fn wait(key: String) -> Result<Transition<ForeverStep>, StepError> {
        Ok(Transition::on_signal(
            ForeverStep::Woken {},
            key,
            Duration::MAX,
        ))
    }

    #[step]
    async fn woken(ctx: StepContext<'_>) -> Result<Transition<ForeverStep>, StepError> {
        Ok(Transition::done(ctx.signal_value::<()>()?.is_some()))
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_waiting_for_ever_on_a_signal_is_reported_not_hung_on() {
    let env = TestRuntime::new(Forever).await.unwrap();
    let run = env.start(ForeverInput { key: "k".into() }).await.unwrap();
    env.run_until_idle().await.unwrap();
    match run.output().await {
        Err(TestError::NotEnded {
            waiting: Waiting::Signal {
                correlation_key, ..
            },
            ..
        }) => assert_eq!(correlation_key, "k"),
        other => panic!("expected NotEnded on the signal: {other:?}"),
    }
    // Time skipping either fires the (far) timeout or says what it waits for.
    let skipped = tokio::time::timeout(Duration::from_secs(600), env.run_until_ended(run.id()))
        .await
        .expect("run_until_ended returns");
    match skipped {
        Ok(_) => assert!(!run.output().await.unwrap()),
        Err(err) => assert!(err.to_string().contains("`k`"), "{err}"),
    }
}

/// Step 0 continues after an hour with a payload of `size` bytes (step 1
/// succeeds); with `size` 0 step 0 goes on at once with a large payload,
/// and step 1 waits an hour with a small one.
struct BigPayload {
    size: usize,
}

impl StepRunner for BigPayload {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        match (step.step_number, self.size) {
            (0, 0) => Ok(StepOutcome::continue_now(vec![b'x'; 4000])),
            (0, size) => Ok(StepOutcome::continue_after(vec![b'x'; size], HOUR)),
            (1, 0) => Ok(StepOutcome::continue_after(b"small".to_vec(), HOUR)),
            _ => Ok(StepOutcome::Succeed {
                result: step.payload.len().to_string().into_bytes(),
            }),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelling_fork_of_the_current_step_with_a_large_payload_forks_it() {
    // The run waits on a timer at step 1, whose payload (2000 bytes) is
    // over the default 1024-byte step input limit.
    let env = TestRuntime::new(BigPayload { size: 2000 }).await.unwrap();
    env.submit(plain("big")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let runtime = env.runtime().unwrap();
    let forked = runtime
        .fork(&rid("big"), 1, ForkOptions::new().cancel_active(true))
        .await;
    let status = runtime.status(&rid("big")).await.unwrap().unwrap().state;
    // Either the fork is made (the documented path: "an active run is
    // refused unless the fork cancels it first and waits for it to end"),
    // or nothing happened to the original.
    match forked {
        Ok(fork) => {
            env.run_until_ended(&fork.run_id).await.unwrap();
            let end = runtime.wait(&fork.run_id).await.unwrap();
            assert_eq!(end.termination.status, TerminalStatus::Succeeded);
        }
        Err(err) => panic!("the fork was refused ({err}) after it cancelled the run: {status:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelling_fork_from_an_unforkable_step_leaves_the_run_running() {
    // Step 0's payload (the 4000-byte continuation) is step 1's, which is
    // not kept; step 1 finished and its job is gone. The run waits at 2.
    let env = TestRuntime::new(BigPayload { size: 0 }).await.unwrap();
    env.submit(plain("busy")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let runtime = env.runtime().unwrap();
    assert_eq!(
        runtime
            .status(&rid("busy"))
            .await
            .unwrap()
            .unwrap()
            .current_step,
        2
    );
    let err = runtime
        .fork(&rid("busy"), 1, ForkOptions::new().cancel_active(true))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::StepNotForkable { step: 1, .. }),
        "{err}"
    );
    // A refused fork should not have cancelled the run it refused to fork.
    let state = runtime.status(&rid("busy")).await.unwrap().unwrap().state;
    assert!(
        !matches!(state, RunState::Terminated(_)),
        "the fork was refused ({err}) but the run was cancelled: {state:?}"
    );
}

/// Blocks step `at` on its first delivery (so the test can crash there),
/// else continues until step `last`, which succeeds.
struct Blocking {
    at: AtomicU32,
    last: u32,
    started: tokio::sync::Notify,
    calls: Mutex<Vec<(u32, u32)>>,
}

impl StepRunner for Blocking {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((step.step_number, step.attempts));
        if step.step_number == self.at.load(Ordering::SeqCst) && step.attempts == 1 {
            self.started.notify_one();
            std::future::pending::<()>().await;
        }
        if step.step_number >= self.last {
            return Ok(StepOutcome::Succeed { result: Vec::new() });
        }
        Ok(StepOutcome::continue_now(vec![step.step_number as u8 + 1]))
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_at_every_step_leaves_each_step_once_in_order_in_the_history() {
    let last = 19;
    let env = TestRuntime::builder(Blocking {
        at: AtomicU32::new(0),
        last,
        started: tokio::sync::Notify::new(),
        calls: Mutex::new(Vec::new()),
    })
    .max_attempts(5)
    .configure(|b| b.history_limit(12))
    .build()
    .await
    .unwrap();
    env.submit(plain("crashy")).await.unwrap();
    for step in 0..=last {
        env.runner().at.store(step, Ordering::SeqCst);
        tokio::select! {
            ran = env.run_until_idle() => panic!("step {step} did not block: {ran:?}"),
            () = env.runner().started.notified() => {}
        }
        env.crash().await.unwrap();
        // Every crash: the history so far is each settled step once.
        let history = env.history(&rid("crashy")).await.unwrap();
        let settled: Vec<u32> = history
            .steps
            .iter()
            .filter(|s| {
                s.attempts
                    .iter()
                    .any(|a| !matches!(a.outcome, AttemptOutcome::Interrupted))
            })
            .map(|s| s.step)
            .collect();
        let first = settled.first().copied().unwrap_or(0);
        assert_eq!(
            settled,
            (first..step).collect::<Vec<_>>(),
            "after the crash at {step}"
        );
    }
    env.run_until_idle().await.unwrap();
    let history = env.history(&rid("crashy")).await.unwrap();
    assert_contiguous(&history, 12, "crashy");
    for step in &history.steps {
        let outcomes: Vec<&AttemptOutcome> = step.attempts.iter().map(|a| &a.outcome).collect();
        let attempts: Vec<u32> = step.attempts.iter().map(|a| a.attempt).collect();
        assert_eq!(attempts, [1, 2], "step {}: {outcomes:?}", step.step);
        assert!(
            matches!(outcomes[..], [AttemptOutcome::Interrupted, _]),
            "step {}: {outcomes:?}",
            step.step
        );
    }
    let end = env.runtime().unwrap().wait(&rid("crashy")).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_step_retried_past_the_attempt_cap_keeps_its_last_attempts_and_counts_the_rest() {
    let env = TestRuntime::builder(Countdown {
        steps: 2,
        flaky_at: None,
        calls: AtomicU32::new(0),
    })
    .max_attempts(20)
    .retry_backoff(Duration::ZERO, Duration::ZERO)
    .build()
    .await
    .unwrap();
    for _ in 0..19 {
        env.fail_next("Countdown", StepError::transient("down"))
            .unwrap();
    }
    env.submit(plain("flaky")).await.unwrap();
    env.run_until_ended(&rid("flaky")).await.unwrap();
    assert!(env.unused_failures().is_empty());
    let history = env.history(&rid("flaky")).await.unwrap();
    let step0 = &history.steps[0];
    let attempts: Vec<u32> = step0.attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(attempts, (5..=20).collect::<Vec<_>>());
    assert_eq!(step0.attempts_dropped, 4);
    assert!(matches!(
        step0.attempts.last().unwrap().outcome,
        AttemptOutcome::Continued { .. }
    ));
}

/// A timer chain: four steps an hour apart, the third retried once.
#[derive(Clone)]
struct Chain;

#[workflow(name = "review41b-chain", output = u32)]
impl Chain {
    #[step(start)]
    async fn a(n: u32) -> Result<Transition<ChainStep>, StepError> {
        Ok(Transition::after(ChainStep::B { n: n + 1 }, HOUR))
    }

    #[step]
    async fn b(n: u32) -> Result<Transition<ChainStep>, StepError> {
        Ok(Transition::after(ChainStep::C { n: n + 1 }, HOUR))
    }

    #[step]
    async fn c(ctx: StepContext<'_>, n: u32) -> Result<Transition<ChainStep>, StepError> {
        if ctx.attempts == 1 {
            return Err(StepError::transient("once"));
        }
        Ok(Transition::after(ChainStep::D { n: n + 1 }, HOUR))
    }

    #[step]
    async fn d(n: u32) -> Result<Transition<ChainStep>, StepError> {
        Ok(Transition::done(n))
    }
}

async fn chain_env() -> (TestRuntime<Chain>, taquba_workflow::testing::TestRun<Chain>) {
    let env = TestRuntime::new(Chain).await.unwrap();
    let run = env
        .start_as(rid("chain"), ChainInput { n: 0 }, Default::default())
        .await
        .unwrap();
    (env, run)
}

#[tokio::test(start_paused = true)]
async fn an_advance_dropped_midway_then_resumed_ends_as_one_advance_would() {
    let (env, run) = chain_env().await;
    env.advance(4 * HOUR).await.unwrap();
    let whole = run.history().await.unwrap();
    assert_eq!(run.output().await.unwrap(), 3);

    let (env2, run2) = chain_env().await;
    let start = env2.now_ms();
    for budget_ms in [0u64, 1, 2, 3, 5, 8, 13] {
        let remaining = (start + 4 * 3_600_000).saturating_sub(env2.now_ms());
        let _ = tokio::time::timeout(
            Duration::from_millis(budget_ms),
            env2.advance(Duration::from_millis(remaining)),
        )
        .await;
    }
    let remaining = (start + 4 * 3_600_000).saturating_sub(env2.now_ms());
    env2.advance(Duration::from_millis(remaining))
        .await
        .unwrap();
    assert_eq!(env2.now_ms(), env.now_ms());
    assert_eq!(run2.output().await.unwrap(), 3);
    assert_eq!(run2.history().await.unwrap(), whole);
}

#[tokio::test(start_paused = true)]
async fn a_long_version_is_cut_at_a_char_boundary_and_patches_round_trip() {
    let runner = Deployable::default();
    let long = "é".repeat(300);
    runner.deploy(CodeInfo::new().version(long.clone()).patch("p"));
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    env.submit(plain("v")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let details = env
        .runtime()
        .unwrap()
        .view()
        .run(&rid("v"))
        .await
        .unwrap()
        .unwrap();
    let version = details.version.expect("a version");
    assert!(version.len() <= 256, "{}", version.len());
    assert!(long.starts_with(version.trim_end_matches('…')));
    assert_eq!(details.patches, ["p"]);
}

#[tokio::test(start_paused = true)]
async fn an_oversized_patch_declaration_is_refused_at_submission_committing_nothing() {
    let runner = Deployable::default();
    runner.deploy(CodeInfo::new().patch("p").patch("x".repeat(2 << 20)));
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    let err = env.submit(plain("huge")).await.unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("invalid code declaration")
            && message.contains("2097152 bytes")
            && message.contains("256 bytes"),
        "{message}"
    );
    let runtime = env.runtime().unwrap();
    assert!(runtime.status(&rid("huge")).await.unwrap().is_none());
    assert_eq!(env.run_until_idle().await.unwrap(), 0);
}

/// Ends its run at step 0 with a failure of `reason_len` bytes; declares
/// `patches` patches of `patch_len` bytes each.
struct BigFailure {
    patches: usize,
    patch_len: usize,
    reason_len: usize,
}

impl StepRunner for BigFailure {
    async fn run_step(&self, _step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Fail {
            reason: "r".repeat(self.reason_len),
        })
    }

    fn code(&self) -> HostedCode {
        HostedCode::all((0..self.patches).fold(CodeInfo::new(), |code, i| {
            let id = format!("{i:04}");
            code.patch(format!("{id}{}", "x".repeat(self.patch_len - id.len())))
        }))
    }
}

/// A patch declaration the runtime could not record on a run's records (a
/// 200 KB id, as reviewed: accepted, it left the run's failure too large to
/// commit, so the run never ended) is refused at submission naming the
/// patch; a code at both patch limits runs and ends with its long failure.
#[tokio::test(start_paused = true)]
async fn a_run_whose_records_carry_a_large_patch_still_ends() {
    let env = TestRuntime::builder(BigFailure {
        patches: 1,
        patch_len: 200_000,
        reason_len: 100_000,
    })
    .idle_timeout(Duration::from_secs(5))
    .build()
    .await
    .unwrap();
    let message = env.submit(plain("bf")).await.unwrap_err().to_string();
    assert!(
        message.contains("patch \"0000xxxx") && message.contains("200000 bytes"),
        "{message}"
    );
    assert!(
        env.runtime()
            .unwrap()
            .status(&rid("bf"))
            .await
            .unwrap()
            .is_none()
    );

    let env = TestRuntime::builder(BigFailure {
        patches: taquba_workflow::limits::MAX_PATCHES_SIZE
            / taquba_workflow::limits::MAX_PATCH_ID_LEN,
        patch_len: taquba_workflow::limits::MAX_PATCH_ID_LEN,
        reason_len: 100_000,
    })
    .idle_timeout(Duration::from_secs(5))
    .build()
    .await
    .unwrap();
    env.submit(plain("bf")).await.unwrap();
    let idle = env.run_until_idle().await;
    let state = env
        .runtime()
        .unwrap()
        .status(&rid("bf"))
        .await
        .unwrap()
        .unwrap()
        .state;
    assert!(
        matches!(state, RunState::Terminated(ref t) if t.status == TerminalStatus::Failed),
        "run_until_idle: {:?}; state: {state:?}",
        idle.map_err(|e| e.to_string())
    );
}

/// Two workflows in one router, each declaring its own patch.
struct Alpha;

#[workflow(name = "review41b-alpha", output = String, version = "a1", patches = ["alpha-fix"])]
impl Alpha {
    #[step(start)]
    async fn go(ctx: StepContext<'_>, ask: String) -> Result<Transition<AlphaStep>, StepError> {
        Ok(Transition::done(format!("{}", ctx.patched(&ask)?)))
    }
}

struct Beta;

#[workflow(name = "review41b-beta", output = String, version = "b7", patches = ["beta-fix"])]
impl Beta {
    #[step(start)]
    async fn go(ctx: StepContext<'_>, ask: String) -> Result<Transition<BetaStep>, StepError> {
        Ok(Transition::done(format!("{}", ctx.patched(&ask)?)))
    }
}

#[tokio::test(start_paused = true)]
async fn a_router_answers_each_workflows_patches_and_records_each_version() {
    let router = taquba_workflow::workflows::Workflows::builder()
        .register(Alpha)
        .register(Beta)
        .build();
    let env = TestRuntime::new(router).await.unwrap();
    let alpha = env
        .start(AlphaInput {
            ask: "alpha-fix".into(),
        })
        .await
        .unwrap();
    let beta = env
        .start(BetaInput {
            ask: "beta-fix".into(),
        })
        .await
        .unwrap();
    let cross = env
        .start(AlphaInput {
            ask: "beta-fix".into(),
        })
        .await
        .unwrap();
    env.run_until_idle().await.unwrap();
    assert_eq!(alpha.output().await.unwrap(), "true");
    assert_eq!(beta.output().await.unwrap(), "true");
    match cross.output().await {
        Err(TestError::RunFailed(err)) => {
            let text = err.to_string();
            assert!(
                text.contains("\"beta-fix\"") && text.contains("review41b-alpha"),
                "{text}"
            );
        }
        other => panic!("alpha does not declare beta's patch: {other:?}"),
    }
    let view = env.runtime().unwrap().view().clone();
    let a = view.run(alpha.id()).await.unwrap().unwrap();
    let b = view.run(beta.id()).await.unwrap().unwrap();
    assert_eq!(
        (a.version.as_deref(), &a.patches[..]),
        (Some("a1"), &["alpha-fix".to_string()][..])
    );
    assert_eq!(
        (b.version.as_deref(), &b.patches[..]),
        (Some("b7"), &["beta-fix".to_string()][..])
    );
}

/// Panics in its only step.
struct Panicky;

#[workflow(name = "review41b-panicky", output = ())]
impl Panicky {
    #[step(start)]
    async fn explode(what: String) -> Result<Transition<PanickyStep>, StepError> {
        panic!("boom: {what}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_kit_reports_a_panicking_step_as_the_runs_failure_naming_the_panic() {
    let env = TestRuntime::builder(Panicky)
        .max_attempts(2)
        .build()
        .await
        .unwrap();
    let run = env.start(PanickyInput { what: "w".into() }).await.unwrap();
    env.run_until_ended(run.id()).await.unwrap();
    match run.output().await {
        Err(err @ TestError::RunFailed(_)) => {
            assert!(err.to_string().contains("boom: w"), "{err}")
        }
        other => panic!("expected the run's failure: {other:?}"),
    }
    let history = run.history().await.unwrap();
    let attempts: Vec<u32> = history.steps[0]
        .attempts
        .iter()
        .map(|a| a.attempt)
        .collect();
    assert_eq!(attempts, [1, 2]);
}

/// The same workflow in the kit and in a runtime driven by hand over a
/// mock clock agree on the output and on the history.
#[tokio::test(start_paused = true)]
async fn the_kit_and_the_real_runtime_agree_on_a_timer_chain_with_a_retry() {
    let config = taquba::QueueConfig::default()
        .retry_backoff_base(Duration::ZERO)
        .max_attempts(3);
    let env = TestRuntime::builder(Chain)
        .queue_config(config)
        .build()
        .await
        .unwrap();
    let run = env
        .start_as(rid("chain"), ChainInput { n: 0 }, Default::default())
        .await
        .unwrap();
    env.run_until_ended(run.id()).await.unwrap();
    let kit_output = run.output().await.unwrap();
    let kit_history = run.history().await.unwrap();

    let (queue, store, clock) = crate::common::memory_queue().await;
    let runtime = crate::common::workflow_builder(&queue, &store, &Chain).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let real = runtime
        .start_as(rid("chain"), ChainInput { n: 0 }, Default::default())
        .await
        .unwrap();
    for step in 1..=3 {
        crate::common::until_step("the next timer", &runtime, "chain", step).await;
        // Give the settlement a moment, then let the timer's hour pass.
        tokio::time::sleep(Duration::from_millis(50)).await;
        clock.advance(HOUR);
    }
    let output = crate::common::within(60, real.wait())
        .await
        .unwrap()
        .unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(output, kit_output);
    let history = runtime.view().steps(&rid("chain")).await.unwrap().unwrap();
    let shape = |h: &RunHistory| {
        h.steps
            .iter()
            .map(|s| {
                (
                    s.step,
                    s.name.clone(),
                    s.attempts
                        .iter()
                        .map(|a| (a.attempt, a.claimed_at_ms, format!("{:?}", a.outcome)))
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&history), shape(&kit_history));
    assert_eq!(history.version, kit_history.version);
}

#[tokio::test(start_paused = true)]
async fn a_signal_that_does_not_fit_the_step_input_limit_beside_the_payload_is_not_delivered_again()
{
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    let env = TestRuntime::builder(runner.clone())
        .configure(|b| b.step_input_limit(64))
        .build()
        .await
        .unwrap();
    // The payload `p2` fits, the 100-byte signal does not beside it.
    fail_at_step_2(&env, "orig", &[b's'; 100]).await;
    // The small signal fits.
    fail_at_step_2(&env, "small", b"tiny").await;
    runner.broken.store(false, Ordering::SeqCst);
    let runtime = env.runtime().unwrap();
    for (id, fork, signal) in [
        ("orig", "f-orig", None),
        ("small", "f-small", Some(b"tiny".to_vec())),
    ] {
        runtime
            .fork(&rid(id), 2, ForkOptions::new().run_id(rid(fork)))
            .await
            .unwrap();
        env.run_until_ended(&rid(fork)).await.unwrap();
        assert_eq!(result_of(&env, fork).await.0, TerminalStatus::Succeeded);
        assert_eq!(
            runner.seen_of(fork)[0],
            (2, b"p2".to_vec(), signal),
            "{fork}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_forked_group_member_is_a_plain_run_and_a_forgotten_one_is_unknown() {
    let runner = Forkable::default();
    runner.broken.store(true, Ordering::SeqCst);
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    let runtime = env.runtime().unwrap();
    let group = runtime.group(rid("g"));
    group
        .submit(vec![crate::common::member("m", "in")], &Default::default())
        .await
        .unwrap();
    let member = crate::common::member_run_id("g", "m");
    env.run_until_idle().await.unwrap();
    env.signal_raw(&format!("sig:{member}"), b"s".to_vec())
        .await
        .unwrap();
    env.run_until_ended(&member).await.unwrap();
    runner.broken.store(false, Ordering::SeqCst);
    let fork = runtime
        .fork(&member, 2, ForkOptions::new().run_id(rid("member-fork")))
        .await
        .unwrap();
    env.run_until_ended(&fork.run_id).await.unwrap();
    let details = runtime.view().run(&fork.run_id).await.unwrap().unwrap();
    assert_eq!(details.group, None);
    assert_eq!(details.group_key, None);
    // The group still sees its member failed.
    let original = runtime.view().run(&member).await.unwrap().unwrap();
    assert!(
        matches!(original.state, RunState::Terminated(t) if t.status == TerminalStatus::Failed)
    );
    group.forget().await.unwrap();
    env.run_until_idle().await.unwrap();
    let err = runtime
        .fork(&member, 2, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::StepNotForkable { ref run_id, step: 2, .. } if *run_id == member),
        "{err}"
    );
    assert!(err.to_string().contains("not known"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn generated_ids_stay_in_submission_order_after_skipping_to_a_far_timeout() {
    let env = TestRuntime::new(Forever).await.unwrap();
    let first = env.start(ForeverInput { key: "k".into() }).await.unwrap();
    env.run_until_idle().await.unwrap();
    env.run_until_ended(first.id()).await.unwrap();
    assert!(!first.output().await.unwrap(), "the timeout fired");
    let second = env.start(ForeverInput { key: "k2".into() }).await.unwrap();
    // "sorted, they list runs in the order they were submitted"
    assert!(
        second.id() > first.id(),
        "{} submitted after {} sorts before it (clock at {} ms)",
        second.id(),
        first.id(),
        env.now_ms()
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelling_fork_dropped_at_any_await_completes_when_called_again() {
    let runner = Forkable::default();
    let env = TestRuntime::new(runner.clone()).await.unwrap();
    let runtime = env.runtime().unwrap();
    for budget_us in [0u64, 1, 50, 500, 5_000] {
        let id = format!("busy-{budget_us}");
        let fork_id = format!("fork-{budget_us}");
        env.submit(plain(&id)).await.unwrap();
        env.run_until_idle().await.unwrap();
        let options = ForkOptions::new().run_id(rid(&fork_id)).cancel_active(true);
        let _ = tokio::time::timeout(
            Duration::from_micros(budget_us),
            runtime.fork(&rid(&id), 1, options.clone()),
        )
        .await;
        env.run_until_idle().await.unwrap();
        let made = runtime.fork(&rid(&id), 1, options).await.unwrap();
        assert_eq!(made.run_id.as_str(), fork_id);
        let original = runtime.wait(&rid(&id)).await.unwrap();
        assert_eq!(original.termination.status, TerminalStatus::Cancelled);
        env.run_until_idle().await.unwrap();
        env.signal_raw(&format!("sig:{fork_id}"), b"z".to_vec())
            .await
            .unwrap();
        env.run_until_ended(&made.run_id).await.unwrap();
        assert_eq!(
            result_of(&env, &fork_id).await,
            (TerminalStatus::Succeeded, "undeclared".into())
        );
        let step1 = runner
            .seen_of(&fork_id)
            .iter()
            .filter(|(s, ..)| *s == 1)
            .count();
        assert_eq!(step1, 1, "{fork_id}");
    }
}

#[tokio::test(start_paused = true)]
async fn every_step_the_history_lists_is_forkable_and_the_others_are_refused_naming_the_limit() {
    let env = TestRuntime::builder(Countdown {
        steps: 30,
        flaky_at: None,
        calls: AtomicU32::new(0),
    })
    .configure(|b| b.history_limit(3))
    .build()
    .await
    .unwrap();
    env.submit(plain("long")).await.unwrap();
    env.run_until_ended(&rid("long")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let history = env.history(&rid("long")).await.unwrap();
    let listed: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
    for step in 0..30u32 {
        let input = runtime.view().step_input(&rid("long"), step).await;
        if listed.contains(&step) {
            let expected = match step {
                0 => b"zero".to_vec(),
                n => format!("s{n}").into_bytes(),
            };
            assert_eq!(input.unwrap(), expected, "step {step}");
        } else {
            let err = input.unwrap_err();
            assert!(
                matches!(err, Error::StepNotForkable { step: s, .. } if s == step)
                    && err.to_string().contains("history_limit"),
                "step {step}: {err}"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_removed_by_retention_is_refused_naming_retention() {
    let env = TestRuntime::builder(Countdown {
        steps: 2,
        flaky_at: None,
        calls: AtomicU32::new(0),
    })
    .configure(|b| b.memo_retention(HOUR))
    .build()
    .await
    .unwrap();
    env.submit(plain("old")).await.unwrap();
    env.run_until_ended(&rid("old")).await.unwrap();
    let runtime = env.runtime().unwrap();
    runtime
        .fork(&rid("old"), 1, ForkOptions::new().run_id(rid("f1")))
        .await
        .unwrap();
    env.advance(2 * HOUR).await.unwrap();
    assert!(runtime.status(&rid("old")).await.unwrap().is_none());
    let err = runtime
        .fork(&rid("old"), 1, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("retention") && err.to_string().contains("`old`"),
        "{err}"
    );
    // A retried fork under the id of a fork that retention removed too.
    let again = runtime
        .fork(&rid("old"), 1, ForkOptions::new().run_id(rid("f1")))
        .await;
    assert!(again.is_err(), "{again:?}");
}

async fn crash_mid_step_scenario() -> RunHistory {
    let env = TestRuntime::new(Blocking {
        at: AtomicU32::new(1),
        last: 3,
        started: tokio::sync::Notify::new(),
        calls: Mutex::new(Vec::new()),
    })
    .await
    .unwrap();
    env.submit(plain("mid")).await.unwrap();
    tokio::select! {
        ran = env.run_until_idle() => panic!("step 1 did not block: {ran:?}"),
        () = env.runner().started.notified() => {}
    }
    env.crash().await.unwrap();
    env.run_until_idle().await.unwrap();
    env.history(&rid("mid")).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_crash_mid_step_is_the_same_crash_on_every_run() {
    let first = crash_mid_step_scenario().await;
    let second = crash_mid_step_scenario().await;
    assert_eq!(first, second);
    assert!(matches!(
        first.steps[1].attempts[0].outcome,
        AttemptOutcome::Interrupted
    ));
}

/// A slow first step (a call that takes `slow` of Tokio time), then a
/// wait for a signal.
struct Slow;

static SLOW_SECS: AtomicU32 = AtomicU32::new(0);

#[workflow(name = "review41b-slow", output = String)]
impl Slow {
    #[step(start)]
    async fn call(order: String) -> Result<Transition<SlowStep>, StepError> {
        let secs = SLOW_SECS.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(u64::from(secs))).await;
        let key = format!("done:{order}");
        Ok(Transition::on_signal(SlowStep::Finish { order }, key, HOUR))
    }

    #[step]
    async fn finish(order: String) -> Result<Transition<SlowStep>, StepError> {
        Ok(Transition::done(order))
    }
}

#[tokio::test(start_paused = true)]
async fn a_crash_after_a_slow_step_reopens_the_store() {
    // A 20 s call: Tokio's paused time runs 20 s ahead of the wall clock.
    SLOW_SECS.store(20, Ordering::SeqCst);
    let env = TestRuntime::new(Slow).await.unwrap();
    let run = env.start(SlowInput { order: "o".into() }).await.unwrap();
    assert_eq!(env.run_until_idle().await.unwrap(), 1);
    // The process dies while the run waits for its signal.
    let crashed = env.crash().await;
    assert!(crashed.is_ok(), "{:?}", crashed.map_err(|e| e.to_string()));
    let signalled = env.signal("done:o", &()).await;
    assert!(
        signalled.is_ok(),
        "the reopened store refuses writes: {:?}",
        signalled.map_err(|e| e.to_string())
    );
    env.run_until_idle().await.unwrap();
    assert_eq!(run.output().await.unwrap(), "o");
}
