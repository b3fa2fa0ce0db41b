//! The life of a run inside the engine ([`core::RuntimeCore`]): the
//! cancel-safe commits every path goes through ([`commit`]), submission
//! ([`submit`], [`submit_batch`]), processing and settling a claimed step
//! ([`settle`], with the effects a step stages in [`effects`]), external
//! cancellation ([`cancel`], racing steps in flight through [`inflight`]),
//! resuming a run whose step was dead-lettered ([`requeue`]), waiting for
//! a termination ([`wait`], woken by [`watch`], taking lately committed
//! outcomes from [`recent_ends`]), composing effects that
//! share one transaction ([`compose`]), the run a runner call works for
//! as the runtime's own errors name it ([`context`]); the ids the runtime generates
//! ([`ids`]).

pub(crate) mod commit;
pub(crate) mod compose;
pub(crate) mod context;
pub(crate) mod effects;
pub(crate) mod ids;
pub(crate) mod inflight;
pub(crate) mod per_queue;
pub(crate) mod recent_ends;
pub(crate) mod record_cache;
pub(crate) mod submit_batch;
pub(crate) mod watch;
