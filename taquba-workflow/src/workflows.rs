//! Typed workflows (placeholder until the macros land).
