//! `keys list` and `keys describe` against a live owner's store, a keyed
//! run's key on `runs describe`, and the dashboard's Keys page.

use std::time::Duration;

use taquba_workflow::{RunId, RunOptions, RunSpec};

use crate::common::{Owner, cli, demo_input, json, run, stdout};

/// Runs `k1` (holding the key, on an hour's timer), `k2` and `k3`
/// (waiting) under `customer:acme`.
async fn owner_with_keyed_runs(dir: &std::path::Path) -> Owner {
    let owner = Owner::open(dir).await;
    for id in ["k1", "k2", "k3"] {
        let options = RunOptions {
            concurrency_key: Some("customer:acme".into()),
            ..RunOptions::default()
        };
        owner
            .runtime
            .submit(RunSpec {
                run_id: Some(RunId::new(id).expect("valid run id")),
                input: demo_input(1, "timer"),
                options,
                ..RunSpec::default()
            })
            .await
            .expect("start the run");
    }
    owner
}

/// `keys list -o json`, polled until `check` holds (at most 30 s): the
/// reader follows the owner's flushes.
async fn keys_until(
    dir: &std::path::Path,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    for _ in 0..300 {
        let value = json(
            &run(cli(dir, &["keys", "list", "-o", "json"]))
                .await
                .success(),
        );
        if check(&value) {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the keys did not reach the state within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_listed_and_described_with_their_waiting_runs() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let owner = owner_with_keyed_runs(dir.path()).await;
    let listed = keys_until(dir.path(), |v| {
        v.as_array()
            .is_some_and(|a| a.len() == 1 && a[0]["waiting"] == 2)
    })
    .await;
    assert_eq!(listed[0]["key"], "customer:acme");
    assert_eq!(listed[0]["active"], 1);

    let text = stdout(&run(cli(dir.path(), &["keys", "list"])).await.success());
    assert!(text.contains("customer:acme"), "{text}");
    let card = stdout(
        &run(cli(dir.path(), &["keys", "describe", "customer:acme"]))
            .await
            .success(),
    );
    let (k1, k2, k3) = (
        card.find("k1").expect("k1"),
        card.find("k2").expect("k2"),
        card.find("k3").expect("k3"),
    );
    assert!(
        k1 < k2 && k2 < k3,
        "holder, then the waiters in order: {card}"
    );
    let described = stdout(
        &run(cli(dir.path(), &["runs", "describe", "k2"]))
            .await
            .success(),
    );
    assert!(
        described.contains("customer:acme (limit 1, waiting for a slot)"),
        "{described}"
    );
    let refused = run(cli(dir.path(), &["keys", "describe", "a/b"]))
        .await
        .failure();
    let message = crate::common::stderr(&refused);
    assert!(message.contains("\"a/b\""), "{message}");

    #[cfg(feature = "ui")]
    {
        use crate::ui::page_with;
        use crate::web::Dashboard;
        let ui = Dashboard::start(dir.path(), &["--read-only"]).await;
        let page = page_with(&ui, "/keys", "customer:acme").await;
        page.has(&[
            "href=\"/runs/k1\"",
            "href=\"/runs/k2\"",
            "href=\"/runs/k3\"",
        ]);
        page_with(&ui, "/runs/k3", "limit 1, waiting for a slot").await;
        ui.stop().await;
    }
    owner.stop().await;
}
