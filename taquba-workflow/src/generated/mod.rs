//! What the code `#[job]` and `#[workflow]` generate calls into, reached
//! through `__private` (which only re-exports): the bound checks whose
//! `#[diagnostic::on_unimplemented]` messages point at the user's token,
//! for jobs ([`job`]) and steps ([`step`]), and the markers that tell a
//! generated type from a user item of the same name (here). Not a public
//! API: names change without notice.

pub(crate) mod job;
pub(crate) mod step;

/// Implemented by the struct `#[job]` generates only: the generated code
/// names the struct by its plain name in the user's module and checks it is
/// this one, so a user item of the same name (which shadows the generated
/// struct) is reported once, with the option that renames the struct.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the struct `#[job]` generates",
    label = "`#[job]` generates a struct of this name, and another item of this module has it",
    note = "rename your item, or give the generated struct another name with `#[job(struct_name = ...)]`"
)]
pub trait GeneratedJobStruct {}

/// As [`GeneratedJobStruct`], for the step enum of `#[workflow]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the step enum `#[workflow]` generates",
    label = "`#[workflow]` generates an enum of this name, and another item of this module has it",
    note = "rename your item, or give the generated enum another name with `#[workflow(step_enum = ...)]`"
)]
pub trait GeneratedStepEnum {}

/// As [`GeneratedJobStruct`], for the input struct of `#[workflow]`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` names your item, not the input struct `#[workflow]` generates",
    label = "`#[workflow]` generates a struct of this name, and another item of this module has it",
    note = "rename your item, or give the generated struct another name with `#[workflow(input = ...)]`"
)]
pub trait GeneratedInput {}

/// Compiles when `T` is a generated job struct.
pub const fn generated_job_struct<T: GeneratedJobStruct>() {}
/// Compiles when `T` is a generated step enum.
pub const fn generated_step_enum<T: GeneratedStepEnum>() {}
/// Compiles when `T` is a generated input struct.
pub const fn generated_input<T: GeneratedInput>() {}
