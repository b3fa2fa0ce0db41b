//! Shared code of the `taquba-workflow` examples and integration tests.
//!
//! * [`store`]: choose the object store a program runs on (a directory, a
//!   `file://` or `s3://` URL, or the standard AWS environment) and open a
//!   queue on it with a bounded wait, so a wrong endpoint or credentials
//!   fail with a clear error instead of hanging.
//! * [`testing`]: helpers for the durability tests: an object store that
//!   injects faults and latency, and a clock that follows tokio's (possibly
//!   paused) time.
//! * [`wordcount`]: the word count of the `word_report` examples.

#![warn(missing_docs)]

pub mod store;
pub mod testing;
pub mod wordcount;

pub use store::{StoreError, open_queue, store_from_env_or_url};
