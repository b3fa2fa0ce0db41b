//! What happens after a run terminates: the [`terminal::TerminalHook`] trait
//! and its notification job, the guard that calls it (panics caught, calls
//! bounded), and the webhook hook with its destination policy (feature
//! `webhooks`).

#[cfg(feature = "webhooks")]
pub(crate) mod destination;
pub(crate) mod guard;
pub(crate) mod terminal;
#[cfg(feature = "webhooks")]
pub(crate) mod webhook;
