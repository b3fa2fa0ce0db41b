//! Attribute macros of `taquba-workflow`: `#[job]` and `#[workflow]`.
