//! Shared code of the `taquba-workflow` examples and integration tests.
//!
//! * [`store`]: choose the object store a program runs on (a directory, a
//!   `file://` or `s3://` URL, or the standard AWS environment) and open a
//!   queue on it with a bounded wait, so a wrong endpoint or credentials
//!   fail with a clear error instead of hanging.
//! * [`testing`]: helpers for the durability tests: an object store that
//!   injects faults and latency, and a clock that follows tokio's (possibly
//!   paused) time.
//! * [`wordcount`]: the word count of the `word_report` examples.
//! * [`cluster_demo`]: worker processes sharing a cluster's shards, a
//!   worker killed mid-way, and the summary (the `cluster` example and the
//!   multi-process test).
//! * [`measure`]: CPU time and resident memory of the process, for the
//!   benchmarks.

#![warn(missing_docs)]

pub mod cluster_demo;
pub mod measure;
pub mod store;
pub mod testing;
pub mod wordcount;

pub use store::{StoreError, open_queue, store_from_env_or_url};

/// The macros in a crate of edition 2021 (the workspace is 2024): a
/// doctest of that edition, run with the package's doctests. `gen` is an
/// identifier there (a keyword in 2024), and the generated code follows
/// the user's edition.
///
/// ```edition2021
/// use taquba_workflow::jobs::JobContext;
/// use taquba_workflow::testing::{TestJobs, TestRuntime};
/// use taquba_workflow::workflows::{StepContext, Transition};
/// use taquba_workflow::{job, workflow, StepError};
///
/// #[job(key = "gen:{gen}")]
/// async fn gen(ctx: &JobContext<'_>, gen: u32) -> Result<u32, std::io::Error> {
///     Ok(gen + ctx.attempts)
/// }
///
/// #[derive(Default)]
/// struct Pipeline;
///
/// #[workflow(output = String)]
/// impl Pipeline {
///     #[step(start)]
///     async fn gen(&self, ctx: StepContext<'_>, gen: u32) -> Result<Transition<PipelineStep>, StepError> {
///         let _ = ctx.step_name();
///         Ok(Transition::next(PipelineStep::Finish { dyn_: vec![gen; 2] }))
///     }
///
///     #[step]
///     async fn finish(dyn_: Vec<u32>) -> Result<Transition<PipelineStep>, StepError> {
///         Ok(Transition::done(format!("{dyn_:?}")))
///     }
/// }
///
/// # fn main() {
/// let rt = tokio::runtime::Builder::new_current_thread()
///     .enable_time()
///     .start_paused(true)
///     .build()
///     .unwrap();
/// rt.block_on(async {
///     let env = TestJobs::builder().register::<Gen>().build().await.unwrap();
///     let job = env.submit(Gen { gen: 1 }).await.unwrap();
///     env.run_until_idle().await.unwrap();
///     assert_eq!(job.output().await.unwrap(), 2);
///
///     let env = TestRuntime::new(Pipeline).await.unwrap();
///     let run = env.start(PipelineInput { gen: 3 }).await.unwrap();
///     env.run_until_idle().await.unwrap();
///     assert_eq!(run.output().await.unwrap(), "[3, 3]");
/// });
/// # }
/// ```
#[cfg(doctest)]
pub struct Edition2021;
