//! Fan-out with a job group: count the lines, words and bytes of every
//! `*.rs` and `*.md` file of a directory (default: this repository), one
//! `#[job]` per file, stream the results as they finish and roll them up.
//!
//! The group id derives from the directory, and the group lives in a local
//! store directory, so running the example again (after a kill, say) runs
//! only the members that did not finish: the others are yielded at once
//! from their recorded results.
//!
//! ```text
//! cargo run --example fanout_wordcount
//! # simulate a crash after five results, then finish the rest:
//! cargo run --example fanout_wordcount -- --delay-ms 200 --stop-after 5
//! cargo run --example fanout_wordcount
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba_workflow::jobs::{JobContext, JobRunner};
use taquba_workflow::{Error, RunId, job};

#[derive(Parser)]
#[command(about = "Count words per file with a durable job group")]
struct Args {
    /// The directory to count (default: this repository).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The store directory (default: under the system temp dir).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Files counted at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// A pause per file, to leave time for a kill.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Exit abruptly (no clean shutdown) after this many results, as a
    /// crash would.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Forget the group first and count everything again.
    #[arg(long)]
    fresh: bool,
}

/// The pause before counting each file (runner state, so it is not part
/// of the members' inputs).
struct Delay(Duration);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Counts {
    lines: u64,
    words: u64,
    bytes: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
struct ReadError {
    path: String,
    source: std::io::Error,
}

/// Jobs executed by this process (as opposed to results recorded before).
#[derive(Default)]
struct Executed(AtomicUsize);

/// Count one file: `#[job]` makes the struct `CountWords { root, relative }`
/// from the parameters, with the member key `relative` (the path relative
/// to the counted directory).
#[job(name = "wordcount.file", key = "{relative}", derive(Debug, Clone))]
async fn count_words(
    ctx: JobContext<'_>,
    root: &Path,
    relative: &str,
) -> Result<Counts, ReadError> {
    ctx.state::<Arc<Executed>>()
        .0
        .fetch_add(1, Ordering::SeqCst);
    let delay = ctx.state::<Delay>().0;
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let file = root.join(relative);
    let bytes = tokio::fs::read(&file).await.map_err(|source| ReadError {
        path: file.display().to_string(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(Counts {
        lines: text.lines().count() as u64,
        words: text.split_whitespace().count() as u64,
        bytes: bytes.len() as u64,
    })
}

/// Every `*.rs` / `*.md` file under `root`, skipping build output, VCS
/// metadata and hidden directories, sorted.
fn source_files(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type()?;
            if kind.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    dirs.push(path);
                }
            } else if kind.is_file()
                && path
                    .extension()
                    .is_some_and(|ext| ext == "rs" || ext == "md")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let root = args
        .dir
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .canonicalize()?;
    let store_dir = args
        .store
        .unwrap_or_else(|| std::env::temp_dir().join("taquba-workflow-wordcount"));
    std::fs::create_dir_all(&store_dir)?;
    println!("counting {}", root.display());
    println!("store:   {}", store_dir.display());

    let files = source_files(&root)?;
    let jobs: Vec<CountWords> = files
        .iter()
        .map(|file| CountWords {
            root: root.clone(),
            relative: file
                .strip_prefix(&root)
                .unwrap_or(file)
                .display()
                .to_string(),
        })
        .collect();
    let digest = hex::encode(Sha256::digest(root.display().to_string().as_bytes()));
    let group_id = RunId::new(format!("wordcount-{}", &digest[..24]))?;

    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&store_dir)?);
    let queue = Arc::new(Queue::open(store.clone(), "wordcount").await?);
    let executed = Arc::new(Executed::default());
    let runner = JobRunner::builder(queue, store)
        .register_all()
        .state(executed.clone())
        .state(Delay(Duration::from_millis(args.delay_ms)))
        .max_concurrent_jobs(args.concurrency)
        .poll_interval(Duration::from_millis(100))
        .build();
    let group = runner.group::<CountWords>(group_id.clone());

    if args.fresh {
        // `forget` cancels the members still running, then removes the group.
        group.forget().await?;
        println!("forgot group {group_id}");
    }
    match group.status().await {
        Ok(status) => println!(
            "group {group_id} exists: {} of {} succeeded, {} failed, {} cancelled, {} pending",
            status.succeeded, status.total, status.failed, status.cancelled, status.pending
        ),
        Err(Error::GroupNotFound(_)) => println!("group {group_id} is new"),
        Err(err) => return Err(err.into()),
    }
    match group.submit(jobs.clone()).await {
        Ok(()) => {}
        Err(Error::GroupMismatch(_)) => {
            println!("the file set changed since the group was created: starting afresh");
            group.forget().await?;
            group.submit(jobs).await?;
        }
        Err(err) => return Err(err.into()),
    }
    println!(
        "{} files submitted (members already succeeded are not run again)",
        files.len()
    );
    // The worker starts after the status above, so the counts it printed
    // are those the previous process left.
    let worker = runner.spawn(std::future::pending::<()>());

    let started = Instant::now();
    let mut total = Counts::default();
    let mut per_file: Vec<(String, u64)> = Vec::new();
    let mut failures = 0;
    let mut seen = 0;
    let mut results = std::pin::pin!(group.results().await?);
    while let Some(result) = results.next().await {
        let result = result?;
        seen += 1;
        match result.result {
            Ok(counts) => {
                println!(
                    "[{seen:>3}/{}] {:<50} {:>6} lines {:>7} words",
                    files.len(),
                    result.key,
                    counts.lines,
                    counts.words
                );
                total.lines += counts.lines;
                total.words += counts.words;
                total.bytes += counts.bytes;
                per_file.push((result.key, counts.words));
            }
            Err(error) => {
                failures += 1;
                println!(
                    "[{seen:>3}/{}] {} failed: {}",
                    files.len(),
                    result.key,
                    error.message
                );
            }
        }
        if args.stop_after == Some(seen) {
            println!(
                "stopping abruptly after {seen} results ({} jobs ran in this process); run again to finish",
                executed.0.load(Ordering::SeqCst)
            );
            std::process::exit(1);
        }
    }

    per_file.sort_by_key(|(_, words)| std::cmp::Reverse(*words));
    println!("---");
    println!(
        "{} files, {} lines, {} words, {} bytes ({failures} failed) in {:?}",
        per_file.len(),
        total.lines,
        total.words,
        total.bytes,
        started.elapsed()
    );
    println!(
        "jobs executed by this process: {} (the rest came from recorded results)",
        executed.0.load(Ordering::SeqCst)
    );
    println!("largest files by words:");
    for (file, words) in per_file.iter().take(5) {
        println!("  {words:>7}  {file}");
    }
    worker.shutdown().await?;
    Ok(())
}
