//! Reads: `runs list|describe|steps|result`, `groups`, `store info`, the
//! discovery of the queue and runtime, exit codes.

use std::time::Duration;

use crate::common::{self, Owner, cli, copy_dir, json, run, stderr, stdout, time_filters};
use predicates::prelude::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_store_is_described_from_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let done = owner.start("done-1", 3, "ok", &[("tenant", "acme")]).await;
    owner.wait(&done).await;
    let failed = owner.start("failed-1", 4, "fail", &[]).await;
    owner.wait(&failed).await;
    owner.start("waiting-1", 7, "signal", &[]).await;

    let described = run(cli(dir.path(), &["runs", "describe", "done-1"])).await;
    let text = stdout(&described.success());
    insta::with_settings!({ filters => time_filters() }, {
        insta::assert_snapshot!("describe_succeeded", text);
    });

    let described = run(cli(
        dir.path(),
        &["runs", "describe", "waiting-1", "-o", "json"],
    ))
    .await;
    let value = json(&described.success());
    assert_eq!(value["state"], "pending");
    assert_eq!(value["current_step"], 1);
    assert!(value["termination"].is_null());

    // A failed run's result is printed, and the exit code says it failed.
    let result = run(cli(dir.path(), &["runs", "result", "failed-1"])).await;
    let result = result.code(1);
    assert!(stdout(&result).contains("asked to fail with n=4"));
    assert!(
        stderr(&result).contains("run failed-1 failed"),
        "{}",
        stderr(&result)
    );

    // An active run has no result yet.
    run(cli(dir.path(), &["runs", "result", "waiting-1"]))
        .await
        .code(1)
        .stderr(
            predicate::str::contains("waiting-1 is pending at step 1")
                .and(predicate::str::contains("--wait")),
        );

    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_wait_follows_a_live_run_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("approval-1", 5, "signal", &[]).await;
    let waiting = tokio::spawn(run(cli(
        dir.path(),
        &[
            "runs",
            "result",
            "approval-1",
            "--wait",
            "--timeout",
            "60s",
            "-o",
            "json",
        ],
    )));
    // The CLI is polling; the run ends only after the signal.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiting.is_finished());
    owner
        .runtime
        .signal_value("approve:5", "ship it")
        .await
        .unwrap();
    owner.wait(&id).await;
    let value = json(&waiting.await.unwrap().success());
    assert_eq!(value["termination"]["status"], "succeeded");
    assert_eq!(
        value["outcome"]["result"]["value"],
        serde_json::json!({ "total": 5, "note": "ship it" })
    );

    // A bounded wait on a run that stays active gives up, naming it.
    owner.start("forever-1", 9, "timer", &[]).await;
    run(cli(
        dir.path(),
        &["runs", "result", "forever-1", "--wait", "--timeout", "1s"],
    ))
    .await
    .code(1)
    .stderr(predicate::str::contains(
        "run forever-1 is still pending at step 1 after 1s",
    ));
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_info_reports_counts_dead_letters_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let ok = owner.start("ok-1", 2, "ok", &[]).await;
    owner.wait(&ok).await;
    let flaky = owner.start("flaky-1", 1, "flaky", &[]).await;
    let end = owner.wait(&flaky).await;
    assert_eq!(end.termination.status.as_str(), "failed");
    owner.start("timer-1", 1, "timer", &[]).await;

    let info = run(cli(dir.path(), &["store", "info", "-o", "json"])).await;
    let value = json(&info.success());
    assert_eq!(value["db"], common::DB);
    let queue = value["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "workflow-steps")
        .expect("the runtime's queue is listed")
        .clone();
    assert_eq!(queue["dead"], 1);
    assert_eq!(queue["scheduled"], 1);
    let dead = &value["dead_letters"][0];
    assert_eq!(dead["run_id"], "flaky-1");
    assert_eq!(dead["attempts"], common::MAX_ATTEMPTS);
    assert!(
        dead["last_error"]
            .as_str()
            .unwrap()
            .contains("flaky dependency (n=1)")
    );
    let prefixes: Vec<&str> = value["prefixes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["prefix"].as_str().unwrap())
        .collect();
    assert!(prefixes.contains(&common::DB), "{prefixes:?}");
    assert!(prefixes.contains(&"workflow-steps-memo"), "{prefixes:?}");
    assert!(value["total_bytes"].as_u64().unwrap() > 0);
    assert!(value["writer"]["epoch"].as_u64().unwrap() >= 1);
    assert_eq!(value["runtimes"][0]["queue_name"], "workflow-steps");
    assert_eq!(value["runtimes"][0]["memo_prefix"], "workflow-steps-memo");

    let text = stdout(&run(cli(dir.path(), &["store", "info"])).await.success());
    assert!(text.contains("Dead letters"), "{text}");
    assert!(text.contains("(run flaky-1) after 2/2 attempts"), "{text}");
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_store_is_inspected_with_no_process_owning_it() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let owner = Owner::open(&live).await;
    let done = owner.start("copied-1", 2, "ok", &[]).await;
    owner.wait(&done).await;
    owner.start("copied-2", 3, "timer", &[]).await;
    owner.stop().await;
    let copy = dir.path().join("copy");
    copy_dir(&live, &copy);
    std::fs::remove_dir_all(&live).unwrap();

    let value = json(
        &run(cli(&copy, &["runs", "result", "copied-1", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(
        value["outcome"]["result"]["value"],
        serde_json::json!({ "total": 3, "note": null })
    );
    let value = json(
        &run(cli(&copy, &["runs", "describe", "copied-2", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "pending");

    // Reading wrote nothing: the copy is byte for byte what it was.
    let before = tree(&copy);
    run(cli(&copy, &["store", "info"])).await.success();
    assert_eq!(tree(&copy), before);
}

/// Every file under `dir` with its size, sorted.
fn tree(dir: &std::path::Path) -> Vec<(String, u64)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read the directory") {
            let entry = entry.expect("a directory entry");
            if entry.file_type().expect("its type").is_dir() {
                stack.push(entry.path());
            } else {
                files.push((
                    entry.path().display().to_string(),
                    entry.metadata().expect("its metadata").len(),
                ));
            }
        }
    }
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_path_is_discovered_or_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    run(cli(dir.path(), &["store", "info"]))
        .await
        .code(2)
        .stderr(predicate::str::contains("no queue found"));

    // Two queues in one store: the error lists them and asks for --db.
    let owner = Owner::open(dir.path()).await;
    owner.stop().await;
    let other = taquba::Queue::open(
        std::sync::Arc::new(
            taquba::object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap(),
        ),
        "other-db",
    )
    .await
    .unwrap();
    other.close().await.unwrap();
    run(cli(dir.path(), &["store", "info"]))
        .await
        .code(2)
        .stderr(predicate::str::contains(
            "holds several queues (demo, other-db): pass --db",
        ));
    let value = json(
        &run(cli(
            dir.path(),
            &["--db", "other-db", "store", "info", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["db"], "other-db");
    // The queue's own directory given as the store: the error says what to
    // pass instead.
    run(cli(&dir.path().join("demo"), &["store", "info"]))
        .await
        .code(2)
        .stderr(predicate::str::contains("is a queue's own directory"));
    run(cli(dir.path(), &["--db", "missing", "store", "info"]))
        .await
        .code(1)
        .stderr(predicate::str::contains("\"missing\""));
}

#[test]
fn usage_errors_exit_2_and_failures_exit_1_naming_the_value() {
    let dir = tempfile::tempdir().unwrap();
    cli(dir.path(), &["runs", "describe", "a/b"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("a/b"));
    cli(dir.path(), &["runs", "list", "--since", "soon"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("soon"));
    let missing = dir.path().join("nowhere");
    cli(&missing, &["store", "info"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains(missing.display().to_string()));
    assert!(!missing.exists(), "a read never creates a store");
    assert_cmd::Command::cargo_bin("taquba-workflow")
        .unwrap()
        .env_remove("TAQUBA_WORKFLOW_STORE")
        .args(["store", "info"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--store"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_run_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let done = owner.start("known-1", 1, "ok", &[]).await;
    owner.wait(&done).await;
    for command in ["describe", "result"] {
        run(cli(dir.path(), &["runs", command, "unknown-7"]))
            .await
            .code(1)
            .stderr(predicate::str::contains("run unknown-7 not found"));
    }
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_filtered_and_paged() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let a = owner.start("list-a", 1, "ok", &[]).await;
    owner.wait(&a).await;
    let b = owner.start("list-b", 2, "fail", &[]).await;
    owner.wait(&b).await;
    owner.start("list-c", 3, "signal", &[]).await;
    owner.start("list-d", 4, "timer", &[]).await;

    let ids = |value: &serde_json::Value| -> Vec<String> {
        value
            .as_array()
            .expect("a JSON array")
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let list = |args: &'static [&'static str]| {
        let mut all = vec!["runs", "list", "-o", "json"];
        all.extend_from_slice(args);
        run(cli(dir.path(), &all))
    };
    assert_eq!(ids(&json(&list(&[]).await.success())), ["list-c", "list-d"]);
    assert_eq!(
        ids(&json(&list(&["--status", "all"]).await.success())),
        ["list-a", "list-b", "list-c", "list-d"]
    );
    assert_eq!(
        ids(&json(&list(&["--status", "terminated"]).await.success())),
        ["list-a", "list-b"]
    );
    assert_eq!(
        ids(&json(
            &list(&["--status", "all", "--workflow", "cli-demo", "--since", "1h"])
                .await
                .success()
        ))
        .len(),
        4
    );
    assert!(
        ids(&json(
            &list(&["--status", "all", "--workflow", "other"])
                .await
                .success()
        ))
        .is_empty()
    );

    // Versions and patches: every run started on `demo-1` with
    // `demo-patch`.
    assert_eq!(
        ids(&json(
            &list(&["--status", "all", "--version", "demo-1"])
                .await
                .success()
        ))
        .len(),
        4
    );
    assert!(
        ids(&json(
            &list(&["--status", "all", "--version", "demo-0"])
                .await
                .success()
        ))
        .is_empty()
    );
    assert!(
        ids(&json(
            &list(&["--lacks-patch", "demo-patch"]).await.success()
        ))
        .is_empty(),
        "no active run lacks the patch: it can be retired"
    );
    assert_eq!(
        ids(&json(
            &list(&["--lacks-patch", "other-patch"]).await.success()
        )),
        ["list-c", "list-d"]
    );
    let listed = json(&list(&["--status", "all"]).await.success());
    assert_eq!(listed[0]["version"], "demo-1");
    assert_eq!(listed[0]["patches"][0], "demo-patch");

    // Pages: the text footer names the cursor, `--after` continues.
    let first = run(cli(
        dir.path(),
        &["runs", "list", "--status", "all", "--limit", "2"],
    ))
    .await;
    let text = stdout(&first.success());
    assert!(
        text.contains("Showing the first 2 runs; more after list-b (`--after list-b`)."),
        "{text}"
    );
    assert_eq!(
        ids(&json(
            &list(&["--status", "all", "--after", "list-b"])
                .await
                .success()
        )),
        ["list-c", "list-d"]
    );

    // JSON lines: one object per line.
    let lines = stdout(
        &run(cli(
            dir.path(),
            &["runs", "list", "--status", "all", "-o", "jsonl"],
        ))
        .await
        .success(),
    );
    let parsed: Vec<serde_json::Value> = lines
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    assert_eq!(parsed.len(), 4);
    assert_eq!(parsed[1]["state"], "failed");
    assert_eq!(parsed[1]["error"], "asked to fail with n=2");
    assert_eq!(parsed[2]["step_name"], "finish");

    let table = stdout(
        &run(cli(
            dir.path(),
            &["runs", "list", "--status", "all", "--time-format", "iso"],
        ))
        .await
        .success(),
    );
    insta::with_settings!({ filters => time_filters() }, {
        insta::assert_snapshot!("list_all", table);
    });
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_show_each_attempt_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let ok = owner.start("steps-ok", 2, "ok", &[]).await;
    owner.wait(&ok).await;
    let flaky = owner.start("steps-flaky", 1, "flaky", &[]).await;
    owner.wait(&flaky).await;

    let table = stdout(
        &run(cli(
            dir.path(),
            &["runs", "steps", "steps-ok", "--time-format", "iso"],
        ))
        .await
        .success(),
    );
    let mut filters = time_filters();
    // The durations vary, and with them the column's width.
    filters.push((
        r"\b\d+(ms|s)( \d+ms)?\s+(continued|succeeded)",
        "[TOOK]  $3",
    ));
    filters.push((r"TOOK\s+OUTCOME", "TOOK  OUTCOME"));
    insta::with_settings!({ filters => filters }, {
        insta::assert_snapshot!("steps_ok", table);
    });

    let value = json(
        &run(cli(
            dir.path(),
            &["runs", "steps", "steps-flaky", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["steps_taken"], 1);
    let attempts = value["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{value}");
    assert_eq!(attempts[0]["name"], "begin");
    assert_eq!(attempts[0]["outcome"], "retried");
    assert_eq!(attempts[0]["error"], "flaky dependency (n=1)");
    assert_eq!(attempts[1]["attempt"], 2);
    assert_eq!(attempts[1]["outcome"], "failed");
    assert_eq!(attempts[1]["error_kind"], "transient");
    assert_eq!(value["version"], "demo-1");
    assert_eq!(attempts[1]["version"], "demo-1");

    run(cli(dir.path(), &["runs", "steps", "steps-none"]))
        .await
        .code(1)
        .stderr(predicate::str::contains("run steps-none not found"));
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_run_is_described_with_its_wait_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner
        .start("wait-1", 3, "signal", &[("tenant", "acme")])
        .await;
    let value = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "wait-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["state"], "pending");
    assert_eq!(value["workflow"], "cli-demo");
    assert_eq!(value["step_name"], "finish");
    assert_eq!(value["waiting_for_signal"]["correlation_key"], "approve:3");
    assert!(
        value["waiting_for_signal"]["timeout_at_ms"]
            .as_u64()
            .is_some()
    );
    assert_eq!(value["headers"]["tenant"], "acme");
    assert!(value["submitted_at_ms"].as_u64().is_some());

    let text = stdout(
        &run(cli(dir.path(), &["runs", "describe", "wait-1"]))
            .await
            .success(),
    );
    insta::with_settings!({ filters => time_filters() }, {
        insta::assert_snapshot!("describe_waiting", text);
    });

    owner.start("held-1", 1, "hold", &[]).await;
    // Running once the claim is visible to the reader.
    let mut state = String::new();
    for _ in 0..100 {
        let value = json(
            &run(cli(
                dir.path(),
                &["runs", "describe", "held-1", "-o", "json"],
            ))
            .await
            .success(),
        );
        state = value["state"].as_str().unwrap().to_string();
        if state == "running" {
            assert_eq!(value["attempts"], 1);
            assert_eq!(value["max_attempts"], common::MAX_ATTEMPTS);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "running");
    owner.hold.add_permits(1);
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_listed_with_their_counts() {
    use taquba_workflow::GroupMember;
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let group = owner
        .runtime
        .group(taquba_workflow::RunId::new("batch-1").unwrap());
    let member = |key: &str, mode: &str| GroupMember {
        key: key.to_string(),
        input: common::demo_input(1, mode),
    };
    group
        .submit(
            vec![member("a", "ok"), member("b", "fail"), member("c", "timer")],
            &taquba_workflow::RunOptions::default(),
        )
        .await
        .unwrap();
    // Two members terminate; the third waits on its timer.
    for _ in 0..200 {
        let status = group.status().await.unwrap();
        if status.succeeded + status.failed == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let value = json(
        &run(cli(dir.path(), &["groups", "list", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value[0]["group_id"], "batch-1");
    assert_eq!(value[0]["total"], 3);
    assert_eq!(value[0]["succeeded"], 1);
    assert_eq!(value[0]["failed"], 1);
    assert_eq!(value[0]["pending"], 1);

    let value = json(
        &run(cli(
            dir.path(),
            &["groups", "describe", "batch-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["members"].as_array().unwrap().len(), 3);
    let text = stdout(
        &run(cli(dir.path(), &["groups", "describe", "batch-1"]))
            .await
            .success(),
    );
    assert!(text.contains("Members:    3"), "{text}");
    run(cli(dir.path(), &["groups", "describe", "batch-9"]))
        .await
        .code(1)
        .stderr(predicate::str::contains("group batch-9 not found"));
    drop(group);
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_runtimes_in_one_queue_are_told_apart_by_queue() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let done = owner.start("main-1", 1, "ok", &[]).await;
    owner.wait(&done).await;
    // A second runtime over the same queue, under its own queue name.
    let other = taquba_workflow::WorkflowRuntime::builder(
        owner.queue.clone(),
        owner.store.clone(),
        common::Demo {
            hold: owner.hold.clone(),
            healed: owner.healed.clone(),
        },
        taquba_workflow::NoopTerminalHook,
    )
    .queue_name("other-steps")
    .poll_interval(Duration::from_millis(50))
    .build();
    let worker = other.spawn(std::future::pending::<()>());
    let mut recorded = 0;
    for _ in 0..100 {
        let value = json(
            &run(cli(dir.path(), &["store", "info", "-o", "json"]))
                .await
                .success(),
        );
        recorded = value["runtimes"].as_array().map_or(0, Vec::len);
        if recorded == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(recorded, 2, "both runtimes record themselves");

    run(cli(dir.path(), &["runs", "list"]))
        .await
        .code(2)
        .stderr(predicate::str::contains(
            "several runtimes (other-steps, workflow-steps): pass --queue",
        ));
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "--queue",
                "workflow-steps",
                "runs",
                "list",
                "--status",
                "all",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value[0]["run_id"], "main-1");
    // The runtime picked gives the memo prefix: results are read there.
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "--queue",
                "workflow-steps",
                "runs",
                "result",
                "main-1",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["outcome"]["result"]["value"]["total"], 1, "{value}");
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "--queue",
                "other-steps",
                "runs",
                "result",
                "main-1",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["outcome"], serde_json::Value::Null, "{value}");
    worker.shutdown().await.unwrap();
    drop(other);
    owner.stop().await;
}
