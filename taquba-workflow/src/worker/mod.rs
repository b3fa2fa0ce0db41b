//! The worker loop ([`driver`]): claiming, running and settling steps with
//! bounded concurrency, and the periodic maintenance beside it
//! ([`sweep`]: dead-letter reconciliation and retention sweeps; [`operator`]:
//! the runtime descriptor, inbox commands and their retention).

pub(crate) mod driver;
