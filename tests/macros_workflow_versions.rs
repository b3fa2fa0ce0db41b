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

/// A later release: `welcome` renamed `greet`, which takes the runs parked
/// under its old name (`alias`); `register` kept.
mod v3 {
    use std::time::Duration;

    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up; the greeting step was renamed.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step(start)]
        async fn register(email: String) -> Result<Transition<SignupStep>, StepError> {
            let key = format!("confirm:{email}");
            Ok(Transition::on_signal(
                SignupStep::Greet { email },
                key,
                Duration::from_secs(60),
            ))
        }

        #[step(alias = "welcome", alias = "hello")]
        async fn greet(email: String) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!("greeted {email}")))
        }
    }
}

/// A release without the greeting step at all (no name or alias matches
/// `welcome`).
mod v4 {
    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up in one step.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step(start)]
        async fn register(email: String) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!("registered {email}")))
        }
    }
}

/// A release whose `welcome` gained a field with a default: runs parked
/// before it resume with the default.
mod v5 {
    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up on a plan.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step(start)]
        async fn register(email: String) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::next(SignupStep::Welcome {
                email,
                plan: "pro".into(),
            }))
        }

        #[step]
        async fn welcome(
            email: String,
            #[serde(default)] plan: String,
        ) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!("welcomed {email} on {plan:?}")))
        }
    }
}

/// A release whose `welcome` changed a field's type: runs parked before it
/// fail once, naming the field.
mod v6 {
    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Signs a user up by number.
    #[derive(Default)]
    pub struct Signup;

    #[workflow(name = "signup", output = String, vis = pub)]
    impl Signup {
        #[step(start)]
        async fn register(email: u64) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::next(SignupStep::Welcome { email }))
        }

        #[step]
        async fn welcome(email: u64) -> Result<Transition<SignupStep>, StepError> {
            Ok(Transition::done(format!("welcomed {email}")))
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

/// Runs of version 1 parked in `welcome`: version 3 renamed the step with
/// `alias = "welcome"` and resumes them; version 4 removed it, and a run
/// parked there fails once, with a permanent error naming the workflow,
/// the step and the run, after one attempt (no retry, no loop), while the
/// other runs go on.
#[test]
fn a_renamed_step_takes_its_parked_runs_and_a_removed_one_fails_them_once() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let first = process();
    let (renamed, removed) = first.block_on(async {
        let rt = runtime(&store, v1::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let mut parked = Vec::new();
        for email in ["ada@example.com", "bob@example.com"] {
            let run = rt
                .start(v1::SignupInput {
                    email: email.into(),
                })
                .await
                .expect("starts");
            parked_at(&rt, run.id(), 1).await;
            parked.push(run.id().clone());
        }
        // Ada confirmed: her `welcome` step is due, not yet run. Bob's
        // stays parked until the last release.
        worker.shutdown().await.expect("worker stops");
        rt.signal_value("confirm:ada@example.com", &())
            .await
            .expect("signals");
        (parked[0].clone(), parked[1].clone())
    });
    first.shutdown_timeout(Duration::from_millis(200));

    let second = process();
    second.block_on(async {
        let rt = runtime(&store, v3::Signup).await;
        // The step is hosted under its old name too: an inbox submission
        // naming it is accepted.
        assert!(
            format!("{:?}", taquba_workflow::StepRunner::hosted(&v3::Signup))
                .contains("\"welcome\""),
            "the alias is hosted"
        );
        let worker = rt.spawn(std::future::pending::<()>());
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v3::Signup>(renamed.clone()).wait(),
        )
        .await
        .expect("the run ends")
        .expect("the run is read");
        assert_eq!(result.expect("succeeds"), "greeted ada@example.com");
        let steps = rt
            .view()
            .steps(&renamed)
            .await
            .expect("reads")
            .expect("a history");
        assert_eq!(steps.steps.len(), 2, "{steps:?}");
        worker.shutdown().await.expect("worker stops");
    });
    second.shutdown_timeout(Duration::from_millis(200));

    let third = process();
    third.block_on(async {
        let rt = runtime(&store, v4::Signup).await;
        rt.signal_value("confirm:bob@example.com", &())
            .await
            .expect("signals");
        let worker = rt.spawn(std::future::pending::<()>());
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v4::Signup>(removed.clone()).wait(),
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
                message.contains("workflow `signup` has no step named `welcome`")
                    && message.contains(&format!("run `{removed}`")),
                "{message}"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
        let history = rt
            .view()
            .steps(&removed)
            .await
            .expect("reads")
            .expect("a history");
        let last = history.steps.last().expect("a step");
        assert_eq!(last.attempts.len(), 1, "one attempt: {last:?}");
        // Other runs go on.
        let fresh = rt
            .start(v4::SignupInput {
                email: "cy@example.com".into(),
            })
            .await
            .expect("starts");
        let done = tokio::time::timeout(Duration::from_secs(10), fresh.wait())
            .await
            .expect("ends")
            .expect("read");
        assert_eq!(done.expect("succeeds"), "registered cy@example.com");
        worker.shutdown().await.expect("worker stops");
    });
}

/// Runs of version 1 parked before `welcome`: version 5 added a field with
/// `#[serde(default)]` and resumes them with the default; version 6
/// changed the field's type and fails a parked run once, naming the field.
#[test]
fn a_changed_field_resumes_with_its_default_or_fails_naming_the_field() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let first = process();
    let (added, changed) = first.block_on(async {
        let rt = runtime(&store, v1::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let mut parked = Vec::new();
        for email in ["dee@example.com", "eve@example.com"] {
            let run = rt
                .start(v1::SignupInput {
                    email: email.into(),
                })
                .await
                .expect("starts");
            parked_at(&rt, run.id(), 1).await;
            parked.push(run.id().clone());
        }
        worker.shutdown().await.expect("worker stops");
        rt.signal_value("confirm:dee@example.com", &())
            .await
            .expect("signals");
        (parked[0].clone(), parked[1].clone())
    });
    first.shutdown_timeout(Duration::from_millis(200));

    let second = process();
    second.block_on(async {
        let rt = runtime(&store, v5::Signup).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v5::Signup>(added.clone()).wait(),
        )
        .await
        .expect("the run ends")
        .expect("the run is read");
        assert_eq!(
            result.expect("succeeds"),
            "welcomed dee@example.com on \"\""
        );
        worker.shutdown().await.expect("worker stops");
    });
    second.shutdown_timeout(Duration::from_millis(200));

    let third = process();
    third.block_on(async {
        let rt = runtime(&store, v6::Signup).await;
        rt.signal_value("confirm:eve@example.com", &())
            .await
            .expect("signals");
        let worker = rt.spawn(std::future::pending::<()>());
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<v6::Signup>(changed.clone()).wait(),
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
                message.contains("the parameters of step `welcome` do not decode (field `email`)")
                    && message.contains(&format!("run `{changed}`")),
                "{message}"
            ),
            other => panic!("expected a failure, got {other:?}"),
        }
        let history = rt
            .view()
            .steps(&changed)
            .await
            .expect("reads")
            .expect("a history");
        assert_eq!(history.steps.last().expect("a step").attempts.len(), 1);
        worker.shutdown().await.expect("worker stops");
    });
}

/// A workflow whose second step has a bug until it is fixed: `fetch`
/// counts its calls, `charge` fails while [`fixed::BROKEN`] is set.
mod fixed {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    pub static BROKEN: AtomicBool = AtomicBool::new(true);
    pub static FETCHES: AtomicUsize = AtomicUsize::new(0);
    pub static CHARGES: AtomicUsize = AtomicUsize::new(0);

    /// Fetches an amount, then charges it.
    #[derive(Default)]
    pub struct Billing;

    #[workflow(name = "billing", output = String, vis = pub)]
    impl Billing {
        #[step(start)]
        async fn fetch(order: u32) -> Result<Transition<BillingStep>, StepError> {
            FETCHES.fetch_add(1, Ordering::SeqCst);
            Ok(Transition::next(BillingStep::Charge {
                order,
                cents: order * 100,
            }))
        }

        #[step]
        async fn charge(order: u32, cents: u32) -> Result<Transition<BillingStep>, StepError> {
            CHARGES.fetch_add(1, Ordering::SeqCst);
            if BROKEN.load(Ordering::SeqCst) {
                return Err(StepError::permanent("charge: a bug"));
            }
            Ok(Transition::done(format!("charged order {order}: {cents}")))
        }
    }
}

/// A `#[workflow]` run that failed at `charge` is forked from that step
/// once the bug is fixed: `fetch` is not run again and `charge` gets the
/// step's fields as stored; a restart runs `fetch` again.
#[test]
fn a_workflow_run_forks_from_its_failed_step_with_the_stored_fields() {
    use std::sync::atomic::Ordering;
    use taquba_workflow::ForkOptions;

    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    process().block_on(async {
        let rt = runtime(&store, fixed::Billing).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let run = rt
            .start(fixed::BillingInput { order: 7 })
            .await
            .expect("starts");
        let failed = tokio::time::timeout(Duration::from_secs(10), run.wait())
            .await
            .expect("the run ends")
            .expect("the run is read");
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(fixed::FETCHES.load(Ordering::SeqCst), 1);

        fixed::BROKEN.store(false, Ordering::SeqCst);
        let fork = rt
            .fork(run.id(), 1, ForkOptions::new())
            .await
            .expect("forks");
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<fixed::Billing>(fork.run_id.clone())
                .wait(),
        )
        .await
        .expect("the fork ends")
        .expect("the fork is read");
        assert_eq!(result.expect("succeeds"), "charged order 7: 700");
        assert_eq!(fixed::FETCHES.load(Ordering::SeqCst), 1, "fetch ran again");
        assert_eq!(fixed::CHARGES.load(Ordering::SeqCst), 2);
        let details = rt
            .view()
            .run(&fork.run_id)
            .await
            .expect("read")
            .expect("known");
        assert_eq!(details.workflow.as_deref(), Some("billing"));
        assert_eq!(details.step_name.as_deref(), Some("charge"));
        let link = details.forked_from.expect("linked");
        assert_eq!((&link.run_id, link.step), (run.id(), 1));

        let restart = rt
            .restart(run.id(), ForkOptions::new())
            .await
            .expect("restarts");
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<fixed::Billing>(restart.run_id).wait(),
        )
        .await
        .expect("the restart ends")
        .expect("the restart is read");
        assert_eq!(result.expect("succeeds"), "charged order 7: 700");
        assert_eq!(fixed::FETCHES.load(Ordering::SeqCst), 2);
        worker.shutdown().await.expect("worker stops");
    });
}
