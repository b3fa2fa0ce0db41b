//! A run's step history as presented: one [`AttemptJson`] per settled
//! attempt, in a [`HistoryJson`] with the counters, and what each attempt
//! led to in words.

use serde::Serialize;
use taquba_workflow::{history::AttemptOutcome, history::RunHistory, history::StepAttempt};

use crate::output::short_duration;
use crate::present::state::{AttemptOutcomeJson, ErrorKindJson};

/// One settled attempt (a line of `runs steps`), as printed.
#[derive(Debug, Serialize)]
pub struct AttemptJson {
    /// The step number.
    pub step: u32,
    /// The step name.
    pub name: String,
    /// The attempt (1-based; 0 for a step ended from outside before it was
    /// delivered).
    pub attempt: u32,
    /// When it was claimed (ms since the Unix epoch).
    pub claimed_at_ms: Option<u64>,
    /// When its settlement committed (ms since the Unix epoch).
    pub settled_at_ms: u64,
    /// What happened.
    pub outcome: AttemptOutcomeJson,
    /// The timer of a `continued` step (ms).
    pub delay_ms: Option<u64>,
    /// The signal a `continued` step waits for.
    pub signal: Option<String>,
    /// Its timeout (ms).
    pub signal_timeout_ms: Option<u64>,
    /// The error kind of a `failed` attempt.
    pub error_kind: Option<ErrorKindJson>,
    /// The error or reason.
    pub error: Option<String>,
    /// The version of the code that settled the step.
    pub version: Option<String>,
}

impl AttemptJson {
    /// One settled `attempt` of step `step` (named `name`), as printed.
    pub fn new(step: u32, name: &str, attempt: &StepAttempt) -> Self {
        let mut json = AttemptJson {
            step,
            name: name.to_string(),
            attempt: attempt.attempt,
            claimed_at_ms: attempt.claimed_at_ms,
            settled_at_ms: attempt.settled_at_ms,
            outcome: AttemptOutcomeJson::Unknown,
            delay_ms: None,
            signal: None,
            signal_timeout_ms: None,
            error_kind: None,
            error: None,
            version: None,
        };
        match &attempt.outcome {
            AttemptOutcome::Continued { delay_ms, signal } => {
                json.outcome = AttemptOutcomeJson::Continued;
                json.delay_ms = *delay_ms;
                if let Some(signal) = signal {
                    json.signal = Some(signal.correlation_key.clone());
                    json.signal_timeout_ms = Some(signal.timeout_ms);
                }
            }
            AttemptOutcome::Retried { error } => {
                json.outcome = AttemptOutcomeJson::Retried;
                json.error = Some(error.clone());
            }
            AttemptOutcome::Succeeded => json.outcome = AttemptOutcomeJson::Succeeded,
            AttemptOutcome::Failed { kind, error } => {
                json.outcome = AttemptOutcomeJson::Failed;
                json.error_kind = Some((*kind).into());
                json.error = Some(error.clone());
            }
            AttemptOutcome::Cancelled { reason } => {
                json.outcome = AttemptOutcomeJson::Cancelled;
                json.error = reason.clone();
            }
            AttemptOutcome::DeadLettered { error } => {
                json.outcome = AttemptOutcomeJson::DeadLettered;
                json.error = Some(error.clone());
            }
            AttemptOutcome::Requeued => json.outcome = AttemptOutcomeJson::Requeued,
            AttemptOutcome::LeaseExpired => json.outcome = AttemptOutcomeJson::LeaseExpired,
            AttemptOutcome::Interrupted => json.outcome = AttemptOutcomeJson::Interrupted,
            // An outcome with no word here (`Unknown`).
            _ => {}
        }
        json
    }

    /// What happened, as the `runs steps` table says it: the outcome and
    /// its error.
    pub fn outcome_text(&self) -> String {
        let word = self.outcome_word();
        match &self.error {
            Some(error) => format!("{word}: {error}"),
            None => word,
        }
    }

    /// What happened, without the error: `continued after 1h`, `failed
    /// (permanent)`, `dead-lettered`.
    pub fn outcome_word(&self) -> String {
        match self.outcome {
            AttemptOutcomeJson::Continued => match (&self.signal, self.delay_ms) {
                (Some(key), _) => format!(
                    "continued on signal {key:?} (timeout {})",
                    short_duration(self.signal_timeout_ms.unwrap_or(0))
                ),
                (None, Some(delay)) => format!("continued after {}", short_duration(delay)),
                (None, None) => "continued".to_string(),
            },
            AttemptOutcomeJson::Failed => match self.error_kind {
                Some(kind) => format!("failed ({kind})"),
                None => "failed".to_string(),
            },
            AttemptOutcomeJson::DeadLettered => "dead-lettered".to_string(),
            AttemptOutcomeJson::LeaseExpired => "lease expired".to_string(),
            other => other.to_string(),
        }
    }
}

/// A run's step history (`runs steps` in JSON), as printed: the attempts
/// and the counters.
#[derive(Debug, Serialize)]
pub struct HistoryJson {
    /// The run.
    pub run_id: String,
    /// Steps taken so far.
    pub steps_taken: u32,
    /// Steps before the first retained one.
    pub steps_dropped: u32,
    /// The version of the code that submitted the run.
    pub version: Option<String>,
    /// Every retained attempt, in step then attempt order.
    pub attempts: Vec<AttemptJson>,
}

impl From<&RunHistory> for HistoryJson {
    fn from(history: &RunHistory) -> Self {
        let mut attempts = Vec::new();
        for step in &history.steps {
            for attempt in &step.attempts {
                let mut json = AttemptJson::new(step.step, &step.name, attempt);
                json.version.clone_from(&step.version);
                attempts.push(json);
            }
        }
        HistoryJson {
            run_id: history.run_id.to_string(),
            steps_taken: history.steps_taken,
            steps_dropped: history.steps_dropped,
            version: history.version.clone(),
            attempts,
        }
    }
}
