//! Review 41 (d): inbox command objects written straight into the store
//! by another tool, in the documented format (`inbox/wire.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use taquba_workflow::inbox::{CommandId, CommandState};
use taquba_workflow::{RunSpec, Step, StepError, StepOutcome, StepRunner, WorkflowView};

/// Step 0 waits an hour on a signal; every other step succeeds.
#[derive(Clone)]
struct Waiter;

impl StepRunner for Waiter {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(match step.step_number {
            0 => StepOutcome::continue_on_signal(
                vec![],
                format!("k-{}", step.run_id),
                Duration::from_secs(3600),
            ),
            _ => StepOutcome::Succeed {
                result: b"ok".to_vec(),
            },
        })
    }
}

fn runner() -> Waiter {
    Waiter
}

/// Write `{name}` into the inbox and touch it, as another tool does.
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

/// A command object in the documented format, its `id` field as given.
fn command_object(id: &str, command: serde_json::Value) -> Vec<u8> {
    rmp_serde::to_vec_named(&serde_json::json!({
        "format": 1,
        "id": id,
        "sent_at_ms": T0,
        "sender": "another tool",
        "command": command,
    }))
    .unwrap()
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

/// A ULID is case-insensitive (Crockford base 32), and the owner takes an
/// object named by a lowercase ULID as that command. The wire format's
/// doc says decoding "checks that the object is the one its name says":
/// an object named `{lower}.msgpack` whose `id` is that same `{lower}`
/// is. A tool whose ULID library writes lowercase must have its cancel
/// applied, not rejected as holding another command.
#[tokio::test(start_paused = true)]
async fn a_lowercase_ulid_command_naming_itself_is_applied() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &runner()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("lc-run")),
            ..Default::default()
        })
        .await
        .unwrap();
    until_step("waiting", &runtime, "lc-run", 1).await;
    let lower = "01jaz3ndektsv4rrffq69g5fb7";
    let id: CommandId = lower.parse().unwrap();
    drop_in_inbox(
        &store,
        &format!("{lower}.msgpack"),
        command_object(
            lower,
            serde_json::json!({"kind": "cancel", "run_id": "lc-run", "reason": "lowercase"}),
        ),
    )
    .await;
    let state = settled_within(runtime.view(), &id, 130).await;
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the command naming itself in lowercase was not applied: {state:?}"
    );
    worker.shutdown().await.unwrap();
}

/// The same, with the object named in uppercase (as the CLI names them)
/// and the id field in lowercase: the same ULID.
#[tokio::test(start_paused = true)]
async fn a_command_whose_id_field_is_its_name_in_lowercase_is_applied() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &runner()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("lc-run-2")),
            ..Default::default()
        })
        .await
        .unwrap();
    until_step("waiting", &runtime, "lc-run-2", 1).await;
    let upper = "01JAZ3NDEKTSV4RRFFQ69G5FB8";
    let id: CommandId = upper.parse().unwrap();
    drop_in_inbox(
        &store,
        &format!("{upper}.msgpack"),
        command_object(
            &upper.to_ascii_lowercase(),
            serde_json::json!({"kind": "cancel", "run_id": "lc-run-2"}),
        ),
    )
    .await;
    let state = settled_within(runtime.view(), &id, 130).await;
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "not applied: {state:?}"
    );
    worker.shutdown().await.unwrap();
}

/// Commands naming runs that do not exist or ids that are not run ids,
/// and a fork from step `u32::MAX`, written straight into the inbox: each
/// is rejected with an error naming the value, none is applied, and a
/// cancel written after them is still applied.
#[tokio::test(start_paused = true)]
async fn commands_naming_bad_runs_are_rejected_by_name_and_the_inbox_goes_on() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &runner()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(RunSpec {
            run_id: Some(rid("target")),
            ..Default::default()
        })
        .await
        .unwrap();
    until_step("waiting", &runtime, "target", 1).await;
    let bad: Vec<(serde_json::Value, &str)> = vec![
        (
            serde_json::json!({"kind": "cancel", "run_id": "../../etc/passwd"}),
            "../../etc/passwd",
        ),
        (
            serde_json::json!({"kind": "requeue", "run_id": "nope\u{0}x"}),
            "nope",
        ),
        (
            serde_json::json!({"kind": "requeue", "run_id": "never-submitted"}),
            "never-submitted",
        ),
        (
            serde_json::json!({"kind": "fork", "run_id": "target", "from_step": u32::MAX}),
            "target",
        ),
        (
            serde_json::json!({"kind": "fork", "run_id": "target", "from_step": 0, "new_run_id": "a/b"}),
            "a/b",
        ),
        (
            serde_json::json!({"kind": "pause_schedule", "name": "no-such-schedule"}),
            "no-such-schedule",
        ),
    ];
    let mut ids = Vec::new();
    for (i, (command, named)) in bad.into_iter().enumerate() {
        let id: CommandId = format!("01JAZ3NDEKTSV4RRFFQ69G5FC{i}").parse().unwrap();
        drop_in_inbox(
            &store,
            &format!("{id}.msgpack"),
            command_object(&id.to_string(), command),
        )
        .await;
        ids.push((id, named));
    }
    // A cancel of a run never submitted is answered as having cancelled
    // nothing (as `WorkflowRuntime::cancel` answers `false`).
    let nothing: CommandId = "01JAZ3NDEKTSV4RRFFQ69G5FCZ".parse().unwrap();
    drop_in_inbox(
        &store,
        &format!("{nothing}.msgpack"),
        command_object(
            &nothing.to_string(),
            serde_json::json!({"kind": "cancel", "run_id": "never-submitted"}),
        ),
    )
    .await;
    let good: CommandId = "01JAZ3NDEKTSV4RRFFQ69G5FD0".parse().unwrap();
    drop_in_inbox(
        &store,
        &format!("{good}.msgpack"),
        command_object(
            &good.to_string(),
            serde_json::json!({"kind": "cancel", "run_id": "target"}),
        ),
    )
    .await;
    for (id, named) in &ids {
        match settled_within(runtime.view(), id, 130).await {
            CommandState::Rejected { error, .. } => {
                assert!(error.contains(named), "{id}: {error:?} names not {named:?}")
            }
            other => panic!("{id} ({named}) was not rejected: {other:?}"),
        }
    }
    let state = settled_within(runtime.view(), &nothing, 130).await;
    assert!(
        format!("{state:?}").contains("cancelled: false"),
        "a cancel of a run never submitted: {state:?}"
    );
    let state = settled_within(runtime.view(), &good, 130).await;
    assert!(
        matches!(state, CommandState::Applied { .. }),
        "the cancel after them: {state:?}"
    );
    until_terminated("cancelled", &runtime, "target").await;
    worker.shutdown().await.unwrap();
}
