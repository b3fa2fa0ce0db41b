//! The cluster demonstration shared by `examples/cluster.rs` and the
//! multi-process test (`tests/cluster_processes.rs`): worker processes
//! sharing the shards of one local directory on bucket leases, a separate
//! submitting process, a worker killed with SIGKILL mid-way, and a summary
//! of what the store holds afterwards.
//!
//! Each run counts one file in three steps (lines, then words, then bytes),
//! each step with `step_ms` of simulated remote work. Every step's
//! settlement writes a marker `app/exec/{run}/{step}`; a step that finds
//! its own marker is a committed step executed again, carried in the run's
//! result as a duplicate settlement.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba_workflow::cluster::{ClusterRuntime, LeaseOptions, Ownership, read_lease};
use taquba_workflow::{
    NoopTerminalHook, RunId, RunSpec, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
};

use crate::store::store_from_env_or_url;
use crate::wordcount::Counts;

/// The cluster's root prefix in the directory.
pub const ROOT: &str = "cluster";

/// The state a run carries from step to step, and its result.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRun {
    /// The file counted.
    pub path: String,
    /// Counted so far.
    pub counts: Counts,
    /// Committed steps of this run found executed again.
    pub duplicates: u32,
}

/// The demo's step runner: count one file, a count per step.
#[derive(Clone)]
pub struct CountFile {
    step_ms: u64,
}

impl CountFile {
    /// Each step spends `step_ms` on simulated remote work.
    pub fn new(step_ms: u64) -> Self {
        Self { step_ms }
    }
}

fn exec_key(run_id: &str, step: u32) -> Vec<u8> {
    format!("app/exec/{run_id}/{step}").into_bytes()
}

impl StepRunner for CountFile {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let n = step.step_number;
        let mut state: FileRun = match n {
            0 => FileRun {
                path: String::from_utf8(step.payload.clone())
                    .map_err(|_| StepError::permanent("the input is not a UTF-8 path"))?,
                ..FileRun::default()
            },
            _ => serde_json::from_slice(&step.payload)
                .map_err(|err| StepError::permanent(format!("the carried state: {err}")))?,
        };
        if step
            .kv
            .get(&exec_key(step.run_id.as_str(), n))
            .await
            .map_err(|err| StepError::transient(err.to_string()))?
            .is_some()
        {
            state.duplicates += 1;
        }
        let text = std::fs::read(&state.path)
            .map_err(|err| StepError::permanent(format!("reading {}: {err}", state.path)))?;
        let counts = Counts::of(&text);
        match n {
            0 => state.counts.lines = counts.lines,
            1 => state.counts.words = counts.words,
            _ => state.counts.bytes = counts.bytes,
        }
        tokio::time::sleep(Duration::from_millis(self.step_ms)).await;
        step.effects
            .put(exec_key(step.run_id.as_str(), n), b"1".to_vec())?;
        let payload = serde_json::to_vec(&state)
            .map_err(|err| StepError::permanent(format!("encoding the state: {err}")))?;
        Ok(match n {
            0 | 1 => StepOutcome::continue_now(payload),
            _ => StepOutcome::Succeed { result: payload },
        })
    }
}

/// How a worker process runs.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// The store holding the cluster: a directory, `file:///dir` or
    /// `s3://bucket/prefix`.
    pub store: String,
    /// The worker's node id.
    pub node: String,
    /// The lease time, ms.
    pub lease_ms: u64,
    /// The ownership round's interval, ms.
    pub check_ms: u64,
    /// Simulated work per step, ms.
    pub step_ms: u64,
}

impl WorkerArgs {
    /// The arguments after the `worker` word of a worker's command line.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--store".into(),
            self.store.clone(),
            "--node".into(),
            self.node.clone(),
            "--lease-ms".into(),
            self.lease_ms.to_string(),
            "--check-ms".into(),
            self.check_ms.to_string(),
            "--step-ms".into(),
            self.step_ms.to_string(),
        ]
    }

    /// Parse what [`to_args`](Self::to_args) wrote.
    ///
    /// # Errors
    /// A message naming the flag that is missing or malformed.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let value = |flag: &str| -> Result<String, String> {
            args.iter()
                .position(|arg| arg == flag)
                .and_then(|i| args.get(i + 1))
                .cloned()
                .ok_or_else(|| format!("missing {flag}"))
        };
        let number = |flag: &str| -> Result<u64, String> {
            value(flag)?.parse().map_err(|err| format!("{flag}: {err}"))
        };
        Ok(Self {
            store: value("--store")?,
            node: value("--node")?,
            lease_ms: number("--lease-ms")?,
            check_ms: number("--check-ms")?,
            step_ms: number("--step-ms")?,
        })
    }
}

/// A worker process: host shards on bucket leases until SIGTERM (or
/// Ctrl-C), then hand them over and exit.
///
/// # Errors
/// The cluster's, as a message.
pub async fn worker(args: WorkerArgs) -> Result<(), String> {
    let store = open_store(&args.store)?;
    let cluster =
        ClusterRuntime::builder(store, ROOT, CountFile::new(args.step_ms), NoopTerminalHook)
            .node_id(args.node.clone())
            .ownership(Ownership::Leases(LeaseOptions {
                lease: Duration::from_millis(args.lease_ms),
                check_interval: Duration::from_millis(args.check_ms),
                drain: Duration::from_secs(10),
            }))
            .configure(|builder| {
                builder
                    .poll_interval(Duration::from_millis(50))
                    .max_concurrent_steps(16)
            })
            .start()
            .await
            .map_err(|err| err.to_string())?;
    terminated().await;
    cluster.shutdown().await.map_err(|err| err.to_string())
}

#[cfg(unix)]
async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn terminated() {
    let _ = tokio::signal::ctrl_c().await;
}

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The store holding the cluster (a directory, created if missing, a
    /// `file:///dir` or an `s3://bucket/prefix` URL), expected empty.
    pub store: String,
    /// Shards.
    pub shards: u32,
    /// Worker processes.
    pub workers: u32,
    /// The files counted, one run each.
    pub files: Vec<String>,
    /// The lease time, ms.
    pub lease_ms: u64,
    /// The ownership round's interval, ms.
    pub check_ms: u64,
    /// Simulated work per step, ms.
    pub step_ms: u64,
    /// The fraction of runs ended when a worker is killed.
    pub kill_at: f64,
    /// How long to wait for every run, after the kill.
    pub deadline: Duration,
}

/// The demo's summary (one JSON line).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    /// Shards of the cluster.
    pub shards: u32,
    /// Worker processes started.
    pub workers: u32,
    /// Runs submitted.
    pub submitted: usize,
    /// Runs that succeeded.
    pub succeeded: usize,
    /// Runs that ended otherwise.
    pub failed: usize,
    /// Runs that did not end by the deadline.
    pub lost: usize,
    /// Succeeded runs whose counts differ from the file's.
    pub wrong_results: usize,
    /// Committed steps executed again (found by their settlement's
    /// marker), plus attempts settled twice in a run's step history.
    pub duplicate_settlements: u64,
    /// The killed worker.
    pub killed: Option<String>,
    /// Shards the killed worker held.
    pub killed_shards: Vec<u32>,
    /// From the kill until every shard it held was held by another worker,
    /// ms.
    pub takeover_ms: Option<u64>,
    /// The lease time, ms.
    pub lease_ms: u64,
    /// From the first submission until every run ended, ms.
    pub elapsed_ms: u64,
}

/// Run the demo: start the workers with `spawn_worker`, submit a run per
/// file from this process, SIGKILL the worker holding the most shards
/// once `kill_at` of the runs ended, measure the takeover, wait for every
/// run, stop the rest with SIGTERM, and sum up.
///
/// # Errors
/// A message for a store or process that fails.
pub async fn run_demo(
    options: DemoOptions,
    spawn_worker: impl Fn(&WorkerArgs) -> Command,
) -> Result<Summary, String> {
    let store = open_store(&options.store)?;
    let client = ClusterRuntime::builder(
        store.clone(),
        ROOT,
        CountFile::new(options.step_ms),
        NoopTerminalHook,
    )
    .shards(options.shards)
    .ownership(Ownership::Client)
    .reader_poll_interval(Duration::from_millis(100))
    .start()
    .await
    .map_err(|err| err.to_string())?;
    let mut workers: BTreeMap<String, Child> = BTreeMap::new();
    for i in 0..options.workers {
        let args = WorkerArgs {
            store: options.store.clone(),
            node: format!("worker-{i}"),
            lease_ms: options.lease_ms,
            check_ms: options.check_ms,
            step_ms: options.step_ms,
        };
        let child = spawn_worker(&args)
            .spawn()
            .map_err(|err| format!("starting {}: {err}", args.node))?;
        workers.insert(args.node, child);
    }

    let started = Instant::now();
    let mut runs = Vec::new();
    for (i, path) in options.files.iter().enumerate() {
        let run_id = RunId::new(format!("count-{i:05}")).map_err(|err| err.to_string())?;
        let _ = client
            .submit(RunSpec {
                run_id: Some(run_id.clone()),
                input: path.clone().into_bytes(),
                ..Default::default()
            })
            .await
            .map_err(|err| err.to_string())?;
        runs.push((run_id, path.clone()));
    }

    // Wait for every run on tasks of their own, counting the ends.
    let ended = Arc::new(AtomicUsize::new(0));
    let deadline = options.deadline;
    let mut waits = tokio::task::JoinSet::new();
    for (run_id, path) in runs.clone() {
        let (client, ended) = (client.clone(), ended.clone());
        waits.spawn(async move {
            let end = client.wait_timeout(&run_id, deadline).await;
            ended.fetch_add(1, Ordering::Relaxed);
            (run_id, path, end)
        });
    }

    // Kill the worker holding the most shards once enough runs ended.
    let kill_when = ((runs.len() as f64) * options.kill_at).ceil() as usize;
    while ended.load(Ordering::Relaxed) < kill_when && started.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let holders = holders(&store, options.shards).await?;
    let victim = holders
        .values()
        .fold(BTreeMap::<&String, usize>::new(), |mut counts, holder| {
            *counts.entry(holder).or_default() += 1;
            counts
        })
        .into_iter()
        .max_by_key(|(_, count)| *count)
        .map(|(holder, _)| holder.clone());
    let mut summary = Summary {
        shards: options.shards,
        workers: options.workers,
        submitted: runs.len(),
        lease_ms: options.lease_ms,
        ..Summary::default()
    };
    if let Some(victim) = victim
        && let Some(child) = workers.get_mut(&victim)
    {
        let held: Vec<u32> = holders
            .iter()
            .filter(|(_, holder)| **holder == victim)
            .map(|(shard, _)| *shard)
            .collect();
        // `Child::kill` is SIGKILL on unix.
        child
            .kill()
            .map_err(|err| format!("killing {victim}: {err}"))?;
        let killed_at = Instant::now();
        let _ = child.wait();
        loop {
            let now = holders_of(&store, &held).await?;
            if now.len() == held.len() && now.values().all(|holder| *holder != victim) {
                summary.takeover_ms = Some(killed_at.elapsed().as_millis() as u64);
                break;
            }
            if killed_at.elapsed() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        summary.killed = Some(victim);
        summary.killed_shards = held;
    }

    while let Some(waited) = waits.join_next().await {
        let (run_id, path, end) = waited.map_err(|err| err.to_string())?;
        summary.duplicate_settlements += settled_twice(&client, &run_id).await?;
        let end = end.map_err(|err| err.to_string())?;
        let Some(end) = end else {
            summary.lost += 1;
            continue;
        };
        if end.termination.status != TerminalStatus::Succeeded {
            summary.failed += 1;
            continue;
        }
        summary.succeeded += 1;
        let result: Option<FileRun> = end
            .outcome
            .and_then(|outcome| outcome.result)
            .and_then(|bytes| serde_json::from_slice(&bytes).ok());
        let expected = std::fs::read(&path).map(|text| Counts::of(&text)).ok();
        match result {
            Some(result) => {
                summary.duplicate_settlements += u64::from(result.duplicates);
                if Some(result.counts) != expected {
                    summary.wrong_results += 1;
                }
            }
            None => summary.wrong_results += 1,
        }
    }
    summary.elapsed_ms = started.elapsed().as_millis() as u64;

    // Stop the others cleanly.
    for (node, child) in workers.iter_mut() {
        if summary.killed.as_deref() == Some(node.as_str()) {
            continue;
        }
        terminate(child);
    }
    for (node, mut child) in workers {
        if summary.killed.as_deref() == Some(node.as_str()) {
            continue;
        }
        let waited = tokio::task::spawn_blocking(move || {
            let limit = Instant::now() + Duration::from_secs(30);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => return,
                    Ok(None) if Instant::now() < limit => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return;
                    }
                }
            }
        });
        let _ = waited.await;
    }
    client.shutdown().await.map_err(|err| err.to_string())?;
    Ok(summary)
}

#[cfg(unix)]
fn terminate(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SIGTERM to a child this process started, through kill(1).
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
    }
}

#[cfg(not(unix))]
fn terminate(child: &mut Child) {
    let _ = child.kill();
}

/// Attempts of `run_id`'s steps that appear twice in its history (each
/// settled attempt is recorded once).
async fn settled_twice<R, H>(client: &ClusterRuntime<R, H>, run_id: &RunId) -> Result<u64, String>
where
    R: StepRunner + Clone + 'static,
    H: taquba_workflow::TerminalHook + Clone + 'static,
{
    let Some(view) = client
        .view(client.shard_of(run_id))
        .await
        .map_err(|err| err.to_string())?
    else {
        return Ok(0);
    };
    let Some(history) = view.steps(run_id).await.map_err(|err| err.to_string())? else {
        return Ok(0);
    };
    let mut twice = 0;
    for step in &history.steps {
        let mut seen = std::collections::BTreeSet::new();
        for attempt in &step.attempts {
            if !seen.insert(attempt.attempt) {
                twice += 1;
            }
        }
    }
    Ok(twice)
}

/// The store at `location`.
fn open_store(location: &str) -> Result<Arc<dyn ObjectStore>, String> {
    store_from_env_or_url(Some(location), Path::new(location)).map_err(|err| err.to_string())
}

/// The holder of each held shard.
async fn holders(
    store: &Arc<dyn ObjectStore>,
    shards: u32,
) -> Result<BTreeMap<u32, String>, String> {
    holders_of(store, &(0..shards).collect::<Vec<_>>()).await
}

async fn holders_of(
    store: &Arc<dyn ObjectStore>,
    shards: &[u32],
) -> Result<BTreeMap<u32, String>, String> {
    let mut held = BTreeMap::new();
    for &shard in shards {
        let lease = read_lease(store.clone(), ROOT, shard)
            .await
            .map_err(|err| err.to_string())?;
        if let Some(lease) = lease
            && lease.state == taquba_workflow::cluster::LeaseState::Held
            && let Some(holder) = lease.holder
        {
            held.insert(shard, holder);
        }
    }
    Ok(held)
}

/// The `*.rs` and `*.md` files under `dir` (see
/// [`list_files`](crate::wordcount::list_files)), at most `limit`.
///
/// # Errors
/// The file system's error.
pub fn files_under(dir: &Path, limit: usize) -> std::io::Result<Vec<String>> {
    let mut files = crate::wordcount::list_files(dir)?;
    files.truncate(limit);
    Ok(files)
}
