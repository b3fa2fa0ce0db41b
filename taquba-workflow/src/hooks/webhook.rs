//! [`WebhookTerminalHook`]: an HTTP callback per terminated run, delivered
//! by [`taquba_webhooks`].

use std::collections::BTreeMap;
use std::time::Duration;

use taquba_webhooks::{WebhookRequest, webhook_enqueue_request};

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
/// let hook = WebhookTerminalHook::new("webhooks").timeout(Duration::from_secs(10));
/// let runtime = WorkflowRuntime::builder(queue.clone(), store, Done, hook).build();
/// let worker = runtime.spawn(std::future::pending::<()>());
/// let deliveries = tokio::spawn(async move {
///     let webhooks = taquba_webhooks::WebhookWorker::new();
///     taquba::run_worker(&queue, "webhooks", &webhooks, Duration::from_millis(200), std::future::pending::<()>()).await
/// });
/// runtime
///     .submit(RunSpec {
///         options: RunOptions {
///             headers: HashMap::from([("callback_url".into(), "https://example.com/done".into())]),
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
}

impl Default for WebhookTerminalHook {
    /// Deliveries on [`DEFAULT_WEBHOOK_QUEUE`].
    fn default() -> Self {
        Self::new(DEFAULT_WEBHOOK_QUEUE)
    }
}

impl WebhookTerminalHook {
    /// A hook enqueueing its deliveries on `delivery_queue`.
    pub fn new(delivery_queue: impl Into<String>) -> Self {
        Self {
            queue: delivery_queue.into(),
            timeout: None,
            headers: BTreeMap::new(),
        }
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
    /// Permanent when the body cannot be encoded or the enqueue cannot be
    /// staged (the handle is sealed); nothing is staged for a run without a
    /// callback URL.
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let Some(url) = Self::callback_url(outcome) else {
            return Ok(());
        };
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
            .header("Authorization", "Bearer t");
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
