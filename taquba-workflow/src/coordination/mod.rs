//! Coordination between runs and the outside: durable signals
//! ([`signal`], and as inbox commands [`signal_command`]) and run groups ([`group`], submitted in chunks by
//! [`group_submit`]).

pub(crate) mod group;
pub(crate) mod group_submit;
pub(crate) mod signal;
pub(crate) mod signal_command;
