//! The test kit's error: the runtime's errors, and what a test asked of the
//! environment that did not hold.

use std::time::Duration;

use crate::error::Error;
use crate::jobs::JobError;
use crate::store::keys::RunId;
use crate::workflows::WorkflowError;

use super::waiting::Waiting;

/// Why a call on a [`TestRuntime`](super::TestRuntime) or
/// [`TestJobs`](super::TestJobs) (or a handle of theirs) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestError {
    /// The runtime (or its queue) returned an error.
    #[error(transparent)]
    Runtime(#[from] Error),
    /// [`run_until_idle`](super::TestRuntime::run_until_idle) gave up: steps
    /// were still due or running after `waited` of Tokio time (the bound
    /// set with `idle_timeout`, 60 s by default). A step that waits for
    /// something the test does only after `run_until_idle` returns keeps
    /// the queue busy forever.
    #[error(
        "the queue is not idle after {waited:?} of Tokio time: {pending} steps due, {claimed} claimed (a step that never returns keeps it busy)"
    )]
    NotIdle {
        /// How long it waited, in Tokio time.
        waited: Duration,
        /// Jobs due at the last look.
        pending: i64,
        /// Jobs claimed (running or settling) at the last look.
        claimed: i64,
    },
    /// The run has not ended: its current step waits (`waiting`: a timer, a
    /// signal, a retry backoff: [`advance`](super::TestRuntime::advance) the
    /// clock or signal it), or is due and the test did not run the queue
    /// until idle. Also what
    /// [`run_until_ended`](super::TestRuntime::run_until_ended) returns when
    /// nothing is due at any future time and the run has not ended.
    #[error("run `{run_id}` has not ended at {now_ms} ms: {} waits for {}", step_text(step.as_deref()), waiting.describe(*now_ms))]
    NotEnded {
        /// The run.
        run_id: RunId,
        /// The name of its current step, when known.
        step: Option<String>,
        /// What that step waits for.
        waiting: Waiting,
        /// The clock's time when the error was made, ms since the UNIX
        /// epoch.
        now_ms: u64,
    },
    /// One call stepped the clock [`max_hops`](super::TestRuntimeBuilder::max_hops)
    /// times (200 by default) and something was still due within its
    /// reach: a run that keeps rescheduling itself (a timer loop, a step
    /// retried for ever with a backoff). `run_id` is the run most of the
    /// hops were for. The clock stays where the last hop left it.
    #[error("{}", too_many_hops_text(*hops, run_id.as_ref(), *run_hops))]
    TooManyHops {
        /// The clock's steps taken.
        hops: u32,
        /// The run that fell due most often (`None` when only retention
        /// expiries were due).
        run_id: Option<RunId>,
        /// How many of the hops were for it.
        run_hops: u32,
    },
    /// [`fail_next`](super::TestRuntime::fail_next) named a step (or job)
    /// that the environment's runner does not run: a failure queued for it
    /// would never be used.
    #[error("{}", unknown_step_text(name, known))]
    UnknownStep {
        /// The name given.
        name: String,
        /// The names of the runner's steps (or the registered jobs).
        known: Vec<String>,
    },
    /// The run was never submitted (or retention removed its records).
    #[error("run `{0}` is unknown: never submitted, or removed by retention")]
    UnknownRun(RunId),
    /// The workflow run ended without success (failed or cancelled).
    #[error(transparent)]
    RunFailed(#[from] WorkflowError),
    /// The job ended without success (failed or cancelled).
    #[error("job `{id}` did not succeed: {error}")]
    JobFailed {
        /// The job's id.
        id: RunId,
        /// How it ended.
        error: JobError,
    },
    /// A [`crash`](super::TestRuntime::crash) could not reopen the queue;
    /// the environment has no runtime since.
    #[error("the environment's queue did not reopen after the crash")]
    NotReopened,
}

fn step_text(step: Option<&str>) -> String {
    match step {
        Some(step) => format!("step `{step}`"),
        None => "its current step".into(),
    }
}

fn too_many_hops_text(hops: u32, run_id: Option<&RunId>, run_hops: u32) -> String {
    let culprit = match run_id {
        Some(run_id) => format!(
            "run `{run_id}` fell due at {run_hops} of them and keeps rescheduling itself (a timer loop, a step retried for ever?)"
        ),
        None => "only retention expiries fell due".into(),
    };
    format!(
        "the clock was stepped {hops} times in one call and something is still due: {culprit}; end the loop, or raise the cap with `max_hops`"
    )
}

fn unknown_step_text(name: &str, known: &[String]) -> String {
    let names = known
        .iter()
        .map(|known| format!("`{known}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let hint = match snake_case(name) {
        Some(snake) if known.contains(&snake) => format!(
            " (did you mean `{snake}`? a `#[step]` is named by its fn, not by its step enum's variant)"
        ),
        _ => String::new(),
    };
    format!(
        "no step or job named `{name}` runs in this environment, so a failure queued for it would never be used{hint}; the names are {names}"
    )
}

/// `AwaitApproval` as `await_approval`; `None` when `name` has no capital.
fn snake_case(name: &str) -> Option<String> {
    if !name.chars().any(char::is_uppercase) {
        return None;
    }
    let mut snake = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                snake.push('_');
            }
            snake.extend(c.to_lowercase());
        } else {
            snake.push(c);
        }
    }
    Some(snake)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_step_lists_the_known_names_and_spots_a_variant_spelling() {
        let known = vec!["ask".to_string(), "await_approval".to_string()];
        let text = TestError::UnknownStep {
            name: "AwaitApproval".into(),
            known: known.clone(),
        }
        .to_string();
        assert!(text.contains("`AwaitApproval`"), "{text}");
        assert!(text.contains("did you mean `await_approval`?"), "{text}");
        assert!(
            text.ends_with("the names are `ask`, `await_approval`"),
            "{text}"
        );
        let text = TestError::UnknownStep {
            name: "reviw".into(),
            known,
        }
        .to_string();
        assert!(!text.contains("did you mean"), "{text}");
    }
}
