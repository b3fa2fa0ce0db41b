//! The worker loop ([`driver`]): claiming, running and settling steps with
//! bounded concurrency, and the periodic maintenance beside it
//! ([`sweep`]: dead-letter reconciliation and retention sweeps).

pub(crate) mod driver;
pub(crate) mod sweep;
