//! The child process of the kill -9 torture test (`tests/kill9.rs`,
//! `tests/s3.rs`), and a small throughput benchmark.
//!
//! * `work --batch K`: open the store, submit batch `K` (standalone runs
//!   and a group, each submitted at most once thanks to a marker committed
//!   with the submission), signal its runs, and serve every run until
//!   killed. The parent kills it with SIGKILL at a random moment.
//! * `check --batches B`: finish every batch `0..B`, then verify the
//!   invariants and print one `CHECK ...` line; exit status 1 on any
//!   violation.
//! * `bench`: run `--runs` runs of `--steps` steps and print one
//!   `BENCH ...` line with the step transitions per second.
//!
//! Each step reads the KV key its own settlement writes
//! (`app/exec/{run}/{step}`): finding it means a committed step ran again,
//! which is recorded in `{state}/violations.log` (synced before the step
//! goes on). The terminal hook does the same with `app/hook/{run}`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use futures_util::StreamExt;
use taquba::object_store::ObjectStore;
use taquba::{OpenOptions, Queue, QueueConfig, SettlementEffects};
use taquba_workflow::{
    GroupMember, RunId, RunOptions, RunOutcome, RunSpec, Step, StepError, StepOutcome, StepRunner,
    TerminalEffects, TerminalHook, WorkflowRuntime,
};
use taquba_workflow_suite::{open_queue, store_from_env_or_url};

/// The queue's path in the store.
const QUEUE_PATH: &str = "torture-db";
/// The memo prefix.
const MEMO_PREFIX: &str = "torture-memo";
/// Retention of terminated runs' memos and records.
const RETENTION: Duration = Duration::from_secs(2);
/// Members of each batch's group.
const GROUP_MEMBERS: usize = 2;
/// The step that waits for a signal (when a run has more steps).
const SIGNAL_STEP: u32 = 1;

#[derive(Parser)]
struct Cli {
    /// A directory, `file:///dir` or `s3://bucket/prefix`.
    #[arg(long)]
    store: String,
    /// A local directory for the violation log.
    #[arg(long)]
    state: Option<PathBuf>,
    /// Standalone runs per batch.
    #[arg(long, default_value_t = 4)]
    runs: usize,
    /// Steps per run.
    #[arg(long, default_value_t = 6)]
    steps: u32,
    /// The queue's WAL flush interval, in milliseconds: on S3 every flush
    /// is an object, and a restart replays every WAL object since the last
    /// memtable flush, so a longer interval keeps restarts quick.
    #[arg(long, default_value_t = 5)]
    flush_ms: u64,
    /// Simulated work per step, in milliseconds.
    #[arg(long, default_value_t = 10)]
    work_ms: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Submit batch `batch` and serve until killed.
    Work {
        #[arg(long)]
        batch: usize,
    },
    /// Finish batches `0..batches` and verify the invariants.
    Check {
        #[arg(long)]
        batches: usize,
        /// How long to wait for the runs to finish, in seconds.
        #[arg(long, default_value_t = 240)]
        timeout_secs: u64,
    },
    /// Measure step transitions per second.
    Bench,
}

/// An append-only, synced record of invariant violations.
#[derive(Clone)]
struct Violations {
    path: Option<PathBuf>,
}

impl Violations {
    fn record(&self, line: &str) {
        eprintln!("VIOLATION {line}");
        let Some(path) = &self.path else { return };
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut file| {
                writeln!(file, "{line}")?;
                file.sync_data()
            });
        if let Err(err) = written {
            eprintln!("cannot record the violation in {}: {err}", path.display());
        }
    }

    fn read(&self) -> Vec<String> {
        self.path
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map(|s| s.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }
}

fn exec_key(run_id: &str, step: u32) -> Vec<u8> {
    format!("app/exec/{run_id}/{step}").into_bytes()
}

fn done_key(run_id: &str) -> Vec<u8> {
    format!("app/done/{run_id}").into_bytes()
}

fn hook_key(run_id: &str) -> Vec<u8> {
    format!("app/hook/{run_id}").into_bytes()
}

fn signal_key(run_id: &str) -> String {
    format!("sig:{run_id}")
}

/// The result of a run of `steps` steps: the sum of its step numbers.
fn expected_result(steps: u32) -> u64 {
    u64::from(steps) * u64::from(steps.saturating_sub(1)) / 2
}

struct Runner {
    steps: u32,
    work: Duration,
    signals: bool,
    violations: Violations,
}

fn transient(err: impl std::fmt::Display) -> StepError {
    StepError::transient(err.to_string())
}

impl StepRunner for Runner {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let run_id = step.run_id.as_str();
        let n = step.step_number;
        if step
            .kv
            .get(&exec_key(run_id, n))
            .await
            .map_err(transient)?
            .is_some()
        {
            self.violations.record(&format!(
                "step {n} of run {run_id} executed again after its commit"
            ));
        }
        let acc: u64 = std::str::from_utf8(&step.payload)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| StepError::permanent("payload is not a number"))?;
        // The step's work, recorded in its memo so a retry reuses it.
        let next: u64 = step
            .memo
            .memoized("sum", async { Ok::<_, StepError>(acc + u64::from(n)) })
            .await?;
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        step.effects.put(exec_key(run_id, n), b"1".to_vec())?;
        let payload = next.to_string().into_bytes();
        if n + 1 >= self.steps {
            step.effects.put(done_key(run_id), payload.clone())?;
            return Ok(StepOutcome::Succeed { result: payload });
        }
        if self.signals && n == SIGNAL_STEP {
            return Ok(StepOutcome::continue_on_signal(
                payload,
                signal_key(run_id),
                Duration::from_millis(300),
            ));
        }
        if n % 3 == 2 {
            return Ok(StepOutcome::continue_after(
                payload,
                Duration::from_millis(20),
            ));
        }
        Ok(StepOutcome::continue_now(payload))
    }
}

struct Hook {
    queue: Arc<Queue>,
    violations: Violations,
}

impl TerminalHook for Hook {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let key = hook_key(&outcome.run_id);
        if self
            .queue
            .view()
            .kv_get(&key)
            .await
            .map_err(transient)?
            .is_some()
        {
            self.violations.record(&format!(
                "terminal hook of run {} ran again after its commit",
                outcome.run_id
            ));
        }
        effects.put(key, outcome.status.as_str().as_bytes().to_vec())?;
        Ok(())
    }
}

type Runtime = WorkflowRuntime<Runner, Hook>;

fn standalone_ids(batch: usize, runs: usize) -> Vec<RunId> {
    (0..runs)
        .filter_map(|i| RunId::new(format!("b{batch}-r{i}")).ok())
        .collect()
}

fn group_id(batch: usize) -> Result<RunId, taquba_workflow::Error> {
    RunId::new(format!("g{batch}"))
}

fn group_members() -> Vec<GroupMember> {
    (0..GROUP_MEMBERS)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"0".to_vec(),
        })
        .collect()
}

fn options() -> RunOptions {
    RunOptions {
        // Kills interrupt attempts; never let them exhaust a step.
        max_attempts_per_step: Some(1000),
        ..RunOptions::default()
    }
}

/// Submit batch `batch` (each run at most once: the marker commits with
/// the submission) and its group (idempotent). Returns the run ids.
async fn submit_batch(
    runtime: &Runtime,
    queue: &Queue,
    batch: usize,
    runs: usize,
) -> Result<Vec<RunId>, String> {
    let mut ids = Vec::new();
    for run_id in standalone_ids(batch, runs) {
        let marker = format!("app/sub/{run_id}").into_bytes();
        let submitted = queue
            .view()
            .kv_get(&marker)
            .await
            .map_err(|e| e.to_string())?;
        if submitted.is_none() {
            runtime
                .submit(RunSpec {
                    run_id: Some(run_id.clone()),
                    input: b"0".to_vec(),
                    options: options(),
                    effects: SettlementEffects::default().kv_put(marker, b"1".to_vec()),
                })
                .await
                .map_err(|e| format!("submit {run_id}: {e}"))?;
        }
        ids.push(run_id);
    }
    let group = runtime.group(group_id(batch).map_err(|e| e.to_string())?);
    group
        .submit(group_members(), &options())
        .await
        .map_err(|e| format!("submit group {}: {e}", group.id()))?;
    Ok(ids)
}

async fn member_ids(runtime: &Runtime, batch: usize) -> Result<Vec<RunId>, String> {
    let group = runtime.group(group_id(batch).map_err(|e| e.to_string())?);
    let mut ids = Vec::new();
    let results = group.results().await.map_err(|e| e.to_string())?;
    let mut results = std::pin::pin!(results);
    while let Some(result) = results.next().await {
        let result = result.map_err(|e| format!("group {}: {e}", group.id()))?;
        if result.termination.status != taquba_workflow::TerminalStatus::Succeeded {
            return Err(format!(
                "member {} of {} ended {}",
                result.key,
                group.id(),
                result.termination.status
            ));
        }
        ids.push(result.run_id);
    }
    Ok(ids)
}

/// Open the queue on the store of `cli`, with the WAL flushed every
/// `flush` (the benchmark's 1 ms, the torture's 5 ms).
async fn open_store(
    cli: &Cli,
    flush: Duration,
) -> Result<(Arc<Queue>, Arc<dyn ObjectStore>), String> {
    let default_dir = Path::new(&cli.store);
    let store = store_from_env_or_url(Some(&cli.store), default_dir).map_err(|e| e.to_string())?;
    let options = OpenOptions::default()
        .flush_interval(flush)
        .scheduler_interval(Duration::from_millis(20))
        .reaper_interval(Duration::from_millis(500))
        .default_queue_config(
            QueueConfig::default()
                .max_attempts(1000)
                .retry_backoff_base(Duration::from_millis(10))
                .retry_backoff_max(Duration::from_millis(200)),
        );
    let queue = open_queue(store.clone(), QUEUE_PATH, options)
        .await
        .map_err(|e| e.to_string())?;
    Ok((queue, store))
}

async fn open(
    cli: &Cli,
    signals: bool,
) -> Result<(Runtime, Arc<Queue>, Arc<dyn ObjectStore>), String> {
    let (queue, store) = open_store(cli, Duration::from_millis(cli.flush_ms)).await?;
    let violations = Violations {
        path: cli.state.as_ref().map(|dir| dir.join("violations.log")),
    };
    let runner = Runner {
        steps: cli.steps,
        work: Duration::from_millis(cli.work_ms),
        signals,
        violations: violations.clone(),
    };
    let hook = Hook {
        queue: queue.clone(),
        violations,
    };
    let runtime = WorkflowRuntime::builder(queue.clone(), store.clone(), runner, hook)
        .memo_prefix(MEMO_PREFIX)
        .max_concurrent_steps(8)
        .poll_interval(Duration::from_millis(50))
        .memo_retention(RETENTION)
        .build();
    Ok((runtime, queue, store))
}

async fn work(cli: &Cli, batch: usize) -> Result<(), String> {
    let started = Instant::now();
    let (runtime, queue, _store) = open(cli, true).await?;
    println!(
        "OPENED batch={batch} after {} ms",
        started.elapsed().as_millis()
    );
    let worker = runtime.spawn(std::future::pending::<()>());
    let ids = submit_batch(&runtime, &queue, batch, cli.runs).await?;
    println!(
        "SUBMITTED batch={batch} after {} ms",
        started.elapsed().as_millis()
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    for run_id in &ids {
        runtime
            .signal(&signal_key(run_id), b"go".to_vec())
            .await
            .map_err(|e| format!("signal {run_id}: {e}"))?;
    }
    // Serve until killed.
    let _worker = worker;
    std::future::pending::<()>().await;
    Ok(())
}

#[derive(Default)]
struct Summary {
    runs: usize,
    /// Runs the killed children had finished before the check started.
    done_before: usize,
    /// Seconds until forget and retention had removed everything.
    cleanup_secs: f64,
    done: usize,
    wrong_result: usize,
    missing_exec: usize,
    hooks: usize,
    leftovers: usize,
    errors: Vec<String>,
}

async fn check(cli: &Cli, batches: usize, timeout: Duration) -> Result<Summary, String> {
    let (runtime, queue, store) = open(cli, true).await?;
    let worker = runtime.spawn(std::future::pending::<()>());
    let mut summary = Summary {
        done_before: queue
            .view()
            .kv_scan(b"app/done/", .., 1_000_000)
            .await
            .map_err(|e| e.to_string())?
            .entries
            .len(),
        ..Summary::default()
    };
    let mut standalone = Vec::new();
    for batch in 0..batches {
        standalone.extend(submit_batch(&runtime, &queue, batch, cli.runs).await?);
    }
    let mut all = standalone.clone();
    let deadline = Instant::now() + timeout;
    for batch in 0..batches {
        let left = deadline.saturating_duration_since(Instant::now());
        let ids = tokio::time::timeout(left, member_ids(&runtime, batch))
            .await
            .map_err(|_| format!("group g{batch} did not finish within {timeout:?}"))??;
        all.extend(ids);
    }
    summary.runs = all.len();
    let kv = |key: Vec<u8>| {
        let queue = queue.clone();
        async move { queue.view().kv_get(&key).await.map_err(|e| e.to_string()) }
    };
    // Every run terminated with the expected result and its hook committed.
    let expected = expected_result(cli.steps).to_string();
    for run_id in &all {
        loop {
            let done = kv(done_key(run_id)).await?;
            let hook = kv(hook_key(run_id)).await?;
            if let (Some(done), Some(_)) = (&done, &hook) {
                summary.done += 1;
                summary.hooks += 1;
                if done.as_ref() != expected.as_bytes() {
                    summary.wrong_result += 1;
                    summary
                        .errors
                        .push(format!("run {run_id} result {done:?}, expected {expected}"));
                }
                break;
            }
            if Instant::now() > deadline {
                summary.errors.push(format!(
                    "run {run_id} not finished: done={} hook={}",
                    done.is_some(),
                    hook.is_some()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for n in 0..cli.steps {
            if kv(exec_key(run_id, n)).await?.is_none() {
                summary.missing_exec += 1;
                summary
                    .errors
                    .push(format!("run {run_id}: no committed effect of step {n}"));
            }
        }
    }
    // Nothing left behind: forget the groups, drop unconsumed signals, let
    // retention clear the standalone runs.
    for batch in 0..batches {
        let group = runtime.group(group_id(batch).map_err(|e| e.to_string())?);
        group
            .forget()
            .await
            .map_err(|e| format!("forget {}: {e}", group.id()))?;
    }
    for run_id in &standalone {
        runtime
            .clear_signal(&signal_key(run_id))
            .await
            .map_err(|e| format!("clear signal {run_id}: {e}"))?;
    }
    let memo_prefix = taquba::object_store::path::Path::from(MEMO_PREFIX);
    // Retention clears a run 2 s after it ended, a few store calls each.
    let cleanup_started = Instant::now();
    let settle_deadline = cleanup_started + Duration::from_secs(60).max(RETENTION * 10);
    loop {
        let objects: Vec<_> = store.list(Some(&memo_prefix)).collect().await;
        let mut reserved = queue
            .view()
            .kv_scan(b"workflow/", .., 1000)
            .await
            .map_err(|e| e.to_string())?;
        // The runtime's descriptor and its worker record (one each per
        // runtime, for tools) stay.
        reserved.entries.retain(|(key, _)| {
            !key.starts_with(b"workflow/runtimes/") && !key.starts_with(b"workflow/workers/")
        });
        let mut statuses = 0;
        for run_id in &all {
            if runtime
                .status(run_id)
                .await
                .map_err(|e| e.to_string())?
                .is_some()
            {
                statuses += 1;
            }
        }
        let left = objects.len() + reserved.entries.len() + statuses;
        if left == 0 {
            summary.cleanup_secs = cleanup_started.elapsed().as_secs_f64();
            break;
        }
        if Instant::now() > settle_deadline {
            summary.leftovers = left;
            let keys: Vec<String> = reserved
                .entries
                .iter()
                .take(5)
                .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
                .collect();
            summary.errors.push(format!(
                "left behind: {} memo objects, {} reserved KV entries (e.g. {keys:?}), {statuses} run records",
                objects.len(),
                reserved.entries.len()
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.shutdown().await.map_err(|e| e.to_string())?;
    Ok(summary)
}

/// The benchmark's runner (as `examples/bench_steps.rs`): continue at once
/// until the last step, no memo, no effects.
struct BenchRunner {
    steps: u32,
}

impl StepRunner for BenchRunner {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number + 1 >= self.steps {
            Ok(StepOutcome::Succeed { result: Vec::new() })
        } else {
            Ok(StepOutcome::continue_now(step.payload.clone()))
        }
    }
}

async fn bench(cli: &Cli) -> Result<(), String> {
    let (queue, store) = open_store(cli, Duration::from_millis(1)).await?;
    let runtime = WorkflowRuntime::builder(
        queue,
        store.clone(),
        BenchRunner { steps: cli.steps },
        taquba_workflow::NoopTerminalHook,
    )
    .memo_prefix(MEMO_PREFIX)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let started = Instant::now();
    let tag = ulid_like();
    let mut ids = Vec::new();
    for i in 0..cli.runs {
        let run = runtime
            .submit(RunSpec {
                run_id: Some(RunId::new(format!("bench-{tag}-{i}")).map_err(|e| e.to_string())?),
                input: b"0".to_vec(),
                options: options(),
                ..RunSpec::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        ids.push(run.run_id);
    }
    for run_id in &ids {
        let end = runtime.wait(run_id).await.map_err(|e| e.to_string())?;
        if end.termination.status != taquba_workflow::TerminalStatus::Succeeded {
            return Err(format!(
                "bench run {run_id} ended {}",
                end.termination.status
            ));
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let transitions = cli.runs as f64 * f64::from(cli.steps);
    println!(
        "BENCH store={store} runs={} steps={} secs={secs:.3} transitions_per_sec={:.1}",
        cli.runs,
        cli.steps,
        transitions / secs
    );
    worker.shutdown().await.map_err(|e| e.to_string())
}

/// A tag unique to this process run, so benchmark runs never collide.
fn ulid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:x}-{}", std::process::id())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Warnings of the runtime (deferred sweeps, failed settlements) go to
    // stderr, which the parent shows when a check fails.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(state) = &cli.state
        && let Err(err) = std::fs::create_dir_all(state)
    {
        eprintln!("cannot create {}: {err}", state.display());
        return ExitCode::FAILURE;
    }
    let result = match &cli.command {
        Command::Work { batch } => work(&cli, *batch).await,
        Command::Bench => bench(&cli).await,
        Command::Check {
            batches,
            timeout_secs,
        } => match check(&cli, *batches, Duration::from_secs(*timeout_secs)).await {
            Ok(summary) => {
                let violations = Violations {
                    path: cli.state.as_ref().map(|dir| dir.join("violations.log")),
                }
                .read();
                let failures = violations.len() + summary.errors.len();
                println!(
                    "CHECK runs={} done_before_check={} terminated={} hooks={} wrong_results={} missing_effects={} leftovers={} cleanup_secs={:.1} violations={}",
                    summary.runs,
                    summary.done_before,
                    summary.done,
                    summary.hooks,
                    summary.wrong_result,
                    summary.missing_exec,
                    summary.leftovers,
                    summary.cleanup_secs,
                    violations.len()
                );
                for line in violations.iter().chain(summary.errors.iter()).take(20) {
                    println!("  {line}");
                }
                if failures == 0 {
                    Ok(())
                } else {
                    Err(format!("{failures} invariant violations"))
                }
            }
            Err(err) => Err(err),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("torture_child: {err}");
            ExitCode::FAILURE
        }
    }
}
