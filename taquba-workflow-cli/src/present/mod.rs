//! The presentation layer: every shape the command line prints and the
//! dashboard renders, built from the runtime's types. A command prints
//! these as JSON (or as the tables and cards it builds from them); a page
//! of `taquba-workflow ui` renders the same values, so the two never
//! disagree on what a run, an attempt or a command is.
//!
//! States and outcomes stay enums ([`state`]): code matches on
//! [`RunStateJson::Running`](state::RunStateJson::Running), never on the
//! word `"running"`; each value serializes as the word JSON output has
//! always carried. Times are `*_ms` fields, milliseconds since the Unix
//! epoch, as the store keeps them.
//!
//! - [`state`]: the enums (a run's state, how it ended, an error's kind,
//!   an attempt's outcome, a command's state, a signal's outcome).
//! - [`run`]: a listed run, a described run, its termination, outcome and
//!   result.
//! - [`step`]: a run's step history.
//! - [`group`]: a group's counts and members.
//! - [`schedule`]: a schedule and its next tick.
//! - [`command`]: an inbox command's state and answer.
//! - [`store`]: the store as a whole.

pub mod command;
pub mod group;
pub mod run;
pub mod schedule;
pub mod state;
pub mod step;
pub mod store;
