//! `WebhookTerminalHook` end to end (feature `webhooks`): a run with a
//! `callback_url` header gets exactly one HTTP `POST` describing its
//! outcome, delivered by `taquba_webhooks::WebhookWorker` to a receiver on
//! 127.0.0.1; a run without the header enqueues no notification and no
//! delivery.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{JobStatus, OpenOptions, Queue, QueueConfig};
use taquba_workflow::webhooks::taquba_webhooks::WebhookWorker;
use taquba_workflow::{
    HEADER_TERMINAL, RunOptions, RunSpec, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
    WorkflowRuntime, webhooks::WebhookTerminalHook,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

struct Done;

impl StepRunner for Done {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

/// A minimal HTTP receiver: answers `200` to every request and forwards
/// `(head, body)`.
async fn receiver() -> (String, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/callback", listener.local_addr().expect("addr"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    let length = head
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if buf.len() < end + 4 + length {
                        continue;
                    }
                    let body = buf[end + 4..end + 4 + length].to_vec();
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                    let _ = tx.send((head, body));
                    return;
                }
            });
        }
    });
    (url, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_callback_url_is_delivered_once_and_others_not_at_all() {
    let (url, mut deliveries) = receiver().await;
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(
        Queue::open_with_options(
            store.clone(),
            "db",
            OpenOptions::default()
                .flush_interval(Duration::from_millis(1))
                .default_queue_config(
                    QueueConfig::default().keep_done_jobs(Duration::from_secs(3600)),
                ),
        )
        .await
        .expect("open"),
    );
    let hook = WebhookTerminalHook::new("hooks").timeout(Duration::from_secs(5));
    let runtime = WorkflowRuntime::builder(queue.clone(), store, Done, hook)
        .poll_interval(Duration::from_millis(20))
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let delivery_queue = queue.clone();
    let delivering = tokio::spawn(async move {
        taquba::run_worker(
            &delivery_queue,
            "hooks",
            &WebhookWorker::new(),
            Duration::from_millis(20),
            async {
                let _ = stop_rx.await;
            },
        )
        .await
    });

    let with_url = runtime
        .submit(RunSpec {
            input: b"report ready".to_vec(),
            options: RunOptions {
                headers: HashMap::from([
                    ("callback_url".to_string(), url.clone()),
                    ("tenant".to_string(), "acme".to_string()),
                ]),
                ..RunOptions::default()
            },
            ..RunSpec::default()
        })
        .await
        .expect("submit");
    let without_url = runtime
        .submit(RunSpec {
            input: b"quiet".to_vec(),
            ..RunSpec::default()
        })
        .await
        .expect("submit");
    for run in [&with_url.run_id, &without_url.run_id] {
        let end = tokio::time::timeout(Duration::from_secs(30), runtime.wait(run))
            .await
            .expect("terminated in time")
            .expect("wait");
        assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    }

    let (head, body) = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
        .await
        .expect("delivered in time")
        .expect("a delivery");
    assert!(head.starts_with("POST /callback"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{head}");
    assert!(
        head.contains(&format!(": {}", with_url.run_id)) && lower.contains("workflow-run-id: "),
        "{head}"
    );
    assert!(lower.contains("webhook-id:"), "{head}");
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
    assert_eq!(json["run_id"], with_url.run_id.as_str());
    assert_eq!(json["status"], "succeeded");
    assert_eq!(json["result"], "report ready");
    assert_eq!(json["headers"]["tenant"], "acme");

    // Exactly one delivery job, done; the quiet run had no notification.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(deliveries.try_recv().is_err(), "a second delivery");
    let stats = queue.view().stats("hooks").await.expect("stats");
    assert_eq!(
        (stats.done, stats.pending, stats.dead),
        (1, 0, 0),
        "{stats:?}"
    );
    let steps = queue.view().stats("workflow-steps").await.expect("stats");
    assert_eq!(steps.dead, 0, "{steps:?}");
    let notes = queue
        .view()
        .list_jobs("workflow-steps", JobStatus::Done, None, 100)
        .await
        .expect("done jobs")
        .jobs
        .into_iter()
        .filter(|j| j.headers.contains_key(HEADER_TERMINAL))
        .count();
    assert_eq!(
        notes, 1,
        "one notification, for the run with a callback URL"
    );

    let _ = stop_tx.send(());
    delivering.await.expect("join").expect("delivery worker");
    worker.shutdown().await.expect("worker shutdown");
}

/// A runtime whose webhook hook would deliver on the runtime's own queue
/// (where its worker takes every delivery for a malformed step) is refused
/// when it is built.
async fn build_with_hook(runtime_queue: Option<&str>, hook: WebhookTerminalHook) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
    let mut builder = WorkflowRuntime::builder(queue, store, Done, hook);
    if let Some(name) = runtime_queue {
        builder = builder.queue_name(name);
    }
    let _runtime = builder.build();
}

#[tokio::test]
#[should_panic(expected = "delivers on `workflow-steps`, the runtime's own queue")]
async fn a_webhook_hook_on_the_runtimes_default_queue_is_refused_at_build() {
    build_with_hook(None, WebhookTerminalHook::new("workflow-steps")).await;
}

#[tokio::test]
#[should_panic(expected = "delivers on `orders`, the runtime's own queue")]
async fn a_webhook_hook_on_the_runtimes_named_queue_is_refused_at_build() {
    build_with_hook(Some("orders"), WebhookTerminalHook::new("orders")).await;
}

#[tokio::test]
async fn a_webhook_hook_on_another_queue_builds() {
    build_with_hook(None, WebhookTerminalHook::default()).await;
    // The default runtime queue name is just another queue to a runtime on
    // "orders".
    build_with_hook(Some("orders"), WebhookTerminalHook::new("workflow-steps")).await;
}
