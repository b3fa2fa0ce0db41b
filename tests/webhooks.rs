//! `WebhookTerminalHook` end to end (feature `webhooks`): a run with a
//! `callback_url` header gets exactly one HTTP `POST` describing its
//! outcome, delivered by `WebhookDeliveryWorker` to a receiver on
//! 127.0.0.1; a run without the header enqueues no notification and no
//! delivery. The destination policy: a callback it refuses dead-letters the
//! run's notification with the URL and the rule and leaves the run's
//! outcome as it was; the delivery worker refuses a job past the hook; the
//! delivery client connects through the policy's resolution and checks
//! redirects.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{JobStatus, OpenOptions, Queue, QueueConfig};
use taquba_workflow::headers::HEADER_RUN_ID;
use taquba_workflow::webhooks::taquba_webhooks::{WebhookRequest, enqueue_webhook};
use taquba_workflow::webhooks::{DestinationError, DestinationPolicy, WebhookTerminalHook};
use taquba_workflow::{
    HEADER_TERMINAL, RunOptions, RunSpec, Step, StepError, StepOutcome, StepRunner, TerminalStatus,
    WorkflowRuntime,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

struct Done;

impl StepRunner for Done {
    /// Succeeds with its input, or fails for the input `fail`.
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.payload == b"fail" {
            return Err(StepError::permanent("asked to fail"));
        }
        Ok(StepOutcome::Succeed {
            result: step.payload.clone(),
        })
    }
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// A minimal HTTP receiver: answers `200` to every request and forwards
/// `(head, body)`.
async fn receiver() -> (String, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    responder(OK).await
}

/// A minimal HTTP receiver: answers `response` to every request and
/// forwards `(head, body)`.
async fn responder(
    response: &'static [u8],
) -> (String, mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
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
                    let _ = socket.write_all(response).await;
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
    // The receiver is on loopback, which the default policy refuses.
    let hook = WebhookTerminalHook::new("hooks")
        .timeout(Duration::from_secs(5))
        .with_policy(DestinationPolicy::default().allow_loopback());
    let webhooks = hook.delivery_worker().expect("delivery worker");
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
            &webhooks,
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

/// A queue keeping its done jobs, a runtime with `hook` on it, its worker,
/// and a `WebhookDeliveryWorker` under the hook's policy on `hooks`.
struct Service {
    queue: Arc<Queue>,
    runtime: WorkflowRuntime<Done, WebhookTerminalHook>,
    worker: taquba_workflow::RunnerHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    delivering: tokio::task::JoinHandle<taquba::Result<()>>,
}

impl Service {
    async fn start(hook: WebhookTerminalHook) -> Self {
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
        let webhooks = hook.delivery_worker().expect("delivery worker");
        let runtime = WorkflowRuntime::builder(queue.clone(), store, Done, hook)
            .poll_interval(Duration::from_millis(20))
            .build();
        let worker = runtime.spawn(std::future::pending::<()>());
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let delivery_queue = queue.clone();
        let delivering = tokio::spawn(async move {
            taquba::run_worker(
                &delivery_queue,
                "hooks",
                &webhooks,
                Duration::from_millis(20),
                async {
                    let _ = stop_rx.await;
                },
            )
            .await
        });
        Self {
            queue,
            runtime,
            worker,
            stop,
            delivering,
        }
    }

    /// Submit a run of `input` with `callback_url` and wait for its end.
    async fn run(&self, input: &str, callback_url: &str) -> taquba_workflow::RunId {
        let submitted = self
            .runtime
            .submit(RunSpec {
                input: input.as_bytes().to_vec(),
                options: RunOptions {
                    headers: HashMap::from([(
                        "callback_url".to_string(),
                        callback_url.to_string(),
                    )]),
                    ..RunOptions::default()
                },
                ..RunSpec::default()
            })
            .await
            .expect("submit");
        tokio::time::timeout(
            Duration::from_secs(30),
            self.runtime.wait(&submitted.run_id),
        )
        .await
        .expect("terminated in time")
        .expect("wait");
        submitted.run_id
    }

    /// The dead jobs of `queue` that `select` keeps, once there are
    /// `count` of them.
    async fn dead_jobs(
        &self,
        queue: &str,
        count: usize,
        select: impl Fn(&taquba::JobRecord) -> bool,
    ) -> Vec<taquba::JobRecord> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let jobs = self
                .queue
                .view()
                .list_jobs(queue, JobStatus::Dead, None, 100)
                .await
                .expect("dead jobs")
                .jobs
                .into_iter()
                .filter(|job| select(job))
                .collect::<Vec<_>>();
            if jobs.len() >= count {
                return jobs;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} dead jobs on {queue}",
                jobs.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.delivering
            .await
            .expect("join")
            .expect("delivery worker");
        self.worker.shutdown().await.expect("worker shutdown");
    }
}

/// Runs whose callbacks the policy refuses (a name resolving to a private
/// address, the metadata address, plain http to a public address) end as
/// they would have; each one's notification is dead-lettered at once with
/// the URL and the rule, and no delivery is enqueued. An allowed name,
/// mapped by the policy to the local receiver (no such name in DNS), is
/// delivered to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_callback_dead_letters_its_notification_and_leaves_the_run_as_it_was() {
    let (url, mut deliveries) = receiver().await;
    let port = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("port")
        .to_string();
    let policy = DestinationPolicy::default()
        .allow_loopback()
        .resolve_to("receiver.test", ["127.0.0.1".parse().expect("ip")])
        .resolve_to("internal.test", ["10.0.0.7".parse().expect("ip")]);
    let service = Service::start(
        WebhookTerminalHook::new("hooks")
            .timeout(Duration::from_secs(5))
            .with_policy(policy),
    )
    .await;

    let refused = [
        (
            "report ready",
            "https://internal.test/cb",
            TerminalStatus::Succeeded,
            "rule `private`: `internal.test` resolves to 10.0.0.7",
        ),
        (
            "fail",
            "http://169.254.169.254/latest/meta-data/",
            TerminalStatus::Failed,
            "rule `metadata`: 169.254.169.254 is a cloud metadata address",
        ),
        (
            "plain",
            "http://203.0.113.10/cb",
            TerminalStatus::Succeeded,
            "rule `plain-http`",
        ),
    ];
    let mut runs = Vec::new();
    for (input, callback, status, _) in &refused {
        let run = service.run(input, callback).await;
        runs.push((run, *status));
    }
    let delivered = service
        .run("allowed", &format!("http://receiver.test:{port}/named"))
        .await;

    // (The failed run's step is dead on the same queue.)
    let notes = service
        .dead_jobs("workflow-steps", refused.len(), |job| {
            job.headers.contains_key(HEADER_TERMINAL)
        })
        .await;
    assert_eq!(notes.len(), refused.len());
    for ((run, status), (_, callback, _, rule)) in runs.iter().zip(&refused) {
        let note = notes
            .iter()
            .find(|job| {
                job.headers.contains_key(HEADER_TERMINAL)
                    && job.headers.get(HEADER_RUN_ID).map(String::as_str) == Some(run.as_str())
            })
            .unwrap_or_else(|| panic!("no dead notification for {run}: {notes:?}"));
        let error = note.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains(&format!("webhook destination `{callback}` refused")),
            "{error}"
        );
        assert!(error.contains(rule), "{error}");
        // Permanent: one attempt, no retry.
        assert_eq!(note.attempts, 1, "{note:?}");
        // The run's outcome is untouched.
        let end = service.runtime.wait(run).await.expect("wait");
        assert_eq!(end.termination.status, *status, "{run}");
    }

    // The allowed run was delivered, through the policy's mapping.
    let (head, body) = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
        .await
        .expect("delivered in time")
        .expect("a delivery");
    assert!(head.starts_with("POST /named"), "{head}");
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
    assert_eq!(json["run_id"], delivered.as_str());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        deliveries.try_recv().is_err(),
        "a refused run was delivered"
    );
    let stats = service.queue.view().stats("hooks").await.expect("stats");
    assert_eq!(
        (stats.done, stats.pending, stats.dead),
        (1, 0, 0),
        "{stats:?}"
    );
    service.stop().await;
}

/// A delivery job that did not come through the hook's check (enqueued
/// directly, or checked under another policy) is refused by the delivery
/// worker: dead-lettered on its first attempt with the URL and the rule,
/// never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_worker_refuses_a_job_that_did_not_pass_the_hook() {
    let (url, mut deliveries) = receiver().await;
    // The hook allows nothing local; its worker is what is tested here.
    let service = Service::start(WebhookTerminalHook::new("hooks")).await;
    for target in [
        url.as_str(),
        "https://169.254.169.254/latest/meta-data/",
        "https://[::ffff:10.0.0.1]/cb",
    ] {
        enqueue_webhook(
            &service.queue,
            "hooks",
            WebhookRequest::new(target),
            b"{}".to_vec(),
        )
        .await
        .expect("enqueue");
    }
    let dead = service.dead_jobs("hooks", 3, |_| true).await;
    for job in &dead {
        let target = &job.headers[taquba_workflow::webhooks::taquba_webhooks::HEADER_URL];
        let error = job.last_error.as_deref().unwrap_or_default();
        assert!(
            error.contains(&format!("webhook destination `{target}` refused: rule `")),
            "{error}"
        );
        assert_eq!(job.attempts, 1, "{job:?}");
    }
    assert!(deliveries.try_recv().is_err(), "a refused job was sent");
    service.stop().await;
}

/// The policy's refusal in `error`'s chain of sources.
fn policy_refusal(error: &(dyn std::error::Error + 'static)) -> Option<DestinationError> {
    let mut source = error.source();
    while let Some(error) = source {
        if let Some(refused) = error.downcast_ref::<DestinationError>() {
            return Some(refused.clone());
        }
        source = error.source();
    }
    None
}

/// The delivery client checks a redirect: one to an address the policy
/// refuses, or to a name over plain http, is not followed; one to a name
/// is followed only to the addresses the name's resolution passed (here
/// none). The receiver gets the request, nothing else is connected to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_client_does_not_follow_a_refused_redirect() {
    for (location, at_redirect, named) in [
        (
            "http://169.254.169.254/latest/meta-data/",
            true,
            "`http://169.254.169.254/latest/meta-data/` refused: rule `metadata`",
        ),
        (
            // A redirect's URL is shown as parsed.
            "https://[::ffff:10.0.0.1]/admin",
            true,
            "`https://[::ffff:a00:1]/admin` refused: rule `private`",
        ),
        (
            "http://receiver.test/elsewhere",
            true,
            "`http://receiver.test/elsewhere` refused: rule `plain-http`",
        ),
        (
            "https://internal.test/admin",
            false,
            "rule `private`: `internal.test` resolves to 10.0.0.7",
        ),
    ] {
        let response: &'static [u8] = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\
             connection: close\r\n\r\n"
        )
        .into_bytes()
        .leak();
        let (url, mut requests) = responder(response).await;
        let policy = DestinationPolicy::default()
            .allow_loopback()
            .resolve_to("internal.test", ["10.0.0.7".parse().expect("ip")])
            .resolve_to("receiver.test", ["127.0.0.1".parse().expect("ip")]);
        let client = policy.http_client().expect("client");
        let error = client
            .post(&url)
            .body("{}")
            .send()
            .await
            .expect_err("the redirect is refused");
        // Refused at the redirect, or when its name resolved.
        assert_eq!(error.is_redirect(), at_redirect, "{location}: {error:?}");
        assert_eq!(error.is_connect(), !at_redirect, "{location}: {error:?}");
        let refused =
            policy_refusal(&error).unwrap_or_else(|| panic!("not the policy's refusal: {error:?}"));
        assert!(refused.is_permanent(), "{refused}");
        assert!(refused.to_string().contains(named), "{refused}");
        // The first request reached the receiver, and only it.
        assert!(requests.recv().await.is_some());
        assert!(requests.try_recv().is_err());
    }
}

/// The delivery client connects to the addresses its own resolution
/// checked: a name mapped to a private address is refused when it is
/// connected to, even though nothing checked the URL before.
#[tokio::test]
async fn the_delivery_client_refuses_a_name_when_it_connects() {
    let policy =
        DestinationPolicy::default().resolve_to("internal.test", ["10.0.0.7".parse().expect("ip")]);
    let client = policy.http_client().expect("client");
    let error = client
        .post("https://internal.test/cb")
        .send()
        .await
        .expect_err("refused");
    assert!(error.is_connect(), "{error:?}");
    let refused =
        policy_refusal(&error).unwrap_or_else(|| panic!("not the policy's refusal: {error:?}"));
    assert!(
        refused
            .to_string()
            .contains("`internal.test` resolves to 10.0.0.7"),
        "{refused}"
    );
}

/// A redirect the policy allows is followed, to the address the policy's
/// resolution gave (a name no DNS knows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delivery_client_follows_an_allowed_redirect() {
    let (target, mut arrivals) = receiver().await;
    let port = target
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .expect("port")
        .to_string();
    let response: &'static [u8] = format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://receiver.test:{port}/moved\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    )
    .into_bytes()
    .leak();
    let (url, mut first) = responder(response).await;
    let policy = DestinationPolicy::default()
        .allow_loopback()
        .allow_scheme("http")
        .resolve_to("receiver.test", ["127.0.0.1".parse().expect("ip")]);
    let response = policy
        .http_client()
        .expect("client")
        .post(&url)
        .body("{}")
        .send()
        .await
        .expect("delivered");
    assert!(response.status().is_success(), "{response:?}");
    assert!(first.recv().await.is_some());
    let (head, body) = arrivals.recv().await.expect("redirected");
    assert!(head.starts_with("POST /moved"), "{head}");
    assert_eq!(body, b"{}");
}
