//! The harness of the CLI tests: a real `#[workflow]` (`Demo`) run by an
//! owning runtime in the test process over a store in a temporary
//! directory, and the `taquba-workflow` binary run as a second process
//! against the same directory (live) or against a copy of it (offline).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::workflows::{ChildRun, StepContext, Transition};
use taquba_workflow::{
    NoopTerminalHook, RunEnd, RunId, RunOptions, RunnerHandle, StepError, WorkflowRuntime, workflow,
};
use tokio::sync::Semaphore;

/// The queue's path inside the store directory.
pub const DB: &str = "demo";
/// The attempt limit of every step.
pub const MAX_ATTEMPTS: u32 = 2;

/// What a finished run returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The sum counted.
    pub total: u64,
    /// The signal's value, when the run waited for one.
    pub note: Option<String>,
}

/// The workflow of the tests. `begin` picks the run's path by `mode`:
/// `ok` counts `n` down one step at a time and succeeds; `fail` fails at
/// once; `signal` waits for a signal on `approve:{n}` (1 h timeout);
/// `timer` waits 1 h; `never` waits `Duration::MAX` (a wake-up time past
/// year 9999); `flaky` returns a transient error on every attempt
/// (dead-lettered after [`MAX_ATTEMPTS`]) until [`Demo::healed`] is set;
/// `hold` blocks until the test releases a permit of [`Demo::hold`];
/// `child` starts an `ok` run of `n` as its child `c` and succeeds with its
/// total.
pub struct Demo {
    /// Permits for `hold` steps.
    pub hold: Arc<Semaphore>,
    /// Whether `flaky` steps succeed.
    pub healed: Arc<AtomicBool>,
}

#[workflow(name = "cli-demo", output = Summary, version = "demo-1", patches = ["demo-patch"])]
impl Demo {
    #[step(start)]
    async fn begin(
        &self,
        ctx: StepContext<'_>,
        n: u64,
        mode: String,
    ) -> Result<Transition<DemoStep>, StepError> {
        match mode.as_str() {
            "child" => {
                let child = ctx.start_child(
                    "c",
                    DemoInput {
                        n,
                        mode: "ok".into(),
                    },
                )?;
                Ok(Transition::on_child(
                    DemoStep::Adopt {
                        child: child.clone(),
                    },
                    &child,
                    Duration::from_secs(3600),
                ))
            }
            "ok" => Ok(Transition::next(DemoStep::Count { left: n, total: 0 })),
            "fail" => Ok(Transition::fail(format!("asked to fail with n={n}"))),
            "signal" => Ok(Transition::on_signal(
                DemoStep::Finish { total: n },
                format!("approve:{n}"),
                Duration::from_secs(3600),
            )),
            "timer" => Ok(Transition::after(
                DemoStep::Finish { total: n },
                Duration::from_secs(3600),
            )),
            "never" => Ok(Transition::after(
                DemoStep::Finish { total: n },
                Duration::MAX,
            )),
            "flaky" if self.healed.load(Ordering::SeqCst) => {
                Ok(Transition::next(DemoStep::Finish { total: n }))
            }
            "flaky" => Err(StepError::transient(format!("flaky dependency (n={n})"))),
            "hold" => {
                let permit = self.hold.acquire().await;
                drop(permit);
                Ok(Transition::next(DemoStep::Finish { total: n }))
            }
            other => Ok(Transition::fail(format!("unknown mode {other}"))),
        }
    }

    #[step]
    async fn count(
        &self,
        _ctx: StepContext<'_>,
        left: u64,
        total: u64,
    ) -> Result<Transition<DemoStep>, StepError> {
        if left == 0 {
            Ok(Transition::next(DemoStep::Finish { total }))
        } else {
            Ok(Transition::next(DemoStep::Count {
                left: left - 1,
                total: total + left,
            }))
        }
    }

    /// The end of a `child` run's child.
    #[step]
    async fn adopt(
        &self,
        ctx: StepContext<'_>,
        child: ChildRun<Demo>,
    ) -> Result<Transition<DemoStep>, StepError> {
        match ctx.child_result(&child)? {
            Some(Ok(summary)) => Ok(Transition::done(Summary {
                total: summary.total,
                note: Some(format!("from {}", child.id())),
            })),
            Some(Err(failed)) => Ok(Transition::fail(failed.to_string())),
            None => Ok(Transition::fail("the child did not end within 1 h")),
        }
    }

    #[step]
    async fn finish(
        &self,
        ctx: StepContext<'_>,
        total: u64,
    ) -> Result<Transition<DemoStep>, StepError> {
        let note = ctx.signal_value::<String>()?;
        Ok(Transition::done(Summary { total, note }))
    }
}

/// The input payload of a `Demo` run (for a group member).
pub fn demo_input(n: u64, mode: &str) -> Vec<u8> {
    taquba_workflow::workflows::encode_input(DemoInput {
        n,
        mode: mode.to_string(),
    })
    .expect("encode the input")
}

/// `cmd` with `input` on its stdin.
pub fn with_stdin(mut cmd: assert_cmd::Command, input: &str) -> assert_cmd::Command {
    cmd.write_stdin(input.to_string());
    cmd
}

/// The owning runtime.
pub type Runtime = WorkflowRuntime<Demo, NoopTerminalHook>;

/// A process owning a store: its queue, runtime and worker.
pub struct Owner {
    /// The store.
    pub store: Arc<dyn ObjectStore>,
    /// The queue.
    pub queue: Arc<Queue>,
    /// The runtime.
    pub runtime: Runtime,
    /// Permits for `hold` steps.
    pub hold: Arc<Semaphore>,
    /// Whether `flaky` steps succeed.
    pub healed: Arc<AtomicBool>,
    worker: Option<RunnerHandle>,
}

impl Owner {
    /// Open the store in `dir` (created) and start the worker.
    pub async fn open(dir: &Path) -> Self {
        Self::open_with(dir, None).await
    }

    /// [`open`](Self::open) with the queue's liveness heartbeat every
    /// `heartbeat` (taquba's `OpenOptions::liveness_heartbeat`).
    pub async fn open_with(dir: &Path, heartbeat: Option<Duration>) -> Self {
        std::fs::create_dir_all(dir).expect("store dir");
        let store: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(dir).expect("local store"));
        Self::open_on(store, heartbeat).await
    }

    /// Own the queue at [`DB`] in `store` and start the worker.
    pub async fn open_on(store: Arc<dyn ObjectStore>, heartbeat: Option<Duration>) -> Self {
        Self::open_on_db(store, DB, heartbeat).await
    }

    /// Own shard `shard` of the cluster whose root is the directory
    /// `cluster` (its record written there first: [`create_cluster`]): the
    /// shard's store is `{cluster}/shards/{shard}/` as the cluster runtime
    /// opens it (`cluster::shard_store` over the root's store), its queue at
    /// `db`.
    pub async fn open_shard(cluster: &Path, shard: u32) -> Self {
        let root: Arc<dyn ObjectStore> =
            Arc::new(LocalFileSystem::new_with_prefix(cluster).expect("local store"));
        let store =
            taquba_workflow::cluster::shard_store(root, "", shard).expect("the shard's store");
        Self::open_on_db(store, taquba_workflow::cluster::SHARD_QUEUE_PATH, None).await
    }

    /// Own the queue at `db` in `store` and start the worker.
    pub async fn open_on_db(
        store: Arc<dyn ObjectStore>,
        db: &str,
        heartbeat: Option<Duration>,
    ) -> Self {
        let options = OpenOptions::default()
            .flush_interval(Duration::from_millis(5))
            .default_queue_config(
                QueueConfig::default()
                    .retry_backoff_base(Duration::from_millis(10))
                    .max_attempts(MAX_ATTEMPTS),
            )
            .liveness_heartbeat(heartbeat);
        let queue = Arc::new(
            Queue::open_with_options(store.clone(), db, options)
                .await
                .expect("open the queue"),
        );
        let hold = Arc::new(Semaphore::new(0));
        let healed = Arc::new(AtomicBool::new(false));
        let runtime = WorkflowRuntime::builder(
            queue.clone(),
            store.clone(),
            Demo {
                hold: hold.clone(),
                healed: healed.clone(),
            },
            NoopTerminalHook,
        )
        .poll_interval(Duration::from_millis(50))
        .build();
        let worker = Some(runtime.spawn(std::future::pending::<()>()));
        Self {
            store,
            queue,
            runtime,
            hold,
            healed,
            worker,
        }
    }

    /// Start run `id` of `Demo` with `n` and `mode` (see [`Demo`]) and the
    /// given headers.
    pub async fn start(&self, id: &str, n: u64, mode: &str, headers: &[(&str, &str)]) -> RunId {
        let run_id = RunId::new(id).expect("valid run id");
        let options = RunOptions {
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            ..RunOptions::default()
        };
        self.runtime
            .start_as(
                run_id.clone(),
                DemoInput {
                    n,
                    mode: mode.to_string(),
                },
                options,
            )
            .await
            .expect("start the run");
        run_id
    }

    /// Wait (at most 30 s) until `id` terminates.
    pub async fn wait(&self, id: &RunId) -> RunEnd {
        self.runtime
            .wait_timeout(id, Duration::from_secs(30))
            .await
            .expect("wait")
            .unwrap_or_else(|| panic!("run {id} did not terminate within 30 s"))
    }

    /// Stop the worker and close the queue (a clean shutdown).
    pub async fn stop(mut self) {
        if let Some(worker) = self.worker.take() {
            worker.shutdown().await.expect("worker shutdown");
        }
        drop(self.runtime);
        // Tasks the runtime spawned (a settlement, a detached call) let go
        // of the queue shortly after the worker stops; on a loaded machine
        // that takes a moment.
        let mut queue = self.queue;
        for _ in 0..1000 {
            match Arc::try_unwrap(queue) {
                Ok(owned) => return owned.close().await.expect("close the queue"),
                Err(shared) => {
                    queue = shared;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        match Arc::try_unwrap(queue) {
            Ok(queue) => queue.close().await.expect("close the queue"),
            Err(_) => panic!("the queue is still shared after 10 s"),
        }
    }
}

/// Write the record of a cluster of `shards` shards at the directory
/// `dir` (its root).
pub async fn create_cluster(dir: &Path, shards: u32) -> taquba_workflow::cluster::ClusterRecord {
    std::fs::create_dir_all(dir).expect("cluster dir");
    let store: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(dir).expect("local store"));
    taquba_workflow::cluster::ClusterRecord::create_or_open(store, "", shards)
        .await
        .expect("the cluster record")
}

/// `taquba-workflow --store DIR ARGS...`, with no store from the
/// environment.
pub fn cli(dir: &Path, args: &[&str]) -> assert_cmd::Command {
    cli_at(&dir.display().to_string(), args)
}

/// `taquba-workflow --store LOCATION ARGS...`, with no store from the
/// environment.
pub fn cli_at(location: &str, args: &[&str]) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("taquba-workflow").expect("the binary");
    cmd.env_remove("TAQUBA_WORKFLOW_STORE")
        .env_remove("TAQUBA_WORKFLOW_UI_TOKEN")
        .arg("--store")
        .arg(location)
        .args(args)
        .timeout(Duration::from_secs(120));
    cmd
}

/// Run `cmd` off the async runtime (the owner keeps running meanwhile).
pub async fn run(mut cmd: assert_cmd::Command) -> assert_cmd::assert::Assert {
    tokio::task::spawn_blocking(move || cmd.assert())
        .await
        .expect("the CLI thread")
}

/// stdout of a finished command, as text.
pub fn stdout(assert: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&assert.get_output().stdout).into_owned()
}

/// stderr of a finished command, as text.
pub fn stderr(assert: &assert_cmd::assert::Assert) -> String {
    String::from_utf8_lossy(&assert.get_output().stderr).into_owned()
}

/// stdout of a finished command, as JSON.
pub fn json(assert: &assert_cmd::assert::Assert) -> serde_json::Value {
    serde_json::from_slice(&assert.get_output().stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            stdout(assert),
            stderr(assert)
        )
    })
}

/// Copy the directory tree `from` to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}

/// Insta filters for text output: relative times and ISO timestamps.
pub fn time_filters() -> Vec<(&'static str, &'static str)> {
    vec![
        (r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\b", "[TIME]"),
        (
            r"\b\d+(ms|s|m|h|d)( \d+(ms|s|m|h|d))? ago\b|\bjust now\b",
            "[AGO]",
        ),
        (r"\bin \d+(ms|s|m|h|d)( \d+(ms|s|m|h|d))?\b", "[IN]"),
        (r"\b[0-9A-HJKMNP-TV-Z]{26}\b", "[ULID]"),
    ]
}
