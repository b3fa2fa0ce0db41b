//! The runtime's integration tests at the public API, in one test binary:
//! one link of the dependency tree instead of one per file, and the shared
//! set-up in `common` compiled once. Run one area with
//! `cargo test --test runtime signals::` (a module name as the filter).
//!
//! The macro suites (which register items through `inventory`, one registry
//! per binary), the panic-counting fault suite and the S3/webhook suites
//! (behind features) keep their own binaries.

#[path = "../common/mod.rs"]
mod common;

mod cancel_and_hooks;
mod durability;
mod group_attacks;
mod groups;
mod history;
mod hook_faults;
mod jobs;
mod kill9;
mod memo_effects;
mod poison;
mod retention_replay;
mod runs;
mod signals;
mod single_writer;
mod stored_formats;
mod waits;
