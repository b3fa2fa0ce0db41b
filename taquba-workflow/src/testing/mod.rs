//! A test environment for workflows and jobs (feature `testing`): an
//! in-memory store, a queue on a [`taquba::MockClock`], the runtime and its
//! worker, driven step by step from the test.
//!
//! - [`TestRuntime::new`]`(runner)` hosts a `#[workflow]` type (or a
//!   [`Workflows`](crate::workflows::Workflows) router, or any
//!   [`StepRunner`](crate::StepRunner)); [`TestJobs::builder`] registers
//!   `#[job]` types.
//! - [`start`](TestRuntime::start) a run with the workflow's generated
//!   input (or [`submit`](TestJobs::submit) a job); nothing runs until
//!   [`run_until_idle`](TestRuntime::run_until_idle), which runs every step
//!   that is due, and what those make due, and returns once nothing is.
//! - [`advance`](TestRuntime::advance) moves virtual time: durable timers,
//!   signal timeouts and retry backoffs that fall due run, without a wait.
//! - [`signal`](TestRuntime::signal) sends a typed signal;
//!   [`crash`](TestRuntime::crash) drops the runtime as a `kill -9` would
//!   and reopens the store; [`fail_next`](TestRuntime::fail_next) makes one
//!   delivery of a step fail; [`history`](TestRuntime::history) is what the
//!   run recorded: step names, attempts, outcomes, times on the clock.
//!
//! The environment is meant for `#[tokio::test(start_paused = true)]`:
//! Tokio's paused time advances whenever every task waits, so a test takes
//! the time of the work it does, nothing more. (It works on a runtime with
//! real time too, only slower.) The clock starts at [`TEST_EPOCH_MS`].
//! Move time with `advance`, not `tokio::time::sleep`: the runtime's
//! durable times are all on the clock, and under paused time Tokio fires
//! the queue's 1 ms WAL flush timer for every millisecond a sleep skips, so
//! a sleep of an hour costs seconds.
//!
//! # A workflow with a timer, a signal and a crash
//!
//! ```
//! use std::time::Duration;
//!
//! use taquba_workflow::testing::{TEST_EPOCH_MS, TestRuntime};
//! use taquba_workflow::workflows::{StepContext, Transition};
//! use taquba_workflow::{AttemptOutcome, StepError, workflow};
//!
//! const DAY: Duration = Duration::from_secs(24 * 3600);
//!
//! struct Fulfil;
//!
//! #[workflow(name = "fulfil", output = String)]
//! impl Fulfil {
//!     /// Give the customer a day to change their mind.
//!     #[step(start)]
//!     async fn reserve(order: String) -> Result<Transition<FulfilStep>, StepError> {
//!         Ok(Transition::after(FulfilStep::Ask { order }, DAY))
//!     }
//!
//!     /// Wait up to a day for the warehouse's tracking number.
//!     #[step]
//!     async fn ask(order: String) -> Result<Transition<FulfilStep>, StepError> {
//!         let key = format!("shipped:{order}");
//!         Ok(Transition::on_signal(FulfilStep::Ship { order }, key, DAY))
//!     }
//!
//!     #[step]
//!     async fn ship(ctx: StepContext<'_>, order: String) -> Result<Transition<FulfilStep>, StepError> {
//!         match ctx.signal_value::<String>()? {
//!             Some(tracking) => Ok(Transition::done(format!("{order}: {tracking}"))),
//!             None => Ok(Transition::fail("the warehouse never answered")),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = TestRuntime::new(Fulfil).await?;
//! let run = env.start(FulfilInput { order: "o-1".into() }).await?;
//!
//! assert_eq!(env.run_until_idle().await?, 1, "`reserve` ran; `ask` waits a day");
//! assert_eq!(env.advance(DAY - Duration::from_secs(1)).await?, 0);
//! assert_eq!(env.advance(Duration::from_secs(1)).await?, 1, "the timer fired");
//!
//! // The process dies while the run waits for its signal, and restarts.
//! env.crash().await?;
//! env.signal("shipped:o-1", "track-9").await?;
//! env.run_until_idle().await?;
//! assert_eq!(run.output().await?, "o-1: track-9");
//!
//! let history = run.history().await?;
//! let names: Vec<&str> = history.steps.iter().map(|step| step.name.as_str()).collect();
//! assert_eq!(names, ["reserve", "ask", "ship"]);
//! let ask = &history.steps[1].attempts[0];
//! assert_eq!(ask.claimed_at_ms, Some(TEST_EPOCH_MS + 24 * 3600 * 1000));
//! assert!(matches!(ask.outcome, AttemptOutcome::Continued { signal: Some(_), .. }));
//! # Ok(()) }
//! ```
//!
//! # A job with retries
//!
//! ```
//! use std::time::Duration;
//!
//! use taquba_workflow::jobs::{Job, JobContext};
//! use taquba_workflow::testing::{TestError, TestJobs};
//! use taquba_workflow::{AttemptOutcome, StepError, job};
//!
//! /// Fails on its first two attempts (a flaky mail server), then sends.
//! #[job(name = "mail.send")]
//! async fn send_mail(ctx: JobContext<'_>, to: String) -> Result<String, String> {
//!     if ctx.attempts < 3 {
//!         return Err(format!("connection reset on attempt {}", ctx.attempts));
//!     }
//!     Ok(format!("sent to {to}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = TestJobs::builder().register::<SendMail>().max_attempts(4).build().await?;
//! let job = env.submit(SendMail { to: "ada@example.com".into() }).await?;
//!
//! env.run_until_idle().await?;
//! assert!(matches!(job.output().await, Err(TestError::NotEnded(_))), "waiting 1 s to retry");
//! env.advance(Duration::from_secs(1)).await?; // attempt 2 fails: 2 s more
//! env.advance(Duration::from_secs(2)).await?; // attempt 3 sends
//! assert_eq!(job.output().await?, "sent to ada@example.com");
//!
//! let attempts = &job.history().await?.steps[0].attempts;
//! assert_eq!(attempts.len(), 3);
//! assert!(matches!(&attempts[0].outcome, AttemptOutcome::Retried { error } if error.contains("attempt 1")));
//! assert!(matches!(attempts[2].outcome, AttemptOutcome::Succeeded));
//!
//! // An injected failure: permanent, so the next job ends at once.
//! env.fail_next(SendMail::NAME, StepError::permanent("mailbox closed"));
//! let bounced = env.submit(SendMail { to: "bob@example.com".into() }).await?;
//! env.run_until_idle().await?;
//! assert!(matches!(bounced.output().await, Err(TestError::JobFailed { .. })));
//! # Ok(()) }
//! ```

mod error;
mod harness;
mod jobs;
mod workflows;
mod wrap;

pub use error::TestError;
pub use harness::TEST_EPOCH_MS;
pub use jobs::{TestJob, TestJobs, TestJobsBuilder};
pub use workflows::{TestRun, TestRuntime, TestRuntimeBuilder, TestWorkflowRuntime};
pub use wrap::{TestHook, TestRunner};
