//! What the runtime derives keys from and where it keeps things, as a
//! store written by 0.13 has them: idempotency keys and memo content keys
//! are digests of a canonical encoding (equal values, one key, whatever
//! order their maps and sets iterate in), content keys are `content:` and
//! a hex digest, and every KV key, object path, dedup key and header the
//! seeds name is spelled as they spell it.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;
use taquba::{Clock, ExpiryIndex, Queue};
use taquba_workflow::jobs::{Job, JobContext, JobRunner, payload_idempotency_key};
use taquba_workflow::{
    Error, HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL, Memo, MemoStore, RunOptions, RunOutcome,
    RunSpec, RunState, Step, StepError, StepOutcome, StepRunner, TerminalEffects, TerminalHook,
    WorkflowRuntime, job,
};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A job with a map and a set of many entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Tally {
    name: String,
    counts: HashMap<String, u64>,
    tags: HashSet<String>,
    nested: Vec<HashMap<u32, HashSet<u16>>>,
}

/// Equal tallies, their maps and sets filled in opposite orders.
fn tally(reverse: bool) -> Tally {
    let mut ids: Vec<u32> = (0..200).collect();
    if reverse {
        ids.reverse();
    }
    Tally {
        name: "weekly".into(),
        counts: ids
            .iter()
            .map(|i| (format!("item-{i}"), u64::from(*i)))
            .collect(),
        tags: ids.iter().map(|i| format!("tag-{i}")).collect(),
        nested: vec![
            ids.iter()
                .filter(|&&i| i < 50)
                .map(|&i| (i, ids.iter().map(|&j| j as u16).collect()))
                .collect(),
        ],
    }
}

/// Runs of [`Tally`], registered as runner state.
#[derive(Default, Clone)]
struct Runs(Arc<AtomicUsize>);

impl Job for Tally {
    const NAME: &'static str = "test.tally";
    type Output = u64;
    type Error = Infallible;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u64, Infallible> {
        ctx.state::<Runs>().0.fetch_add(1, Ordering::SeqCst);
        Ok(self.counts.values().sum::<u64>() + self.tags.len() as u64)
    }

    fn idempotency_key(&self) -> Option<String> {
        payload_idempotency_key(self).ok()
    }
}

/// The same shape, keyed by a field instead of the payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NamedTally(Tally);

impl Job for NamedTally {
    const NAME: &'static str = "test.named-tally";
    type Output = usize;
    type Error = Infallible;

    async fn run(&self, ctx: JobContext<'_>) -> Result<usize, Infallible> {
        ctx.state::<Runs>().0.fetch_add(1, Ordering::SeqCst);
        Ok(self.0.counts.len())
    }

    fn idempotency_key(&self) -> Option<String> {
        Some(format!("tally:{}", self.0.name))
    }
}

static TAG_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Counts the tags, once per distinct payload.
#[job(name = "test.count-tags", idempotent)]
async fn count_tags(
    tags: HashSet<String>,
    weights: HashMap<String, u32>,
) -> Result<usize, Infallible> {
    TAG_RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(tags.len() + weights.len())
}

fn count_tags_job(reverse: bool) -> CountTags {
    let t = tally(reverse);
    CountTags {
        tags: t.tags,
        weights: t.counts.into_iter().map(|(k, v)| (k, v as u32)).collect(),
    }
}

#[test]
fn equal_payloads_with_maps_and_sets_have_one_idempotency_key() {
    let (a, b) = (tally(false), tally(true));
    assert!(a == b, "equal values");
    assert_ne!(
        rmp_serde::to_vec_named(&a).unwrap(),
        rmp_serde::to_vec_named(&b).unwrap(),
        "the maps and sets iterate in different orders"
    );
    let key = payload_idempotency_key(&a).unwrap();
    assert_eq!(key, payload_idempotency_key(&b).unwrap());
    assert_eq!(key.len(), 64);
    let mut other = tally(true);
    other.tags.remove("tag-7");
    assert_ne!(key, payload_idempotency_key(&other).unwrap());

    // `#[job(idempotent)]` keys by the same digest.
    let (a, b) = (count_tags_job(false), count_tags_job(true));
    assert_eq!(a.idempotency_key(), b.idempotency_key());
    assert_eq!(
        a.idempotency_key(),
        Some(payload_idempotency_key(&a).unwrap())
    );
}

#[test]
fn the_idempotency_key_of_a_payload_without_maps_is_unchanged() {
    #[derive(Serialize, Deserialize)]
    struct Charge {
        card: String,
        cents: u64,
        lines: Vec<(String, i32)>,
    }
    impl Job for Charge {
        const NAME: &'static str = "shop.charge";
        type Output = ();
        type Error = Infallible;
        async fn run(&self, _ctx: JobContext<'_>) -> Result<(), Infallible> {
            Ok(())
        }
    }
    let charge = Charge {
        card: "4242".into(),
        cents: 1999,
        lines: vec![("book".into(), 2), ("pen".into(), -1)],
    };
    let mut digested = b"shop.charge\0".to_vec();
    digested.extend(rmp_serde::to_vec_named(&charge).unwrap());
    assert_eq!(
        payload_idempotency_key(&charge).unwrap(),
        sha256_hex(&digested)
    );
}

#[tokio::test(start_paused = true)]
async fn an_equal_job_with_maps_submitted_again_runs_once() {
    let (queue, store, _clock) = memory_queue().await;
    let runs = Runs::default();
    let runner = JobRunner::builder(queue, store)
        .register::<Tally>()
        .register::<NamedTally>()
        .register::<CountTags>()
        .state(runs.clone())
        .build();
    let worker = runner.spawn(std::future::pending::<()>());

    let first = runner.submit(tally(false)).await.unwrap();
    assert!(first.newly_submitted());
    let result = within(30, first.join()).await.unwrap().unwrap();
    let again = runner.submit(tally(true)).await.unwrap();
    assert!(!again.newly_submitted(), "the same job");
    assert_eq!(again.id(), first.id());
    assert_eq!(within(30, again.join()).await.unwrap().unwrap(), result);

    // A key of its own, a payload with maps: equal payloads are not a
    // mismatch.
    let named = runner.submit(NamedTally(tally(false))).await.unwrap();
    within(30, named.join()).await.unwrap().unwrap();
    let named_again = runner.submit(NamedTally(tally(true))).await.unwrap();
    assert!(!named_again.newly_submitted());
    let mut different = tally(true);
    different.counts.insert("extra".into(), 1);
    assert!(matches!(
        runner.submit(NamedTally(different)).await,
        Err(Error::InputMismatch(_))
    ));
    assert_eq!(runs.0.load(Ordering::SeqCst), 2, "one run per job");

    let tags = runner.submit(count_tags_job(false)).await.unwrap();
    within(30, tags.join()).await.unwrap().unwrap();
    let tags_again = runner.submit(count_tags_job(true)).await.unwrap();
    assert!(!tags_again.newly_submitted());
    assert_eq!(TAG_RUNS.load(Ordering::SeqCst), 1);
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn content_keys_are_content_and_the_hex_digest_of_the_canonical_encoding() {
    #[derive(Serialize)]
    struct DraftInput<'a> {
        operation: &'static str,
        payload: &'a [u8],
    }
    let input = DraftInput {
        operation: "draft",
        payload: b"hello",
    };
    let key = Memo::content_key(&input).unwrap();
    let expected = format!(
        "content:{}",
        sha256_hex(&rmp_serde::to_vec_named(&input).unwrap())
    );
    assert_eq!(key, expected);
    assert_eq!(key.len(), "content:".len() + 64);

    // Equal inputs with maps and sets: one key.
    let (a, b) = (tally(false), tally(true));
    assert_eq!(
        Memo::content_key(&a).unwrap(),
        Memo::content_key(&b).unwrap()
    );

    // An entry a 0.13 store holds under the key of an input without maps
    // is found; an input with maps finds the entry of an equal one.
    let store: Arc<dyn ObjectStore> = Arc::new(taquba::object_store::memory::InMemory::new());
    let memo = MemoStore::new(store, MEMO_PREFIX).new_memo(&rid("r"), 0);
    memo.put(&expected, &rmp_serde::to_vec_named(&42u32).unwrap())
        .await
        .unwrap();
    let computed = AtomicUsize::new(0);
    let compute = || async {
        computed.fetch_add(1, Ordering::SeqCst);
        Ok::<u32, Error>(7)
    };
    assert_eq!(
        memo.memoized_by_content(&input, compute()).await.unwrap(),
        42
    );
    assert_eq!(memo.memoized_by_content(&a, compute()).await.unwrap(), 7);
    assert_eq!(memo.memoized_by_content(&b, compute()).await.unwrap(), 7);
    assert_eq!(computed.load(Ordering::SeqCst), 1);
    assert!(memo.content_get(&b).await.unwrap().is_some());
}

/// Step 0 waits for the gate and continues with `next`; step 1 succeeds.
#[derive(Clone, Default)]
struct TwoSteps {
    gate: Gate,
}

impl StepRunner for TwoSteps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number == 0 {
            self.gate.wait().await;
            return Ok(StepOutcome::Continue {
                payload: b"next".to_vec(),
                when: taquba_workflow::Trigger::Immediate,
            });
        }
        Ok(StepOutcome::Succeed {
            result: b"done".to_vec(),
        })
    }
}

/// Dead-letters every notification, so its job record stays to be read.
struct Refuses;

impl TerminalHook for Refuses {
    async fn on_termination(
        &self,
        _outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        Err(StepError::permanent("kept for the test"))
    }
}

async fn kv_keys(queue: &Queue, prefix: &[u8]) -> Vec<Vec<u8>> {
    queue
        .view()
        .kv_scan(prefix, .., 1000)
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|(key, _)| key.to_vec())
        .collect()
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn keys_paths_dedup_keys_and_headers_are_as_the_seeds_name_them() {
    let (queue, store, clock) = memory_queue().await;
    let runner = TwoSteps::default();
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), runner.clone(), Refuses)
        .memo_retention(Duration::from_secs(3600))
        .group_retention(Duration::from_secs(3600))
        .step_output_replay()
        .poll_interval(Duration::from_millis(50))
        .build();
    // The worker starts once the pending step job was read: a claim
    // releases the job's dedup key.
    let submitted = runtime
        .submit(RunSpec {
            run_id: Some(rid("fmt")),
            input: b"in".to_vec(),
            options: RunOptions {
                headers: HashMap::from([("tenant".to_string(), "acme".to_string())]),
                ..Default::default()
            },
            ..Default::default()
        })
        .await
        .unwrap();
    // An active run: its record and current-step pointer.
    for key in ["workflow/runs/fmt", "workflow/steps/fmt"] {
        assert!(
            queue.view().kv_get(key.as_bytes()).await.unwrap().is_some(),
            "{key}"
        );
    }
    // The step job: the reserved headers and `run:{run_id}:{step}`.
    let step0 = job_record(&queue, &submitted.job_id, "step 0").await;
    assert_eq!(step0.dedup_key.as_deref(), Some("run:fmt:0"));
    assert_eq!(HEADER_RUN_ID, "workflow.run_id");
    assert_eq!(HEADER_STEP, "workflow.step");
    assert_eq!(
        step0.headers.get(HEADER_RUN_ID).map(String::as_str),
        Some("fmt")
    );
    assert_eq!(
        step0.headers.get(HEADER_STEP).map(String::as_str),
        Some("0")
    );
    assert_eq!(
        step0.headers.get("tenant").map(String::as_str),
        Some("acme")
    );

    let worker = runtime.spawn(std::future::pending::<()>());
    until_step("step 0 to run", &runtime, "fmt", 0).await;
    runner.gate.open();
    let end = within(30, runtime.wait(&rid("fmt"))).await.unwrap();
    for key in ["workflow/runs/fmt", "workflow/steps/fmt"] {
        assert!(
            queue.view().kv_get(key.as_bytes()).await.unwrap().is_none(),
            "{key}"
        );
    }
    // The terminal record, and the retention marker: an expiry-index entry
    // under `workflow/terminals/` at the termination time, the run id its
    // suffix.
    assert!(
        queue
            .view()
            .kv_get(b"workflow/outcomes/fmt")
            .await
            .unwrap()
            .is_some()
    );
    let terminals = ExpiryIndex::new(b"workflow/terminals/".to_vec());
    assert_eq!(
        kv_keys(&queue, b"workflow/terminals/").await,
        vec![terminals.entry_key(end.termination.terminated_at_ms, b"fmt")]
    );
    // The run result record: the run memo's `workflow.outcome` entry.
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    assert!(
        memos
            .new_run_memo(&rid("fmt"))
            .get("workflow.outcome")
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(MEMO_PREFIX, "workflow-steps-memo", "`{{queue_name}}-memo`");
    // Replay records, keyed by run, step and the payload's SHA-256.
    let objects = objects_under(&store, MEMO_PREFIX).await;
    for (step, payload) in [(0, &b"in"[..]), (1, &b"next"[..])] {
        let path = format!(
            "{MEMO_PREFIX}/runs/fmt/replay/{step}/{}",
            sha256_hex(payload)
        );
        assert!(objects.contains(&path), "{path} in {objects:?}");
    }
    // The notification job: `workflow.terminal` holds the status.
    eventually("the dead notification", || async {
        !dead_jobs(&queue).await.is_empty()
    })
    .await;
    let notification = dead_jobs(&queue).await.remove(0);
    assert_eq!(HEADER_TERMINAL, "workflow.terminal");
    assert_eq!(
        notification
            .headers
            .get(HEADER_TERMINAL)
            .map(String::as_str),
        Some("succeeded")
    );
    assert_eq!(
        notification.headers.get(HEADER_RUN_ID).map(String::as_str),
        Some("fmt")
    );

    // A group: the manifest under `{memo_prefix}/groups/{id}/manifest`,
    // member records under `workflow/groups/{id}/{key}`, members run under
    // the hex SHA-256 of `{id}/{key}`.
    let group = runtime.group(rid("g"));
    group
        .submit(vec![member("a", "x")], &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        kv_keys(&queue, b"workflow/groups/g/").await,
        vec![b"workflow/groups/g/a".to_vec()]
    );
    assert!(
        objects_under(&store, &format!("{MEMO_PREFIX}/groups/g"))
            .await
            .contains(&format!("{MEMO_PREFIX}/groups/g/manifest"))
    );
    let member_run = rid(&sha256_hex(b"g/a"));
    assert!(runtime.status(&member_run).await.unwrap().is_some());
    runner.gate.open();
    let end = within(30, runtime.wait(&member_run)).await.unwrap();
    assert!(matches!(
        runtime.status(&member_run).await.unwrap().unwrap().state,
        RunState::Terminated(_)
    ));
    assert_eq!(end.termination.final_step, 1);
    // Once a results consumer saw the last termination: the group's
    // retention marker, an expiry-index entry under
    // `workflow/group-terminals/` with the group id its suffix.
    let results: Vec<_> = group.results().await.unwrap().try_collect().await.unwrap();
    assert_eq!(results.len(), 1);
    let group_terminals = ExpiryIndex::new(b"workflow/group-terminals/".to_vec());
    assert_eq!(
        kv_keys(&queue, b"workflow/group-terminals/").await,
        vec![group_terminals.entry_key(clock.now_ms(), b"g")]
    );
    worker.shutdown().await.unwrap();
}
