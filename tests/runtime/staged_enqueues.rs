//! Enqueues a caller stages beside the runtime's own writes
//! (`RunSpec::effects`, `TerminalEffects::enqueue`) cannot forge the
//! runtime's jobs: a `workflow.` header or the runtime's own queue is
//! refused where it is staged, naming the header or the queue, and nothing
//! of the submission or the hook's effects commits.

use crate::common;

use std::sync::{Arc, Mutex};

use common::*;
use taquba::{EnqueueOptions, EnqueueRequest, JobStatus, SettlementEffects};
use taquba_workflow::{
    Error, HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, RunOutcome, RunSpec, Step, StepError,
    StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime,
};

#[derive(Clone)]
struct Succeeds;

impl StepRunner for Succeeds {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

fn request(queue: &str, headers: &[(&str, &str)]) -> EnqueueRequest {
    EnqueueRequest {
        queue: queue.to_string(),
        payload: b"follow-up".to_vec(),
        options: EnqueueOptions::default().headers(
            headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
    }
}

/// A spec for run `id` whose effects enqueue `request` and write `app/k`.
fn spec_with(id: &str, request: EnqueueRequest) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        effects: SettlementEffects::default()
            .enqueue(request)
            .kv_put("app/k", "v"),
        ..Default::default()
    }
}

async fn jobs_on(queue: &taquba::Queue, name: &str) -> usize {
    let mut count = 0;
    for status in [JobStatus::Pending, JobStatus::Scheduled, JobStatus::Dead] {
        count += queue
            .view()
            .list_jobs(name, status, None, 100)
            .await
            .expect("list")
            .jobs
            .len();
    }
    count
}

#[tokio::test(start_paused = true)]
async fn a_submission_enqueue_with_a_reserved_header_is_refused_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Succeeds).build();
    for header in [
        HEADER_RUN_ID,
        HEADER_STEP,
        HEADER_TERMINAL,
        "workflow.custom",
    ] {
        let forged = request("elsewhere", &[(header, "victim"), ("tenant", "a")]);
        let err = runtime
            .submit(spec_with("forger", forged))
            .await
            .expect_err("a reserved header in an effect enqueue is refused");
        assert!(
            matches!(&err, Error::ReservedHeaderInSubmit(name) if name == header),
            "{err:?}"
        );
        assert!(err.to_string().contains(header), "{err}");
    }
    // Nothing of the refused submissions committed.
    assert!(runtime.status(&rid("forger")).await.unwrap().is_none());
    assert!(queue.view().kv_get(b"app/k").await.unwrap().is_none());
    assert_eq!(jobs_on(&queue, "elsewhere").await, 0);

    // User headers on another queue ride along as before.
    let fine = request("elsewhere", &[("tenant", "a")]);
    assert!(
        runtime
            .submit(spec_with("honest", fine))
            .await
            .unwrap()
            .newly_submitted
    );
    assert_eq!(jobs_on(&queue, "elsewhere").await, 1);
}

#[tokio::test(start_paused = true)]
async fn a_submission_enqueue_into_the_runtimes_own_queue_is_refused_naming_it() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Succeeds).build();
    let err = runtime
        .submit(spec_with("r", request(STEPS, &[("tenant", "a")])))
        .await
        .expect_err("an enqueue into the runtime's queue is refused");
    assert!(
        matches!(&err, Error::Queue(taquba::Error::InvalidQueueName { queue, .. }) if queue == STEPS),
        "{err:?}"
    );
    assert!(err.to_string().contains(STEPS), "{err}");
    assert!(err.is_permanent());
    assert!(runtime.status(&rid("r")).await.unwrap().is_none());
    assert!(queue.view().kv_get(b"app/k").await.unwrap().is_none());
    assert_eq!(jobs_on(&queue, STEPS).await, 0);

    // The check follows the runtime's queue name: the default name is just
    // another queue to a runtime on "orders".
    let orders = workflow_builder(&queue, &store, &Succeeds)
        .queue_name("orders")
        .build();
    let err = orders
        .submit(spec_with("o", request("orders", &[])))
        .await
        .expect_err("refused on the runtime's own queue");
    assert!(err.to_string().contains("`orders`"), "{err}");
    orders
        .submit(spec_with("o", request(STEPS, &[])))
        .await
        .expect("the default queue name is another queue here");
}

/// A hook that stages `request` and returns what staging said.
#[derive(Clone)]
struct StagesEnqueue {
    request: EnqueueRequest,
    staged: Arc<Mutex<Vec<String>>>,
}

impl TerminalHook for StagesEnqueue {
    async fn on_termination(
        &self,
        _outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        effects.put("app/hook", "ran")?;
        let result = effects.enqueue(self.request.clone());
        self.staged.lock().unwrap().push(match &result {
            Ok(()) => "ok".to_string(),
            Err(err) => err.to_string(),
        });
        result?;
        Ok(())
    }
}

/// Run one run through a runtime whose hook stages `request`; returns what
/// staging said and the dead notification's error, if any.
async fn hook_staging(
    request: EnqueueRequest,
) -> (Vec<String>, Option<String>, Arc<taquba::Queue>) {
    let (queue, store, _clock) = memory_queue().await;
    let hook = StagesEnqueue {
        request,
        staged: Arc::default(),
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Succeeds, hook.clone())
        .poll_interval(std::time::Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "r").await;
    let end = within(30, runtime.wait(&rid("r"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook ran", || async {
        !hook.staged.lock().unwrap().is_empty()
    })
    .await;
    let dead_error = {
        let mut found = None;
        for _ in 0..100 {
            if let Some(job) = dead_jobs(&queue)
                .await
                .into_iter()
                .find(|j| j.headers.contains_key(HEADER_TERMINAL))
            {
                found = job.last_error;
                break;
            }
            if queue.view().kv_get(b"app/hook").await.unwrap().is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        found
    };
    worker.shutdown().await.unwrap();
    let staged = hook.staged.lock().unwrap().clone();
    drop(runtime);
    (staged, dead_error, queue)
}

#[tokio::test(start_paused = true)]
async fn a_hook_enqueue_with_a_reserved_header_is_refused_at_staging() {
    let (staged, dead, queue) =
        hook_staging(request("elsewhere", &[(HEADER_RUN_ID, "victim")])).await;
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(staged[0].contains(HEADER_RUN_ID), "{staged:?}");
    // The hook passed the error on: the notification is dead-lettered with
    // it, and nothing it staged committed.
    let dead = dead.expect("the notification is dead-lettered");
    assert!(dead.contains(HEADER_RUN_ID), "{dead}");
    assert_eq!(jobs_on(&queue, "elsewhere").await, 0);
    assert!(queue.view().kv_get(b"app/hook").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_hook_enqueue_into_the_runtimes_own_queue_is_refused_at_staging() {
    let (staged, dead, queue) = hook_staging(request(STEPS, &[("kind", "follow-up")])).await;
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(staged[0].contains(STEPS), "{staged:?}");
    let dead = dead.expect("the notification is dead-lettered");
    assert!(dead.contains(STEPS), "{dead}");
    // Only the dead notification is on the runtime's queue: no follow-up
    // job was committed to be dead-lettered as a malformed step.
    let dead_jobs = dead_jobs(&queue).await;
    assert_eq!(dead_jobs.len(), 1, "{dead_jobs:?}");
    assert!(dead_jobs[0].headers.contains_key(HEADER_TERMINAL));
    assert!(queue.view().kv_get(b"app/hook").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_hook_enqueue_on_another_queue_still_commits() {
    let (staged, dead, queue) = hook_staging(request("elsewhere", &[("kind", "x")])).await;
    assert_eq!(staged, vec!["ok".to_string()]);
    assert!(dead.is_none(), "{dead:?}");
    assert_eq!(jobs_on(&queue, "elsewhere").await, 1);
    assert_eq!(
        queue.view().kv_get(b"app/hook").await.unwrap().as_deref(),
        Some(b"ran".as_slice())
    );
}

#[test]
fn a_detached_terminal_effects_refuses_reserved_headers_too() {
    let effects = TerminalEffects::detached();
    let err = effects
        .enqueue(request("q", &[(HEADER_STEP, "0")]))
        .expect_err("refused");
    assert!(
        matches!(&err, Error::ReservedHeaderInSubmit(name) if name == HEADER_STEP),
        "{err:?}"
    );
    effects
        .enqueue(request("q", &[("tenant", "a")]))
        .expect("a user header is fine");
}
