//! Typed jobs with `#[job]`: define a job as an async fn, submit it, await
//! its typed output, submit it again under the same idempotency key (no
//! second run, the same result), and watch a job that fails permanently
//! end after one attempt.
//!
//! ```text
//! cargo run --example typed_jobs
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::jobs::{Job, JobContext, JobRunner, JoinError};
use taquba_workflow::{StepErrorKind, job};

/// How many times each job body ran in this process, by job name; shared
/// with the jobs as runner state.
#[derive(Default)]
struct Runs(std::sync::Mutex<HashMap<&'static str, u32>>);

impl Runs {
    fn bump(&self, name: &'static str) {
        if let Ok(mut runs) = self.0.lock() {
            *runs.entry(name).or_default() += 1;
        }
    }

    fn of(&self, name: &str) -> u32 {
        self.0
            .lock()
            .map(|runs| runs.get(name).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Priced {
    order_id: String,
    total_cents: u64,
    lines: usize,
}

#[derive(Debug, thiserror::Error)]
enum QuoteError {
    #[error("order {0} has no items")]
    Empty(String),
}

/// A quote for an order: idempotent on its payload (`idempotent`), so
/// submitting the same order twice prices it once. `#[job]` generates
/// `struct Quote { order_id: String, items: Vec<(String, u32, u64)> }`.
#[job(name = "shop.quote", idempotent, derive(Debug, Clone))]
async fn quote(
    ctx: JobContext<'_>,
    order_id: &str,
    items: &[(String, u32, u64)],
) -> Result<Priced, QuoteError> {
    ctx.state::<Arc<Runs>>().bump(Quote::NAME);
    if items.is_empty() {
        return Err(QuoteError::Empty(order_id.to_string()));
    }
    println!(
        "  [worker] pricing {order_id} (job {}, attempt {})",
        ctx.run_id, ctx.attempts
    );
    let total_cents = items
        .iter()
        .map(|(_, qty, cents)| u64::from(*qty) * cents)
        .sum();
    Ok(Priced {
        order_id: order_id.to_string(),
        total_cents,
        lines: items.len(),
    })
}

#[derive(Debug, thiserror::Error)]
enum ChargeError {
    #[error("card {card} declined a charge of {cents} cents")]
    Declined { card: String, cents: u64 },
    #[error("the processor timed out")]
    #[allow(dead_code)]
    Timeout,
}

/// A decline is permanent (the job ends after its first attempt); a
/// timeout is transient (retried, up to `max_attempts`).
fn classify_charge(error: &ChargeError) -> StepErrorKind {
    match error {
        ChargeError::Declined { .. } => StepErrorKind::Permanent,
        ChargeError::Timeout => StepErrorKind::Transient,
    }
}

/// A charge that a card processor may decline. `#[job]` generates
/// `struct Charge { card: String, cents: u64 }`.
#[job(name = "shop.charge", max_attempts = 5, classify = classify_charge)]
async fn charge(ctx: JobContext<'_>, card: &str, cents: u64) -> Result<String, ChargeError> {
    ctx.state::<Arc<Runs>>().bump(Charge::NAME);
    println!(
        "  [worker] charging {cents} cents to {card} (attempt {} of {})",
        ctx.attempts, ctx.max_attempts
    );
    if card.ends_with("0000") {
        return Err(ChargeError::Declined {
            card: card.to_string(),
            cents,
        });
    }
    Ok(format!("ch_{card}_{cents}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(Queue::open(store.clone(), "typed-jobs").await?);
    let runs = Arc::new(Runs::default());
    let runner = JobRunner::builder(queue, store)
        .register_all()
        .state(runs.clone())
        .build();
    let worker = runner.spawn(std::future::pending::<()>());

    let order = Quote {
        order_id: "order-1001".into(),
        items: vec![
            ("notebook".into(), 3, 450),
            ("pen".into(), 10, 120),
            ("stapler".into(), 1, 1_899),
        ],
    };

    println!("1. submit a quote and await its typed output");
    let handle = runner.submit(order.clone()).await?;
    println!(
        "   job {} newly_submitted={}",
        handle.id(),
        handle.newly_submitted()
    );
    let priced = handle.clone().await?;
    println!(
        "   -> {} has {} lines, total {}.{:02}",
        priced.order_id,
        priced.lines,
        priced.total_cents / 100,
        priced.total_cents % 100
    );

    println!("2. submit the same quote again (idempotency key = payload digest)");
    let again = runner.submit(order.clone()).await?;
    println!(
        "   job {} newly_submitted={} (same job: {})",
        again.id(),
        again.newly_submitted(),
        again.id() == handle.id()
    );
    let priced_again = again.clone().await?;
    println!(
        "   -> total {} cents, read from the recorded result",
        priced_again.total_cents
    );
    let recorded = again.fetch_result().await?;
    println!(
        "   fetch_result (from the store): {:?}",
        recorded.map(|r| r.map(|p| p.total_cents))
    );

    println!("3. a charge that the processor declines (classified permanent)");
    let declined = runner
        .submit(Charge {
            card: "4000-0000-0000-0000".into(),
            cents: priced.total_cents,
        })
        .await?;
    match declined.await {
        Ok(id) => println!("   unexpected success: {id}"),
        Err(JoinError::Job(error)) => {
            println!("   -> failed ({:?}): {}", error.kind, error.message)
        }
        Err(JoinError::Infra(error)) => return Err(error.into()),
    }

    println!("4. a charge that goes through");
    let charged = runner
        .submit(Charge {
            card: "4242-4242-4242-4242".into(),
            cents: priced.total_cents,
        })
        .await?
        .await?;
    println!("   -> charge id {charged}");

    println!(
        "job bodies run: {} quote(s) for two submissions, {} charge(s), the declined one once",
        runs.of(Quote::NAME),
        runs.of(Charge::NAME)
    );
    worker.shutdown().await?;
    Ok(())
}
