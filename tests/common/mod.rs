//! Shared set-up of the integration tests: queues over an in-memory store
//! or a temporary directory, driven by a `MockClock`.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::ObjectStore;
use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::memory::InMemory;
use taquba::{MockClock, OpenOptions, Queue, QueueConfig};
use taquba_workflow::RunId;

/// The epoch of every mock clock: 2023-11-14.
pub const T0: u64 = 1_700_000_000_000;

pub fn rid(id: &str) -> RunId {
    RunId::new(id).expect("valid test run id")
}

/// Open options with `clock`, a fast flush and no retry backoff.
pub fn options(clock: &MockClock) -> OpenOptions {
    OpenOptions::default()
        .clock(Arc::new(clock.clone()))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .max_attempts(3),
        )
}

/// An in-memory queue at `path` with a mock clock.
pub async fn memory_queue() -> (Arc<Queue>, Arc<dyn ObjectStore>, MockClock) {
    let clock = MockClock::new(T0);
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = Queue::open_with_options(store.clone(), "db", options(&clock))
        .await
        .expect("open queue");
    (Arc::new(queue), store, clock)
}

/// A store in a directory (for restart tests).
pub fn dir_store(dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir).expect("local store"))
}

/// Open (or reopen) the queue in `store` with `clock`.
pub async fn open(store: &Arc<dyn ObjectStore>, clock: &MockClock) -> Arc<Queue> {
    Arc::new(
        Queue::open_with_options(store.clone(), "db", options(clock))
            .await
            .expect("open queue"),
    )
}

/// Run `f` to completion within `secs` seconds of (paused) time.
pub async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("finished in time")
}
