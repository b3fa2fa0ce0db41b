//! Trace context that follows a run (feature `opentelemetry`).
//!
//! At submission the W3C trace context current on the submitting task (the
//! current `tracing` span's, through `tracing-opentelemetry`'s layer, else
//! OpenTelemetry's current context) is stored on the run's step-0 job as
//! the reserved headers [`HEADER_TRACEPARENT`] and [`HEADER_TRACESTATE`],
//! and each settlement copies them to the next step's job. Every attempt's
//! `workflow.step` span is parented on it: across timers and signal waits
//! (the next step's job carries them), retries (the same job), dead-letter
//! reconciliation (the dead job's) and restarts in another process (the
//! headers are durable). A run submitted with no trace context current
//! carries no headers and its steps' spans are roots.
//!
//! A signal's sender is a span link of the step it wakes, not its parent:
//! the trace context current at [`signal`](crate::WorkflowRuntime::signal)
//! (or `signal_run`) is stored beside the signal (under the woken step
//! job's id, or beside a buffered signal until a step consumes it) and the
//! woken step's spans link to it; the step's settlement deletes it. Only
//! signals sent in-process carry a sender: an inbox command names none.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::{Deserialize, Serialize};
use taquba::JobRecord;
use tracing::{Span, debug};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::store::durable;
use crate::store::keys::{
    HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, HEADER_TRACEPARENT, HEADER_TRACESTATE,
    signal_sender_kv_key,
};

/// The W3C fields of a trace context, as the propagator writes them and as
/// a signal's sender is stored (MessagePack, named fields).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TraceFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
}

impl Injector for TraceFields {
    fn set(&mut self, key: &str, value: String) {
        match key {
            "traceparent" => self.traceparent = Some(value),
            "tracestate" if !value.is_empty() => self.tracestate = Some(value),
            _ => {}
        }
    }
}

impl Extractor for TraceFields {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => self.traceparent.as_deref(),
            "tracestate" => self.tracestate.as_deref(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        let mut keys = Vec::with_capacity(2);
        if self.traceparent.is_some() {
            keys.push("traceparent");
        }
        if self.tracestate.is_some() {
            keys.push("tracestate");
        }
        keys
    }
}

impl TraceFields {
    /// The fields of the trace context current on this task; `None` when
    /// none is.
    pub(crate) fn current() -> Option<Self> {
        let mut cx = Span::current().context();
        if !cx.span().span_context().is_valid() {
            cx = Context::current();
        }
        if !cx.span().span_context().is_valid() {
            return None;
        }
        let mut fields = Self::default();
        TraceContextPropagator::new().inject_context(&cx, &mut fields);
        fields.traceparent.is_some().then_some(fields)
    }

    /// The fields a step job's headers carry.
    fn of_headers(headers: &HashMap<String, String>) -> Option<Self> {
        Some(Self {
            traceparent: Some(headers.get(HEADER_TRACEPARENT)?.clone()),
            tracestate: headers.get(HEADER_TRACESTATE).cloned(),
        })
    }

    /// The remote context the fields describe; `None` when they do not
    /// parse (a header written by hand, a future version).
    fn context(&self) -> Option<Context> {
        let cx = TraceContextPropagator::new().extract(self);
        cx.span().span_context().is_valid().then_some(cx)
    }

    fn into_headers(self) -> impl Iterator<Item = (&'static str, String)> {
        self.traceparent
            .map(|value| (HEADER_TRACEPARENT, value))
            .into_iter()
            .chain(self.tracestate.map(|value| (HEADER_TRACESTATE, value)))
    }
}

/// The reserved headers storing the trace context current now with a run
/// being submitted; none when no trace context is current.
pub(crate) fn submit_headers() -> impl Iterator<Item = (&'static str, String)> {
    TraceFields::current()
        .into_iter()
        .flat_map(TraceFields::into_headers)
}

/// The trace headers of a step job's `headers`, for its run's next step.
pub(crate) fn carried(
    headers: &HashMap<String, String>,
) -> impl Iterator<Item = (&'static str, String)> {
    TraceFields::of_headers(headers)
        .into_iter()
        .flat_map(TraceFields::into_headers)
}

/// Parent `span` on the trace context a step job's `headers` carry.
pub(crate) fn set_parent(span: &Span, headers: &HashMap<String, String>) {
    if let Some(cx) = TraceFields::of_headers(headers).and_then(|fields| fields.context()) {
        // Fails only for a span no OpenTelemetry layer records, or one
        // already started: neither gets a parent then.
        let _ = span.set_parent(cx);
    }
}

/// Link `span`, the span of an attempt of step job `job`, to the sender of
/// the signal that woke the step, when one was stored.
pub(crate) async fn link_signal_sender(queue: &taquba::Queue, span: &Span, job: &JobRecord) {
    if span.is_disabled()
        || !(job.headers.contains_key(HEADER_SIGNAL_WAIT)
            || job.headers.contains_key(HEADER_SIGNAL_DELIVERED))
    {
        return;
    }
    let stored = match queue.view().kv_get(&signal_sender_kv_key(&job.id)).await {
        Ok(stored) => stored,
        Err(err) => {
            debug!(job_id = %job.id, "the signal's sender could not be read: {err}");
            return;
        }
    };
    let Some(cx) = stored
        .and_then(|bytes| durable::decode::<TraceFields>(&bytes).ok())
        .and_then(|fields| fields.context())
    else {
        return;
    };
    span.add_link(cx.span().span_context().clone());
}

/// The sender record a settlement of step job `job` deletes (that of the
/// signal that woke it), for a step that followed a signal wait.
pub(crate) fn sender_cleanup(job: &JobRecord) -> Option<Vec<u8>> {
    (job.headers.contains_key(HEADER_SIGNAL_WAIT)
        || job.headers.contains_key(HEADER_SIGNAL_DELIVERED))
    .then(|| signal_sender_kv_key(&job.id))
}

/// A sender recorded before a wake: the key and value written.
pub(crate) type NotedSender = Option<(Vec<u8>, Vec<u8>)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_fields_round_trip_through_headers_and_the_propagator() {
        let headers = HashMap::from([
            (
                HEADER_TRACEPARENT.to_string(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string(),
            ),
            (HEADER_TRACESTATE.to_string(), "vendor=opaque".to_string()),
        ]);
        let carried: HashMap<_, _> = carried(&headers).collect();
        assert_eq!(carried.len(), 2);
        let cx = TraceFields::of_headers(&headers)
            .and_then(|fields| fields.context())
            .expect("a valid context");
        let span = cx.span();
        let context = span.span_context();
        assert_eq!(
            context.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert!(context.is_remote());
        assert_eq!(context.trace_state().header(), "vendor=opaque");
        let mut again = TraceFields::default();
        TraceContextPropagator::new().inject_context(&cx, &mut again);
        assert_eq!(again, TraceFields::of_headers(&headers).unwrap());
    }

    #[test]
    fn a_malformed_traceparent_parents_nothing() {
        let headers = HashMap::from([(HEADER_TRACEPARENT.to_string(), "00-zz-yy-01".to_string())]);
        assert!(
            TraceFields::of_headers(&headers)
                .and_then(|fields| fields.context())
                .is_none()
        );
        assert_eq!(carried(&HashMap::new()).count(), 0);
    }
}
