//! Cluster benchmark: what shards and processes cost and buy, measured in
//! one run on a temporary directory and printed as figures and ratios.
//!
//! ```text
//! cargo run --release --example bench_cluster [-- --runs 400 --steps 10]
//! ```
//!
//! * Step throughput of a cluster of 1 process × 1 shard (the baseline),
//!   1 process × 8 shards and 2 processes × 8 shards: each worker process
//!   (this program, run as `bench_cluster throughput ...`) hosts its
//!   shards by static ownership, submits its share of the runs to them and
//!   waits for them; steps/s is every step over the slowest worker's time.
//! * The idle cost of a shard: a process holding 0, 1, 4 and 16 shards of
//!   a 16-shard cluster, idle; resident memory and CPU time over an idle
//!   window, per shard held.
//! * Takeover after a SIGKILL: the `cluster` example's demonstration with
//!   3 workers on bucket leases; the time until the killed worker's shards
//!   are held again, against the lease time.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use taquba_workflow::cluster::{ClusterRuntime, Ownership, StaticOwnership};
use taquba_workflow::{NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner};
use taquba_workflow_suite::cluster_demo::{DemoOptions, WorkerArgs, files_under, run_demo, worker};
use taquba_workflow_suite::measure::{cpu_micros, rss_kib};
use taquba_workflow_suite::store::dir_store;

#[derive(Parser, Debug)]
#[command(about = "What a cluster's shards and processes cost and buy")]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    /// Runs of the throughput figure (split over the worker processes).
    #[arg(long, default_value_t = 400)]
    runs: usize,
    /// Steps per run.
    #[arg(long, default_value_t = 10)]
    steps: u32,
    /// Idle window of the idle-cost figure, s.
    #[arg(long, default_value_t = 5)]
    idle_secs: u64,
    /// Lease time of the takeover figure, ms.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// A throughput worker: host `ordinal`'s shards, submit `runs` runs of
    /// `steps` steps when told (a line on stdin), print `DONE`.
    Throughput {
        #[arg(long)]
        store: PathBuf,
        #[arg(long)]
        shards: u32,
        #[arg(long)]
        ordinal: u32,
        #[arg(long)]
        replicas: u32,
        #[arg(long)]
        runs: usize,
        #[arg(long)]
        steps: u32,
    },
    /// An idle worker holding shards `0..hold` of a 16-shard cluster.
    Idle {
        #[arg(long)]
        store: PathBuf,
        #[arg(long)]
        hold: u32,
        #[arg(long)]
        secs: u64,
    },
    /// A worker of the takeover demonstration.
    Worker {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Continues until the step number reaches the run's input, then succeeds.
#[derive(Clone)]
struct Steps;

impl StepRunner for Steps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let last: u32 = std::str::from_utf8(&step.payload)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| StepError::permanent("the input is not a step count"))?;
        Ok(if step.step_number + 1 >= last {
            StepOutcome::Succeed { result: Vec::new() }
        } else {
            StepOutcome::continue_now(step.payload.clone())
        })
    }
}

async fn throughput_worker(
    store: &Path,
    shards: u32,
    ordinal: u32,
    replicas: u32,
    runs: usize,
    steps: u32,
) -> Result<(), String> {
    let bucket = dir_store(store).map_err(|err| err.to_string())?;
    let owned = StaticOwnership::ordinal(ordinal, replicas).map_err(|err| err.to_string())?;
    let cluster = ClusterRuntime::builder(bucket, "bench", Steps, NoopTerminalHook)
        .shards(shards)
        .ownership(Ownership::Static(owned))
        .open_options(|_| taquba::OpenOptions::default().flush_interval(Duration::from_millis(1)))
        .configure(|builder| builder.max_concurrent_steps(64))
        .start()
        .await
        .map_err(|err| err.to_string())?;
    println!("READY");
    let mut go = String::new();
    std::io::stdin()
        .read_line(&mut go)
        .map_err(|err| err.to_string())?;
    let (cpu, started) = (cpu_micros(), Instant::now());
    let mut ids = Vec::new();
    for _ in 0..runs {
        let routed = cluster
            .submit(RunSpec {
                input: steps.to_string().into_bytes(),
                ..Default::default()
            })
            .await
            .map_err(|err| err.to_string())?;
        match routed.applied() {
            Some(outcome) => ids.push(outcome.run_id),
            None => return Err("a keyless submission was sent, not committed".into()),
        }
    }
    for id in &ids {
        cluster.wait(id).await.map_err(|err| err.to_string())?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "DONE steps={} secs={secs:.4} cpu_us={}",
        runs as u64 * u64::from(steps),
        cpu_micros().saturating_sub(cpu)
    );
    cluster.shutdown().await.map_err(|err| err.to_string())
}

async fn idle_worker(store: &Path, hold: u32, secs: u64) -> Result<(), String> {
    let bucket = dir_store(store).map_err(|err| err.to_string())?;
    let cluster = ClusterRuntime::builder(bucket, "idle", Steps, NoopTerminalHook)
        .shards(16)
        .ownership(Ownership::Static(StaticOwnership::Shards(
            (0..hold).collect(),
        )))
        .start()
        .await
        .map_err(|err| err.to_string())?;
    // Settle: the opens' allocations and first maintenance rounds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_micros();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    println!(
        "IDLE rss_kib={} cpu_us={}",
        rss_kib(),
        cpu_micros().saturating_sub(cpu)
    );
    cluster.shutdown().await.map_err(|err| err.to_string())
}

/// A line `PREFIX key=value ...` of a child, as pairs.
fn fields(line: &str) -> Vec<(String, f64)> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|pair| pair.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        .collect()
}

fn field(fields: &[(String, f64)], name: &str) -> f64 {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map_or(0.0, |(_, v)| *v)
}

/// Steps/s of `replicas` worker processes over a fresh cluster of
/// `shards`.
fn throughput(exe: &Path, args: &Args, shards: u32, replicas: u32) -> Result<f64, String> {
    let dir = fresh_dir("throughput")?;
    let mut children = Vec::new();
    for ordinal in 0..replicas {
        let mut child = Command::new(exe)
            .arg("throughput")
            .args(["--store", &dir.display().to_string()])
            .args(["--shards", &shards.to_string()])
            .args(["--ordinal", &ordinal.to_string()])
            .args(["--replicas", &replicas.to_string()])
            .args(["--runs", &(args.runs / replicas as usize).to_string()])
            .args(["--steps", &args.steps.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|err| err.to_string())?;
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut line = String::new();
        out.read_line(&mut line).map_err(|err| err.to_string())?;
        if line.trim() != "READY" {
            return Err(format!("worker {ordinal}: {line:?}"));
        }
        children.push((child, out));
    }
    for (child, _) in &mut children {
        let stdin = child.stdin.as_mut().ok_or("no stdin")?;
        writeln!(stdin, "GO").map_err(|err| err.to_string())?;
    }
    let (mut steps, mut slowest) = (0.0, 0.0f64);
    for (mut child, mut out) in children {
        let mut line = String::new();
        out.read_line(&mut line).map_err(|err| err.to_string())?;
        let done = fields(&line);
        steps += field(&done, "steps");
        slowest = slowest.max(field(&done, "secs"));
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(steps / slowest.max(f64::EPSILON))
}

/// Resident KiB and idle CPU µs of a process holding `hold` shards.
fn idle(exe: &Path, args: &Args, hold: u32) -> Result<(f64, f64), String> {
    let dir = fresh_dir("idle")?;
    let output = Command::new(exe)
        .arg("idle")
        .args(["--store", &dir.display().to_string()])
        .args(["--hold", &hold.to_string()])
        .args(["--secs", &args.idle_secs.to_string()])
        .output()
        .map_err(|err| err.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find(|line| line.starts_with("IDLE"))
        .ok_or_else(|| format!("idle worker: {text}"))?;
    let idle = fields(line);
    Ok((field(&idle, "rss_kib"), field(&idle, "cpu_us")))
}

fn fresh_dir(what: &str) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!(
        "taquba-bench-cluster-{what}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).map_err(|err| err.to_string())?;
    Ok(dir)
}

async fn parent(args: Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|err| err.to_string())?;
    println!(
        "step throughput ({} runs × {} steps, worker processes on a local directory):",
        args.runs, args.steps
    );
    let base = throughput(&exe, &args, 1, 1)?;
    println!(
        "  {:<22}{base:>9.0} steps/s  (baseline)",
        "1 process × 1 shard"
    );
    for (replicas, shards) in [(1, 8), (2, 8)] {
        let rate = throughput(&exe, &args, shards, replicas)?;
        let label = format!(
            "{replicas} process{} × {shards} shards",
            if replicas == 1 { "" } else { "es" }
        );
        println!("  {label:<22}{rate:>9.0} steps/s  ×{:.2}", rate / base);
    }

    println!(
        "idle cost of a shard held (a 16-shard cluster, {} s idle window):",
        args.idle_secs
    );
    let (rss0, cpu0) = idle(&exe, &args, 0)?;
    println!(
        "  0 shards   {:>7.1} MiB  {:>6.2}% of a core  (baseline)",
        rss0 / 1024.0,
        cpu0 / (args.idle_secs as f64 * 10_000.0)
    );
    for hold in [1, 4, 16] {
        let (rss, cpu) = idle(&exe, &args, hold)?;
        let per_mib = (rss - rss0) / 1024.0 / f64::from(hold);
        let per_core = (cpu - cpu0) / (args.idle_secs as f64 * 10_000.0) / f64::from(hold);
        println!(
            "  {hold:>2} shards  {:>7.1} MiB  {:>6.2}% of a core  per shard: {per_mib:.2} MiB, {per_core:.3}% of a core; ×{:.2} memory of 0",
            rss / 1024.0,
            cpu / (args.idle_secs as f64 * 10_000.0),
            rss / rss0.max(1.0)
        );
    }

    println!("takeover after a SIGKILL (3 workers, 8 shards, bucket leases):");
    let dir = fresh_dir("takeover")?;
    let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = files_under(&repository, 60).map_err(|err| err.to_string())?;
    let options = DemoOptions {
        store: dir.display().to_string(),
        shards: 8,
        workers: 3,
        files,
        lease_ms: args.lease_ms,
        check_ms: (args.lease_ms / 12).max(50),
        step_ms: 20,
        kill_at: 0.3,
        deadline: Duration::from_secs(120),
    };
    let summary = run_demo(options, |worker| {
        let mut command = Command::new(&exe);
        command.arg("worker").args(worker.to_args());
        command
    })
    .await?;
    let _ = std::fs::remove_dir_all(&dir);
    match summary.takeover_ms {
        Some(ms) => println!(
            "  {ms} ms for {} shards, lease {} ms: ×{:.2} the lease, {} ms past it (goal: within 2000 ms); lost {}, duplicate settlements {}",
            summary.killed_shards.len(),
            args.lease_ms,
            ms as f64 / args.lease_ms as f64,
            ms.saturating_sub(args.lease_ms),
            summary.lost,
            summary.duplicate_settlements
        ),
        None => println!("  not taken over: {summary:?}"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let done = match &args.role {
        Some(Role::Throughput {
            store,
            shards,
            ordinal,
            replicas,
            runs,
            steps,
        }) => throughput_worker(store, *shards, *ordinal, *replicas, *runs, *steps).await,
        Some(Role::Idle { store, hold, secs }) => idle_worker(store, *hold, *secs).await,
        Some(Role::Worker { args }) => match WorkerArgs::parse(args) {
            Ok(args) => worker(args).await,
            Err(err) => Err(err),
        },
        None => parent(args).await,
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench_cluster: {err}");
            ExitCode::FAILURE
        }
    }
}
