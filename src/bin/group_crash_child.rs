//! The child process of the group kill -9 test (`tests/group_attacks.rs`).
//!
//! * `submit`: open the store, start the worker, print `SUBMITTING`, submit
//!   group `crash-group` of `--members` members, print `SUBMITTED`, serve
//!   until killed.
//! * `resume`: as `submit`, but `resume` the group (falling back to
//!   `submit` when it has no manifest yet).
//! * `check`: submit the group again, wait for every member, verify the
//!   invariants and print one `CHECK ...` line; exit status 1 on any
//!   violation.
//!
//! Member `m{i}` runs two steps. Everything is recorded by member, named by
//! its first run's id (`{member}`: the digest of `{group}/{key}`; a member's
//! later runs are `{member}-{n}`). Step 0 records each execution as a file
//! `{state}/exec/{member}.{job_id}.{attempt}`, and commits with its
//! settlement `app/ok0/{member}` and `app/ok0c/{member}/{job_id}`; finding
//! `app/ok0/{member}` when it starts means a member whose step 0 committed
//! a success runs again, recorded in `{state}/violations.log`. Every tenth
//! member fails its first run (a `Fail` verdict committing
//! `app/failed/{member}`). Step 1 succeeds.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::{
    Error, GroupMember, NoopTerminalHook, RunId, RunOptions, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::{open_queue, store_from_env_or_url};

const GROUP: &str = "crash-group";

#[derive(Parser)]
struct Cli {
    #[arg(long)]
    store: String,
    #[arg(long)]
    state: PathBuf,
    #[arg(long, default_value_t = 3000)]
    members: usize,
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    mode: Mode,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Submit,
    Resume,
    Check,
}

fn flaky(i: usize) -> bool {
    i.is_multiple_of(10)
}

fn members(n: usize) -> Vec<GroupMember> {
    (0..n)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: if flaky(i) {
                b"flaky".to_vec()
            } else {
                b"ok".to_vec()
            },
        })
        .collect()
}

fn member_run_id(key: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("{GROUP}/{key}")))
}

struct Runner {
    state: PathBuf,
}

impl Runner {
    fn violation(&self, line: &str) {
        eprintln!("VIOLATION {line}");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.join("violations.log"))
            .and_then(|mut f| {
                writeln!(f, "{line}")?;
                f.sync_data()
            });
        if let Err(e) = written {
            eprintln!("cannot record violation: {e}");
        }
    }
}

fn transient(e: impl std::fmt::Display) -> StepError {
    StepError::transient(e.to_string())
}

impl StepRunner for Runner {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.step_number > 0 {
            return Ok(StepOutcome::Succeed {
                result: b"done".to_vec(),
            });
        }
        // The member, whichever of its runs this is.
        let member = step.run_id.split('-').next().unwrap_or(&step.run_id);
        let exec = self.state.join("exec").join(format!(
            "{member}.{}.{}",
            hex::encode(step.job_id.as_bytes()),
            step.attempts
        ));
        std::fs::write(&exec, b"").map_err(transient)?;
        if step
            .kv
            .get(format!("app/ok0/{member}").as_bytes())
            .await
            .map_err(transient)?
            .is_some()
        {
            self.violation(&format!(
                "step 0 of member {member} ran again (job {}) after a committed success",
                step.job_id
            ));
        }
        if step.payload == b"flaky"
            && step
                .kv
                .get(format!("app/failed/{member}").as_bytes())
                .await
                .map_err(transient)?
                .is_none()
        {
            step.effects
                .put(format!("app/failed/{member}"), b"1".to_vec())
                .map_err(transient)?;
            step.effects
                .put(
                    format!("app/fail0c/{member}/{}", step.job_id),
                    b"1".to_vec(),
                )
                .map_err(transient)?;
            return Ok(StepOutcome::Fail {
                reason: "first run fails".into(),
            });
        }
        step.effects
            .put(format!("app/ok0/{member}"), b"1".to_vec())
            .map_err(transient)?;
        step.effects
            .put(format!("app/ok0c/{member}/{}", step.job_id), b"1".to_vec())
            .map_err(transient)?;
        Ok(StepOutcome::continue_now(step.payload.clone()))
    }
}

type Runtime = WorkflowRuntime<Runner, NoopTerminalHook>;

async fn open(cli: &Cli) -> Result<(Runtime, Arc<Queue>), String> {
    std::fs::create_dir_all(cli.state.join("exec")).map_err(|e| e.to_string())?;
    let store = store_from_env_or_url(Some(&cli.store), std::path::Path::new(&cli.store))
        .map_err(|e| e.to_string())?;
    let options = OpenOptions::default()
        .flush_interval(Duration::from_millis(5))
        .scheduler_interval(Duration::from_millis(20))
        .reaper_interval(Duration::from_millis(500))
        .default_queue_config(
            QueueConfig::default()
                .max_attempts(1000)
                .retry_backoff_base(Duration::from_millis(10))
                .retry_backoff_max(Duration::from_millis(200)),
        );
    let queue = open_queue(store.clone(), "crash-db", options)
        .await
        .map_err(|e| e.to_string())?;
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store,
        Runner {
            state: cli.state.clone(),
        },
        NoopTerminalHook,
    )
    .max_concurrent_steps(32)
    .poll_interval(Duration::from_millis(20))
    .build();
    Ok((runtime, queue))
}

fn options() -> RunOptions {
    RunOptions {
        max_attempts_per_step: Some(1000),
        ..RunOptions::default()
    }
}

async fn work(cli: &Cli, resume: bool) -> Result<(), String> {
    let started = Instant::now();
    let (runtime, _queue) = open(cli).await?;
    let _worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(RunId::new(GROUP).map_err(|e| e.to_string())?);
    println!("SUBMITTING after {} ms", started.elapsed().as_millis());
    let submitted = if resume {
        match group.resume(&options()).await {
            Err(Error::GroupNotFound(_)) => {
                println!("NO-MANIFEST");
                group.submit(members(cli.members), &options()).await
            }
            other => other,
        }
    } else {
        group.submit(members(cli.members), &options()).await
    };
    submitted.map_err(|e| format!("submit: {e}"))?;
    println!("SUBMITTED after {} ms", started.elapsed().as_millis());
    std::future::pending::<()>().await;
    Ok(())
}

async fn count(
    queue: &Queue,
    prefix: &str,
) -> Result<std::collections::HashMap<String, usize>, String> {
    let mut counts = std::collections::HashMap::new();
    let view = queue.view();
    let mut entries = std::pin::pin!(view.kv_entries(prefix.as_bytes(), .., 1000));
    while let Some(entry) = entries.next().await {
        let (key, _) = entry.map_err(|e| e.to_string())?;
        let key = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
        let run = key.split('/').next().unwrap_or_default().to_string();
        *counts.entry(run).or_default() += 1;
    }
    Ok(counts)
}

async fn check(cli: &Cli) -> Result<(), String> {
    let started = Instant::now();
    let (runtime, queue) = open(cli).await?;
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(RunId::new(GROUP).map_err(|e| e.to_string())?);
    let before = group.status().await;
    group
        .submit(members(cli.members), &options())
        .await
        .map_err(|e| format!("check submit: {e}"))?;
    let mut errors = Vec::new();
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut rounds = 0;
    // Members that failed their first run are run again by one more submit.
    loop {
        rounds += 1;
        seen.clear();
        let collected = tokio::time::timeout(Duration::from_secs(cli.timeout_secs), async {
            let mut results = std::pin::pin!(group.results().await?);
            let mut out = Vec::new();
            while let Some(r) = results.next().await {
                out.push(r?);
            }
            Ok::<_, Error>(out)
        })
        .await
        .map_err(|_| format!("results did not finish within {} s", cli.timeout_secs))?
        .map_err(|e| format!("results: {e}"))?;
        let mut failed = 0;
        for r in &collected {
            *seen.entry(r.key.clone()).or_default() += 1;
            if r.termination.status != TerminalStatus::Succeeded {
                failed += 1;
            }
        }
        if failed == 0 || rounds >= 3 {
            for r in &collected {
                if r.termination.status != TerminalStatus::Succeeded {
                    errors.push(format!("member {} ended {}", r.key, r.termination.status));
                }
            }
            break;
        }
        group
            .submit(members(cli.members), &options())
            .await
            .map_err(|e| format!("check re-submit: {e}"))?;
    }
    let all = members(cli.members);
    for m in &all {
        match seen.get(&m.key) {
            Some(1) => {}
            other => errors.push(format!("member {} yielded {other:?} times", m.key)),
        }
    }
    if seen.len() != all.len() {
        errors.push(format!("{} results for {} members", seen.len(), all.len()));
    }
    let status = group.status().await.map_err(|e| e.to_string())?;
    if status.total != all.len() || status.succeeded != all.len() {
        errors.push(format!("final status {status:?}"));
    }
    let ok0c = count(&queue, "app/ok0c/").await?;
    let fail0c = count(&queue, "app/fail0c/").await?;
    // Distinct step-0 jobs that executed, per run, from the exec files.
    let mut jobs = std::collections::HashMap::<String, std::collections::HashSet<String>>::new();
    let mut executions = 0usize;
    for entry in std::fs::read_dir(cli.state.join("exec")).map_err(|e| e.to_string())? {
        let name = entry.map_err(|e| e.to_string())?.file_name();
        let name = name.to_string_lossy();
        let mut parts = name.split('.');
        let (Some(run), Some(job)) = (parts.next(), parts.next()) else {
            continue;
        };
        executions += 1;
        jobs.entry(run.to_string())
            .or_default()
            .insert(job.to_string());
    }
    let mut reexecuted = 0;
    for (i, m) in all.iter().enumerate() {
        let run = member_run_id(&m.key);
        let ok = ok0c.get(&run).copied().unwrap_or(0);
        if ok != 1 {
            errors.push(format!("member {}: {ok} committed step-0 successes", m.key));
        }
        let fails = fail0c.get(&run).copied().unwrap_or(0);
        let expected_fails = usize::from(flaky(i));
        if fails != expected_fails {
            errors.push(format!(
                "member {}: {fails} committed step-0 failures (expected {expected_fails})",
                m.key
            ));
        }
        let runs = jobs.get(&run).map(|s| s.len()).unwrap_or(0);
        // More jobs than that can have executed without committing: a
        // worker may claim a step whose submission was still being flushed
        // when the process was killed, and that submission is then lost and
        // made again under a new job id. The commit counts above hold every
        // run to one committed outcome per submission.
        if runs < 1 + expected_fails {
            errors.push(format!(
                "member {}: step 0 executed in {runs} distinct jobs (expected at least {})",
                m.key,
                1 + expected_fails
            ));
        }
        if runs > 1 + expected_fails {
            reexecuted += 1;
        }
    }
    let violations: Vec<String> = std::fs::read_to_string(cli.state.join("violations.log"))
        .map(|s| s.lines().map(str::to_string).collect())
        .unwrap_or_default();
    println!(
        "CHECK members={} status_before={:?} results_rounds={rounds} step0_executions={executions} members_with_extra_runs={reexecuted} errors={} violations={} secs={:.1}",
        all.len(),
        before.map(|s| (s.total, s.pending, s.succeeded, s.failed, s.cancelled)),
        errors.len(),
        violations.len(),
        started.elapsed().as_secs_f64()
    );
    for line in violations.iter().chain(errors.iter()).take(30) {
        println!("  {line}");
    }
    worker.shutdown().await.map_err(|e| e.to_string())?;
    if errors.is_empty() && violations.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} errors, {} violations",
            errors.len(),
            violations.len()
        ))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.mode {
        Mode::Submit => work(&cli, false).await,
        Mode::Resume => work(&cli, true).await,
        Mode::Check => check(&cli).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("group_crash_child: {e}");
            ExitCode::FAILURE
        }
    }
}
