//! Child workflows at the public API (raw `StepRunner`): a parent starts a
//! child and reads its result; a child's failure is the parent step's to
//! handle; a step that errors starts no child and its retry starts it
//! once; the links show both ways in `WorkflowView::run`; cancel cascades
//! two levels and the parent ends last; cancelling a child alone leaves
//! the parent running with the child's `Cancelled` end; a parent that ends
//! without waiting has its child cancelled; a crash at different moments
//! (each commit boundary of the parent's step, the child's steps and the
//! wake) neither loses the child's end nor starts the child twice.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taquba::OpenOptions;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::children::{ChildEnd, child_run_id};
use taquba_workflow::{
    Error, RunId, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus,
};

use crate::common::{memory_queue, rid, within, workflow_builder};
use crate::fixtures::tokio_clock_queue;

const DAY: Duration = Duration::from_secs(24 * 3600);

/// One runner call: run id, step number, job id.
type Call = (String, u32, String);

/// Step 0's input says what a run does:
/// - `parent:{child input}` starts child `c` with that input and waits for
///   it; step 1 reports the child's end (a failure or cancel is handled:
///   the parent succeeds saying so);
/// - `orphan:{child input}` starts child `c` and succeeds at once;
/// - `ok:{result}` succeeds with the result; `fail:{reason}` fails;
/// - `hold` waits a day on `hold:{run id}`, then succeeds `released`;
/// - `perm` is dead-lettered on its first call (a permanent error),
///   and holds as `hold` does once requeued;
/// - `flaky:{child input}` starts child `c` and errors on its first
///   attempt; on the next it waits for it as `parent:` does.
#[derive(Clone, Default)]
struct Family {
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Family {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("calls").clone()
    }

    /// The calls of `run`'s step 0 so far.
    fn step0_calls(&self, run: &str) -> usize {
        self.calls()
            .iter()
            .filter(|(r, step, _)| r == run && *step == 0)
            .count()
    }

    /// Each run's distinct step-0 jobs: a run started twice has two.
    fn step0_jobs(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut jobs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (run, step, job) in self.calls() {
            if step == 0 {
                jobs.entry(run).or_default().insert(job);
            }
        }
        jobs
    }
}

fn start_child(step: &Step, input: &str) -> Result<RunId, StepError> {
    step.delivery
        .children
        .start("c", input.as_bytes().to_vec(), RunOptions::default())
        .map_err(|e| StepError::permanent(e.to_string()))
}

impl StepRunner for Family {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.calls.lock().expect("calls").push((
            step.run_id.to_string(),
            step.step_number,
            step.job_id.clone(),
        ));
        // Every step takes a little (virtual) time, so crashes land inside
        // steps as well as between them.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let payload = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(match payload.as_str() {
                "await" => {
                    let end = ChildEnd::of_signal(step.signal.as_deref())
                        .map_err(|e| StepError::permanent(e.to_string()))?;
                    let said = match end {
                        None => "timed out".to_string(),
                        Some(end) => match end.status {
                            TerminalStatus::Succeeded => format!(
                                "child said {}",
                                String::from_utf8_lossy(&end.result.unwrap_or_default())
                            ),
                            TerminalStatus::Failed => {
                                format!("handled: {}", end.error.unwrap_or_default())
                            }
                            TerminalStatus::Cancelled => "child cancelled".to_string(),
                        },
                    };
                    StepOutcome::Succeed {
                        result: said.into_bytes(),
                    }
                }
                _ => StepOutcome::Succeed {
                    result: b"released".to_vec(),
                },
            });
        }
        let (kind, rest) = payload.split_once(':').unwrap_or((payload.as_str(), ""));
        match kind {
            "parent" => {
                let child = start_child(step, rest)?;
                Ok(StepOutcome::continue_on_child(
                    b"await".to_vec(),
                    &child,
                    DAY,
                ))
            }
            "flaky" => {
                let child = start_child(step, rest)?;
                if step.attempts == 1 {
                    return Err(StepError::transient("first attempt fails"));
                }
                Ok(StepOutcome::continue_on_child(
                    b"await".to_vec(),
                    &child,
                    DAY,
                ))
            }
            "orphan" => {
                start_child(step, rest)?;
                Ok(StepOutcome::Succeed {
                    result: b"left".to_vec(),
                })
            }
            "perm" if self.step0_calls(&step.run_id) == 1 => {
                Err(StepError::permanent("dead on its first call"))
            }
            "perm" => Ok(StepOutcome::continue_on_signal(
                b"held".to_vec(),
                format!("hold:{}", step.run_id),
                DAY,
            )),
            "ok" => Ok(StepOutcome::Succeed {
                result: rest.as_bytes().to_vec(),
            }),
            "fail" => Ok(StepOutcome::Fail {
                reason: rest.to_string(),
            }),
            "hold" => Ok(StepOutcome::continue_on_signal(
                b"held".to_vec(),
                format!("hold:{}", step.run_id),
                DAY,
            )),
            other => Err(StepError::permanent(format!("unknown input {other:?}"))),
        }
    }
}

fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..RunSpec::default()
    }
}

fn result_of(end: &taquba_workflow::RunEnd) -> String {
    String::from_utf8_lossy(
        end.outcome
            .as_ref()
            .and_then(|o| o.result.as_deref())
            .unwrap_or_default(),
    )
    .into_owned()
}

/// A child's end reaches its waiting parent as soon as the child's
/// termination commits, not at the next maintenance round (an hour away
/// here).
#[tokio::test(start_paused = true)]
async fn a_parent_is_woken_when_its_child_ends_not_at_the_next_maintenance_round() {
    let (queue, store, _clock) = memory_queue().await;
    let family = Family::default();
    let runtime = workflow_builder(&queue, &store, &family)
        .poll_interval(Duration::from_secs(3600))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for i in 0..3 {
        let id = format!("quick-{i}");
        runtime.submit(spec(&id, "parent:ok:now")).await.unwrap();
        let end = within(60, runtime.wait(&rid(&id))).await.unwrap();
        assert_eq!(result_of(&end), "child said now");
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_parent_gets_its_childs_result_and_the_links_show_both_ways() {
    let (queue, store, _clock) = memory_queue().await;
    let family = Family::default();
    let runtime = workflow_builder(&queue, &store, &family).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p1", "parent:ok:hi")).await.unwrap();
    let end = within(60, runtime.wait(&rid("p1"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(result_of(&end), "child said hi");

    let child = child_run_id(&rid("p1"), "c").unwrap();
    assert_eq!(child.as_str(), "p1--c");
    let parent = runtime.view().run(&rid("p1")).await.unwrap().unwrap();
    assert_eq!(parent.children, vec![child.clone()]);
    assert_eq!(parent.parent, None);
    let described = runtime.view().run(&child).await.unwrap().unwrap();
    assert_eq!(described.parent, Some(rid("p1")));
    assert!(described.children.is_empty());
    assert!(matches!(described.state, RunState::Terminated(_)));
    // The step that got the child's end removed its end record and marker.
    for key in ["workflow/child-ends/p1--c", "workflow/child-wakes/p1--c"] {
        crate::common::eventually(key, || async {
            queue.view().kv_get(key.as_bytes()).await.unwrap().is_none()
        })
        .await;
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_childs_failure_is_the_parent_steps_to_handle() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Family::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("p2", "parent:fail:boom"))
        .await
        .unwrap();
    let end = within(60, runtime.wait(&rid("p2"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(result_of(&end), "handled: boom");
    let child = runtime.wait(&rid("p2--c")).await.unwrap();
    assert_eq!(child.termination.status, TerminalStatus::Failed);
    worker.shutdown().await.unwrap();
}

/// A step that stages a child and then errors starts no child: its retry
/// stages it again and starts it once.
#[tokio::test(start_paused = true)]
async fn a_step_that_errors_starts_no_child_and_its_retry_starts_it_once() {
    let (queue, store, _clock) = memory_queue().await;
    let family = Family::default();
    let runtime = workflow_builder(&queue, &store, &family).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p3", "flaky:ok:again")).await.unwrap();
    let end = within(60, runtime.wait(&rid("p3"))).await.unwrap();
    assert_eq!(result_of(&end), "child said again");
    let jobs = family.step0_jobs();
    assert_eq!(jobs.get("p3--c").map(BTreeSet::len), Some(1), "{jobs:?}");
    let parent_attempts = family
        .calls()
        .iter()
        .filter(|(run, step, _)| run == "p3" && *step == 0)
        .count();
    assert_eq!(parent_attempts, 2);
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_bad_child_key_is_refused_naming_it() {
    let handle = taquba_workflow::children::ChildrenHandle::detached(rid("p"));
    let err = handle
        .start("no/slash", Vec::new(), RunOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidChildKey { .. }), "{err}");
    assert!(err.to_string().contains("no/slash"), "{err}");
    let long = "k".repeat(200);
    let err = handle
        .start(&long, Vec::new(), RunOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("over the 128"), "{err}");
    // A child takes no concurrency key: refused, not ignored.
    let keyed = RunOptions {
        concurrency_key: Some("customer-7".into()),
        ..RunOptions::default()
    };
    let err = handle.start("c", Vec::new(), keyed).unwrap_err();
    assert!(matches!(err, Error::InvalidRunOptions(_)), "{err}");
    assert!(err.to_string().contains("customer-7"), "{err}");
}

/// Cancelling a grandparent cancels its child and grandchild first; each
/// ends `Cancelled` with the reason naming its parent, and the cancel call
/// returns once all three ended.
#[tokio::test(start_paused = true)]
async fn a_cancel_cascades_two_levels_and_the_parent_ends_last() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Family::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("g", "parent:parent:hold"))
        .await
        .unwrap();
    let grandchild = rid("g--c--c");
    crate::common::eventually("the grandchild holds", || async {
        runtime
            .status(&grandchild)
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1)
    })
    .await;
    assert!(within(60, runtime.cancel(&rid("g"))).await.unwrap());
    let mut ended_at = Vec::new();
    for id in ["g--c--c", "g--c", "g"] {
        let end = runtime.wait(&rid(id)).await.unwrap();
        assert_eq!(end.termination.status, TerminalStatus::Cancelled, "{id}");
        ended_at.push(end.termination.terminated_at_ms);
        let details = runtime.view().run(&rid(id)).await.unwrap().unwrap();
        if id != "g" {
            let reason = details.cancel_reason.unwrap_or_default();
            assert!(reason.contains("was cancelled"), "{id}: {reason}");
        }
    }
    assert!(
        ended_at.windows(2).all(|w| w[0] <= w[1]),
        "children end before parents: {ended_at:?}"
    );
    worker.shutdown().await.unwrap();
}

/// A child cancelled alone: its parent keeps running and gets the child's
/// `Cancelled` end.
#[tokio::test(start_paused = true)]
async fn cancelling_a_child_alone_gives_the_parent_its_cancelled_end() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Family::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p4", "parent:hold")).await.unwrap();
    crate::common::eventually("the child holds", || async {
        runtime
            .status(&rid("p4--c"))
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1)
    })
    .await;
    assert!(runtime.cancel(&rid("p4--c")).await.unwrap());
    let end = within(60, runtime.wait(&rid("p4"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(result_of(&end), "child cancelled");
    worker.shutdown().await.unwrap();
}

/// A parent that ends without waiting for its child: the maintenance round
/// cancels the child, naming the parent.
#[tokio::test(start_paused = true)]
async fn a_child_left_by_its_ended_parent_is_cancelled() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Family::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p5", "orphan:hold")).await.unwrap();
    within(60, runtime.wait(&rid("p5"))).await.unwrap();
    let end = within(60, runtime.wait(&rid("p5--c"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    let details = runtime.view().run(&rid("p5--c")).await.unwrap().unwrap();
    let reason = details.cancel_reason.unwrap_or_default();
    assert!(reason.contains("`p5` ended"), "{reason}");
    worker.shutdown().await.unwrap();
}

/// A dead-lettered child requeued after its parent ended is active again
/// as a child: the maintenance round cancels it, naming the parent.
#[tokio::test(start_paused = true)]
async fn a_requeued_child_of_an_ended_parent_is_cancelled() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Family::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("p6", "orphan:perm")).await.unwrap();
    within(60, runtime.wait(&rid("p6"))).await.unwrap();
    let child = rid("p6--c");
    let end = within(60, runtime.wait(&child)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    runtime.requeue(&child).await.unwrap();
    let end = within(60, runtime.wait(&child)).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    let details = runtime.view().run(&child).await.unwrap().unwrap();
    assert_eq!(details.parent, Some(rid("p6")));
    let reason = details.cancel_reason.unwrap_or_default();
    assert!(reason.contains("`p6` ended"), "{reason}");
    worker.shutdown().await.unwrap();
}

/// The runtime is dropped without shutdown at each of many moments of a
/// parent/child pair's life (its steps, commits and the wake), and a new
/// one opened on the same store: the parent always ends with the child's
/// result, and the child ran under one step-0 job (started once).
#[tokio::test(start_paused = true)]
async fn a_crash_at_each_moment_neither_loses_the_childs_end_nor_starts_it_twice() {
    // What the store held at each crash: the child not started yet, the
    // child active, the child ended with its wake pending, the wake sent
    // and the parent still waiting or running, the parent ended.
    let mut phases = BTreeSet::new();
    let moments = 0u64..120;
    for crash_after_ms in moments {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let family = Family::default();
        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &family).build();
        let worker = {
            let runtime = runtime.clone();
            tokio::spawn(async move { runtime.run(std::future::pending::<()>()).await })
        };
        runtime.submit(spec("k", "parent:ok:x")).await.unwrap();
        if crash_after_ms > 0 {
            tokio::time::sleep(Duration::from_millis(crash_after_ms)).await;
        }
        worker.abort();
        let _ = worker.await;
        phases.insert(phase(&runtime, &queue).await);
        drop(runtime);
        drop(queue);

        let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
        let runtime = workflow_builder(&queue, &store, &family).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        let end = within(120, runtime.wait(&rid("k"))).await.unwrap();
        assert_eq!(
            result_of(&end),
            "child said x",
            "crash after {crash_after_ms} ms"
        );
        let jobs = family.step0_jobs();
        assert_eq!(
            jobs.get("k--c").map(BTreeSet::len),
            Some(1),
            "crash after {crash_after_ms} ms: the child started once: {jobs:?}"
        );
        worker.shutdown().await.unwrap();
    }
    assert_eq!(
        phases,
        BTreeSet::from([
            "child not started",
            "child active",
            "child ended, wake pending",
            "wake sent, parent active",
            "parent ended"
        ]),
        "the crashes hit every phase"
    );
}

/// Where the pair of `a_crash_at_each_moment_...` is, read from the store.
async fn phase<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &taquba_workflow::WorkflowRuntime<R, H>,
    queue: &taquba::Queue,
) -> &'static str {
    let ended = |state: Option<RunState>| matches!(state, Some(RunState::Terminated(_)));
    let parent = runtime
        .view()
        .run(&rid("k"))
        .await
        .unwrap()
        .map(|d| d.state);
    let child = runtime
        .view()
        .run(&rid("k--c"))
        .await
        .unwrap()
        .map(|d| d.state);
    let wake = queue
        .view()
        .kv_get(b"workflow/child-wakes/k--c")
        .await
        .unwrap();
    match (ended(parent), child.is_some(), ended(child), wake.is_some()) {
        (true, ..) => "parent ended",
        (_, false, ..) => "child not started",
        (_, _, false, _) => "child active",
        (_, _, true, true) => "child ended, wake pending",
        (_, _, true, false) => "wake sent, parent active",
    }
}

/// The `parent_child` example (as the `parent_child_crash` binary) is
/// killed with SIGKILL while its children run, then run again on the same
/// store: it resumes the same parent, which reports every child's counts
/// (and the failure of the child whose file is missing), and each child
/// key names one run.
#[test]
fn the_example_killed_mid_child_resumes_and_reports_every_child() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let bin = env!("CARGO_BIN_EXE_parent_child_crash");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut files: Vec<std::path::PathBuf> = (0..3)
        .map(|i| {
            let path = dir.path().join(format!("f{i}.txt"));
            let text = "word ".repeat(i + 1) + "\nline two\n";
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect();
    // A file that is not there: its child fails, and the parent reports it.
    files.push(dir.path().join("missing.txt"));
    let run = |slow_ms: u64| {
        let mut cmd = Command::new(bin);
        cmd.arg("--store")
            .arg(&store)
            .arg("--slow-ms")
            .arg(slow_ms.to_string())
            .args(&files)
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        cmd.spawn().expect("spawn parent_child_crash")
    };
    // First run: the children sleep 30 s; kill it once one runs.
    let mut first = run(30_000);
    let stdout = first.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next()
            .expect("the first run prints CHILD_RUNNING")
            .unwrap();
        if line.starts_with("CHILD_RUNNING") {
            break;
        }
    }
    first.kill().expect("SIGKILL");
    first.wait().unwrap();

    // Second run: the children's steps are delivered again once their
    // leases expire, and the parent resumes.
    let second = run(0).wait_with_output().expect("the second run");
    let out = String::from_utf8_lossy(&second.stdout);
    assert!(second.status.success(), "{out}");
    assert!(out.contains("run digest-1 resumed"), "{out}");
    for (i, file) in files.iter().take(3).enumerate() {
        let expected = format!("{}: 2 lines, {} words", file.display(), i + 3);
        assert!(out.contains(&expected), "{expected} in {out}");
        assert!(
            out.contains(&format!("CHILD digest-1--file-{i} succeeded")),
            "{out}"
        );
    }
    assert!(
        out.contains("digest-1--file-3: run `digest-1--file-3` failed: cannot read"),
        "{out}"
    );
    assert!(out.contains("CHILD digest-1--file-3 failed"), "{out}");
    assert_eq!(out.matches("CHILD digest-1--").count(), 4, "{out}");
}

/// Typed child workflows (`#[workflow]`) in the test kit.
mod typed {
    use std::time::Duration;

    use taquba_workflow::testing::TestRuntime;
    use taquba_workflow::workflows::{ChildRun, StepContext, Transition, Workflows};
    use taquba_workflow::{RunId, StepError, workflow};

    const HOUR: Duration = Duration::from_secs(3600);

    /// Waits `hours`, then succeeds with `n * 2` (fails for `n == 0`).
    #[derive(Default)]
    pub struct Double;

    #[workflow(name = "children-double", output = u64)]
    impl Double {
        #[step(start)]
        async fn begin(n: u64, hours: u64) -> Result<Transition<DoubleStep>, StepError> {
            Ok(Transition::after(
                DoubleStep::Finish { n },
                HOUR * u32::try_from(hours).unwrap_or(u32::MAX),
            ))
        }

        #[step]
        async fn finish(n: u64) -> Result<Transition<DoubleStep>, StepError> {
            match n {
                0 => Ok(Transition::fail("nothing to double")),
                n => Ok(Transition::done(n * 2)),
            }
        }
    }

    /// Starts a `Double` child and waits for it `wait_hours` at most.
    #[derive(Default)]
    pub struct Caller;

    #[workflow(name = "children-caller", output = String)]
    impl Caller {
        #[step(start)]
        async fn call(
            ctx: StepContext<'_>,
            n: u64,
            hours: u64,
            wait_hours: u64,
        ) -> Result<Transition<CallerStep>, StepError> {
            let child = ctx.start_child("double", DoubleInput { n, hours })?;
            Ok(Transition::on_child(
                CallerStep::Answer {
                    child: child.clone(),
                    timeouts: 0,
                },
                &child,
                HOUR * u32::try_from(wait_hours).unwrap_or(u32::MAX),
            ))
        }

        /// Reports the child's end; after a timeout, waits again (a day).
        #[step]
        async fn answer(
            ctx: StepContext<'_>,
            child: ChildRun<Double>,
            timeouts: u32,
        ) -> Result<Transition<CallerStep>, StepError> {
            Ok(Transition::done(match ctx.child_result(&child)? {
                Some(Ok(doubled)) => format!("doubled: {doubled} after {timeouts} timeouts"),
                Some(Err(failed)) => {
                    format!("child failed: {}", failed.message.unwrap_or_default())
                }
                None => {
                    let again = CallerStep::Answer {
                        child: child.clone(),
                        timeouts: timeouts + 1,
                    };
                    return Ok(Transition::on_child(again, &child, HOUR * 24));
                }
            }))
        }
    }

    async fn env() -> TestRuntime<Workflows> {
        let router = Workflows::builder()
            .register(Double)
            .register(Caller)
            .build();
        TestRuntime::new(router).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_typed_parent_reads_its_childs_output_across_a_crash() {
        let env = env().await;
        let run = env
            .start(CallerInput {
                n: 21,
                hours: 2,
                wait_hours: 24,
            })
            .await
            .unwrap();
        env.run_until_idle().await.unwrap();
        let child = RunId::new(format!("{}--double", run.id())).unwrap();
        let details = env
            .runtime()
            .unwrap()
            .view()
            .run(&child)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(details.parent.as_ref(), Some(run.id()));
        // The process dies while the child waits on its timer.
        env.crash().await.unwrap();
        env.run_until_ended(run.id()).await.unwrap();
        assert_eq!(run.output().await.unwrap(), "doubled: 42 after 0 timeouts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_typed_parent_handles_its_childs_failure_and_its_timeout() {
        let env = env().await;
        let failing = env
            .start(CallerInput {
                n: 0,
                hours: 1,
                wait_hours: 24,
            })
            .await
            .unwrap();
        env.run_until_ended(failing.id()).await.unwrap();
        assert_eq!(
            failing.output().await.unwrap(),
            "child failed: nothing to double"
        );

        // The first wait times out before the child ends (`None`; the
        // child keeps running) and the step waits again.
        let slow = env
            .start(CallerInput {
                n: 5,
                hours: 30,
                wait_hours: 1,
            })
            .await
            .unwrap();
        env.run_until_ended(slow.id()).await.unwrap();
        assert_eq!(slow.output().await.unwrap(), "doubled: 10 after 2 timeouts");
    }
}

/// In a cluster the child lives in its parent's shard (it is committed in
/// the parent's settlement), whatever its id's home shard: a client finds
/// it for `status` and `wait`, and a cancel of the parent through the
/// client cascades to it.
#[tokio::test(start_paused = true)]
async fn a_clusters_client_finds_a_child_in_its_parents_shard() {
    use taquba::QueueConfig;
    use taquba_workflow::NoopTerminalHook;
    use taquba_workflow::cluster::{ClusterRuntime, Ownership, StaticOwnership, shard_of};
    use taquba_workflow_suite::testing::TokioClock;

    const SHARDS: u32 = 8;
    let shards = std::num::NonZeroU32::new(SHARDS).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let node = |name: &str, ownership: Ownership| {
        ClusterRuntime::builder(
            store.clone(),
            "prod/wf",
            Family::default(),
            NoopTerminalHook,
        )
        .shards(SHARDS)
        .node_id(name)
        .ownership(ownership)
        .open_options(|_| {
            OpenOptions::default()
                .clock(Arc::new(TokioClock::new(crate::common::T0)))
                .flush_interval(Duration::from_millis(1))
                .default_queue_config(
                    QueueConfig::default()
                        .retry_backoff_base(Duration::ZERO)
                        .lease_duration(Duration::from_secs(5)),
                )
        })
        .configure(|builder| builder.poll_interval(Duration::from_millis(20)))
        .reader_poll_interval(Duration::from_millis(20))
        .start()
    };
    let owner = node(
        "owner",
        Ownership::Static(StaticOwnership::ordinal(0, 1).unwrap()),
    )
    .await
    .unwrap();
    let client = node("client", Ownership::Client).await.unwrap();
    // Parents whose child's id routes to another shard than theirs.
    let parent = |prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}{i}"))
            .find(|id| shard_of(id, shards) != shard_of(&format!("{id}--c"), shards))
            .unwrap()
    };

    let done = parent("cp");
    let _ = owner.submit(spec(&done, "parent:ok:far")).await.unwrap();
    let child = rid(&format!("{done}--c"));
    let end = client
        .wait_timeout(&child, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the client finds the child");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert!(client.status(&child).await.unwrap().is_some());
    let end = client
        .wait_timeout(&rid(&done), Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the parent ends");
    assert_eq!(result_of(&end), "child said far");

    let held = parent("hp");
    let _ = owner.submit(spec(&held, "parent:hold")).await.unwrap();
    let child = rid(&format!("{held}--c"));
    crate::common::eventually("the child holds", || async {
        client
            .status(&child)
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1)
    })
    .await;
    let _ = client.cancel(&rid(&held)).await.unwrap();
    for id in [child, rid(&held)] {
        let end = client
            .wait_timeout(&id, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("ended");
        assert_eq!(end.termination.status, TerminalStatus::Cancelled, "{id}");
    }
    owner.shutdown().await.unwrap();
    client.shutdown().await.unwrap();
}

/// Retention removes a parent's links to its children with the parent, and
/// the end of a child its parent never read once nothing can read it.
#[tokio::test(start_paused = true)]
async fn retention_removes_a_parents_child_links_and_unread_ends() {
    let (queue, store, _clock) = memory_queue().await;
    let family = Family::default();
    let runtime = workflow_builder(&queue, &store, &family)
        .memo_retention(Duration::ZERO)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // One parent reads its child's end; the other never waits for it.
    runtime.submit(spec("kept", "parent:ok:hi")).await.unwrap();
    runtime.submit(spec("left", "orphan:ok:bye")).await.unwrap();
    crate::common::eventually("the sweep to remove every run", || async {
        let mut gone = true;
        for id in ["kept", "left", "kept--c", "left--c"] {
            gone &= runtime.status(&rid(id)).await.unwrap().is_none()
                && runtime.outcome(&rid(id)).await.unwrap().is_none();
        }
        gone
    })
    .await;
    crate::common::eventually("the children's state to go", || async {
        let mut left = Vec::new();
        for prefix in [
            &b"workflow/children/"[..],
            b"workflow/child-ends/",
            b"workflow/child-wakes/",
            b"workflow/child-active/",
        ] {
            let page = queue.view().kv_scan(prefix, .., 10).await.unwrap();
            left.extend(page.entries.into_iter().map(|(k, _)| k));
        }
        left.is_empty()
    })
    .await;
    assert_eq!(family.step0_calls("left--c"), 1);
    worker.shutdown().await.unwrap();
}
