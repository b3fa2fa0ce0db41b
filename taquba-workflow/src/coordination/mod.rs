//! Coordination between runs and the outside: durable signals
//! ([`signal`], [`signal_run`] addressed to one run's wait, and as inbox
//! commands [`signal_command`]) and run groups ([`group`], submitted in
//! chunks by [`group_submit`], serialised per group by [`group_locks`],
//! removed by [`group_forget`]), child workflows ([`children`]) and
//! per-key concurrency ([`keys`]).

pub(crate) mod child_wakes;
pub(crate) mod children;
pub(crate) mod group;
pub(crate) mod group_locks;
pub(crate) mod keys;
pub(crate) mod members;
pub(crate) mod signal;
