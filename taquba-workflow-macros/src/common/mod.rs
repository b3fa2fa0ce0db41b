//! Pieces shared by `#[job]` and `#[workflow]`: the error accumulator
//! ([`errors`]), the fields' serialization and bound checks ([`fields`]),
//! the option-list parser ([`options`]), parameter
//! classification ([`params`]), key templates ([`template`]) and the names
//! and paths of generated code ([`names`]).

mod errors;
mod fields;
mod names;
mod options;
mod params;
mod template;

pub(crate) use errors::Errors;
pub(crate) use fields::*;
pub(crate) use names::*;
pub(crate) use options::*;
pub(crate) use params::*;
pub(crate) use template::*;
