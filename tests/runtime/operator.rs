//! Listing and describing runs from another process: a writer runs a
//! runtime over a store in a directory, and a second "process" (its own
//! object store instance and a `taquba::QueueReader` over the same
//! directory) finds the runtime from the store alone, lists runs with
//! every filter and page, describes them and reads their history and
//! groups.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use taquba::object_store::ObjectStore;
use taquba::{QueueReader, ReaderOptions};
use taquba_workflow::{
    MemoStore, NoopTerminalHook, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    TerminalStatus, WorkflowRuntime, WorkflowView, view::RunFilter, view::RunSummary,
    view::StatusFilter,
};

const HOUR: Duration = Duration::from_secs(3600);

/// A run whose id names `slow` waits an hour at step 1, one that names
/// `fail` fails at step 0, the rest succeed at step 1.
fn runner() -> impl taquba_workflow::StepRunner + use<> {
    FnRunner(|step: Step| async move {
        let id = step.run_id.to_string();
        match step.step_number {
            0 if id.contains("fail") => Err(StepError::permanent("bad input")),
            0 => Ok(StepOutcome::continue_now(step.payload.clone())),
            1 if id.contains("slow") => Ok(StepOutcome::continue_after(vec![], HOUR)),
            _ => Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            }),
        }
    })
}

/// A `#[workflow]` envelope, written by hand (the macro suites have their
/// own binaries).
fn envelope(workflow: &str, step: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        workflow: &'a str,
        step: HashMap<&'a str, HashMap<&'a str, u32>>,
    }
    rmp_serde::to_vec_named(&Envelope {
        workflow,
        step: [(step, HashMap::new())].into(),
    })
    .unwrap()
}

/// A second process's view of the store in `dir`: its own object store
/// and a reader polling the manifest every 20 ms.
pub(crate) async fn second_process(dir: &std::path::Path) -> (QueueReader, Arc<dyn ObjectStore>) {
    let store = dir_store(dir);
    let reader = QueueReader::open_with_options(
        store.clone(),
        "db",
        ReaderOptions::default().manifest_poll_interval(Duration::from_millis(20)),
    )
    .await
    .expect("open a reader");
    (reader, store)
}

fn ids(runs: &[RunSummary]) -> Vec<String> {
    runs.iter().map(|r| r.run_id.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn another_process_finds_lists_and_describes_the_runs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), runner(), NoopTerminalHook)
            .poll_interval(Duration::from_millis(50))
            .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut headers = HashMap::new();
    headers.insert("tenant".to_string(), "acme".to_string());
    for (id, input) in [
        ("a-done", b"x".to_vec()),
        ("b-slow", b"x".to_vec()),
        ("c-order", envelope("order", "charge")),
    ] {
        runtime
            .submit(RunSpec {
                run_id: Some(rid(id)),
                input,
                options: RunOptions {
                    headers: headers.clone(),
                    ..Default::default()
                },
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // The slow run's timer is set an hour from the (mock) time its step
    // runs: let it run before the clock moves on.
    until_step("the slow run's timer", &runtime, "b-slow", 2).await;
    // `fail-1` is submitted later, so `submitted since` can tell it apart.
    clock.advance(Duration::from_secs(60));
    submit_run(&runtime, "fail-1").await;
    let group = runtime.group(rid("g1"));
    group
        .submit(
            vec![member("k1", "x"), member("k2", "x")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    for id in ["a-done", "c-order", "fail-1"] {
        within(30, runtime.wait(&rid(id))).await.unwrap();
    }
    let members: Vec<_> = [member_run_id("g1", "k1"), member_run_id("g1", "k2")].into();
    for id in &members {
        within(30, runtime.wait(id)).await.unwrap();
    }

    let (reader, reader_store) = second_process(dir.path()).await;
    eventually("the reader to find the runtime", || async {
        !WorkflowView::runtimes(reader.view())
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    let runtimes = WorkflowView::runtimes(reader.view()).await.unwrap();
    assert_eq!(runtimes.len(), 1);
    let info = &runtimes[0];
    assert_eq!(info.queue_name, STEPS);
    assert_eq!(info.memo_prefix, MEMO_PREFIX);
    assert_eq!(info.format, 1);
    let view = WorkflowView::new(
        reader.view().clone(),
        MemoStore::new(reader_store, info.memo_prefix.clone()),
    );
    let all_ids = {
        let mut all: Vec<String> = ["a-done", "b-slow", "c-order", "fail-1"]
            .iter()
            .map(|s| s.to_string())
            .chain(members.iter().map(|id| id.to_string()))
            .collect();
        all.sort();
        all
    };
    eventually("the reader to see every run terminated but one", || async {
        let page = view.runs(&RunFilter::new()).await.unwrap();
        ids(&page.runs) == all_ids
            && page
                .runs
                .iter()
                .filter(|r| matches!(r.state, RunState::Terminated(_)))
                .count()
                == all_ids.len() - 1
    })
    .await;

    // Status filters.
    let active = view
        .runs(&RunFilter::new().status(StatusFilter::Active))
        .await
        .unwrap();
    assert_eq!(ids(&active.runs), ["b-slow"]);
    let slow = &active.runs[0];
    assert_eq!(slow.state, RunState::Pending);
    assert_eq!(slow.current_step, 2);
    assert_eq!(slow.submitted_at_ms, Some(T0));
    assert_eq!(slow.ended_at_ms, None);
    assert_eq!(
        slow.step_name, None,
        "a hand-written runner's step not settled yet"
    );
    let terminated = view
        .runs(&RunFilter::new().status(StatusFilter::Terminated))
        .await
        .unwrap();
    assert_eq!(terminated.runs.len(), all_ids.len() - 1);
    let failed = terminated
        .runs
        .iter()
        .find(|r| r.run_id == "fail-1")
        .unwrap();
    let RunState::Terminated(termination) = &failed.state else {
        panic!("{failed:?}");
    };
    assert_eq!(termination.status, TerminalStatus::Failed);
    assert_eq!(failed.submitted_at_ms, Some(T0 + 60_000));
    assert_eq!(failed.step_name.as_deref(), Some("FnRunner"));
    assert_eq!(failed.attempts, 1);

    // Workflow, group and time filters.
    let orders = view
        .runs(&RunFilter::new().workflow("order"))
        .await
        .unwrap();
    assert_eq!(ids(&orders.runs), ["c-order"]);
    assert_eq!(orders.runs[0].workflow.as_deref(), Some("order"));
    let in_group = view.runs(&RunFilter::new().group(rid("g1"))).await.unwrap();
    let mut expected: Vec<String> = members.iter().map(|id| id.to_string()).collect();
    expected.sort();
    assert_eq!(ids(&in_group.runs), expected);
    assert!(in_group.runs.iter().all(|r| r.group == Some(rid("g1"))));
    let recent = view
        .runs(&RunFilter::new().submitted_since_ms(T0 + 1))
        .await
        .unwrap();
    assert_eq!(recent.runs.len(), 3, "fail-1 and the group's two members");

    // Pages of 2 in run-id order, each run once.
    let mut paged = Vec::new();
    let mut filter = RunFilter::new().limit(2);
    loop {
        let page = view.runs(&filter).await.unwrap();
        assert!(page.runs.len() <= 2);
        paged.extend(ids(&page.runs));
        match page.next {
            Some(next) => filter = filter.after(next),
            None => break,
        }
    }
    assert_eq!(paged, all_ids);

    // One run described.
    let details = view.run(&rid("b-slow")).await.unwrap().unwrap();
    assert_eq!(details.state, RunState::Pending);
    assert_eq!(details.current_step, 2);
    assert_eq!(details.scheduled_at_ms, Some(T0 + 3_600_000), "its timer");
    assert_eq!(
        details.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert_eq!(details.attempts, 0);
    assert!(details.max_attempts > 0);
    assert!(details.job_id.is_some());
    assert!(!details.cancel_requested);
    let failed = view.run(&rid("fail-1")).await.unwrap().unwrap();
    assert_eq!(failed.last_error.as_deref(), Some("bad input"));
    assert_eq!(failed.submitted_at_ms, Some(T0 + 60_000));
    assert!(failed.ended_at_ms.is_some());
    let order = view.run(&rid("c-order")).await.unwrap().unwrap();
    assert_eq!(order.workflow.as_deref(), Some("order"));
    assert_eq!(
        order.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let member = view.run(&members[0]).await.unwrap().unwrap();
    assert_eq!(member.group, Some(rid("g1")));
    assert!(view.run(&rid("never")).await.unwrap().is_none());

    // History and groups, read from here as the writer reads them.
    assert_eq!(
        view.steps(&rid("a-done")).await.unwrap(),
        runtime.view().steps(&rid("a-done")).await.unwrap()
    );
    let history = view.steps(&rid("b-slow")).await.unwrap().unwrap();
    assert_eq!(history.steps.len(), 2);
    assert_eq!(history.steps_taken, 3);
    let groups = view.groups(None, 10).await.unwrap();
    assert_eq!(groups.groups.len(), 1);
    assert_eq!(groups.groups[0].group_id, rid("g1"));
    assert_eq!(groups.groups[0].total, 2);
    assert_eq!(groups.groups[0].succeeded, 2);
    assert_eq!(groups.next, None);
    assert_eq!(
        view.group(&rid("g1")).await.unwrap(),
        Some(groups.groups[0].clone())
    );
    assert!(view.group(&rid("nope")).await.unwrap().is_none());

    worker.shutdown().await.unwrap();
    reader.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_run_waiting_on_a_signal_shows_the_key_and_its_timeout() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        match step.step_number {
            0 => Ok(StepOutcome::continue_on_signal(
                vec![],
                "approval-7",
                Duration::from_secs(600),
            )),
            _ => Ok(StepOutcome::Succeed { result: vec![] }),
        }
    });
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "w").await;
    until_step("the wait", &runtime, "w", 1).await;
    let details = runtime.view().run(&rid("w")).await.unwrap().unwrap();
    let wait = details.waiting_for_signal.expect("a signal wait");
    assert_eq!(wait.correlation_key, "approval-7");
    assert_eq!(wait.timeout_at_ms, Some(T0 + 600_000));
    assert_eq!(details.scheduled_at_ms, Some(T0 + 600_000));
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_store_written_before_the_operator_fields_still_lists() {
    // A terminal record written without the new fields (as by an older
    // build, with only the fields of 0.13) decodes and lists.
    let (queue, store, _clock) = memory_queue().await;
    #[derive(serde::Serialize)]
    struct OldTermination {
        status: &'static str,
        error: Option<String>,
        error_kind: Option<String>,
        final_step: u32,
        terminated_at_ms: u64,
    }
    queue
        .kv_put(
            b"workflow/outcomes/old-run",
            &rmp_serde::to_vec_named(&OldTermination {
                status: "succeeded",
                error: None,
                error_kind: None,
                final_step: 3,
                terminated_at_ms: T0,
            })
            .unwrap(),
        )
        .await
        .unwrap();
    let runtime = WorkflowRuntime::builder(queue, store, runner(), NoopTerminalHook).build();
    let page = runtime.view().runs(&RunFilter::new()).await.unwrap();
    assert_eq!(ids(&page.runs), ["old-run"]);
    let old = &page.runs[0];
    assert_eq!(old.submitted_at_ms, None);
    assert_eq!(old.current_step, 3);
    assert_eq!(old.ended_at_ms, Some(T0));
    let details = runtime.view().run(&rid("old-run")).await.unwrap().unwrap();
    assert!(
        matches!(details.state, RunState::Terminated(ref t) if t.status == TerminalStatus::Succeeded)
    );
    let history = runtime
        .view()
        .steps(&rid("old-run"))
        .await
        .unwrap()
        .unwrap();
    assert!(history.steps.is_empty());
    assert_eq!(history.steps_dropped, 4);
    // A filter on submission time never matches a run without one.
    let since = runtime
        .view()
        .runs(&RunFilter::new().submitted_since_ms(0))
        .await
        .unwrap();
    assert!(since.runs.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_runs_input_is_read_while_the_queue_keeps_its_first_job() {
    // One queue deletes done jobs (the default), the other keeps them.
    for keep in [false, true] {
        let clock = taquba::MockClock::new(T0);
        let store: Arc<dyn ObjectStore> = Arc::new(taquba::object_store::memory::InMemory::new());
        let config = taquba::QueueConfig::default()
            .retry_backoff_base(Duration::ZERO)
            .keep_done_jobs(keep.then_some(HOUR));
        let queue = Arc::new(
            taquba::Queue::open_with_options(
                store.clone(),
                "db",
                options(&clock).default_queue_config(config),
            )
            .await
            .unwrap(),
        );
        let runtime = WorkflowRuntime::builder(queue, store, runner(), NoopTerminalHook)
            .poll_interval(Duration::from_millis(50))
            .build();
        let view = runtime.view();
        assert_eq!(view.input(&rid("slow-in")).await.unwrap(), None);
        runtime
            .submit(RunSpec {
                run_id: Some(rid("slow-in")),
                input: b"the input".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap();
        // Step 0 is current: its job is the input.
        assert_eq!(
            view.input(&rid("slow-in")).await.unwrap().as_deref(),
            Some(&b"the input"[..])
        );
        let worker = runtime.spawn(std::future::pending::<()>());
        until_step("the slow run's timer", &runtime, "slow-in", 2).await;
        let after = view.input(&rid("slow-in")).await.unwrap();
        match keep {
            true => assert_eq!(after.as_deref(), Some(&b"the input"[..])),
            false => assert_eq!(after, None, "a deleted step-0 job has no input"),
        }
        worker.shutdown().await.unwrap();
    }
}
