//! Commands from processes that do not own the store: sent as objects to
//! the owner's inbox, applied once by its maintenance with their answers
//! recorded, never applied twice across a crash between the apply and the
//! removal of the object (or while deletes fail), and refused with a
//! recorded error when malformed, oversized or invalid, without holding up
//! the commands after them: garbage objects, objects in sub-directories,
//! a command named by a lowercase ULID, a signal on an oversized key.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::fixtures::{Scripted, ends_within, spec, state, switchable_store, tokio_clock_queue};
use common::*;
use taquba::OpenOptions;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba::{QueueReader, ReaderOptions};
use taquba_workflow::{
    Error, MemoStore, NoopTerminalHook, RunState, SignalOutcome, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime, WorkflowView, history::AttemptOutcome,
    inbox::Command, inbox::CommandAnswer, inbox::CommandId, inbox::CommandState, inbox::Inbox,
    inbox::MAX_COMMAND_SIZE, inbox::MAX_COMMAND_TEXT_LEN, inbox::SubmitCommand, view::RunFilter,
};
use taquba_workflow_suite::testing::{FaultConfig, FaultyStore, Op};

const HOUR: Duration = Duration::from_secs(3600);

/// Runs by their id: `slow*` waits an hour at step 1; `wait*` waits for
/// signal `k-{id}` (10 s) and succeeds with the signal (or `timeout`);
/// `fail-once*` fails permanently until `healed` is set; `verdict*` returns
/// a `Fail` verdict; the rest succeed at once.
#[derive(Clone, Default)]
struct Runner {
    healed: Arc<AtomicBool>,
}

impl StepRunner for Runner {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let id = step.run_id.to_string();
        match step.step_number {
            0 if id.starts_with("hold") => {
                // Outlives the inbox round's wait for it once cancelled.
                step.cancel_token.cancelled().await;
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok(StepOutcome::Succeed { result: vec![] })
            }
            0 if id.starts_with("slow") => Ok(StepOutcome::continue_now(vec![])),
            1 if id.starts_with("slow") => Ok(StepOutcome::continue_after(vec![], HOUR)),
            0 if id.starts_with("wait") => Ok(StepOutcome::continue_on_signal(
                vec![],
                format!("k-{id}"),
                Duration::from_secs(10),
            )),
            1 if id.starts_with("wait") => Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_else(|| b"timeout".to_vec()),
            }),
            _ if id.starts_with("fail-once") && !self.healed.load(Ordering::SeqCst) => {
                Err(StepError::permanent("upstream rejected it"))
            }
            _ if id.starts_with("verdict") => Ok(StepOutcome::Fail {
                reason: "not allowed".into(),
            }),
            _ => Ok(StepOutcome::Succeed {
                result: b"ok".to_vec(),
            }),
        }
    }
}

fn runtime_over(
    queue: &Arc<taquba::Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: &Runner,
) -> WorkflowRuntime<Runner, NoopTerminalHook> {
    WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        runner.clone(),
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(50))
    .build()
}

/// Poll `view` until command `id` is applied or rejected; its state.
pub(crate) async fn settled(view: &WorkflowView, id: &CommandId) -> CommandState {
    let mut state = CommandState::Pending;
    for _ in 0..6_000 {
        state = view.command(id).await.unwrap();
        if matches!(
            state,
            CommandState::Applied { .. } | CommandState::Rejected { .. }
        ) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("command {id} not settled: {state:?}");
}

fn answer(state: CommandState) -> CommandAnswer {
    match state {
        CommandState::Applied { answer, .. } => answer,
        other => panic!("not applied: {other:?}"),
    }
}

pub(crate) fn rejection(state: CommandState) -> String {
    match state {
        CommandState::Rejected { error, .. } => error,
        other => panic!("not rejected: {other:?}"),
    }
}

/// The objects left in the inbox of `store`.
async fn inbox_objects(store: &Arc<dyn ObjectStore>) -> usize {
    use futures_util::StreamExt;
    let dir = Path::from(format!("{MEMO_PREFIX}/inbox/v1"));
    store.list(Some(&dir)).collect::<Vec<_>>().await.len()
}

#[tokio::test(start_paused = true)]
async fn commands_sent_from_another_process_are_applied_and_answered() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    // Runs the commands will act on.
    submit_run(&runtime, "slow-1").await;
    submit_run(&runtime, "wait-1").await;
    submit_run(&runtime, "fail-once-1").await;
    until_step("the slow run's timer", &runtime, "slow-1", 2).await;
    until_step("the signal wait", &runtime, "wait-1", 1).await;
    until_terminated("the failing run", &runtime, "fail-once-1").await;

    // The other process: its own object store over the directory, a reader
    // for the state, an inbox for the commands.
    let their_store = dir_store(dir.path());
    let reader = QueueReader::open_with_options(
        their_store.clone(),
        "db",
        ReaderOptions::default().manifest_poll_interval(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let view = WorkflowView::new(
        reader.view().clone(),
        MemoStore::new(their_store.clone(), MEMO_PREFIX),
    );
    let inbox = Inbox::new(their_store.clone(), MEMO_PREFIX).with_sender("ops@laptop");

    let submit = inbox
        .send(Command::Submit(
            SubmitCommand::new(b"from the cli".to_vec())
                .run_id(rid("from-cli"))
                .header("tenant", "acme"),
        ))
        .await
        .unwrap();
    let cancel = inbox
        .send(Command::cancel(
            rid("slow-1"),
            Some("operator said so".into()),
        ))
        .await
        .unwrap();
    let signal = inbox
        .send(Command::signal("k-wait-1", b"approved".to_vec()))
        .await
        .unwrap();
    let unknown = inbox
        .send(Command::cancel(rid("no-such-run"), None))
        .await
        .unwrap();
    runner.healed.store(true, Ordering::SeqCst);
    let requeue = inbox
        .send(Command::requeue(rid("fail-once-1")))
        .await
        .unwrap();

    assert_eq!(
        answer(settled(&view, &submit).await),
        CommandAnswer::Submitted {
            run_id: rid("from-cli"),
            newly_submitted: true
        }
    );
    assert_eq!(
        answer(settled(&view, &cancel).await),
        CommandAnswer::Cancelled {
            run_id: rid("slow-1"),
            cancelled: true
        }
    );
    assert_eq!(
        answer(settled(&view, &signal).await),
        CommandAnswer::Signalled {
            outcome: SignalOutcome::Delivered,
            run_id: Some(rid("wait-1"))
        }
    );
    assert_eq!(
        answer(settled(&view, &unknown).await),
        CommandAnswer::Cancelled {
            run_id: rid("no-such-run"),
            cancelled: false
        }
    );
    let CommandAnswer::Requeued { run_id, step, .. } = answer(settled(&view, &requeue).await)
    else {
        panic!("not a requeue");
    };
    assert_eq!((run_id, step), (rid("fail-once-1"), 0));

    // What the commands did, as the owner sees it.
    let submitted = within(30, runtime.wait(&rid("from-cli"))).await.unwrap();
    let outcome = submitted.outcome.expect("recorded");
    assert_eq!(
        outcome.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let cancelled = runtime.view().run(&rid("slow-1")).await.unwrap().unwrap();
    assert_eq!(cancelled.cancel_reason.as_deref(), Some("operator said so"));
    assert!(
        matches!(cancelled.state, RunState::Terminated(ref t) if t.status == TerminalStatus::Cancelled)
    );
    let signalled = within(30, runtime.wait(&rid("wait-1"))).await.unwrap();
    assert_eq!(
        signalled.outcome.and_then(|o| o.result).as_deref(),
        Some(b"approved".as_slice())
    );
    let requeued = within(30, runtime.wait(&rid("fail-once-1"))).await.unwrap();
    assert_eq!(requeued.termination.status, TerminalStatus::Succeeded);
    let history = runtime
        .view()
        .steps(&rid("fail-once-1"))
        .await
        .unwrap()
        .unwrap();
    let outcomes: Vec<_> = history.steps[0]
        .attempts
        .iter()
        .map(|a| a.outcome.clone())
        .collect();
    assert!(
        matches!(
            outcomes.as_slice(),
            [
                AttemptOutcome::Failed { .. },
                AttemptOutcome::Requeued,
                AttemptOutcome::Succeeded
            ]
        ),
        "{outcomes:?}"
    );
    // The applied commands left the inbox.
    eventually("the inbox to empty", || async {
        inbox_objects(&their_store).await == 0
    })
    .await;
    worker.shutdown().await.unwrap();
    reader.close().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_command_whose_object_outlives_its_apply_is_not_applied_again() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    // The owner's object store fails every delete in its inbox: the command
    // is applied and its object stays, as after a crash between the two.
    let faulty = FaultyStore::new(
        store.clone(),
        FaultConfig {
            rates: [0.0, 0.0, 0.0, 1.0],
            only_under: vec![format!("{MEMO_PREFIX}/inbox")],
            ..FaultConfig::default()
        },
    );
    let owner_store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let queue = open(&store, &clock).await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &owner_store, &runner);
    let inbox = Inbox::new(dir_store(dir.path()), MEMO_PREFIX);
    // No run id: applied twice, it would start two runs.
    let id = inbox
        .send(Command::Submit(SubmitCommand::new(b"once".to_vec())))
        .await
        .unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    let state = settled(runtime.view(), &id).await;
    let CommandAnswer::Submitted { run_id, .. } = answer(state.clone()) else {
        panic!("{state:?}");
    };
    // Many more rounds find the object and apply nothing.
    eventually("several failed deletes", || async {
        faulty.injected(Op::Delete) >= 5
    })
    .await;
    assert_eq!(
        inbox_objects(&store).await,
        1,
        "the object outlived its apply"
    );
    let runs = runtime.view().runs(&RunFilter::new()).await.unwrap();
    assert_eq!(runs.runs.len(), 1, "{:?}", runs.runs);
    assert_eq!(runs.runs[0].run_id, run_id);
    worker.shutdown().await.unwrap();
    drop(runtime);
    close(queue).await;

    // Restarted, with deletes working: the object goes, nothing is applied.
    let queue = open(&store, &clock).await;
    let runtime = runtime_over(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    eventually("the object to be removed", || async {
        inbox_objects(&store).await == 0
    })
    .await;
    let runs = runtime.view().runs(&RunFilter::new()).await.unwrap();
    assert_eq!(runs.runs.len(), 1, "{:?}", runs.runs);
    assert_eq!(runtime.view().command(&id).await.unwrap(), state);
    worker.shutdown().await.unwrap();
}

/// A command object written by hand, as a buggy or hostile sender could.
#[derive(serde::Serialize)]
struct HandMade<'a> {
    format: u32,
    id: String,
    sent_at_ms: u64,
    command: HandMadeSubmit<'a>,
}

#[derive(serde::Serialize)]
struct HandMadeSubmit<'a> {
    kind: &'a str,
    #[serde(with = "serde_bytes_like")]
    input: Vec<u8>,
    headers: std::collections::HashMap<&'a str, &'a str>,
}

/// `serde_bytes` for one field, without the dependency.
mod serde_bytes_like {
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
}

#[tokio::test(start_paused = true)]
async fn malformed_oversized_and_invalid_commands_are_rejected_and_the_inbox_moves_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    // Each sent as a valid command, then overwritten before the owner runs.
    let garbage = inbox.send(Command::requeue(rid("x"))).await.unwrap();
    let oversized = inbox.send(Command::requeue(rid("x"))).await.unwrap();
    let reserved = inbox.send(Command::requeue(rid("x"))).await.unwrap();
    let other_id = inbox.send(Command::requeue(rid("x"))).await.unwrap();
    let valid = inbox
        .send(Command::Submit(
            SubmitCommand::new(vec![]).run_id(rid("after")),
        ))
        .await
        .unwrap();
    let put = |id: &CommandId, bytes: Vec<u8>| {
        let path = inbox.command_path(id);
        let store = store.clone();
        async move { store.put(&path, PutPayload::from(bytes)).await.unwrap() }
    };
    put(&garbage, b"\x93not a command".to_vec()).await;
    put(&oversized, vec![0; MAX_COMMAND_SIZE + 1]).await;
    let hand_made = |id: &CommandId| {
        rmp_serde::to_vec_named(&HandMade {
            format: 1,
            id: id.to_string(),
            sent_at_ms: 0,
            command: HandMadeSubmit {
                kind: "submit",
                input: vec![],
                headers: [("workflow.step", "9")].into(),
            },
        })
        .unwrap()
    };
    put(&reserved, hand_made(&reserved)).await;
    // A command object holding another command's id.
    put(&other_id, hand_made(&garbage)).await;
    // Not a command's name at all.
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/v1/notes.txt")),
            PutPayload::from_static(b"hello"),
        )
        .await
        .unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    let view = runtime.view();
    let error = rejection(settled(view, &garbage).await);
    assert!(error.contains("not a command"), "{error}");
    let error = rejection(settled(view, &oversized).await);
    assert!(
        error.contains(&(MAX_COMMAND_SIZE + 1).to_string()),
        "{error}"
    );
    let error = rejection(settled(view, &reserved).await);
    assert!(error.contains("workflow.step"), "{error}");
    let error = rejection(settled(view, &other_id).await);
    assert!(error.contains(&garbage.to_string()), "{error}");
    assert_eq!(
        answer(settled(view, &valid).await),
        CommandAnswer::Submitted {
            run_id: rid("after"),
            newly_submitted: true
        }
    );
    eventually("the inbox to empty", || async {
        inbox_objects(&store).await == 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_signal_is_not_delivered_to_a_step_that_timed_out() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "wait-late").await;
    until_step("the wait", &runtime, "wait-late", 1).await;
    clock.advance(Duration::from_secs(11));
    let end = within(30, runtime.wait(&rid("wait-late"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"timeout".as_slice())
    );
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::signal("k-wait-late", b"too late".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        answer(settled(runtime.view(), &id).await),
        CommandAnswer::Signalled {
            outcome: SignalOutcome::Buffered,
            run_id: None
        }
    );
    // The buffered signal goes to the next waiter on the key.
    submit_run(&runtime, "wait-late2").await;
    let id = inbox
        .send(Command::signal("k-wait-late2", b"on time".to_vec()))
        .await
        .unwrap();
    let answered = answer(settled(runtime.view(), &id).await);
    let end = within(30, runtime.wait(&rid("wait-late2"))).await.unwrap();
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(b"on time".as_slice()),
        "{answered:?}"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn requeue_is_refused_for_a_run_that_did_not_fail_by_a_dead_letter() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "verdict-1").await;
    submit_run(&runtime, "done-1").await;
    submit_run(&runtime, "slow-2").await;
    for id in ["verdict-1", "done-1"] {
        until_terminated(id, &runtime, id).await;
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    for (id, expected) in [
        ("verdict-1", "`Fail` verdict is final"),
        ("done-1", "ended succeeded"),
        ("slow-2", "is active"),
        ("never-1", "is not known"),
    ] {
        let command = inbox.send(Command::requeue(rid(id))).await.unwrap();
        let error = rejection(settled(runtime.view(), &command).await);
        assert!(error.contains(id) && error.contains(expected), "{error}");
    }
    // The in-process call refuses alike.
    let err = runtime.requeue(&rid("done-1")).await.unwrap_err();
    assert!(matches!(err, Error::CommandRefused(_)), "{err}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_duplicate_submission_is_answered_as_one() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    submit_run(&runtime, "slow-dup").await;
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let same = inbox
        .send(Command::Submit(
            SubmitCommand::new(vec![]).run_id(rid("slow-dup")),
        ))
        .await
        .unwrap();
    let other = inbox
        .send(Command::Submit(
            SubmitCommand::new(b"another input".to_vec()).run_id(rid("slow-dup")),
        ))
        .await
        .unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        answer(settled(runtime.view(), &same).await),
        CommandAnswer::Submitted {
            run_id: rid("slow-dup"),
            newly_submitted: false
        }
    );
    let error = rejection(settled(runtime.view(), &other).await);
    assert!(
        error.contains("slow-dup") && error.contains("different input"),
        "{error}"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn command_records_are_removed_after_the_command_retention() {
    let (queue, store, clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .command_retention(Duration::from_secs(60))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::cancel(rid("nobody"), None))
        .await
        .unwrap();
    settled(runtime.view(), &id).await;
    clock.advance(Duration::from_secs(61));
    eventually("the record to expire", || async {
        runtime.view().command(&id).await.unwrap() == CommandState::Unknown
    })
    .await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_sender_refuses_what_the_owner_would_reject() {
    let (_queue, store, _clock) = memory_queue().await;
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let err = inbox
        .send(Command::Submit(
            SubmitCommand::new(vec![]).header("workflow.run_id", "x"),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ReservedHeaderInSubmit(ref h) if h == "workflow.run_id"),
        "{err}"
    );
    let err = inbox
        .send(Command::cancel(
            rid("r"),
            Some("x".repeat(MAX_COMMAND_TEXT_LEN + 1)),
        ))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cancellation reason"), "{err}");
    let err = inbox
        .send(Command::signal("k", vec![0; taquba::MAX_KV_VALUE_SIZE + 1]))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("large") || err.to_string().contains("262145"),
        "{err}"
    );
    assert_eq!(inbox_objects(&store).await, 0, "nothing was sent");
    let err = "not-a-ulid".parse::<CommandId>().unwrap_err();
    assert!(err.to_string().contains("not-a-ulid"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn an_offline_tool_applies_the_inbox_without_running_steps() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &store, &runner);
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::Submit(
            SubmitCommand::new(vec![]).run_id(rid("queued")),
        ))
        .await
        .unwrap();
    assert_eq!(
        runtime.view().command(&id).await.unwrap(),
        CommandState::Pending
    );
    assert_eq!(runtime.apply_inbox().await.unwrap(), 1);
    assert!(matches!(
        runtime.view().command(&id).await.unwrap(),
        CommandState::Applied { .. }
    ));
    assert_eq!(runtime.apply_inbox().await.unwrap(), 0);
    let status = runtime.status(&rid("queued")).await.unwrap().unwrap();
    assert_eq!(status.state, RunState::Pending, "no worker ran it");
    let _ = Command::kind(&Command::requeue(rid("x")));
}

#[tokio::test(start_paused = true)]
async fn an_idle_owner_looks_at_the_touch_instead_of_listing_the_inbox() {
    let (queue, store, _clock) = memory_queue().await;
    let counting = FaultyStore::new(store.clone(), FaultConfig::default());
    let owner_store: Arc<dyn ObjectStore> = Arc::new(counting.clone());
    let runner = Runner::default();
    let runtime = runtime_over(&queue, &owner_store, &runner);
    let worker = runtime.spawn(std::future::pending::<()>());
    // 200 maintenance rounds of 50 ms with nothing sent.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let listed = counting.calls(Op::List);
    assert!(listed <= 2, "{listed} listings of an idle inbox");
    // A command is applied at the next round all the same.
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::cancel(rid("nobody"), None))
        .await
        .unwrap();
    within(1, settled(runtime.view(), &id)).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_command_that_cannot_be_read_does_not_hold_up_the_ones_after_it() {
    let (queue, store, _clock) = memory_queue().await;
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let stuck = inbox.send(Command::cancel(rid("a"), None)).await.unwrap();
    let next = inbox.send(Command::cancel(rid("b"), None)).await.unwrap();
    // Every read of the first command's object fails (a storage error, not
    // its content): it stays pending, the second is applied.
    let faulty = FaultyStore::new(
        store.clone(),
        FaultConfig {
            rates: [0.0, 1.0, 0.0, 0.0],
            only_under: vec![inbox.command_path(&stuck).to_string()],
            ..FaultConfig::default()
        },
    );
    let owner_store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let runtime = runtime_over(&queue, &owner_store, &Runner::default());
    let worker = runtime.spawn(std::future::pending::<()>());
    let view = WorkflowView::new(queue.view().clone(), MemoStore::new(store, MEMO_PREFIX));
    settled(&view, &next).await;
    assert_eq!(view.command(&stuck).await.unwrap(), CommandState::Pending);
    // Once it reads, it is applied too.
    faulty.set_enabled(false);
    settled(&view, &stuck).await;
    worker.shutdown().await.unwrap();
}

/// The documented command format, written as another tool would.
#[derive(serde::Serialize)]
struct ForeignCancel<'a> {
    format: u32,
    id: String,
    sent_at_ms: u64,
    sender: &'a str,
    command: ForeignCancelKind<'a>,
}

#[derive(serde::Serialize)]
struct ForeignCancelKind<'a> {
    kind: &'a str,
    run_id: &'a str,
    reason: &'a str,
}

#[tokio::test(start_paused = true)]
async fn a_command_written_by_another_tool_in_the_documented_format_is_applied() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = runtime_over(&queue, &store, &Runner::default());
    submit_run(&runtime, "slow-foreign").await;
    let id: CommandId = "01JAZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
    let bytes = rmp_serde::to_vec_named(&ForeignCancel {
        format: 1,
        id: id.to_string(),
        sent_at_ms: 1,
        sender: "a python script",
        command: ForeignCancelKind {
            kind: "cancel",
            run_id: "slow-foreign",
            reason: "from elsewhere",
        },
    })
    .unwrap();
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/v1/{id}.msgpack")),
            PutPayload::from(bytes),
        )
        .await
        .unwrap();
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/touch")),
            PutPayload::from(id.to_string().into_bytes()),
        )
        .await
        .unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    assert_eq!(
        answer(settled(runtime.view(), &id).await),
        CommandAnswer::Cancelled {
            run_id: rid("slow-foreign"),
            cancelled: true
        }
    );
    let details = runtime
        .view()
        .run(&rid("slow-foreign"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(details.cancel_reason.as_deref(), Some("from elsewhere"));
    assert!(details.cancel_requested);
    worker.shutdown().await.unwrap();
}

/// A cancel command whose running step settles after the round that
/// accepted it gets its answer when the owner shuts down right after the
/// run ended (as a process that exits once its run ended does), not only at
/// its next start.
#[tokio::test(start_paused = true)]
async fn a_cancel_accepted_for_a_running_step_is_answered_before_the_owner_stops() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_over(&queue, &store, &Runner::default());
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "hold-1").await;
    for _ in 0..1_000 {
        if matches!(
            runtime
                .view()
                .run(&rid("hold-1"))
                .await
                .unwrap()
                .map(|d| d.state),
            Some(RunState::Running)
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::cancel(rid("hold-1"), Some("stop it".into())))
        .await
        .unwrap();
    let end = runtime.wait(&rid("hold-1")).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
    match runtime.view().command(&id).await.unwrap() {
        CommandState::Applied {
            answer: CommandAnswer::Cancelled { cancelled, .. },
            ..
        } => assert!(cancelled),
        other => panic!("the cancel command is {other:?} after the owner stopped"),
    }
}

// ---------------------------------------------------------------------------
// Junk in the inbox, and commands whose objects outlive their apply.

/// Write `bytes` at `{MEMO_PREFIX}/inbox/v1/{name}` and touch the inbox.
async fn drop_in_inbox(store: &Arc<dyn ObjectStore>, name: &str, bytes: Vec<u8>) {
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/v1/{name}")),
            PutPayload::from(bytes),
        )
        .await
        .unwrap();
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/inbox/touch")),
            PutPayload::from(name.as_bytes().to_vec()),
        )
        .await
        .unwrap();
}

async fn inbox_names(store: &Arc<dyn ObjectStore>) -> Vec<String> {
    use futures_util::StreamExt;
    let dir = Path::from(format!("{MEMO_PREFIX}/inbox/v1"));
    store
        .list(Some(&dir))
        .map(|m| m.unwrap().location.to_string())
        .collect::<Vec<_>>()
        .await
}

async fn settled_within(view: &WorkflowView, id: &CommandId, secs: u64) -> CommandState {
    let mut state = CommandState::Pending;
    for _ in 0..(secs * 100) {
        state = view.command(id).await.unwrap();
        if matches!(
            state,
            CommandState::Applied { .. } | CommandState::Rejected { .. }
        ) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    state
}

/// Garbage objects of every kind in the inbox (zero bytes, random bytes,
/// a wrong name, an oversized one, valid MessagePack of the wrong shape)
/// are rejected or removed, and a real command sent after them is applied.
#[tokio::test(start_paused = true)]
async fn garbage_in_the_inbox_is_removed_and_the_inbox_goes_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    submit_run(&runtime, "garbage-target").await;
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("g-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "g-wait", 1).await;
    let mut ids = Vec::new();
    for (i, bytes) in [
        Vec::new(),
        vec![0xc1; 100],
        rmp_serde::to_vec(&42u32).unwrap(),
        rmp_serde::to_vec_named(&serde_json::json!({"format": 99, "command": {"kind": "nuke"}}))
            .unwrap(),
        vec![0u8; 2 * 1024 * 1024],
    ]
    .into_iter()
    .enumerate()
    {
        let id: CommandId = format!("01JAZ3NDEKTSV4RRFFQ69G5FA{i}").parse().unwrap();
        drop_in_inbox(&store, &format!("{id}.msgpack"), bytes).await;
        ids.push(id);
    }
    for name in ["notes.txt", "NOT-A-ULID.msgpack", ".msgpack"] {
        drop_in_inbox(&store, name, b"junk".to_vec()).await;
    }
    for id in &ids {
        match settled_within(runtime.view(), id, 120).await {
            CommandState::Rejected { .. } => {}
            other => panic!("{id}: {other:?}"),
        }
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let real = inbox
        .send(Command::cancel(rid("g-wait"), Some("real".into())))
        .await
        .unwrap();
    match settled_within(runtime.view(), &real, 120).await {
        CommandState::Applied { answer, .. } => assert_eq!(
            answer,
            CommandAnswer::Cancelled {
                run_id: rid("g-wait"),
                cancelled: true
            }
        ),
        other => panic!("real command: {other:?}"),
    }
    eventually("the inbox empties", || async {
        inbox_names(&store).await.is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A command written by another tool under a lowercase ULID (Crockford
/// base 32 is case-insensitive; the id parses) is applied or rejected,
/// and its object removed; it must not sit in the inbox unanswered.
#[tokio::test(start_paused = true)]
async fn a_command_named_by_a_lowercase_ulid_is_answered_and_removed() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("lc-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "lc-wait", 1).await;
    #[derive(serde::Serialize)]
    struct Foreign<'a> {
        format: u32,
        id: &'a str,
        sent_at_ms: u64,
        sender: &'a str,
        command: Kind<'a>,
    }
    #[derive(serde::Serialize)]
    struct Kind<'a> {
        kind: &'a str,
        run_id: &'a str,
        reason: &'a str,
    }
    let lower = "01jaz3ndektsv4rrffq69g5fav";
    let id: CommandId = lower.parse().unwrap();
    let bytes = rmp_serde::to_vec_named(&Foreign {
        format: 1,
        id: lower,
        sent_at_ms: 1,
        sender: "a go tool",
        command: Kind {
            kind: "cancel",
            run_id: "lc-wait",
            reason: "lowercase",
        },
    })
    .unwrap();
    drop_in_inbox(&store, &format!("{lower}.msgpack"), bytes).await;
    let state = settled_within(runtime.view(), &id, 130).await;
    let left = inbox_names(&store).await;
    assert!(
        !matches!(state, CommandState::Pending),
        "still pending after two minutes; inbox: {left:?}; run: {:?}",
        state_of(&runtime, "lc-wait").await
    );
    assert!(left.is_empty(), "inbox objects left: {left:?}");
    worker.shutdown().await.unwrap();
}

async fn state_of<R: StepRunner, H: taquba_workflow::TerminalHook>(
    runtime: &WorkflowRuntime<R, H>,
    id: &str,
) -> Option<RunState> {
    state(runtime, id).await
}

/// Objects in a sub-directory of the inbox (a tool that wrote
/// `inbox/v1/<sender>/<ulid>.msgpack`, a stray copy) sort before every
/// command. 64 of them (a round's share) must not keep the real commands
/// after them from being applied.
#[tokio::test(start_paused = true)]
async fn nested_inbox_objects_do_not_block_later_commands() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("n-wait", "wait")).await.unwrap();
    until_step("timer", &runtime, "n-wait", 1).await;
    for i in 0..64u32 {
        let id = format!("01JAZ3NDEKTSV4RRFFQ69G{i:04}");
        let _: CommandId = id.parse().unwrap();
        drop_in_inbox(&store, &format!("0/{id}.msgpack"), b"junk".to_vec()).await;
    }
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let real = inbox
        .send(Command::cancel(rid("n-wait"), None))
        .await
        .unwrap();
    let state = settled_within(runtime.view(), &real, 130).await;
    let left = inbox_names(&store).await.len();
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the real command is {state:?} after two minutes; {left} inbox objects left"
    );
    worker.shutdown().await.unwrap();
}

/// A signal command written by hand, as a tool that skips the sender's
/// checks could.
#[derive(serde::Serialize)]
struct HandMadeSignal<'a> {
    format: u32,
    id: String,
    sent_at_ms: u64,
    command: HandMadeSignalKind<'a>,
}

#[derive(serde::Serialize)]
struct HandMadeSignalKind<'a> {
    kind: &'a str,
    correlation_key: String,
    #[serde(with = "serde_bytes_like")]
    payload: Vec<u8>,
}

/// The same oversized key sent through the inbox, as the CLI's
/// `runs signal KEY` would. The README: a key over `MAX_COMMAND_TEXT_LEN`
/// is rejected with a recorded error naming the problem and the value, and
/// the sender refuses what the owner would reject. So `Inbox::send`
/// refuses it (`InvalidCommand` naming the key's length and the limit) and
/// writes nothing; written by a tool that skips that check, the owner
/// rejects the command with that error recorded, and keeps applying the
/// commands after it.
#[tokio::test(start_paused = true)]
async fn an_inbox_signal_on_an_oversized_key_is_rejected_and_the_inbox_goes_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("after-big-key", "wait")).await.unwrap();
    until_step("timer", &runtime, "after-big-key", 1).await;
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let key = "k".repeat(70_000);
    let names_the_key = |error: &str| {
        error.contains(&format!(
            "is 70000 bytes, over the {MAX_COMMAND_TEXT_LEN}-byte limit"
        ))
    };
    match inbox
        .send(Command::signal(key.clone(), b"x".to_vec()))
        .await
    {
        Err(Error::InvalidCommand(message)) => {
            assert!(names_the_key(&message), "the sender's refusal: {message}")
        }
        other => panic!("the sender took a 70000-byte key: {other:?}"),
    }
    let left = inbox_names(&store).await;
    assert!(
        left.is_empty(),
        "the sender wrote a refused command: {left:?}"
    );
    // Written by a tool that skips the sender's check.
    let big: CommandId = "01JAZ3NDEKTSV4RRFFQ69G5FAK".parse().unwrap();
    let bytes = rmp_serde::to_vec_named(&HandMadeSignal {
        format: 1,
        id: big.to_string(),
        sent_at_ms: 0,
        command: HandMadeSignalKind {
            kind: "signal",
            correlation_key: key,
            payload: b"x".to_vec(),
        },
    })
    .unwrap();
    drop_in_inbox(&store, &format!("{big}.msgpack"), bytes).await;
    match settled_within(runtime.view(), &big, 130).await {
        CommandState::Rejected { error, .. } => {
            assert!(names_the_key(&error), "the owner's rejection: {error}")
        }
        other => panic!("the oversized-key signal command is {other:?}"),
    }
    let next = inbox
        .send(Command::cancel(rid("after-big-key"), None))
        .await
        .unwrap();
    let state = settled_within(runtime.view(), &next, 130).await;
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the command after it: {state:?}"
    );
    worker.shutdown().await.unwrap();
}

/// Inbox commands while every delete of the store fails for 20 s, so the
/// owner cannot remove a command's object once it applied it and sees it
/// again at every round. README: "records its answer in the same
/// transaction as its first effect, then deletes the object: a command is
/// applied once". A signal command woke a waiting run; applied again, it
/// would buffer the signal for the next wait on the key. After the faults
/// the objects are gone and a later wait on the key sees no signal.
#[tokio::test(start_paused = true)]
async fn inbox_commands_whose_objects_cannot_be_deleted_are_applied_once() {
    use taquba_workflow::{inbox::Command, inbox::CommandState, inbox::Inbox};
    let (faulty, store) = switchable_store();
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("inboxed", "signal:inbox-key:3600000"))
        .await
        .unwrap();
    until_step("the wait", &runtime, "inboxed", 1).await;
    faulty.set_config(FaultConfig {
        rates: [0.0, 0.0, 0.0, 1.0],
        ..FaultConfig::default()
    });
    faulty.set_enabled(true);
    let inbox = Inbox::new(store.clone(), MEMO_PREFIX);
    let id = inbox
        .send(Command::signal("inbox-key", b"from-afar".to_vec()))
        .await
        .unwrap();
    let end = ends_within(&runtime, "inboxed", 60, "the inbox signal").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"from-afar"[..])
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(faulty.injected(Op::Delete) > 0, "no delete was attempted");
    faulty.set_enabled(false);
    assert!(matches!(
        runtime.view().command(&id).await.unwrap(),
        CommandState::Applied { .. }
    ));
    // A later wait on the key: no signal was buffered by a second apply.
    runtime
        .submit(spec("later", "signal:inbox-key:1000"))
        .await
        .unwrap();
    let end = ends_within(&runtime, "later", 60, "the later wait").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"timed out"[..]),
        "the signal command was applied twice"
    );
    eventually("the command's object to go", || async {
        use futures_util::StreamExt;
        let dir = taquba::object_store::path::Path::from(format!("{MEMO_PREFIX}/inbox/v1"));
        store.list(Some(&dir)).collect::<Vec<_>>().await.is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}
