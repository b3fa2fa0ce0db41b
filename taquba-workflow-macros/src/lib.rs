//! Attribute macros of `taquba-workflow`: `#[job]` and `#[workflow]`.
//!
//! Use them through the runtime crate (`use taquba_workflow::{job,
//! workflow};`), which re-exports them behind its default `macros` feature
//! and hosts everything the generated code reaches (under
//! `taquba_workflow::__private`), so the user's crate needs no serde,
//! rmp-serde or inventory dependency of its own. The runtime crate's
//! documentation (module `workflows` and the README) describes what the
//! macros generate.
//!
//! Each macro is split into `parse` (the attribute's options), `validate`
//! (the annotated item, producing a model) and `expand` (the generated
//! code). Every mistake the macro can see is a `compile_error!` spanned on
//! the offending token, all of them are reported in one compile, and the
//! user's item is emitted unchanged beside them (so the rest of the crate
//! does not cascade). What only the type system can tell (is the return
//! type a `Result`, is a parameter serializable) is checked through hidden
//! marker traits of `taquba_workflow::__private`, each named once, at the
//! user's token, whose `#[diagnostic::on_unimplemented]` message names the
//! fix; nothing else the generated code writes states the bound again (the
//! job's `Job` impl follows from `__private::GeneratedJob`, which names the
//! return type once; fields are serialized through probes that state no
//! bound): one error per mistake. Beside an error the generated types
//! are stand-ins that match the user's code as written: an option value of
//! the wrong kind that holds what was meant (`output = "u32"`) and a
//! misspelt option close to a known one (`outptu`) are reported, then read
//! as meant, and a refused step keeps its variant with the fields as meant,
//! so nothing else is reported on top. Where no stand-in could match what
//! was meant (a parameter without a name, an output option that could not
//! be read), none is written: with the macro's errors reported, rustc
//! reports no unresolved names beside them. A `#[workflow]` impl block is
//! written where the generated types' names mean them, so an item of the
//! user's with one of those names is the name check's one error, and the
//! step fns are not reported on top.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod common;
mod job;
mod workflow;

use proc_macro::TokenStream;

/// Makes a typed job from an `async fn`.
///
/// ```ignore
/// /// Sends one email.
/// #[job(name = "email.send", key = "email:{to}")]
/// async fn send_email(ctx: JobContext<'_>, to: String, subject: &str) -> Result<MessageId, EmailError> {
///     ...
/// }
/// // generated: `struct SendEmail { to: String, subject: String }`, `impl Job for SendEmail`
/// // and a registration entry found by `JobRunnerBuilder::register_all`.
/// ```
///
/// Options: `name = "..."` (the job's stable name, default the fn name),
/// `key = "template {field}"` or `idempotent` (the idempotency key),
/// `max_attempts = N`, `classify = path::to::fn` (a
/// `fn(&E) -> StepErrorKind`, or a closure that captures nothing:
/// `classify = |e: &MyError| e.kind()`), `struct_name = Ident` (default the fn name
/// in PascalCase), `derive(...)` (extra derives on the struct) and
/// `crate = path` (where the runtime crate is, default `::taquba_workflow`).
///
/// A `key` without `{field}` placeholders is constant: the job is a
/// singleton, every submission is the same job (`key = "reindex"` on a job
/// with no parameters is the usual case). A submission while it is pending
/// or running returns that run (`newly_submitted() == false`), one after it
/// ended returns its recorded result until retention removes the record
/// (then it runs again), and one with another payload (a job with
/// parameters) fails with `InputMismatch`. The key is the job's identity
/// across types too: give each singleton its own.
///
/// Accepted signatures: an optional `JobContext<'_>` (or `JobContext<'a>`)
/// in any position, by value or by reference (`&JobContext<'_>`,
/// `&mut JobContext<'_>`); named lifetimes on the fn (`&'a str`);
/// parameters with doc comments (moved to the field), `#[cfg]` /
/// `#[cfg_attr]` (a parameter configured out is absent from the struct and
/// from the call), lint levels, `#[serde(default)]` /
/// `#[serde(default = "path")]` (a field added by a later version, read
/// with its default from what was stored before it) and `mut`; a return
/// type that is
/// `Result<T, E>` under any name (`anyhow::Result<T>`, `std::io::Result<T>`,
/// a local alias), resolved by the type system, with
/// `T: Serialize + DeserializeOwned + Send` and
/// `E: Debug + Display + Send + Sync` (`anyhow::Error`,
/// `Box<dyn Error + Send + Sync>`, `String` and every `std::error::Error`);
/// other attributes on the fn (`#[tracing::instrument]`, `#[must_use]`),
/// which stay on it (`#[deprecated]` also deprecates the struct).
/// Refused, with one error on the token to change: generics (type and
/// const parameters), `self`, `const`, `unsafe`, `extern`, `...`, destructuring and
/// `_` patterns (a field needs a name, and the name is stored), `impl
/// Trait`, `&mut` fields, fields that borrow (`Cow<'a, str>`), other
/// attributes on parameters; a `{placeholder}` in `key` that names no
/// parameter (or a `#[cfg]`-gated one), an empty `key`,
/// `derive(Serialize)` (always derived), a name with whitespace at an end.
///
/// The struct has the fn's visibility. It is defined in a hidden module
/// and re-exported, so an item of yours with the same name is reported
/// once (with the option that renames the struct) instead of clashing.
/// The fn is a free fn, at module level or in a fn body (a test's; the
/// struct's fields resolve their types through the enclosing module, so a
/// type declared in that body is not found). An associated fn of an impl
/// block cannot carry the generated struct and module: rustc reports the
/// items an impl block cannot hold.
#[proc_macro_attribute]
pub fn job(attr: TokenStream, item: TokenStream) -> TokenStream {
    job::job(attr.into(), item.into()).into()
}

/// Makes a durable workflow from an `impl` block whose `#[step]` async
/// fns are its states.
///
/// ```ignore
/// #[workflow(name = "order", output = Receipt)]
/// impl Order {
///     #[step(start)]
///     async fn charge(&self, ctx: StepContext<'_>, order_id: String) -> Result<Transition<OrderStep>, StepError> {
///         Ok(Transition::next(OrderStep::Ship { order_id }))
///     }
///     #[step]
///     async fn ship(&self, order_id: String) -> Result<Transition<OrderStep>, StepError> {
///         Ok(Transition::done(Receipt { order_id }))
///     }
/// }
/// ```
///
/// Workflow options: `name = "..."` (default the type's name),
/// `output = Type` (default `()`), `step_enum = Ident` (default
/// `{Type}Step`), `input = Ident` (default `{Type}Input`), `vis = ...`
/// (the generated types' visibility, default private to the module, as an
/// item without `pub` is), `derive(...)`, `crate = path`,
/// `version = "2.1.0"` (a non-empty string of at most 256 bytes, default
/// the crate's `CARGO_PKG_VERSION`: recorded with every run the code
/// submits and every step it settles, `Workflow::VERSION`) and
/// `patches = ["skip-slack-post", ...]` (distinct non-empty string
/// literals: the patch ids the code declares, recorded with every run it
/// submits; `ctx.patched("skip-slack-post")?` answers `true` in the runs
/// submitted on code declaring it and `false` in runs submitted before,
/// `Workflow::PATCHES`; asking for an undeclared id is a permanent step
/// error). Each option once. Step options:
/// `start` (exactly one step), `name = "..."` (the step's stable name,
/// default the fn name) and `alias = "..."`, any number of times: a name
/// the step was stored under by an earlier version, so runs parked under
/// it resume in this step (`Workflow::ALIASES`). A stored name leads to one
/// step: two steps with one name or alias, or an alias that is its own
/// step's name, are refused at compile time. A run parked in a step no
/// name or alias matches fails once, permanently, naming the workflow,
/// the step and the run.
///
/// A step takes `&self` (or `self: &Self`) or no receiver, an optional
/// `StepContext<'_>` (or `StepContext<'a>`, by value or by reference), and
/// parameters as a job does (attributes, lifetimes, `#[cfg]`; `Self` in a
/// parameter's type is the workflow type); it returns
/// `Result<Transition<{Type}Step>, E>` under any name, where `E` is
/// `StepError`, a type with `impl From<E> for StepError`, or any `Display`
/// type (`anyhow::Error`, `Box<dyn Error + Send + Sync>`), which becomes a
/// transient `StepError`. A `#[cfg]`'d-out step is absent from the enum,
/// the dispatch and `Workflow::STEPS`. A parameter added to a step by a
/// later version takes `#[serde(default)]`, so runs parked in the step
/// before it resume with the default; a field that no longer decodes fails
/// the run once, naming the field. A step's `name` (or `alias`) cannot contain `/`
/// (it separates the step from the key in its memo). The impl block can
/// hold other items (consts, helper fns, macros) and a `where` clause, and
/// can name its type through a path (`impl shop::Order`); it cannot be
/// generic (one error on its generics). One `#[workflow]` impl block per
/// type: helpers go in other, plain impl blocks.
#[proc_macro_attribute]
pub fn workflow(attr: TokenStream, item: TokenStream) -> TokenStream {
    workflow::workflow(attr.into(), item.into()).into()
}

/// Marks a step of a `#[workflow]` impl block; `#[workflow]` consumes it.
/// Written anywhere else it is an error.
#[proc_macro_attribute]
pub fn step(attr: TokenStream, item: TokenStream) -> TokenStream {
    workflow::stray_step(attr.into(), item.into()).into()
}
