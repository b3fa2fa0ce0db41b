//! The command line and the dashboard against hostile entries in a live
//! store (a FIFO where a command or the touch would be, links out of the
//! store, a link loop), a far-future time, and an operator in a hurry:
//! `--offline` against an owner busy in a long step, a `--wait` that gives
//! up while the owner commits. Nothing hangs, nothing outside the store is
//! counted or followed, no time panics, and the hints say what they read.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use taquba_workflow::{RunId, RunState, TerminalStatus};

use crate::common::{Owner, cli, json, run, stderr, stdout};
use crate::web::Dashboard;

/// The default runtime's inbox directory in the store at `dir`.
fn inbox(dir: &Path) -> PathBuf {
    dir.join("workflow-steps-memo").join("inbox").join("v1")
}

/// Make a FIFO at `path`.
fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// Wait (at most 10 s) until run `id` of `owner` is at step `step`.
async fn at_step(owner: &Owner, id: &RunId, step: u32) {
    for _ in 0..500 {
        let status = owner.runtime.status(id).await.expect("the run status");
        if status.is_some_and(|s| s.current_step == step) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("run {id} did not reach step {step} within 10 s");
}

/// A command id no one sent.
const PLANTED: &str = "01JAZ3NDEKTSV4RRFFQ69G5FAV";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifos_and_links_in_the_inbox_hang_no_command_and_no_page() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let parked = owner.start("fifo-parked", 1, "timer", &[]).await;
    let inbox = inbox(dir.path());
    std::fs::create_dir_all(&inbox).unwrap();
    mkfifo(&inbox.join(format!("{PLANTED}.msgpack")));
    mkfifo(&inbox.join("fifo"));
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("big"), vec![7u8; 1 << 20]).unwrap();
    std::os::unix::fs::symlink(outside.path(), inbox.join("zz-link")).unwrap();
    std::os::unix::fs::symlink("..", inbox.join("loop")).unwrap();

    // `commands describe` of the FIFO's name answers at once.
    let started = Instant::now();
    let mut describe = cli(dir.path(), &["commands", "describe", PLANTED, "-o", "json"]);
    describe.timeout(Duration::from_secs(30));
    let described = run(describe).await.success();
    assert_eq!(json(&described)["state"], "unknown");
    assert!(started.elapsed() < Duration::from_secs(30));

    // `store info` counts the store only, and says what it passed over.
    let mut info = cli(dir.path(), &["store", "info", "-o", "json"]);
    info.timeout(Duration::from_secs(60));
    let info = json(&run(info).await.success());
    assert!(
        info["total_bytes"].as_u64().unwrap() < 1 << 20,
        "the file behind the link was counted: {info}"
    );
    assert!(info["passed_over"].as_u64().unwrap() >= 4, "{info}");

    // The dashboard answers many requests for the FIFO's command, and the
    // other pages after them.
    let ui = Dashboard::start(dir.path(), &[]).await;
    let path = format!("/commands/{PLANTED}");
    let requests: Vec<_> = (0..40)
        .map(|_| {
            let (ui, path) = (&ui, path.clone());
            async move { tokio::time::timeout(Duration::from_secs(20), ui.get(&path)).await }
        })
        .collect();
    for reply in futures_util::future::join_all(requests).await {
        let reply = reply.expect("the command page answered within 20 s");
        reply.expect(200).has(&["badge b-unknown"]);
    }
    for page in ["/store", "/runs", &format!("/runs/{parked}")] {
        tokio::time::timeout(Duration::from_secs(20), ui.get(page))
            .await
            .unwrap_or_else(|_| panic!("{page} answered within 20 s"))
            .expect(200);
    }
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_refuses_an_owner_busy_in_a_long_step() {
    let dir = tempfile::tempdir().unwrap();
    // No heartbeat: nothing but the worker's records and the lease tell
    // that it is alive.
    let owner = Owner::open(dir.path()).await;
    let parked = owner.start("long-parked", 1, "timer", &[]).await;
    let long = owner.start("long-1", 1, "hold", &[]).await;
    for _ in 0..500 {
        let state = owner.runtime.status(&long).await.unwrap().map(|s| s.state);
        if state == Some(RunState::Running) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the reader see the claim.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = run(cli(
        dir.path(),
        &["runs", "cancel", "long-parked", "--yes", "--offline"],
    ))
    .await
    .code(1);
    let err = stderr(&refused);
    for part in [
        "check(s) say a process may own it",
        "lease: job",
        "(run long-1)",
        "a worker may be running it",
        "recorded no clean stop",
        "--force opens the store anyway",
        "detected newer DB client",
    ] {
        assert!(err.contains(part), "{part:?} not in:\n{err}");
    }
    // The owner was not fenced: its step finishes, and it applies a cancel
    // sent the usual way.
    owner.hold.add_permits(1);
    assert_eq!(
        owner.wait(&long).await.termination.status,
        TerminalStatus::Succeeded
    );
    run(cli(
        dir.path(),
        &["runs", "cancel", "long-parked", "--yes", "--wait"],
    ))
    .await
    .success();
    assert_eq!(
        owner.wait(&parked).await.termination.status,
        TerminalStatus::Cancelled
    );

    // Once it stopped cleanly, no check refuses.
    let other = owner.start("long-later", 1, "timer", &[]).await;
    at_step(&owner, &other, 1).await;
    owner.stop().await;
    let done = run(cli(
        dir.path(),
        &[
            "runs",
            "cancel",
            "long-later",
            "--yes",
            "--offline",
            "-o",
            "json",
        ],
    ))
    .await
    .success();
    let err = stderr(&done);
    assert!(err.contains("No live writer found"), "{err}");
    assert!(err.contains("stopped cleanly"), "{err}");
    assert_eq!(json(&done)["answer"]["cancelled"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_time_past_year_9999_is_shown_not_panicked_on() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let never = owner.start("never-1", 1, "never", &[]).await;
    at_step(&owner, &never, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let described = run(cli(
        dir.path(),
        &["runs", "describe", "never-1", "--time-format", "iso"],
    ))
    .await
    .success();
    let text = stdout(&described);
    assert!(text.contains("past year 9999"), "{text}");
    let ui = Dashboard::start(dir.path(), &[]).await;
    ui.get("/runs/never-1")
        .await
        .expect(200)
        .has(&["past year 9999"]);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_liveness_hints_read_what_moves() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    // Commits a step after another for as long as the test runs.
    owner.start("busy-hint", 1_000_000, "ok", &[]).await;
    // A second runtime of the store that ran once and stopped: its inbox
    // is polled by no process.
    let stopped = taquba_workflow::WorkflowRuntime::builder(
        owner.queue.clone(),
        owner.store.clone(),
        crate::common::Demo {
            hold: owner.hold.clone(),
            healed: owner.healed.clone(),
        },
        taquba_workflow::NoopTerminalHook,
    )
    .queue_name("stopped-q")
    .build();
    let worker = stopped.spawn(std::future::pending::<()>());
    tokio::time::sleep(Duration::from_millis(200)).await;
    worker.shutdown().await.unwrap();
    // The owner's stop below waits for the queue's last holder.
    drop(stopped);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A signal to that runtime is never applied, while the owner commits.
    let waited = run(cli(
        dir.path(),
        &[
            "--queue",
            "stopped-q",
            "runs",
            "signal",
            "k",
            "--json",
            "1",
            "--wait",
            "--wait-timeout",
            "2s",
        ],
    ))
    .await
    .code(1);
    let err = stderr(&waited);
    for part in [
        "is still pending after 2s",
        "a writer is committing (the durable sequence number moved from",
        "the newest write-ahead log object (the last commit) was written",
        "no heartbeat is recorded",
    ] {
        assert!(err.contains(part), "{part:?} not in:\n{err}");
    }
    assert!(!err.contains("last flush"), "{err}");

    let info = run(cli(dir.path(), &["store", "info"])).await.success();
    let text = stdout(&info);
    for part in [
        "Durable sequence:",
        "Last commit:",
        "newest write-ahead log object",
    ] {
        assert!(text.contains(part), "{part:?} not in:\n{text}");
    }
    let value = json(
        &run(cli(dir.path(), &["store", "info", "-o", "json"]))
            .await
            .success(),
    );
    let wal = value["writer"]["newest_wal"]["path"]
        .as_str()
        .unwrap_or_default();
    assert!(wal.starts_with("demo/wal/"), "{value}");
    owner.stop().await;
}
