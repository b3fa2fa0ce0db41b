//! Step and run memos, and application KV effects staged by submissions
//! and steps. Memo keys a step may build from user input are stored under
//! their own entries on a local directory; only the empty and the reserved
//! key are refused.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStoreExt, PutPayload};
use taquba::{MAX_KV_VALUE_SIZE, SettlementEffects};
use taquba_workflow::{
    EffectsHandle, Error, MemoStore, NoopTerminalHook, RunSpec, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};

fn spec(id: &str, input: &str) -> RunSpec {
    RunSpec {
        run_id: Some(rid(id)),
        input: input.as_bytes().to_vec(),
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_memoized_effect_is_not_repeated_by_the_retry_of_its_step() {
    let (queue, store, _clock) = memory_queue().await;
    let work = Arc::new(AtomicU32::new(0));
    let runner = {
        let work = work.clone();
        FnRunner(move |step: Step| {
            let work = work.clone();
            async move {
                let charge: String = step
                    .memo
                    .memoized("charge", async {
                        let n = work.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StepError>(format!("charge-{n}"))
                    })
                    .await?;
                if step.attempts == 1 {
                    return Err(StepError::transient("crashed after the charge"));
                }
                Ok(StepOutcome::Succeed {
                    result: charge.into_bytes(),
                })
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("pay", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("pay"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(work.load(Ordering::SeqCst), 1, "the retry read the memo");
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"charge-0".as_slice())
    );
    let memos = MemoStore::new(store, MEMO_PREFIX);
    let stored = memos.new_memo(&rid("pay"), 0).get("charge").await.unwrap();
    assert!(
        stored.is_some(),
        "the entry is readable from outside the runtime"
    );
    assert!(
        memos
            .new_memo(&rid("pay"), 1)
            .get("charge")
            .await
            .unwrap()
            .is_none(),
        "step memos are scoped to their step"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_run_memo_is_shared_by_the_steps_and_cleared_with_the_run() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        let journal = step.run_memo.get("journal").await?.unwrap_or_default();
        let mut journal = journal;
        journal.extend_from_slice(step.step_number.to_string().as_bytes());
        step.run_memo.put("journal", &journal).await?;
        step.memo.put("mine", b"x").await?;
        if step.step_number < 2 {
            Ok(StepOutcome::continue_now(vec![]))
        } else {
            Ok(StepOutcome::Succeed { result: journal })
        }
    });
    let runtime = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("journal", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("journal"))).await.unwrap();
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"012".as_slice())
    );
    worker.shutdown().await.unwrap();

    let memos = MemoStore::new(store, MEMO_PREFIX);
    // Three step entries, the journal and the run result record.
    assert_eq!(memos.clear_memos_for_run(&rid("journal")).await.unwrap(), 5);
    assert!(
        memos
            .new_run_memo(&rid("journal"))
            .get("journal")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        runtime.outcome(&rid("journal")).await.unwrap().is_none(),
        "the run result record went with the memos"
    );
    assert_eq!(memos.clear_memos_for_run(&rid("journal")).await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_memo_entry_that_does_not_decode_is_recomputed() {
    let (queue, store, _clock) = memory_queue().await;
    let work = Arc::new(AtomicU32::new(0));
    let runner = {
        let work = work.clone();
        FnRunner(move |step: Step| {
            let work = work.clone();
            async move {
                let value: Vec<String> = step
                    .memo
                    .memoized("k", async {
                        work.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, StepError>(vec!["fresh".to_string()])
                    })
                    .await?;
                Ok(StepOutcome::Succeed {
                    result: value.concat().into_bytes(),
                })
            }
        })
    };
    // Garbage where the entry of step 0 of run `g` lives.
    store
        .put(
            &Path::from(format!("{MEMO_PREFIX}/runs/g/steps/0/k")),
            PutPayload::from_static(b"\xc1\xc1 not msgpack"),
        )
        .await
        .unwrap();
    let runtime = WorkflowRuntime::builder(queue, store.clone(), runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("g", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("g"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.unwrap().result.as_deref(),
        Some(b"fresh".as_slice())
    );
    assert_eq!(work.load(Ordering::SeqCst), 1);
    let rewritten = MemoStore::new(store, MEMO_PREFIX)
        .new_memo(&rid("g"), 0)
        .get("k")
        .await
        .unwrap()
        .unwrap();
    assert_ne!(
        rewritten, b"\xc1\xc1 not msgpack",
        "the entry was overwritten"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn submission_effects_commit_with_the_run_and_a_duplicate_drops_them() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store,
        FnRunner(|_: Step| async { Ok(StepOutcome::Succeed { result: vec![] }) }),
        NoopTerminalHook,
    )
    .build();
    let first = runtime
        .submit(RunSpec {
            effects: SettlementEffects::default()
                .kv_put(b"app/orders/1".to_vec(), b"submitted".to_vec())
                .kv_delete(b"app/cart/1".to_vec()),
            ..spec("order-1", "in")
        })
        .await
        .unwrap();
    assert!(first.newly_submitted);
    assert_eq!(
        queue
            .view()
            .kv_get(b"app/orders/1")
            .await
            .unwrap()
            .as_deref(),
        Some(b"submitted".as_slice())
    );
    queue.kv_put(b"app/cart/1", b"restored").await.unwrap();
    let again = runtime
        .submit(RunSpec {
            effects: SettlementEffects::default()
                .kv_put(b"app/orders/1".to_vec(), b"again".to_vec())
                .kv_put(b"app/dup".to_vec(), b"x".to_vec())
                .kv_delete(b"app/cart/1".to_vec()),
            ..spec("order-1", "in")
        })
        .await
        .unwrap();
    assert!(!again.newly_submitted);
    assert_eq!(
        queue
            .view()
            .kv_get(b"app/orders/1")
            .await
            .unwrap()
            .as_deref(),
        Some(b"submitted".as_slice())
    );
    assert!(queue.view().kv_get(b"app/dup").await.unwrap().is_none());
    assert!(queue.view().kv_get(b"app/cart/1").await.unwrap().is_some());

    let reserved = runtime
        .submit(RunSpec {
            effects: SettlementEffects::default()
                .kv_put(b"workflow/runs/x".to_vec(), b"x".to_vec()),
            ..spec("order-2", "in")
        })
        .await;
    assert!(
        matches!(&reserved, Err(Error::ReservedKvKey(key)) if key == "workflow/runs/x"),
        "{reserved:?}"
    );
    assert!(
        runtime.status(&rid("order-2")).await.unwrap().is_none(),
        "a rejected submission writes nothing"
    );
}

/// Stages `app/{run}/{step}` on every step; the run's input decides the
/// verdict of step 1.
fn staging_runner() -> impl StepRunner {
    FnRunner(|step: Step| {
        let staged = step
            .effects
            .put(format!("app/{}/{}", step.run_id, step.step_number), "v");
        std::future::ready(staged.map_err(StepError::from).map(|()| {
            if step.step_number == 0 {
                return StepOutcome::continue_now(step.payload.clone());
            }
            match step.payload.as_slice() {
                b"fail" => StepOutcome::Fail {
                    reason: "no".into(),
                },
                b"cancel" => StepOutcome::Cancel {
                    reason: "stop".into(),
                },
                _ => StepOutcome::Succeed { result: vec![] },
            }
        }))
    })
}

#[tokio::test(start_paused = true)]
async fn staged_effects_commit_with_every_runner_outcome() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store, staging_runner(), NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, status) in [
        ("succeed", TerminalStatus::Succeeded),
        ("fail", TerminalStatus::Failed),
        ("cancel", TerminalStatus::Cancelled),
    ] {
        runtime.submit(spec(id, id)).await.unwrap();
        let end = within(30, runtime.wait(&rid(id))).await.unwrap();
        assert_eq!(end.termination.status, status);
        for step in 0..2 {
            let key = format!("app/{id}/{step}");
            assert_eq!(
                queue
                    .view()
                    .kv_get(key.as_bytes())
                    .await
                    .unwrap()
                    .as_deref(),
                Some(b"v".as_slice()),
                "{key} committed with the step's settlement"
            );
        }
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn effects_of_a_step_error_are_dropped_and_the_retry_stages_its_own() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = FnRunner(|step: Step| async move {
        step.effects
            .put(format!("app/attempt/{}", step.attempts), "staged")?;
        step.effects
            .put("app/status", format!("attempt {}", step.attempts))?;
        if step.attempts < 3 {
            return Err(StepError::transient("again"));
        }
        Ok(StepOutcome::Succeed { result: vec![] })
    });
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("retry", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("retry"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    let kv = queue.view();
    assert!(kv.kv_get(b"app/attempt/1").await.unwrap().is_none());
    assert!(kv.kv_get(b"app/attempt/2").await.unwrap().is_none());
    assert!(kv.kv_get(b"app/attempt/3").await.unwrap().is_some());
    assert_eq!(
        kv.kv_get(b"app/status").await.unwrap().as_deref(),
        Some(b"attempt 3".as_slice())
    );

    // A run whose last attempt fails applies none of its staged effects.
    let runner = FnRunner(|step: Step| async move {
        step.effects.put("app/doomed", "x")?;
        Err(StepError::transient("always"))
    });
    let store2 = memory_queue().await;
    let runtime =
        WorkflowRuntime::builder(store2.0.clone(), store2.1, runner, NoopTerminalHook).build();
    let worker2 = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("doomed", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("doomed"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Failed);
    assert!(
        store2
            .0
            .view()
            .kv_get(b"app/doomed")
            .await
            .unwrap()
            .is_none()
    );
    worker2.shutdown().await.unwrap();
    worker.shutdown().await.unwrap();
}

/// What a step observed when it tried each invalid effect.
#[derive(Debug, Default)]
struct Observed {
    reserved: Option<String>,
    conflict_put: Option<String>,
    conflict_delete: Option<String>,
    too_large: Option<(usize, usize)>,
    kept: Option<EffectsHandle>,
    read_own_write: Option<bool>,
}

#[tokio::test(start_paused = true)]
async fn invalid_effects_are_rejected_as_they_are_staged() {
    let (queue, store, _clock) = memory_queue().await;
    let observed = Arc::new(Mutex::new(Observed::default()));
    let runner = {
        let observed = observed.clone();
        FnRunner(move |step: Step| {
            let observed = observed.clone();
            async move {
                let mut seen = Observed::default();
                if let Err(Error::ReservedKvKey(key)) = step.effects.put("workflow/runs/x", "v") {
                    seen.reserved = Some(key);
                }
                step.effects.put("app/a", "1")?;
                step.effects.delete("app/b")?;
                if let Err(Error::ConflictingKvEffect(key)) = step.effects.delete("app/a") {
                    seen.conflict_delete = Some(key);
                }
                if let Err(Error::ConflictingKvEffect(key)) = step.effects.put("app/b", "2") {
                    seen.conflict_put = Some(key);
                }
                if let Err(Error::Queue(taquba::Error::KvValueTooLarge { size, max })) = step
                    .effects
                    .put("app/big", vec![0u8; MAX_KV_VALUE_SIZE + 1])
                {
                    seen.too_large = Some((size, max));
                }
                seen.read_own_write = Some(step.kv.get(b"app/a").await?.is_some());
                seen.kept = Some(step.effects.clone());
                *observed.lock().expect("lock") = seen;
                Ok(StepOutcome::Succeed { result: vec![] })
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store, runner, NoopTerminalHook).build();
    queue.kv_put(b"app/b", b"old").await.unwrap();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("v", "")).await.unwrap();
    let end = within(30, runtime.wait(&rid("v"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);

    let seen = std::mem::take(&mut *observed.lock().unwrap());
    assert_eq!(seen.reserved.as_deref(), Some("workflow/runs/x"));
    assert_eq!(seen.conflict_delete.as_deref(), Some("app/a"));
    assert_eq!(seen.conflict_put.as_deref(), Some("app/b"));
    assert_eq!(
        seen.too_large,
        Some((MAX_KV_VALUE_SIZE + 1, MAX_KV_VALUE_SIZE))
    );
    assert_eq!(
        seen.read_own_write,
        Some(false),
        "staged effects are not visible"
    );
    let kept = seen.kept.expect("the handle");
    assert!(matches!(
        kept.put("app/late", "x"),
        Err(Error::EffectsSealed)
    ));
    assert!(matches!(kept.delete("app/late"), Err(Error::EffectsSealed)));

    // The valid effects committed; the rejected ones did not.
    let kv = queue.view();
    assert_eq!(
        kv.kv_get(b"app/a").await.unwrap().as_deref(),
        Some(b"1".as_slice())
    );
    assert!(kv.kv_get(b"app/b").await.unwrap().is_none());
    assert!(kv.kv_get(b"app/big").await.unwrap().is_none());
    assert!(kv.kv_get(b"app/late").await.unwrap().is_none());
    assert!(kv.kv_get(b"workflow/runs/x").await.unwrap().is_none());

    let message = Error::ReservedKvKey("workflow/runs/x".into()).to_string();
    assert!(message.contains("workflow/runs/x"), "{message}");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_step_reads_committed_state_only() {
    let (queue, store, _clock) = memory_queue().await;
    let reads = Arc::new(Mutex::new(Vec::new()));
    let runner = {
        let reads = reads.clone();
        FnRunner(move |step: Step| {
            let reads = reads.clone();
            async move {
                let before = step.kv.get(b"app/progress").await?.map(|b| b.to_vec());
                step.effects
                    .put("app/progress", format!("step {}", step.step_number))?;
                let after = step.kv.get(b"app/progress").await?.map(|b| b.to_vec());
                reads.lock().expect("lock").push((before, after));
                if step.step_number == 0 {
                    Ok(StepOutcome::continue_now(vec![]))
                } else {
                    Ok(StepOutcome::Succeed { result: vec![] })
                }
            }
        })
    };
    let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("reads", "")).await.unwrap();
    within(30, runtime.wait(&rid("reads"))).await.unwrap();
    let reads = reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 2);
    assert_eq!(
        reads[0],
        (None, None),
        "step 0 sees nothing of its own staging"
    );
    let committed = Some(b"step 0".to_vec());
    assert_eq!(
        reads[1],
        (committed.clone(), committed),
        "step 1 sees step 0's committed write, not its own"
    );
    worker.shutdown().await.unwrap();
}

/// Memo keys a step might build from user input, on a local directory:
/// `.`, `..`, `a/b`, `a%2Fb`, a 300-byte key, unicode, a trailing `#1`, a
/// control character, a space. Each is one path segment (escaped, or
/// digested when overlong), so every one is stored and reads back its own
/// value, and no two keys share an entry. `Memo::put` documents the only
/// keys it refuses, with `InvalidMemoKey` naming the key and the reason:
/// the empty key and `Memo::RESERVED_KEY` (the run result record's), in
/// step memos as in run memos; nothing is written for them.
#[tokio::test]
async fn odd_memo_keys_round_trip_or_are_refused_and_never_alias() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir_store(dir.path());
    let memos = taquba_workflow::MemoStore::new(store, "memo");
    let memo = memos.new_memo(&rid("odd"), 0);
    let long = "k".repeat(300);
    let keys = [
        ".",
        "..",
        "a/b",
        "a%2Fb",
        "a",
        long.as_str(),
        "ключ-🔑",
        "part#1",
        "tab\tkey",
        " ",
        "run.x",
    ];
    let mut stored = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let value = format!("value-{i}");
        match memo.put(key, value.as_bytes()).await {
            Ok(()) => stored.push((*key, value)),
            Err(err) => panic!("memo key {key:?} refused: {err}"),
        }
    }
    for (key, value) in &stored {
        assert_eq!(
            memo.get(key).await.unwrap().as_deref(),
            Some(value.as_bytes()),
            "key {key:?} reads another key's value"
        );
    }
    assert_eq!(stored.len(), keys.len(), "every key is stored: {stored:?}");
    // A step memo and the run memo of the same run never share a key.
    let run_memo = memos.new_run_memo(&rid("odd"));
    run_memo.put("x", b"run").await.unwrap();
    memo.put("run.x", b"step").await.unwrap();
    assert_eq!(
        run_memo.get("x").await.unwrap().as_deref(),
        Some(&b"run"[..])
    );
    // The keys no memo takes, and why.
    for (key, why) in [
        ("", "empty"),
        (
            taquba_workflow::Memo::RESERVED_KEY,
            "reserved for the run result record",
        ),
    ] {
        for (scope, memo) in [("step memo", &memo), ("run memo", &run_memo)] {
            match memo.put(key, b"forged").await {
                Err(Error::InvalidMemoKey {
                    key: refused,
                    reason,
                }) => {
                    assert_eq!((refused.as_str(), reason), (key, why), "{scope}");
                }
                other => {
                    panic!("{scope}: memo key {key:?}: expected InvalidMemoKey, got {other:?}")
                }
            }
        }
    }
    assert_eq!(
        run_memo
            .get(taquba_workflow::Memo::RESERVED_KEY)
            .await
            .unwrap(),
        None,
        "a refused put wrote the run result record"
    );
}
