//! A cluster of worker processes over one local directory, one of them
//! killed with SIGKILL mid-way, and the others taking its shards over.
//!
//! ```text
//! cargo run --release --example cluster -- [--workers P] [--shards N] [--runs R] [--lease-ms MS] [--store DIR]
//! ```
//!
//! The program starts `P` worker processes (this same program, run as
//! `cluster worker ...`), each hosting shards of a cluster of `N` shards in
//! `DIR` (default: a fresh temporary directory) on bucket leases. From this
//! process it submits `R` runs, one per `*.rs` and `*.md` file of this
//! repository, each counting its file's lines, words and bytes in three
//! steps. Once a third of the runs ended it kills the worker holding the
//! most shards with SIGKILL, measures how long the others take to hold its
//! shards, waits for every run, checks each result against the file, stops
//! the workers and prints one JSON line:
//!
//! ```text
//! {"shards":8,"workers":3,"submitted":120,"succeeded":120,"failed":0,"lost":0,"wrong_results":0,"duplicate_settlements":0,"killed":"worker-1","killed_shards":[1,4,6],"takeover_ms":3390,"lease_ms":3000,"elapsed_ms":9120}
//! ```
//!
//! The exit code is 1 when a run was lost, failed, counted wrong or had a
//! committed step executed again.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Duration;

use clap::{Parser, Subcommand};
use taquba_workflow_suite::cluster_demo::{DemoOptions, WorkerArgs, files_under, run_demo, worker};

#[derive(Parser, Debug)]
#[command(about = "Worker processes sharing a cluster's shards; one killed mid-way")]
struct Args {
    #[command(subcommand)]
    role: Option<Role>,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: u32,
    /// Shards of the cluster.
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// Runs (files counted), at most.
    #[arg(long, default_value_t = 120)]
    runs: usize,
    /// The lease time, ms: a worker silent this long is dead.
    #[arg(long, default_value_t = 3000)]
    lease_ms: u64,
    /// The ownership round's interval, ms.
    #[arg(long, default_value_t = 250)]
    check_ms: u64,
    /// Simulated remote work per step, ms.
    #[arg(long, default_value_t = 30)]
    step_ms: u64,
    /// The cluster's directory (default: a fresh temporary one).
    #[arg(long)]
    store: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Run as a worker process (started by the parent).
    Worker {
        /// The worker's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Role::Worker { args }) = args.role {
        return match WorkerArgs::parse(&args) {
            Ok(args) => match worker(args).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("worker: {err}");
                    ExitCode::FAILURE
                }
            },
            Err(err) => {
                eprintln!("worker: {err}");
                ExitCode::from(2)
            }
        };
    }
    let (store, _temp) = match args.store {
        Some(dir) => (dir, None),
        None => match tempfile_dir() {
            Ok((dir, guard)) => (dir, Some(guard)),
            Err(err) => {
                eprintln!("cluster: a temporary directory: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let files = match files_under(&repository, args.runs) {
        Ok(files) => files,
        Err(err) => {
            eprintln!("cluster: listing {}: {err}", repository.display());
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "cluster: {} workers, {} shards, {} runs, lease {} ms, in {}",
        args.workers,
        args.shards,
        files.len(),
        args.lease_ms,
        store.display()
    );
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(err) => {
            eprintln!("cluster: this program's path: {err}");
            return ExitCode::FAILURE;
        }
    };
    let options = DemoOptions {
        store: store.display().to_string(),
        shards: args.shards,
        workers: args.workers,
        files,
        lease_ms: args.lease_ms,
        check_ms: args.check_ms,
        step_ms: args.step_ms,
        kill_at: 1.0 / 3.0,
        deadline: Duration::from_secs(300),
    };
    let summary = run_demo(options, |worker| {
        let mut command = Command::new(&exe);
        command.arg("worker").args(worker.to_args());
        command
    })
    .await;
    match summary {
        Ok(summary) => {
            match serde_json::to_string(&summary) {
                Ok(line) => println!("{line}"),
                Err(err) => eprintln!("cluster: the summary: {err}"),
            }
            let clean = summary.lost == 0
                && summary.failed == 0
                && summary.wrong_results == 0
                && summary.duplicate_settlements == 0
                && summary.succeeded == summary.submitted;
            if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(err) => {
            eprintln!("cluster: {err}");
            ExitCode::FAILURE
        }
    }
}

/// A fresh directory under the system's temporary directory, removed when
/// the guard drops.
fn tempfile_dir() -> std::io::Result<(PathBuf, TempDir)> {
    let dir = std::env::temp_dir().join(format!(
        "taquba-cluster-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    ));
    std::fs::create_dir_all(&dir)?;
    Ok((dir.clone(), TempDir(dir)))
}

/// Removes its directory on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
