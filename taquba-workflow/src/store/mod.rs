//! What the runtime keeps and where: every KV key and object path
//! ([`keys`]), the durable record formats ([`durable`]), the canonical
//! encoding keys are digested from ([`canonical`]), payloads stored
//! beside their records ([`blob`]), the memo ([`memo`]), the read-only KV
//! handle steps get ([`kv`]) and step-output replay records ([`replay`]).

pub(crate) mod blob;
pub(crate) mod canonical;
pub(crate) mod durable;
pub(crate) mod keys;
pub(crate) mod kv;
pub(crate) mod memo;
pub(crate) mod replay;
