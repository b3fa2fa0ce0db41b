//! An approval flow on durable signals, across a restart of the process.
//!
//! Three requests each wait for a decision under the correlation key
//! `approval:{request}`:
//!
//! * `invoice-17` waits (ten minutes at most) and is approved by a signal
//!   sent *after* the restart: the wait registered before it is delivered;
//! * `expense-42` waits two seconds and nobody answers: the timeout runs its
//!   next step without a signal, and it is escalated;
//! * `po-3` is approved *before* its run exists: the signal is buffered and
//!   consumed by the wait, so its next step runs at once.
//!
//! The state lives in a local directory (printed). One command runs both
//! phases, closing the queue in between as a process exit would:
//!
//! ```text
//! cargo run --example durable_approvals
//! ```
//!
//! or as two processes:
//!
//! ```text
//! cargo run --example durable_approvals -- --phase submit
//! cargo run --example durable_approvals -- --phase approve
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba_workflow::{
    NoopTerminalHook, RunId, RunSpec, RunState, SignalOutcome, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};

#[derive(Parser)]
#[command(about = "An approval flow on durable signals, across a restart")]
struct Args {
    /// The directory holding the queue and memos (default: under the
    /// system temp dir).
    #[arg(long)]
    store: Option<PathBuf>,
    /// Which part to run.
    #[arg(long, value_enum, default_value_t = Phase::All)]
    phase: Phase,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Phase {
    /// Submit and wait, then restart and approve.
    All,
    /// Buffer one approval, submit the three requests, stop.
    Submit,
    /// Reopen the store, approve the waiting request, report.
    Approve,
}

/// The requests: id, wait timeout.
const REQUESTS: [(&str, Duration); 3] = [
    ("invoice-17", Duration::from_secs(600)),
    ("expense-42", Duration::from_secs(2)),
    ("po-3", Duration::from_secs(600)),
];

fn approval_key(request: &str) -> String {
    format!("approval:{request}")
}

/// Step 0 asks for approval and waits; step 1 reads the decision (or its
/// absence) and ends the run.
struct ApprovalFlow;

impl StepRunner for ApprovalFlow {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        let (request, timeout_ms) = input
            .split_once('|')
            .and_then(|(r, t)| Some((r.to_string(), t.parse::<u64>().ok()?)))
            .ok_or_else(|| StepError::permanent(format!("malformed request {input:?}")))?;
        match step.step_number {
            0 => {
                println!(
                    "  [{request}] approval requested; waiting up to {:?} on {:?}",
                    Duration::from_millis(timeout_ms),
                    approval_key(&request)
                );
                Ok(StepOutcome::continue_on_signal(
                    step.payload.clone(),
                    approval_key(&request),
                    Duration::from_millis(timeout_ms),
                ))
            }
            _ => match &step.signal {
                Some(decision) => {
                    let decision = String::from_utf8_lossy(decision).into_owned();
                    println!("  [{request}] decision arrived: {decision}");
                    Ok(StepOutcome::Succeed {
                        result: format!("{request}: {decision}").into_bytes(),
                    })
                }
                None => {
                    println!("  [{request}] no decision in time; escalating");
                    Ok(StepOutcome::Fail {
                        reason: format!("{request}: no approval within the timeout, escalated"),
                    })
                }
            },
        }
    }
}

type Runtime = WorkflowRuntime<ApprovalFlow, NoopTerminalHook>;

async fn open(
    dir: &PathBuf,
) -> Result<(Arc<Queue>, Arc<dyn ObjectStore>), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(dir)?);
    let queue = Arc::new(Queue::open(store.clone(), "approvals").await?);
    Ok((queue, store))
}

fn runtime(queue: &Arc<Queue>, store: &Arc<dyn ObjectStore>) -> Runtime {
    WorkflowRuntime::builder(queue.clone(), store.clone(), ApprovalFlow, NoopTerminalHook)
        .poll_interval(Duration::from_millis(200))
        .build()
}

/// Close the queue as a clean process exit would.
async fn close(queue: Arc<Queue>) -> Result<(), Box<dyn std::error::Error>> {
    match Arc::try_unwrap(queue) {
        Ok(queue) => Ok(queue.close().await?),
        Err(_) => Err("the queue is still in use at close".into()),
    }
}

fn run_id(request: &str) -> Result<RunId, Box<dyn std::error::Error>> {
    Ok(RunId::new(request)?)
}

async fn describe(runtime: &Runtime, request: &str) -> Result<String, Box<dyn std::error::Error>> {
    Ok(match runtime.status(&run_id(request)?).await? {
        None => "unknown".to_string(),
        Some(status) => match status.state {
            RunState::Terminated(t) => format!(
                "{} at step {}{}",
                t.status,
                t.final_step,
                t.error.map(|e| format!(" ({e})")).unwrap_or_default()
            ),
            state => format!("{state:?} at step {}", status.current_step),
        },
    })
}

async fn submit_phase(dir: &PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    println!("== phase 1: submit (store {})", dir.display());
    let (queue, store) = open(dir).await?;
    let runtime = runtime(&queue, &store);
    let worker = runtime.spawn(std::future::pending::<()>());

    // po-3 is approved before anyone waits for it.
    let outcome = runtime
        .signal(&approval_key("po-3"), b"approved by bob (early)".to_vec())
        .await?;
    println!("signal for po-3 before its run exists: {outcome:?}");
    assert_eq!(outcome, SignalOutcome::Buffered);

    for (request, timeout) in REQUESTS {
        let submitted = runtime
            .submit(RunSpec {
                run_id: Some(run_id(request)?),
                input: format!("{request}|{}", timeout.as_millis()).into_bytes(),
                ..Default::default()
            })
            .await?;
        println!(
            "submitted {request} (newly submitted: {})",
            submitted.newly_submitted
        );
    }

    // po-3 consumes the buffered signal at once.
    let end = runtime.wait(&run_id("po-3")?).await?;
    println!(
        "po-3 finished before the restart: {}",
        end.termination.status
    );

    // invoice-17 and expense-42 are waiting: a scheduled job each, no
    // worker held. Give them a moment to register, then "exit".
    for request in ["invoice-17", "expense-42"] {
        while runtime
            .status(&run_id(request)?)
            .await?
            .map(|s| s.current_step)
            != Some(1)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for (request, _) in REQUESTS {
        println!("  {request}: {}", describe(&runtime, request).await?);
    }
    worker.shutdown().await?;
    drop(runtime);
    close(queue).await?;
    println!("process stopped; the waits are durable in the store");
    Ok(())
}

async fn approve_phase(dir: &PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    println!("== phase 2: approve (store {})", dir.display());
    let (queue, store) = open(dir).await?;
    let runtime = runtime(&queue, &store);
    let worker = runtime.spawn(std::future::pending::<()>());
    for (request, _) in REQUESTS {
        println!("  {request}: {}", describe(&runtime, request).await?);
    }

    let outcome = runtime
        .signal(&approval_key("invoice-17"), b"approved by alice".to_vec())
        .await?;
    println!("signal for invoice-17 after the restart: {outcome:?}");
    if outcome == SignalOutcome::Buffered {
        println!("  (nobody was waiting: run `--phase submit` first)");
        runtime.clear_signal(&approval_key("invoice-17")).await?;
    }

    println!("waiting for the runs (expense-42 times out 2 s after it started waiting)");
    for (request, _) in REQUESTS {
        match runtime
            .wait_timeout(&run_id(request)?, Duration::from_secs(30))
            .await
        {
            Ok(Some(end)) => {
                let detail = match end.termination.status {
                    TerminalStatus::Succeeded => end
                        .outcome
                        .and_then(|o| o.result)
                        .map(|r| String::from_utf8_lossy(&r).into_owned())
                        .unwrap_or_default(),
                    _ => end.termination.error.unwrap_or_default(),
                };
                println!("  {request}: {} -> {detail}", end.termination.status);
            }
            Ok(None) => println!("  {request}: still waiting"),
            Err(err) => println!("  {request}: {err}"),
        }
    }
    worker.shutdown().await?;
    drop(runtime);
    close(queue).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dir = args
        .store
        .unwrap_or_else(|| std::env::temp_dir().join("taquba-workflow-durable-approvals"));
    println!("store: {}", dir.display());
    match args.phase {
        Phase::All => {
            submit_phase(&dir).await?;
            approve_phase(&dir).await?;
        }
        Phase::Submit => {
            submit_phase(&dir).await?;
            println!(
                "next: cargo run --example durable_approvals -- --phase approve --store {}",
                dir.display()
            );
        }
        Phase::Approve => approve_phase(&dir).await?,
    }
    Ok(())
}
