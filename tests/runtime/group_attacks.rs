//! Attacks on the documented promises of run groups and job groups:
//! concurrent submissions and resumptions (several tasks, two runtimes over
//! one queue), large groups, unusual member keys, `forget` and `cancel`
//! racing `submit`, the order `results` promises, and a kill -9 during the
//! submission of a large group (with the `group_crash_child` binary).
//!
//! The assertions are invariants that hold in every interleaving the
//! documentation allows:
//! * a member that succeeded never runs again (its run succeeds once);
//! * a member that failed runs again only through a submission or resume,
//!   and one member's run is never executing twice at once;
//! * `results` yields every manifest member once;
//! * the status counts never exceed the manifest's size.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::{
    Error, GroupMember, GroupStatus, MemberResult, RunGroup, RunId, RunOptions, RunOutcome, Step,
    StepError, StepErrorKind, StepOutcome, StepRunner, TerminalEffects, TerminalHook,
    TerminalStatus, WorkflowRuntime,
};

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// What the members' runner observed.
#[derive(Default)]
struct Book {
    /// Executions of step 0, by member (over all its runs).
    starts: HashMap<RunId, usize>,
    /// Members whose first step 0 already failed (`flaky` members).
    failed_once: HashSet<RunId>,
    /// Runs executing step 0 right now.
    active: HashSet<RunId>,
    /// Runs seen executing step 0 twice at the same time.
    overlaps: Vec<RunId>,
}

/// Every member runs two steps. Step 0 records its execution, sleeps the
/// runner's delay, then by its input: `flaky` fails (a `Fail` verdict) the
/// first time a member executes it and continues afterwards (in its next
/// run), `gate` waits
/// for the runner's gate (its step stays claimed), `ok-1` and `flaky-1`
/// succeed at step 0 (one-step runs; `flaky-1` after its first failure),
/// `wait:{key}` continues on the signal `key`, anything else continues at
/// once. Step 1 succeeds with `{input}@1`.
#[derive(Clone, Default)]
struct Members {
    book: Arc<Mutex<Book>>,
    delay_ms: Arc<AtomicU64>,
    /// Step 0 of a `gate` member waits for this gate.
    gate: Gate,
}

impl Members {
    fn with_delay(ms: u64) -> Self {
        let members = Self::default();
        members.delay_ms.store(ms, Ordering::SeqCst);
        members
    }

    /// Executions of step 0 by the member whose run id is `run_id`, over
    /// all its runs.
    fn starts(&self, run_id: &RunId) -> usize {
        self.book
            .lock()
            .unwrap()
            .starts
            .get(run_id)
            .copied()
            .unwrap_or(0)
    }

    fn overlaps(&self) -> Vec<RunId> {
        self.book.lock().unwrap().overlaps.clone()
    }
}

impl StepRunner for Members {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: format!("{input}@{}", step.step_number).into_bytes(),
            });
        }
        let fail_now = {
            let mut book = self.book.lock().unwrap();
            let member = step.run_id.clone();
            *book.starts.entry(member.clone()).or_default() += 1;
            if !book.active.insert(step.run_id.clone()) {
                book.overlaps.push(step.run_id.clone());
            }
            (input == "flaky" || input == "flaky-1") && book.failed_once.insert(member)
        };
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.book.lock().unwrap().active.remove(&step.run_id);
        if input == "gate" {
            self.gate.wait().await;
        }
        if fail_now {
            return Ok(StepOutcome::Fail {
                reason: format!("first run of {}", step.run_id),
            });
        }
        if input == "ok-1" || input == "flaky-1" {
            // One-step members: succeed at step 0.
            return Ok(StepOutcome::Succeed {
                result: format!("{input}@0").into_bytes(),
            });
        }
        if let Some(key) = input.strip_prefix("wait:") {
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                key,
                Duration::from_secs(3600),
            ));
        }
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

/// A terminal hook counting each member's committed terminations (over all
/// its runs) by status.
#[derive(Clone, Default)]
struct Tally(Arc<Mutex<HashMap<RunId, Vec<TerminalStatus>>>>);

impl Tally {
    /// The terminations with `status` of the member whose run id is
    /// `run_id`.
    fn count(&self, run_id: &RunId, status: TerminalStatus) -> usize {
        self.0
            .lock()
            .unwrap()
            .get(run_id)
            .map(|all| all.iter().filter(|s| **s == status).count())
            .unwrap_or(0)
    }
}

impl TerminalHook for Tally {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        _effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.0
            .lock()
            .unwrap()
            .entry(outcome.run_id.clone())
            .or_default()
            .push(outcome.status);
        Ok(())
    }
}

type Runtime = WorkflowRuntime<Members, Tally>;

fn runtime(
    queue: &Arc<Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: &Members,
    tally: &Tally,
) -> Runtime {
    WorkflowRuntime::builder(queue.clone(), store.clone(), runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(32)
        .build()
}

/// Collect every result of `group`, on the real clock, within `secs`.
async fn collect_results(group: &RunGroup, secs: u64) -> Vec<MemberResult> {
    let collected = tokio::time::timeout(Duration::from_secs(secs), async {
        group.results().await?.try_collect::<Vec<_>>().await
    })
    .await;
    match collected {
        Ok(Ok(results)) => results,
        Ok(Err(err)) => panic!("results of {}: {err:?}", group.id()),
        Err(_) => panic!(
            "results of {} did not finish within {secs} s (status {:?})",
            group.id(),
            group.status().await
        ),
    }
}

/// Every key of `members` is in `results` exactly once, and nothing else.
fn assert_each_member_once(results: &[MemberResult], members: &[GroupMember], what: &str) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for result in results {
        *seen.entry(result.key.as_str()).or_default() += 1;
    }
    let expected: HashSet<&str> = members.iter().map(|m| m.key.as_str()).collect();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "{what}: keys yielded twice: {twice:?}");
    let extra: Vec<_> = seen.keys().filter(|k| !expected.contains(*k)).collect();
    assert!(
        extra.is_empty(),
        "{what}: keys not in the manifest: {extra:?}"
    );
    let missing: Vec<_> = expected.iter().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "{what}: keys never yielded: {missing:?}"
    );
    assert_eq!(results.len(), members.len(), "{what}");
}

fn assert_counts_consistent(status: &GroupStatus, what: &str) {
    let counted = status.pending + status.succeeded + status.failed + status.cancelled;
    assert!(
        counted <= status.total,
        "{what}: counts exceed the manifest: {status:?}"
    );
}

/// Threads spinning until dropped: CPU contention that preempts the
/// runtime's threads at arbitrary points.
struct CpuLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl CpuLoad {
    fn start(n: usize) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Wait (real clock) until `check` holds, up to `secs`.
async fn real_eventually<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// Wait until every member's success reached the terminal hook, then give
/// any duplicate a moment to show up.
async fn settle_hooks(tally: &Tally, run_ids: &[RunId]) {
    real_eventually("every member's success hook", 20, || async {
        run_ids
            .iter()
            .all(|id| tally.count(id, TerminalStatus::Succeeded) >= 1)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
}

// ---------------------------------------------------------------------------
// Concurrent submissions
// ---------------------------------------------------------------------------

/// Two first submissions of one fresh group with different member sets
/// (from two runtimes over one queue, in parallel): the manifest is written
/// by one of them, so the other must get `GroupMismatch` and none of its
/// members may be submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_submissions_of_different_member_sets_admit_only_one() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let a = runtime(&queue, &store, &runner, &tally);
    let b = runtime(&queue, &store, &runner, &tally);
    // No worker: member records stay pending, so the counts show every
    // member any submission wrote.
    const ROUNDS: usize = 300;
    let mut both_accepted = Vec::new();
    for round in 0..ROUNDS {
        let id = format!("split-{round}");
        let xs: Vec<GroupMember> = (0..10).map(|i| member(&format!("x{i}"), "ok")).collect();
        let ys: Vec<GroupMember> = (0..10).map(|i| member(&format!("y{i}"), "ok")).collect();
        let (ga, gb) = (a.group(rid(&id)), b.group(rid(&id)));
        let (xs2, ys2) = (xs.clone(), ys.clone());
        let ta = tokio::spawn(async move { ga.submit(xs2, &RunOptions::default()).await });
        let tb = tokio::spawn(async move { gb.submit(ys2, &RunOptions::default()).await });
        let (ra, rb) = (ta.await.unwrap(), tb.await.unwrap());
        let oks = usize::from(ra.is_ok()) + usize::from(rb.is_ok());
        for r in [&ra, &rb] {
            assert!(
                matches!(r, Ok(()) | Err(Error::GroupMismatch(_))),
                "round {round}: unexpected {r:?}"
            );
        }
        assert!(oks >= 1, "round {round}: neither submission was accepted");
        let group = a.group(rid(&id));
        let status = group.status().await.unwrap();
        let mut with_run = 0;
        for key in xs.iter().chain(ys.iter()).map(|m| m.key.clone()) {
            if a.status(&member_run_id(&id, &key)).await.unwrap().is_some() {
                with_run += 1;
            }
        }
        if oks == 2 || with_run > 10 || status.pending > status.total {
            both_accepted.push(format!(
                "round {round}: results ({ra:?}, {rb:?}), runs submitted {with_run}, status {status:?}"
            ));
        }
    }
    assert!(
        both_accepted.is_empty(),
        "two different member sets were both accepted for one group in {} of {ROUNDS} rounds:\n{}",
        both_accepted.len(),
        both_accepted.join("\n")
    );
}

/// Six concurrent submit/resume calls per round (three on each of two
/// runtimes over one queue, both with workers, a real clock), 300 members
/// of which every fifth fails on its first run: every member runs step 0
/// once if it succeeds at once and exactly twice if it failed first; no run
/// executes twice at once; each member's success is committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submits_and_resumes_from_two_runtimes_run_each_member_as_promised() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let a = runtime(&queue, &store, &runner, &tally);
    let b = runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 300;
    let flaky = |n: usize| n.is_multiple_of(5);
    for g in 0..3 {
        let id = format!("storm-{g}");
        let members: Vec<GroupMember> = (0..N)
            .map(|n| member(&format!("m{n:03}"), if flaky(n) { "flaky" } else { "ok" }))
            .collect();
        let mut done = false;
        for round in 0..6 {
            let mut tasks = tokio::task::JoinSet::new();
            for (i, rt) in [&a, &a, &a, &b, &b, &b].into_iter().enumerate() {
                let group = rt.group(rid(&id));
                let members = members.clone();
                let resume = round > 0 && i % 3 == 2;
                tasks.spawn(async move {
                    if resume {
                        group.resume(&RunOptions::default()).await
                    } else {
                        group.submit(members, &RunOptions::default()).await
                    }
                });
            }
            while let Some(joined) = tasks.join_next().await {
                joined
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{id} round {round}: submit/resume: {e:?}"));
            }
            let group = a.group(rid(&id));
            let results = collect_results(&group, 20).await;
            assert_each_member_once(&results, &members, &format!("{id} round {round}"));
            let status = group.status().await.unwrap();
            assert_counts_consistent(&status, &format!("{id} round {round}"));
            for r in &results {
                let n: usize = r.key[1..].parse().unwrap();
                if !flaky(n) {
                    assert_eq!(
                        r.termination.status,
                        TerminalStatus::Succeeded,
                        "{id} round {round}: {}",
                        r.key
                    );
                }
            }
            if results
                .iter()
                .all(|r| r.termination.status == TerminalStatus::Succeeded)
            {
                assert_eq!(status.succeeded, N, "{id}: {status:?}");
                done = true;
                break;
            }
        }
        assert!(done, "{id}: some member never succeeded");
        let run_ids: Vec<RunId> = (0..N)
            .map(|n| member_run_id(&id, &format!("m{n:03}")))
            .collect();
        settle_hooks(&tally, &run_ids).await;
        let mut wrong = Vec::new();
        for (n, run_id) in run_ids.iter().enumerate() {
            let starts = runner.starts(run_id);
            let expected = if flaky(n) { 2 } else { 1 };
            let successes = tally.count(run_id, TerminalStatus::Succeeded);
            if starts != expected || successes != 1 {
                wrong.push(format!(
                    "m{n:03}: step 0 ran {starts} times (expected {expected}), succeeded {successes} times"
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "{id}: {} members broke the promise:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
        assert_eq!(
            runner.overlaps(),
            Vec::<RunId>::new(),
            "{id}: concurrent runs"
        );
    }
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
}

/// Members of one step that fail their first run, submitted over and over
/// by six concurrent tasks (four submissions each, two runtimes, a real
/// clock, two spinning threads for contention) while first runs fail and
/// second runs finish: a member whose second run succeeded must not be
/// started a third time by a submission that saw it failed a moment
/// earlier. Each member's step 0 runs exactly twice and its success is
/// committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_resubmissions_never_run_a_member_that_just_succeeded_again() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let a = runtime(&queue, &store, &runner, &tally);
    let b = runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 512;
    const GROUPS: usize = 8;
    const SUBMITTERS: u64 = 6;
    const REPEATS: usize = 4;
    let mut all: Vec<(String, RunId)> = Vec::new();
    for g in 0..GROUPS {
        let id = format!("relapse-{g}");
        let members: Vec<GroupMember> = (0..N)
            .map(|n| member(&format!("m{n:03}"), "flaky-1"))
            .collect();
        // Six submitters at once, staggered by a few milliseconds so later
        // submissions land while first runs fail and second runs finish;
        // two spinning threads preempt the runtime's threads, as a loaded
        // machine does.
        let _load = CpuLoad::start(2);
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..SUBMITTERS {
            let group = if i % 2 == 0 { &a } else { &b }.group(rid(&id));
            let members = members.clone();
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 3)).await;
                for _ in 0..REPEATS {
                    group
                        .submit(members.clone(), &RunOptions::default())
                        .await?;
                }
                Ok::<_, Error>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.unwrap().unwrap();
        }
        drop(_load);
        // Then resubmit until every member succeeded.
        let mut complete = false;
        for _ in 0..5 {
            let results = collect_results(&a.group(rid(&id)), 20).await;
            assert_each_member_once(&results, &members, &id);
            if results
                .iter()
                .all(|r| r.termination.status == TerminalStatus::Succeeded)
            {
                complete = true;
                break;
            }
            a.group(rid(&id))
                .submit(members.clone(), &RunOptions::default())
                .await
                .unwrap();
        }
        assert!(complete, "{id} never completed");
        all.extend((0..N).map(|n| {
            let key = format!("m{n:03}");
            (format!("{id}/{key}"), member_run_id(&id, &key))
        }));
    }
    let run_ids: Vec<RunId> = all.iter().map(|(_, r)| r.clone()).collect();
    settle_hooks(&tally, &run_ids).await;
    let mut wrong = Vec::new();
    for (name, run_id) in &all {
        let starts = runner.starts(run_id);
        let successes = tally.count(run_id, TerminalStatus::Succeeded);
        if starts != 2 || successes != 1 {
            wrong.push(format!(
                "{name}: step 0 ran {starts} times (1 failure, then 1 success \
                 expected), success committed {successes} times"
            ));
        }
    }
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert!(
        wrong.is_empty(),
        "{} members of {} ran again after succeeding:\n{}",
        wrong.len(),
        GROUPS * N,
        wrong.join("\n")
    );
    assert_eq!(
        runner.overlaps(),
        Vec::<RunId>::new(),
        "a run executed twice at once"
    );
}

/// The member set is a list: the same members in another order are a
/// different submission (`GroupMismatch`), and the group is left as it was.
#[tokio::test(start_paused = true)]
async fn a_re_submission_listing_the_same_members_in_another_order_is_a_mismatch() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("order"));
    let members = vec![member("a", "ok"), member("b", "ok"), member("c", "ok")];
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let mut reversed = members.clone();
    reversed.reverse();
    let again = group.submit(reversed, &RunOptions::default()).await;
    assert!(
        matches!(&again, Err(Error::GroupMismatch(id)) if id == "order"),
        "{again:?}"
    );
    let results = within(30, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "order");
    worker.shutdown().await.unwrap();
}

/// A submission rejected for a duplicate key writes nothing, and one
/// rejected as a mismatch submits none of its new members.
#[tokio::test(start_paused = true)]
async fn rejected_submissions_write_nothing() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
    let group = rt.group(rid("strict"));
    let dup = vec![member("x", "ok"), member("y", "ok"), member("x", "ok")];
    assert!(matches!(
        group.submit(dup, &RunOptions::default()).await,
        Err(Error::DuplicateMemberKey(k)) if k == "x"
    ));
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    for key in ["x", "y"] {
        assert!(
            rt.status(&member_run_id("strict", key))
                .await
                .unwrap()
                .is_none()
        );
    }
    // Empty keys are keys too.
    assert!(matches!(
        group.submit(vec![member("", "1"), member("", "2")], &RunOptions::default()).await,
        Err(Error::DuplicateMemberKey(k)) if k.is_empty()
    ));

    group
        .submit(vec![member("x", "ok")], &RunOptions::default())
        .await
        .unwrap();
    let bigger = vec![member("x", "ok"), member("z", "ok")];
    assert!(matches!(
        group.submit(bigger, &RunOptions::default()).await,
        Err(Error::GroupMismatch(_))
    ));
    assert!(
        rt.status(&member_run_id("strict", "z"))
            .await
            .unwrap()
            .is_none(),
        "a mismatched submission submitted a new member"
    );
    let status = group.status().await.unwrap();
    assert_eq!((status.total, status.pending), (1, 1));
}

// ---------------------------------------------------------------------------
// Large groups, results order
// ---------------------------------------------------------------------------

async fn large_group(n: usize) {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = WorkflowRuntime::builder(queue, store, runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(64)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let id = format!("large-{n}");
    let group = rt.group(rid(&id));
    let flaky = |i: usize| i % 97 == 13;
    // Keys out of lexical order, so a key-ordered listing differs from the
    // manifest's order.
    let members: Vec<GroupMember> = (0..n)
        .map(|i| {
            member(
                &format!("k{}", (i * 7919) % n),
                if flaky(i) { "flaky" } else { "ok" },
            )
        })
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(120, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, &id);
    let failed: usize = results
        .iter()
        .filter(|r| r.termination.status == TerminalStatus::Failed)
        .count();
    let n_flaky = (0..n).filter(|i| flaky(*i)).count();
    assert_eq!(failed, n_flaky, "{id}");
    for r in &results {
        assert_eq!(
            r.run_id,
            member_run_id(&id, &r.key),
            "{id}: run id of {}",
            r.key
        );
    }
    let status = group.status().await.unwrap();
    assert_eq!(
        (
            status.total,
            status.succeeded,
            status.failed,
            status.pending
        ),
        (n, n - n_flaky, n_flaky, 0)
    );

    group.resume(&RunOptions::default()).await.unwrap();
    let results = within(120, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, &id);
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
    );
    // A member run again keeps its derived run id.
    for r in &results {
        assert_eq!(r.run_id, member_run_id(&id, &r.key), "{id}: {}", r.key);
    }
    for (i, m) in members.iter().enumerate() {
        let starts = runner.starts(&member_run_id(&id, &m.key));
        assert_eq!(starts, if flaky(i) { 2 } else { 1 }, "{id}: {}", m.key);
    }
    // Nothing left to run.
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    group.resume(&RunOptions::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let total: usize = members
        .iter()
        .map(|m| runner.starts(&member_run_id(&id, &m.key)))
        .sum();
    assert_eq!(total, n + n_flaky, "{id}: a succeeded member ran again");
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_of_257_members_resumes_only_its_failures() {
    large_group(257).await;
}

#[tokio::test(start_paused = true)]
async fn a_group_of_1000_members_resumes_only_its_failures() {
    large_group(1000).await;
}

/// `results` yields already terminated members first, even when more than
/// the 256-member window of members ahead of them in the manifest are still
/// waiting.
#[tokio::test(start_paused = true)]
async fn results_yield_terminated_members_first_behind_300_waiting_members() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = WorkflowRuntime::builder(queue, store, runner.clone(), tally.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_steps(64)
        .build();
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("crowded"));
    let mut members: Vec<GroupMember> = (0..300)
        .map(|i| member(&format!("w{i:03}"), &format!("wait:crowded-{i}")))
        .collect();
    members.extend((0..20).map(|i| member(&format!("d{i:02}"), "ok")));
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if group.status().await.unwrap().succeeded == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if settled.is_err() {
        let mut states: HashMap<String, usize> = HashMap::new();
        for m in &members {
            let st = rt.status(&member_run_id("crowded", &m.key)).await.unwrap();
            *states
                .entry(format!(
                    "{}: {:?}",
                    &m.key[..1],
                    st.map(|s| (s.state, s.current_step))
                ))
                .or_default() += 1;
        }
        panic!(
            "the 20 quick members did not all succeed in 60 s: {:?}; runs by state {states:#?}",
            group.status().await
        );
    }
    let mut results = std::pin::pin!(group.results().await.unwrap());
    let first = tokio::time::timeout(Duration::from_secs(2), results.next()).await;
    let first_key = match &first {
        Ok(Some(Ok(r))) => Some(r.key.clone()),
        _ => None,
    };
    // Release everyone so the stream ends either way.
    for i in 0..300 {
        rt.signal(&format!("crowded-{i}"), b"go".to_vec())
            .await
            .unwrap();
    }
    let mut all: Vec<MemberResult> = Vec::new();
    if let Ok(Some(r)) = first {
        all.push(r.unwrap());
    }
    loop {
        match tokio::time::timeout(Duration::from_secs(120), results.next()).await {
            Ok(Some(r)) => all.push(r.unwrap()),
            Ok(None) => break,
            Err(_) => {
                let seen: HashSet<String> = all.iter().map(|r| r.key.clone()).collect();
                let mut missing = Vec::new();
                for m in &members {
                    if !seen.contains(&m.key) {
                        let st = rt.status(&member_run_id("crowded", &m.key)).await.unwrap();
                        missing.push(format!(
                            "{} {:?}",
                            m.key,
                            st.map(|s| (s.state, s.current_step))
                        ));
                    }
                }
                panic!(
                    "results stalled after {} of {} members; missing: {:#?}",
                    all.len(),
                    members.len(),
                    &missing[..missing.len().min(10)]
                );
            }
        }
    }
    assert_each_member_once(&all, &members, "crowded");
    worker.shutdown().await.unwrap();
    assert!(
        first_key.as_deref().is_some_and(|k| k.starts_with('d')),
        "with 20 members terminated behind 300 waiting ones, the first result \
         (within 2 s) was {first_key:?}, not a terminated member"
    );
}

// ---------------------------------------------------------------------------
// Unusual keys
// ---------------------------------------------------------------------------

fn unusual_keys() -> Vec<String> {
    vec![
        String::new(),
        "/".into(),
        "//".into(),
        "a".into(),
        "a/".into(),
        "a/b".into(),
        "a/b/".into(),
        "../other-group/x".into(),
        " a".into(),
        "a ".into(),
        "Ünïcödé ключ 鍵 🔑".into(),
        "line\nbreak\ttab".into(),
        "nul\0byte".into(),
        "%2F%00".into(),
        "workflow.group_key".into(),
        "k".repeat(1024),
        "é".repeat(600),
    ]
}

/// Keys are any text: each member keeps its exact key, its run id is the
/// digest of `{group_id}/{key}`, a re-submission matches the manifest and
/// runs nothing again.
#[tokio::test(start_paused = true)]
async fn unusual_member_keys_round_trip() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let group = rt.group(rid("odd-keys"));
    let members: Vec<GroupMember> = unusual_keys()
        .iter()
        .enumerate()
        .map(|(i, k)| member(k, if i % 3 == 0 { "flaky" } else { "ok" }))
        .collect();
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(60, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "odd-keys");
    for r in &results {
        assert_eq!(r.run_id, member_run_id("odd-keys", &r.key), "{:?}", r.key);
        let status = rt.status(&r.run_id).await.unwrap();
        assert!(
            status.is_some(),
            "no run under the documented id for {:?}",
            r.key
        );
    }
    let status = group.status().await.unwrap();
    assert_eq!(status.total, members.len());
    assert_eq!(
        status.succeeded + status.failed,
        members.len(),
        "{status:?}"
    );
    group
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let results = within(60, async {
        group.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await
    .unwrap();
    assert_each_member_once(&results, &members, "odd-keys again");
    assert!(
        results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded),
        "{:?}",
        results
            .iter()
            .map(|r| (&r.key, r.termination.status))
            .collect::<Vec<_>>()
    );
    for (i, m) in members.iter().enumerate() {
        assert_eq!(
            runner.starts(&member_run_id("odd-keys", &m.key)),
            if i % 3 == 0 { 2 } else { 1 },
            "{:?}",
            m.key
        );
    }
    // The key "a" and its prefix-sharing siblings are distinct members;
    // forgetting removes them all.
    group.forget().await.unwrap();
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    worker.shutdown().await.unwrap();
}

/// A key of 100 KB of text ("any text"): accepted and run, or refused with
/// an error; never a panic, and the runtime keeps working either way.
#[tokio::test(start_paused = true)]
async fn a_100_kb_member_key_is_accepted_or_refused_without_a_panic() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let key = "x".repeat(100 * 1024);
    let members = vec![member(&key, "ok"), member("small", "ok")];
    let submitting = {
        let group = rt.group(rid("huge-key"));
        let members = members.clone();
        tokio::spawn(async move { group.submit(members, &RunOptions::default()).await })
    };
    let submitted = within(30, submitting).await;
    let group = rt.group(rid("huge-key"));
    let status = group.status().await;
    // The runtime still works.
    let other = rt.group(rid("after-huge-key"));
    other
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    let after = within(30, async {
        other.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await;
    let resumed = within(30, async {
        let group = rt.group(rid("huge-key"));
        tokio::spawn(async move { group.resume(&RunOptions::default()).await }).await
    })
    .await;
    worker.shutdown().await.unwrap();
    assert!(
        after.is_ok_and(|r| r.len() == 1),
        "the runtime stopped working"
    );
    match submitted {
        Ok(Ok(())) => {}
        Ok(Err(e)) => println!(
            "refused with {}",
            e.to_string().chars().take(200).collect::<String>()
        ),
        Err(join) => panic!(
            "submitting a group with a 100 KB key panicked ({}); the group is then {:?}, \
             and resume {}",
            if join.is_panic() {
                panic_message(join.into_panic())
            } else {
                String::new()
            },
            status.map(|s| (s.total, s.pending)),
            match resumed {
                Err(j) if j.is_panic() => "panics too".to_string(),
                other => format!("gives {other:?}"),
            }
        ),
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

// ---------------------------------------------------------------------------
// forget and cancel racing submit
// ---------------------------------------------------------------------------

/// `forget` racing a submission (another runtime over the queue, a real
/// clock): whatever the interleaving, a later submission completes the
/// group with every member once, and no member runs more often than the
/// three submissions could start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_racing_submit_leaves_a_group_that_a_later_submit_completes() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::with_delay(2);
    let tally = Tally::default();
    let a = runtime(&queue, &store, &runner, &tally);
    let b = runtime(&queue, &store, &runner, &tally);
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

/// `forget` while a member's step is claimed by the worker and ignores its
/// cancel token (and another member waits for a signal): the waiting member
/// is cancelled at once, and `forget` returns only once the running one's
/// step returned; a later `submit` starts both afresh and `results` yields
/// both.
#[tokio::test(start_paused = true)]
async fn forget_waits_for_a_running_member_and_a_later_submit_starts_afresh() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
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
    let runner = Members::default();
    let tally = Tally::default();
    let rt = runtime(&queue, &store, &runner, &tally);
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

/// `cancel` racing submissions (two runtimes, a real clock): members end
/// Succeeded or Cancelled, a later resume completes the group, and no
/// member's success is committed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_submit_never_runs_a_succeeded_member_again() {
    let (queue, store) = real_clock_queue().await;
    let runner = Members::with_delay(15);
    let tally = Tally::default();
    let a = runtime(&queue, &store, &runner, &tally);
    let b = runtime(&queue, &store, &runner, &tally);
    let wa = a.spawn(std::future::pending::<()>());
    let wb = b.spawn(std::future::pending::<()>());
    const N: usize = 200;
    let id = "tug";
    let members: Vec<GroupMember> = (0..N).map(|i| member(&format!("m{i:03}"), "ok")).collect();
    a.group(rid(id))
        .submit(members.clone(), &RunOptions::default())
        .await
        .unwrap();
    let mut cancelled = 0;
    let mut cancelled_statuses = 0;
    for round in 0..8u64 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, rt) in [&a, &b, &b, &a].into_iter().enumerate() {
            let group = rt.group(rid(id));
            let members = members.clone();
            tasks.spawn(async move {
                tokio::time::sleep(Duration::from_millis(round * 3 % 7)).await;
                if i % 2 == 0 {
                    group
                        .submit(members, &RunOptions::default())
                        .await
                        .map(|()| 0)
                } else {
                    group.cancel().await
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let r = joined.unwrap();
            assert!(r.is_ok(), "round {round}: {r:?}");
            let recorded = r.unwrap();
            assert!(recorded <= N);
            cancelled += recorded;
        }
        let status = a.group(rid(id)).status().await.unwrap();
        assert_counts_consistent(&status, &format!("round {round}"));
        cancelled_statuses += status.cancelled;
    }
    // The race must have happened: cancellations were recorded and seen.
    assert!(
        cancelled > 0 && cancelled_statuses > 0,
        "no cancellation raced the submissions ({cancelled} requests)"
    );
    let group = a.group(rid(id));
    let mut done = false;
    for round in 0..10 {
        let results = collect_results(&group, 20).await;
        assert_each_member_once(&results, &members, &format!("settle {round}"));
        assert!(results.iter().all(|r| matches!(
            r.termination.status,
            TerminalStatus::Succeeded | TerminalStatus::Cancelled
        )));
        if results
            .iter()
            .all(|r| r.termination.status == TerminalStatus::Succeeded)
        {
            done = true;
            break;
        }
        group.resume(&RunOptions::default()).await.unwrap();
    }
    assert!(done, "the group never completed");
    let run_ids: Vec<RunId> = (0..N)
        .map(|i| member_run_id(id, &format!("m{i:03}")))
        .collect();
    settle_hooks(&tally, &run_ids).await;
    let twice: Vec<String> = run_ids
        .iter()
        .enumerate()
        .filter_map(|(i, run_id)| {
            let n = tally.count(run_id, TerminalStatus::Succeeded);
            (n != 1).then(|| format!("m{i:03} succeeded {n} times"))
        })
        .collect();
    let overlaps = runner.overlaps();
    wa.shutdown().await.unwrap();
    wb.shutdown().await.unwrap();
    assert!(twice.is_empty(), "{}", twice.join("\n"));
    assert_eq!(
        overlaps,
        Vec::<RunId>::new(),
        "a run executed twice at once"
    );
}

// ---------------------------------------------------------------------------
// JobGroup
// ---------------------------------------------------------------------------

/// Executions by label, and the labels that already failed once.
type Executions = (HashMap<String, usize>, HashSet<String>);

/// Job executions by label, and the labels that already failed once.
#[derive(Clone, Default)]
struct JobBook(Arc<Mutex<Executions>>, Arc<Mutex<Vec<String>>>);

impl JobBook {
    fn runs(&self, label: &str) -> usize {
        self.0.lock().unwrap().0.get(label).copied().unwrap_or(0)
    }

    /// The recorded executions of `label`.
    fn log_of(&self, label: &str) -> Vec<String> {
        let prefix = format!("{label}:");
        self.1
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .cloned()
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("chunk error: {0}")]
struct ChunkError(String);

/// Doubles `n`; `flaky` chunks fail permanently on their first execution.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Chunk {
    n: u32,
    flaky: bool,
    key: Option<String>,
}

impl Chunk {
    fn label(&self) -> String {
        format!("chunk {}", self.n)
    }
}

impl Job for Chunk {
    const NAME: &'static str = "attack.chunk";
    type Output = u32;
    type Error = ChunkError;

    async fn run(&self, ctx: JobContext<'_>) -> Result<u32, ChunkError> {
        let fail = {
            let mut book = ctx.state::<JobBook>().0.lock().unwrap();
            *book.0.entry(self.label()).or_default() += 1;
            self.flaky && book.1.insert(self.label())
        };
        ctx.state::<JobBook>().1.lock().unwrap().push(format!(
            "{}: run {} job {} attempt {} fails {fail} at {:?}",
            self.label(),
            ctx.run_id,
            ctx.job_id,
            ctx.attempts,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_micros()
                % 100_000_000
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
        if fail {
            return Err(ChunkError(format!("first run of {}", self.n)));
        }
        Ok(self.n * 2)
    }

    fn classify(&self, _: &ChunkError) -> StepErrorKind {
        StepErrorKind::Permanent
    }

    fn idempotency_key(&self) -> Option<String> {
        self.key.clone()
    }
}

fn job_runner(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>, book: &JobBook) -> JobRunner {
    JobRunner::builder(queue.clone(), store.clone())
        .register::<Chunk>()
        .state(book.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_jobs(32)
        .build()
}

/// Concurrent `submit`/`resume` of one job group from two runners over one
/// queue (a real clock): `join` returns every job in submission order under
/// its key (idempotency key, else `item-{i}`), and each job runs once, or
/// twice when its first run failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_group_concurrent_submits_and_resumes_from_two_runners() {
    let (queue, store) = real_clock_queue().await;
    let book = JobBook::default();
    let r1 = job_runner(&queue, &store, &book);
    let r2 = job_runner(&queue, &store, &book);
    let w1 = r1.spawn(std::future::pending::<()>());
    let w2 = r2.spawn(std::future::pending::<()>());
    const N: u32 = 280;
    let jobs: Vec<Chunk> = (0..N)
        .map(|n| Chunk {
            n,
            flaky: n % 6 == 1,
            key: (n % 7 == 3).then(|| format!("ключ/{n}/🔑")),
        })
        .collect();
    let keys: Vec<String> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| j.key.clone().unwrap_or_else(|| format!("item-{i}")))
        .collect();
    let id = rid("job-storm");
    let mut done = false;
    for round in 0..6 {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, runner) in [&r1, &r2, &r1, &r2].into_iter().enumerate() {
            let group = runner.group::<Chunk>(id.clone());
            let jobs = jobs.clone();
            let resume = round > 0 && i >= 2;
            tasks.spawn(async move {
                if resume {
                    group.resume().await
                } else {
                    group.submit(jobs).await
                }
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        }
        let group = r1.group::<Chunk>(id.clone());
        let joined = tokio::time::timeout(Duration::from_secs(20), group.join())
            .await
            .expect("join in time")
            .expect("join");
        let got: Vec<&str> = joined.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(got, keys, "round {round}: join order or keys");
        for (r, job) in joined.iter().zip(&jobs) {
            if let Ok(v) = &r.result {
                assert_eq!(*v, job.n * 2);
            } else {
                assert!(job.flaky, "round {round}: {} failed", r.key);
            }
        }
        if joined.iter().all(|r| r.result.is_ok()) {
            done = true;
            break;
        }
    }
    assert!(done, "the job group never completed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wrong: Vec<String> = jobs
        .iter()
        .filter_map(|j| {
            let runs = book.runs(&j.label());
            let expected = if j.flaky { 2 } else { 1 };
            (runs != expected).then(|| {
                format!(
                    "{}: ran {runs} times, expected {expected}: {:#?}",
                    j.label(),
                    book.log_of(&j.label())
                )
            })
        })
        .collect();
    w1.shutdown().await.unwrap();
    w2.shutdown().await.unwrap();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// An idempotency key equal to another job's positional key is a duplicate
/// member key, and nothing is written.
#[tokio::test(start_paused = true)]
async fn job_group_idempotency_key_colliding_with_a_positional_key_is_a_duplicate() {
    let (queue, store, _clock) = memory_queue().await;
    let book = JobBook::default();
    let runner = job_runner(&queue, &store, &book);
    let group = runner.group::<Chunk>(rid("collide"));
    let jobs = vec![
        Chunk {
            n: 0,
            flaky: false,
            key: None,
        },
        Chunk {
            n: 1,
            flaky: false,
            key: Some("item-0".into()),
        },
    ];
    let submitted = group.submit(jobs).await;
    assert!(
        matches!(&submitted, Err(Error::DuplicateMemberKey(k)) if k == "item-0"),
        "{submitted:?}"
    );
    assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
}

/// A job group of 1000 jobs joins in submission order; a resume re-runs
/// only the failures.
#[tokio::test(start_paused = true)]
async fn a_job_group_of_1000_joins_in_order_and_resumes_only_failures() {
    let (queue, store, _clock) = memory_queue().await;
    let book = JobBook::default();
    let runner = JobRunner::builder(queue.clone(), store.clone())
        .register::<Chunk>()
        .state(book.clone())
        .poll_interval(Duration::from_millis(10))
        .max_concurrent_jobs(64)
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let jobs: Vec<Chunk> = (0..1000)
        .map(|n| Chunk {
            n,
            flaky: n % 50 == 7,
            key: None,
        })
        .collect();
    let group = runner.group::<Chunk>(rid("thousand"));
    group.submit(jobs.clone()).await.unwrap();
    let joined = within(300, group.join()).await.unwrap();
    assert_eq!(joined.len(), 1000);
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(r.key, format!("item-{i}"));
        assert_eq!(r.result.is_ok(), !jobs[i].flaky, "{}", r.key);
    }
    group.resume().await.unwrap();
    let joined = within(300, group.join()).await.unwrap();
    for (i, r) in joined.iter().enumerate() {
        assert_eq!(r.key, format!("item-{i}"));
        assert_eq!(r.result.as_ref().ok(), Some(&(i as u32 * 2)));
    }
    group.submit(jobs.clone()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for j in &jobs {
        assert_eq!(
            book.runs(&j.label()),
            if j.flaky { 2 } else { 1 },
            "{}",
            j.label()
        );
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// kill -9 during a large group submission
// ---------------------------------------------------------------------------

/// The `group_crash_child` binary is killed with SIGKILL while it submits
/// (or resumes) a group of 3000 members, several times, and then finishes
/// the group: every member ends Succeeded, no member's step 0 committed a
/// success twice, each member's step 0 ran in one run (two for members
/// that fail their first run), and no committed step 0 ran again.
#[test]
fn kill9_during_a_3000_member_group_submission_then_resume_completes_each_member_once() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let child = env!("CARGO_BIN_EXE_group_crash_child");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let state = dir.path().join("state");
    let members = std::env::var("GROUP_CRASH_MEMBERS").unwrap_or_else(|_| "3000".into());
    let started = Instant::now();
    // (mode, kill delay in ms after the marker line, marker)
    let plan: &[(&str, u64, &str)] = &[
        ("submit", 0, "SUBMITTING"),
        ("submit", 15, "SUBMITTING"),
        ("resume", 40, "SUBMITTING"),
        ("submit", 90, "SUBMITTING"),
        ("resume", 160, "SUBMITTING"),
        ("resume", 250, "SUBMITTING"),
        ("submit", 400, "SUBMITTING"),
        ("resume", 550, "SUBMITTING"),
        ("resume", 30, "SUBMITTED"),
        ("submit", 5, "SUBMITTING"),
    ];
    let mut notes = Vec::new();
    for (k, (mode, delay, marker)) in plan.iter().enumerate() {
        let log = std::fs::File::create(dir.path().join(format!("child-{k}.log"))).unwrap();
        let mut process = Command::new(child)
            .args(["--store", store.to_str().unwrap()])
            .args(["--state", state.to_str().unwrap()])
            .args(["--members", &members])
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the child");
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let stdout = process.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => {
                    let hit = line.starts_with(marker);
                    seen.push(line);
                    if hit {
                        break;
                    }
                }
                Err(_) => {
                    let _ = process.kill();
                    let log = std::fs::read_to_string(dir.path().join(format!("child-{k}.log")))
                        .unwrap_or_default();
                    panic!("child {k} ({mode}) never printed {marker}: {seen:?}\n{log}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(*delay));
        assert!(
            process.try_wait().unwrap().is_none(),
            "child {k} exited by itself"
        );
        process.kill().unwrap();
        process.wait().unwrap();
        seen.extend(lines.try_iter());
        notes.push(format!(
            "kill {k}: {mode}, {delay} ms after {marker}; child printed {:?}",
            seen
        ));
    }
    let output = Command::new(child)
        .args(["--store", store.to_str().unwrap()])
        .args(["--state", state.to_str().unwrap()])
        .args(["--members", &members])
        .arg("check")
        .output()
        .expect("run the check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{}", notes.join("\n"));
    println!("{stdout}");
    println!("elapsed {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        output.status.success(),
        "check failed ({}):\n{stdout}\n{}",
        output.status,
        stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
}
