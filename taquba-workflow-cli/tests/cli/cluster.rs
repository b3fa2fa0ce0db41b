//! A cluster root: four shards on a local directory, each owned by a live
//! runtime in this test process (opened as the cluster runtime opens a
//! shard: `cluster::shard_store` over the root, queue `db`), and the
//! binary run as a second process on the root: merged listings paged
//! across shards, a run described on its shard, a cancel and a key-only
//! signal applied by the owning shard's runtime, `commands describe`,
//! `store info` with a row per shard, and the dashboard's pages.

use std::collections::BTreeSet;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use taquba_workflow::cluster::shard_of;

use crate::common::{Owner, cli, create_cluster, json, run, stderr, stdout, with_stdin};

const SHARDS: u32 = 4;

fn shard(id: &str) -> u32 {
    shard_of(id, NonZeroU32::new(SHARDS).expect("non-zero"))
}

/// A cluster of [`SHARDS`] shards at `dir`, each owned by a runtime.
async fn owners(dir: &Path) -> Vec<Owner> {
    let record = create_cluster(dir, SHARDS).await;
    assert_eq!(record.shards, SHARDS);
    let mut owners = Vec::new();
    for k in 0..SHARDS {
        owners.push(Owner::open_shard(dir, k).await);
    }
    owners
}

/// Every run `runs list --status all` lists, paging with `--limit limit`
/// and `--after` (JSON: the cursor is the last id of a full page), with
/// each run's `shard`.
async fn list_all(dir: &Path, limit: usize) -> Vec<(String, u64)> {
    let limit_text = limit.to_string();
    let mut listed = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut args = vec!["runs", "list", "--status", "all", "-o", "json"];
        args.extend(["--limit", limit_text.as_str()]);
        if let Some(after) = &after {
            args.extend(["--after", after.as_str()]);
        }
        let page = json(&run(cli(dir, &args)).await.success());
        let page = page.as_array().expect("an array").clone();
        for run in &page {
            listed.push((
                run["run_id"].as_str().expect("an id").to_string(),
                run["shard"].as_u64().expect("a shard on a cluster"),
            ));
        }
        if page.len() < limit {
            return listed;
        }
        after = listed.last().map(|(id, _)| id.clone());
        assert!(listed.len() < 1000, "the pages end");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_and_steers_every_shard_of_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let owners = owners(root).await;
    let owner_of = |id: &str| &owners[shard(id) as usize];

    let ids: Vec<String> = (0..14).map(|i| format!("c-{i:02}")).collect();
    for id in &ids {
        owner_of(id).start(id, 1, "ok", &[]).await;
    }
    for id in &ids {
        let owner = owner_of(id);
        owner
            .wait(&taquba_workflow::RunId::new(id.as_str()).unwrap())
            .await;
    }
    let timer = owner_of("c-timer").start("c-timer", 1, "timer", &[]).await;
    // A run waiting on a key whose home shard is its own shard.
    let n = (0..100u64)
        .find(|n| shard(&format!("c-sig-{n}")) == shard(&format!("approve:{n}")))
        .expect("a key in the run's shard");
    let sig_id = format!("c-sig-{n}");
    let waiting = owner_of(&sig_id).start(&sig_id, n, "signal", &[]).await;
    let mut expected: Vec<String> = ids.clone();
    expected.extend(["c-timer".to_string(), sig_id.clone()]);
    expected.sort();
    let shards_used: BTreeSet<u32> = expected.iter().map(|id| shard(id)).collect();
    assert_eq!(shards_used.len(), SHARDS as usize, "runs on every shard");

    // Merged and paged across shards, from another process; the readers
    // follow the owners' commits, so poll until every run is listed.
    let mut listed = Vec::new();
    for _ in 0..300 {
        listed = list_all(root, 3).await;
        if listed.len() == expected.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed_ids: Vec<String> = listed.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(listed_ids, expected, "every shard's runs, in run-id order");
    for (id, k) in &listed {
        assert_eq!(*k, u64::from(shard(id)), "{id}");
    }
    for limit in [1, 5, 16, 17] {
        let paged: Vec<String> = list_all(root, limit)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        assert_eq!(paged, expected, "limit {limit}");
    }
    let text = run(cli(
        root,
        &["runs", "list", "--status", "all", "--limit", "3"],
    ))
    .await
    .success();
    let text = stdout(&text);
    assert!(text.contains("SHARD"), "{text}");
    assert!(
        text.contains(&format!(
            "Showing the first 3 runs; more after {} (`--after {}`).",
            expected[2], expected[2]
        )),
        "{text}"
    );

    // A run described on its shard.
    let on = &ids[5];
    let described = json(
        &run(cli(root, &["runs", "describe", on, "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(described["run_id"], on.as_str());
    assert_eq!(described["state"], "succeeded");
    let steps = json(
        &run(cli(root, &["runs", "steps", on, "-o", "json"]))
            .await
            .success(),
    );
    assert!(!steps["attempts"].as_array().unwrap().is_empty(), "{steps}");
    let missing = run(cli(root, &["runs", "describe", "c-none"]))
        .await
        .code(1);
    let err = stderr(&missing);
    assert!(
        err.contains(&format!(
            "run c-none not found in the cluster (4 shards): not in its home shard {}",
            shard("c-none")
        )),
        "{err}"
    );

    // A cancel goes to the run's shard; its owner applies it.
    let cancelled = run(with_stdin(
        cli(
            root,
            &[
                "runs",
                "cancel",
                "c-timer",
                "--yes",
                "--wait",
                "--wait-timeout",
                "60s",
                "-o",
                "json",
            ],
        ),
        "",
    ))
    .await;
    let err = stderr(&cancelled);
    let value = json(&cancelled.success());
    assert!(
        err.contains(&format!(
            "Run c-timer is in shard {} of the cluster",
            shard("c-timer")
        )),
        "{err}"
    );
    assert_eq!(value["state"], "applied", "{value}");
    assert_eq!(value["answer"]["cancelled"], true, "{value}");
    let end = owner_of("c-timer").wait(&timer).await;
    assert_eq!(end.termination.status.as_str(), "cancelled");
    let command = value["command_id"]
        .as_str()
        .expect("a command id")
        .to_string();
    let described = run(cli(root, &["commands", "describe", &command, "-o", "json"]))
        .await
        .success();
    let found = json(&described);
    assert_eq!(found["state"], "applied", "{found}");
    let err = stderr(&described);
    assert!(
        err.contains(&format!(
            "Command {command} is in shard {} of the cluster",
            shard("c-timer")
        )),
        "{err}"
    );

    // A key-only signal goes to the key's home shard.
    let key = format!("approve:{n}");
    let signalled = run(cli(
        root,
        &[
            "runs",
            "signal",
            &key,
            "--json",
            "\"go\"",
            "--wait",
            "--wait-timeout",
            "60s",
            "-o",
            "json",
        ],
    ))
    .await;
    let err = stderr(&signalled);
    let value = json(&signalled.success());
    assert!(
        err.contains(&format!(
            "goes to its key's home shard: it is in shard {}",
            shard(&key)
        )),
        "{err}"
    );
    assert_eq!(value["state"], "applied", "{value}");
    let end = owner_of(&sig_id).wait(&waiting).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");

    // store info: the cluster and every shard.
    let info = json(
        &run(cli(root, &["store", "info", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(info["shard_count"], 4, "{info}");
    assert_eq!(info["hash"], "sha256-be64-mod");
    let shards = info["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 4);
    for (k, s) in shards.iter().enumerate() {
        assert_eq!(s["shard"], k);
        assert_eq!(s["open"], true, "{s}");
        assert_eq!(s["owner"], "—");
        assert!(s["writer"]["epoch"].as_u64().unwrap() >= 1, "{s}");
        assert!(!s["queues"].as_array().unwrap().is_empty(), "{s}");
    }
    let text = stdout(&run(cli(root, &["store", "info"])).await.success());
    assert!(
        text.contains("Shards") && text.contains("DURABLE SEQ"),
        "{text}"
    );
    for k in 0..SHARDS {
        assert!(
            text.lines()
                .any(|line| line.trim_start().starts_with(&format!("{k} "))),
            "shard {k} has a row:\n{text}"
        );
    }

    // What a command costs on a cluster of 4 against one store (printed,
    // for the record; not asserted).
    let single = tempfile::tempdir().unwrap();
    let one = Owner::open(single.path()).await;
    for id in &expected {
        one.start(id, 1, "ok", &[]).await;
    }
    for (what, at) in [("cluster of 4", root), ("one store", single.path())] {
        let started = std::time::Instant::now();
        for _ in 0..3 {
            run(cli(
                at,
                &["runs", "list", "--status", "all", "--limit", "5"],
            ))
            .await
            .success();
        }
        println!(
            "runs list --limit 5 on {what}: {:?} per command",
            started.elapsed() / 3
        );
    }
    one.stop().await;
    for owner in owners {
        owner.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_never_opened_holds_nothing_and_refuses_its_signals() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    create_cluster(root, SHARDS).await;
    // Only shard 0 has an owner.
    let owner = Owner::open_shard(root, 0).await;
    let id = (0..100)
        .map(|i| format!("only-{i}"))
        .find(|id| shard(id) == 0)
        .expect("an id of shard 0");
    owner.start(&id, 1, "ok", &[]).await;
    owner
        .wait(&taquba_workflow::RunId::new(id.as_str()).unwrap())
        .await;
    let listed = list_all(root, 10).await;
    assert_eq!(listed, vec![(id.clone(), 0)]);
    let info = json(
        &run(cli(root, &["store", "info", "-o", "json"]))
            .await
            .success(),
    );
    let open: Vec<bool> = info["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["open"].as_bool().unwrap())
        .collect();
    assert_eq!(open, vec![true, false, false, false]);
    let key = (0..100)
        .map(|i| format!("key-{i}"))
        .find(|key| shard(key) != 0)
        .expect("a key of another shard");
    let refused = run(cli(root, &["runs", "signal", &key, "--json", "1"]))
        .await
        .code(1);
    let err = stderr(&refused);
    assert!(
        err.contains(&format!(
            "the signal {key:?} goes to its home shard {}, which has no queue yet",
            shard(&key)
        )),
        "{err}"
    );
    owner.stop().await;
}

#[cfg(feature = "ui")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_and_steers_a_cluster() {
    use crate::web::Dashboard;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let owners = owners(root).await;
    let owner_of = |id: &str| &owners[shard(id) as usize];
    let ids: Vec<String> = (0..8).map(|i| format!("d-{i:02}")).collect();
    for id in &ids {
        owner_of(id).start(id, 1, "ok", &[]).await;
    }
    let timer = owner_of("d-timer").start("d-timer", 1, "timer", &[]).await;
    let ui = Dashboard::start(root, &[]).await;
    assert!(
        ui.banner.contains("the cluster at") && ui.banner.contains("4 shards"),
        "{}",
        ui.banner
    );

    // The runs page lists every shard's runs, merged, with their shard.
    let mut page = None;
    for _ in 0..300 {
        let reply = ui.get("/runs?status=all&limit=100").await;
        if reply.status == 200 && ids.iter().all(|id| reply.body.contains(id.as_str())) {
            page = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let page = page.expect("every run listed within 30 s");
    page.has(&["Shard", "d-timer"]);
    let positions: Vec<usize> = ids
        .iter()
        .map(|id| page.body.find(&format!("/runs/{id}\"")).expect("linked"))
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in run-id order");
    // Paged across shards.
    let first = ui.get("/runs?status=all&limit=20").await.expect(200);
    first.has(&["d-00"]);

    // A run page reads the run's shard.
    let in_shard = format!("In shard {} of the cluster", shard("d-03"));
    ui.get("/runs/d-03")
        .await
        .expect(200)
        .has(&[in_shard.as_str()]);

    // A cancel from the dashboard reaches the run's shard's owner.
    let confirm = ui.get("/runs/d-timer/cancel").await.expect(200);
    let token = confirm.token();
    let sent = ui
        .post("/runs/d-timer/cancel", &[("csrf", &token), ("reason", "")])
        .await
        .expect(303);
    let location = sent.header("location").expect("a redirect").to_string();
    let mut applied = false;
    for _ in 0..300 {
        let reply = ui.get(&location).await;
        if reply.body.contains("badge b-applied") {
            let shard_row = format!("<dt>Shard</dt><dd>{}</dd>", shard("d-timer"));
            reply.has(&[shard_row.as_str()]);
            applied = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(applied, "the cancel was applied within 30 s");
    let end = owner_of("d-timer").wait(&timer).await;
    assert_eq!(end.termination.status.as_str(), "cancelled");

    // The store page has a row per shard.
    let store = ui.get("/store").await.expect(200);
    store.has(&["Cluster", "id=\"shards\"", "sha256-be64-mod"]);
    assert_eq!(
        store.body.matches("<tr>").count(),
        1 + SHARDS as usize,
        "{}",
        store.body
    );
    ui.stop().await;
    for owner in owners {
        owner.stop().await;
    }
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_or_link_in_place_of_the_record_or_a_shard_is_refused_unopened() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("cluster"))
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let started = std::time::Instant::now();
    let refused = run(cli(root, &["runs", "list"])).await.code(1);
    assert!(
        stderr(&refused).contains("is not a regular file"),
        "{}",
        stderr(&refused)
    );
    assert!(started.elapsed() < Duration::from_secs(20), "not opened");

    // A shard directory that is a link is not followed.
    let cluster = tempfile::tempdir().unwrap();
    create_cluster(cluster.path(), 2).await;
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cluster.path().join("shards")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), cluster.path().join("shards/1")).unwrap();
    let refused = run(cli(cluster.path(), &["runs", "list"])).await.code(1);
    assert!(
        stderr(&refused).contains("is a symbolic link"),
        "{}",
        stderr(&refused)
    );
}

/// `runs restart` on a cluster root: the fork is made in the original's
/// shard under an id drawn to route there (so the cluster finds it by its
/// id); a `--run-id` of another shard is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_on_a_cluster_root_is_named_for_its_originals_shard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let owners = owners(root).await;
    let owner = &owners[shard("f-1") as usize];
    let done = owner.start("f-1", 1, "ok", &[]).await;
    owner.wait(&done).await;
    let value = json(
        &run(cli(
            root,
            &[
                "runs",
                "restart",
                "f-1",
                "--wait",
                "--wait-timeout",
                "60s",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["kind"], "forked", "{value}");
    let new_id = value["answer"]["new_run_id"].as_str().expect("an id");
    assert_eq!(shard(new_id), shard("f-1"), "{value}");
    let fork = taquba_workflow::RunId::new(new_id).unwrap();
    owner.wait(&fork).await;
    let described = json(
        &run(cli(root, &["runs", "describe", new_id, "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(described["forked_from"]["run_id"], "f-1", "{described}");

    let elsewhere = (0..100)
        .map(|i| format!("f-other-{i}"))
        .find(|id| shard(id) != shard("f-1"))
        .expect("an id of another shard");
    let refused = run(cli(
        root,
        &["runs", "restart", "f-1", "--run-id", &elsewhere],
    ))
    .await
    .code(1);
    let err = stderr(&refused);
    assert!(err.contains("routes to shard"), "{err}");
}
