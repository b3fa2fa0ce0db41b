//! The `tracing` spans of the runtime, and what is recorded on them.
//!
//! | span | where | fields |
//! |---|---|---|
//! | `workflow.step` | one attempt of a step: the runner call and its settlement | `queue`, `run_id`, `workflow`, `step` (name), `step_number`, `attempt`, `job_id`, then `outcome` (`continued`, `retried`, `succeeded`, `failed`, `cancelled`) and on an error `error` and `otel.status_code = "ERROR"` |
//! | `workflow.notify` | one attempt of a terminal hook call | `queue`, `run_id`, `status`, `attempt`, `job_id`, `outcome`, `error` |
//! | `workflow.submit` | a submission (runs, typed starts, jobs, group members) | `queue`, `run_id` (or `group`), `newly_submitted`, `error` |
//! | `workflow.cancel` | a cancellation from outside | `queue`, `run_id`, `cancelled`, `error` |
//! | `workflow.signal` | a signal ([`signal`](crate::WorkflowRuntime::signal), [`signal_run`](crate::WorkflowRuntime::signal_run)) | `queue`, `correlation_key`, `run_id` (for `signal_run`), `outcome`, `error` |
//! | `workflow.reconcile` | the termination of a run whose step was dead-lettered outside the worker | `queue`, `run_id`, `step_number`, `job_id` |
//!
//! Numbers are recorded as `i64` (OpenTelemetry's integer attributes).
//! Every span is at `INFO`. Fields are computed only for an enabled span:
//! with no subscriber interested, a span costs `tracing`'s level check and
//! nothing else (no allocation, no payload read). With the `opentelemetry`
//! feature a step's span is parented on the trace context stored with its
//! run (see `otel`).

use std::future::Future;

use futures_util::future::Either;
use tracing::field::Empty;
use tracing::instrument::Instrumented;
use tracing::{Instrument, Span, info_span};

use crate::error::Error;
use crate::store::keys::{HEADER_RUN_ID, HEADER_STEP, HEADER_TERMINAL};

/// `future` in `span`; as it is when the span is disabled (no subscriber
/// wants it), so that it pays nothing per poll: a disabled span's enter and
/// exit still run `tracing`'s `log` fallback, which a dependency (slatedb)
/// turns on.
pub(crate) fn within<F: Future>(span: Span, future: F) -> Either<F, Instrumented<F>> {
    if span.is_disabled() {
        Either::Left(future)
    } else {
        Either::Right(future.instrument(span))
    }
}

/// The span of one attempt of a step job (or of a notification job) with
/// the identity `job` carries; `names` gives the workflow and step names,
/// asked only for an enabled span.
pub(crate) fn step(
    queue: &str,
    job: &taquba::JobRecord,
    names: impl FnOnce() -> (Option<String>, String),
) -> Span {
    if let Some(status) = job.headers.get(HEADER_TERMINAL) {
        let span = info_span!(
            "workflow.notify",
            queue,
            run_id = Empty,
            status = status.as_str(),
            attempt = i64::from(job.attempts),
            job_id = job.id.as_str(),
            outcome = Empty,
            error = Empty,
            otel.status_code = Empty,
        );
        if !span.is_disabled()
            && let Some(run_id) = job.headers.get(HEADER_RUN_ID)
        {
            span.record("run_id", run_id.as_str());
        }
        return span;
    }
    let span = info_span!(
        "workflow.step",
        queue,
        run_id = Empty,
        workflow = Empty,
        step = Empty,
        step_number = Empty,
        attempt = i64::from(job.attempts),
        job_id = job.id.as_str(),
        outcome = Empty,
        error = Empty,
        otel.status_code = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    if let Some(run_id) = job.headers.get(HEADER_RUN_ID) {
        span.record("run_id", run_id.as_str());
    }
    if let Some(step) = job
        .headers
        .get(HEADER_STEP)
        .and_then(|s| s.parse::<u32>().ok())
    {
        span.record("step_number", step);
    }
    let (workflow, step) = names();
    if let Some(workflow) = workflow {
        span.record("workflow", workflow.as_str());
    }
    span.record("step", step.as_str());
    #[cfg(feature = "opentelemetry")]
    super::otel::set_parent(&span, &job.headers);
    span
}

/// Record on the step span `span` how its attempt settles: `outcome` (a
/// terminal status, `continued`, `retried`, `failed` or `dead_lettered`)
/// and the error, if any.
pub(crate) fn settling(span: &Span, (outcome, error): (&str, Option<&str>)) {
    if span.is_disabled() {
        return;
    }
    span.record("outcome", outcome);
    // A runner-issued cancel's reason is no error.
    if let Some(error) = error.filter(|_| outcome != "cancelled") {
        span.record("error", error);
        span.record("otel.status_code", "ERROR");
    }
}

/// The span of a submission to `queue` (of run `run_id` when the caller
/// named it).
pub(crate) fn submit(queue: &str, run_id: Option<&str>) -> Span {
    let span = info_span!(
        "workflow.submit",
        queue,
        run_id = run_id,
        newly_submitted = Empty,
        error = Empty,
        otel.status_code = Empty,
    );
    span
}

/// The span of a submission (or resumption) of group `group_id`'s members.
pub(crate) fn submit_group(queue: &str, group_id: &str) -> Span {
    info_span!(
        "workflow.submit",
        queue,
        group = group_id,
        run_id = Empty,
        newly_submitted = Empty,
        error = Empty,
        otel.status_code = Empty,
    )
}

/// Record a submission's answer on its span.
pub(crate) fn submitted(
    span: &Span,
    answer: &std::result::Result<crate::model::SubmitOutcome, Error>,
) {
    if span.is_disabled() {
        return;
    }
    match answer {
        Ok(outcome) => {
            span.record("run_id", outcome.run_id.as_str());
            span.record("newly_submitted", outcome.newly_submitted);
        }
        Err(err) => failed(span, err),
    }
}

/// The span of a cancellation of `run_id`.
pub(crate) fn cancel(queue: &str, run_id: &str) -> Span {
    info_span!(
        "workflow.cancel",
        queue,
        run_id,
        cancelled = Empty,
        error = Empty,
        otel.status_code = Empty,
    )
}

/// Record a cancellation's answer on its span.
pub(crate) fn cancelled(span: &Span, answer: &std::result::Result<bool, Error>) {
    if span.is_disabled() {
        return;
    }
    match answer {
        Ok(cancelled) => {
            span.record("cancelled", *cancelled);
        }
        Err(err) => failed(span, err),
    }
}

/// The span of a signal under `correlation_key` (to `run_id`'s wait only,
/// when given).
pub(crate) fn signal(queue: &str, correlation_key: &str, run_id: Option<&str>) -> Span {
    info_span!(
        "workflow.signal",
        queue,
        correlation_key,
        run_id,
        outcome = Empty,
        error = Empty,
        otel.status_code = Empty,
    )
}

/// Record a signal's outcome (`delivered`, `buffered`) or error on its span.
pub(crate) fn signalled<T>(
    span: &Span,
    answer: &std::result::Result<T, Error>,
    outcome: impl FnOnce(&T) -> &'static str,
) {
    if span.is_disabled() {
        return;
    }
    match answer {
        Ok(value) => {
            span.record("outcome", outcome(value));
        }
        Err(err) => failed(span, err),
    }
}

/// The span of the reconciliation of dead step job `job` of `run_id`.
pub(crate) fn reconcile(
    queue: &str,
    run_id: &str,
    step_number: u32,
    job: &taquba::JobRecord,
) -> Span {
    let span = info_span!(
        "workflow.reconcile",
        queue,
        run_id,
        step_number = i64::from(step_number),
        job_id = job.id.as_str(),
    );
    #[cfg(feature = "opentelemetry")]
    if !span.is_disabled() {
        super::otel::set_parent(&span, &job.headers);
    }
    span
}

fn failed(span: &Span, err: &Error) {
    span.record("error", tracing::field::display(err));
    span.record("otel.status_code", "ERROR");
}
