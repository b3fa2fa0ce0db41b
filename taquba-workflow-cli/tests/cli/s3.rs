//! The CLI against a bucket (`--store s3://bucket/prefix`, feature `aws`):
//! an owner in this process on the bucket, the CLI reading and steering it
//! from a second process; and what the CLI writes there (nothing for the
//! reads, the inbox only for the steering), seen in the server's data
//! directory. Run by `.ci/s3.sh`, which starts an S3-compatible server
//! (s3s-fs, which keeps each object as a file) on 127.0.0.1 and exports the
//! standard AWS environment and `S3S_DATA_ROOT`; without `AWS_ENDPOINT`
//! and `AWS_BUCKET` the tests say they are skipped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::aws::AmazonS3Builder;
use taquba::object_store::prefix::PrefixStore;

use crate::common::{Owner, Summary, cli_at, json, run};
use crate::privilege::{changes, only_added_in, parked, snapshot};

/// The bucket and a fresh prefix in it, with its object store; `None`
/// (the test is skipped) without the S3 environment.
fn bucket(name: &str) -> Option<(String, String, Arc<dyn ObjectStore>)> {
    let endpoint = std::env::var("AWS_ENDPOINT").unwrap_or_default();
    let bucket = std::env::var("AWS_BUCKET").unwrap_or_default();
    if endpoint.is_empty() || bucket.is_empty() {
        println!("skipped: AWS_ENDPOINT/AWS_BUCKET not set (run .ci/s3.sh)");
        return None;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let prefix = format!("{name}-{nanos:x}");
    let s3 = AmazonS3Builder::from_env()
        .with_bucket_name(&bucket)
        .build()
        .expect("an S3 client from the environment");
    let store: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(s3, prefix.as_str()));
    Some((bucket, prefix, store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_store_is_read_and_steered_from_another_process() {
    let Some((bucket, prefix, store)) = bucket("cli") else {
        return;
    };
    let owner = Owner::open_on(store, None).await;
    let location = format!("s3://{bucket}/{prefix}");

    let done = owner.start("s3-done", 2, "ok", &[]).await;
    owner.wait(&done).await;
    let waiting = owner.start("s3-wait", 31, "signal", &[]).await;

    let value = json(
        &run(cli_at(
            &location,
            &["runs", "list", "--status", "all", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value.as_array().map(Vec::len), Some(2), "{value}");
    let value = json(
        &run(cli_at(
            &location,
            &["runs", "result", "s3-done", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(value["outcome"]["result"]["value"]["total"], 3, "{value}");

    let value = json(
        &run(cli_at(
            &location,
            &[
                "runs",
                "signal",
                "approve:31",
                "--json",
                "\"from s3\"",
                "--wait",
                "-o",
                "json",
            ],
        ))
        .await
        .success(),
    );
    assert_eq!(value["answer"]["run_id"], "s3-wait", "{value}");
    let end = owner.wait(&waiting).await;
    let summary: Summary =
        rmp_serde::from_slice(end.outcome.unwrap().result.as_deref().unwrap()).unwrap();
    assert_eq!(summary.note.as_deref(), Some("from s3"));

    let value = json(
        &run(cli_at(&location, &["store", "info", "-o", "json"]))
            .await
            .success(),
    );
    assert_eq!(value["db"], crate::common::DB);
    assert_eq!(value["store"], location);
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_bucket_reads_write_nothing_and_steering_only_the_inbox() {
    let Some((bucket, prefix, store)) = bucket("cli-lp") else {
        return;
    };
    let owner = Owner::open_on(store, None).await;
    let done = owner.start("s3-lp-done", 2, "ok", &[]).await;
    owner.wait(&done).await;
    let timer = owner.start("s3-lp-timer", 1, "timer", &[]).await;
    parked(&owner, &timer).await;
    owner.stop().await;
    let location = format!("s3://{bucket}/{prefix}");
    // The server's files of the prefix, when the server is s3s-fs.
    let Some(files) = std::env::var_os("S3S_DATA_ROOT")
        .map(|root| PathBuf::from(root).join(&bucket).join(&prefix))
    else {
        println!("skipped: S3S_DATA_ROOT not set (run .ci/s3.sh)");
        return;
    };
    assert!(files.is_dir(), "no objects at {}", files.display());
    let before = snapshot(&files);
    for args in [
        &["runs", "list", "--status", "all"][..],
        &["runs", "describe", "s3-lp-timer"],
        &["runs", "steps", "s3-lp-done"],
        &["runs", "result", "s3-lp-done"],
        &["groups", "list"],
        &["store", "info"],
        &["commands", "describe", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
    ] {
        run(cli_at(&location, args)).await.success();
    }
    // Give the server a moment to finish anything it was still writing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = changes(&before, &snapshot(&files), false);
    assert!(read.is_empty(), "reading wrote to the bucket: {read:#?}");

    run(cli_at(
        &location,
        &["runs", "cancel", "s3-lp-timer", "--yes"],
    ))
    .await
    .success();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let steered = changes(&before, &snapshot(&files), true);
    let inbox = "workflow-steps-memo/inbox/";
    assert!(
        steered.iter().any(|c| c.ends_with(".msgpack"))
            && steered.iter().all(|c| only_added_in(c, inbox)),
        "steering wrote outside {inbox}: {steered:#?}"
    );
}
