//! `#[job]` end to end: generated structs run on a real `JobRunner`,
//! found by `register_all`, awaited, and re-submitted idempotently.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::jobs::{JobContext, JobRunner, JoinError};
use taquba_workflow::{StepErrorKind, job};

#[derive(Debug, thiserror::Error)]
#[error("math error: {0}")]
pub struct MathError(String);

static ADD_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Adds two numbers (once per key).
#[job(name = "math.add", key = "add:{a}:{b}")]
async fn add(a: i64, b: i64) -> Result<i64, MathError> {
    ADD_CALLS.fetch_add(1, Ordering::SeqCst);
    Ok(a + b)
}

/// Greeting prefix, registered as runner state.
struct Prefix(&'static str);

/// The context in the middle, reference parameters, a `mut` parameter.
#[job(name = "text.greet", derive(Debug, Clone, PartialEq))]
async fn greet(
    name: &str,
    ctx: JobContext<'_>,
    tags: &[String],
    mut times: u32,
) -> Result<String, MathError> {
    let prefix = ctx.state::<Prefix>().0;
    let mut out = String::new();
    while times > 0 {
        out.push_str(&format!("{prefix} {name}{}", tags.join("")));
        times -= 1;
    }
    Ok(out)
}

fn classify_math(error: &MathError) -> StepErrorKind {
    if error.0.contains("forever") {
        StepErrorKind::Permanent
    } else {
        StepErrorKind::Transient
    }
}

static FAIL_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Always fails; `classify` makes it permanent, so it runs once.
#[job(max_attempts = 5, classify = classify_math, idempotent)]
async fn fail_forever(reason: String) -> Result<(), MathError> {
    FAIL_CALLS.fetch_add(1, Ordering::SeqCst);
    Err(MathError(reason))
}

/// `classify` as a closure: "forever" is permanent.
#[job(max_attempts = 5, classify = |e: &MathError| if e.0.contains("forever") { StepErrorKind::Permanent } else { StepErrorKind::Transient })]
async fn fail_by_closure(reason: String) -> Result<(), MathError> {
    Err(MathError(reason))
}

static REINDEX_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Rebuilds the search index: a constant key makes it a singleton, one job
/// however often it is submitted.
#[job(name = "search.reindex", key = "reindex")]
async fn reindex() -> Result<usize, MathError> {
    Ok(REINDEX_CALLS.fetch_add(1, Ordering::SeqCst) + 1)
}

/// Syncs running now and the most at once, per customer.
static SYNCS: std::sync::Mutex<Vec<(String, i32, i32)>> = std::sync::Mutex::new(Vec::new());

/// At most one sync per customer at a time.
#[job(name = "crm.sync", concurrency_key = "customer:{customer}", limit = 1)]
async fn sync_customer(customer: String, batch: u32) -> Result<u32, MathError> {
    let bump = |by: i32| {
        let mut syncs = SYNCS.lock().expect("syncs");
        if !syncs.iter().any(|(c, _, _)| *c == customer) {
            syncs.push((customer.clone(), 0, 0));
        }
        for (c, now, max) in syncs.iter_mut() {
            if *c == customer {
                *now += by;
                *max = (*max).max(*now);
            }
        }
    };
    bump(1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    bump(-1);
    Ok(batch)
}

/// Two per tenant; `limit` defaults to one without it.
#[job(concurrency_key = "tenant:{tenant}", limit = 2)]
async fn call_api(tenant: String) -> Result<(), MathError> {
    let _ = tenant;
    Ok(())
}

/// A runner with every `#[job]`, no worker running yet.
async fn idle_runner() -> JobRunner {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Queue::open(store.clone(), "db").await.expect("queue opens");
    JobRunner::builder(queue, store)
        .register_all()
        .state(Prefix("hello"))
        .poll_interval(Duration::from_millis(20))
        .build()
}

async fn runner() -> (JobRunner, taquba_workflow::RunnerHandle) {
    let runner = idle_runner().await;
    let worker = runner.spawn(std::future::pending::<()>());
    (runner, worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_is_submitted_awaited_and_resubmitted_idempotently() {
    let (runner, worker) = runner().await;

    let first = runner.submit(Add { a: 2, b: 3 }).await.expect("submits");
    assert!(first.newly_submitted());
    assert_eq!(first.clone().await.expect("runs"), 5);
    assert_eq!(ADD_CALLS.load(Ordering::SeqCst), 1);

    // Same key, same payload: the recorded result, not a second run.
    let again = runner.submit(Add { a: 2, b: 3 }).await.expect("resubmits");
    assert!(!again.newly_submitted());
    assert_eq!(again.id(), first.id());
    assert_eq!(again.await.expect("recorded"), 5);
    assert_eq!(ADD_CALLS.load(Ordering::SeqCst), 1);

    // The key template names the fields.
    assert_eq!(
        taquba_workflow::jobs::Job::idempotency_key(&Add { a: 2, b: 3 }).as_deref(),
        Some("add:2:3")
    );
    worker.shutdown().await.expect("worker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_singleton_job_submitted_twice_while_pending_runs_once() {
    use taquba_workflow::jobs::Job;
    assert_eq!(Reindex.idempotency_key().as_deref(), Some("reindex"));

    // No worker yet: the first submission is still pending when the second
    // one comes, and collapses into it.
    let runner = idle_runner().await;
    let first = runner.submit(Reindex).await.expect("submits");
    let second = runner.submit(Reindex).await.expect("submits again");
    assert!(first.newly_submitted());
    assert!(!second.newly_submitted());
    assert_eq!(second.id(), first.id());

    let worker = runner.spawn(std::future::pending::<()>());
    assert_eq!(first.await.expect("runs"), 1);
    assert_eq!(second.await.expect("the same run"), 1);
    assert_eq!(REINDEX_CALLS.load(Ordering::SeqCst), 1, "run once");
    worker.shutdown().await.expect("worker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_state_and_reference_parameters_reach_the_fn() {
    let (runner, worker) = runner().await;
    let job = Greet {
        name: "ada".into(),
        tags: vec!["!".into(), "?".into()],
        times: 2,
    };
    // `derive(...)` reached the struct.
    assert_eq!(job.clone(), job);
    let out = runner
        .submit(job)
        .await
        .expect("submits")
        .await
        .expect("runs");
    assert_eq!(out, "hello ada!?hello ada!?");
    worker.shutdown().await.expect("worker stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_max_attempts_and_idempotent_reach_the_job() {
    use taquba_workflow::jobs::Job;
    let job = FailForever {
        reason: "forever".into(),
    };
    assert_eq!(job.max_attempts(), Some(5));
    assert_eq!(
        job.idempotency_key(),
        Some(taquba_workflow::jobs::payload_idempotency_key(&job).expect("encodes"))
    );
    assert_eq!(<FailForever as Job>::NAME, "fail_forever");

    let (runner, worker) = runner().await;
    let result = runner.submit(job).await.expect("submits").await;
    match result {
        Err(JoinError::Job(error)) => {
            assert_eq!(error.kind, StepErrorKind::Permanent);
            assert!(error.message.contains("forever"), "{error}");
        }
        other => panic!("expected a job error, got {other:?}"),
    }
    assert_eq!(FAIL_CALLS.load(Ordering::SeqCst), 1);
    worker.shutdown().await.expect("worker stops");
}

#[test]
fn classify_takes_a_closure() {
    use taquba_workflow::jobs::Job;
    let job = FailByClosure {
        reason: "forever".into(),
    };
    assert_eq!(
        job.classify(&MathError("broken forever".into())),
        StepErrorKind::Permanent
    );
    assert_eq!(
        job.classify(&MathError("once".into())),
        StepErrorKind::Transient
    );
}

/// Doubles `x`.
#[job]
pub async fn double(x: i64) -> Result<i64, MathError> {
    Ok(x * 2)
}

#[test]
fn the_fn_stays_callable_as_written() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    assert_eq!(rt.block_on(double(21)).expect("doubles"), 42);
    assert_eq!(<Double as taquba_workflow::jobs::Job>::NAME, "double");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_a_concurrency_key_runs_one_per_key_at_a_time() {
    use taquba_workflow::jobs::Job;
    let sync = SyncCustomer {
        customer: "acme".into(),
        batch: 1,
    };
    assert_eq!(sync.concurrency_key().as_deref(), Some("customer:acme"));
    assert_eq!(sync.concurrency_limit(), 1);
    let api = CallApi { tenant: "t".into() };
    assert_eq!(
        (api.concurrency_key().as_deref(), api.concurrency_limit()),
        (Some("tenant:t"), 2)
    );
    assert_eq!(Add { a: 1, b: 2 }.concurrency_key(), None);

    let (runner, worker) = runner().await;
    let mut handles = Vec::new();
    for batch in 0..30 {
        let customer = ["acme", "globex", "initech"][batch as usize % 3].to_string();
        handles.push(
            runner
                .submit(SyncCustomer { customer, batch })
                .await
                .expect("submits"),
        );
    }
    for (batch, handle) in handles.into_iter().enumerate() {
        assert_eq!(handle.await.expect("runs"), batch as u32);
    }
    let syncs = SYNCS.lock().expect("syncs").clone();
    assert_eq!(syncs.len(), 3);
    for (customer, now, max) in syncs {
        assert_eq!((now, max), (0, 1), "{customer}");
    }
    assert!(
        runner
            .view()
            .concurrency_keys()
            .await
            .expect("keys")
            .is_empty()
    );
    worker.shutdown().await.expect("worker stops");
}
