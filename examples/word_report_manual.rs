//! `word_report` written by hand: the same durable multi-step run over real
//! files, with a hand-written [`StepRunner`] that matches on its own payload
//! enum instead of the `#[workflow]` macro (compare with `word_report.rs`).
//!
//! ```text
//! cargo run --release --example word_report_manual -- [DIR] [--store STORE_DIR] [--again] [--slow-ms MS]
//! ```
//!
//! One run counts the lines, words and bytes of every `*.rs` and `*.md` file
//! under `DIR` (default: this repository):
//!
//! * step 0 lists the files,
//! * steps 1..=N count one file each, carrying the running totals in the
//!   step payload (the file's figures are memoized, so a retried step does
//!   not read the file twice),
//! * the last step writes a Markdown report and succeeds.
//!
//! Every step commits to a queue in `STORE_DIR` (a local directory; the
//! path is printed; default `<temp>/taquba-word-report-manual`, apart from
//! `word_report`'s, whose payloads differ). Kill the process at any moment
//! (`kill -9`, Ctrl-C) and run the same command again: the run resumes at
//! its last committed step. A missing directory or an unreadable file ends
//! the run `Failed` with a message naming the path.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba::{OpenOptions, Queue};
use taquba_workflow::{
    MemoStore, NoopTerminalHook, RunId, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::wordcount::{Counts, FileCounts, list_files};

/// Prints a progress line. Output goes to a terminal or a pipe that may
/// close (`| head`): a failed write is ignored, so it can never fail a step
/// of a durable run.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

#[derive(Parser, Debug)]
#[command(
    about = "Count lines, words and bytes of a directory's *.rs and *.md files as a durable run"
)]
struct Args {
    /// The directory to report on (default: this repository).
    dir: Option<PathBuf>,
    /// Where the queue and memos live (default: <temp>/taquba-word-report-manual).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Pause this long in each counting step, to leave time for a kill.
    #[arg(long, default_value_t = 40)]
    slow_ms: u64,
    /// Start a new run even if the last one for DIR finished.
    #[arg(long)]
    again: bool,
}

/// The payload of every step: where the run is.
#[derive(Debug, Serialize, Deserialize)]
enum Stage {
    /// Step 0: list the files under `dir`.
    List { dir: String },
    /// Count `files[next]`; `done` holds the files counted so far.
    Count {
        dir: String,
        files: Vec<String>,
        next: usize,
        totals: Counts,
        done: Vec<FileCounts>,
    },
    /// Write the report to `out`.
    Report {
        dir: String,
        out: String,
        totals: Counts,
        done: Vec<FileCounts>,
    },
}

fn encode(stage: &Stage) -> Result<Vec<u8>, StepError> {
    rmp_serde::to_vec_named(stage)
        .map_err(|e| StepError::permanent(format!("cannot encode the stage: {e}")))
}

struct WordReport {
    slow: Duration,
    report_path: PathBuf,
}

impl StepRunner for WordReport {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let stage: Stage = rmp_serde::from_slice(&step.payload).map_err(|e| {
            StepError::permanent(format!(
                "step {} has an unreadable payload: {e}",
                step.step_number
            ))
        })?;
        match stage {
            Stage::List { dir } => {
                let files = match list_files(Path::new(&dir)) {
                    Ok(files) => files,
                    Err(e) => {
                        return Ok(StepOutcome::Fail {
                            reason: format!("cannot list directory {dir}: {e}"),
                        });
                    }
                };
                say!(
                    "  step {}: found {} files under {dir}",
                    step.step_number,
                    files.len()
                );
                let next = if files.is_empty() {
                    Stage::Report {
                        out: self.report_path.to_string_lossy().into_owned(),
                        dir,
                        totals: Counts::default(),
                        done: Vec::new(),
                    }
                } else {
                    Stage::Count {
                        dir,
                        files,
                        next: 0,
                        totals: Counts::default(),
                        done: Vec::new(),
                    }
                };
                Ok(StepOutcome::continue_now(encode(&next)?))
            }
            Stage::Count {
                dir,
                files,
                next,
                mut totals,
                mut done,
            } => {
                let path = files[next].clone();
                tokio::time::sleep(self.slow).await;
                // The figures are memoized: a retry of this step (after a
                // crash before its commit) reads them back.
                let counted: Result<Counts, StepError> = step
                    .memo
                    .memoized("counts", async {
                        match tokio::fs::read(&path).await {
                            Ok(bytes) => Ok(Counts::of(&bytes)),
                            Err(e) => Err(StepError::permanent(format!("cannot read {path}: {e}"))),
                        }
                    })
                    .await;
                let counts = match counted {
                    Ok(counts) => counts,
                    Err(e) if e.kind == taquba_workflow::StepErrorKind::Permanent => {
                        return Ok(StepOutcome::Fail { reason: e.message });
                    }
                    Err(e) => return Err(e),
                };
                totals.add(counts);
                say!(
                    "  step {}: {path}: {} lines, {} words, {} bytes",
                    step.step_number,
                    counts.lines,
                    counts.words,
                    counts.bytes
                );
                done.push(FileCounts { path, counts });
                let stage = if next + 1 < files.len() {
                    Stage::Count {
                        dir,
                        files,
                        next: next + 1,
                        totals,
                        done,
                    }
                } else {
                    Stage::Report {
                        dir,
                        out: self.report_path.to_string_lossy().into_owned(),
                        totals,
                        done,
                    }
                };
                Ok(StepOutcome::continue_now(encode(&stage)?))
            }
            Stage::Report {
                dir,
                out,
                totals,
                done,
            } => {
                let mut report = format!(
                    "# Word report of {dir}\n\n{} files, {} lines, {} words, {} bytes\n\n| file | lines | words | bytes |\n|---|---:|---:|---:|\n",
                    done.len(),
                    totals.lines,
                    totals.words,
                    totals.bytes
                );
                for file in &done {
                    let shown = file
                        .path
                        .strip_prefix(&dir)
                        .unwrap_or(&file.path)
                        .trim_start_matches('/');
                    report.push_str(&format!(
                        "| {shown} | {} | {} | {} |\n",
                        file.counts.lines, file.counts.words, file.counts.bytes
                    ));
                }
                if let Err(e) = tokio::fs::write(&out, report).await {
                    return Ok(StepOutcome::Fail {
                        reason: format!("cannot write the report {out}: {e}"),
                    });
                }
                say!("  step {}: wrote {out}", step.step_number);
                Ok(StepOutcome::Succeed {
                    result: out.into_bytes(),
                })
            }
        }
    }
}

/// Where the runtime keeps memos and run results in the store.
const MEMO_PREFIX: &str = "word-report-memo";

/// The run id of a report over `dir`: stable across invocations, so a second
/// invocation resumes the first one's run.
fn run_id_for(dir: &str) -> RunId {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(dir.as_bytes());
    RunId::new(format!("word-report-manual-{}", &hex::encode(digest)[..16]))
        .expect("a valid run id")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dir = args
        .dir
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    // A directory that does not exist is reported by the run itself.
    let dir = std::fs::canonicalize(&dir)
        .unwrap_or(dir)
        .to_string_lossy()
        .into_owned();
    let store_dir = args
        .store
        .unwrap_or_else(|| std::env::temp_dir().join("taquba-word-report-manual"));
    std::fs::create_dir_all(&store_dir)?;
    say!("state store: {}", store_dir.display());

    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&store_dir)?);
    // A 5 ms WAL flush interval: each step's commit waits for one flush.
    let options = OpenOptions::default().flush_interval(Duration::from_millis(5));
    let queue = Arc::new(Queue::open_with_options(store.clone(), "word-report", options).await?);
    let run_id = run_id_for(&dir);
    let report_path = store_dir.join(format!("{run_id}.md"));
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        WordReport {
            slow: Duration::from_millis(args.slow_ms),
            report_path,
        },
        NoopTerminalHook,
    )
    .memo_prefix(MEMO_PREFIX)
    .build();

    match runtime.status(&run_id).await? {
        Some(status) => match status.state {
            RunState::Terminated(termination) if !args.again => {
                say!(
                    "run {run_id} already {} at step {}",
                    termination.status,
                    termination.final_step
                );
                if let Some(outcome) = runtime.outcome(&run_id).await?
                    && let Some(result) = outcome.result
                {
                    say!("report: {}", String::from_utf8_lossy(&result));
                }
                if let Some(error) = &termination.error {
                    say!("error: {error}");
                }
                say!("(pass --again to run it anew)");
                drop(runtime);
                queue_close(queue).await;
                if termination.status != TerminalStatus::Succeeded {
                    std::process::exit(1);
                }
                return Ok(());
            }
            RunState::Terminated(_) => {
                // The new run reuses the run id: drop the old run's memos,
                // or its steps would read back the old counts.
                MemoStore::new(store, MEMO_PREFIX)
                    .clear_memos_for_run(&run_id)
                    .await?;
                submit(&runtime, &run_id, &dir).await?
            }
            _ => say!("resuming run {run_id} at step {}", status.current_step),
        },
        None => submit(&runtime, &run_id, &dir).await?,
    }

    let worker = runtime.spawn(std::future::pending::<()>());
    let follower = follow(&runtime, &run_id);
    let end = tokio::select! {
        end = runtime.wait(&run_id) => Some(end?),
        () = follower => unreachable!("the follower runs until the run ends"),
        _ = tokio::signal::ctrl_c() => None,
    };
    let interrupted = end.is_none();
    if interrupted {
        // The steps in flight finish and commit first; a second Ctrl-C quits
        // at once (those steps then run again on resume).
        eprintln!("stopping after the steps in flight commit (Ctrl-C again to quit now)");
        tokio::spawn(async {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("quitting now: the interrupted step runs again on resume");
            std::process::exit(130);
        });
    }
    // Stop claiming steps and let the steps in flight settle.
    worker.shutdown().await?;
    drop(runtime);
    queue_close(queue).await;
    let Some(end) = end else {
        eprintln!("interrupted: run the same command to resume run {run_id}");
        std::process::exit(130);
    };

    match end.termination.status {
        TerminalStatus::Succeeded => {
            let report = end
                .outcome
                .and_then(|o| o.result)
                .map(|r| String::from_utf8_lossy(&r).into_owned());
            say!(
                "run {run_id} succeeded at step {}",
                end.termination.final_step
            );
            if let Some(report) = report {
                say!("report: {report}");
            }
            Ok(())
        }
        status => {
            eprintln!(
                "run {run_id} {status} at step {}: {}",
                end.termination.final_step,
                end.termination.error.unwrap_or_default()
            );
            std::process::exit(1);
        }
    }
}

async fn submit(
    runtime: &WorkflowRuntime<WordReport, NoopTerminalHook>,
    run_id: &RunId,
    dir: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let input = encode(&Stage::List {
        dir: dir.to_string(),
    })
    .map_err(|e| e.message)?;
    runtime
        .submit(RunSpec {
            run_id: Some(run_id.clone()),
            input,
            ..Default::default()
        })
        .await?;
    say!("submitted run {run_id} over {dir}");
    Ok(())
}

/// Print each step as it commits (the run's current step advances only when
/// the previous step's settlement committed).
async fn follow(runtime: &WorkflowRuntime<WordReport, NoopTerminalHook>, run_id: &RunId) {
    let mut last = None;
    loop {
        if let Ok(Some(status)) = runtime.status(run_id).await
            && !matches!(status.state, RunState::Terminated(_))
        {
            if let Some(previous) = last
                && status.current_step > previous
            {
                for step in previous..status.current_step {
                    say!("✔ step {step} committed");
                }
            }
            last = Some(status.current_step);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn queue_close(queue: Arc<Queue>) {
    match Arc::try_unwrap(queue) {
        Ok(queue) => {
            if let Err(e) = queue.close().await {
                eprintln!("closing the queue failed: {e}");
            }
        }
        Err(_) => eprintln!("the queue is still shared; it closes on exit"),
    }
}
