//! Two versions of one `#[workflow]` between two process runs, with runs
//! in flight: steps are stored by name, so version 2 (a step added, the
//! steps reordered) continues a run of version 1, and version 1 fails a
//! run parked at version 2's new step with a message naming both.

use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::workflows::WorkflowError;
use taquba_workflow::{
    NoopTerminalHook, RunId, RunState, StepRunner, TerminalStatus, WorkflowRuntime,
};

/// The first release.
mod v1 {
    use std::time::Duration;

    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up once they confirm their email.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step(start)]
        async fn register(email: String) -> Result<Transition<SignupStep>, StepError> {
            let key = format!("confirm:{email}");
            Ok(Transition::on_signal(
                SignupStep::Welcome { email },
                key,
                Duration::from_secs(60),
            ))
        }

        #[step]
        async fn welcome(email: String) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!("welcomed {email}")))
        }
    }
}

/// The next release: an `audit` step between `welcome` and the end, and
/// the steps declared in another order.
mod v2 {
    use std::time::Duration;

    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up once they confirm their email, then audits.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step]
        async fn audit(
            email: String,
            confirmed: bool,
        ) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!(
                "welcomed and audited {email} (confirmed: {confirmed})"
            )))
        }

        #[step]
        async fn welcome(email: String) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::after(
                SignupStep::Audit {
                    email,
                    confirmed: true,
                },
                Duration::from_millis(300),
            ))
        }

        #[step(start)]
        async fn register(email: String) -> Result<Transition<SignupStep>, StepError> {
            let key = format!("confirm:{email}");
            Ok(Transition::on_signal(
                SignupStep::Welcome { email },
                key,
                Duration::from_secs(60),
            ))
        }
    }
}

fn process() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn runtime<R: StepRunner>(
    store: &Arc<dyn ObjectStore>,
    runner: R,
) -> WorkflowRuntime<R, NoopTerminalHook> {
    let options = OpenOptions::default()
        .scheduler_interval(Duration::from_millis(20))
        .queue_config(
            "workflow-steps",
            QueueConfig::default().retry_backoff_base(Duration::ZERO),
        );
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("queue opens");
    WorkflowRuntime::builder(Arc::new(queue), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(20))
        .build()
}

/// Waits until `run_id` is pending at `step`.
async fn parked_at<R: StepRunner, H: taquba_workflow::TerminalHook>(
    rt: &WorkflowRuntime<R, H>,
    run_id: &RunId,
    step: u32,
) {
    for _ in 0..500 {
        if let Some(status) = rt.status(run_id).await.expect("status")
            && status.current_step == step
            && status.state == RunState::Pending
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("run {run_id} never parked at step {step}");
}

#[test]
fn a_step_added_between_two_process_runs_keeps_runs_in_flight() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());

    // Version 1 starts a run, which parks waiting for the confirmation.
    let first = process();
    let old_run = first.block_on(async {
        let rt = runtime(&store, v1::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let run = rt
            .start(v1::SignupInput {
                email: "ada@example.com".into(),
            })
            .await
            .expect("starts");
        parked_at(&rt, run.id(), 1).await;
        worker.shutdown().await.expect("worker stops");
        run.id().clone()
    });
    drop(first);

    // Version 2 continues it (its `welcome` now goes through `audit`), and
    // starts a run that parks on the timer before the new step.
    let second = process();
    let new_run = second.block_on(async {
        let rt = runtime(&store, v2::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        rt.signal_value("confirm:ada@example.com", &())
            .await
            .expect("signals");
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v2::Signup>(old_run).wait(),
        )
        .await
        .expect("the run ends")
        .expect("the run is read");
        assert_eq!(
            result.expect("succeeds"),
            "welcomed and audited ada@example.com (confirmed: true)"
        );

        let run = rt
            .start(v2::SignupInput {
                email: "bob@example.com".into(),
            })
            .await
            .expect("starts");
        parked_at(&rt, run.id(), 1).await;
        rt.signal_value("confirm:bob@example.com", &())
            .await
            .expect("signals");
        parked_at(&rt, run.id(), 2).await;
        worker.shutdown().await.expect("worker stops");
        run.id().clone()
    });
    second.shutdown_timeout(Duration::from_millis(200));

    // Version 1 again (a rollback): the run parked at `audit` fails
    // permanently, naming the workflow and the unknown step.
    let third = process();
    third.block_on(async {
        let rt = runtime(&store, v1::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v1::Signup>(new_run.clone()).wait(),
        )
        .await
        .expect("the run ends")
        .expect("the run is read");
        match result {
            Err(WorkflowError {
                status: TerminalStatus::Failed,
                message: Some(message),
                ..
            }) => assert!(
                message.contains("workflow `signup` has no step named `audit`")
                    && message.contains(&format!("run `{new_run}`")),
                "{message}"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
        worker.shutdown().await.expect("worker stops");
    });
}
