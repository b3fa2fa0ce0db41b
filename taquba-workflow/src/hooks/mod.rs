//! What happens after a run terminates: the [`terminal::TerminalHook`] trait
//! and its notification job, and the webhook hook (feature `webhooks`).

pub(crate) mod terminal;
#[cfg(feature = "webhooks")]
pub(crate) mod webhook;
