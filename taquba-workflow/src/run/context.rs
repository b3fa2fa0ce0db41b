//! The run a runner call works for, as the runtime's own errors name it.
//!
//! When the runtime itself fails a step permanently (a typed job's payload
//! or a `#[workflow]` step's fields that no longer decode after a deploy, a
//! step of a workflow this process does not host, an output that does not
//! encode), the error lands in the run's terminal record, the hook's
//! outcome and the log. An operator reading it needs the run: the worker
//! runs every runner call inside [`RunScope::scope`], and the runtime's
//! error constructors ([`failure`]) prefix the message with the run id
//! (and a job's key, when it has one). Outside a worker (a test calling
//! [`decode_step`](crate::workflows::decode_step) directly) there is no
//! run, and the message is left as it is.

use std::fmt::Display;
use std::future::Future;

use crate::model::StepError;
use crate::store::keys::{HEADER_GROUP_KEY, HEADER_JOB_KEY, RunId};

tokio::task_local! {
    static CURRENT: RunScope;
}

/// The longest job key an error names, in bytes (a longer one is cut at a
/// character boundary and ends with `…`).
const MAX_KEY_IN_ERROR: usize = 256;

/// The run of one runner call.
#[derive(Debug, Clone)]
pub(crate) struct RunScope {
    run_id: RunId,
    key: Option<String>,
}

impl RunScope {
    /// The run `run_id`; `key` is the job's idempotency key or the group
    /// member's key, when the run has one (cut only when an error names
    /// it: a runner call that fails nothing pays one copy).
    pub(crate) fn new(run_id: RunId, key: Option<&str>) -> Self {
        Self {
            run_id,
            key: key.map(str::to_string),
        }
    }

    /// Run `run_id`, whose step job is `job`, with the job's key (a keyed
    /// job's, or a group member's) when it has one.
    pub(crate) fn of_job(run_id: &RunId, job: &taquba::JobRecord) -> Self {
        let header = |name| job.headers.get(name).map(String::as_str);
        Self::new(
            run_id.clone(),
            header(HEADER_JOB_KEY).or_else(|| header(HEADER_GROUP_KEY)),
        )
    }

    /// Run `future` as this run's runner call.
    pub(crate) async fn scope<F: Future>(self, future: F) -> F::Output {
        CURRENT.scope(self, future).await
    }

    /// `message` prefixed with the run: ``run `{id}`: {message}`` or
    /// ``run `{id}` (key "{key}"): {message}``.
    pub(crate) fn name(&self, message: impl Display) -> String {
        match &self.key {
            Some(key) => format!(
                "run `{}` (key {:?}): {message}",
                self.run_id,
                crate::history::cut_cow(key, MAX_KEY_IN_ERROR)
            ),
            None => format!("run `{}`: {message}", self.run_id),
        }
    }
}

/// `message` naming the current run, when there is one.
pub(crate) fn in_current_run(message: impl Display) -> String {
    CURRENT
        .try_with(|scope| scope.name(&message))
        .unwrap_or_else(|_| message.to_string())
}

/// A permanent step error of the runtime's own (not the runner's), naming
/// the current run: see the module doc.
pub(crate) fn failure(message: impl Display) -> StepError {
    StepError::permanent(in_current_run(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_error_names_the_run_and_key_it_was_made_in() {
        let id = RunId::new("r-1").expect("id");
        let plain = RunScope::new(id.clone(), None)
            .scope(async { failure("does not decode").message })
            .await;
        assert_eq!(plain, "run `r-1`: does not decode");
        let keyed = RunScope::new(id, Some("order-7"))
            .scope(async { failure("does not decode").message })
            .await;
        assert_eq!(keyed, "run `r-1` (key \"order-7\"): does not decode");
        assert_eq!(failure("outside").message, "outside");
    }

    #[tokio::test]
    async fn a_long_key_is_cut() {
        let key = "k".repeat(1000);
        let message = RunScope::new(RunId::new("r").expect("id"), Some(&key))
            .scope(async { failure("x").message })
            .await;
        assert!(message.len() < 300, "{message}");
        assert!(message.contains('…'));
    }
}
