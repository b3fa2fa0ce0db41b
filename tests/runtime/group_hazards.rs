//! Group state against re-submission and `forget` (issue 12, points 1, 2, 7
//! and 11): the group retention sweep leaves a group submitted again after
//! its results were consumed, `forget` ends the members still active before
//! it removes anything (and waits for one whose step is running), a member
//! submitted again after `forget` keeps its state for its own retention
//! window, and a job group whose jobs hold maps is the same group whatever
//! order its maps iterate in. `forget` racing a submission leaves a group a
//! later submission completes, a member finishing after `forget` records
//! its end for the next submission, and a `results` stream of a group being
//! forgotten ends.

use crate::common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixtures::{
    Scripted, Tally, TrackedMembers, assert_each_member_once, tokio_clock_queue, tracked_runtime,
};
use common::*;
use futures_util::TryStreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::OpenOptions;
use taquba::Queue;
use taquba::object_store::memory::InMemory;
use taquba::object_store::path::Path;
use taquba::object_store::{ObjectStore, ObjectStoreExt};
use taquba_workflow::GroupMember;
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::{
    Error, MemberResult, MemoStore, NoopTerminalHook, RunGroup, RunId, RunOptions, Step, StepError,
    StepOutcome, StepRunner, TerminalStatus, WorkflowRuntime,
};

/// Step 0 by input: `ok` writes the run memo entry `paid` and continues;
/// `flaky` fails (a `Fail` verdict) while `failing` is set and otherwise
/// holds like `hold`; `hold` writes `paid` and holds until the gate opens or
/// its cancel token fires (noted); `park:{key}` continues on the signal
/// `key`. Step 1 succeeds with the input. Every step-0 call is noted.
#[derive(Clone, Default)]
struct Script {
    calls: Arc<Mutex<Vec<RunId>>>,
    cancelled: Arc<Mutex<Vec<RunId>>>,
    failing: Arc<AtomicBool>,
    gate: Gate,
}

impl Script {
    fn calls(&self) -> Vec<RunId> {
        self.calls.lock().unwrap().clone()
    }

    fn cancelled(&self) -> Vec<RunId> {
        self.cancelled.lock().unwrap().clone()
    }
}

impl StepRunner for Script {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            });
        }
        self.calls.lock().unwrap().push(step.run_id.clone());
        if let Some(key) = input.strip_prefix("park:") {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_secs(3600),
            ));
        }
        if input == "flaky" && self.failing.load(Ordering::SeqCst) {
            return Ok(StepOutcome::Fail {
                reason: "flaky".into(),
            });
        }
        step.run_memo.put("paid", step.run_id.as_bytes()).await?;
        if input == "hold" || input == "flaky" {
            tokio::select! {
                () = self.gate.wait() => {}
                () = step.cancel_token.cancelled() => {
                    self.cancelled.lock().unwrap().push(step.run_id.clone());
                }
            }
        }
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

type Runtime = WorkflowRuntime<Script, NoopTerminalHook>;

async fn results(group: &RunGroup) -> Vec<MemberResult> {
    within(30, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap()
}

async fn kv_keys(queue: &Queue, prefix: &str) -> Vec<String> {
    queue
        .view()
        .kv_scan(prefix.as_bytes(), .., 1000)
        .await
        .expect("scan")
        .entries
        .into_iter()
        .map(|(key, _)| String::from_utf8_lossy(&key).into_owned())
        .collect()
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list")
}

/// Let the worker's maintenance (every 50 ms) run a few rounds.
async fn a_few_sweeps() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

// ---------------------------------------------------------------------------
// 1. Group retention vs a re-submitted group.
// ---------------------------------------------------------------------------

/// A group whose results were consumed (its retention marker written) and
/// which is then resumed to run its failed member again is not removed by
/// that marker while the member runs, nor once it ended unobserved: its
/// window starts again when a consumer observes the re-run's end.
#[tokio::test(start_paused = true)]
async fn a_group_resumed_after_its_results_were_consumed_is_not_swept_by_the_old_marker() {
    let (queue, store, clock) = memory_queue().await;
    let script = Script::default();
    script.failing.store(true, Ordering::SeqCst);
    let runtime: Runtime = workflow_builder(&queue, &store, &script)
        .group_retention(Duration::from_secs(10))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("again"));
    group
        .submit(
            vec![member("a", "ok"), member("b", "flaky")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let first = results(&group).await;
    assert_eq!(first.len(), 2);
    assert_eq!(
        kv_keys(&queue, "workflow/group-terminals/").await.len(),
        1,
        "the consumer's marker"
    );

    // The failed member runs again and is still running when the marker's
    // window has passed.
    script.failing.store(false, Ordering::SeqCst);
    clock.advance(Duration::from_secs(5));
    group.resume(&RunOptions::default()).await.unwrap();
    eventually("b runs again", || async { script.calls().len() == 3 }).await;
    clock.advance(Duration::from_secs(6));
    a_few_sweeps().await;
    let status = group
        .status()
        .await
        .expect("the re-submitted group is still there");
    assert_eq!((status.total, status.succeeded, status.pending), (2, 1, 1));

    // It ends; nobody has consumed its results since, so the group stays.
    script.gate.open();
    eventually("b succeeds", || async {
        group.status().await.unwrap().succeeded == 2
    })
    .await;
    clock.advance(Duration::from_secs(60));
    a_few_sweeps().await;
    assert_eq!(group.status().await.unwrap().succeeded, 2);

    // Consumed again: a window later it is removed.
    assert_eq!(results(&group).await.len(), 2);
    clock.advance(Duration::from_secs(11));
    eventually("the group is removed", || async {
        matches!(group.status().await, Err(Error::GroupNotFound(_)))
    })
    .await;
    assert!(kv_keys(&queue, "workflow/groups/").await.is_empty());
    assert!(objects_under(&store, MEMO_PREFIX).await.is_empty());
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 2. `forget` of a group with active members.
// ---------------------------------------------------------------------------

/// `forget` cancels the members still active (a running one through its
/// cancel token, a signal-waiting one by removing its step) and returns once
/// they ended; nothing of the group is left behind afterwards, also once
/// the worker has settled everything, and the group can start afresh.
#[tokio::test(start_paused = true)]
async fn forget_ends_the_active_members_before_it_removes_the_group() {
    let (queue, store, _clock) = memory_queue().await;
    let script = Script::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &script).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("busy"));
    let members = vec![
        member("done", "ok"),
        member("running", "hold"),
        member("parked", "park:busy-gate"),
    ];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    eventually("every member started", || async {
        script.calls().len() == 3 && group.status().await.unwrap().succeeded == 1
    })
    .await;
    eventually("the parked member waits", || async {
        !kv_keys(&queue, "workflow/signals/waiters/")
            .await
            .is_empty()
    })
    .await;

    within(30, group.forget()).await.unwrap();
    let running = member_run_id("busy", "running");
    assert_eq!(
        script.cancelled(),
        vec![running.clone()],
        "the running member was cancelled"
    );
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    // The members ended before the removal: nothing comes back once the
    // worker has settled everything.
    a_few_sweeps().await;
    for prefix in [
        "workflow/groups/",
        "workflow/group-submissions/",
        "workflow/group-manifests/",
        "workflow/outcomes/",
        "workflow/runs/",
        "workflow/steps/",
        "workflow/signals/",
    ] {
        assert_eq!(
            kv_keys(&queue, prefix).await,
            Vec::<String>::new(),
            "{prefix}"
        );
    }
    assert_eq!(
        objects_under(&store, MEMO_PREFIX).await,
        Vec::<String>::new()
    );
    for key in ["done", "running", "parked"] {
        assert!(
            runtime
                .status(&member_run_id("busy", key))
                .await
                .unwrap()
                .is_none(),
            "{key}"
        );
    }

    // A later submission starts every member afresh.
    script.gate.open();
    group.submit(members, &RunOptions::default()).await.unwrap();
    runtime.signal("busy-gate", b"go".to_vec()).await.unwrap();
    let again = results(&group).await;
    assert_eq!(again.len(), 3);
    assert!(
        again
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    assert_eq!(script.calls().len(), 6);
    worker.shutdown().await.unwrap();
}

/// `forget` of a group without a worker in the process: the pending
/// members are removed at once, so it returns.
#[tokio::test(start_paused = true)]
async fn forget_of_a_group_whose_members_never_ran_removes_them() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime: Runtime = workflow_builder(&queue, &store, &Script::default()).build();
    let group = runtime.group(rid("idle"));
    group
        .submit(
            vec![member("a", "ok"), member("b", "ok")],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    within(30, group.forget()).await.unwrap();
    assert_eq!(queue.view().stats(STEPS).await.unwrap().pending, 0);
    for prefix in ["workflow/groups/", "workflow/runs/", "workflow/outcomes/"] {
        assert_eq!(
            kv_keys(&queue, prefix).await,
            Vec::<String>::new(),
            "{prefix}"
        );
    }
}

// ---------------------------------------------------------------------------
// 7. A member re-submitted after `forget` keeps its state for its window.
// ---------------------------------------------------------------------------

/// With memo retention, a member that ended, was forgotten and submitted
/// again ends again: the first run's retention marker comes due first and
/// must not remove the new run's memo entries and outcome, which are kept
/// for the new run's own window.
#[tokio::test(start_paused = true)]
async fn a_member_submitted_again_after_forget_keeps_its_state_for_its_own_window() {
    let (queue, store, clock) = memory_queue().await;
    let script = Script::default();
    let runtime: Runtime = workflow_builder(&queue, &store, &script)
        .memo_retention(Duration::from_secs(10))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("twice"));
    let members = vec![member("m", "ok")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    assert_eq!(results(&group).await.len(), 1);
    group.forget().await.unwrap();

    clock.advance(Duration::from_secs(5));
    group.submit(members, &RunOptions::default()).await.unwrap();
    let second = results(&group).await;
    let run_id = second[0].run_id.clone();
    assert!(second[0].outcome.is_some());
    let memos = MemoStore::new(store.clone(), MEMO_PREFIX);
    let paid = || async { memos.new_run_memo(&run_id).get("paid").await.unwrap() };
    assert!(paid().await.is_some());

    // The first run's window has passed, the second's has not.
    clock.advance(Duration::from_secs(6));
    a_few_sweeps().await;
    let kept = results(&group).await;
    assert!(
        kept[0].outcome.is_some(),
        "the new run's outcome was removed by the forgotten run's marker"
    );
    assert!(
        paid().await.is_some(),
        "the new run's memo entry was removed by the forgotten run's marker"
    );

    // Its own window passes.
    clock.advance(Duration::from_secs(5));
    eventually("the new run's state is removed", || async {
        paid().await.is_none()
    })
    .await;
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// 11. Job groups whose jobs hold maps.
// ---------------------------------------------------------------------------

/// A job holding a map of many entries.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Census {
    region: String,
    counts: HashMap<String, u64>,
}

/// Equal censuses, their maps filled in opposite orders.
fn census(region: &str, reverse: bool) -> Census {
    let mut ids: Vec<u64> = (0..200).collect();
    if reverse {
        ids.reverse();
    }
    Census {
        region: region.into(),
        counts: ids.iter().map(|i| (format!("town-{i}"), *i)).collect(),
    }
}

/// Runs of [`Census`], and a gate every run waits on.
#[derive(Clone, Default)]
struct CensusRuns {
    runs: Arc<AtomicUsize>,
    gate: Gate,
}

impl Job for Census {
    const NAME: &'static str = "test.census";
    type Output = u64;
    type Error = Infallible;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u64, Infallible> {
        let state = ctx.state::<CensusRuns>();
        state.runs.fetch_add(1, Ordering::SeqCst);
        state.gate.wait().await;
        Ok(self.counts.values().sum())
    }
}

fn census_runner(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>, runs: &CensusRuns) -> JobRunner {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Census>()
        .state(runs.clone())
        .poll_interval(Duration::from_millis(50))
        .build()
}

/// The serialized bytes of two equal censuses differ (their maps iterate
/// in other orders): what the tests below rely on.
#[test]
fn equal_censuses_serialize_differently() {
    let (a, b) = (census("north", false), census("north", true));
    assert_eq!(a.counts, b.counts);
    assert_ne!(
        rmp_serde::to_vec_named(&a).unwrap(),
        rmp_serde::to_vec_named(&b).unwrap()
    );
}

/// A job group submitted again with equal jobs whose maps iterate in
/// another order is the same group: while its members run (no second run of
/// any) and after they succeeded (none runs again).
#[tokio::test(start_paused = true)]
async fn a_job_group_of_jobs_with_maps_submitted_again_is_the_same_group() {
    let (queue, store, _clock) = memory_queue().await;
    let runs = CensusRuns::default();
    let runner = census_runner(&queue, &store, &runs);
    let worker = runner.spawn(std::future::pending::<()>());
    let group = runner.group::<Census>(rid("census"));
    let jobs = |reverse| vec![census("north", reverse), census("south", reverse)];
    group.submit(jobs(false)).await.unwrap();
    eventually("both run", || async {
        runs.runs.load(Ordering::SeqCst) == 2
    })
    .await;

    // While they run.
    group.submit(jobs(true)).await.expect("the same set");
    runs.gate.open();
    let joined = within(30, group.join()).await.unwrap();
    let expected: u64 = (0..200).sum();
    assert!(
        joined
            .iter()
            .all(|r| matches!(r.result, Ok(total) if total == expected))
    );

    // After they succeeded.
    group.submit(jobs(true)).await.expect("the same set");
    group.resume().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs.runs.load(Ordering::SeqCst), 2, "no member ran again");

    // Another set is still another set.
    assert!(matches!(
        group
            .submit(vec![census("north", false), census("east", false)])
            .await,
        Err(Error::GroupMismatch(_))
    ));
    worker.shutdown().await.unwrap();
}

/// The claim a first submission writes before the manifest, as the
/// releases before the canonical claim wrote it (the SHA-256 of the stored
/// manifest), left without its manifest by a crash in between: the same
/// set submitted again is accepted, for a run group and for a job group.
#[tokio::test(start_paused = true)]
async fn a_group_claimed_with_the_raw_manifest_digest_accepts_its_own_re_submission() {
    let (queue, store, _clock) = memory_queue().await;
    let runs = CensusRuns::default();
    runs.gate.open();
    let jobs = JobRunner::builder(queue.clone(), store.clone())
        .register::<Census>()
        .state(runs.clone())
        .build();
    let runtime: Runtime = workflow_builder(&queue, &store, &Script::default()).build();

    /// Turn the group's claim into the raw digest of its manifest and drop
    /// the manifest.
    async fn as_crashed_before_the_manifest(
        queue: &Queue,
        store: &Arc<dyn ObjectStore>,
        prefix: &str,
        group: &str,
    ) {
        let path = Path::from(format!("{prefix}/groups/{group}/manifest"));
        let manifest = store.get(&path).await.unwrap().bytes().await.unwrap();
        let claim = format!("workflow/group-manifests/{group}");
        assert!(
            queue
                .view()
                .kv_get(claim.as_bytes())
                .await
                .unwrap()
                .is_some()
        );
        queue
            .kv_put(claim.as_bytes(), &Sha256::digest(&manifest))
            .await
            .unwrap();
        store.delete(&path).await.unwrap();
    }

    let members = vec![member("a", "ok"), member("b", "ok")];
    let run_group = runtime.group(rid("old-claim"));
    run_group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    as_crashed_before_the_manifest(&queue, &store, MEMO_PREFIX, "old-claim").await;
    run_group
        .submit(members, &RunOptions::default())
        .await
        .expect("its own set is accepted");
    assert_eq!(run_group.status().await.unwrap().total, 2);

    let job_group = jobs.group::<Census>(rid("old-job-claim"));
    let census_jobs = vec![census("north", false)];
    job_group.submit(census_jobs.clone()).await.unwrap();
    as_crashed_before_the_manifest(&queue, &store, "jobs-memo", "old-job-claim").await;
    job_group
        .submit(census_jobs)
        .await
        .expect("its own set is accepted");
    assert_eq!(job_group.status().await.unwrap().total, 1);
    assert!(matches!(
        job_group.submit(vec![census("south", false)]).await,
        Err(Error::GroupMismatch(_))
    ));
}

// ---------------------------------------------------------------------------
// `forget` racing submissions, running members and consumers.

/// A summary of the reserved KV keys of group `id` (member records and the
/// submissions record), for failure messages.
async fn reserved_keys(queue: &Queue, id: &str) -> String {
    let mut out = Vec::new();
    for prefix in [
        format!("workflow/groups/{id}/"),
        format!("workflow/group-submissions/{id}"),
    ] {
        let page = queue
            .view()
            .kv_scan(prefix.as_bytes(), .., 1000)
            .await
            .unwrap();
        out.push(format!("{prefix}*: {}", page.entries.len()));
    }
    out.join(", ")
}

/// `forget` racing a submission (another runtime over the queue, a real
/// clock): whatever the interleaving, a later submission completes the
/// group with every member once, and no member runs more often than the
/// three submissions could start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_racing_submit_leaves_a_group_that_a_later_submit_completes() {
    let (queue, store) = real_clock_queue().await;
    let runner = TrackedMembers::with_delay(2);
    let tally = Tally::default();
    let a = tracked_runtime(&queue, &store, &runner, &tally);
    let b = tracked_runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    let mut failures = Vec::new();
    for round in 0..12u64 {
        let id = format!("amnesia-{round}");
        let members: Vec<GroupMember> = (0..40).map(|i| member(&format!("m{i}"), "ok")).collect();
        a.group(rid(&id))
            .submit(members.clone(), &RunOptions::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(round % 4 * 5)).await;
        let forgetting = {
            let group = a.group(rid(&id));
            tokio::spawn(async move { group.forget().await })
        };
        let submitting = {
            let group = b.group(rid(&id));
            let members = members.clone();
            tokio::spawn(async move { group.submit(members, &RunOptions::default()).await })
        };
        let forgot = forgetting.await.unwrap();
        let submitted = submitting.await.unwrap();
        if let Err(e) = &forgot {
            failures.push(format!("{id}: forget: {e:?}"));
        }
        if let Err(e) = &submitted {
            failures.push(format!("{id}: racing submit: {e:?}"));
        }
        let group = a.group(rid(&id));
        if let Err(e) = group.submit(members.clone(), &RunOptions::default()).await {
            failures.push(format!("{id}: final submit: {e:?}"));
            continue;
        }
        let collected = tokio::time::timeout(Duration::from_secs(15), async {
            group.results().await?.try_collect::<Vec<_>>().await
        })
        .await;
        match collected {
            Err(_) => failures.push(format!(
                "{id}: results did not finish in 15 s (status {:?})",
                group.status().await
            )),
            Ok(Err(e)) => {
                let keys = reserved_keys(&queue, &id).await;
                // Does anything heal the group? A resume, then another
                // submission.
                group.resume(&RunOptions::default()).await.unwrap();
                let after_resume = tokio::time::timeout(Duration::from_secs(5), async {
                    group.results().await?.try_collect::<Vec<_>>().await
                })
                .await;
                let healed_by_resume = matches!(&after_resume, Ok(Ok(r)) if r.len() == 40);
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut states: HashMap<String, usize> = HashMap::new();
                for m in &members {
                    let st = a.status(&member_run_id(&id, &m.key)).await.unwrap();
                    let st = st.map(|s| {
                        format!("{:?}", s.state)
                            .chars()
                            .take(24)
                            .collect::<String>()
                    });
                    *states.entry(format!("{st:?}")).or_default() += 1;
                }
                let keys_later = reserved_keys(&queue, &id).await;
                failures.push(format!(
                    "{id}: results after the final submit: {e:?}; reserved keys then: {keys}; \
                     healed by a resume: {healed_by_resume} ({:?}); 1 s later: keys {keys_later}, \
                     member run states {states:?}",
                    after_resume.map(|r| r.map(|v| v.len()))
                ));
                continue;
            }
            Ok(Ok(results)) => {
                assert_each_member_once(&results, &members, &id);
                let not_ok: Vec<_> = results
                    .iter()
                    .filter(|r| r.termination.status != TerminalStatus::Succeeded)
                    .map(|r| (&r.key, r.termination.status))
                    .collect();
                if !not_ok.is_empty() {
                    failures.push(format!("{id}: not succeeded: {not_ok:?}"));
                }
            }
        }
        match group.status().await {
            Ok(status) => {
                let counted = status.pending + status.succeeded + status.failed + status.cancelled;
                if status.total != 40 || counted != 40 || status.succeeded != 40 {
                    let mut detail = Vec::new();
                    for m in &members {
                        let run_id = member_run_id(&id, &m.key);
                        let st = a
                            .status(&run_id)
                            .await
                            .unwrap()
                            .map(|s| format!("{:?}", s.state));
                        let run_rec = queue
                            .view()
                            .kv_get(format!("workflow/runs/{run_id}").as_bytes())
                            .await
                            .unwrap()
                            .is_some();
                        let ptr = queue
                            .view()
                            .kv_get(format!("workflow/steps/{run_id}").as_bytes())
                            .await
                            .unwrap()
                            .is_some();
                        let rec = queue
                            .view()
                            .kv_get(format!("workflow/groups/{id}/{}", m.key).as_bytes())
                            .await
                            .unwrap()
                            .map(|v| v.len());
                        if !matches!(st.as_deref(), Some(s) if s.starts_with("Terminated"))
                            || rec.is_none()
                        {
                            detail.push(format!("{}: state {st:?} run_rec {run_rec} ptr {ptr} member_rec_len {rec:?} starts {}", m.key, runner.starts(&run_id)));
                        }
                    }
                    failures.push(format!(
                        "{id}: status after completion {status:?}; {detail:?}"
                    ));
                }
            }
            Err(e) => failures.push(format!("{id}: status: {e:?}")),
        }
        for m in &members {
            let starts = runner.starts(&member_run_id(&id, &m.key));
            if starts > 3 {
                failures.push(format!("{id}/{}: step 0 ran {starts} times", m.key));
            }
        }
    }
    let overlaps = runner.overlaps();
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        overlaps,
        Vec::<RunId>::new(),
        "a run executed twice at once"
    );
}

/// `forget` while a member's step is claimed by the worker and ignores its
/// cancel token (and another member waits for a signal): the waiting member
/// is cancelled at once, and `forget` returns only once the running one's
/// step returned; a later `submit` starts both afresh and `results` yields
/// both.
#[tokio::test(start_paused = true)]
async fn forget_waits_for_a_running_member_and_a_later_submit_starts_afresh() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("busy"));
    let members = vec![member("busy", "gate"), member("parked", "wait:parked-gate")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let busy = member_run_id("busy", "busy");
    let parked = member_run_id("busy", "parked");
    within(30, async {
        while runner.starts(&busy) == 0 || runner.starts(&parked) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // Let the parked member's signal wait commit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let forgetting = tokio::spawn({
        let group = group.clone();
        async move { group.forget().await }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !forgetting.is_finished(),
        "forget returned while a member still ran"
    );
    let parked_state = rt.status(&parked).await.unwrap().map(|s| s.state);
    assert!(
        matches!(&parked_state, Some(taquba_workflow::RunState::Terminated(t)) if t.status == TerminalStatus::Cancelled),
        "the waiting member is cancelled at once: {parked_state:?}"
    );
    runner.gate.open();
    within(30, forgetting).await.unwrap().unwrap();
    assert!(rt.status(&busy).await.unwrap().is_none());
    assert_eq!(
        reserved_keys(&queue, "busy").await,
        "workflow/groups/busy/*: 0, workflow/group-submissions/busy*: 0"
    );

    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    rt.signal("parked-gate", b"go".to_vec()).await.unwrap();
    let results: Vec<MemberResult> = within(30, async {
        group.results().await.unwrap().try_collect().await
    })
    .await
    .unwrap();
    worker.shutdown().await.unwrap();
    assert_each_member_once(&results, &members, "busy");
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    assert_eq!(
        runner.starts(&busy),
        2,
        "the forgotten member starts afresh"
    );
    assert_eq!(
        runner.starts(&parked),
        2,
        "the forgotten member starts afresh"
    );
}

/// A member left running by a release whose `forget` did not end it (set
/// up by removing the group's records as that `forget` did) finishes,
/// writing its member record back; the group is gone (no manifest), and a
/// later submission starts the other members afresh and takes the finished
/// member's success as its result.
#[tokio::test(start_paused = true)]
async fn a_member_finishing_after_forget_records_its_end_for_a_later_submit() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("late"));
    let members = vec![member("quick", "ok"), member("slow", "wait:late-gate")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let slow = member_run_id("late", "slow");
    let quick = member_run_id("late", "quick");
    within(30, async {
        while runner.starts(&slow) == 0 || group.status().await.unwrap().succeeded < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    forget_leaving_members_running(&queue, &store, MEMO_PREFIX, "late").await;
    rt.signal("late-gate", b"go".to_vec()).await.unwrap();
    until_terminated("slow finishes after forget", &rt, slow.as_str()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let leftover: Vec<String> = queue
        .view()
        .kv_scan(b"workflow/groups/late/", .., 100)
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
        .collect();
    let status_after = group.status().await;

    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(30, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "late");
    worker.shutdown().await.unwrap();
    assert_eq!(runner.starts(&quick), 2, "quick starts afresh");
    assert!(
        matches!(status_after, Err(Error::GroupNotFound(_))),
        "{status_after:?}"
    );
    assert_eq!(
        leftover,
        vec!["workflow/groups/late/slow".to_string()],
        "the member that finished after forget wrote its record back"
    );
    assert_eq!(
        runner.starts(&slow),
        1,
        "the member that succeeded after forget is not run again"
    );
}

/// A consumer streaming a group's `results` while the group is forgotten
/// (its members still waiting on hour-long timers): the stream must end
/// (with the members' cancellations, or an error), not wait forever for
/// members whose state is gone.
#[tokio::test(start_paused = true)]
async fn a_results_stream_of_a_group_being_forgotten_ends() {
    use futures_util::StreamExt;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("forgotten-stream"));
    let members: Vec<GroupMember> = (0..3)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"timer:3600000".to_vec(),
        })
        .collect();
    group.submit(members, &RunOptions::default()).await.unwrap();
    let consumer = {
        let group = group.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(group.results().await?);
            let mut seen = Vec::new();
            while let Some(item) = stream.next().await {
                seen.push(item.map(|r| r.termination.status));
            }
            Ok::<_, taquba_workflow::Error>(seen)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    within(60, group.forget()).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(60), consumer).await {
        Err(_) => panic!("the results stream of a forgotten group never ends"),
        Ok(joined) => {
            let seen = joined.unwrap().unwrap();
            assert!(
                seen.iter()
                    .all(|item| matches!(item, Ok(TerminalStatus::Cancelled) | Err(_))),
                "{seen:?}"
            );
        }
    }
    worker.shutdown().await.unwrap();
}
