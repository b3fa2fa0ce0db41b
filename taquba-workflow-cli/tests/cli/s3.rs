//! The CLI against a bucket (`--store s3://bucket/prefix`, feature `aws`):
//! an owner in this process on the bucket, the CLI reading and steering it
//! from a second process. Run by `.ci/s3.sh`, which starts an S3-compatible
//! server on 127.0.0.1 and exports the standard AWS environment; without
//! `AWS_ENDPOINT` and `AWS_BUCKET` the test says it is skipped.

use std::sync::Arc;

use taquba::object_store::ObjectStore;
use taquba::object_store::aws::AmazonS3Builder;
use taquba::object_store::prefix::PrefixStore;

use crate::common::{Owner, Summary, cli_at, json, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_store_is_read_and_steered_from_another_process() {
    let endpoint = std::env::var("AWS_ENDPOINT").unwrap_or_default();
    let bucket = std::env::var("AWS_BUCKET").unwrap_or_default();
    if endpoint.is_empty() || bucket.is_empty() {
        println!("skipped: AWS_ENDPOINT/AWS_BUCKET not set (run .ci/s3.sh)");
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let prefix = format!("cli-{nanos:x}");
    let s3 = AmazonS3Builder::from_env()
        .with_bucket_name(&bucket)
        .build()
        .expect("an S3 client from the environment");
    let store: Arc<dyn ObjectStore> = Arc::new(PrefixStore::new(s3, prefix.as_str()));
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
