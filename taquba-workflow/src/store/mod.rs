//! What the runtime keeps and where: every KV key and object path
//! ([`keys`]), the durable record formats ([`durable`]), the canonical
//! encoding keys are digested from ([`canonical`]), payloads stored
//! beside their records ([`blob`]), the memo ([`memo`]), the read-only KV
//! handle steps get ([`kv`]), step-output replay records ([`replay`]) and,
//! on Unix, the link-safe access to a local-directory store's inbox
//! (`local_dir`).

pub(crate) mod blob;
pub(crate) mod canonical;
pub(crate) mod durable;
pub(crate) mod keys;
pub(crate) mod kv;
#[cfg(unix)]
pub(crate) mod local_dir;
pub(crate) mod memo;
pub(crate) mod outage;
