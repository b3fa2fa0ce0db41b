//! Least privilege, checked on a local store (the object store the CLI
//! sees is a `LocalFileSystem`, where every write the object store API can
//! make, a put, a delete, a copy or a rename, shows as a file or
//! directory created, removed or changed): the read commands and the
//! dashboard's pages change nothing at all in the store (not a file, not
//! a directory's modification time), on a single store and on a cluster
//! root; the steering commands and the dashboard's actions write only
//! under the runtime's inbox, `{memo_prefix}/inbox/` (on a cluster, the
//! shard's). What docs/operate.md's bucket policies grant rests on it.
//!
//! The owners are stopped first, so nothing else writes meanwhile.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::{Duration, SystemTime};

use taquba_workflow::RunId;
use taquba_workflow::cluster::shard_of;

use crate::common::{Owner, cli, create_cluster, run, stdout};

/// The default memo prefix of the tests' runtime.
const MEMO: &str = "workflow-steps-memo";

/// What is seen of one file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    dir: bool,
    len: u64,
    modified: Option<SystemTime>,
    #[cfg(unix)]
    inode: u64,
}

/// Every file and directory under `root` (links not followed), by path
/// relative to it.
pub(crate) fn snapshot(root: &Path) -> BTreeMap<String, Entry> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<String, Entry>) {
        for entry in std::fs::read_dir(dir).expect("read a store directory") {
            let entry = entry.expect("a directory entry");
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("examine an entry");
            let relative = path
                .strip_prefix(root)
                .expect("below the root")
                .to_string_lossy()
                .replace('\\', "/");
            into.insert(
                relative,
                Entry {
                    dir: meta.is_dir(),
                    len: meta.len(),
                    modified: meta.modified().ok(),
                    #[cfg(unix)]
                    inode: std::os::unix::fs::MetadataExt::ino(&meta),
                },
            );
            if meta.is_dir() {
                walk(root, &path, into);
            }
        }
    }
    let mut tree = BTreeMap::new();
    walk(root, root, &mut tree);
    tree
}

/// The paths added, removed or changed from `before` to `after`; with
/// `dirs_by_presence`, a directory counts only when added or removed (not
/// for its modification time, which an entry made in it moves).
pub(crate) fn changes(
    before: &BTreeMap<String, Entry>,
    after: &BTreeMap<String, Entry>,
    dirs_by_presence: bool,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (path, entry) in after {
        match before.get(path) {
            None => changed.push(format!("added {path}")),
            Some(_) if dirs_by_presence && entry.dir => {}
            Some(old) if old != entry => changed.push(format!("changed {path}")),
            Some(_) => {}
        }
    }
    for path in before.keys() {
        if !after.contains_key(path) {
            changed.push(format!("removed {path}"));
        }
    }
    changed
}

/// Whether `change` (of [`changes`]) is an entry added under `inbox`, or
/// a directory on the way to it (a local directory store makes the
/// directories of an object's path; a bucket has none).
pub(crate) fn only_added_in(change: &str, inbox: &str) -> bool {
    change
        .strip_prefix("added ")
        .is_some_and(|path| path.starts_with(inbox) || inbox.starts_with(&format!("{path}/")))
}

/// `taquba-workflow --store DIR ARGS…`, which must succeed; its stdout.
async fn ok(dir: &Path, args: &[&str]) -> String {
    stdout(&run(cli(dir, args)).await.success())
}

/// Wait (at most 10 s) until run `id` of `owner` committed its first step.
pub(crate) async fn parked(owner: &Owner, id: &RunId) {
    for _ in 0..500 {
        let status = owner.runtime.status(id).await.expect("a status");
        if status.is_some_and(|s| s.current_step == 1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("run {id} did not reach its second step within 10 s");
}

/// Every read command on the store or cluster root at `dir`, and the
/// dashboard's pages (read-only and not), for run `id`.
async fn read_everything(dir: &Path, id: &str) {
    ok(dir, &["runs", "list", "--status", "all"]).await;
    ok(dir, &["runs", "list", "-o", "json"]).await;
    ok(dir, &["runs", "describe", id]).await;
    ok(dir, &["runs", "steps", id]).await;
    ok(dir, &["groups", "list"]).await;
    ok(dir, &["store", "info"]).await;
    ok(dir, &["commands", "describe", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]).await;
    #[cfg(feature = "ui")]
    for args in [&["--read-only"][..], &[]] {
        let ui = crate::web::Dashboard::start(dir, args).await;
        for path in [
            "/runs?status=all".to_string(),
            format!("/runs/{id}"),
            "/groups".to_string(),
            "/dead-letters".to_string(),
            "/store".to_string(),
        ] {
            ui.get(&path).await.expect(200);
        }
        if args.is_empty() {
            ui.get(&format!("/runs/{id}/cancel")).await.expect(200);
            ui.get("/signal").await.expect(200);
        }
        ui.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_write_nothing_and_steering_writes_only_the_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path();
    let owner = Owner::open(store).await;
    let done = owner.start("lp-done", 2, "ok", &[]).await;
    owner.wait(&done).await;
    let failed = owner.start("lp-failed", 1, "flaky", &[]).await;
    owner.wait(&failed).await;
    let timer = owner.start("lp-timer", 1, "timer", &[]).await;
    let by_ui = owner.start("lp-by-ui", 1, "timer", &[]).await;
    let waiting = owner.start("lp-waiting", 3, "signal", &[]).await;
    for id in [&timer, &by_ui, &waiting] {
        parked(&owner, id).await;
    }
    owner.stop().await;

    let before = snapshot(store);
    read_everything(store, "lp-timer").await;
    ok(store, &["runs", "result", "lp-done"]).await;
    let read = changes(&before, &snapshot(store), false);
    assert!(read.is_empty(), "reading wrote to the store: {read:#?}");

    // Steering: the CLI's commands and a dashboard's action.
    ok(store, &["runs", "cancel", "lp-timer", "--yes"]).await;
    ok(store, &["runs", "signal", "approve:3", "--json", "\"ok\""]).await;
    ok(store, &["runs", "requeue", "lp-failed"]).await;
    #[cfg(feature = "ui")]
    {
        let ui = crate::web::Dashboard::start(store, &[]).await;
        let token = ui.get("/runs/lp-by-ui/cancel").await.expect(200).token();
        ui.post("/runs/lp-by-ui/cancel", &[("csrf", &token)])
            .await
            .expect(303);
        ui.stop().await;
    }
    let steered = changes(&before, &snapshot(store), true);
    let inbox = format!("{MEMO}/inbox/");
    assert!(
        steered.iter().all(|c| only_added_in(c, &inbox)),
        "steering wrote outside {inbox} (or changed what was there): {steered:#?}"
    );
    let commands = steered
        .iter()
        .filter(|c| c.starts_with(&format!("added {MEMO}/inbox/v1/")) && c.ends_with(".msgpack"))
        .count();
    let expected = if cfg!(feature = "ui") { 4 } else { 3 };
    assert_eq!(commands, expected, "{steered:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_root_too() {
    const SHARDS: u32 = 2;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    create_cluster(root, SHARDS).await;
    let mut owners = Vec::new();
    for k in 0..SHARDS {
        owners.push(Owner::open_shard(root, k).await);
    }
    let shard = |id: &str| shard_of(id, NonZeroU32::new(SHARDS).expect("non-zero")) as usize;
    // A parked run in each shard.
    let ids: Vec<String> =
        (0..20)
            .map(|i| format!("lp-c{i}"))
            .fold(Vec::<String>::new(), |mut picked, id| {
                if !picked.iter().any(|p| shard(p) == shard(&id)) {
                    picked.push(id);
                }
                picked
            });
    assert_eq!(ids.len(), SHARDS as usize, "{ids:?}");
    for id in &ids {
        let owner = &owners[shard(id)];
        let run = owner.start(id, 1, "timer", &[]).await;
        parked(owner, &run).await;
    }
    for owner in owners {
        owner.stop().await;
    }

    let before = snapshot(root);
    read_everything(root, &ids[0]).await;
    let read = changes(&before, &snapshot(root), false);
    assert!(read.is_empty(), "reading wrote to the cluster: {read:#?}");

    ok(root, &["runs", "cancel", &ids[1], "--yes"]).await;
    let steered = changes(&before, &snapshot(root), true);
    let inbox = format!("shards/{}/{MEMO}/inbox/", shard(&ids[1]));
    assert!(
        steered.iter().any(|c| c.ends_with(".msgpack"))
            && steered.iter().all(|c| only_added_in(c, &inbox)),
        "steering wrote outside {inbox}: {steered:#?}"
    );
}
