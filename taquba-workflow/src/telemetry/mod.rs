//! What the runtime tells an operator's tools: `tracing` spans per step
//! attempt and per submission, cancellation and signal (`spans`, always
//! on); with the `opentelemetry` feature, the W3C trace context stored with
//! each run and carried to every step (`otel`); with the `metrics` feature,
//! counters, histograms and gauges through the `metrics` facade
//! (`metrics`). Each is reached from a few points of the engine, so the
//! engine's modules stay about the engine.

pub(crate) mod spans;

#[cfg(feature = "opentelemetry")]
pub(crate) mod otel;

#[cfg(feature = "metrics")]
pub(crate) mod metrics;
