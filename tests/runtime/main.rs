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

mod attacks_round2;
mod cancel_and_hooks;
mod cancel_lease;
mod durability;
mod durable_paths;
mod group_attacks;
mod group_hazards;
mod groups;
mod history;
mod hook_faults;
mod inbox;
#[cfg(unix)]
mod inbox_hostile;
mod jobs;
mod kill9;
mod kit;
mod lost_payloads;
mod memo_effects;
mod new_user_attacks;
mod operator;
mod poison;
mod reruns;
mod retention_replay;
mod run_ids;
mod runs;
mod signal_run;
mod signals;
mod single_writer;
mod spans;
mod staged_enqueues;
mod stored_formats;
mod waits;
