//! Child workflows: a parent `digest` run starts one child `count_words`
//! run per file (each child's run id is `{parent}--file-{i}`), waits for
//! each child durably, and reports the counts; a child that fails (a file
//! that cannot be read) is reported by the parent, not fatal to it.
//!
//! The state lives in a local directory. Run it again with the same
//! `--store` after killing it (`kill -9`) mid-child and it resumes: the
//! start is idempotent on the run id and input, no child is started twice,
//! and the parent gets every child's end:
//!
//! ```text
//! cargo run --example parent_child -- --store /tmp/pc --slow-ms 3000 README.md Cargo.toml
//! # kill -9 it while a child runs (it prints CHILD_RUNNING), then:
//! cargo run --example parent_child -- --store /tmp/pc README.md Cargo.toml
//! ```
//!
//! (The kill -9 test in `tests/runtime/children.rs` runs this file through
//! the `parent_child_crash` binary.)

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::workflows::{ChildRun, StepContext, Transition, Workflows};
use taquba_workflow::{
    NoopTerminalHook, RunId, RunOptions, RunState, StepError, WorkflowRuntime, workflow,
};

/// How long the parent waits for one child before it gives up on it.
const CHILD_TIMEOUT: Duration = Duration::from_secs(600);
/// A step's lease: a step of a killed process is delivered again this long
/// after its claim.
const LEASE: Duration = Duration::from_secs(3);
/// `--slow-ms`.
static SLOW_MS: AtomicU64 = AtomicU64::new(0);

#[derive(Parser)]
#[command(about = "A parent workflow that counts words in files through child workflows")]
struct Args {
    /// The directory holding the queue and memos (default: under the
    /// system temp dir).
    #[arg(long)]
    store: Option<PathBuf>,
    /// The parent's run id: the same id resumes the same run.
    #[arg(long, default_value = "digest-1")]
    run_id: String,
    /// How long each child's step sleeps before it reads its file (ms), to
    /// leave time to kill the process mid-child (not part of the runs'
    /// input, so a resumed run can go fast).
    #[arg(long, default_value_t = 0)]
    slow_ms: u64,
    /// The files to count (default: this repository's README.md and
    /// Cargo.toml).
    files: Vec<String>,
}

/// What a child counted in one file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Counts {
    path: String,
    lines: u64,
    words: u64,
}

/// The child: counts the lines and words of one file.
#[derive(Default)]
pub struct CountWords;

#[workflow(name = "count_words", output = Counts)]
impl CountWords {
    #[step(start)]
    async fn count(path: String) -> Result<Transition<CountWordsStep>, StepError> {
        println!("CHILD_RUNNING {path}");
        let _ = std::io::stdout().flush();
        tokio::time::sleep(Duration::from_millis(SLOW_MS.load(Ordering::Relaxed))).await;
        let text = tokio::fs::read_to_string(&path)
            .await
            .map_err(|e| StepError::permanent(format!("cannot read {path}: {e}")))?;
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Ok(Transition::done(Counts {
            lines: count(text.lines().count()),
            words: count(text.split_whitespace().count()),
            path,
        }))
    }
}

/// The parent: one child per file, waited for in turn.
#[derive(Default)]
pub struct Digest;

#[workflow(name = "digest", output = String)]
impl Digest {
    /// Start every child in this step's settlement, then wait for the
    /// first.
    #[step(start)]
    async fn start(
        ctx: StepContext<'_>,
        paths: Vec<String>,
    ) -> Result<Transition<DigestStep>, StepError> {
        let mut children = Vec::new();
        for (i, path) in paths.into_iter().enumerate() {
            let input = CountWordsInput { path };
            children.push(ctx.start_child(&format!("file-{i}"), input)?);
        }
        let Some(first) = children.first().cloned() else {
            return Ok(Transition::done("no files".into()));
        };
        let next = DigestStep::Collect {
            children,
            lines: Vec::new(),
        };
        Ok(Transition::on_child(next, &first, CHILD_TIMEOUT))
    }

    /// The child waited for ended (or the wait timed out): note it, then
    /// wait for the next one or report.
    #[step]
    async fn collect(
        ctx: StepContext<'_>,
        children: Vec<ChildRun<CountWords>>,
        mut lines: Vec<String>,
    ) -> Result<Transition<DigestStep>, StepError> {
        let child = &children[lines.len()];
        lines.push(match ctx.child_result(child)? {
            Some(Ok(c)) => format!("{}: {} lines, {} words", c.path, c.lines, c.words),
            Some(Err(failed)) => format!("{}: {failed}", child.id()),
            None => format!("{}: no end within {CHILD_TIMEOUT:?}", child.id()),
        });
        match children.get(lines.len()).cloned() {
            Some(next) => Ok(Transition::on_child(
                DigestStep::Collect { children, lines },
                &next,
                CHILD_TIMEOUT,
            )),
            None => Ok(Transition::done(lines.join("\n"))),
        }
    }
}

/// The example's entry (`pub` so the kill -9 test binary can run it).
#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let dir = args
        .store
        .unwrap_or_else(|| std::env::temp_dir().join("taquba-parent-child"));
    std::fs::create_dir_all(&dir)?;
    println!("state in {}", dir.display());
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&dir)?);
    let options =
        OpenOptions::default().default_queue_config(QueueConfig::default().lease_duration(LEASE));
    let queue = Arc::new(Queue::open_with_options(store.clone(), "queue", options).await?);
    let router = Workflows::builder()
        .register(Digest)
        .register(CountWords)
        .build();
    let runtime = WorkflowRuntime::builder(queue, store, router, NoopTerminalHook)
        .poll_interval(Duration::from_millis(100))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());

    let paths = match args.files.is_empty() {
        true => vec![
            concat!(env!("CARGO_MANIFEST_DIR"), "/README.md").to_string(),
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml").to_string(),
        ],
        false => args.files,
    };
    SLOW_MS.store(args.slow_ms, Ordering::Relaxed);
    let input = DigestInput { paths };
    let run = runtime
        .start_as(RunId::new(args.run_id)?, input, RunOptions::default())
        .await?;
    println!(
        "run {} {}",
        run.id(),
        if run.newly_submitted() {
            "started"
        } else {
            "resumed"
        }
    );
    let report = run.wait().await??;
    println!("RESULT\n{report}");

    // `runs describe` shows the same links.
    if let Some(parent) = runtime.view().run(run.id()).await? {
        for child in &parent.children {
            let state = match runtime.view().run(child).await?.map(|d| d.state) {
                Some(RunState::Terminated(t)) => t.status.to_string(),
                Some(other) => format!("{other:?}"),
                None => "gone".into(),
            };
            println!("CHILD {child} {state}");
        }
    }
    worker.shutdown().await?;
    Ok(())
}
