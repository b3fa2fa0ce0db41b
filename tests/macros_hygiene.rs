//! (Compiled by the main test build rather than as a trybuild pass case, so
//! the trybuild suite stays check-only and does not rebuild every dependency
//! with code generation.)
//!
//! The generated code compiles under `#![deny(warnings, missing_docs)]`,
//! with user types named like the prelude's in scope, raw identifiers,
//! `mut` parameters, parameters named like generated items, `pub(crate)`
//! visibility, `#[cfg]` and other attributes, and nested modules.
#![deny(warnings, missing_docs)]
// Lints libraries turn on: none of them fires on the generated code.
#![deny(
    unused_qualifications,
    unreachable_pub,
    missing_debug_implementations,
    unused_results,
    single_use_lifetimes,
    unused_lifetimes,
    elided_lifetimes_in_paths
)]
// Under `cargo clippy` the generated code meets the pedantic lints too (and
// the `async` the macros require of a body that need not await is allowed).
#![deny(clippy::pedantic)]
// A lint on the fns as written, not on what the macros generate.
#![allow(clippy::missing_errors_doc)]
#![allow(dead_code)]

/// Types that shadow the prelude: the generated code must not use them.
#[allow(missing_debug_implementations)]
pub mod shadow {
    /// Not `core::result::Result`.
    pub struct Result;
    /// Not `Option::Some`.
    pub struct Some;
    /// Not `Result::Ok`.
    pub struct Ok;
    /// Not `std::boxed::Box`.
    pub struct Box;
    /// Not `core::option::Option`.
    pub struct Option;
    /// Not `std::string::String`.
    pub struct String;
    /// Not `std::vec::Vec`.
    pub struct Vec;
    /// Not `core::future::Future`.
    pub trait Future {}
    /// Not `core::marker::Send`.
    pub trait Send {}
    /// Not `core::clone::Clone`.
    pub trait Clone {}
    /// Not `core::default::Default`.
    pub trait Default {}
    /// Not `core::convert::From`.
    pub trait From {}
    /// Not `core::convert::Into`.
    pub trait Into {}
    /// Not `core::marker::Sync`.
    pub trait Sync {}
    /// Not `core::marker::Sized`.
    pub trait Sized {}
    /// Not `core::fmt::Debug`.
    pub trait Debug {}
    /// Not `Result::Err`.
    #[allow(non_upper_case_globals)]
    pub const Err: u8 = 0;
    /// Not `Option::None`.
    #[allow(non_upper_case_globals)]
    pub const None: u8 = 0;
    /// Not `std::sync::Arc`.
    pub struct Arc;
    /// Not `core::marker::PhantomData`.
    pub struct PhantomData;
}

/// Macros named like the standard ones, in the textual scope of every
/// module below: the generated code must not use them.
#[allow(unused_macros)]
macro_rules! format {
    ($($t:tt)*) => {
        compile_error!("the user's `format!` was used")
    };
}
#[allow(unused_macros)]
macro_rules! unreachable {
    ($($t:tt)*) => {
        compile_error!("the user's `unreachable!` was used")
    };
}
#[allow(unused_macros)]
macro_rules! panic {
    ($($t:tt)*) => {
        compile_error!("the user's `panic!` was used")
    };
}
#[allow(unused_macros)]
macro_rules! vec {
    ($($t:tt)*) => {
        compile_error!("the user's `vec!` was used")
    };
}

/// A crate that renames the runtime dependency (here through `extern crate
/// ... as`, which puts the name in the extern prelude as a `Cargo.toml`
/// rename does): the macros reach it through `crate = ::name`.
extern crate taquba_workflow as renamed_runtime;

/// Items written against the renamed crate only.
pub mod renamed {
    #[allow(unused_imports)]
    use crate::shadow::*;
    use renamed_runtime::workflows::{StepContext, Transition};

    /// A job through the renamed crate.
    #[renamed_runtime::job(crate = ::renamed_runtime, key = "renamed:{n}")]
    pub async fn renamed_job(
        ctx: &renamed_runtime::jobs::JobContext<'_>,
        n: u32,
    ) -> core::result::Result<u32, std::io::Error> {
        core::result::Result::Ok(n + ctx.attempts)
    }

    /// A workflow through the renamed crate.
    #[derive(core::default::Default, core::fmt::Debug)]
    pub struct Renamed;

    #[renamed_runtime::workflow(crate = ::renamed_runtime, output = u32, vis = pub)]
    impl Renamed {
        /// The only step.
        #[renamed_runtime::workflows::step(start)]
        async fn only(
            ctx: StepContext<'_>,
            n: u32,
        ) -> core::result::Result<Transition<RenamedStep>, renamed_runtime::StepError> {
            let _ = ctx.step_name();
            core::result::Result::Ok(Transition::done(n))
        }
    }
}

/// Jobs in a nested module, with the prelude shadowed.
pub mod jobs {
    #[allow(unused_imports)]
    use crate::shadow::*;
    use taquba_workflow::job;
    use taquba_workflow::jobs::JobContext;

    /// A job's error.
    #[derive(Debug)]
    pub struct Failed;

    impl std::fmt::Display for Failed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("failed")
        }
    }

    impl std::error::Error for Failed {}

    /// Parameters named like the generated items, a raw identifier, `mut`.
    #[job(name = "hygiene.rename", key = "rename:{type}:{run}")]
    #[inline]
    pub async fn rename(
        r#type: &str,
        run: u32,
        mut register: std::vec::Vec<u8>,
        ctx: JobContext<'_>,
        input: std::string::String,
        step: std::option::Option<u8>,
    ) -> core::result::Result<std::string::String, Failed> {
        register.push(1);
        let _ = (ctx.attempts, input, step);
        core::result::Result::Ok(std::format!("{type}{run}{}", register.len()))
    }

    /// Crate-visible, without context, returning a `Result` alias.
    #[job]
    pub(crate) async fn crate_only(items: &[u64]) -> std::io::Result<u64> {
        std::io::Result::Ok(items.iter().sum())
    }

    /// Only in some builds (`#[cfg]` below the macro reaches the generated items).
    #[job]
    #[cfg(any())]
    pub async fn gated(x: NotDefinedAnywhere) -> core::result::Result<(), Failed> {
        let _ = x;
        core::result::Result::Ok(())
    }

    /// A job's result, through an alias.
    pub type JobResult = core::result::Result<u64, Failed>;

    /// Returns an alias of `Result`.
    #[job]
    pub async fn aliased(n: u64) -> JobResult {
        core::result::Result::Ok(n)
    }

    /// A job with no parameters is a unit struct.
    #[job(struct_name = Heartbeat)]
    pub async fn beat() -> core::result::Result<(), Failed> {
        core::result::Result::Ok(())
    }

    /// Deprecated: the struct is too (a submission warns), and the
    /// generated code that calls the fn and names the struct does not.
    #[job]
    #[deprecated = "use `beat`"]
    pub async fn old_beat(n: u8) -> core::result::Result<u8, Failed> {
        core::result::Result::Ok(n)
    }

    pub(crate) fn construct() {
        #[allow(deprecated)]
        let _ = OldBeat { n: 1 };
        let _ = Rename {
            r#type: std::string::String::from("a"),
            run: 1,
            register: std::vec::Vec::new(),
            input: std::string::String::new(),
            step: std::option::Option::None,
        };
        let _ = CrateOnly {
            items: std::vec![1],
        };
        let _ = Heartbeat;
        let _ = Aliased { n: 1 };
    }
}

/// Workflows in a nested module, with the prelude shadowed.
pub mod flows {
    #[allow(unused_imports)]
    use crate::shadow::*;
    use std::time::Duration;
    use taquba_workflow::workflow;
    use taquba_workflow::workflows::{StepContext, Transition};

    /// A workflow's error type.
    pub(crate) type StepResult =
        core::result::Result<Transition<ReviewStep>, taquba_workflow::StepError>;

    /// Reviews a document.
    #[derive(core::default::Default, core::fmt::Debug)]
    pub struct Review {
        reviewer: std::string::String,
    }

    #[workflow(name = "review", output = std::string::String, vis = pub(crate))]
    impl Review {
        /// A helper that is not a step.
        fn helper(&self) -> &str {
            &self.reviewer
        }

        /// Starts the review.
        #[step(start)]
        #[allow(clippy::needless_lifetimes)]
        async fn submit(&self, r#type: &str, mut step: u32, ctx: StepContext<'_>) -> StepResult {
            step += ctx.step_number;
            let _ = self.helper();
            core::result::Result::Ok(Transition::after(
                ReviewStep::Decide {
                    input: std::format!("{type}{step}"),
                    run: std::vec::Vec::new(),
                },
                Duration::from_secs(1),
            ))
        }

        /// Decides.
        #[step(name = "decide")]
        async fn decide(input: std::string::String, run: std::vec::Vec<u8>) -> StepResult {
            let _ = run;
            core::result::Result::Ok(Transition::done(input))
        }

        /// Only in some builds.
        #[step]
        #[cfg(any())]
        async fn gated(x: NotDefinedAnywhere) -> StepResult {
            let _ = x;
            core::result::Result::Ok(Transition::fail("gated"))
        }
    }

    /// A deprecated workflow with a deprecated step: the generated code
    /// that names them does not warn.
    #[derive(core::default::Default, core::fmt::Debug)]
    #[deprecated = "use `Review`"]
    pub struct OldReview;

    #[allow(deprecated)]
    #[workflow(name = "old-review")]
    impl OldReview {
        /// The only step.
        #[step(start)]
        #[deprecated = "no longer started"]
        async fn only(
            n: u8,
        ) -> core::result::Result<Transition<OldReviewStep>, taquba_workflow::StepError> {
            let _ = n;
            core::result::Result::Ok(Transition::done(()))
        }
    }

    pub(crate) fn construct() -> ReviewInput {
        ReviewInput {
            r#type: std::string::String::from("doc"),
            step: 0,
        }
    }
}

/// The generated items are usable, not only compiled.
#[test]
fn generated_code_compiles_under_deny_warnings_and_constructs() {
    jobs::construct();
    let _ = flows::construct();
    let _ = renamed::RenamedJob { n: 1 };
    let _ = renamed::RenamedInput { n: 1 };
}

/// The items of the renamed crate run.
#[tokio::test(start_paused = true)]
async fn items_of_a_renamed_crate_run() {
    let env = renamed_runtime::testing::TestJobs::builder()
        .register::<renamed::RenamedJob>()
        .build()
        .await
        .expect("the environment builds");
    let job = env
        .submit(renamed::RenamedJob { n: 4 })
        .await
        .expect("submits");
    let _ = env.run_until_idle().await.expect("the job runs");
    std::assert_eq!(job.output().await.expect("succeeds"), 5);

    let env = renamed_runtime::testing::TestRuntime::new(renamed::Renamed)
        .await
        .expect("the environment builds");
    let run = env
        .start(renamed::RenamedInput { n: 7 })
        .await
        .expect("starts");
    let _ = env.run_until_idle().await.expect("the run runs");
    std::assert_eq!(run.output().await.expect("succeeds"), 7);
}
