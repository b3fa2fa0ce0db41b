//! `#[workflow]` end to end: a timer, a signal wait and a memoized call
//! that survives a crash mid-run; several workflows sharing one runtime
//! through the router; unknown workflows and steps failing permanently.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::workflows::{
    StepContext, Transition, Workflow, WorkflowError, WorkflowStep, Workflows, encode_step,
};
use taquba_workflow::{
    NoopTerminalHook, RunSpec, StepError, StepRunner, TerminalStatus, WorkflowRuntime, workflow,
};

/// What a fulfilled order returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    order_id: String,
    charge_id: String,
    tracking: String,
}

static CHARGES: AtomicUsize = AtomicUsize::new(0);
static CRASH_AFTER_CHARGE: AtomicBool = AtomicBool::new(true);
static CHARGED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Charges, packs after a timer, ships when the warehouse signals.
#[derive(Default)]
pub struct Fulfil;

#[workflow(name = "fulfil", output = Receipt)]
impl Fulfil {
    /// Charges the order once, however often the step runs.
    #[step(start)]
    async fn charge(
        ctx: StepContext<'_>,
        order_id: &str,
        cents: u64,
    ) -> Result<Transition<FulfilStep>, StepError> {
        let charge_id: String = ctx
            .memo
            .memoized("charge", async {
                CHARGES.fetch_add(1, Ordering::SeqCst);
                Ok::<_, StepError>(format!("ch-{order_id}-{cents}"))
            })
            .await?;
        if CRASH_AFTER_CHARGE.swap(false, Ordering::SeqCst) {
            // The process dies here, after the charge and before the step
            // settles: the test drops this process's runtime.
            CHARGED.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(Transition::after(
            FulfilStep::Pack {
                order_id: order_id.to_string(),
                charge_id,
            },
            Duration::from_millis(100),
        ))
    }

    /// Waits for the warehouse.
    #[step]
    async fn pack(
        order_id: String,
        charge_id: String,
    ) -> Result<Transition<FulfilStep>, StepError> {
        let key = format!("shipped:{order_id}");
        Ok(Transition::on_signal(
            FulfilStep::Ship {
                order_id,
                charge_id,
            },
            key,
            Duration::from_secs(60),
        ))
    }

    /// Ships with the tracking number the signal carried.
    #[step]
    async fn ship(
        ctx: StepContext<'_>,
        order_id: String,
        charge_id: String,
    ) -> Result<Transition<FulfilStep>, StepError> {
        assert_eq!(ctx.step_name(), "ship");
        assert_eq!(ctx.workflow_name(), "fulfil");
        match ctx.signal_value::<String>()? {
            Some(tracking) => Ok(Transition::done(Receipt {
                order_id,
                charge_id,
                tracking,
            })),
            None => Ok(Transition::fail("the warehouse never answered")),
        }
    }
}

/// A second workflow in the same binary, holding state through `&self`.
#[derive(Default)]
pub struct Greeter {
    greeting: String,
}

#[workflow(output = String)]
impl Greeter {
    #[step(start)]
    async fn greet(&self, name: String) -> Result<Transition<GreeterStep>, StepError> {
        if name.is_empty() {
            return Ok(Transition::cancel("nobody to greet"));
        }
        Ok(Transition::next(GreeterStep::Sign {
            text: format!("{} {name}", self.greeting),
        }))
    }

    #[step]
    async fn sign(text: &str) -> Result<Transition<GreeterStep>, StepError> {
        Ok(Transition::done(format!("{text}.")))
    }
}

fn open_options() -> OpenOptions {
    OpenOptions::default()
        .scheduler_interval(Duration::from_millis(20))
        .reaper_interval(Duration::from_millis(50))
        .queue_config(
            "workflow-steps",
            QueueConfig::default().retry_backoff_base(Duration::ZERO),
        )
}

async fn open(store: &Arc<dyn ObjectStore>) -> Arc<Queue> {
    Arc::new(
        Queue::open_with_options(store.clone(), "db", open_options())
            .await
            .expect("queue opens"),
    )
}

fn runtime<R: StepRunner>(
    queue: Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: R,
) -> WorkflowRuntime<R, NoopTerminalHook> {
    WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(20))
        .build()
}

fn process() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
fn a_timer_a_signal_and_a_memoized_call_survive_a_crash_mid_run() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());

    // Process 1 hosts `Fulfil` alone, starts a run and dies in its first
    // step, after the memoized charge.
    let first = process();
    let run_id = first.block_on(async {
        let rt = runtime(open(&store).await, &store, Fulfil);
        let _worker = rt.spawn(std::future::pending::<()>());
        let run = rt
            .start(FulfilInput {
                order_id: "o-1".into(),
                cents: 500,
            })
            .await
            .expect("starts");
        assert!(run.newly_submitted());
        tokio::time::timeout(Duration::from_secs(10), CHARGED.notified())
            .await
            .expect("the charge step runs");
        run.id().clone()
    });
    first.shutdown_timeout(Duration::from_millis(200));
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);

    // Process 2 hosts every registered workflow; the interrupted step runs
    // again, reads the memoized charge, sleeps on its timer, and waits for
    // the signal (sent early: it is buffered).
    let second = process();
    second.block_on(async {
        let rt = runtime(open(&store).await, &store, Workflows::registered());
        let worker = rt.spawn(std::future::pending::<()>());
        rt.signal_value("shipped:o-1", "trk-42")
            .await
            .expect("signals");
        let run = rt.workflow_run::<Fulfil>(run_id);
        let receipt = tokio::time::timeout(Duration::from_secs(20), run.wait())
            .await
            .expect("the run ends")
            .expect("the run is read")
            .expect("the run succeeds");
        assert_eq!(
            receipt,
            Receipt {
                order_id: "o-1".into(),
                charge_id: "ch-o-1-500".into(),
                tracking: "trk-42".into(),
            }
        );
        // The durable record gives the same typed result.
        assert_eq!(run.outcome().await.expect("reads"), Some(Ok(receipt)));
        worker.shutdown().await.expect("worker stops");
    });
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1, "the charge ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflows_share_one_runtime_through_the_router() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let router = Workflows::builder()
        .register(Greeter {
            greeting: "hello".into(),
        })
        .register_all()
        .build();
    assert_eq!(router.names().collect::<Vec<_>>(), ["Greeter", "fulfil"]);
    let rt = runtime(open(&store).await, &store, router);
    let worker = rt.spawn(std::future::pending::<()>());

    let greeting = rt
        .start(GreeterInput { name: "ada".into() })
        .await
        .expect("starts")
        .await
        .expect("reads")
        .expect("succeeds");
    assert_eq!(greeting, "hello ada.");

    let cancelled = rt
        .start(GreeterInput {
            name: String::new(),
        })
        .await
        .expect("starts")
        .await
        .expect("reads");
    match cancelled {
        Err(WorkflowError {
            status: TerminalStatus::Cancelled,
            message: Some(message),
            ..
        }) => assert_eq!(message, "nobody to greet"),
        other => panic!("expected a cancellation, got {other:?}"),
    }
    worker.shutdown().await.expect("worker stops");
}

async fn failure_of(
    rt: &WorkflowRuntime<impl StepRunner + 'static, NoopTerminalHook>,
    input: Vec<u8>,
) -> String {
    let submitted = rt
        .submit(RunSpec {
            input,
            ..RunSpec::default()
        })
        .await
        .expect("submits");
    let end = tokio::time::timeout(Duration::from_secs(10), rt.wait(&submitted.run_id))
        .await
        .expect("the run ends")
        .expect("the run is read");
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    end.termination.error.unwrap_or_default()
}

#[derive(Serialize)]
struct RawEnvelope<'a> {
    workflow: &'a str,
    step: BTreeMap<&'a str, BTreeMap<&'a str, u8>>,
}

fn raw(workflow: &str, step: &str) -> Vec<u8> {
    rmp_serde::to_vec_named(&RawEnvelope {
        workflow,
        step: [(step, BTreeMap::new())].into_iter().collect(),
    })
    .expect("encodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_workflows_and_steps_fail_permanently_with_their_names() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let router = Workflows::builder()
        .register(Greeter {
            greeting: "hi".into(),
        })
        .build();
    let rt = runtime(open(&store).await, &store, router);
    let worker = rt.spawn(std::future::pending::<()>());

    // A workflow the router does not host.
    let payload = encode_step(&FulfilStep::Pack {
        order_id: "o".into(),
        charge_id: "c".into(),
    })
    .expect("encodes");
    let error = failure_of(&rt, payload).await;
    assert!(
        error.contains("no workflow named `fulfil`") && error.contains("`Greeter`"),
        "{error}"
    );

    // A step the workflow does not have (a run of another version).
    let error = failure_of(&rt, raw("Greeter", "refund")).await;
    assert!(
        error.contains("workflow `Greeter` has no step named `refund`"),
        "{error}"
    );
    assert!(error.contains("`greet`, `sign`"), "{error}");

    // Not a workflow payload at all.
    let error = failure_of(&rt, b"not msgpack".to_vec()).await;
    assert!(error.contains("not a `#[workflow]` step"), "{error}");
    worker.shutdown().await.expect("worker stops");
}

#[test]
fn the_generated_constants_describe_the_workflow() {
    assert_eq!(Fulfil::NAME, "fulfil");
    assert_eq!(Fulfil::START, "charge");
    assert_eq!(Fulfil::STEPS, ["charge", "pack", "ship"]);
    assert_eq!(Greeter::NAME, "Greeter");
    let step = FulfilStep::Ship {
        order_id: "o".into(),
        charge_id: "c".into(),
    };
    assert_eq!(step.name(), "ship");
}
