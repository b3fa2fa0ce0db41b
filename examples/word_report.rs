//! The first program to run: a durable multi-step run over real files,
//! written with `#[workflow]`.
//!
//! ```text
//! cargo run --release --example word_report -- [DIR] [--store STORE] [--again] [--slow-ms MS]
//! ```
//!
//! One run counts the lines, words and bytes of every `*.rs` and `*.md` file
//! under `DIR` (default: this repository). Each `#[step]` fn below is a
//! step, and its parameters are what the step carries:
//!
//! * `list` (the start step) lists the files,
//! * `count` counts one file per step, carrying the file list and the
//!   running totals in its fields (the file's figures are memoized, so a
//!   retried step does not read the file twice),
//! * `report` writes a Markdown report and ends the run with a typed
//!   [`Report`].
//!
//! Every step commits to a queue in `STORE`: a local directory (default
//! `<temp>/taquba-word-report`, printed), a `file:///dir` URL, or (built
//! with `--features aws`) an `s3://bucket/prefix` URL. Kill the process at
//! any moment (`kill -9`, Ctrl-C) and run the same command again: the run
//! resumes at its last committed step. A missing directory or an unreadable
//! file ends the run `Failed` with a message naming the path (exit code 1).
//!
//! `word_report_manual.rs` is the same program with a hand-written
//! `StepRunner`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::{Deserialize, Serialize};
use taquba::OpenOptions;
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::{
    MemoStore, NoopTerminalHook, RunId, RunOptions, RunState, StepError, StepErrorKind,
    WorkflowRuntime, workflow,
};
use taquba_workflow_suite::wordcount::{Counts, FileCounts, list_files};
use taquba_workflow_suite::{open_queue, store_from_env_or_url};

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
    /// Where the queue and memos live: a directory, `file:///dir` or
    /// `s3://bucket/prefix` (default: <temp>/taquba-word-report).
    #[arg(long)]
    store: Option<String>,
    /// Pause this long in each counting step, to leave time for a kill.
    #[arg(long, default_value_t = 40)]
    slow_ms: u64,
    /// Start a new run even if the last one for DIR finished.
    #[arg(long)]
    again: bool,
}

/// What a finished run returns.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Where the Markdown report was written.
    path: String,
    /// How many files were counted.
    files: usize,
    /// Their totals.
    totals: Counts,
}

/// The workflow: its fields are the process's configuration, not state of
/// the run (that lives in the steps' fields).
struct WordReport {
    slow: Duration,
    report_path: PathBuf,
}

#[workflow(name = "word-report", output = Report)]
impl WordReport {
    /// Lists the files under `dir`.
    #[step(start)]
    async fn list(
        &self,
        ctx: StepContext<'_>,
        dir: String,
    ) -> Result<Transition<WordReportStep>, StepError> {
        let files = match list_files(Path::new(&dir)) {
            Ok(files) => files,
            Err(e) => {
                return Ok(Transition::fail(format!(
                    "cannot list directory {dir}: {e}"
                )));
            }
        };
        say!(
            "  step {}: found {} files under {dir}",
            ctx.step_number,
            files.len()
        );
        if files.is_empty() {
            return Ok(Transition::next(self.report_step(
                dir,
                Counts::default(),
                Vec::new(),
            )));
        }
        Ok(Transition::next(WordReportStep::Count {
            dir,
            files,
            next: 0,
            totals: Counts::default(),
            done: Vec::new(),
        }))
    }

    /// Counts `files[next]` and adds it to the running totals.
    #[step]
    async fn count(
        &self,
        ctx: StepContext<'_>,
        dir: String,
        files: Vec<String>,
        next: usize,
        mut totals: Counts,
        mut done: Vec<FileCounts>,
    ) -> Result<Transition<WordReportStep>, StepError> {
        let Some(path) = files.get(next).cloned() else {
            return Err(StepError::permanent(format!(
                "no file number {next}: the step is corrupt"
            )));
        };
        tokio::time::sleep(self.slow).await;
        // The figures are memoized: a retry of this step (after a crash
        // before its commit) reads them back instead of the file.
        let counted = ctx
            .memo
            .memoized("counts", async {
                tokio::fs::read(&path)
                    .await
                    .map(|bytes| Counts::of(&bytes))
                    .map_err(|e| StepError::permanent(format!("cannot read {path}: {e}")))
            })
            .await;
        let counts = match counted {
            Ok(counts) => counts,
            Err(e) if e.kind == StepErrorKind::Permanent => return Ok(Transition::fail(e.message)),
            // A transient error (the memo's store) retries the step.
            Err(e) => return Err(e),
        };
        totals.add(counts);
        say!(
            "  step {}: {path}: {} lines, {} words, {} bytes",
            ctx.step_number,
            counts.lines,
            counts.words,
            counts.bytes
        );
        done.push(FileCounts { path, counts });
        if next + 1 < files.len() {
            Ok(Transition::next(WordReportStep::Count {
                dir,
                files,
                next: next + 1,
                totals,
                done,
            }))
        } else {
            Ok(Transition::next(self.report_step(dir, totals, done)))
        }
    }

    /// Writes the Markdown report to `out` and ends the run.
    #[step]
    async fn report(
        ctx: StepContext<'_>,
        dir: &str,
        out: &str,
        totals: Counts,
        done: &[FileCounts],
    ) -> Result<Transition<WordReportStep>, StepError> {
        let mut report = format!(
            "# Word report of {dir}\n\n{} files, {} lines, {} words, {} bytes\n\n| file | lines | words | bytes |\n|---|---:|---:|---:|\n",
            done.len(),
            totals.lines,
            totals.words,
            totals.bytes
        );
        for file in done {
            let shown = file
                .path
                .strip_prefix(dir)
                .unwrap_or(&file.path)
                .trim_start_matches('/');
            report.push_str(&format!(
                "| {shown} | {} | {} | {} |\n",
                file.counts.lines, file.counts.words, file.counts.bytes
            ));
        }
        if let Err(e) = tokio::fs::write(out, report).await {
            return Ok(Transition::fail(format!(
                "cannot write the report {out}: {e}"
            )));
        }
        say!("  step {}: wrote {out}", ctx.step_number);
        Ok(Transition::done(Report {
            path: out.to_string(),
            files: done.len(),
            totals,
        }))
    }
}

impl WordReport {
    fn report_step(&self, dir: String, totals: Counts, done: Vec<FileCounts>) -> WordReportStep {
        WordReportStep::Report {
            dir,
            out: self.report_path.to_string_lossy().into_owned(),
            totals,
            done,
        }
    }
}

/// The run id of a report over `dir`: stable across invocations, so a second
/// invocation resumes the first one's run.
fn run_id_for(dir: &str) -> RunId {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(dir.as_bytes());
    RunId::new(format!("word-report-{}", &hex::encode(digest)[..16])).expect("a valid run id")
}

/// The local directory of a `--store` location (a path or a `file://`
/// URL), where the report goes too; `None` for a bucket.
fn local_dir(location: Option<&str>, default_dir: &Path) -> Option<PathBuf> {
    match location {
        None if std::env::var("AWS_BUCKET").is_ok_and(|b| !b.is_empty()) => None,
        None => Some(default_dir.to_path_buf()),
        Some(url) if url.starts_with("file://") => Some(PathBuf::from(&url["file://".len()..])),
        Some(url) if url.contains("://") => None,
        Some(dir) => Some(PathBuf::from(dir)),
    }
}

/// Where the queue keeps memos and run results in the store.
const MEMO_PREFIX: &str = "word-report-memo";

type Runtime = WorkflowRuntime<WordReport, NoopTerminalHook>;

#[tokio::main]
async fn main() -> ExitCode {
    match run_cli(Args::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("word_report: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit code: success, 1 when the run failed, 130 when interrupted.
async fn run_cli(args: Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let dir = args
        .dir
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    // A directory that does not exist is reported by the run itself.
    let dir = std::fs::canonicalize(&dir)
        .unwrap_or(dir)
        .to_string_lossy()
        .into_owned();

    let default_dir = std::env::temp_dir().join("taquba-word-report");
    let location = args.store.as_deref();
    let store = store_from_env_or_url(location, &default_dir)?;
    let local = local_dir(location, &default_dir);
    // The store as the `taquba-workflow` CLI takes it.
    let store_arg = match (&local, location) {
        (Some(path), _) => path.display().to_string(),
        (None, Some(url)) => url.to_string(),
        (None, None) => format!("s3://{}", std::env::var("AWS_BUCKET").unwrap_or_default()),
    };
    say!("state store: {store_arg}");
    // A 5 ms WAL flush interval: each step's commit waits for one flush.
    let options = OpenOptions::default().flush_interval(Duration::from_millis(5));
    let queue = open_queue(store.clone(), "word-report", options).await?;

    let run_id = run_id_for(&dir);
    // The report is a local file: in the store's directory, or in the
    // default directory when the state is in a bucket.
    let report_dir = local.unwrap_or(default_dir);
    std::fs::create_dir_all(&report_dir)?;
    let workflow = WordReport {
        slow: Duration::from_millis(args.slow_ms),
        report_path: report_dir.join(format!("{run_id}.md")),
    };
    let runtime =
        WorkflowRuntime::builder(queue.clone(), store.clone(), workflow, NoopTerminalHook)
            .memo_prefix(MEMO_PREFIX)
            .build();
    let run = runtime.workflow_run::<WordReport>(run_id.clone());

    match runtime.status(&run_id).await? {
        Some(status) => match status.state {
            RunState::Terminated(termination) if !args.again => {
                say!(
                    "run {run_id} already {} at step {}",
                    termination.status,
                    termination.final_step
                );
                let failed = match run.outcome().await? {
                    Some(Ok(report)) => {
                        print_report(&report);
                        false
                    }
                    Some(Err(error)) => {
                        say!("{error}");
                        true
                    }
                    None => false,
                };
                say!("(pass --again to run it anew)");
                print_describe_command(&store_arg, &run_id);
                drop((run, runtime));
                close(queue).await;
                return Ok(if failed {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                });
            }
            RunState::Terminated(_) => {
                // The new run reuses the run id: drop the old run's memos,
                // or its steps would read back the old counts.
                MemoStore::new(store, MEMO_PREFIX)
                    .clear_memos_for_run(&run_id)
                    .await?;
                start(&runtime, &run_id, &dir).await?;
            }
            _ => say!("resuming run {run_id} at step {}", status.current_step),
        },
        None => start(&runtime, &run_id, &dir).await?,
    }

    print_describe_command(&store_arg, &run_id);
    let worker = runtime.spawn(std::future::pending::<()>());
    let result = tokio::select! {
        result = run.wait() => Some(result?),
        () = follow(&runtime, &run_id) => unreachable!("the follower runs until the process ends"),
        _ = tokio::signal::ctrl_c() => None,
    };
    let interrupted = result.is_none();
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
    drop((run, runtime));
    close(queue).await;

    match result {
        None => {
            eprintln!("interrupted: run the same command to resume run {run_id}");
            Ok(ExitCode::from(130))
        }
        Some(Ok(report)) => {
            say!("run {run_id} succeeded");
            print_report(&report);
            Ok(ExitCode::SUCCESS)
        }
        Some(Err(error)) => {
            eprintln!("{error}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn start(runtime: &Runtime, run_id: &RunId, dir: &str) -> taquba_workflow::Result<()> {
    let input = WordReportInput {
        dir: dir.to_string(),
    };
    runtime
        .start_as(run_id.clone(), input, RunOptions::default())
        .await?;
    say!("submitted run {run_id} over {dir}");
    Ok(())
}

/// How to look at the run from another shell, while it runs or after.
fn print_describe_command(store: &str, run_id: &RunId) {
    let store = if store.contains(char::is_whitespace) {
        format!("'{store}'")
    } else {
        store.to_string()
    };
    say!(
        "describe it from another shell: cargo run -q -p taquba-workflow-cli -- --store {store} runs describe {run_id}"
    );
}

fn print_report(report: &Report) {
    say!(
        "{} files, {} lines, {} words, {} bytes; report: {}",
        report.files,
        report.totals.lines,
        report.totals.words,
        report.totals.bytes,
        report.path
    );
}

/// Print each step as it commits (the run's current step advances only when
/// the previous step's settlement committed).
async fn follow(runtime: &Runtime, run_id: &RunId) {
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

async fn close(queue: Arc<taquba::Queue>) {
    match Arc::try_unwrap(queue) {
        Ok(queue) => {
            if let Err(e) = queue.close().await {
                eprintln!("closing the queue failed: {e}");
            }
        }
        Err(_) => eprintln!("the queue is still shared; it closes on exit"),
    }
}
