//! Typed jobs (placeholder replaced below).
