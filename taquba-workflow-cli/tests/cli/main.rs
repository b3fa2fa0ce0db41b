//! The `taquba-workflow` binary against stores written by a real
//! `#[workflow]` runtime: live (the owner runs in this test process, the
//! CLI is a second process reading the same directory) and offline (a
//! copy of a store no process owns). One test binary: `read` (listing,
//! describing, history, results, store info, discovery, exit codes) and
//! `steer` (cancel, signal, requeue through the inbox and `--offline`),
//! `schedules` (list, describe, pause and resume; the Schedules page),
//! `keys` (concurrency keys listed and described; the Keys page),
//! `ui` (the dashboard over HTTP, with `web` its client), `login` (the
//! dashboard's token, sessions and refusals), `cluster`
//! (a cluster root of four shards: merged listings, routed reads and
//! commands, `store info`, the dashboard), `privilege` (what the read
//! and steering commands write: nothing, and only the inbox), `hostile`
//! (hostile inbox entries, far-future times, `--offline` against a busy
//! owner, the liveness hints), `review_stop41` (a review's: commands for
//! a runtime the store does not record, bad values and their exit codes,
//! duplicated commands, listings racing the writer), and with
//! feature `aws` `s3` (a bucket store, run by `.ci/s3.sh`).

mod cluster;
mod common;
#[cfg(all(feature = "ui", unix))]
mod hostile;
mod keys;
#[cfg(feature = "ui")]
mod login;
mod privilege;
mod read;
mod review_stop41;
#[cfg(feature = "aws")]
mod s3;
mod schedules;
mod steer;
#[cfg(feature = "ui")]
mod ui;
#[cfg(feature = "ui")]
mod web;
