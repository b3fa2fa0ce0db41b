//! Work done on another machine reports back through the store: no inbound
//! endpoint, no lease held while it runs.
//!
//! * A run's step 0 writes a request object naming a *reply key*
//!   (`remote/replies/{run_id}`) and a pending marker
//!   (`remote/pending/{run_id}` holding the reply key), then settles with
//!   `continue_on_signal(reply_key)`.
//! * A "remote worker" task (standing in for another machine that shares
//!   only the bucket) picks up requests, does the work and writes the reply
//!   object at the reply key.
//! * A watcher task in this process lists the pending markers and, for each
//!   reply object that has appeared, delivers it as
//!   `runtime.signal(reply_key, bytes)`, then removes marker and reply.
//! * The woken step 1 reads the reply from `Step::signal` and finishes.
//!
//! A reply that lands before the step's wait is registered is buffered and
//! consumed by the wait, so the order of the two never matters.
//!
//! ```text
//! cargo run --example remote_reply
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::TryStreamExt;
use stop_flag::Stop;
use taquba::Queue;
use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::path::Path;
use taquba::object_store::{self, ObjectStore, ObjectStoreExt};
use taquba_workflow::{
    NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
    WorkflowRuntime,
};

#[derive(Parser)]
#[command(about = "A step waits for a reply written by another machine")]
struct Args {
    /// The directory shared with the "remote" worker (default: a fresh
    /// directory under the system temp dir).
    #[arg(long)]
    store: Option<PathBuf>,
}

const REQUESTS: &str = "remote/requests";
const PENDING: &str = "remote/pending";
const REPLIES: &str = "remote/replies";

/// How long a run waits for its reply before failing.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// A request object: the reply key on the first line, the work after it.
fn encode_request(reply_key: &str, text: &str) -> Vec<u8> {
    format!("{reply_key}\n{text}").into_bytes()
}

fn decode_request(bytes: &[u8]) -> Option<(String, String)> {
    let text = String::from_utf8_lossy(bytes);
    let (key, body) = text.split_once('\n')?;
    Some((key.to_string(), body.to_string()))
}

async fn get(store: &dyn ObjectStore, path: &Path) -> Result<Option<Vec<u8>>, object_store::Error> {
    match store.get(path).await {
        Ok(found) => Ok(Some(found.bytes().await?.to_vec())),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(err) => Err(err),
    }
}

async fn list(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<Path>, object_store::Error> {
    store
        .list(Some(&Path::from(prefix)))
        .map_ok(|meta| meta.location)
        .try_collect()
        .await
}

/// Step 0 sends the request and waits for the reply; step 1 reads it.
struct AskRemote {
    store: Arc<dyn ObjectStore>,
}

impl StepRunner for AskRemote {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let text = String::from_utf8_lossy(&step.payload).into_owned();
        if step.step_number == 0 {
            let reply_key = format!("{REPLIES}/{}", step.run_id);
            // Both writes are idempotent, so a retried step repeats them
            // harmlessly.
            let transient = |e: object_store::Error| StepError::transient(e.to_string());
            self.store
                .put(
                    &Path::from(format!("{PENDING}/{}", step.run_id)),
                    reply_key.clone().into_bytes().into(),
                )
                .await
                .map_err(transient)?;
            self.store
                .put(
                    &Path::from(format!("{REQUESTS}/{}", step.run_id)),
                    encode_request(&reply_key, &text).into(),
                )
                .await
                .map_err(transient)?;
            println!(
                "[run {}] sent {text:?}; waiting for {reply_key}",
                step.run_id
            );
            return Ok(StepOutcome::continue_on_signal(
                step.payload.clone(),
                reply_key,
                REPLY_TIMEOUT,
            ));
        }
        match &step.signal {
            Some(reply) => {
                let reply = String::from_utf8_lossy(reply).into_owned();
                println!("[run {}] resumed with the reply {reply:?}", step.run_id);
                Ok(StepOutcome::Succeed {
                    result: reply.into_bytes(),
                })
            }
            None => Ok(StepOutcome::Fail {
                reason: format!("no reply to {text:?} within {REPLY_TIMEOUT:?}"),
            }),
        }
    }
}

/// The other machine: sees only the bucket. Each request is "processed"
/// (word statistics, after a pause) and answered at its reply key.
async fn remote_worker(store: Arc<dyn ObjectStore>, stop: Stop) -> Result<(), object_store::Error> {
    while !stop.is_stopped() {
        for path in list(store.as_ref(), REQUESTS).await? {
            let Some(bytes) = get(store.as_ref(), &path).await? else {
                continue;
            };
            let Some((reply_key, text)) = decode_request(&bytes) else {
                eprintln!("  (remote) malformed request at {path}; skipped");
                store.delete(&path).await?;
                continue;
            };
            println!("  (remote) working on {text:?}");
            tokio::time::sleep(Duration::from_millis(300 + 100 * text.len() as u64 % 500)).await;
            let words = text.split_whitespace().count();
            let longest = text
                .split_whitespace()
                .max_by_key(|w| w.len())
                .unwrap_or_default();
            let reply = format!(
                "{words} words, longest {longest:?}, shouted: {}",
                text.to_uppercase()
            );
            store
                .put(&Path::from(reply_key.as_str()), reply.into_bytes().into())
                .await?;
            store.delete(&path).await?;
            println!("  (remote) replied at {reply_key}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The watcher: turns each reply that appeared for a pending marker into a
/// signal, then removes the marker and the reply.
async fn watcher<R: StepRunner + 'static>(
    runtime: WorkflowRuntime<R, NoopTerminalHook>,
    store: Arc<dyn ObjectStore>,
    stop: Stop,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    while !stop.is_stopped() {
        for marker in list(store.as_ref(), PENDING).await? {
            let Some(reply_key) = get(store.as_ref(), &marker).await? else {
                continue;
            };
            let reply_key = String::from_utf8_lossy(&reply_key).into_owned();
            let reply_path = Path::from(reply_key.as_str());
            let Some(reply) = get(store.as_ref(), &reply_path).await? else {
                continue;
            };
            // Signal first: a crash before the deletes signals again, and a
            // second signal with no waiter is only buffered.
            let outcome = runtime.signal(&reply_key, reply).await?;
            println!("  (watcher) {reply_key} appeared -> signal {outcome:?}");
            store.delete(&marker).await?;
            store.delete(&reply_path).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A tiny stop flag shared by the background tasks.
mod stop_flag {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Clone, Default)]
    pub struct Stop(Arc<AtomicBool>);

    impl Stop {
        pub fn stop(&self) {
            self.0.store(true, Ordering::SeqCst);
        }

        pub fn is_stopped(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args = Args::parse();
    let dir = args.store.unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "taquba-workflow-remote-reply-{}",
            std::process::id()
        ))
    });
    std::fs::create_dir_all(&dir)?;
    println!("store: {}", dir.display());
    let store: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&dir)?);
    let queue = Arc::new(Queue::open(store.clone(), "remote-reply").await?);
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        AskRemote {
            store: store.clone(),
        },
        NoopTerminalHook,
    )
    .poll_interval(Duration::from_millis(200))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let stop = Stop::default();
    let remote = tokio::spawn(remote_worker(store.clone(), stop.clone()));
    let watch = tokio::spawn(watcher(runtime.clone(), store.clone(), stop.clone()));

    let texts = [
        "the quick brown fox jumps over the lazy dog",
        "durable execution on object storage",
        "no inbound endpoint needed",
    ];
    let mut runs = Vec::new();
    for text in texts {
        let run = runtime
            .submit(RunSpec {
                input: text.as_bytes().to_vec(),
                ..Default::default()
            })
            .await?;
        runs.push(run.run_id);
    }

    let mut failed = 0;
    for run_id in &runs {
        let end = runtime.wait(run_id).await?;
        match end.termination.status {
            TerminalStatus::Succeeded => {
                let result = end.outcome.and_then(|o| o.result).unwrap_or_default();
                println!(
                    "run {run_id} succeeded: {}",
                    String::from_utf8_lossy(&result)
                );
            }
            status => {
                failed += 1;
                println!(
                    "run {run_id} {status}: {}",
                    end.termination.error.unwrap_or_default()
                );
            }
        }
    }

    stop.stop();
    remote.await??;
    watch.await?.map_err(|e| e.to_string())?;
    worker.shutdown().await?;
    let left = list(store.as_ref(), "remote").await?;
    println!(
        "{} runs finished ({failed} failed); objects left under remote/: {}",
        runs.len(),
        left.len()
    );
    Ok(())
}
