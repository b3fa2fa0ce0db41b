//! A run's steps follow its submitter's trace (feature `opentelemetry`),
//! exported through `tracing-opentelemetry` to `opentelemetry_sdk`'s
//! in-memory exporter: one trace id across a timer, a retry, a signal and
//! a restart; every attempt's span a child of the submission's; the
//! signal's sender a link of the step it woke, not its parent; a run
//! failed by dead-letter reconciliation after a restart in that trace too.
//!
//! `cargo test -p taquba-workflow --features testing,opentelemetry --test trace_context`

use std::time::Duration;

use opentelemetry::trace::{SpanId, Status, TraceContextExt, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{RunId, RunSpec, Step, StepError, StepOutcome, StepRunner};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

const HOUR: Duration = Duration::from_secs(3600);

/// Step 0 (`hold`) waits an hour, step 1 (`review`) waits for the signal
/// `approve`, step 2 (`ship`) succeeds; with `block` as its input, step 0
/// never returns.
struct Approval;

impl StepRunner for Approval {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.payload == b"block" {
            std::future::pending::<()>().await;
        }
        match step.step_number {
            0 => Ok(StepOutcome::continue_after(vec![], HOUR)),
            1 => Ok(StepOutcome::continue_on_signal(vec![], "approve", HOUR)),
            _ => Ok(StepOutcome::Succeed {
                result: step.signal.clone().unwrap_or_default(),
            }),
        }
    }

    fn step_name(&self, step_number: u32, _payload: &[u8]) -> Option<String> {
        Some(["hold", "review", "ship"][step_number.min(2) as usize].to_string())
    }
}

/// An OpenTelemetry pipeline into an in-memory exporter, as this thread's
/// subscriber (the tests run on one thread, their tasks too).
fn pipeline() -> (
    InMemorySpanExporter,
    SdkTracerProvider,
    tracing::subscriber::DefaultGuard,
) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("trace-context-test"));
    let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    (exporter, provider, guard)
}

fn ids(span: &tracing::Span) -> (TraceId, SpanId) {
    let cx = span.context();
    let otel = cx.span();
    let context = otel.span_context();
    (context.trace_id(), context.span_id())
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> String {
    attribute(span, key)
        .map(|value| value.as_str().into_owned())
        .unwrap_or_default()
}

fn finished(exporter: &InMemorySpanExporter, provider: &SdkTracerProvider) -> Vec<SpanData> {
    provider.force_flush().expect("flush");
    exporter.get_finished_spans().expect("the exporter's spans")
}

#[tokio::test(start_paused = true)]
async fn one_trace_follows_a_run_across_a_timer_a_retry_a_signal_and_a_restart() {
    let (exporter, provider, _guard) = pipeline();
    let env = TestRuntime::new(Approval).await.unwrap();
    let request = tracing::info_span!("http.request");
    let (trace_id, request_id) = ids(&request);
    env.submit(RunSpec {
        run_id: Some(RunId::new("order-1").unwrap()),
        ..Default::default()
    })
    .instrument(request.clone())
    .await
    .unwrap();
    drop(request);

    env.fail_next("review", StepError::transient("reviewer busy"))
        .unwrap();
    env.run_until_idle().await.unwrap();
    env.advance(HOUR).await.unwrap(); // the timer: `review` fails
    env.advance(Duration::from_secs(1)).await.unwrap(); // the retry waits on the signal
    env.crash().await.unwrap();
    let webhook = tracing::info_span!("webhook.received");
    let (webhook_trace, _) = ids(&webhook);
    assert_ne!(webhook_trace, trace_id, "the sender is another trace");
    env.signal_raw("approve", b"ok".to_vec())
        .instrument(webhook.clone())
        .await
        .unwrap();
    drop(webhook);
    env.run_until_idle().await.unwrap();

    let spans = finished(&exporter, &provider);
    let submit = spans
        .iter()
        .find(|s| s.name == "workflow.submit")
        .expect("the submission's span");
    assert_eq!(submit.span_context.trace_id(), trace_id);
    assert_eq!(submit.parent_span_id, request_id);
    assert_eq!(text(submit, "run_id"), "order-1");

    let steps: Vec<&SpanData> = spans.iter().filter(|s| s.name == "workflow.step").collect();
    let seen: Vec<(String, i64)> = steps
        .iter()
        .map(|s| {
            let attempt = match attribute(s, "attempt") {
                Some(Value::I64(attempt)) => *attempt,
                other => panic!("attempt is an integer: {other:?}"),
            };
            (text(s, "step"), attempt)
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("hold".to_string(), 1),
            ("review".to_string(), 1),
            ("review".to_string(), 2),
            ("ship".to_string(), 1)
        ]
    );
    for step in &steps {
        assert_eq!(
            step.span_context.trace_id(),
            trace_id,
            "{} left the trace",
            text(step, "step")
        );
        assert_eq!(step.parent_span_id, submit.span_context.span_id());
        assert!(step.parent_span_is_remote, "parented on the stored context");
        assert_eq!(text(step, "run_id"), "order-1");
        assert!(!text(step, "job_id").is_empty());
    }
    let failed = steps[1];
    assert_eq!(text(failed, "outcome"), "retried");
    assert_eq!(text(failed, "error"), "reviewer busy");
    assert!(matches!(failed.status, Status::Error { .. }));
    assert_eq!(text(steps[2], "outcome"), "continued");
    assert_eq!(text(steps[3], "outcome"), "succeeded");

    let signal = spans
        .iter()
        .find(|s| s.name == "workflow.signal")
        .expect("the signal's span");
    assert_eq!(signal.span_context.trace_id(), webhook_trace);
    assert_eq!(text(signal, "outcome"), "delivered");
    let ship = steps[3];
    let links: Vec<_> = ship.links.iter().map(|l| l.span_context.clone()).collect();
    assert_eq!(links.len(), 1, "the sender is linked: {links:?}");
    assert_eq!(links[0].trace_id(), webhook_trace);
    assert_eq!(links[0].span_id(), signal.span_context.span_id());
    assert!(
        steps[..3].iter().all(|s| s.links.is_empty()),
        "only the woken step links the sender"
    );
}

#[tokio::test(start_paused = true)]
async fn a_buffered_signal_links_its_sender_to_the_step_that_consumes_it() {
    let (exporter, provider, _guard) = pipeline();
    let env = TestRuntime::new(Approval).await.unwrap();
    let webhook = tracing::info_span!("early.webhook");
    let (webhook_trace, _) = ids(&webhook);
    env.signal_raw("approve", b"early".to_vec())
        .instrument(webhook.clone())
        .await
        .unwrap();
    drop(webhook);
    let request = tracing::info_span!("http.request");
    let (trace_id, _) = ids(&request);
    env.submit(RunSpec::default())
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    env.run_until_idle().await.unwrap();
    env.advance(HOUR).await.unwrap();

    let spans = finished(&exporter, &provider);
    let ship = spans
        .iter()
        .find(|s| s.name == "workflow.step" && text(s, "step") == "ship")
        .expect("the run ended");
    assert_eq!(ship.span_context.trace_id(), trace_id);
    assert_eq!(
        ship.links
            .iter()
            .map(|l| l.span_context.trace_id())
            .collect::<Vec<_>>(),
        [webhook_trace]
    );
    let signal = spans.iter().find(|s| s.name == "workflow.signal").unwrap();
    assert_eq!(text(signal, "outcome"), "buffered");
    // Nothing of the sender outlives the step that consumed it.
    let queue = env.queue().unwrap();
    let left = queue
        .view()
        .kv_scan(b"workflow/trace/", .., 10)
        .await
        .unwrap()
        .entries;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(start_paused = true)]
async fn a_run_ended_by_reconciliation_after_a_restart_stays_in_its_trace() {
    let (exporter, provider, _guard) = pipeline();
    let env = TestRuntime::builder(Approval)
        .max_attempts(1)
        .build()
        .await
        .unwrap();
    let request = tracing::info_span!("http.request");
    let (trace_id, _) = ids(&request);
    env.submit(RunSpec {
        input: b"block".to_vec(),
        ..Default::default()
    })
    .instrument(request.clone())
    .await
    .unwrap();
    drop(request);
    // The step hangs; the process dies on its last attempt.
    let _ = tokio::time::timeout(Duration::from_secs(5), env.run_until_idle()).await;
    env.crash().await.unwrap();
    env.run_until_idle().await.unwrap();

    let spans = finished(&exporter, &provider);
    let reconcile = spans
        .iter()
        .find(|s| s.name == "workflow.reconcile")
        .expect("the reconciliation's span");
    assert_eq!(reconcile.span_context.trace_id(), trace_id);
    let untraced = RunSpec::default();
    env.submit(untraced).await.unwrap();
    env.run_until_idle().await.unwrap();
    let spans = finished(&exporter, &provider);
    let roots = spans
        .iter()
        .filter(|s| s.name == "workflow.step" && s.span_context.trace_id() != trace_id)
        .count();
    assert!(
        roots >= 1,
        "a run submitted outside any trace starts its own at the submission"
    );
}
