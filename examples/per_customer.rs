//! Per-key concurrency with `#[job(concurrency_key = ..., limit = 1)]`:
//! twelve syncs over three customers, at most one per customer at a time
//! (the others wait without holding a worker slot and start in submission
//! order), while different customers' syncs run side by side.
//!
//! ```text
//! cargo run --example per_customer
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use taquba::Queue;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba_workflow::job;
use taquba_workflow::jobs::{JobContext, JobRunner};

/// The syncs running now and the most seen at once, by customer; shared
/// with the jobs as runner state.
#[derive(Default)]
struct Running(Mutex<HashMap<String, (u32, u32)>>);

impl Running {
    fn enter(&self, customer: &str) {
        if let Ok(mut running) = self.0.lock() {
            let (now, max) = running.entry(customer.to_string()).or_default();
            *now += 1;
            *max = (*max).max(*now);
        }
    }

    fn leave(&self, customer: &str) {
        if let Ok(mut running) = self.0.lock()
            && let Some((now, _)) = running.get_mut(customer)
        {
            *now -= 1;
        }
    }

    fn most_at_once(&self) -> HashMap<String, u32> {
        self.0
            .lock()
            .map(|running| {
                running
                    .iter()
                    .map(|(c, (_, max))| (c.clone(), *max))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the CRM refused the sync")]
struct SyncError;

/// At most one sync per customer at a time.
#[job(name = "crm.sync", concurrency_key = "customer:{customer}", limit = 1)]
async fn sync_account(ctx: JobContext<'_>, customer: &str, batch: u32) -> Result<u32, SyncError> {
    let running = ctx.state::<Arc<Running>>();
    running.enter(customer);
    tokio::time::sleep(Duration::from_millis(20)).await;
    running.leave(customer);
    Ok(batch)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Arc::new(Queue::open(store.clone(), "per-customer").await?);
    let running = Arc::new(Running::default());
    let runner = JobRunner::builder(queue, store)
        .register_all()
        .state(running.clone())
        .build();
    let worker = runner.spawn(std::future::pending::<()>());

    let mut handles = Vec::new();
    for batch in 0..12 {
        let customer = ["acme", "globex", "initech"][batch as usize % 3];
        let job = SyncAccount {
            customer: customer.into(),
            batch,
        };
        handles.push(runner.submit(job).await?);
    }
    for key in runner.view().concurrency_keys().await? {
        println!(
            "{}: {} active, {} waiting",
            key.key, key.active, key.waiting
        );
    }
    for handle in handles {
        handle.await?;
    }
    let most = running.most_at_once();
    println!("most syncs at once per customer: {most:?}");
    assert!(most.values().all(|&n| n == 1));
    worker.shutdown().await?;
    Ok(())
}
