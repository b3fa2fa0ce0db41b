//! The runtime's `tracing` spans (always on): one `workflow.step` span per
//! attempt with the run id, workflow and step names, step number, attempt
//! and job id, its outcome and error; spans for submissions, signals and
//! cancellations with their answers; the runner's own events inside the
//! step's span.
//!
//! A test binary of its own: the spans are collected by a thread-local
//! subscriber (`set_default`), and `tracing` caches each callsite's
//! interest process-wide. In the runtime's binary, a test running at the
//! same time on another thread, with no subscriber, could register a step
//! span's callsite as uninteresting just as this one set its subscriber,
//! and the spans were then never created (seen once in a full run).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{RunId, RunSpec, Step, StepError, StepOutcome, StepRunner};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

fn rid(id: &str) -> RunId {
    RunId::new(id).expect("valid test run id")
}

/// A span as recorded: its name and the fields it was given or recorded.
#[derive(Debug, Clone, Default)]
struct Recorded {
    name: &'static str,
    fields: HashMap<String, String>,
    /// Messages of the events inside it.
    events: Vec<String>,
}

impl Recorded {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

/// Records every span (in creation order) with its fields.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Recorded>>>);

impl Spans {
    fn named(&self, name: &str) -> Vec<Recorded> {
        let spans = self.0.lock().expect("spans lock");
        spans.iter().filter(|s| s.name == name).cloned().collect()
    }
}

/// The index of a span in [`Spans`], kept in its extensions.
struct Index(usize);

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut recorded = Recorded {
            name: attrs.metadata().name(),
            ..Default::default()
        };
        attrs.record(&mut Fields(&mut recorded.fields));
        let mut spans = self.0.lock().expect("spans lock");
        spans.push(recorded);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(spans.len() - 1));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut spans = self.0.lock().expect("spans lock");
        values.record(&mut Fields(&mut spans[index].fields));
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.event_span(event) else {
            return;
        };
        let Some(index) = span.extensions().get::<Index>().map(|i| i.0) else {
            return;
        };
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().expect("spans lock");
        spans[index]
            .events
            .push(fields.remove("message").unwrap_or_default());
    }
}

/// Step 0 logs and continues on signal `go`; step 1 succeeds.
struct Logged;

impl StepRunner for Logged {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        tracing::info!("working on step {}", step.step_number);
        match step.step_number {
            0 => Ok(StepOutcome::continue_on_signal(
                vec![],
                "go",
                Duration::from_secs(60),
            )),
            _ => Ok(StepOutcome::Succeed { result: vec![] }),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn every_attempt_has_a_span_with_its_identity_outcome_and_error() {
    let spans = Spans::default();
    let _guard =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let env = TestRuntime::builder(Logged)
        .retry_backoff(Duration::ZERO, Duration::ZERO)
        .build()
        .await
        .unwrap();
    env.fail_next("Logged", StepError::transient("warming up"))
        .unwrap();
    let submitted = env
        .submit(RunSpec {
            run_id: Some(rid("traced")),
            ..Default::default()
        })
        .await
        .unwrap();
    env.run_until_idle().await.unwrap();
    env.signal_raw("go", vec![]).await.unwrap();
    env.run_until_idle().await.unwrap();
    env.submit(RunSpec {
        run_id: Some(rid("cancelled")),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(
        env.runtime()
            .unwrap()
            .cancel(&rid("cancelled"))
            .await
            .unwrap()
    );

    let submits = spans.named("workflow.submit");
    assert_eq!(submits.len(), 2);
    assert_eq!(submits[0].field("run_id"), Some("traced"));
    assert_eq!(submits[0].field("newly_submitted"), Some("true"));
    assert_eq!(submits[0].field("queue"), Some("workflow-steps"));

    let steps = spans.named("workflow.step");
    let seen: Vec<_> = steps
        .iter()
        .map(|s| {
            (
                s.field("step_number").unwrap_or_default().to_string(),
                s.field("attempt").unwrap_or_default().to_string(),
                s.field("outcome").unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("0".into(), "1".into(), "retried".into()),
            ("0".into(), "2".into(), "continued".into()),
            ("1".into(), "1".into(), "succeeded".into()),
        ]
    );
    for step in &steps {
        assert_eq!(step.field("run_id"), Some("traced"));
        assert_eq!(step.field("step"), Some("Logged"), "the runner's label");
        assert_eq!(step.field("workflow"), Some("Logged"));
        assert!(step.field("job_id").is_some_and(|id| !id.is_empty()));
    }
    assert_eq!(steps[0].field("error"), Some("warming up"));
    assert_eq!(steps[0].field("otel.status_code"), Some("ERROR"));
    assert_eq!(steps[1].field("error"), None);
    assert!(
        steps[1].events.iter().any(|e| e == "working on step 0"),
        "the runner's event is in its step's span: {:?}",
        steps[1].events
    );
    assert_eq!(
        steps[0].field("job_id"),
        steps[1].field("job_id"),
        "a retry is the same job"
    );
    assert_eq!(
        steps[1].field("job_id"),
        Some(submitted.job_id.as_str()),
        "step 0 is the submitted job"
    );

    let signals = spans.named("workflow.signal");
    assert_eq!(signals.len(), 1);
    assert_eq!(signals[0].field("correlation_key"), Some("go"));
    assert_eq!(signals[0].field("outcome"), Some("delivered"));
    let cancels = spans.named("workflow.cancel");
    assert_eq!(cancels.len(), 1);
    assert_eq!(cancels[0].field("run_id"), Some("cancelled"));
    assert_eq!(cancels[0].field("cancelled"), Some("true"));
}
