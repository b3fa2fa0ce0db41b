//! kill -9 torture on a local directory: a child process running many
//! multi-step runs (memo writes, KV effects, signal waits, a group per
//! batch, terminal hooks) is killed with SIGKILL at random moments and
//! restarted; a final check verifies that every run terminated with the
//! right result, no committed step or hook ran again, every committed
//! effect is there once, and `forget`/retention left nothing behind.
//!
//! `KILL9_KILLS` (default 50) and `KILL9_SEED` size and seed the session.

use std::time::Duration;

use taquba_workflow_suite::testing::{KillPlan, torture};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn killed_with_sigkill_at_random_moments_every_run_ends_once() {
    let kills = env_or("KILL9_KILLS", 50usize);
    let seed = env_or(
        "KILL9_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let state = dir.path().join("state");
    println!("kill -9 torture on a local directory: {kills} kills, seed {seed}");
    let report = torture(
        std::path::Path::new(env!("CARGO_BIN_EXE_torture_child")),
        store.to_str().expect("utf-8 temp path"),
        &state,
        kills,
        &KillPlan {
            after_start_ms: 100..900,
            mid_work_every: 5,
            after_submit_ms: 20..400,
            child_args: Vec::new(),
        },
        seed,
    )
    .unwrap_or_else(|err| panic!("torture session (seed {seed}) failed: {err}"));
    println!(
        "KILL9 store=dir kills={} runs={} violations={} elapsed={:.1}s\n{}",
        report.kills,
        report.runs,
        report.violations,
        report.elapsed.as_secs_f64(),
        report.check_output
    );
    assert_eq!(report.violations, 0);
    assert!(report.elapsed < Duration::from_secs(600));
}
