//! A change sent to a store's owner and its answer as the command line
//! prints it: [`Change`] (the inbox command and what it does in words),
//! [`CommandJson`] and [`AnswerJson`] (a command's state, in JSON and as a
//! card) and [`answer`], which prints the final state and turns a
//! rejection into the exit code. Shared by the inbox path
//! ([`crate::commands::mutate`]) and the offline path
//! ([`crate::commands::offline`]).

use serde::Serialize;
use taquba_workflow::{Command, CommandAnswer, CommandId, CommandState, SignalOutcome};

use crate::error::{CliError, CliResult};
use crate::output::{Card, Output, Times};

/// A change to send, with what it is in words.
pub struct Change {
    /// The inbox command.
    pub command: Command,
    /// What it does, for messages: `cancel run X`.
    pub what: String,
}

/// A command's state, as printed.
#[derive(Debug, Serialize)]
pub struct CommandJson {
    /// The command id.
    pub command_id: String,
    /// `pending`, `accepted`, `applied`, `rejected` or `unknown`.
    pub state: &'static str,
    /// What the applied command did.
    pub answer: Option<AnswerJson>,
    /// Why it was rejected.
    pub error: Option<String>,
    /// When the answer or rejection was recorded (ms since the Unix epoch).
    pub at_ms: Option<u64>,
    /// Where the command object is (or was) in the store.
    pub path: String,
}

/// What an applied command did, as printed.
#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AnswerJson {
    /// A submission.
    Submitted {
        /// The run.
        run_id: String,
        /// Whether it was newly submitted.
        newly_submitted: bool,
    },
    /// A cancellation.
    Cancelled {
        /// The run.
        run_id: String,
        /// Whether the run ends cancelled.
        cancelled: bool,
    },
    /// A signal.
    Signalled {
        /// `delivered` or `buffered`.
        outcome: &'static str,
        /// The run it was delivered to.
        run_id: Option<String>,
    },
    /// A requeue.
    Requeued {
        /// The run.
        run_id: String,
        /// The step enqueued again.
        step: u32,
        /// Its new job.
        job_id: String,
    },
    /// An answer of a later runtime version.
    Other,
}

impl From<&CommandAnswer> for AnswerJson {
    fn from(answer: &CommandAnswer) -> Self {
        match answer {
            CommandAnswer::Submitted {
                run_id,
                newly_submitted,
            } => AnswerJson::Submitted {
                run_id: run_id.to_string(),
                newly_submitted: *newly_submitted,
            },
            CommandAnswer::Cancelled { run_id, cancelled } => AnswerJson::Cancelled {
                run_id: run_id.to_string(),
                cancelled: *cancelled,
            },
            CommandAnswer::Signalled { outcome, run_id } => AnswerJson::Signalled {
                outcome: match outcome {
                    SignalOutcome::Delivered => "delivered",
                    SignalOutcome::Buffered => "buffered",
                },
                run_id: run_id.as_ref().map(ToString::to_string),
            },
            CommandAnswer::Requeued {
                run_id,
                step,
                job_id,
            } => AnswerJson::Requeued {
                run_id: run_id.to_string(),
                step: *step,
                job_id: job_id.clone(),
            },
            _ => AnswerJson::Other,
        }
    }
}

impl AnswerJson {
    /// The answer in words.
    pub fn text(&self) -> String {
        match self {
            AnswerJson::Submitted {
                run_id,
                newly_submitted: true,
            } => format!("run {run_id} submitted"),
            AnswerJson::Submitted { run_id, .. } => {
                format!("run {run_id} was already active with the same input")
            }
            AnswerJson::Cancelled {
                run_id,
                cancelled: true,
            } => format!("run {run_id} cancelled"),
            AnswerJson::Cancelled { run_id, .. } => {
                format!("run {run_id} was not active: nothing was cancelled")
            }
            AnswerJson::Signalled {
                outcome: "delivered",
                run_id,
            } => match run_id {
                Some(run_id) => format!("signal delivered to run {run_id}"),
                None => "signal delivered".to_string(),
            },
            AnswerJson::Signalled { .. } => {
                "no run waits on the key: the signal is buffered for the next waiter".to_string()
            }
            AnswerJson::Requeued {
                run_id,
                step,
                job_id,
            } => format!("run {run_id} is active again: step {step} requeued as job {job_id}"),
            AnswerJson::Other => "applied".to_string(),
        }
    }

    /// Whether the answer says the command did nothing it was asked to (a
    /// cancel of a run that was no longer active): exit code 1.
    fn did_nothing(&self) -> bool {
        matches!(
            self,
            AnswerJson::Cancelled {
                cancelled: false,
                ..
            }
        )
    }
}

/// `state` of command `id`, as printed.
pub fn command_json(id: &CommandId, state: &CommandState, path: String) -> CommandJson {
    let mut json = CommandJson {
        command_id: id.to_string(),
        state: "unknown",
        answer: None,
        error: None,
        at_ms: None,
        path,
    };
    match state {
        CommandState::Pending => json.state = "pending",
        CommandState::Accepted => json.state = "accepted",
        CommandState::Applied { answer, at_ms } => {
            json.state = "applied";
            json.answer = Some(AnswerJson::from(answer));
            json.at_ms = Some(*at_ms);
        }
        CommandState::Rejected { error, at_ms } => {
            json.state = "rejected";
            json.error = Some(error.clone());
            json.at_ms = Some(*at_ms);
        }
        CommandState::Unknown => json.state = "unknown",
        // A state of a later runtime version.
        _ => {}
    }
    json
}

/// `json` as a card, with a note on what a state that is not final means.
pub fn command_card(json: &CommandJson, times: &Times) -> Card {
    let mut card = Card::new();
    card.field("Command", &json.command_id)
        .field("State", json.state);
    if let Some(answer) = &json.answer {
        card.field("Answer", answer.text());
    }
    card.field_opt("Error", json.error.as_deref());
    if let Some(at) = json.at_ms {
        card.field("Recorded", times.at(at));
    }
    card.field("Object", &json.path);
    card.field_opt("Note", state_note(json.state));
    card
}

/// What a command's state word (see [`CommandJson::state`]) means for
/// the operator, for the states that are not final.
pub fn state_note(state: &str) -> Option<&'static str> {
    match state {
        "pending" => {
            Some("In the inbox: the owning process applies it at its next maintenance round.")
        }
        "accepted" => Some(
            "Its effect is committed; the answer follows when the running step it waits for settles.",
        ),
        "unknown" => Some(
            "Neither in the inbox nor recorded: never sent here, removed by command retention, or applied a moment ago (try again).",
        ),
        _ => None,
    }
}

/// Print the final state of command `id`; a rejection, or an answer that
/// says nothing was done, is an error (exit code 1) after printing.
pub fn answer(id: &CommandId, state: &CommandState, path: String, out: &Output) -> CliResult<()> {
    let json = command_json(id, state, path);
    out.one(&json, |times| command_card(&json, times))?;
    if let Some(error) = &json.error {
        return Err(CliError::Refused(format!(
            "the owner rejected command {id}: {error}"
        )));
    }
    if let Some(answer) = &json.answer
        && answer.did_nothing()
    {
        return Err(CliError::Refused(answer.text()));
    }
    Ok(())
}
