//! Step-transition benchmark: the runtime against the raw queue loop it
//! stands on, in one process and one run, printing figures and ratios.
//!
//! ```text
//! cargo run --release --example bench_steps [-- --runs 100 --steps 10]
//! ```
//!
//! Every figure is measured here, now: steps/s (wall clock) and CPU µs per
//! step (user + system time of the process, from `getrusage`) for
//! `runs` concurrent runs of `steps` steps whose runner continues at once, on
//! `InMemory` and on a temporary directory, with a 1 ms WAL flush interval.
//! The baseline ("raw") does the same transitions directly on `taquba`:
//! claim, then acknowledge with the next step's enqueue in one transaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::memory::InMemory;
use taquba::object_store::{ObjectStore, ObjectStoreExt};
use taquba::{EnqueueOptions, EnqueueRequest, OpenOptions, Queue, SettlementEffects};
use taquba_workflow::jobs::{Job, JobContext, JobRunner};
use taquba_workflow::{
    GroupMember, HEADER_RUN_ID, HEADER_STEP, NoopTerminalHook, RunOptions, RunSpec, Step,
    StepError, StepOutcome, StepRunner, WorkflowRuntime,
};
use taquba_workflow_suite::measure::calls::CountingStore;
use taquba_workflow_suite::measure::{cpu_micros, rss_kib};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Concurrent runs.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Steps per run.
    #[arg(long, default_value_t = 10)]
    steps: u32,
    /// Jobs for the job and group figures.
    #[arg(long, default_value_t = 2000)]
    jobs: usize,
    /// Concurrent submissions in the jobs figure.
    #[arg(long, default_value_t = 256)]
    submitters: usize,
    /// Members of the group whose peak memory is measured.
    #[arg(long, default_value_t = 10_000)]
    big_group: usize,
    /// Times each step case is measured (on a fresh store each time); the
    /// median is printed, since one run of 1,000 steps lasts ~50 ms.
    #[arg(long, default_value_t = 7)]
    repeat: usize,
    /// Only the step figures (skip jobs and groups).
    #[arg(long)]
    steps_only: bool,
    /// Run one case (on InMemory unless `--dir`): `raw16`, `raw100`,
    /// `shaped100`, `rt16`, `rt100`, `defaults`, `replay`, `memo`,
    /// `history` (interleaved pairs with run history off and on),
    /// `submit_wait` (runs timed from their submission to their result),
    /// `jobs`, `raw_jobs` (a job's transactions and result record straight
    /// on the queue), `calls` (object-store calls per step and per job, by
    /// operation and path), `group`, `raw_group` (a group member's
    /// transactions straight on the queue), `counts` (allocations, context
    /// switches and worker parks per step and per job), `idle_waits` (the
    /// CPU of `--jobs` waits on runs parked on a signal, against the same
    /// runtime idle without them), `latency` (sequential submits) or
    /// `goals` (the issue's goal rows, interleaved, in memory and on a
    /// directory) or `floor` (the CPU row alone beside the queue's floor
    /// under it, cheap enough for many rounds; see `floor_rows`). A case with a
    /// baseline measures it in the same process, interleaved, and prints
    /// the ratio, unless `--bare`.
    #[arg(long)]
    only: Option<String>,
    /// With `--only`: on a temporary directory instead of InMemory.
    #[arg(long)]
    dir: bool,
    /// With `--only`: the case alone, without its baseline (for instruction
    /// counts under valgrind).
    #[arg(long)]
    bare: bool,
    /// Sequential submissions in the latency figure.
    #[arg(long, default_value_t = 1000)]
    sequential: usize,
    /// The WAL flush interval every store is opened with, in ms.
    #[arg(long, default_value_t = 1.0)]
    flush_ms: f64,
}

#[derive(Clone, Copy)]
struct Figure {
    per_sec: f64,
    cpu_us: f64,
}

async fn measure<F: std::future::Future<Output = ()>>(count: u64, f: F) -> Figure {
    let cpu = cpu_micros();
    let start = Instant::now();
    f.await;
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_micros().saturating_sub(cpu) as f64;
    Figure {
        per_sec: count as f64 / secs,
        cpu_us: cpu / count as f64,
    }
}

/// The median of `n` measurements by rate (CPU taken from the same
/// measurement).
async fn median<F, Fut>(n: usize, mut f: F) -> Figure
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Figure>,
{
    let mut figures = Vec::new();
    for _ in 0..n.max(1) {
        figures.push(f().await);
    }
    median_of(figures)
}

/// The median of `figures` (at least one) by rate.
fn median_of(mut figures: Vec<Figure>) -> Figure {
    figures.sort_by(|a, b| a.per_sec.total_cmp(&b.per_sec));
    figures[figures.len() / 2]
}

#[derive(Clone, Copy)]
enum StoreKind {
    Memory,
    Dir,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "InMemory",
            StoreKind::Dir => "temp dir",
        }
    }
}

struct Opened {
    queue: Arc<Queue>,
    store: Arc<dyn ObjectStore>,
}

/// The temporary directories of the stores opened so far, removed when the
/// benchmark ends rather than when their round does: on ext4, creating a
/// file or directory soon after many were deleted costs time in proportion
/// to them (the allocator skips recently deleted inodes, `recently_deleted`
/// in a profile), so a round that followed the removal of the last one's
/// thousands of files would pay for it and be measured slower than it is.
static KEPT_DIRS: std::sync::Mutex<Vec<tempfile::TempDir>> = std::sync::Mutex::new(Vec::new());

async fn open(kind: StoreKind) -> Opened {
    let (store, dir): (Arc<dyn ObjectStore>, _) = match kind {
        StoreKind::Memory => (Arc::new(InMemory::new()), None),
        StoreKind::Dir => {
            let dir = tempfile::tempdir().expect("temp dir");
            (
                Arc::new(LocalFileSystem::new_with_prefix(dir.path()).expect("local store")),
                Some(dir),
            )
        }
    };
    let store = counted(store);
    let options = OpenOptions::default().flush_interval(Duration::from_secs_f64(flush_ms() / 1e3));
    let queue = Queue::open_with_options(store.clone(), "bench", options)
        .await
        .expect("open");
    if let Some(dir) = dir {
        KEPT_DIRS.lock().expect("lock").push(dir);
    }
    Opened {
        queue: Arc::new(queue),
        store,
    }
}

/// Continues until the payload's counter reaches the run's step count.
struct Continue {
    steps: u32,
    memo: bool,
    /// Bytes of the result the last step returns.
    result_len: usize,
}

impl StepRunner for Continue {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if self.memo {
            step.memo.put("m", &step.payload).await?;
        }
        if step.step_number + 1 >= self.steps {
            Ok(StepOutcome::Succeed {
                result: vec![7; self.result_len],
            })
        } else {
            Ok(StepOutcome::continue_now(step.payload.clone()))
        }
    }
}

#[derive(Clone, Copy)]
struct RuntimeCase {
    in_flight: Option<usize>,
    replay: bool,
    memo: bool,
    /// Run history off (`history_limit(0)`) instead of the default.
    no_history: bool,
}

impl RuntimeCase {
    /// The runtime's defaults, `in_flight` steps at a time when given.
    fn plain(in_flight: Option<usize>) -> Self {
        Self {
            in_flight,
            replay: false,
            memo: false,
            no_history: false,
        }
    }
}

/// What the run history costs: `args.repeat` interleaved rounds of the
/// runtime at its defaults with history off (`history_limit(0)`) and on, each
/// on a fresh store; returns the two medians and the median of the per-round
/// ratios (on / off), which a noisy shared machine disturbs least.
async fn history_cost(kind: StoreKind, args: &Args) -> (Figure, Figure, f64, f64) {
    let (mut offs, mut ons, mut rates, mut cpus) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.repeat.max(1) {
        let off = runtime_steps_once(
            kind,
            args,
            RuntimeCase {
                no_history: true,
                ..RuntimeCase::plain(None)
            },
        )
        .await;
        let on = runtime_steps_once(kind, args, RuntimeCase::plain(None)).await;
        rates.push(on.per_sec / off.per_sec);
        cpus.push(on.cpu_us / off.cpu_us);
        offs.push(off);
        ons.push(on);
    }
    let middle = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median_of(offs), median_of(ons), middle(rates), middle(cpus))
}

/// Print [`history_cost`]'s figures.
async fn history_rows(kind: StoreKind, args: &Args) {
    let (off, on, rate, cpu) = history_cost(kind, args).await;
    row("runtime, defaults, history_limit(0)", off, None);
    row("runtime, defaults (history on) vs off", on, Some(off));
    println!(
        "  run history, median of {} interleaved pairs: {:.3} of the steps/s without it (cost {:+.1}%), CPU per step x{:.3}",
        args.repeat.max(1),
        rate,
        (1.0 - rate) * 100.0,
        cpu
    );
}

/// The median of `args.repeat` measurements of [`runtime_steps_once`].
async fn runtime_steps(kind: StoreKind, args: &Args, case: RuntimeCase) -> Figure {
    median(args.repeat, || runtime_steps_once(kind, args, case)).await
}

async fn runtime_steps_once(kind: StoreKind, args: &Args, case: RuntimeCase) -> Figure {
    let opened = open(kind).await;
    let mut builder = WorkflowRuntime::builder(
        opened.queue.clone(),
        opened.store.clone(),
        Continue {
            steps: args.steps,
            memo: case.memo,
            result_len: 0,
        },
        NoopTerminalHook,
    );
    if let Some(n) = case.in_flight {
        builder = builder.max_concurrent_steps(n);
    }
    if case.replay {
        builder = builder.step_output_replay();
    }
    if case.no_history {
        builder = builder.history_limit(0);
    }
    let runtime = builder.build();
    let ids = submit_runs(&runtime, args.runs).await;
    let total = args.runs as u64 * u64::from(args.steps);
    let figure = measure(total, async {
        let worker = runtime.spawn(std::future::pending::<()>());
        for id in &ids {
            runtime.wait(id).await.expect("wait");
        }
        worker.shutdown().await.expect("shutdown");
    })
    .await;
    drop(runtime);
    figure
}

/// Submit `count` runs with generated ids and empty input, one after the
/// other; their ids in submission order.
async fn submit_runs<R: StepRunner + 'static>(
    runtime: &WorkflowRuntime<R, NoopTerminalHook>,
    count: usize,
) -> Vec<taquba_workflow::RunId> {
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(
            runtime
                .submit(RunSpec::default())
                .await
                .expect("submit")
                .run_id,
        );
    }
    ids
}

/// The raw loop: `in_flight` transitions at a time, each a claim and an
/// acknowledgement carrying the next step's enqueue.
async fn raw_steps(kind: StoreKind, args: &Args, in_flight: usize) -> Figure {
    raw_loop(kind, args, in_flight, false).await
}

/// The raw loop with the runtime's transition shape: runs named by ULIDs
/// on a queue of the runtime's default name, as the runtime's are (both
/// are spelled in most keys a step writes); each next step carries
/// a dedup key, a caller-chosen job id and the seed's reserved headers (run
/// id and step number, see [`reserved_headers`]), each acknowledgement also writes
/// a small KV record (the runtime's current-step pointer), and a run's last
/// one is preceded by its result record and ends it (see
/// [`raw_termination`]). The gap
/// between this and [`raw_steps`] is what the runtime's durable layout
/// costs inside the queue; the gap between this and the runtime is the
/// runtime's own.
async fn raw_shaped_steps(kind: StoreKind, args: &Args, in_flight: usize) -> Figure {
    raw_loop(kind, args, in_flight, true).await
}

/// The median of `args.repeat` measurements of [`raw_loop_once`].
async fn raw_loop(kind: StoreKind, args: &Args, in_flight: usize, shaped: bool) -> Figure {
    median(args.repeat, || raw_loop_once(kind, args, in_flight, shaped)).await
}

async fn raw_loop_once(kind: StoreKind, args: &Args, in_flight: usize, shaped: bool) -> Figure {
    let opened = open(kind).await;
    let queue = opened.queue.clone();
    // The shaped loop names its runs and its queue as the runtime does (a
    // ULID run id, the default queue name): both are spelled in most of the
    // keys and headers a step writes, so their length is part of the
    // layout's cost.
    let name = if shaped { SHAPED_QUEUE } else { "raw" };
    let runs: Arc<Vec<String>> = Arc::new(
        (0..args.runs)
            .map(|run| {
                if shaped {
                    ulid::Ulid::new().to_string()
                } else {
                    run.to_string()
                }
            })
            .collect(),
    );
    for run in 0..args.runs as u32 {
        let mut payload = 0u32.to_le_bytes().to_vec();
        payload.extend_from_slice(&run.to_le_bytes());
        let mut options = EnqueueOptions::default();
        if shaped {
            options = options.headers(reserved_headers(&runs[run as usize], 0));
        }
        queue
            .enqueue_with(name, payload, options)
            .await
            .expect("enqueue");
    }
    let total = args.runs as u64 * u64::from(args.steps);
    let steps = args.steps;
    let store = opened.store.clone();
    measure(
        total,
        raw_worker(queue, name, in_flight, total, move |queue, claim| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
                let step = u32::from_le_bytes(claim.payload[..4].try_into().expect("4 bytes"));
                let index = u32::from_le_bytes(claim.payload[4..8].try_into().expect("4 bytes"));
                let run = &runs[index as usize];
                let mut effects = SettlementEffects::default();
                if shaped && step + 1 >= steps {
                    effects = raw_termination(&store, run, effects).await;
                }
                if step + 1 < steps {
                    let mut payload = (step + 1).to_le_bytes().to_vec();
                    payload.extend_from_slice(&index.to_le_bytes());
                    let mut options = EnqueueOptions::default();
                    if shaped {
                        let id = queue.next_job_id();
                        effects = effects
                            .kv_put(format!("workflow/steps/{run}"), id.clone().into_bytes());
                        options = options
                            .dedup_key(format!("run:{run}:{}", step + 1))
                            .id_override(id)
                            .headers(reserved_headers(run, step + 1));
                    }
                    effects = effects.enqueue(EnqueueRequest {
                        queue: name.into(),
                        payload,
                        options,
                    });
                }
                queue.ack_with(&claim, effects).await.expect("ack");
            }
        }),
    )
    .await
}

/// The queue the shaped loop runs on: the runtime's default queue name.
const SHAPED_QUEUE: &str = "workflow-steps";

/// The headers the seed reserves on every step job (seed-lib.rs, "Reserved
/// headers"): the run id and the step number, which the queue stores with the
/// job and decodes at each claim and settlement.
fn reserved_headers(run: &str, step: u32) -> HashMap<String, String> {
    HashMap::from([
        (HEADER_RUN_ID.to_string(), run.to_string()),
        (HEADER_STEP.to_string(), step.to_string()),
    ])
}

/// What the seed's layout adds to a run's last settlement, straight on the
/// queue: the run result record, an object at
/// `bench-memo/runs/{run}/run.workflow.outcome` written first, then the run
/// record and current-step pointer deleted and a terminal record (~100
/// bytes) written in the settlement's transaction.
async fn raw_termination(
    store: &Arc<dyn ObjectStore>,
    run: &str,
    effects: SettlementEffects,
) -> SettlementEffects {
    let result = taquba::object_store::path::Path::from(format!(
        "bench-memo/runs/{run}/run.workflow.outcome"
    ));
    store
        .put(&result, vec![3u8; 60].into())
        .await
        .expect("result record");
    effects
        .kv_delete(format!("workflow/runs/{run}"))
        .kv_delete(format!("workflow/steps/{run}"))
        .kv_put(format!("workflow/outcomes/{run}"), vec![5u8; 100])
}

/// Claim from the queue `name`, up to `in_flight` jobs at a time (each
/// claim takes every free slot, as the runtime's worker loop does), and
/// run `settle` on each claimed job on its own task, until `total` have
/// been settled.
async fn raw_worker<F, Fut>(
    queue: Arc<Queue>,
    name: &'static str,
    in_flight: usize,
    total: u64,
    settle: F,
) where
    F: Fn(Arc<Queue>, taquba::Claim) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    let slots = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    while !finished.load(Ordering::Relaxed) {
        let first = slots.clone().acquire_owned().await.expect("open");
        let mut permits = vec![first];
        while let Ok(p) = slots.clone().try_acquire_owned() {
            permits.push(p);
        }
        let claims = queue
            .claim_batch(name, permits.len(), Duration::from_secs(30))
            .await
            .expect("claim");
        if claims.is_empty() {
            drop(permits);
            queue.wait_for_jobs_on(name, Duration::from_millis(5)).await;
            continue;
        }
        for (claim, permit) in claims.into_iter().zip(permits) {
            let (queue, settle) = (queue.clone(), settle.clone());
            let (done, finished) = (done.clone(), finished.clone());
            tasks.spawn(async move {
                settle(queue.clone(), claim).await;
                if done.fetch_add(1, Ordering::Relaxed) + 1 == total {
                    finished.store(true, Ordering::Relaxed);
                    queue.enqueue("raw-stop", vec![]).await.ok();
                }
                drop(permit);
            });
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// The queue's floor under a typed job: `args.jobs` one-step jobs straight
/// on taquba, submitted all at once and settled by [`raw_worker`] at 100 in
/// flight, with the store traffic the seed's layout gives a job. Each
/// submission enqueues step 0 under a dedup key, a chosen job id and the
/// reserved headers and writes a run record (~180 bytes) and a current-step
/// pointer, submissions
/// sharing transactions of up to 256, 8 transactions at a time (as the
/// runtime's group commit does); each settlement first writes the run
/// result record, an object at `bench-memo/runs/{id}/run.workflow.outcome`,
/// then acknowledges the job deleting the run record and pointer and writing
/// a terminal record (~100 bytes). Comparing it with
/// [`raw_shaped_steps`] gives what a job costs in steps on the queue alone,
/// under the runtime's job-in-steps ratio.
async fn raw_jobs_once(kind: StoreKind, args: &Args) -> Figure {
    let opened = open(kind).await;
    let (queue, store) = (opened.queue.clone(), opened.store.clone());
    let total = args.jobs as u64;
    measure(total, async move {
        let worker = tokio::spawn(raw_worker(
            queue.clone(),
            "raw",
            100,
            total,
            move |queue, claim| {
                let store = store.clone();
                async move {
                    let run = String::from_utf8(claim.payload.to_vec()).expect("run id");
                    let effects = raw_termination(&store, &run, SettlementEffects::default()).await;
                    queue.ack_with(&claim, effects).await.expect("ack");
                }
            },
        ));
        let submissions = (0..args.jobs).map(|_| {
            let run = ulid::Ulid::new().to_string();
            let id = queue.next_job_id();
            SettlementEffects::default()
                .kv_put(format!("workflow/runs/{run}"), vec![1u8; 180])
                .kv_put(format!("workflow/steps/{run}"), id.clone().into_bytes())
                .enqueue(EnqueueRequest {
                    queue: "raw".into(),
                    payload: run.clone().into_bytes(),
                    options: EnqueueOptions::default()
                        .dedup_key(format!("run:{run}:0"))
                        .id_override(id)
                        .headers(reserved_headers(&run, 0)),
                })
        });
        let batches: Vec<SettlementEffects> = submissions
            .collect::<Vec<_>>()
            .chunks(256)
            .map(|chunk| {
                let mut merged = SettlementEffects::default();
                for effects in chunk {
                    merged.enqueues.extend(effects.enqueues.iter().cloned());
                    merged.kv_writes.extend(effects.kv_writes.clone());
                }
                merged
            })
            .collect();
        futures_util::stream::iter(batches)
            .map(|batch| {
                let queue = queue.clone();
                async move { queue.commit_effects(batch).await.expect("submit") }
            })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        worker.await.expect("worker");
    })
    .await
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Noop {
    i: u64,
}

impl Job for Noop {
    const NAME: &'static str = "bench.noop";
    type Output = u64;
    type Error = std::convert::Infallible;
    async fn run(&self, _ctx: JobContext<'_>) -> Result<u64, Self::Error> {
        Ok(self.i)
    }
}

async fn jobs_per_sec(kind: StoreKind, args: &Args) -> Figure {
    let opened = open(kind).await;
    let runner = JobRunner::builder(opened.queue.clone(), opened.store.clone())
        .register::<Noop>()
        .build();
    let worker = runner.spawn(std::future::pending::<()>());
    let figure = measure(args.jobs as u64, async {
        let handles = futures_util::stream::iter(0..args.jobs as u64)
            .map(|i| {
                let runner = runner.clone();
                async move { runner.submit(Noop { i }).await.expect("submit") }
            })
            .buffer_unordered(args.submitters)
            .collect::<Vec<_>>()
            .await;
        futures_util::stream::iter(handles)
            .map(|h| async move { h.await.expect("job") })
            .buffer_unordered(4096)
            .collect::<Vec<_>>()
            .await;
    })
    .await;
    worker.shutdown().await.expect("shutdown");
    figure
}

struct Echo;

impl StepRunner for Echo {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

async fn group_members(kind: StoreKind, members: usize, sample_memory: bool) -> (Figure, u64) {
    let opened = open(kind).await;
    let runtime = WorkflowRuntime::builder(
        opened.queue.clone(),
        opened.store.clone(),
        Echo,
        NoopTerminalHook,
    )
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.new_group();
    let sampler = sample_memory.then(PeakRss::start);
    let figure = measure(members as u64, async {
        let input: Vec<GroupMember> = (0..members)
            .map(|i| GroupMember {
                key: format!("m{i}"),
                input: i.to_le_bytes().to_vec(),
            })
            .collect();
        group
            .submit(input, &RunOptions::default())
            .await
            .expect("group submit");
        let mut results = group.results().await.expect("results");
        let mut seen = 0;
        while let Some(result) = results.next().await {
            result.expect("member");
            seen += 1;
        }
        assert_eq!(seen, members);
    })
    .await;
    let peak = match sampler {
        Some(sampler) => sampler.finish().await,
        None => 0,
    };
    worker.shutdown().await.expect("shutdown");
    (figure, peak)
}

/// The queue's floor for a group member, in the same process: the
/// transactions and objects a member of [`group_members`] costs, straight on
/// `taquba` and the object store. Members are submitted in chunks of 256,
/// one transaction each (a step-0 enqueue with a caller-chosen id and a
/// dedup key, the pointer, the run record and the member record per
/// member, and the group's counter), while a loop of 100 in flight claims
/// them; each is settled as a run's termination is ([`raw_termination`],
/// with its member record in the acknowledgement); then every
/// member's record is scanned and its result object read back.
async fn raw_group_once(kind: StoreKind, members: usize) -> Figure {
    let opened = open(kind).await;
    let (queue, store) = (opened.queue.clone(), opened.store.clone());
    let record = vec![0u8; 64];
    measure(members as u64, async {
        let worker = tokio::spawn(raw_worker(queue.clone(), "rawg", 100, members as u64, {
            let (store, record) = (store.clone(), record.clone());
            move |queue, claim| {
                let (store, record) = (store.clone(), record.clone());
                async move {
                    let m = u64::from_le_bytes(claim.payload[..8].try_into().expect("8 bytes"));
                    let effects =
                        raw_termination(&store, &m.to_string(), SettlementEffects::default())
                            .await
                            .kv_put(format!("bench/members/{m}"), record);
                    queue.ack_with(&claim, effects).await.expect("ack");
                }
            }
        }));
        let ids: Vec<u64> = (0..members as u64).collect();
        for chunk in ids.chunks(256) {
            let mut effects = SettlementEffects::default();
            for &m in chunk {
                let id = queue.next_job_id();
                effects = effects
                    .enqueue(EnqueueRequest {
                        queue: "rawg".into(),
                        payload: m.to_le_bytes().to_vec(),
                        options: EnqueueOptions::default()
                            .dedup_key(format!("run:{m}:0"))
                            .id_override(id.clone()),
                    })
                    .kv_put(format!("bench/steps/{m}"), id.into_bytes())
                    .kv_put(format!("bench/runs/{m}"), record.clone())
                    .kv_put(format!("bench/members/{m}"), record.clone());
            }
            effects = effects.kv_put("bench/counter", queue.next_job_id().into_bytes());
            queue.commit_effects(effects).await.expect("chunk");
        }
        worker.await.expect("worker");
        let scanned = queue
            .view()
            .kv_scan(b"bench/members/", .., members + 1)
            .await
            .expect("scan");
        assert_eq!(scanned.entries.len(), members);
        futures_util::stream::iter(0..members)
            .map(|m| {
                let store = store.clone();
                async move {
                    let path = taquba::object_store::path::Path::from(format!(
                        "bench-memo/runs/{m}/run.workflow.outcome"
                    ));
                    store
                        .get(&path)
                        .await
                        .expect("get")
                        .bytes()
                        .await
                        .expect("bytes");
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
    })
    .await
}

/// Jobs/s and group members/s against steps/s at the runtime's defaults,
/// all on InMemory, from interleaved rounds.
async fn jobs_and_groups(args: &Args) {
    println!(
        "\n== jobs and groups (InMemory, runtime defaults; {} interleaved rounds of steps, jobs, group; medians)",
        args.repeat
    );
    // Interleaved, so the ratios compare figures taken under the same
    // machine state.
    let (mut steps, mut jobs, mut members) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.repeat.max(1) {
        let case = RuntimeCase::plain(None);
        steps.push(runtime_steps_once(StoreKind::Memory, args, case).await);
        jobs.push(jobs_per_sec(StoreKind::Memory, args).await);
        members.push(group_members(StoreKind::Memory, args.jobs, false).await.0);
    }
    let defaults = median_of(steps);
    row(
        "runtime, defaults (this section's baseline)",
        defaults,
        None,
    );
    row(
        &format!("{} trivial jobs, submitted and awaited vs steps", args.jobs),
        median_of(jobs),
        Some(defaults),
    );
    row(
        &format!("group of {} members, submit + results vs steps", args.jobs),
        median_of(members),
        Some(defaults),
    );
}

/// Samples the process's RSS every 5 ms from `start` to `finish`.
struct PeakRss {
    baseline: u64,
    peak: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    fn start() -> Self {
        let baseline = rss_kib();
        let peak = Arc::new(AtomicU64::new(baseline));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (peak, sampling) = (peak.clone(), sampling.clone());
            tokio::spawn(async move {
                while sampling.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_kib(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        Self {
            baseline,
            peak,
            sampling,
            sampler,
        }
    }

    /// The peak growth over the baseline, in KiB.
    async fn finish(self) -> u64 {
        self.sampling.store(false, Ordering::Relaxed);
        self.sampler.await.ok();
        self.peak
            .load(Ordering::Relaxed)
            .max(rss_kib())
            .saturating_sub(self.baseline)
    }
}

/// Runs timed from their submission to their result, the way an
/// application uses the runtime: `args.runs` runs of `args.steps` steps at
/// the runtime's defaults, submitted at once while the worker runs, each
/// awaited for its outcome. The last step returns an 8-byte result, so
/// every run writes its result record and every wait returns it.
async fn submit_wait_once(kind: StoreKind, args: &Args) -> Figure {
    let opened = open(kind).await;
    let runtime = WorkflowRuntime::builder(
        opened.queue.clone(),
        opened.store.clone(),
        Continue {
            steps: args.steps,
            memo: false,
            result_len: 8,
        },
        NoopTerminalHook,
    )
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let total = args.runs as u64 * u64::from(args.steps);
    let figure = measure(total, async {
        futures_util::stream::iter(0..args.runs)
            .map(|_| {
                let runtime = runtime.clone();
                async move {
                    let id = runtime
                        .submit(RunSpec::default())
                        .await
                        .expect("submit")
                        .run_id;
                    let end = runtime.wait(&id).await.expect("wait");
                    let result = end.outcome.and_then(|outcome| outcome.result);
                    assert_eq!(result.map(|r| r.len()), Some(8), "the run's result");
                }
            })
            .buffer_unordered(args.runs.max(1))
            .collect::<Vec<_>>()
            .await;
    })
    .await;
    worker.shutdown().await.expect("shutdown");
    figure
}

/// Latency percentiles, in ms.
#[derive(Clone, Copy)]
struct Latency {
    p50_ms: f64,
    p90_ms: f64,
}

fn latency_of(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len().saturating_sub(1));
        samples.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    Latency {
        p50_ms: at(0.5),
        p90_ms: at(0.9),
    }
}

/// `args.sequential` submissions one after another (each awaited before
/// the next starts), no worker running: what one caller waits for.
async fn submit_latency(kind: StoreKind, args: &Args) -> Latency {
    let opened = open(kind).await;
    let runtime = WorkflowRuntime::builder(
        opened.queue.clone(),
        opened.store.clone(),
        Echo,
        NoopTerminalHook,
    )
    .build();
    let mut samples = Vec::with_capacity(args.sequential);
    for _ in 0..args.sequential {
        let start = Instant::now();
        runtime.submit(RunSpec::default()).await.expect("submit");
        samples.push(start.elapsed());
    }
    latency_of(samples)
}

/// The queue's floor for [`submit_latency`]: as many sequential commits
/// straight on `taquba`, each of a submission's shape (an enqueue with a
/// caller-chosen id and a dedup key, and two small KV puts: the pointer
/// and the run record).
async fn raw_commit_latency(kind: StoreKind, args: &Args) -> Latency {
    let opened = open(kind).await;
    let queue = opened.queue.clone();
    let mut samples = Vec::with_capacity(args.sequential);
    for run in 0..args.sequential {
        let id = queue.next_job_id();
        let effects = SettlementEffects::default()
            .enqueue(EnqueueRequest {
                queue: "raw".into(),
                payload: Vec::new(),
                options: EnqueueOptions::default()
                    .dedup_key(format!("run:{run}:0"))
                    .id_override(id.clone()),
            })
            .kv_put(format!("bench/steps/{run}"), id.into_bytes())
            .kv_put(format!("bench/runs/{run}"), vec![0; 48]);
        let start = Instant::now();
        queue.commit_effects(effects).await.expect("commit");
        samples.push(start.elapsed());
    }
    latency_of(samples)
}

/// The median, least and greatest of per-round ratios.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            median: values[values.len() / 2],
            min: values[0],
            max: values[values.len() - 1],
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2} [{:.2}–{:.2}]", self.median, self.min, self.max)
    }
}

/// `rounds` interleaved measurements of `base` and `case` (each on a fresh
/// store): their medians and the spread of the per-round ratios of rate
/// and CPU per item (case / base).
async fn paired<B, FB, C, FC>(
    rounds: usize,
    mut base: B,
    mut case: C,
) -> (Figure, Figure, Spread, Spread)
where
    B: FnMut() -> FB,
    FB: std::future::Future<Output = Figure>,
    C: FnMut() -> FC,
    FC: std::future::Future<Output = Figure>,
{
    let (mut bases, mut cases, mut rates, mut cpus) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let b = base().await;
        let c = case().await;
        rates.push(c.per_sec / b.per_sec);
        cpus.push(c.cpu_us / b.cpu_us);
        bases.push(b);
        cases.push(c);
    }
    (
        median_of(bases),
        median_of(cases),
        Spread::of(rates),
        Spread::of(cpus),
    )
}

/// Print a [`paired`] measurement.
fn paired_rows(
    base_label: &str,
    label: &str,
    (base, case, rate, cpu): (Figure, Figure, Spread, Spread),
) {
    row(base_label, base, None);
    row(label, case, Some(base));
    println!("  per-round ratios, median [min–max]: rate {rate}, CPU ×{cpu}");
}

/// Print the sequential-submit latency against the flush interval and the
/// queue's own commit of the same shape.
async fn latency_rows(kind: StoreKind, args: &Args) -> (Latency, Latency) {
    let raw = raw_commit_latency(kind, args).await;
    let ours = submit_latency(kind, args).await;
    println!(
        "{} sequential raw taquba commits (a submission's shape): p50 {:.2} ms, p90 {:.2} ms",
        args.sequential, raw.p50_ms, raw.p90_ms
    );
    println!(
        "{} sequential submits: p50 {:.2} ms ({:.2} flush intervals; raw ×{:.2}), p90 {:.2} ms",
        args.sequential,
        ours.p50_ms,
        ours.p50_ms / flush_ms(),
        ours.p50_ms / raw.p50_ms,
        ours.p90_ms
    );
    (raw, ours)
}

/// The WAL flush interval every store here is opened with, in ms
/// (`--flush-ms`, set once at start).
static FLUSH: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// The counting store of the last store opened, while `calls` counts.
static COUNTING: std::sync::Mutex<Option<CountingStore>> = std::sync::Mutex::new(None);
/// Whether stores are opened behind a [`CountingStore`].
static COUNT: AtomicBool = AtomicBool::new(false);

/// `store`, behind a [`CountingStore`] (kept in [`COUNTING`]) while the
/// `calls` case counts.
fn counted(store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
    if !COUNT.load(Ordering::Relaxed) {
        return store;
    }
    let counting = CountingStore::new(store);
    *COUNTING.lock().expect("lock") = Some(counting.clone());
    Arc::new(counting)
}

/// Print the calls the last store opened counted, per `unit` of `count`.
fn print_calls(label: &str, count: u64, unit: &str) {
    let counting = COUNTING
        .lock()
        .expect("lock")
        .take()
        .expect("a counted store");
    let calls = counting.counts();
    let total: u64 = calls.values().sum();
    println!(
        "{label}: {:.2} store calls per {unit} ({total} for {count})",
        total as f64 / count as f64
    );
    let bytes = counting.put_bytes();
    for ((kind, op), n) in calls {
        let written = match bytes.get(&kind) {
            Some(written) if op == "put" => {
                format!("{:>9.0} bytes per {unit}", *written as f64 / count as f64)
            }
            _ => String::new(),
        };
        println!(
            "  {:<8} {:<28} {:>9.3} per {unit} {written}",
            op,
            if kind.is_empty() { "(root)" } else { &kind },
            n as f64 / count as f64
        );
    }
}

/// The object-store calls of one step (raw loop, runtime at its defaults)
/// and one typed job, counted by operation and path kind.
async fn calls(kind: StoreKind, args: &Args) {
    COUNT.store(true, Ordering::Relaxed);
    let steps = args.runs as u64 * u64::from(args.steps);
    raw_loop_once(kind, args, 100, false).await;
    print_calls("raw taquba loop, 100 in flight", steps, "step");
    raw_loop_once(kind, args, 100, true).await;
    print_calls("raw loop with the runtime's shape", steps, "step");
    runtime_steps_once(kind, args, RuntimeCase::plain(None)).await;
    print_calls("runtime, defaults", steps, "step");
    jobs_per_sec(kind, args).await;
    print_calls("typed jobs", args.jobs as u64, "job");
    COUNT.store(false, Ordering::Relaxed);
}

fn flush_ms() -> f64 {
    *FLUSH.get().unwrap_or(&1.0)
}

/// The issue's goal rows, from interleaved rounds on InMemory and then on a
/// temporary directory (raw loop at 100 in flight, steps at defaults, a
/// burst of typed jobs; on InMemory also runs timed from submit to result
/// and a group), then the sequential-submit latency: each row the median
/// [least–greatest] of the per-round ratios, beside its goal.
async fn goals(args: &Args) {
    let rounds = args.repeat.max(1);
    let flush = flush_ms();
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    for kind in [StoreKind::Memory, StoreKind::Dir] {
        let memory = matches!(kind, StoreKind::Memory);
        println!(
            "\n== goals ({}, {flush} ms WAL flush; {rounds} interleaved rounds; median [min–max] of the per-round ratios)",
            kind.name()
        );
        let (mut steps, mut cpu, mut job_cost, mut job_cpu) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut e2e, mut e2e_cpu, mut group, mut raw_group, mut group_vs_raw) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut raws, mut defaults_all, mut bursts) = (Vec::new(), Vec::new(), Vec::new());
        let (mut floor_cpu, mut over_floor_cpu) = (Vec::new(), Vec::new());
        let (mut job_floor, mut job_floor_cpu) = (Vec::new(), Vec::new());
        let (mut same_concurrency_cpu, mut slots_cpu) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            let raw = raw_loop_once(kind, args, 100, false).await;
            let shaped = raw_loop_once(kind, args, 100, true).await;
            let defaults = runtime_steps_once(kind, args, RuntimeCase::plain(None)).await;
            let wide = runtime_steps_once(kind, args, RuntimeCase::plain(Some(100))).await;
            floor_cpu.push(shaped.cpu_us / raw.cpu_us);
            over_floor_cpu.push(defaults.cpu_us / shaped.cpu_us);
            same_concurrency_cpu.push(wide.cpu_us / shaped.cpu_us);
            slots_cpu.push(defaults.cpu_us / wide.cpu_us);
            let burst = jobs_per_sec(kind, args).await;
            let raw_jobs = raw_jobs_once(kind, args).await;
            job_floor.push(shaped.per_sec / raw_jobs.per_sec);
            job_floor_cpu.push(raw_jobs.cpu_us / shaped.cpu_us);
            steps.push(defaults.per_sec / raw.per_sec);
            cpu.push(defaults.cpu_us / raw.cpu_us);
            // What a job costs in steps: the time (and CPU) of one job over
            // that of one step at defaults.
            job_cost.push(defaults.per_sec / burst.per_sec);
            job_cpu.push(burst.cpu_us / defaults.cpu_us);
            if memory {
                let submitted = submit_wait_once(kind, args).await;
                let members = group_members(kind, args.jobs, false).await.0;
                let raw_members = raw_group_once(kind, args.jobs).await;
                e2e.push(submitted.per_sec / raw.per_sec);
                e2e_cpu.push(submitted.cpu_us / raw.cpu_us);
                group.push(members.per_sec / defaults.per_sec);
                raw_group.push(raw_members.per_sec / raw.per_sec);
                group_vs_raw.push(members.per_sec / raw_members.per_sec);
            }
            raws.push(raw);
            defaults_all.push(defaults);
            bursts.push(burst);
        }
        let (raw, defaults) = (median_of(raws), median_of(defaults_all));
        row("raw taquba loop, 100 in flight", raw, None);
        row("runtime, defaults vs raw 100", defaults, Some(raw));
        row(
            &format!("{} typed jobs at once vs steps", args.jobs),
            median_of(bursts),
            Some(defaults),
        );
        let (steps, cpu) = (Spread::of(steps), Spread::of(cpu));
        let (job_cost, job_cpu) = (Spread::of(job_cost), Spread::of(job_cpu));
        println!(
            "steps at defaults vs raw 100:          {steps} (goal ≥ 0.60) {}",
            verdict(steps.median >= 0.6)
        );
        println!(
            "CPU per step at defaults vs raw 100:  ×{cpu} (goal ≤ 1.50) {}",
            verdict(cpu.median <= 1.5)
        );
        println!(
            "  the queue's floor under it: the raw loop with the runtime's transition shape (ULID run ids on the runtime's queue name, dedup key, chosen job id, reserved headers, pointer write) uses ×{} the raw loop's CPU per step; the runtime at defaults ×{} of that",
            Spread::of(floor_cpu),
            Spread::of(over_floor_cpu)
        );
        println!(
            "  at the same concurrency: the runtime at 100 steps in flight uses ×{} the shaped loop's CPU per step; its default 8 in flight ×{} of that",
            Spread::of(same_concurrency_cpu),
            Spread::of(slots_cpu)
        );
        println!(
            "a typed job's time in steps' (steps/s ÷ jobs/s): {job_cost} (goal ≤ 1.10) {}; its CPU in steps' ×{job_cpu}",
            verdict(job_cost.median <= 1.1)
        );
        println!(
            "  the queue's floor under it: a job's transactions and result record straight on taquba take {} of a shaped raw step's time (CPU ×{})",
            Spread::of(job_floor),
            Spread::of(job_floor_cpu)
        );
        if !memory {
            continue;
        }
        println!(
            "{} runs × {} steps, submit → result vs raw 100: {} (CPU ×{})",
            args.runs,
            args.steps,
            Spread::of(e2e),
            Spread::of(e2e_cpu)
        );
        let group = Spread::of(group);
        println!(
            "group of {} members, submit + results vs steps: {group} (goal ≥ 0.75) {}",
            args.jobs,
            verdict(group.median >= 0.75)
        );
        println!(
            "  the queue's floor: a member's transactions straight on taquba {} of raw 100's steps/s; the group {} of that floor",
            Spread::of(raw_group),
            Spread::of(group_vs_raw)
        );
    }
    let (_, latency) = latency_rows(StoreKind::Memory, args).await;
    let limit = 1.5 * flush + 0.3;
    println!(
        "sequential submit p50 (InMemory): {:.2} ms (goal ≤ 1.5 × {flush} ms + 0.3 ms = {limit:.2} ms) {}",
        latency.p50_ms,
        verdict(latency.p50_ms <= limit)
    );
}

/// The CPU row of the goals alone, with the queue's floor under it: `repeat`
/// interleaved rounds of the raw loop, the shaped loop (the raw loop with
/// the runtime's layout, see [`raw_shaped_steps`]) and the runtime at
/// defaults, each on a fresh store, and the medians of the per-round CPU
/// ratios. Three cases a round instead of the goals' dozen, so many rounds
/// are cheap; run under `taskset -c 0`, every thread shares one core and
/// the figures lose most of the scheduler's noise (cross-core wakeups and
/// migrations that a 2-core VM adds to whichever case they land on).
async fn floor_rows(kind: StoreKind, args: &Args) {
    let (mut floor, mut over, mut total) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.repeat.max(1) {
        let raw = raw_loop_once(kind, args, 100, false).await;
        let shaped = raw_loop_once(kind, args, 100, true).await;
        let defaults = runtime_steps_once(kind, args, RuntimeCase::plain(None)).await;
        floor.push(shaped.cpu_us / raw.cpu_us);
        over.push(defaults.cpu_us / shaped.cpu_us);
        total.push(defaults.cpu_us / raw.cpu_us);
    }
    let total = Spread::of(total);
    println!(
        "CPU per step ({}), median [min–max] of {} rounds' ratios:",
        kind.name(),
        args.repeat.max(1)
    );
    println!(
        "  the queue's floor (shaped loop) vs raw 100: ×{}",
        Spread::of(floor)
    );
    println!(
        "  the runtime at defaults vs that floor:      ×{}",
        Spread::of(over)
    );
    println!(
        "  the runtime at defaults vs raw 100:         ×{total} (goal ≤ 1.50) {}",
        if total.median <= 1.5 {
            "met"
        } else {
            "NOT met"
        }
    );
}

fn row(label: &str, figure: Figure, baseline: Option<Figure>) {
    match baseline {
        Some(base) => println!(
            "{label:<48} {:>9.0}/s {:>8.1} µs CPU   ratio {:>5.2} (CPU ×{:.2})",
            figure.per_sec,
            figure.cpu_us,
            figure.per_sec / base.per_sec,
            figure.cpu_us / base.cpu_us
        ),
        None => println!(
            "{label:<48} {:>9.0}/s {:>8.1} µs CPU",
            figure.per_sec, figure.cpu_us
        ),
    }
}

/// The process's allocator, counting calls while [`COUNT_ALLOCS`] is set (the
/// `counts` case only: a shared counter's cache line would otherwise tax
/// every other case's figures).
struct CountingAlloc;

static COUNT_ALLOCS: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to `System` unchanged; the counters only
// observe.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if COUNT_ALLOCS.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            ALLOC_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is `System`'s.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        if COUNT_ALLOCS.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
            ALLOC_BYTES.fetch_add(new as u64, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// What one measured case did, per step: allocations (and their bytes),
/// context switches (voluntary: a thread blocked; involuntary: preempted),
/// tokio worker parks, CPU µs.
#[derive(Default, Clone, Copy)]
struct Counts {
    allocs: f64,
    bytes: f64,
    voluntary: f64,
    involuntary: f64,
    parks: f64,
    cpu_us: f64,
}

fn process_counters() -> [u64; 6] {
    // SAFETY: as in `cpu_micros`: `getrusage` fills the zeroed struct.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let metrics = tokio::runtime::Handle::current().metrics();
    let parks: u64 = (0..metrics.num_workers())
        .map(|w| metrics.worker_park_count(w))
        .sum();
    [
        ALLOCS.load(Ordering::Relaxed),
        ALLOC_BYTES.load(Ordering::Relaxed),
        usage.ru_nvcsw as u64,
        usage.ru_nivcsw as u64,
        parks,
        cpu_micros(),
    ]
}

/// Run `f` (which does `steps` steps) with the counters on.
async fn counted_case<F: std::future::Future<Output = Figure>>(steps: u64, f: F) -> Counts {
    COUNT_ALLOCS.store(true, Ordering::Relaxed);
    let before = process_counters();
    f.await;
    let after = process_counters();
    COUNT_ALLOCS.store(false, Ordering::Relaxed);
    let per = |i: usize| after[i].saturating_sub(before[i]) as f64 / steps as f64;
    Counts {
        allocs: per(0),
        bytes: per(1),
        voluntary: per(2),
        involuntary: per(3),
        parks: per(4),
        cpu_us: per(5),
    }
}

/// The `counts` case: per step, the raw loop's and the runtime's
/// allocations, context switches and worker parks, each the median of
/// `repeat` interleaved rounds (the figures include each round's set-up:
/// opening the store and submitting the runs).
async fn counts(kind: StoreKind, args: &Args) {
    let steps = args.runs as u64 * u64::from(args.steps);
    let jobs = args.jobs as u64;
    let (mut raws, mut shapeds, mut rts, mut js) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut raw_js = Vec::new();
    for _ in 0..args.repeat.max(1) {
        raws.push(counted_case(steps, raw_loop_once(kind, args, 100, false)).await);
        shapeds.push(counted_case(steps, raw_loop_once(kind, args, 100, true)).await);
        rts.push(
            counted_case(
                steps,
                runtime_steps_once(kind, args, RuntimeCase::plain(None)),
            )
            .await,
        );
        js.push(counted_case(jobs, jobs_per_sec(kind, args)).await);
        raw_js.push(counted_case(jobs, raw_jobs_once(kind, args)).await);
    }
    let median = |v: &[Counts], f: fn(&Counts) -> f64| {
        let mut v: Vec<f64> = v.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{:<28} {:>9} {:>10} {:>9} {:>9} {:>8} {:>8}",
        "per step (per job)", "allocs", "bytes", "vol. cs", "invol. cs", "parks", "CPU µs"
    );
    for (label, v) in [
        ("raw taquba loop, 100", &raws),
        ("raw loop, runtime's shape", &shapeds),
        ("runtime, defaults", &rts),
        ("typed job", &js),
        ("raw job, runtime's layout", &raw_js),
    ] {
        println!(
            "{label:<28} {:>9.1} {:>10.0} {:>9.2} {:>9.2} {:>8.2} {:>8.1}",
            median(v, |c| c.allocs),
            median(v, |c| c.bytes),
            median(v, |c| c.voluntary),
            median(v, |c| c.involuntary),
            median(v, |c| c.parks),
            median(v, |c| c.cpu_us),
        );
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    bench(Args::parse()).await;
    KEPT_DIRS.lock().expect("lock").clear();
}

async fn bench(args: Args) {
    FLUSH.set(args.flush_ms).expect("set once");
    println!(
        "{} runs x {} steps, runner continues at once, {} ms WAL flush; CPU = process user+system time (getrusage); median of {}",
        args.runs, args.steps, args.flush_ms, args.repeat
    );
    if let Some(case) = &args.only {
        let kind = if args.dir {
            StoreKind::Dir
        } else {
            StoreKind::Memory
        };
        let plain = RuntimeCase::plain;
        let rounds = args.repeat;
        if !args.bare {
            let defaults = || runtime_steps_once(kind, &args, plain(None));
            match case.as_str() {
                "submit_wait" => {
                    paired_rows(
                        "raw taquba loop, 100 in flight",
                        "runs timed from submit to result vs raw 100",
                        paired(
                            rounds,
                            || raw_loop_once(kind, &args, 100, false),
                            || submit_wait_once(kind, &args),
                        )
                        .await,
                    );
                    return;
                }
                "floor" => {
                    floor_rows(kind, &args).await;
                    return;
                }
                "jobs" => {
                    paired_rows(
                        "runtime, defaults",
                        &format!("{} jobs at once, each awaited vs steps", args.jobs),
                        paired(rounds, defaults, || jobs_per_sec(kind, &args)).await,
                    );
                    return;
                }
                "group" => {
                    paired_rows(
                        "runtime, defaults",
                        &format!("group of {} members, submit + results vs steps", args.jobs),
                        paired(rounds, defaults, || async {
                            group_members(kind, args.jobs, false).await.0
                        })
                        .await,
                    );
                    paired_rows(
                        "raw queue, a group member's transactions",
                        &format!("group of {} members vs the raw queue's", args.jobs),
                        paired(
                            rounds,
                            || raw_group_once(kind, args.jobs),
                            || async { group_members(kind, args.jobs, false).await.0 },
                        )
                        .await,
                    );
                    return;
                }
                _ => {}
            }
        }
        let figure = match case.as_str() {
            "raw16" => raw_steps(kind, &args, 16).await,
            "raw100" => raw_steps(kind, &args, 100).await,
            "shaped100" => raw_shaped_steps(kind, &args, 100).await,
            "rt16" => runtime_steps(kind, &args, plain(Some(16))).await,
            "rt100" => runtime_steps(kind, &args, plain(Some(100))).await,
            "defaults" => runtime_steps(kind, &args, plain(None)).await,
            "replay" => {
                runtime_steps(
                    kind,
                    &args,
                    RuntimeCase {
                        replay: true,
                        ..RuntimeCase::plain(None)
                    },
                )
                .await
            }
            "history" => {
                history_rows(kind, &args).await;
                return;
            }
            "jobs" => jobs_per_sec(kind, &args).await,
            "raw_jobs" => median(rounds, || raw_jobs_once(kind, &args)).await,
            "submit_wait" => median(rounds, || submit_wait_once(kind, &args)).await,
            "latency" => {
                if args.bare {
                    let latency = submit_latency(kind, &args).await;
                    println!(
                        "sequential submits: p50 {:.2} ms, p90 {:.2} ms",
                        latency.p50_ms, latency.p90_ms
                    );
                } else {
                    latency_rows(kind, &args).await;
                }
                return;
            }
            "goals" => {
                goals(&args).await;
                return;
            }
            "idle_waits" => {
                idle_waits(kind, &args).await;
                return;
            }
            "calls" => {
                calls(kind, &args).await;
                return;
            }
            "counts" => {
                counts(kind, &args).await;
                return;
            }
            "group" => group_members(kind, args.jobs, false).await.0,
            "raw_group" => raw_group_once(kind, args.jobs).await,
            "memo" => {
                runtime_steps(
                    kind,
                    &args,
                    RuntimeCase {
                        memo: true,
                        ..RuntimeCase::plain(None)
                    },
                )
                .await
            }
            other => {
                eprintln!("unknown case {other:?}");
                std::process::exit(2);
            }
        };
        row(case, figure, None);
        return;
    }
    for kind in [StoreKind::Memory, StoreKind::Dir] {
        println!("\n== {}", kind.name());
        let raw16 = raw_steps(kind, &args, 16).await;
        row("raw taquba loop, 16 in flight", raw16, None);
        let raw_full = raw_steps(kind, &args, 100).await;
        row("raw taquba loop, 100 in flight", raw_full, None);
        let shaped = raw_shaped_steps(kind, &args, 100).await;
        row(
            "raw loop, runtime's transition shape, 100 vs raw",
            shaped,
            Some(raw_full),
        );
        let at16 = runtime_steps(kind, &args, RuntimeCase::plain(Some(16))).await;
        row(
            "runtime, max_concurrent_steps 16 vs raw 16",
            at16,
            Some(raw16),
        );
        let at100 = runtime_steps(kind, &args, RuntimeCase::plain(Some(100))).await;
        row(
            "runtime, max_concurrent_steps 100 vs raw 100",
            at100,
            Some(raw_full),
        );
        let defaults = runtime_steps(kind, &args, RuntimeCase::plain(None)).await;
        row("runtime, defaults vs raw 100", defaults, Some(raw_full));
        let submitted = median(args.repeat, || submit_wait_once(kind, &args)).await;
        row(
            "runs timed from submit to result vs raw 100",
            submitted,
            Some(raw_full),
        );
        if matches!(kind, StoreKind::Dir) {
            latency_rows(kind, &args).await;
        }
        let replay = runtime_steps(
            kind,
            &args,
            RuntimeCase {
                replay: true,
                ..RuntimeCase::plain(None)
            },
        )
        .await;
        row(
            "runtime, defaults + step_output_replay vs off",
            replay,
            Some(defaults),
        );
        let memo = runtime_steps(
            kind,
            &args,
            RuntimeCase {
                memo: true,
                ..RuntimeCase::plain(None)
            },
        )
        .await;
        row(
            "runtime, defaults + a memo write per step vs off",
            memo,
            Some(defaults),
        );
        history_rows(kind, &args).await;
        if matches!(kind, StoreKind::Memory) && !args.steps_only {
            // Before the temp-dir cases, whose write-back would slow them.
            jobs_and_groups(&args).await;
            goals(&args).await;
        }
    }
    if args.steps_only {
        return;
    }
    // On a directory: an InMemory store keeps every object it is given in
    // the process's memory, which would be counted as the runtime's.
    let (big, peak_kib) = group_members(StoreKind::Dir, args.big_group, true).await;
    row(
        &format!(
            "group of {} members on a temp dir, submit + results",
            args.big_group
        ),
        big,
        None,
    );
    println!(
        "peak RSS growth during the {}-member group: {} KiB ({:.1} KiB per member)",
        args.big_group,
        peak_kib,
        peak_kib as f64 / args.big_group as f64
    );
    // The same number of runs through the raw queue (an enqueue and two
    // acknowledgements each, with the runtime's dedup keys, ids and pointer
    // writes), after the group: the store's own share of the growth
    // (memtable, caches). Measured second, so the group is not flattered by
    // memory this one freed.
    let raw_args = Args {
        runs: args.big_group,
        steps: 2,
        ..args.clone()
    };
    let sampler = PeakRss::start();
    let raw = raw_loop_once(StoreKind::Dir, &raw_args, 100, true).await;
    let raw_kib = sampler.finish().await;
    row(
        &format!(
            "raw queue, {} runs of 2 steps on a temp dir",
            args.big_group
        ),
        raw,
        None,
    );
    println!(
        "peak RSS growth during the raw queue's {} runs: {} KiB ({:.1} KiB per run)",
        args.big_group,
        raw_kib,
        raw_kib as f64 / args.big_group as f64
    );
}

/// Parks step 0 on a signal keyed by its run id; step 1 succeeds.
struct ParkOnSignal;

impl StepRunner for ParkOnSignal {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number == 0 {
            Ok(StepOutcome::continue_on_signal(
                Vec::new(),
                format!("idle-{}", step.run_id),
                Duration::from_secs(3600),
            ))
        } else {
            Ok(StepOutcome::Succeed { result: Vec::new() })
        }
    }
}

/// The poll interval of the `idle_waits` case (short, so that a few
/// seconds hold many of a wait's looks).
const IDLE_POLL: Duration = Duration::from_millis(50);

/// How long each `idle_waits` window lasts.
const IDLE_WINDOW: Duration = Duration::from_secs(4);

/// The CPU the process spends over [`IDLE_WINDOW`] (µs per second of the
/// window).
async fn idle_cpu() -> f64 {
    let cpu = cpu_micros();
    let start = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    cpu_micros().saturating_sub(cpu) as f64 / start.elapsed().as_secs_f64()
}

/// `--jobs` runs parked on a signal (a step that stays the same for
/// minutes, as an agent waiting for a human or a payment does), each
/// followed by a `wait` in this process: the CPU those waits cost while
/// nothing happens, against the same runtime idle before they started,
/// then the time from signalling every run to the last wait's return.
async fn idle_waits(kind: StoreKind, args: &Args) {
    let opened = open(kind).await;
    let runtime = WorkflowRuntime::builder(
        opened.queue.clone(),
        opened.store.clone(),
        ParkOnSignal,
        NoopTerminalHook,
    )
    .poll_interval(IDLE_POLL)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let ids = submit_runs(&runtime, args.jobs).await;
    // Every run parked on its signal (its pointer names step 1).
    for id in &ids {
        while runtime
            .status(id)
            .await
            .expect("status")
            .is_none_or(|status| status.current_step < 1)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let idle = idle_cpu().await;
    let waits: Vec<_> = ids
        .iter()
        .map(|id| {
            let runtime = runtime.clone();
            let id = id.clone();
            tokio::spawn(async move { runtime.wait(&id).await.expect("wait") })
        })
        .collect();
    // The waits' first looks, then the window.
    tokio::time::sleep(IDLE_POLL * 4).await;
    let waiting = idle_cpu().await;
    let signalled = Instant::now();
    for id in &ids {
        runtime
            .signal(&format!("idle-{id}"), Vec::new())
            .await
            .expect("signal");
    }
    for wait in waits {
        wait.await.expect("the wait's task");
    }
    let ended = signalled.elapsed();
    worker.shutdown().await.expect("shutdown");
    println!(
        "{} runs parked on a signal, poll interval {} ms, {} s windows",
        args.jobs,
        IDLE_POLL.as_millis(),
        IDLE_WINDOW.as_secs()
    );
    println!(
        "runtime idle, no waits                {:>9.0} µs CPU per s",
        idle
    );
    println!(
        "with a wait on every run              {:>9.0} µs CPU per s   ×{:.2} of idle, {:.2} µs per wait per s",
        waiting,
        waiting / idle.max(1.0),
        (waiting - idle).max(0.0) / args.jobs as f64
    );
    println!(
        "signals sent to the last wait's end   {:>9.0} ms",
        ended.as_secs_f64() * 1e3
    );
}
