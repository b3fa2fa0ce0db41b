//! kill -9 torture on a local directory: a child process running many
//! multi-step runs (memo writes, KV effects, signal waits, a group per
//! batch, terminal hooks) is killed with SIGKILL at random moments and
//! restarted; a final check verifies that every run terminated with the
//! right result, no committed step or hook ran again, every committed
//! effect is there once, and `forget`/retention left nothing behind. And
//! a child killed while it submits or resumes a group of 3000 members
//! (the `group_crash_child` binary): every member then ends once.
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

/// The `group_crash_child` binary is killed with SIGKILL while it submits
/// (or resumes) a group of 3000 members, several times, and then finishes
/// the group: every member ends Succeeded, no member's step 0 committed a
/// success twice, each member's step 0 ran in one run (two for members
/// that fail their first run), and no committed step 0 ran again.
#[test]
fn kill9_during_a_3000_member_group_submission_then_resume_completes_each_member_once() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let child = env!("CARGO_BIN_EXE_group_crash_child");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let state = dir.path().join("state");
    let members = std::env::var("GROUP_CRASH_MEMBERS").unwrap_or_else(|_| "3000".into());
    let started = Instant::now();
    // (mode, kill delay in ms after the marker line, marker)
    let plan: &[(&str, u64, &str)] = &[
        ("submit", 0, "SUBMITTING"),
        ("submit", 15, "SUBMITTING"),
        ("resume", 40, "SUBMITTING"),
        ("submit", 90, "SUBMITTING"),
        ("resume", 160, "SUBMITTING"),
        ("resume", 250, "SUBMITTING"),
        ("submit", 400, "SUBMITTING"),
        ("resume", 550, "SUBMITTING"),
        ("resume", 30, "SUBMITTED"),
        ("submit", 5, "SUBMITTING"),
    ];
    let mut notes = Vec::new();
    for (k, (mode, delay, marker)) in plan.iter().enumerate() {
        let log = std::fs::File::create(dir.path().join(format!("child-{k}.log"))).unwrap();
        let mut process = Command::new(child)
            .args(["--store", store.to_str().unwrap()])
            .args(["--state", state.to_str().unwrap()])
            .args(["--members", &members])
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the child");
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let stdout = process.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut seen = Vec::new();
        loop {
            match lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => {
                    let hit = line.starts_with(marker);
                    seen.push(line);
                    if hit {
                        break;
                    }
                }
                Err(_) => {
                    let _ = process.kill();
                    let log = std::fs::read_to_string(dir.path().join(format!("child-{k}.log")))
                        .unwrap_or_default();
                    panic!("child {k} ({mode}) never printed {marker}: {seen:?}\n{log}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(*delay));
        assert!(
            process.try_wait().unwrap().is_none(),
            "child {k} exited by itself"
        );
        process.kill().unwrap();
        process.wait().unwrap();
        seen.extend(lines.try_iter());
        notes.push(format!(
            "kill {k}: {mode}, {delay} ms after {marker}; child printed {:?}",
            seen
        ));
    }
    let output = Command::new(child)
        .args(["--store", store.to_str().unwrap()])
        .args(["--state", state.to_str().unwrap()])
        .args(["--members", &members])
        .arg("check")
        .output()
        .expect("run the check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{}", notes.join("\n"));
    println!("{stdout}");
    println!("elapsed {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        output.status.success(),
        "check failed ({}):\n{stdout}\n{}",
        output.status,
        stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
}
