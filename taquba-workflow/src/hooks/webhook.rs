//! [`WebhookTerminalHook`]: an HTTP callback per terminated run, delivered
//! by [`taquba_webhooks`].

use std::collections::BTreeMap;
use std::time::Duration;

use taquba::{JobRecord, LeaseHandle, PermanentFailure, Worker, WorkerError};
use taquba_webhooks::{WebhookRequest, WebhookWorker, webhook_enqueue_request};

use crate::hooks::destination::{DestinationError, DestinationPolicy};
use crate::hooks::terminal::TerminalHook;
use crate::model::RunOutcome;
use crate::model::StepError;
use crate::run::effects::TerminalEffects;

/// The submitter header ([`RunOptions::headers`](crate::RunOptions::headers))
/// holding a run's callback URL.
pub const CALLBACK_URL_HEADER: &str = "callback_url";

/// The queue deliveries are enqueued on unless
/// [`WebhookTerminalHook::new`] names another.
pub const DEFAULT_WEBHOOK_QUEUE: &str = "workflow-webhooks";

/// A [`TerminalHook`] that sends an HTTP `POST` to each run's callback URL
/// when the run terminates.
///
/// The URL is the run's [`RunOptions::headers`](crate::RunOptions::headers)`["callback_url"]`;
/// runs without it (or with an empty one) are not observed, so their
/// terminations enqueue no notification at all. For an observed run the
/// hook builds the delivery with [`taquba_webhooks::webhook_enqueue_request`]
/// and stages its enqueue on the [`TerminalEffects`], so the delivery job is
/// created exactly once, in the transaction that acknowledges the run's
/// notification. Deliver the jobs by running a
/// [`taquba_webhooks::WebhookWorker`] on the delivery queue (with
/// [`taquba::run_worker`] on the runtime's [`taquba::Queue`]); it retries
/// transient HTTP failures with the queue's backoff and sends a
/// `Webhook-Id` header for receiver-side deduplication.
///
/// The delivery queue must not be the runtime's own queue (its worker
/// would take every delivery for a malformed step and dead-letter it):
/// [`WorkflowRuntimeBuilder::build`](crate::WorkflowRuntimeBuilder::build)
/// panics when it is. A hook of your own that wraps this one is not seen
/// through at build; its staging of the delivery is refused instead
/// ([`TerminalEffects::enqueue`]), so each notification is dead-lettered
/// with an error naming the queue.
///
/// # Where callbacks may go
///
/// The callback URL is the submitter's, so the hook checks it with its
/// [`DestinationPolicy`] before staging the delivery
/// ([`with_policy`](Self::with_policy); [`DestinationPolicy::default()`]
/// without it): `https` to public addresses, nothing on loopback or private
/// networks, no cloud metadata endpoint, names checked by what they resolve
/// to. A refused URL fails the notification with a permanent error (a
/// [`DestinationError`] naming the URL and the rule), so it is
/// dead-lettered at once and no delivery is enqueued; the run's outcome
/// committed before and stays as it was. A name that does not resolve is a
/// transient error (the notification is retried).
///
/// Deliver with [`delivery_worker`](Self::delivery_worker) (a
/// [`WebhookDeliveryWorker`] under the same policy) rather than a plain
/// [`WebhookWorker`]: it checks each delivery again when it is sent and
/// connects only to the addresses its resolution checked, so a name whose
/// DNS answer changes after the hook's check (DNS rebinding) cannot reach
/// a refused address.
///
/// The request body is a JSON object:
///
/// | field | value |
/// |---|---|
/// | `run_id` | the run id |
/// | `status` | `"succeeded"`, `"failed"` or `"cancelled"` |
/// | `final_step` | the step the run ended at |
/// | `result` | the `Succeed` result as a string when it is UTF-8, else `null` |
/// | `result_hex` | the result in hex, present only when it is not UTF-8 |
/// | `error` | the failure (or runner cancel) reason, or `null` |
/// | `headers` | the submitter's headers, without `callback_url` |
///
/// with the HTTP headers `Content-Type: application/json`,
/// `Workflow-Run-Id` and `Workflow-Status`.
///
/// ```no_run
/// # use std::{collections::HashMap, sync::Arc, time::Duration};
/// # use taquba::{Queue, object_store::memory::InMemory};
/// # use taquba_workflow::{RunOptions, RunSpec, Step, StepError, StepOutcome, StepRunner, WebhookTerminalHook, WorkflowRuntime};
/// # struct Done;
/// # impl StepRunner for Done {
/// #     async fn run_step(&self, _: &Step) -> Result<StepOutcome, StepError> {
/// #         Ok(StepOutcome::Succeed { result: b"ok".to_vec() })
/// #     }
/// # }
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(InMemory::new());
/// let queue = Arc::new(Queue::open(store.clone(), "app").await?);
/// let policy = taquba_workflow::webhooks::DestinationPolicy::default().allow_host("*.example.com");
/// let hook = WebhookTerminalHook::new("webhooks")
///     .timeout(Duration::from_secs(10))
///     .with_policy(policy);
/// let webhooks = hook.delivery_worker()?;
/// let runtime = WorkflowRuntime::builder(queue.clone(), store, Done, hook).build();
/// let worker = runtime.spawn(std::future::pending::<()>());
/// let deliveries = tokio::spawn(async move {
///     taquba::run_worker(&queue, "webhooks", &webhooks, Duration::from_millis(200), std::future::pending::<()>()).await
/// });
/// runtime
///     .submit(RunSpec {
///         options: RunOptions {
///             headers: HashMap::from([("callback_url".into(), "https://hooks.example.com/done".into())]),
///             ..RunOptions::default()
///         },
///         ..RunSpec::default()
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct WebhookTerminalHook {
    queue: String,
    timeout: Option<Duration>,
    headers: BTreeMap<String, String>,
    policy: DestinationPolicy,
}

impl Default for WebhookTerminalHook {
    /// Deliveries on [`DEFAULT_WEBHOOK_QUEUE`].
    fn default() -> Self {
        Self::new(DEFAULT_WEBHOOK_QUEUE)
    }
}

impl WebhookTerminalHook {
    /// A hook enqueueing its deliveries on `delivery_queue`, under the
    /// default [`DestinationPolicy`] (`https` to public addresses only).
    pub fn new(delivery_queue: impl Into<String>) -> Self {
        Self {
            queue: delivery_queue.into(),
            timeout: None,
            headers: BTreeMap::new(),
            policy: DestinationPolicy::default(),
        }
    }

    /// Check every callback URL with `policy` (in place of
    /// [`DestinationPolicy::default()`]); a URL it refuses dead-letters
    /// the run's notification with the refusal.
    pub fn with_policy(mut self, policy: DestinationPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The policy callback URLs are checked with.
    pub fn policy(&self) -> &DestinationPolicy {
        &self.policy
    }

    /// A [`WebhookDeliveryWorker`] under this hook's policy, to run on the
    /// [`delivery_queue`](Self::delivery_queue) with [`taquba::run_worker`].
    ///
    /// # Errors
    /// When the HTTP client cannot be built
    /// ([`DestinationPolicy::http_client`]).
    pub fn delivery_worker(&self) -> Result<WebhookDeliveryWorker, reqwest::Error> {
        WebhookDeliveryWorker::new(self.policy.clone())
    }

    /// Bound each delivery's HTTP request by `timeout` (without it the
    /// worker's default applies).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Send the HTTP header `name: value` with every delivery (for example
    /// an authorization token of the receiver).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The queue deliveries are enqueued on.
    pub fn delivery_queue(&self) -> &str {
        &self.queue
    }

    fn callback_url(outcome: &RunOutcome) -> Option<&str> {
        outcome
            .headers
            .get(CALLBACK_URL_HEADER)
            .map(String::as_str)
            .filter(|url| !url.trim().is_empty())
    }

    /// The JSON body of `outcome`'s delivery.
    fn body(outcome: &RunOutcome) -> serde_json::Value {
        let text = outcome
            .result
            .as_deref()
            .and_then(|bytes| std::str::from_utf8(bytes).ok());
        let headers: BTreeMap<&str, &str> = outcome
            .headers
            .iter()
            .filter(|(name, _)| name.as_str() != CALLBACK_URL_HEADER)
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        let mut body = serde_json::json!({
            "run_id": outcome.run_id.as_str(),
            "status": outcome.status.as_str(),
            "final_step": outcome.final_step,
            "result": text,
            "error": outcome.error,
            "headers": headers,
        });
        if let (Some(result), None, Some(object)) = (&outcome.result, text, body.as_object_mut()) {
            object.insert("result_hex".to_string(), hex::encode(result).into());
        }
        body
    }
}

/// Panic when `hook` is a [`WebhookTerminalHook`] delivering on
/// `runtime_queue`, the queue of the runtime being built: a configuration
/// error no notification could survive.
pub(crate) fn refuse_delivery_on_runtime_queue<H: 'static>(hook: &H, runtime_queue: &str) {
    let Some(hook) = (hook as &dyn std::any::Any).downcast_ref::<WebhookTerminalHook>() else {
        return;
    };
    assert!(
        hook.delivery_queue() != runtime_queue,
        "WebhookTerminalHook delivers on `{runtime_queue}`, the runtime's own queue, whose worker \
         would dead-letter every delivery as a malformed step: give the hook another queue \
         (WebhookTerminalHook::new) or the runtime another (WorkflowRuntimeBuilder::queue_name)"
    );
}

impl TerminalHook for WebhookTerminalHook {
    /// Stage the delivery of `outcome` to its callback URL.
    ///
    /// # Errors
    /// Permanent when the policy refuses the callback URL
    /// ([`DestinationError::Refused`]: the URL and the rule), when the body
    /// cannot be encoded or the enqueue cannot be staged (the handle is
    /// sealed); transient when the URL's host does not resolve
    /// ([`DestinationError::Lookup`]). Nothing is staged for a run without a
    /// callback URL, nor for a refused one.
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let Some(url) = Self::callback_url(outcome) else {
            return Ok(());
        };
        self.policy.check(url).await.map_err(destination_error)?;
        let body = serde_json::to_vec(&Self::body(outcome))
            .map_err(|e| StepError::permanent(format!("cannot encode the webhook body: {e}")))?;
        let mut request = WebhookRequest::new(url)
            .header("Content-Type", "application/json")
            .header("Workflow-Run-Id", outcome.run_id.as_str())
            .header("Workflow-Status", outcome.status.as_str());
        for (name, value) in &self.headers {
            request = request.header(name.clone(), value.clone());
        }
        if let Some(timeout) = self.timeout {
            request = request.timeout(timeout);
        }
        effects.enqueue(webhook_enqueue_request(&self.queue, request, body))?;
        Ok(())
    }

    /// Whether the run has a non-empty `callback_url` header.
    fn observes(&self, outcome: &RunOutcome) -> bool {
        Self::callback_url(outcome).is_some()
    }
}

/// A [`DestinationError`] as the notification's error: permanent for a
/// refusal, transient for a failed lookup.
fn destination_error(error: DestinationError) -> StepError {
    if error.is_permanent() {
        StepError::permanent(error.to_string())
    } else {
        StepError::transient(error.to_string())
    }
}

/// A [`taquba::Worker`] delivering [`WebhookTerminalHook`]'s jobs (or any
/// [`taquba_webhooks`] job) under a [`DestinationPolicy`].
///
/// Each delivery's URL (its `webhook.url` header) is checked with the
/// policy first: a refused one is dead-lettered at once with the
/// [`DestinationError`] (the URL and the rule) as its error, a name that
/// does not resolve is retried. The delivery itself is a
/// [`taquba_webhooks::WebhookWorker`]'s (retries, timeouts, the
/// `Webhook-Id` header), on the policy's
/// [`http_client`](DestinationPolicy::http_client): every connection
/// resolves its host through the policy and goes only to the addresses
/// that resolution passed, and every redirect is checked before it is
/// followed. A refusal there (the name's DNS answer changed since the
/// check) fails the attempt as a transport error, retried like one; the
/// refused address is never connected to.
///
/// Build it with [`WebhookTerminalHook::delivery_worker`] to share the
/// hook's policy.
pub struct WebhookDeliveryWorker {
    policy: DestinationPolicy,
    inner: WebhookWorker,
}

impl std::fmt::Debug for WebhookDeliveryWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookDeliveryWorker")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl WebhookDeliveryWorker {
    /// A worker delivering under `policy`, with
    /// [`taquba_webhooks::WebhookWorker`]'s defaults otherwise.
    ///
    /// # Errors
    /// When the HTTP client cannot be built
    /// ([`DestinationPolicy::http_client`]).
    pub fn new(policy: DestinationPolicy) -> Result<Self, reqwest::Error> {
        let client = policy.http_client()?;
        Ok(Self {
            policy,
            inner: WebhookWorker::with_client(client),
        })
    }

    /// Bound deliveries that name no timeout by `timeout`
    /// ([`WebhookWorker::with_default_timeout`]).
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.with_default_timeout(timeout);
        self
    }

    /// Carry the job id in the header `name` instead of `Webhook-Id`
    /// ([`WebhookWorker::with_delivery_id_header`]).
    pub fn with_delivery_id_header(mut self, name: impl Into<String>) -> Self {
        self.inner = self.inner.with_delivery_id_header(name);
        self
    }

    /// Send no delivery-id header
    /// ([`WebhookWorker::without_delivery_id_header`]).
    pub fn without_delivery_id_header(mut self) -> Self {
        self.inner = self.inner.without_delivery_id_header();
        self
    }

    /// The policy deliveries are checked with.
    pub fn policy(&self) -> &DestinationPolicy {
        &self.policy
    }
}

impl Worker for WebhookDeliveryWorker {
    /// Check the job's URL with the policy, then deliver it.
    ///
    /// # Errors
    /// A [`PermanentFailure`] with the [`DestinationError`] for a refused
    /// URL; the [`DestinationError`] (transient) when its host does not
    /// resolve; otherwise the delivery's own errors.
    async fn process(&self, job: &JobRecord, lease: &LeaseHandle) -> Result<(), WorkerError> {
        // A job without a URL is the inner worker's to refuse.
        if let Some(url) = job
            .headers
            .get(taquba_webhooks::HEADER_URL)
            .filter(|url| !url.is_empty())
        {
            match self.policy.check(url).await {
                Ok(_) => {}
                Err(refused) if refused.is_permanent() => {
                    return Err(PermanentFailure::new(refused.to_string()).into());
                }
                Err(lookup) => return Err(lookup.into()),
            }
        }
        self.inner.process(job, lease).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TerminalStatus;
    use crate::store::keys::RunId;

    fn outcome(headers: &[(&str, &str)], result: Option<&[u8]>) -> RunOutcome {
        RunOutcome {
            run_id: RunId::new("run-1").unwrap(),
            status: TerminalStatus::Succeeded,
            result: result.map(<[u8]>::to_vec),
            error: None,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            final_step: 2,
        }
    }

    #[tokio::test]
    async fn a_run_with_a_callback_url_stages_one_delivery() {
        let hook = WebhookTerminalHook::new("hooks")
            .timeout(Duration::from_secs(3))
            .header("Authorization", "Bearer t")
            .with_policy(DestinationPolicy::default().allow_loopback());
        let outcome = outcome(
            &[
                ("callback_url", "http://127.0.0.1:9/cb"),
                ("tenant", "acme"),
            ],
            Some(b"done"),
        );
        assert!(hook.observes(&outcome));
        let effects = TerminalEffects::detached();
        hook.on_termination(&outcome, &effects).await.unwrap();
        let (kv, enqueues) = effects.seal_and_take();
        assert!(kv.writes.is_empty());
        assert_eq!(enqueues.len(), 1);
        let request = &enqueues[0];
        assert_eq!(request.queue, "hooks");
        let headers = &request.options.headers;
        assert_eq!(
            headers.get(taquba_webhooks::HEADER_URL).map(String::as_str),
            Some("http://127.0.0.1:9/cb")
        );
        assert_eq!(
            headers
                .get(taquba_webhooks::HEADER_TIMEOUT_MS)
                .map(String::as_str),
            Some("3000")
        );
        assert_eq!(
            headers.get("http.Authorization").map(String::as_str),
            Some("Bearer t")
        );
        assert_eq!(
            headers.get("http.Workflow-Run-Id").map(String::as_str),
            Some("run-1")
        );
        let body: serde_json::Value = serde_json::from_slice(&request.payload).unwrap();
        assert_eq!(body["status"], "succeeded");
        assert_eq!(body["result"], "done");
        assert_eq!(body["final_step"], 2);
        assert_eq!(body["headers"]["tenant"], "acme");
        assert!(body["headers"].get("callback_url").is_none());
        assert!(body.get("result_hex").is_none());
    }

    #[tokio::test]
    async fn a_refused_callback_url_is_a_permanent_error_and_stages_nothing() {
        use crate::model::StepErrorKind;
        let metadata = outcome(&[("callback_url", "http://169.254.169.254/latest")], None);
        let loopback = outcome(&[("callback_url", "http://127.0.0.1:9/cb")], None);
        let internal = outcome(&[("callback_url", "https://internal.test/cb")], None);
        let policy = DestinationPolicy::default()
            .allow_loopback()
            .resolve_to("internal.test", ["10.0.0.7".parse().unwrap()]);
        for (hook, outcome, rule) in [
            (WebhookTerminalHook::default(), &metadata, "rule `metadata`"),
            (WebhookTerminalHook::default(), &loopback, "rule `loopback`"),
            (
                WebhookTerminalHook::default().with_policy(policy.clone()),
                &internal,
                "rule `private`",
            ),
            (
                WebhookTerminalHook::default().with_policy(policy.clone()),
                &metadata,
                "rule `metadata`",
            ),
        ] {
            // Still observed: the refusal is the notification's error.
            assert!(hook.observes(outcome));
            let effects = TerminalEffects::detached();
            let error = hook.on_termination(outcome, &effects).await.unwrap_err();
            assert_eq!(error.kind, StepErrorKind::Permanent, "{}", error.message);
            let url = &outcome.headers["callback_url"];
            assert!(error.message.contains(url.as_str()), "{}", error.message);
            assert!(error.message.contains(rule), "{}", error.message);
            assert!(effects.seal_and_take().1.is_empty());
        }
        // A name that does not resolve is retried.
        let hook = WebhookTerminalHook::default()
            .with_policy(DestinationPolicy::default().resolve_to("gone.test", []));
        let gone = outcome(&[("callback_url", "https://gone.test/cb")], None);
        let error = hook
            .on_termination(&gone, &TerminalEffects::detached())
            .await
            .unwrap_err();
        assert_eq!(error.kind, StepErrorKind::Transient, "{}", error.message);
    }

    #[test]
    fn only_a_webhook_hook_on_the_runtimes_queue_is_refused() {
        // Another hook type is never looked into, whatever the queue.
        refuse_delivery_on_runtime_queue(&crate::NoopTerminalHook, DEFAULT_WEBHOOK_QUEUE);
        refuse_delivery_on_runtime_queue(&WebhookTerminalHook::default(), "workflow-steps");
        let refused = std::panic::catch_unwind(|| {
            refuse_delivery_on_runtime_queue(&WebhookTerminalHook::new("steps"), "steps");
        })
        .expect_err("refused");
        let message = crate::hooks::guard::panic_message(refused.as_ref());
        assert!(
            message.contains("`steps`, the runtime's own queue"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn binary_results_are_hex_and_runs_without_a_url_are_not_observed() {
        let hook = WebhookTerminalHook::default();
        assert_eq!(hook.delivery_queue(), DEFAULT_WEBHOOK_QUEUE);
        let binary = outcome(&[("callback_url", "http://h/cb")], Some(&[0xff, 0x00]));
        let body = WebhookTerminalHook::body(&binary);
        assert!(body["result"].is_null());
        assert_eq!(body["result_hex"], "ff00");
        for headers in [&[][..], &[("callback_url", " ")][..]] {
            let outcome = outcome(headers, None);
            assert!(!hook.observes(&outcome));
            let effects = TerminalEffects::detached();
            hook.on_termination(&outcome, &effects).await.unwrap();
            assert!(effects.seal_and_take().1.is_empty());
        }
    }
}
