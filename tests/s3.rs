//! The S3 test group: the runtime against a real S3-compatible server.
//!
//! Run through `.ci/s3.sh`, which starts `s3s-fs` on 127.0.0.1 and exports
//! the standard environment (`AWS_ENDPOINT`, `AWS_BUCKET`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//! `AWS_ALLOW_HTTP`). Without `AWS_ENDPOINT`, or in a build without the
//! `aws` feature, every test prints why it is skipped and passes.
//!
//! Each test works under its own prefix of the bucket, so the group can
//! run again on the same bucket.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use taquba::{OpenOptions, QueueConfig};
use taquba_workflow::{
    GroupMember, NoopTerminalHook, RunOptions, RunSpec, Step, StepError, StepOutcome, StepRunner,
    TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{KillPlan, torture};
use taquba_workflow_suite::{open_queue, store_from_env_or_url};

const CHILD: &str = env!("CARGO_BIN_EXE_torture_child");

/// The bucket of the environment, or `None` (with the reason printed) when
/// the S3 group cannot run here.
fn s3_bucket(test: &str) -> Option<String> {
    if !cfg!(feature = "aws") {
        println!("{test}: skipped: built without the `aws` feature (run .ci/s3.sh)");
        return None;
    }
    let endpoint = std::env::var("AWS_ENDPOINT").unwrap_or_default();
    let bucket = std::env::var("AWS_BUCKET").unwrap_or_default();
    if endpoint.is_empty() || bucket.is_empty() {
        println!("{test}: skipped: AWS_ENDPOINT/AWS_BUCKET not set (run .ci/s3.sh)");
        return None;
    }
    Some(bucket)
}

/// A fresh `s3://bucket/prefix` location for one test.
fn location(bucket: &str, test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("s3://{bucket}/{test}-{nanos:x}")
}

/// `n` counts down to 0 (one step each, a memo write per step) and
/// succeeds with the step number; `wait:KEY` waits for a signal on `KEY`
/// and succeeds with its payload.
struct Steps;

impl StepRunner for Steps {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let input = String::from_utf8_lossy(&step.payload).into_owned();
        if let Some(key) = input.strip_prefix("wait:") {
            return Ok(StepOutcome::continue_on_signal(
                b"woken".to_vec(),
                key,
                Duration::from_secs(120),
            ));
        }
        if input == "woken" {
            let signal = step
                .signal
                .clone()
                .ok_or_else(|| StepError::permanent("timed out"))?;
            return Ok(StepOutcome::Succeed { result: signal });
        }
        let n: u32 = input
            .parse()
            .map_err(|_| StepError::permanent(format!("bad input {input:?}")))?;
        step.memo.put("seen", input.as_bytes()).await?;
        if n == 0 {
            Ok(StepOutcome::Succeed {
                result: step.step_number.to_string().into_bytes(),
            })
        } else {
            Ok(StepOutcome::continue_now((n - 1).to_string().into_bytes()))
        }
    }
}

async fn bounded<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 120 s"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_submit_multi_step_signal_and_group() {
    let Some(bucket) = s3_bucket("s3_submit_multi_step_signal_and_group") else {
        return;
    };
    let started = Instant::now();
    let location = location(&bucket, "runtime");
    let store = store_from_env_or_url(Some(&location), Path::new("unused")).expect("S3 store");
    let options = OpenOptions::default()
        .flush_interval(Duration::from_millis(5))
        .scheduler_interval(Duration::from_millis(50))
        .default_queue_config(QueueConfig::default().retry_backoff_base(Duration::from_millis(10)));
    let queue = open_queue(store.clone(), "db", options)
        .await
        .expect("queue on S3");
    let runtime = WorkflowRuntime::builder(queue, store, Steps, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());

    // A multi-step run.
    let run = runtime
        .submit(RunSpec {
            input: b"5".to_vec(),
            options: RunOptions {
                headers: HashMap::from([("tenant".to_string(), "s3".to_string())]),
                ..RunOptions::default()
            },
            ..RunSpec::default()
        })
        .await
        .expect("submit");
    let end = bounded("the multi-step run", runtime.wait(&run.run_id))
        .await
        .expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(end.termination.final_step, 5);
    let outcome = end.outcome.expect("outcome recorded in the bucket");
    assert_eq!(outcome.result.as_deref(), Some(&b"5"[..]));
    assert_eq!(
        outcome.headers.get("tenant").map(String::as_str),
        Some("s3")
    );

    // A signal wait.
    let waiting = runtime
        .submit(RunSpec {
            input: b"wait:approval-1".to_vec(),
            ..RunSpec::default()
        })
        .await
        .expect("submit waiting run");
    runtime
        .signal("approval-1", b"approved".to_vec())
        .await
        .expect("signal");
    let end = bounded("the signal wait", runtime.wait(&waiting.run_id))
        .await
        .expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"approved"[..])
    );

    // A group.
    let group = runtime.new_group();
    let members = (0..3)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: b"2".to_vec(),
        })
        .collect();
    group
        .submit(members, &RunOptions::default())
        .await
        .expect("group submit");
    let results: Vec<_> = bounded(
        "the group",
        group.results().await.expect("results").collect(),
    )
    .await;
    assert_eq!(results.len(), 3);
    for result in results {
        let result = result.expect("member result");
        assert_eq!(
            result.termination.status,
            TerminalStatus::Succeeded,
            "{}",
            result.key
        );
    }
    group.forget().await.expect("forget");
    worker.shutdown().await.expect("worker shutdown");
    println!(
        "S3 runtime group: multi-step run, signal wait and group in {:.2}s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn s3_restart_from_a_second_process() {
    let Some(bucket) = s3_bucket("s3_restart_from_a_second_process") else {
        return;
    };
    let location = location(&bucket, "restart");
    let state = tempfile::tempdir().expect("temp dir");
    // The first process submits and is killed mid-run; the second one
    // finishes every run and checks the invariants.
    let plan = KillPlan {
        after_start_ms: 1500..2500,
        mid_work_every: 2,
        after_submit_ms: 200..600,
        child_args: Vec::new(),
    };
    let report = torture(Path::new(CHILD), &location, state.path(), 2, &plan, 7)
        .unwrap_or_else(|err| panic!("restart from a second process failed: {err}"));
    assert_eq!(report.violations, 0);
    println!("S3 restart: {}", report.check_output);
}

#[test]
fn s3_wrong_credentials_fail_with_a_clear_error_in_time() {
    let Some(bucket) = s3_bucket("s3_wrong_credentials_fail_with_a_clear_error_in_time") else {
        return;
    };
    let started = Instant::now();
    let output = Command::new(CHILD)
        .args([
            "--store",
            &location(&bucket, "wrong-creds"),
            "--runs",
            "1",
            "--steps",
            "1",
            "bench",
        ])
        .env("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        .env("TAQUBA_OPEN_TIMEOUT_SECS", "20")
        .stdin(Stdio::null())
        .output()
        .expect("start the child");
    let elapsed = started.elapsed();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "wrong credentials were accepted: {stderr}"
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
    assert!(
        stderr.contains("is not usable") || stderr.contains("did not finish within"),
        "{stderr}"
    );
    println!(
        "wrong credentials failed in {:.2}s: {}",
        elapsed.as_secs_f64(),
        stderr.trim()
    );
}

fn bench(store: &str) -> (f64, String) {
    let output = Command::new(CHILD)
        .args([
            "--store",
            store,
            "--runs",
            "100",
            "--steps",
            "10",
            "--work-ms",
            "0",
            "bench",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("start the child");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "bench on {store} failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rate = stdout
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("transitions_per_sec="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    (rate, stdout.trim().to_string())
}

#[test]
fn s3_benchmark_against_a_local_directory() {
    let Some(bucket) = s3_bucket("s3_benchmark_against_a_local_directory") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (dir_rate, dir_line) = bench(dir.path().to_str().expect("utf-8 temp path"));
    let (s3_rate, s3_line) = bench(&location(&bucket, "bench"));
    println!("{dir_line}\n{s3_line}");
    println!("BENCH-SUMMARY dir={dir_rate:.1}/s s3={s3_rate:.1}/s step transitions");
    assert!(dir_rate > 0.0 && s3_rate > 0.0);
}

#[test]
fn s3_kill9_torture() {
    let Some(bucket) = s3_bucket("s3_kill9_torture") else {
        return;
    };
    let kills = std::env::var("KILL9_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1);
    let state = tempfile::tempdir().expect("temp dir");
    let location = location(&bucket, "kill9");
    println!("kill -9 torture on {location}: {kills} kills, seed {seed}");
    let report = torture(
        Path::new(CHILD),
        &location,
        state.path(),
        kills,
        &KillPlan {
            // Opening replays every WAL object since the last memtable
            // flush, one S3 read each, so it slows down as kills pile up:
            // most kills land during opens and recoveries, every fifth
            // one in the middle of steps.
            after_start_ms: 300..1500,
            mid_work_every: 5,
            after_submit_ms: 50..500,
            child_args: vec!["--flush-ms".to_string(), "50".to_string()],
        },
        seed,
    )
    .unwrap_or_else(|err| panic!("S3 torture session (seed {seed}) failed: {err}"));
    println!(
        "KILL9 store=s3 kills={} runs={} violations={} elapsed={:.1}s\n{}",
        report.kills,
        report.runs,
        report.violations,
        report.elapsed.as_secs_f64(),
        report.check_output
    );
    assert_eq!(report.violations, 0);
}

/// The cluster on the bucket, as a smoke test: two worker processes on
/// bucket leases, the one holding the most shards killed with SIGKILL, the
/// other takes its shards over and every run succeeds with the right
/// counts. No race winner is asserted: this server's conditional create
/// checks, then writes, so two racing creates can both succeed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_cluster_takes_over_a_killed_worker() {
    use taquba_workflow_suite::cluster_demo::{DemoOptions, files_under, run_demo};

    let Some(bucket) = s3_bucket("s3_cluster_takes_over_a_killed_worker") else {
        return;
    };
    let files = files_under(Path::new(env!("CARGO_MANIFEST_DIR")), 24).expect("files");
    let options = DemoOptions {
        store: location(&bucket, "cluster"),
        shards: 4,
        workers: 2,
        files,
        lease_ms: 3000,
        check_ms: 500,
        step_ms: 10,
        kill_at: 0.3,
        deadline: Duration::from_secs(90),
    };
    let summary = bounded(
        "the cluster on the bucket",
        run_demo(options, |worker| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_cluster_worker"));
            command.args(worker.to_args());
            command
        }),
    )
    .await
    .expect("the cluster demo");
    println!("s3 cluster: {summary:?}");
    assert_eq!(summary.succeeded, summary.submitted, "{summary:?}");
    assert_eq!(
        (summary.lost, summary.failed, summary.wrong_results),
        (0, 0, 0),
        "{summary:?}"
    );
    assert!(summary.takeover_ms.is_some(), "{summary:?}");
}
