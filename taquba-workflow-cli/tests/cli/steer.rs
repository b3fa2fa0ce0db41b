//! Changes: `runs cancel|signal|requeue|fork|restart` sent through the inbox to a live
//! owner, `commands describe`, and `--offline` on a copied store.

use std::sync::atomic::Ordering;
use std::time::Duration;

use predicates::prelude::*;

use crate::common::{Owner, cli, copy_dir, json, run, stderr, stdout, with_stdin};

/// `commands describe ID -o json`, polled until the command is applied or
/// rejected (at most 30 s).
async fn settled_command(dir: &std::path::Path, id: &str) -> serde_json::Value {
    for _ in 0..300 {
        let value = json(
            &run(cli(dir, &["commands", "describe", id, "-o", "json"]))
                .await
                .success(),
        );
        if value["state"] == "applied" || value["state"] == "rejected" {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("command {id} was not applied within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_owner_applies_a_cancel_sent_from_another_process() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("cancel-1", 1, "timer", &[]).await;

    // Not confirmed: nothing is sent, the run stays.
    let refused = run(with_stdin(
        cli(dir.path(), &["runs", "cancel", "cancel-1"]),
        "n\n",
    ))
    .await;
    let refused = refused.code(1);
    let err = stderr(&refused);
    assert!(
        err.contains("Run cancel-1 (workflow cli-demo) is pending at step 1 (finish)"),
        "{err}"
    );
    assert!(err.contains("Its waiting step is removed"), "{err}");
    assert!(err.contains("Cancel run cancel-1? [y/N]"), "{err}");
    assert!(err.contains("not confirmed: nothing was sent"), "{err}");
    let state = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "cancel-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(state["state"], "pending");

    // Confirmed on stdin and waited for: the owner's answer is printed.
    let done = run(with_stdin(
        cli(
            dir.path(),
            &[
                "runs",
                "cancel",
                "cancel-1",
                "--reason",
                "no longer needed",
                "--wait",
                "-o",
                "json",
            ],
        ),
        "y\n",
    ))
    .await;
    let value = json(&done.success());
    assert_eq!(value["state"], "applied", "{value}");
    assert_eq!(value["answer"]["kind"], "cancelled");
    assert_eq!(value["answer"]["cancelled"], true);
    let end = owner.wait(&id).await;
    assert_eq!(end.termination.status.as_str(), "cancelled");

    let value = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "cancel-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["state"], "cancelled");
    assert_eq!(value["cancel_reason"], "no longer needed");
    let steps = json(
        &run(cli(
            dir.path(),
            &["runs", "steps", "cancel-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    let last = steps["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["outcome"], "cancelled", "{steps}");
    assert_eq!(last["error"], "no longer needed");

    // A terminated run is refused before anything is sent.
    run(cli(dir.path(), &["runs", "cancel", "cancel-1", "--yes"]))
        .await
        .code(1)
        .stderr(predicate::str::contains(
            "run cancel-1 already cancelled at step 1: there is nothing to cancel",
        ));
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_of_a_running_step_is_answered_when_the_step_returns() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("held-2", 1, "hold", &[]).await;
    // Sent without --wait: the command id is printed, to follow it.
    let mut running = false;
    for _ in 0..100 {
        let value = json(
            &run(cli(
                dir.path(),
                &["runs", "describe", "held-2", "-o", "json"],
            ))
            .await
            .success(),
        );
        if value["state"] == "running" {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(running, "the held step was claimed");
    let sent = run(cli(
        dir.path(),
        &[
            "runs", "cancel", "held-2", "--yes", "--reason", "stuck", "-o", "json",
        ],
    ))
    .await;
    let sent = sent.success();
    assert!(
        stderr(&sent).contains("The running step's cancel token fires"),
        "{}",
        stderr(&sent)
    );
    let value = json(&sent);
    assert_eq!(value["state"], "pending");
    let command = value["command_id"].as_str().unwrap().to_string();
    assert!(stderr(&sent).contains(&format!("taquba-workflow commands describe {command}")));

    // The step ignores its token; the answer follows once it returns.
    tokio::time::sleep(Duration::from_millis(500)).await;
    owner.hold.add_permits(1);
    let value = settled_command(dir.path(), &command).await;
    assert_eq!(value["answer"]["cancelled"], true, "{value}");
    assert_eq!(
        owner.wait(&id).await.termination.status.as_str(),
        "cancelled"
    );
    // The reason is kept with the run and in its history.
    let value = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "held-2", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["cancel_reason"], "stuck", "{value}");
    let steps = json(
        &run(cli(dir.path(), &["runs", "steps", "held-2", "-o", "json"]))
            .await
            .success(),
    );
    let last = steps["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["outcome"], "cancelled", "{steps}");
    assert_eq!(last["error"], "stuck", "{steps}");
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_sent_from_another_process_wakes_the_waiting_run() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("sig-1", 11, "signal", &[]).await;
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "runs",
                "signal",
                "approve:11",
                "--json",
                "\"lgtm\"",
                "--wait",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["kind"], "signalled", "{value}");
    assert_eq!(value["answer"]["outcome"], "delivered");
    assert_eq!(value["answer"]["run_id"], "sig-1");
    let end = owner.wait(&id).await;
    let result: crate::common::Summary =
        rmp_serde::from_slice(end.outcome.unwrap().result.as_deref().unwrap()).unwrap();
    assert_eq!(result.note.as_deref(), Some("lgtm"));

    // No waiter: buffered, and the text says so.
    let file = dir.path().join("payload.json");
    std::fs::write(&file, "\"later\"").unwrap();
    let text = stdout(
        &run(cli(
            dir.path(),
            &[
                "runs",
                "signal",
                "approve:12",
                "--file",
                file.to_str().unwrap(),
                "--wait",
            ],
        ))
        .await
        .success(),
    );
    assert!(
        text.contains("the signal is buffered for the next waiter"),
        "{text}"
    );
    let late = owner.start("sig-2", 12, "signal", &[]).await;
    let end = owner.wait(&late).await;
    let result: crate::common::Summary =
        rmp_serde::from_slice(end.outcome.unwrap().result.as_deref().unwrap()).unwrap();
    assert_eq!(result.note.as_deref(), Some("later"));

    // A payload that is not JSON is a usage error, before anything is sent.
    run(cli(
        dir.path(),
        &["runs", "signal", "approve:13", "--json", "{nope"],
    ))
    .await
    .code(2)
    .stderr(predicate::str::contains("--json is not valid JSON"));
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_run_is_requeued_and_a_verdict_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let flaky = owner.start("requeue-1", 6, "flaky", &[]).await;
    assert_eq!(
        owner.wait(&flaky).await.termination.status.as_str(),
        "failed"
    );
    owner.healed.store(true, Ordering::SeqCst);
    let value = json(
        &run(cli(
            dir.path(),
            &["runs", "requeue", "requeue-1", "--wait", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["kind"], "requeued", "{value}");
    assert_eq!(value["answer"]["step"], 0);
    let end = owner.wait(&flaky).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");

    // A runner's Fail verdict is not a dead letter: the owner refuses.
    let failed = owner.start("requeue-2", 1, "fail", &[]).await;
    owner.wait(&failed).await;
    run(cli(dir.path(), &["runs", "requeue", "requeue-2", "--wait"]))
        .await
        .code(1)
        .stderr(predicate::str::contains("the owner rejected command"));
    // A succeeded run is refused before anything is sent.
    run(cli(dir.path(), &["runs", "requeue", "requeue-1"]))
        .await
        .code(1)
        .stderr(predicate::str::contains(
            "only a failed run's dead-lettered step can be requeued",
        ));
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_changes_apply_to_a_copied_store_after_checking_for_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let owner = Owner::open(&live).await;
    owner.start("off-1", 1, "timer", &[]).await;
    owner.start("off-2", 21, "signal", &[]).await;
    owner.start("off-3", 3, "timer", &[]).await;
    // Copied while the owner runs (idle: every run waits), so the copy is
    // what a crashed owner leaves: never closed, its last writes in the
    // WAL.
    let copy = dir.path().join("copy");
    copy_dir(&live, &copy);
    owner.stop().await;

    // Without an owner a sent command waits in the inbox; --wait gives up
    // and says what to do.
    run(cli(
        &copy,
        &[
            "runs",
            "cancel",
            "off-1",
            "--yes",
            "--wait",
            "--wait-timeout",
            "1s",
        ],
    ))
    .await
    .code(1)
    .stderr(
        predicate::str::contains("is still pending after 1s")
            .and(predicate::str::contains("use --offline")),
    );

    // Offline: refused at first, as the copy is what a crashed owner
    // leaves (a worker start with no clean stop, no heartbeat), naming the
    // check and the override.
    let signal = |force: bool| {
        let mut args = vec![
            "runs",
            "signal",
            "approve:21",
            "--json",
            "\"offline\"",
            "--offline",
            "-o",
            "json",
        ];
        if force {
            args.push("--force");
        }
        cli(&copy, &args)
    };
    let refused = run(signal(false)).await.code(1);
    let err = stderr(&refused);
    assert!(err.contains("recorded no clean stop"), "{err}");
    assert!(err.contains("--force opens the store anyway"), "{err}");
    // With --force the command waiting in the inbox is applied first, then
    // this one; the output says what was checked and what was applied.
    let done = run(signal(true)).await;
    let done = done.success();
    let err = stderr(&done);
    assert!(
        err.contains("--force: opening the store although 1 check(s) refused:"),
        "{err}"
    );
    assert!(err.contains("heartbeat: none recorded"), "{err}");
    assert!(err.contains("commits: none for 3s"), "{err}");
    assert!(err.contains("as its writer"), "{err}");
    assert!(
        err.contains("The inbox also held 1 command(s) sent before this one"),
        "{err}"
    );
    let value = json(&done);
    assert_eq!(value["answer"]["outcome"], "delivered", "{value}");
    assert_eq!(value["answer"]["run_id"], "off-2");
    let value = json(
        &run(cli(&copy, &["runs", "describe", "off-1", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "cancelled");
    let value = json(
        &run(cli(&copy, &["runs", "describe", "off-2", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "pending");
    assert_eq!(value["step_name"], "finish");
    assert_eq!(
        value["waiting_for_signal"],
        serde_json::Value::Null,
        "{value}"
    );

    // The offline writer closed cleanly with a heartbeat: the next
    // --offline needs no --force.
    let done = run(cli(
        &copy,
        &[
            "runs",
            "cancel",
            "off-3",
            "--yes",
            "--reason",
            "offline",
            "--offline",
            "-o",
            "json",
        ],
    ))
    .await
    .success();
    let err = stderr(&done);
    assert!(err.contains("No live writer found. Checked:"), "{err}");
    assert!(err.contains("is a clean close's"), "{err}");
    let value = json(&done);
    assert_eq!(value["answer"]["cancelled"], true, "{value}");
    let value = json(
        &run(cli(&copy, &["runs", "describe", "off-3", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "cancelled");
    assert_eq!(value["cancel_reason"], "offline");

    // The original store was not touched.
    let value = json(
        &run(cli(&live, &["runs", "describe", "off-1", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_is_refused_while_a_writer_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    // An owner with a liveness heartbeat: refused at once.
    let beating = dir.path().join("beating");
    let owner = Owner::open_with(&beating, Some(Duration::from_secs(1))).await;
    owner.start("alive-1", 1, "timer", &[]).await;
    run(cli(
        &beating,
        &["runs", "cancel", "alive-1", "--yes", "--offline"],
    ))
    .await
    .code(1)
    .stderr(predicate::str::contains(
        "a writer owns the store: its liveness heartbeat is",
    ));
    owner.stop().await;

    // An owner without one, committing steps: seen by the durable sequence
    // number.
    let busy = dir.path().join("busy");
    let owner = Owner::open(&busy).await;
    owner.start("busy-1", 1_000_000, "ok", &[]).await;
    owner.start("busy-2", 1, "timer", &[]).await;
    run(cli(
        &busy,
        &["runs", "cancel", "busy-2", "--yes", "--offline"],
    ))
    .await
    .code(1)
    .stderr(predicate::str::contains(
        "a writer is committing to the store",
    ));
    let value = json(
        &run(cli(&busy, &["runs", "describe", "busy-2", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["state"], "pending", "nothing was applied");
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_forked_and_restarted_through_the_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    // Steps: begin, count 2, count 1, count 0, finish.
    let done = owner.start("fork-1", 2, "ok", &[("team", "search")]).await;
    owner.wait(&done).await;
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "runs",
                "fork",
                "fork-1",
                "--from-step",
                "2",
                "--run-id",
                "fork-2",
                "--wait",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["kind"], "forked", "{value}");
    assert_eq!(value["answer"]["new_run_id"], "fork-2");
    assert_eq!(value["answer"]["from_step"], 2);
    let fork = taquba_workflow::RunId::new("fork-2").unwrap();
    let end = owner.wait(&fork).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");
    let described = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "fork-2", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(described["forked_from"]["run_id"], "fork-1", "{described}");
    assert_eq!(described["forked_from"]["step"], 2);
    assert_eq!(described["headers"]["team"], "search");
    let card = stdout(
        &run(cli(dir.path(), &["runs", "describe", "fork-2"]))
            .await
            .success(),
    );
    assert!(
        card.contains("Forked from") && card.contains("run fork-1, step 2"),
        "{card}"
    );
    // Past the run's end: refused before anything is sent.
    run(cli(
        dir.path(),
        &["runs", "fork", "fork-1", "--from-step", "9"],
    ))
    .await
    .code(1)
    .stderr(predicate::str::contains(
        "step 9 of run fork-1 can no longer be forked: the run ended at step 4",
    ));

    // An active run: refused, unless --cancel cancels it first.
    let busy = owner.start("fork-busy", 1, "timer", &[]).await;
    run(cli(dir.path(), &["runs", "restart", "fork-busy"]))
        .await
        .code(1)
        .stderr(predicate::str::contains("pass --cancel"));
    let value = json(
        &run(cli(
            dir.path(),
            &[
                "runs",
                "restart",
                "fork-busy",
                "--cancel",
                "--run-id",
                "fork-busy-2",
                "--wait",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["kind"], "forked", "{value}");
    assert_eq!(value["answer"]["from_step"], 0);
    assert_eq!(
        owner.wait(&busy).await.termination.status.as_str(),
        "cancelled"
    );
    let described = json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "fork-busy-2", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(
        described["forked_from"]["run_id"], "fork-busy",
        "{described}"
    );
    assert_eq!(described["forked_from"]["step"], 0);
    owner.stop().await;
}
