//! The signatures Rust users write, accepted by `#[job]`, `#[workflow]` and
//! `#[step]` and run end to end: attributes on parameters (doc comments,
//! lint levels, `#[cfg]`, `#[cfg_attr]`), named lifetimes, `Result`
//! aliases and nested results, `anyhow::Error` and
//! `Box<dyn Error + Send + Sync>` errors, and `#[cfg]`'d-out steps.

// `cfg(all())` is always on, on purpose: a parameter kept by a `#[cfg]`.
#![allow(clippy::non_minimal_cfg)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::jobs::{Job, JobContext, JobRunner, JoinError};
use taquba_workflow::workflows::{StepContext, Transition, Workflow};
use taquba_workflow::{
    NoopTerminalHook, StepErrorKind, StepRunner, WorkflowRuntime, job, workflow,
};

/// A job error that is a `std::error::Error`.
#[derive(Debug, thiserror::Error)]
#[error("bad: {0}")]
pub struct Bad(String);

// ---------------------------------------------------------------------------
// Jobs

/// Parameters with attributes: the field keeps them, a configured-out one
/// is absent from the struct and from the call.
#[job(name = "sig.attributes")]
async fn attributes(
    /// The greeting's target.
    name: String,
    #[allow(unused_mut)] mut times: u32,
    #[cfg(any())] never: u32,
    #[cfg(all())] always: u32,
    #[cfg_attr(all(), allow(unused_variables))] ignored: u8,
    #[cfg_attr(any(), cfg(any()))] kept: u8,
    #[cfg(feature = "webhooks")] with_webhooks: bool,
) -> Result<String, Bad> {
    #[cfg(any())]
    let _ = never;
    #[cfg(feature = "webhooks")]
    let _ = with_webhooks;
    Ok(format!("{name}x{times}+{always}+{kept}"))
}

/// Named lifetimes on the context and on borrowed parameters.
#[job(name = "sig.lifetimes")]
async fn lifetimes<'a>(
    ctx: JobContext<'a>,
    name: &'a str,
    tags: &'a [String],
) -> Result<String, Bad> {
    let attempt = ctx.attempts;
    Ok(format!("{name}:{}:{attempt}", tags.join(",")))
}

/// `anyhow::Result<T>`: the error is `anyhow::Error`, transient by default.
#[job(name = "sig.anyhow", max_attempts = 1)]
async fn with_anyhow(fail: bool) -> anyhow::Result<u32> {
    if fail {
        anyhow::bail!("anyhow says no");
    }
    Ok(7)
}

/// `std::io::Result<T>`.
#[job(name = "sig.io")]
async fn with_io(n: u64) -> std::io::Result<u64> {
    Ok(n * 3)
}

/// A boxed error.
#[job(name = "sig.boxed", max_attempts = 1)]
async fn with_box(fail: bool) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
    if fail {
        return Err("boxed no".into());
    }
    Ok(1)
}

/// A nested result: the output is the inner `Result`.
#[job(name = "sig.nested")]
async fn nested(inner_ok: bool) -> Result<Result<u8, String>, Bad> {
    Ok(if inner_ok { Ok(5) } else { Err("inner".into()) })
}

/// A local `type Result<T>` alias.
mod aliased {
    use super::{Bad, job};

    type Result<T> = core::result::Result<T, Bad>;

    /// Through the module's own `Result`.
    #[job(name = "sig.alias")]
    pub(crate) async fn via_alias(n: i32) -> Result<i32> {
        if n < 0 {
            return Err(Bad("negative".into()));
        }
        Ok(-n)
    }
}

/// `classify` over `anyhow::Error`.
fn classify_anyhow(error: &anyhow::Error) -> StepErrorKind {
    if error.to_string().contains("forever") {
        StepErrorKind::Permanent
    } else {
        StepErrorKind::Transient
    }
}

static CLASSIFIED: AtomicUsize = AtomicUsize::new(0);

/// Fails permanently through `classify`: runs once despite the attempts.
#[job(name = "sig.classified", max_attempts = 3, classify = classify_anyhow)]
async fn classified() -> anyhow::Result<()> {
    CLASSIFIED.fetch_add(1, Ordering::SeqCst);
    Err(anyhow::anyhow!("broken forever"))
}

async fn job_runner() -> (JobRunner, taquba_workflow::RunnerHandle) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Queue::open(store.clone(), "db").await.expect("queue opens");
    let runner = JobRunner::builder(queue, store)
        .register_all()
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    (runner, worker)
}

async fn run_job<J: Job>(runner: &JobRunner, job: J) -> Result<J::Output, JoinError> {
    runner.submit(job).await.expect("submits").await
}

fn job_error<T: std::fmt::Debug>(result: Result<T, JoinError>) -> taquba_workflow::jobs::JobError {
    match result {
        Err(JoinError::Job(error)) => error,
        other => panic!("expected a job error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_attributes_reach_the_fields_and_cfg_removes_a_parameter() {
    let (runner, worker) = job_runner().await;
    // `never` is configured out: the struct has no such field (this
    // literal would not compile otherwise), `always` and `kept` are there.
    let job = Attributes {
        name: "ada".into(),
        times: 2,
        always: 3,
        ignored: 0,
        kept: 4,
        #[cfg(feature = "webhooks")]
        with_webhooks: true,
    };
    assert_eq!(run_job(&runner, job).await.expect("runs"), "adax2+3+4");
    worker.shutdown().await.expect("worker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_lifetimes_on_the_context_and_borrowed_parameters() {
    let (runner, worker) = job_runner().await;
    let job = Lifetimes {
        name: "bo".into(),
        tags: vec!["a".into(), "b".into()],
    };
    assert_eq!(run_job(&runner, job).await.expect("runs"), "bo:a,b:1");
    worker.shutdown().await.expect("worker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_aliases_and_error_types_resolve_through_the_type_system() {
    let (runner, worker) = job_runner().await;

    assert_eq!(
        run_job(&runner, WithAnyhow { fail: false })
            .await
            .expect("runs"),
        7
    );
    let error = job_error(run_job(&runner, WithAnyhow { fail: true }).await);
    assert_eq!(
        error.kind,
        StepErrorKind::Transient,
        "the default classification"
    );
    assert_eq!(error.message, "anyhow says no");

    assert_eq!(run_job(&runner, WithIo { n: 4 }).await.expect("runs"), 12);

    assert_eq!(
        run_job(&runner, WithBox { fail: false })
            .await
            .expect("runs"),
        1
    );
    let error = job_error(run_job(&runner, WithBox { fail: true }).await);
    assert_eq!(error.message, "boxed no");

    let inner: Result<u8, String> = run_job(&runner, Nested { inner_ok: false })
        .await
        .expect("runs");
    assert_eq!(inner, Err("inner".to_string()));
    assert_eq!(
        run_job(&runner, Nested { inner_ok: true })
            .await
            .expect("runs"),
        Ok(5)
    );

    assert_eq!(
        run_job(&runner, aliased::ViaAlias { n: 9 })
            .await
            .expect("runs"),
        -9
    );
    let error = job_error(run_job(&runner, aliased::ViaAlias { n: -1 }).await);
    assert_eq!(error.message, "bad: negative");

    let error = job_error(run_job(&runner, Classified).await);
    assert_eq!(error.kind, StepErrorKind::Permanent);
    assert_eq!(
        CLASSIFIED.load(Ordering::SeqCst),
        1,
        "a permanent error is not retried"
    );
    worker.shutdown().await.expect("worker stops");
}

#[test]
fn the_job_types_are_the_return_types_parts() {
    fn same<T: 'static>(_: std::marker::PhantomData<T>, _: std::marker::PhantomData<T>) {}
    same(
        std::marker::PhantomData::<<WithAnyhow as Job>::Error>,
        std::marker::PhantomData::<anyhow::Error>,
    );
    same(
        std::marker::PhantomData::<<Nested as Job>::Output>,
        std::marker::PhantomData::<Result<u8, String>>,
    );
    same(
        std::marker::PhantomData::<<WithIo as Job>::Error>,
        std::marker::PhantomData::<std::io::Error>,
    );
}

// ---------------------------------------------------------------------------
// Workflows

static FLAKY: AtomicUsize = AtomicUsize::new(0);

/// Steps with lifetimes, attributes on parameters, `anyhow` and boxed
/// errors, and a step configured out.
#[derive(Default)]
pub struct Shapes;

#[workflow(name = "sig.shapes", output = String)]
impl Shapes {
    /// Starts; the `#[cfg(any())]` parameter is absent from the input.
    #[step(start)]
    async fn begin<'a>(
        ctx: StepContext<'a>,
        /// Who the run is for.
        name: &'a str,
        #[cfg(any())] never: u32,
        #[cfg(all())]
        #[allow(unused_mut)]
        mut count: u32,
    ) -> anyhow::Result<Transition<ShapesStep>> {
        let _ = ctx.step_name();
        count += 1;
        Ok(Transition::next(ShapesStep::Flaky {
            name: name.to_string(),
            count,
        }))
    }

    /// Fails once with an `anyhow::Error` (a transient step error), then
    /// moves on.
    #[step]
    async fn flaky(name: String, count: u32) -> anyhow::Result<Transition<ShapesStep>> {
        if FLAKY.fetch_add(1, Ordering::SeqCst) == 0 {
            anyhow::bail!("first try fails");
        }
        Ok(Transition::next(ShapesStep::Boxed { name, count }))
    }

    /// A boxed error type.
    #[step]
    async fn boxed(
        name: String,
        count: u32,
    ) -> Result<Transition<ShapesStep>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Transition::done(format!("{name}:{count}")))
    }

    /// Configured out: absent from the enum, the dispatch and `STEPS`.
    #[cfg(any())]
    #[step]
    async fn gone(
        x: NotDefinedAnywhere,
    ) -> Result<Transition<ShapesStep>, taquba_workflow::StepError> {
        let _ = x;
        Ok(Transition::fail("gone"))
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_take_lifetimes_attributes_and_anyhow_errors() {
    assert_eq!(<Shapes as Workflow>::STEPS, ["begin", "flaky", "boxed"]);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = OpenOptions::default().queue_config(
        "workflow-steps",
        QueueConfig::default().retry_backoff_base(Duration::ZERO),
    );
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options)
            .await
            .expect("queue opens"),
    );
    let rt = runtime(queue, &store, Shapes);
    let worker = rt.spawn(std::future::pending::<()>());
    let run = rt
        .start(ShapesInput {
            name: "cy".into(),
            count: 1,
        })
        .await
        .expect("starts");
    let output = tokio::time::timeout(Duration::from_secs(20), run.wait())
        .await
        .expect("the run ends")
        .expect("the run is read")
        .expect("the run succeeds");
    assert_eq!(output, "cy:2");
    assert_eq!(
        FLAKY.load(Ordering::SeqCst),
        2,
        "the anyhow error was retried"
    );
    worker.shutdown().await.expect("worker stops");
}

// ---------------------------------------------------------------------------
// Ordinary Rust: the forms a backend engineer writes without thinking of
// the macro, run on the test kit.

mod ordinary {
    use std::time::Duration;

    use serde::{Deserialize, Serialize};
    use taquba_workflow::jobs::{Job, JobContext};
    use taquba_workflow::testing::{TestJobs, TestRuntime};
    use taquba_workflow::workflows::{StepContext, Transition, Workflow};
    use taquba_workflow::{StepError, job, workflow};

    /// A service's own error type.
    #[derive(Debug, thiserror::Error)]
    pub enum ServiceError {
        /// The input was refused.
        #[error("refused: {0}")]
        Refused(String),
        /// A number did not parse.
        #[error(transparent)]
        Parse(#[from] std::num::ParseIntError),
    }

    /// A module's result alias over the service's error.
    type R<T> = Result<T, ServiceError>;

    /// A struct input.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Point {
        pub x: i32,
        pub y: i32,
    }

    /// A tuple struct output.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Pair(pub i32, pub String);

    /// The context by shared reference.
    #[job]
    async fn ctx_by_ref(ctx: &JobContext<'_>, n: u32) -> R<u32> {
        Ok(n + ctx.attempts)
    }

    /// The context by unique reference, after the fields.
    #[job]
    async fn ctx_by_mut(n: u32, ctx: &mut JobContext<'_>) -> R<u32> {
        Ok(n * 10 + ctx.attempts)
    }

    /// Attributes of other crates around the macro, and `#[must_use]`.
    #[job(name = "ordinary.traced")]
    #[tracing::instrument(skip(ctx), fields(n = n))]
    #[must_use = "the doubled count"]
    async fn traced(ctx: JobContext<'_>, n: u32) -> R<u32> {
        tracing::info!(attempt = ctx.attempts, "traced");
        Ok(n + 1)
    }

    /// `#[tracing::instrument]` written above the macro.
    #[tracing::instrument]
    #[job(name = "ordinary.traced_first")]
    async fn traced_first(label: String) -> R<String> {
        Ok(label.to_uppercase())
    }

    /// Unit, tuple and struct inputs and outputs; `std::result::Result`.
    #[job]
    async fn shapes(
        unit: (),
        pair: (u32, u32),
        point: Point,
        mut tags: Vec<String>,
    ) -> std::result::Result<(Pair, ()), ServiceError> {
        let () = unit;
        tags.push("!".into());
        let (a, b) = pair;
        Ok((Pair(point.x + point.y + (a + b) as i32, tags.concat()), ()))
    }

    /// A raw identifier as the fn's name and a parameter's.
    #[job]
    async fn r#match(r#type: String, r#in: u8) -> R<String> {
        Ok(format!("{type}{in}"))
    }

    /// Bodies as services write them: early return, `?` through `From`,
    /// `async move`, `tokio::select!`, `format!`.
    #[job(name = "ordinary.bodies", max_attempts = 1)]
    async fn bodies(text: String) -> R<String> {
        if text.is_empty() {
            return Err(ServiceError::Refused("empty".into()));
        }
        let n: u32 = text.parse()?;
        let doubled = async move { n * 2 }.await;
        let out = tokio::select! {
            v = async { doubled + 1 } => v,
            () = tokio::time::sleep(Duration::from_secs(3600)) => 0,
        };
        Ok(format!("{text}->{out}"))
    }

    /// The context unused (`_`).
    #[job]
    async fn wild_ctx(_: JobContext<'_>, mut n: u32) -> R<u32> {
        n += 1;
        Ok(n)
    }

    /// The context bound `mut`.
    #[job]
    async fn mut_ctx(n: u32, mut ctx: JobContext<'_>) -> R<u32> {
        let ctx = &mut ctx;
        Ok(n + ctx.attempts)
    }

    pub(crate) mod nested {
        pub(crate) mod deeper {
            use super::super::R;
            use taquba_workflow::job;

            /// `pub(super)` two modules down.
            #[job]
            pub(super) async fn up_one(n: u32) -> R<u32> {
                Ok(n + 1)
            }

            /// `pub(in path)`.
            #[job]
            pub(in crate::ordinary) async fn in_path(n: u32) -> R<u32> {
                Ok(n + 2)
            }
        }

        /// `UpOne` is visible here, not in the parent module.
        #[tokio::test(start_paused = true)]
        async fn a_pub_super_job_runs() {
            let env = taquba_workflow::testing::TestJobs::builder()
                .register::<deeper::UpOne>()
                .build()
                .await
                .expect("the environment builds");
            let job = env.submit(deeper::UpOne { n: 1 }).await.expect("submits");
            env.run_until_idle().await.expect("the job runs");
            assert_eq!(job.output().await.expect("succeeds"), 2);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ordinary_jobs_compile_and_run() {
        let env = TestJobs::builder()
            .register::<CtxByRef>()
            .register::<CtxByMut>()
            .register::<Traced>()
            .register::<TracedFirst>()
            .register::<Shapes>()
            .register::<Match>()
            .register::<Bodies>()
            .register::<WildCtx>()
            .register::<MutCtx>()
            .register::<nested::deeper::InPath>()
            .build()
            .await
            .expect("the environment builds");

        let by_ref = env.submit(CtxByRef { n: 4 }).await.expect("submits");
        let by_mut = env.submit(CtxByMut { n: 4 }).await.expect("submits");
        let traced = env.submit(Traced { n: 1 }).await.expect("submits");
        let traced_first = env
            .submit(TracedFirst { label: "ab".into() })
            .await
            .expect("submits");
        let shapes = env
            .submit(Shapes {
                unit: (),
                pair: (1, 2),
                point: Point { x: 10, y: 20 },
                tags: vec!["a".into()],
            })
            .await
            .expect("submits");
        let raw = env
            .submit(Match {
                r#type: "t".into(),
                r#in: 7,
            })
            .await
            .expect("submits");
        let bodies = env
            .submit(Bodies { text: "21".into() })
            .await
            .expect("submits");
        let refused = env
            .submit(Bodies { text: "".into() })
            .await
            .expect("submits");
        let unparsable = env
            .submit(Bodies { text: "x".into() })
            .await
            .expect("submits");
        let wild = env.submit(WildCtx { n: 1 }).await.expect("submits");
        let mut_ctx = env.submit(MutCtx { n: 1 }).await.expect("submits");
        let in_path = env
            .submit(nested::deeper::InPath { n: 1 })
            .await
            .expect("submits");
        env.run_until_idle().await.expect("the jobs run");

        assert_eq!(by_ref.output().await.expect("succeeds"), 5);
        assert_eq!(by_mut.output().await.expect("succeeds"), 41);
        assert_eq!(traced.output().await.expect("succeeds"), 2);
        assert_eq!(traced_first.output().await.expect("succeeds"), "AB");
        assert_eq!(
            shapes.output().await.expect("succeeds"),
            (Pair(33, "a!".into()), ())
        );
        assert_eq!(raw.output().await.expect("succeeds"), "t7");
        assert_eq!(bodies.output().await.expect("succeeds"), "21->43");
        let refused = refused.result().await.expect("reads").expect("ended");
        assert_eq!(refused.expect_err("fails").message, "refused: empty");
        let unparsable = unparsable.result().await.expect("reads").expect("ended");
        assert!(
            unparsable
                .expect_err("fails")
                .message
                .contains("invalid digit"),
            "the `?` conversion's error is the job's"
        );
        assert_eq!(wild.output().await.expect("succeeds"), 2);
        assert_eq!(mut_ctx.output().await.expect("succeeds"), 2);
        assert_eq!(in_path.output().await.expect("succeeds"), 3);
        assert_eq!(<Match as Job>::NAME, "match");
    }

    /// A job and a workflow declared in a test's body, as tests write
    /// them (their parameter types are the module's).
    #[tokio::test(start_paused = true)]
    async fn a_job_and_a_workflow_in_a_fn_body() {
        #[job(name = "ordinary.local")]
        async fn local_job(point: Point) -> R<i32> {
            Ok(point.x * point.y)
        }

        #[derive(Default)]
        struct LocalFlow;

        #[workflow(name = "ordinary.local_flow", output = i32)]
        impl LocalFlow {
            #[step(start)]
            async fn only(point: Point) -> Result<Transition<LocalFlowStep>, StepError> {
                Ok(Transition::done(point.x - point.y))
            }
        }

        let env = TestJobs::builder()
            .register::<LocalJob>()
            .build()
            .await
            .expect("the environment builds");
        let job = env
            .submit(LocalJob {
                point: Point { x: 3, y: 4 },
            })
            .await
            .expect("submits");
        env.run_until_idle().await.expect("the job runs");
        assert_eq!(job.output().await.expect("succeeds"), 12);

        let env = TestRuntime::new(LocalFlow)
            .await
            .expect("the environment builds");
        let run = env
            .start(LocalFlowInput {
                point: Point { x: 3, y: 4 },
            })
            .await
            .expect("starts");
        env.run_until_idle().await.expect("the run runs");
        assert_eq!(run.output().await.expect("succeeds"), -1);
    }

    // -- Workflows --

    /// A workflow whose value is also carried by a step (`Self` in a
    /// parameter type), with consts, helpers and a macro in its impl
    /// block, steps taking `self: &Self`, `&'a self`, the context by
    /// reference, raw identifiers and attributes of other crates.
    #[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
    pub struct Tally {
        pub total: u32,
    }

    macro_rules! tally_helper {
        () => {
            fn bump(&self, by: u32) -> u32 {
                self.total + by
            }
        };
    }

    #[workflow(output = u32, vis = pub(crate))]
    impl Tally {
        const STEP: u32 = 2;

        tally_helper!();

        /// Starts from `seed`, carrying a copy of the workflow value.
        #[step(start)]
        #[tracing::instrument(skip(self, ctx))]
        #[allow(clippy::needless_lifetimes)]
        pub(crate) async fn begin<'a>(
            &'a self,
            ctx: &StepContext<'a>,
            seed: Self,
        ) -> Result<Transition<TallyStep>, StepError> {
            let _ = ctx.step_name();
            Ok(Transition::next(TallyStep::Loop {
                r#type: "sum".into(),
                seen: vec![seed.clone(), self.clone()],
            }))
        }

        /// A raw identifier as the fn's and a parameter's name; `Self` in
        /// a nested type; `self: &Self`.
        #[step]
        #[allow(clippy::needless_arbitrary_self_type)]
        async fn r#loop(
            self: &Self,
            ctx: &mut StepContext<'_>,
            r#type: String,
            seen: Vec<Self>,
        ) -> anyhow::Result<Transition<TallyStep>> {
            let _ = &mut *ctx;
            anyhow::ensure!(r#type == "sum", "unknown {type}");
            let sum: u32 = seen.iter().map(|t| t.total).sum();
            Ok(Transition::done(self.bump(sum) + Self::STEP))
        }
    }

    /// A workflow for a type named through a path, in an impl block with
    /// a `where` clause (the bounds the type must meet, written out).
    pub(crate) mod types {
        /// Defined here, its workflow impl elsewhere.
        #[derive(Default)]
        pub struct Behind;
    }

    #[workflow(name = "ordinary.behind", output = String)]
    impl types::Behind
    where
        types::Behind: Send + Sync + Default,
    {
        #[step(start)]
        async fn only(word: String) -> Result<Transition<BehindStep>, StepError> {
            Ok(Transition::done(word.repeat(2)))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ordinary_workflows_compile_and_run() {
        assert_eq!(<Tally as Workflow>::STEPS, ["begin", "loop"]);
        let env = TestRuntime::new(Tally { total: 100 })
            .await
            .expect("the environment builds");
        let run = env
            .start(TallyInput {
                seed: Tally { total: 5 },
            })
            .await
            .expect("starts");
        env.run_until_idle().await.expect("the run runs");
        // 100 (the runtime's value) + 5 (the seed) + 100 (the copy) + 2.
        assert_eq!(run.output().await.expect("succeeds"), 207);

        let env = TestRuntime::new(types::Behind)
            .await
            .expect("the environment builds");
        let run = env
            .start(BehindInput { word: "ab".into() })
            .await
            .expect("starts");
        env.run_until_idle().await.expect("the run runs");
        assert_eq!(run.output().await.expect("succeeds"), "abab");
    }
}
