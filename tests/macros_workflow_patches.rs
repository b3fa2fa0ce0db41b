//! Patches and versions between two builds of one `#[workflow]` over one
//! store: version 1 parks runs waiting for a payment; version 2 declares
//! the patch `skip-slack-post` and branches on it. A run submitted on
//! version 1 answers `false` (it keeps the old path), a run submitted on
//! version 2 answers `true`, each the same on an attempt after a crash
//! between the patch point and the step's commit. Each run records the
//! version it started on and the version each step ran on; listings
//! filter on both.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::view::{RunFilter, StatusFilter};
use taquba_workflow::{
    NoopTerminalHook, RunId, RunOptions, RunState, StepRunner, TerminalHook, WorkflowRuntime,
};

/// Every answer of `patched("skip-slack-post")`: (run, attempt, answer).
static ANSWERS: Mutex<Vec<(String, u32, bool)>> = Mutex::new(Vec::new());

/// The first release: posts to Slack once an order is paid.
mod v1 {
    use std::time::Duration;

    use taquba_workflow::workflows::Transition;
    use taquba_workflow::{StepError, workflow};

    /// Posts an order to Slack once it is paid.
    #[derive(Default)]
    pub struct Notify;

    #[workflow(name = "notify", output = String, vis = pub, version = "1.0.0")]
    impl Notify {
        #[step(start)]
        async fn order(id: String) -> Result<Transition<NotifyStep>, StepError> {
            let key = format!("paid:{id}");
            Ok(Transition::on_signal(
                NotifyStep::Post { id },
                key,
                Duration::from_secs(600),
            ))
        }

        #[step]
        async fn post(id: String) -> Result<Transition<NotifyStep>, StepError> {
            Ok(Transition::done(format!("posted {id} to slack")))
        }
    }
}

/// The next release: runs submitted on it skip the Slack post. The first
/// attempt of `post` in a run whose id starts with `crash` hangs after
/// the patch point, so the test can kill the process there.
mod v2 {
    use std::time::Duration;

    use taquba_workflow::workflows::{StepContext, Transition};
    use taquba_workflow::{StepError, workflow};

    /// Posts an order to Slack once it is paid, unless patched.
    #[derive(Default)]
    pub struct Notify;

    #[workflow(
        name = "notify",
        output = String,
        vis = pub,
        version = "2.0.0",
        patches = ["skip-slack-post"]
    )]
    impl Notify {
        #[step(start)]
        async fn order(id: String) -> Result<Transition<NotifyStep>, StepError> {
            let key = format!("paid:{id}");
            Ok(Transition::on_signal(
                NotifyStep::Post { id },
                key,
                Duration::from_secs(600),
            ))
        }

        #[step]
        async fn post(
            ctx: StepContext<'_>,
            id: String,
        ) -> Result<Transition<NotifyStep>, StepError> {
            let skip = ctx.patched("skip-slack-post")?;
            super::ANSWERS
                .lock()
                .expect("answers")
                .push((id.clone(), ctx.attempts, skip));
            if id.starts_with("crash") && ctx.attempts == 1 {
                // Past the patch point, before the commit: the process dies
                // here.
                std::future::pending::<()>().await;
            }
            Ok(Transition::done(match skip {
                true => format!("skipped the slack post of {id}"),
                false => format!("posted {id} to slack"),
            }))
        }
    }
}

/// A release that asks for a patch it does not declare.
mod typo {
    use std::time::Duration;

    use taquba_workflow::workflows::{StepContext, Transition};
    use taquba_workflow::{StepError, workflow};

    /// Misspells its patch.
    #[derive(Default)]
    pub struct Notify;

    #[workflow(name = "notify", output = String, vis = pub, patches = ["skip-slack-post"])]
    impl Notify {
        #[step(start)]
        async fn order(id: String) -> Result<Transition<NotifyStep>, StepError> {
            let key = format!("paid:{id}");
            Ok(Transition::on_signal(
                NotifyStep::Post { id },
                key,
                Duration::from_secs(600),
            ))
        }

        #[step]
        async fn post(
            ctx: StepContext<'_>,
            id: String,
        ) -> Result<Transition<NotifyStep>, StepError> {
            let skip = ctx.patched("skip-slak-post")?;
            Ok(Transition::done(format!("{id}: {skip}")))
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
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .lease_duration(Duration::from_secs(1)),
        );
    let queue = Queue::open_with_options(store.clone(), "db", options)
        .await
        .expect("queue opens");
    WorkflowRuntime::builder(Arc::new(queue), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(20))
        .build()
}

/// Waits until `run_id` is pending at `step`.
async fn parked_at<R: StepRunner, H: TerminalHook>(
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

/// Waits until `post` of run `id` answered on attempt `attempt`.
async fn answered(id: &str, attempt: u32) -> bool {
    for _ in 0..1000 {
        if let Some((_, _, answer)) = ANSWERS
            .lock()
            .expect("answers")
            .iter()
            .find(|(run, n, _)| run == id && *n == attempt)
        {
            return *answer;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{id} never answered on attempt {attempt}");
}

async fn result<R: StepRunner, H: TerminalHook>(
    rt: &WorkflowRuntime<R, H>,
    run_id: &RunId,
) -> String {
    tokio::time::timeout(
        Duration::from_secs(10),
        rt.workflow_run::<v2::Notify>(run_id.clone()).wait(),
    )
    .await
    .expect("the run ends")
    .expect("the run is read")
    .expect("the run succeeds")
}

fn ids(page: &taquba_workflow::view::RunPage) -> Vec<String> {
    page.runs.iter().map(|run| run.run_id.to_string()).collect()
}

#[test]
fn a_patch_answers_by_the_code_a_run_started_on_and_the_same_after_a_crash() {
    ANSWERS.lock().expect("answers").clear();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());

    // Version 1 parks two runs, waiting for their payment.
    let first = process();
    first.block_on(async {
        let rt = runtime(&store, v1::Notify).await;
        let worker = rt.spawn(std::future::pending::<()>());
        for id in ["old", "crash-old"] {
            let run = rt
                .start_as(
                    RunId::new(id).expect("id"),
                    v1::NotifyInput { id: id.into() },
                    RunOptions::default(),
                )
                .await
                .expect("starts");
            parked_at(&rt, run.id(), 1).await;
        }
        worker.shutdown().await.expect("worker stops");
    });
    first.shutdown_timeout(Duration::from_millis(200));

    // Version 2: the old runs lack the patch; new runs carry it.
    let second = process();
    second.block_on(async {
        let rt = runtime(&store, v2::Notify).await;
        let worker = rt.spawn(std::future::pending::<()>());
        for id in ["new", "crash-new"] {
            let run = rt
                .start_as(
                    RunId::new(id).expect("id"),
                    v2::NotifyInput { id: id.into() },
                    RunOptions::default(),
                )
                .await
                .expect("starts");
            parked_at(&rt, run.id(), 1).await;
        }
        // The operator's view before any of them moves on: which active
        // runs still need the old branch, and what each started on.
        let lacking = rt
            .view()
            .runs(
                &RunFilter::new()
                    .status(StatusFilter::Active)
                    .lacks_patch("skip-slack-post"),
            )
            .await
            .expect("lists");
        assert_eq!(ids(&lacking), ["crash-old", "old"]);
        let on_v1 = rt
            .view()
            .runs(&RunFilter::new().version("1.0.0"))
            .await
            .expect("lists");
        assert_eq!(ids(&on_v1), ["crash-old", "old"]);
        let old = rt
            .view()
            .run(&RunId::new("old").expect("id"))
            .await
            .expect("reads")
            .expect("a run");
        assert_eq!(old.version.as_deref(), Some("1.0.0"));
        assert!(old.patches.is_empty());
        let new = rt
            .view()
            .run(&RunId::new("new").expect("id"))
            .await
            .expect("reads")
            .expect("a run");
        assert_eq!(new.version.as_deref(), Some("2.0.0"));
        assert_eq!(new.patches, ["skip-slack-post"]);

        for id in ["old", "new"] {
            rt.signal_value(&format!("paid:{id}"), &())
                .await
                .expect("signals");
        }
        let old_id = RunId::new("old").expect("id");
        let new_id = RunId::new("new").expect("id");
        assert_eq!(result(&rt, &old_id).await, "posted old to slack");
        assert_eq!(result(&rt, &new_id).await, "skipped the slack post of new");

        // Both crash runs reach the patch point and hang there.
        for id in ["crash-old", "crash-new"] {
            rt.signal_value(&format!("paid:{id}"), &())
                .await
                .expect("signals");
        }
        assert!(!answered("crash-old", 1).await);
        assert!(answered("crash-new", 1).await);
        drop(worker);
    });
    // The process dies with both steps claimed, past the patch point,
    // before their commits.
    second.shutdown_timeout(Duration::from_millis(200));

    let third = process();
    third.block_on(async {
        let rt = runtime(&store, v2::Notify).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let crash_old = RunId::new("crash-old").expect("id");
        let crash_new = RunId::new("crash-new").expect("id");
        assert_eq!(result(&rt, &crash_old).await, "posted crash-old to slack");
        assert_eq!(
            result(&rt, &crash_new).await,
            "skipped the slack post of crash-new"
        );
        // The attempt after the crash answered as the one before it.
        let answers = ANSWERS.lock().expect("answers").clone();
        for (id, expected) in [("crash-old", false), ("crash-new", true)] {
            let of_run: Vec<bool> = answers
                .iter()
                .filter(|(run, _, _)| run == id)
                .map(|(_, _, answer)| *answer)
                .collect();
            assert!(of_run.len() >= 2, "{id}: {answers:?}");
            assert!(of_run.iter().all(|a| *a == expected), "{id}: {answers:?}");
        }

        // A run started on 1.0.0 and finished on 2.0.0: started on 1.0.0,
        // its first step settled by 1.0.0, its second by 2.0.0.
        let old_id = RunId::new("old").expect("id");
        let steps = rt
            .view()
            .steps(&old_id)
            .await
            .expect("reads")
            .expect("a history");
        assert_eq!(steps.version.as_deref(), Some("1.0.0"));
        let versions: Vec<Option<&str>> =
            steps.steps.iter().map(|s| s.version.as_deref()).collect();
        assert_eq!(versions, [Some("1.0.0"), Some("2.0.0")]);
        let details = rt.view().run(&old_id).await.expect("reads").expect("a run");
        assert_eq!(details.version.as_deref(), Some("1.0.0"));
        // A terminated run keeps its version and patches.
        let new = rt
            .view()
            .run(&RunId::new("new").expect("id"))
            .await
            .expect("reads")
            .expect("a run");
        assert_eq!(new.patches, ["skip-slack-post"]);
        let on_v2 = rt
            .view()
            .runs(&RunFilter::new().version("2.0.0"))
            .await
            .expect("lists");
        assert_eq!(ids(&on_v2), ["crash-new", "new"]);
        let lacking = rt
            .view()
            .runs(
                &RunFilter::new()
                    .status(StatusFilter::Active)
                    .lacks_patch("skip-slack-post"),
            )
            .await
            .expect("lists");
        assert!(lacking.runs.is_empty(), "the patch can be retired");
        worker.shutdown().await.expect("worker stops");
    });
}

#[test]
fn a_patch_the_code_does_not_declare_fails_the_run_naming_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let process = process();
    process.block_on(async {
        let rt = runtime(&store, typo::Notify).await;
        let worker = rt.spawn(std::future::pending::<()>());
        let run = rt
            .start(typo::NotifyInput { id: "t".into() })
            .await
            .expect("starts");
        parked_at(&rt, run.id(), 1).await;
        rt.signal_value("paid:t", &()).await.expect("signals");
        let ended = tokio::time::timeout(
            Duration::from_secs(10),
            rt.workflow_run::<typo::Notify>(run.id().clone()).wait(),
        )
        .await
        .expect("the run ends")
        .expect("the run is read");
        let err = ended.expect_err("the run fails");
        let message = err.message.unwrap_or_default();
        assert!(
            message.contains("\"skip-slak-post\"")
                && message.contains("workflow `notify`")
                && message.contains(&format!("run `{}`", run.id())),
            "{message}"
        );
        // The run records the crate's version by default.
        let details = rt.view().run(run.id()).await.expect("reads").expect("run");
        assert_eq!(details.version.as_deref(), Some(env!("CARGO_PKG_VERSION")));
        worker.shutdown().await.expect("worker stops");
    });
}

/// A hand-written runner: it declares its version and patches in
/// `StepRunner::code` and asks `step.patched(..)`; step 0 waits for a
/// signal, step 1 returns the answer.
struct Hand {
    code: taquba_workflow::versioning::CodeInfo,
}

impl StepRunner for Hand {
    async fn run_step(
        &self,
        step: &taquba_workflow::Step,
    ) -> Result<taquba_workflow::StepOutcome, taquba_workflow::StepError> {
        if step.step_number == 0 {
            let key = format!("go:{}", step.run_id);
            return Ok(taquba_workflow::StepOutcome::continue_on_signal(
                Vec::new(),
                key,
                Duration::from_secs(600),
            ));
        }
        let answer = match self.code.patches.is_empty() {
            true => "unpatched code".to_string(),
            false => step.patched("batch-emails")?.to_string(),
        };
        Ok(taquba_workflow::StepOutcome::Succeed {
            result: answer.into_bytes(),
        })
    }

    fn code(&self) -> taquba_workflow::versioning::HostedCode {
        taquba_workflow::versioning::HostedCode::all(self.code.clone())
    }
}

#[test]
fn a_hand_written_runner_declares_its_code_and_asks_for_patches() {
    use taquba_workflow::RunSpec;
    use taquba_workflow::versioning::CodeInfo;

    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let submit = |rt: &WorkflowRuntime<Hand, NoopTerminalHook>, id: &'static str| {
        let rt = rt.clone();
        async move {
            rt.submit(RunSpec {
                run_id: Some(RunId::new(id).expect("id")),
                input: Vec::new(),
                ..RunSpec::default()
            })
            .await
            .expect("submits");
            parked_at(&rt, &RunId::new(id).expect("id"), 1).await;
        }
    };
    let first = process();
    first.block_on(async {
        let rt = runtime(
            &store,
            Hand {
                code: CodeInfo::new().version("h1"),
            },
        )
        .await;
        let worker = rt.spawn(std::future::pending::<()>());
        submit(&rt, "hand-old").await;
        worker.shutdown().await.expect("worker stops");
    });
    first.shutdown_timeout(Duration::from_millis(200));

    let second = process();
    second.block_on(async {
        let rt = runtime(
            &store,
            Hand {
                code: CodeInfo::new().version("h2").patch("batch-emails"),
            },
        )
        .await;
        let worker = rt.spawn(std::future::pending::<()>());
        submit(&rt, "hand-new").await;
        for (id, expected) in [("hand-old", "false"), ("hand-new", "true")] {
            let run_id = RunId::new(id).expect("id");
            rt.signal_value(&format!("go:{id}"), &())
                .await
                .expect("signals");
            let end = tokio::time::timeout(Duration::from_secs(10), rt.wait(&run_id))
                .await
                .expect("the run ends")
                .expect("waits");
            let result = end.outcome.and_then(|o| o.result).expect("a result");
            assert_eq!(String::from_utf8_lossy(&result), expected, "{id}");
        }
        let old = rt
            .view()
            .steps(&RunId::new("hand-old").expect("id"))
            .await
            .expect("reads")
            .expect("a history");
        assert_eq!(old.version.as_deref(), Some("h1"));
        let versions: Vec<Option<&str>> = old.steps.iter().map(|s| s.version.as_deref()).collect();
        assert_eq!(versions, [Some("h1"), Some("h2")]);
        worker.shutdown().await.expect("worker stops");
    });
}
