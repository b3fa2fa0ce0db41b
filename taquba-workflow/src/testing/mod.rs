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
//! - [`advance`](TestRuntime::advance)`(d)` lets `d` pass on the clock:
//!   everything that falls due meanwhile (durable timers, signal timeouts,
//!   retry backoffs, expired leases, the ticks of
//!   [schedules](crate::schedule)), what the window itself schedules
//!   included, runs at its own time and in time order, and the clock ends
//!   at exactly now + `d`.
//!   [`run_until_ended`](TestRuntime::run_until_ended) skips time from due
//!   instant to due instant until a run ends, and
//!   [`run_to_completion`](TestRuntime::run_to_completion) until nothing
//!   is due at any future time; all three are bounded
//!   ([`TestError::TooManyHops`] names a run that keeps rescheduling
//!   itself).
//! - [`signal`](TestRuntime::signal) sends a typed signal;
//!   [`crash`](TestRuntime::crash) drops the runtime as a `kill -9` would
//!   and reopens the store; [`fail_next`](TestRuntime::fail_next) makes one
//!   delivery of a step fail (a name the workflow has no step of is
//!   refused: [`TestError::UnknownStep`] lists its steps), and
//!   [`unused_failures`](TestRuntime::unused_failures) lists those never
//!   used; [`history`](TestRuntime::history) is what the run recorded: step
//!   names, attempts, outcomes, times on the clock.
//! - The output of a run that has not ended is [`TestError::NotEnded`],
//!   saying what it waits for ([`Waiting`]: a timer due at a time, a signal
//!   key and its timeout, a retry backoff).
//!
//! The environment is meant for `#[tokio::test(start_paused = true)]`
//! (tokio's `macros`, `rt` and `test-util` features):
//! Tokio's paused time advances whenever every task waits, so a test takes
//! the time of the work it does, nothing more. (It works on a runtime with
//! real time too, only slower.) The clock starts at [`TEST_EPOCH_MS`].
//! Move time with `advance`, not `tokio::time::sleep`: the runtime's
//! durable times are all on the clock, which a sleep does not move, and
//! under paused time Tokio fires the queue's 1 ms WAL flush timer for
//! every millisecond a sleep skips, so a sleep of an hour costs seconds.
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
//! use taquba_workflow::testing::{TEST_EPOCH_MS, TestError, TestJobs, Waiting};
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
//! match job.output().await {
//!     Err(TestError::NotEnded { waiting: Waiting::Retry { attempts: 1, due_at_ms, .. }, .. }) => {
//!         assert_eq!(due_at_ms, TEST_EPOCH_MS + 1_000, "1 s of backoff");
//!     }
//!     other => panic!("waiting to retry: {other:?}"),
//! }
//! // A minute passes: attempt 2 runs at +1 s and fails, attempt 3 at +3 s sends.
//! assert_eq!(env.advance(Duration::from_secs(60)).await?, 2);
//! assert_eq!(job.output().await?, "sent to ada@example.com");
//! assert_eq!(env.now_ms(), TEST_EPOCH_MS + 60_000);
//!
//! let attempts = &job.history().await?.steps[0].attempts;
//! let claimed: Vec<_> = attempts.iter().map(|a| a.claimed_at_ms).collect();
//! assert_eq!(claimed, [Some(TEST_EPOCH_MS), Some(TEST_EPOCH_MS + 1_000), Some(TEST_EPOCH_MS + 3_000)]);
//! assert!(matches!(&attempts[0].outcome, AttemptOutcome::Retried { error } if error.contains("attempt 1")));
//! assert!(matches!(attempts[2].outcome, AttemptOutcome::Succeeded));
//!
//! // An injected failure: permanent, so the next job ends at once.
//! env.fail_next(SendMail::NAME, StepError::permanent("mailbox closed"))?;
//! let bounced = env.submit(SendMail { to: "bob@example.com".into() }).await?;
//! env.run_until_idle().await?;
//! assert!(matches!(bounced.output().await, Err(TestError::JobFailed { .. })));
//! // A name no registered job has is refused, not silently never used.
//! let refused = env.fail_next("mail.sned", StepError::transient("typo"));
//! assert!(matches!(refused, Err(TestError::UnknownStep { .. })));
//! assert!(env.unused_failures().is_empty());
//! # Ok(()) }
//! ```
//!
//! # Skipping time until a run ends
//!
//! ```
//! use std::time::Duration;
//!
//! use taquba_workflow::testing::{TEST_EPOCH_MS, TestError, TestRuntime, Waiting};
//! use taquba_workflow::workflows::{StepContext, Transition};
//! use taquba_workflow::{StepError, workflow};
//!
//! const HOUR: Duration = Duration::from_secs(3600);
//!
//! struct Approval;
//!
//! #[workflow(name = "approval", output = bool)]
//! impl Approval {
//!     /// Ask tomorrow.
//!     #[step(start)]
//!     async fn file(request: String) -> Result<Transition<ApprovalStep>, StepError> {
//!         Ok(Transition::after(ApprovalStep::AwaitApproval { request }, 24 * HOUR))
//!     }
//!
//!     /// Wait an hour for the approver.
//!     #[step]
//!     async fn await_approval(request: String) -> Result<Transition<ApprovalStep>, StepError> {
//!         let key = format!("approved:{request}");
//!         Ok(Transition::on_signal(ApprovalStep::Decide {}, key, HOUR))
//!     }
//!
//!     #[step]
//!     async fn decide(ctx: StepContext<'_>) -> Result<Transition<ApprovalStep>, StepError> {
//!         Ok(Transition::done(ctx.signal_value::<bool>()?.unwrap_or(false)))
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let env = TestRuntime::new(Approval).await?;
//! // Steps are named by their fn: the enum variant's spelling is refused.
//! let refused = env.fail_next("AwaitApproval", StepError::transient("busy"));
//! assert!(refused.unwrap_err().to_string().contains("did you mean `await_approval`?"));
//!
//! let run = env.start(ApprovalInput { request: "r-1".into() }).await?;
//! env.run_until_idle().await?;
//! match run.output().await {
//!     Err(TestError::NotEnded { waiting: Waiting::Timer { due_at_ms }, .. }) => {
//!         assert_eq!(due_at_ms, TEST_EPOCH_MS + 24 * 3600 * 1000);
//!     }
//!     other => panic!("waiting on the timer: {other:?}"),
//! }
//! // The timer fires a day later, the signal wait times out an hour after.
//! env.run_until_ended(run.id()).await?;
//! assert!(!run.output().await?, "nobody approved");
//! assert_eq!(env.now_ms(), TEST_EPOCH_MS + 25 * 3600 * 1000);
//! # Ok(()) }
//! ```

mod due;
mod error;
mod harness;
mod jobs;
mod skip;
mod waiting;
mod workflows;
mod wrap;

pub use error::TestError;
pub use harness::DEFAULT_MAX_HOPS;
pub use harness::TEST_EPOCH_MS;
pub use jobs::{TestJob, TestJobs, TestJobsBuilder};
pub use waiting::Waiting;
pub use workflows::{TestRun, TestRuntime, TestRuntimeBuilder, TestWorkflowRuntime};
pub use wrap::{TestHook, TestRunner};
