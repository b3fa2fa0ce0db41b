//! Fork and restart at the public API: a fork from step k of a failed run
//! runs no step before k (step executions counted) and starts k with the
//! payload it was delivered with; a restart starts again from step 0; an
//! active run is refused unless the fork cancels it first; a step whose
//! input is no longer recorded is refused naming the run and step; the
//! link to the original is shown by the view; a retried fork under the
//! same id makes no second run; the inbox's fork command.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use taquba_workflow::inbox::{Command, CommandAnswer, CommandState, Inbox};
use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{
    Error, ForkOptions, ForkedFrom, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus,
};

/// The steps each run delivered, with their payloads, in order.
type Seen = Arc<Mutex<Vec<(String, u32, Vec<u8>)>>>;

/// Four steps: step n continues with payload `p{n+1}`; step 3 fails
/// permanently while `broken`, else succeeds with its payload. Step 1
/// waits an hour when its payload is `wait`.
fn four_steps(seen: Seen, broken: Arc<AtomicBool>) -> impl StepRunner {
    let runner = move |step: Step| {
        let (seen, broken) = (seen.clone(), broken.clone());
        async move {
            seen.lock().unwrap().push((
                step.run_id.to_string(),
                step.step_number,
                step.payload.clone(),
            ));
            let next = format!("p{}", step.step_number + 1).into_bytes();
            match step.step_number {
                3 if broken.load(Ordering::SeqCst) => Err(StepError::permanent("bug in step 3")),
                3 => Ok(StepOutcome::Succeed {
                    result: step.payload.clone(),
                }),
                0 if step.payload == b"wait" => {
                    Ok(StepOutcome::continue_after(next, Duration::from_secs(3600)))
                }
                _ => Ok(StepOutcome::continue_now(next)),
            }
        }
    };
    FnRunner(runner)
}

/// How many times run `run` delivered step `step`.
fn runs_of(seen: &Seen, run: &str, step: u32) -> usize {
    let seen = seen.lock().unwrap();
    seen.iter()
        .filter(|(r, s, _)| r == run && *s == step)
        .count()
}

fn spec(id: &str, input: &[u8]) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.to_vec(),
        options: RunOptions {
            headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_fork_from_step_k_of_a_failed_run_runs_no_step_before_k() {
    let (seen, broken) = (Seen::default(), Arc::new(AtomicBool::new(true)));
    let env = TestRuntime::new(four_steps(seen.clone(), broken.clone()))
        .await
        .unwrap();
    env.submit(spec("orig", b"in")).await.unwrap();
    env.run_until_ended(&rid("orig")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let ended = runtime.wait(&rid("orig")).await.unwrap();
    assert_eq!(ended.termination.status, TerminalStatus::Failed);

    // The bug is fixed; the run goes on from step 2 under a new id.
    broken.store(false, Ordering::SeqCst);
    let fork = runtime
        .fork(&rid("orig"), 2, ForkOptions::new().run_id(rid("fork")))
        .await
        .unwrap();
    assert!(fork.newly_submitted);
    assert_eq!(fork.run_id, rid("fork"));
    env.run_until_ended(&rid("fork")).await.unwrap();
    let end = runtime.wait(&rid("fork")).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 3);
    assert_eq!(end.outcome.unwrap().result.as_deref(), Some(&b"p3"[..]));

    // Steps 0 and 1 ran once (in the original), 2 and 3 once in each run.
    for step in [0, 1] {
        assert_eq!(runs_of(&seen, "orig", step), 1);
        assert_eq!(runs_of(&seen, "fork", step), 0, "step {step} ran again");
    }
    for step in [2, 3] {
        assert_eq!(runs_of(&seen, "fork", step), 1);
    }
    // Step 2 of the fork got the payload step 2 of the original got.
    let payload_of = |run: &str, step: u32| {
        let seen = seen.lock().unwrap();
        seen.iter()
            .find(|(r, s, _)| r == run && *s == step)
            .map(|(_, _, p)| p.clone())
    };
    assert_eq!(payload_of("fork", 2), payload_of("orig", 2));
    assert_eq!(payload_of("fork", 2).as_deref(), Some(&b"p2"[..]));

    // The link, and the headers that carried over.
    let details = runtime.view().run(&rid("fork")).await.unwrap().unwrap();
    let link = details.forked_from.clone().expect("linked to the original");
    assert_eq!((link.run_id.as_str(), link.step), ("orig", 2));
    assert_eq!(
        details.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let original = runtime.view().run(&rid("orig")).await.unwrap().unwrap();
    assert_eq!(original.forked_from, None);
    assert!(
        matches!(original.state, RunState::Terminated(t) if t.status == TerminalStatus::Failed)
    );
    // The fork's history starts at step 2.
    let history = env.history(&rid("fork")).await.unwrap();
    let steps: Vec<u32> = history.steps.iter().map(|s| s.step).collect();
    assert_eq!(steps, [2, 3]);

    // A retried fork under the same id answers the fork made, runs nothing.
    let again = runtime
        .fork(&rid("orig"), 2, ForkOptions::new().run_id(rid("fork")))
        .await
        .unwrap();
    assert!(!again.newly_submitted);
    assert_eq!(env.run_until_idle().await.unwrap(), 0);
    // The id of that fork is not another fork's.
    let taken = runtime
        .fork(&rid("orig"), 1, ForkOptions::new().run_id(rid("fork")))
        .await
        .unwrap_err();
    assert!(
        matches!(taken, Error::ForkRunIdTaken(ref id) if id.as_str() == "fork"),
        "{taken}"
    );
}

#[tokio::test(start_paused = true)]
async fn restart_runs_again_from_step_0_with_the_runs_input() {
    let (seen, broken) = (Seen::default(), Arc::new(AtomicBool::new(false)));
    let env = TestRuntime::new(four_steps(seen.clone(), broken))
        .await
        .unwrap();
    env.submit(spec("orig", b"in")).await.unwrap();
    env.run_until_ended(&rid("orig")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let restarted = runtime
        .restart(&rid("orig"), ForkOptions::new())
        .await
        .unwrap();
    assert_ne!(restarted.run_id, rid("orig"));
    // A generated id is a ULID.
    assert_eq!(restarted.run_id.as_str().len(), 26);
    env.run_until_ended(&restarted.run_id).await.unwrap();
    let new = restarted.run_id.as_str();
    for step in 0..4 {
        assert_eq!(runs_of(&seen, new, step), 1, "step {step}");
    }
    let input = seen
        .lock()
        .unwrap()
        .iter()
        .find(|(r, s, _)| r == new && *s == 0)
        .map(|(_, _, p)| p.clone());
    assert_eq!(input.as_deref(), Some(&b"in"[..]));
    let details = runtime
        .view()
        .run(&restarted.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        details.forked_from.map(|f: ForkedFrom| (f.run_id, f.step)),
        Some((rid("orig"), 0))
    );
}

#[tokio::test(start_paused = true)]
async fn an_active_run_is_refused_unless_the_fork_cancels_it_first() {
    let (seen, broken) = (Seen::default(), Arc::new(AtomicBool::new(false)));
    let env = TestRuntime::new(four_steps(seen.clone(), broken))
        .await
        .unwrap();
    // Step 0 continues to step 1 after an hour: the run is active.
    env.submit(spec("orig", b"wait")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let runtime = env.runtime().unwrap();
    let refused = runtime
        .fork(&rid("orig"), 0, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, Error::RunActive(ref id) if id.as_str() == "orig"),
        "{refused}"
    );
    assert!(
        runtime
            .status(&rid("orig"))
            .await
            .unwrap()
            .is_some_and(|s| !matches!(s.state, RunState::Terminated(_)))
    );

    // Cancelled first: the waiting step 1 is removed, and the fork starts
    // from it with the payload it waited with.
    let fork = runtime
        .fork(&rid("orig"), 1, ForkOptions::new().cancel_active(true))
        .await
        .unwrap();
    let original = runtime.wait(&rid("orig")).await.unwrap();
    assert_eq!(original.termination.status, TerminalStatus::Cancelled);
    env.run_until_ended(&fork.run_id).await.unwrap();
    let new = fork.run_id.as_str();
    assert_eq!(
        runs_of(&seen, "orig", 1),
        0,
        "step 1 never ran in the original"
    );
    assert_eq!(runs_of(&seen, new, 0), 0);
    assert_eq!(runs_of(&seen, new, 1), 1);
    let end = runtime.wait(&fork.run_id).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_step_whose_input_is_gone_is_refused_naming_the_run_and_step() {
    let (seen, broken) = (Seen::default(), Arc::new(AtomicBool::new(true)));
    // Payloads of more than 1 byte are not kept in the history: a fork
    // reads the step's job, which the queue keeps only for the dead step.
    let env = TestRuntime::builder(four_steps(seen.clone(), broken.clone()))
        .configure(|builder| builder.step_input_limit(1))
        .build()
        .await
        .unwrap();
    env.submit(spec("orig", b"in")).await.unwrap();
    env.run_until_ended(&rid("orig")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let err = runtime
        .fork(&rid("orig"), 1, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::StepNotForkable { ref run_id, step: 1, .. } if run_id.as_str() == "orig"),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("step 1 of run `orig`"), "{message}");
    assert!(
        message.contains("no longer holds the step's job"),
        "{message}"
    );
    // Past the run's end.
    let err = runtime
        .fork(&rid("orig"), 9, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ended at step 3"), "{err}");
    // An unknown run.
    let err = runtime
        .fork(&rid("nobody"), 0, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::StepNotForkable { .. }), "{err}");
    // The failed step's dead job is still in the dead letters: it forks.
    broken.store(false, Ordering::SeqCst);
    let fork = runtime
        .fork(&rid("orig"), 3, ForkOptions::new())
        .await
        .unwrap();
    env.run_until_ended(&fork.run_id).await.unwrap();
    assert_eq!(runs_of(&seen, fork.run_id.as_str(), 3), 1);
    // A fork of the fork cannot go before the step it started from.
    let err = runtime
        .fork(&fork.run_id, 1, ForkOptions::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fork `orig` instead"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn the_inbox_forks_under_the_commands_id() {
    let (seen, broken) = (Seen::default(), Arc::new(AtomicBool::new(false)));
    let env = TestRuntime::new(four_steps(seen.clone(), broken))
        .await
        .unwrap();
    env.submit(spec("orig", b"in")).await.unwrap();
    env.run_until_ended(&rid("orig")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let store: Arc<dyn taquba::object_store::ObjectStore> = env.store();
    let inbox = Inbox::new(store, MEMO_PREFIX);
    let id = inbox
        .send(Command::fork(rid("orig"), 2, None))
        .await
        .unwrap();
    assert_eq!(runtime.apply_inbox().await.unwrap(), 1);
    let state = runtime.view().command(&id).await.unwrap();
    let CommandState::Applied {
        answer:
            CommandAnswer::Forked {
                run_id,
                from_step,
                new_run_id,
            },
        ..
    } = state
    else {
        panic!("not applied as a fork: {state:?}");
    };
    assert_eq!((run_id, from_step), (rid("orig"), 2));
    assert_eq!(new_run_id.as_str(), id.to_string());
    env.run_until_ended(&new_run_id).await.unwrap();
    assert_eq!(runs_of(&seen, new_run_id.as_str(), 1), 0);
    assert_eq!(runs_of(&seen, new_run_id.as_str(), 2), 1);
    // A fork of an active run is rejected, naming it.
    env.submit(spec("busy", b"wait")).await.unwrap();
    env.run_until_idle().await.unwrap();
    let id = inbox
        .send(Command::fork(rid("busy"), 0, None))
        .await
        .unwrap();
    runtime.apply_inbox().await.unwrap();
    let state = runtime.view().command(&id).await.unwrap();
    assert!(
        matches!(&state, CommandState::Rejected { error, .. } if error.contains("`busy` is active")),
        "{state:?}"
    );
}

/// A cancelling fork of the run's current step while the step runs, its
/// payload over the step input limit: the cancel fires the step's token,
/// the step settles cancelled and its done job (the only copy of its
/// input) is deleted; the fork is made from the input read before the
/// cancel. The fork's step gets the payload the original's got.
#[tokio::test(start_paused = true)]
async fn a_cancelling_fork_of_a_running_step_with_a_large_payload_forks_it() {
    let seen = Seen::default();
    let started = Arc::new(tokio::sync::Notify::new());
    let runner = {
        let (seen, started) = (seen.clone(), started.clone());
        FnRunner(move |step: Step| {
            let (seen, started) = (seen.clone(), started.clone());
            async move {
                seen.lock().unwrap().push((
                    step.run_id.to_string(),
                    step.step_number,
                    step.payload.clone(),
                ));
                match step.step_number {
                    0 => Ok(StepOutcome::continue_now(vec![b'x'; 3000])),
                    // The original's step 1 runs until it is cancelled.
                    1 if step.run_id.as_str() == "orig" => {
                        started.notify_one();
                        step.cancel_token.cancelled().await;
                        Ok(StepOutcome::continue_now(Vec::new()))
                    }
                    _ => Ok(StepOutcome::Succeed {
                        result: step.payload.len().to_string().into_bytes(),
                    }),
                }
            }
        })
    };
    let env = TestRuntime::new(runner).await.unwrap();
    env.submit(spec("orig", b"in")).await.unwrap();
    let runtime = env.runtime().unwrap();
    let forking = async {
        started.notified().await;
        assert_eq!(
            runtime.status(&rid("orig")).await.unwrap().unwrap().state,
            RunState::Running
        );
        runtime
            .fork(
                &rid("orig"),
                1,
                ForkOptions::new().run_id(rid("fork")).cancel_active(true),
            )
            .await
    };
    let (ran, forked) = tokio::join!(env.run_until_idle(), forking);
    ran.unwrap();
    let fork = forked.unwrap();
    let original = runtime.wait(&rid("orig")).await.unwrap();
    assert_eq!(original.termination.status, TerminalStatus::Cancelled);
    // The ended run's records no longer hold step 1's input.
    let err = runtime
        .view()
        .step_input(&rid("orig"), 1)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::StepNotForkable { step: 1, .. }),
        "{err}"
    );
    env.run_until_ended(&fork.run_id).await.unwrap();
    let end = runtime.wait(&fork.run_id).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"3000"[..])
    );
    assert_eq!(runs_of(&seen, "fork", 0), 0);
    assert_eq!(runs_of(&seen, "fork", 1), 1);
}
