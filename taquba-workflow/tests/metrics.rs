//! The runtime's metrics (feature `metrics`), read from `metrics-util`'s
//! debugging recorder: the names and labels the README's table lists, with
//! the values a known set of runs produces.
//!
//! `cargo test -p taquba-workflow --features testing,metrics --test metrics`

use std::collections::HashMap;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use taquba_workflow::testing::TestRuntime;
use taquba_workflow::{RunSpec, Step, StepError, StepOutcome, StepRunner};

/// Step 0 waits a minute; step 1 succeeds, or fails permanently when the
/// input says `fail`.
struct Pipeline;

impl StepRunner for Pipeline {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        match step.step_number {
            0 => Ok(StepOutcome::continue_after(
                step.payload.clone(),
                Duration::from_secs(60),
            )),
            _ if step.payload == b"fail" => Err(StepError::permanent("bad input")),
            _ => Ok(StepOutcome::Succeed { result: vec![] }),
        }
    }
}

/// A metric by its name and labels (sorted `key=value`, comma-joined).
type Metrics = HashMap<(MetricKind, String, String), DebugValue>;

/// Add a snapshot (the recorder's values since the last one: counters and
/// histograms are drained, gauges read and reset) to `into`.
fn read_into(into: &mut Metrics, snapshotter: &Snapshotter) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key: CompositeKey = key;
        let (kind, key) = key.into_parts();
        let mut labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        labels.sort();
        let entry = (kind, key.name().to_string(), labels.join(","));
        match (into.get_mut(&entry), value) {
            (Some(DebugValue::Counter(total)), DebugValue::Counter(more)) => *total += more,
            (Some(DebugValue::Histogram(all)), DebugValue::Histogram(more)) => all.extend(more),
            (Some(DebugValue::Gauge(level)), DebugValue::Gauge(delta)) => {
                *level = (level.into_inner() + delta.into_inner()).into();
            }
            (_, value) => {
                into.insert(entry, value);
            }
        }
    }
}

fn counter(metrics: &Metrics, name: &str, labels: &str) -> u64 {
    match metrics.get(&(MetricKind::Counter, name.to_string(), labels.to_string())) {
        Some(DebugValue::Counter(value)) => *value,
        None => 0,
        other => panic!("{name}{{{labels}}} is no counter: {other:?}"),
    }
}

fn gauge(metrics: &Metrics, name: &str, labels: &str) -> Option<f64> {
    match metrics.get(&(MetricKind::Gauge, name.to_string(), labels.to_string())) {
        Some(DebugValue::Gauge(value)) => Some(value.into_inner()),
        None => None,
        other => panic!("{name}{{{labels}}} is no gauge: {other:?}"),
    }
}

fn histogram(metrics: &Metrics, name: &str, labels: &str) -> Vec<f64> {
    match metrics.get(&(MetricKind::Histogram, name.to_string(), labels.to_string())) {
        Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
        None => Vec::new(),
        other => panic!("{name}{{{labels}}} is no histogram: {other:?}"),
    }
}

const Q: &str = "queue=workflow-steps";

#[tokio::test(start_paused = true)]
async fn counters_histograms_and_gauges_follow_the_runs() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let env = TestRuntime::builder(Pipeline)
        .retry_backoff(Duration::ZERO, Duration::ZERO)
        .build()
        .await
        .unwrap();
    for input in ["ok", "retry", "fail"] {
        env.submit(RunSpec {
            input: input.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    env.run_until_idle().await.unwrap();
    let mut metrics = Metrics::new();
    read_into(&mut metrics, &snapshotter);
    assert_eq!(
        gauge(&metrics, "taquba_workflow_steps_due", Q),
        Some(0.0),
        "sampled at the last maintenance round, with the timers waiting"
    );
    assert_eq!(
        gauge(&metrics, "taquba_workflow_steps_in_flight", Q),
        Some(0.0)
    );
    env.fail_next("Pipeline", StepError::transient("503"))
        .unwrap();
    env.advance(Duration::from_secs(60)).await.unwrap();
    read_into(&mut metrics, &snapshotter);

    let unnamed = format!("{Q},workflow=");
    assert_eq!(
        counter(&metrics, "taquba_workflow_runs_submitted_total", &unnamed),
        3
    );
    // 3 timers, then 2 successes and 1 failure; the retry moved nothing.
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_transitions_total",
            &format!("outcome=continued,{Q}")
        ),
        3
    );
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_transitions_total",
            &format!("outcome=succeeded,{Q}")
        ),
        2
    );
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_transitions_total",
            &format!("outcome=failed,{Q}")
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_step_errors_total",
            &format!("kind=transient,{unnamed}")
        ),
        1,
        "the injected failure is the kit's runner's error"
    );
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_step_errors_total",
            &format!("kind=permanent,{unnamed}")
        ),
        1
    );
    assert_eq!(
        counter(&metrics, "taquba_workflow_step_retries_total", Q),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "taquba_workflow_dead_letters_total",
            &format!("origin=worker,{Q}")
        ),
        1
    );
    for (status, runs) in [("succeeded", 2), ("failed", 1), ("cancelled", 0)] {
        assert_eq!(
            counter(
                &metrics,
                "taquba_workflow_runs_ended_total",
                &format!("{Q},status={status},workflow=")
            ),
            runs,
            "{status}"
        );
    }
    // Each run took its 60 s timer, on the runtime's clock.
    assert_eq!(
        histogram(
            &metrics,
            "taquba_workflow_run_duration_seconds",
            &format!("{Q},status=succeeded,workflow=")
        ),
        [60.0, 60.0]
    );
    // 3 first steps, 4 deliveries of second steps.
    assert_eq!(
        histogram(&metrics, "taquba_workflow_step_duration_seconds", &unnamed).len(),
        7
    );
    assert_eq!(
        gauge(&metrics, "taquba_workflow_steps_in_flight", Q),
        Some(0.0),
        "every claimed step settled"
    );
}
