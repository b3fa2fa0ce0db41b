//! Review 41 (d): the CLI under bad input, hostile inbox objects written
//! straight into a live owner's inbox, and reads racing the writer.

use std::path::Path;
use std::time::Duration;

use crate::common::{Owner, cli, json, run, stderr};

/// The inbox directory of the harness's runtime.
fn inbox(dir: &Path) -> std::path::PathBuf {
    dir.join("workflow-steps-memo").join("inbox").join("v1")
}

/// `commands describe ID -o json`, polled until settled (at most 30 s).
async fn settled(dir: &Path, id: &str) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    for _ in 0..300 {
        last = json(
            &run(cli(dir, &["commands", "describe", id, "-o", "json"]))
                .await
                .success(),
        );
        if last["state"] == "applied" || last["state"] == "rejected" {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left: Vec<_> = std::fs::read_dir(inbox(dir))
        .map(|d| d.map(|e| e.expect("an inbox entry").file_name()).collect())
        .unwrap_or_default();
    panic!("command {id} was not settled within 30 s: {last}; inbox: {left:?}");
}

/// `runs signal KEY` with neither `--json` nor `--file`: the docs give the
/// command as `runs signal KEY --json '…' | --file F`, so the error must
/// say one of the two is needed, not that both are (they conflict).
#[test]
fn a_signal_without_a_payload_asks_for_one_of_the_two() {
    let dir = tempfile::tempdir().unwrap();
    let out = cli(dir.path(), &["runs", "signal", "approve:1"])
        .assert()
        .code(2);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(
        !err.contains("--json <JSON> --file <FILE>"),
        "the usage line demands both conflicting flags:\n{err}"
    );
    let required = err
        .lines()
        .skip_while(|l| !l.contains("required arguments were not provided"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .count();
    assert!(
        required <= 1,
        "the error lists {required} required flags, though only one of them may be given:\n{err}"
    );
}

/// Every bad value is refused with the documented exit code and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_exit_with_the_documented_code_and_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let done = owner.start("one-1", 1, "ok", &[]).await;
    owner.wait(&done).await;
    owner.stop().await;
    let cases: &[(&[&str], i32, &str)] = &[
        (&["runs", "list", "--limit", "0"], 2, "0"),
        (&["runs", "list", "--limit", "-3"], 2, "-3"),
        (&["runs", "list", "--after", "a/b"], 2, "a/b"),
        (&["runs", "list", "--group", "../g"], 2, "../g"),
        (&["runs", "describe", "../../etc"], 2, "../../etc"),
        (
            &["runs", "fork", "x", "--from-step", "4294967296"],
            2,
            "4294967296",
        ),
        (&["commands", "describe", "../inbox"], 2, "../inbox"),
        (
            &["commands", "describe", "01M95S764D40HB273KW8C9MFM"],
            2,
            "01M95S764D40HB273KW8C9MFM",
        ),
    ];
    for (args, code, named) in cases {
        let out = cli(dir.path(), args).assert().code(*code);
        let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
        assert!(
            err.contains(named),
            "{args:?}: stderr does not name {named:?}:\n{err}"
        );
        assert!(
            out.get_output().stdout.is_empty(),
            "{args:?}: wrote to stdout"
        );
    }
    let missing = dir.path().join("no-such-store");
    let out = cli(&missing, &["runs", "list", "-o", "json"])
        .assert()
        .code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(out.get_output().stdout.is_empty());
    assert!(!missing.exists(), "a read created the store");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a store").unwrap();
    let out = cli(&file, &["store", "info"]).assert().code(1);
    let err = String::from_utf8_lossy(&out.get_output().stderr).into_owned();
    assert!(err.contains(&file.display().to_string()), "{err}");
}

/// Hostile objects written straight into a live owner's inbox under
/// well-formed names are rejected, each with a recorded error that
/// `commands describe` shows, and a real cancel written after them is
/// still applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_inbox_objects_are_rejected_and_described() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner.start("wait-1", 1, "signal", &[]).await;
    let inbox = inbox(dir.path());
    std::fs::create_dir_all(&inbox).unwrap();
    let garbage = "01M95S764D40HB273KW8C9MFA0";
    let empty = "01M95S764D40HB273KW8C9MFA1";
    let huge = "01M95S764D40HB273KW8C9MFA2";
    std::fs::write(
        inbox.join(format!("{garbage}.msgpack")),
        b"\xc1\xff garbage",
    )
    .unwrap();
    std::fs::write(inbox.join(format!("{empty}.msgpack")), b"").unwrap();
    std::fs::write(
        inbox.join(format!("{huge}.msgpack")),
        vec![0x90u8; 2 * 1024 * 1024],
    )
    .unwrap();
    std::fs::write(inbox.parent().unwrap().join("touch"), garbage.as_bytes()).unwrap();
    for id in [garbage, empty, huge] {
        let answer = settled(dir.path(), id).await;
        assert_eq!(answer["state"], "rejected", "{id}: {answer}");
        let error = answer.to_string();
        assert!(
            error.len() > 40,
            "{id}: the rejection names nothing: {answer}"
        );
    }
    let huge_answer = settled(dir.path(), huge).await.to_string();
    assert!(
        huge_answer.contains("1048576")
            || huge_answer.contains("2097152")
            || huge_answer.contains("MiB"),
        "the rejection of an oversized command names no size: {huge_answer}"
    );
    let sent = run(cli(
        dir.path(),
        &["runs", "cancel", "wait-1", "--yes", "--wait", "-o", "json"],
    ))
    .await
    .success();
    let answer = json(&sent);
    assert_eq!(answer["state"], "applied", "{answer}");
    let left: Vec<_> = std::fs::read_dir(&inbox)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".msgpack"))
        .collect();
    assert!(
        left.is_empty(),
        "handled objects left in the inbox: {left:?}"
    );
    owner.stop().await;
}

/// The same cancel applied twice (sent twice) is answered once as a
/// cancel, the second refused by name, and a cancel racing the run's end
/// never turns a succeeded run into a cancelled one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cancel_and_a_cancel_of_an_ended_run_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner.start("wait-2", 2, "signal", &[]).await;
    let first = json(
        &run(cli(
            dir.path(),
            &["runs", "cancel", "wait-2", "--yes", "--wait", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(first["state"], "applied", "{first}");
    let again = run(cli(
        dir.path(),
        &["runs", "cancel", "wait-2", "--yes", "--wait"],
    ))
    .await;
    let err = stderr(&again);
    again.code(1);
    assert!(err.contains("wait-2"), "{err}");
    let done = owner.start("quick-1", 3, "ok", &[]).await;
    owner.wait(&done).await;
    let late = run(cli(dir.path(), &["runs", "cancel", "quick-1", "--yes"])).await;
    late.code(1);
    let described = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "quick-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(described["state"], "succeeded", "{described}");
    owner.stop().await;
}

/// Listing while the owner writes: every read is valid JSON and exits 0,
/// and paging with the printed cursor gives each run once, in id order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_read_while_the_owner_writes_are_whole_and_page_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let mut last = Vec::new();
    for round in 0..4 {
        for i in 0..5 {
            last.push(owner.start(&format!("r{round}-{i}"), 3, "ok", &[]).await);
        }
        for output in ["json", "jsonl"] {
            let out = run(cli(
                dir.path(),
                &["runs", "list", "--status", "all", "-o", output],
            ))
            .await
            .success();
            let text = String::from_utf8_lossy(&out.get_output().stdout).into_owned();
            if output == "json" {
                let value: serde_json::Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
                assert!(value.is_array(), "{value}");
            } else {
                for line in text.lines() {
                    let value: serde_json::Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("a line is not JSON ({e}): {line}"));
                    assert!(value.is_object(), "{line}");
                }
            }
        }
    }
    for id in &last {
        owner.wait(id).await;
    }
    let mut seen: Vec<String> = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..20 {
        let mut args = vec![
            "runs", "list", "--status", "all", "--limit", "3", "-o", "json",
        ];
        if let Some(a) = &after {
            args.push("--after");
            args.push(a);
        }
        let page = json(&run(cli(dir.path(), &args)).await.success());
        let ids: Vec<String> = page
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect();
        if ids.is_empty() {
            break;
        }
        after = ids.last().cloned();
        seen.extend(ids);
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "pages out of order or repeating");
    assert_eq!(seen.len(), 20, "{seen:?}");
    owner.stop().await;
}

/// Two requeues of one dead-lettered run, and two forks under one
/// `--run-id`, sent while no owner runs and applied together in the
/// owner's first round: the step is requeued once (one answer says
/// `requeued`, the run's steps run once more) and the fork makes one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_requeues_and_forks_applied_in_one_round_act_once() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let flaky = owner.start("dead-9", 4, "flaky", &[]).await;
    assert_eq!(
        owner.wait(&flaky).await.termination.status.as_str(),
        "failed"
    );
    let done = owner.start("done-9", 2, "ok", &[]).await;
    owner.wait(&done).await;
    owner.stop().await;

    let mut ids = Vec::new();
    for args in [
        &["runs", "requeue", "dead-9", "-o", "json"][..],
        &["runs", "requeue", "dead-9", "-o", "json"][..],
        &[
            "runs",
            "fork",
            "done-9",
            "--from-step",
            "1",
            "--run-id",
            "fork-9",
            "-o",
            "json",
        ][..],
        &[
            "runs",
            "fork",
            "done-9",
            "--from-step",
            "1",
            "--run-id",
            "fork-9",
            "-o",
            "json",
        ][..],
    ] {
        let sent = json(&run(cli(dir.path(), args)).await.success());
        let id = sent["command_id"]
            .as_str()
            .or_else(|| sent["id"].as_str())
            .unwrap_or_else(|| panic!("no command id in {sent}"))
            .to_string();
        ids.push(id);
    }
    let owner = Owner::open(dir.path()).await;
    owner
        .healed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let mut answers = Vec::new();
    for id in &ids {
        answers.push(settled(dir.path(), id).await);
    }
    let requeued = answers[..2]
        .iter()
        .filter(|a| a["answer"]["kind"] == "requeued")
        .count();
    assert_eq!(requeued, 1, "one run requeued twice: {answers:#?}");
    let end = owner.wait(&flaky).await;
    let steps = json(
        &run(cli(dir.path(), &["runs", "steps", "dead-9", "-o", "json"]))
            .await
            .success(),
    );
    let finishes = steps["attempts"]
        .as_array()
        .unwrap_or_else(|| panic!("no attempts in {steps}"))
        .iter()
        .filter(|s| s["name"] == "finish")
        .count();
    assert!(
        finishes <= 1,
        "the step after the requeued one ran {finishes} times ({end:?}): {steps:#}"
    );
    let runs = json(
        &run(cli(
            dir.path(),
            &["runs", "list", "--status", "all", "-o", "json"],
        ))
        .await
        .success(),
    );
    let forks = runs
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["run_id"].as_str().unwrap().starts_with("fork-9"))
        .count();
    assert_eq!(forks, 1, "{runs:#}");
    owner.stop().await;
}

/// `--queue NAME` or `--memo-prefix PREFIX` naming no runtime the store
/// records: a command sent with it lands in an inbox no owner reads, so
/// it must be refused before anything is sent, naming the value (docs:
/// "errors name the run, the path or the value"; `--queue NAME`
/// "default: the only runtime the store records").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_for_a_runtime_the_store_does_not_record_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner.start("wait-q", 5, "signal", &[]).await;
    for (flag, value, written) in [
        ("--queue", "nope", "nope-memo"),
        ("--memo-prefix", "typo-memo", "typo-memo"),
        ("--memo-prefix", "../../elsewhere", "%2E%2E"),
    ] {
        let out = run(cli(
            dir.path(),
            &[flag, value, "runs", "cancel", "wait-q", "--yes"],
        ))
        .await;
        let code = out.get_output().status.code();
        let err = stderr(&out);
        let stray = dir.path().join(written);
        assert!(
            code == Some(1) && err.contains(value) && !stray.exists(),
            "{flag} {value}: exit {code:?}, stray inbox {} exists: {}; stderr:\n{err}",
            stray.display(),
            stray.exists()
        );
    }
    let described = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "wait-q", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(described["state"], "pending", "{described}");
    owner.stop().await;
}
