//! An inbox command as presented: where it is ([`CommandJson`]) and what
//! the applied command did ([`AnswerJson`]).

use serde::Serialize;
use taquba_workflow::{inbox::CommandAnswer, inbox::CommandId, inbox::CommandState};

use crate::present::state::{CommandStateJson, SignalOutcomeJson};

/// A command's state, as printed.
#[derive(Debug, Serialize)]
pub struct CommandJson {
    /// The command id.
    pub command_id: String,
    /// Where it is.
    pub state: CommandStateJson,
    /// What the applied command did.
    pub answer: Option<AnswerJson>,
    /// Why it was rejected.
    pub error: Option<String>,
    /// When the answer or rejection was recorded (ms since the Unix epoch).
    pub at_ms: Option<u64>,
    /// Where the command object is (or was) in the store.
    pub path: String,
}

impl CommandJson {
    /// `state` of command `id`, whose object is (or was) at `path`, as
    /// printed.
    pub fn new(id: &CommandId, state: &CommandState, path: String) -> Self {
        let mut json = CommandJson {
            command_id: id.to_string(),
            state: CommandStateJson::from(state),
            answer: None,
            error: None,
            at_ms: None,
            path,
        };
        match state {
            CommandState::Applied { answer, at_ms } => {
                json.answer = Some(AnswerJson::from(answer));
                json.at_ms = Some(*at_ms);
            }
            CommandState::Rejected { error, at_ms } => {
                json.error = Some(error.clone());
                json.at_ms = Some(*at_ms);
            }
            _ => {}
        }
        json
    }
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
        /// Delivered or buffered.
        outcome: SignalOutcomeJson,
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
    /// A fork (or restart: from step 0).
    Forked {
        /// The original run.
        run_id: String,
        /// The step the fork started from.
        from_step: u32,
        /// The new run.
        new_run_id: String,
    },
    /// A schedule paused or resumed.
    Schedule {
        /// The schedule.
        name: String,
        /// Whether it is paused.
        paused: bool,
        /// Its next tick, ms since the UNIX epoch (`None` while paused).
        next_fire_ms: Option<u64>,
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
                outcome: (*outcome).into(),
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
            CommandAnswer::Forked {
                run_id,
                from_step,
                new_run_id,
            } => AnswerJson::Forked {
                run_id: run_id.to_string(),
                from_step: *from_step,
                new_run_id: new_run_id.to_string(),
            },
            CommandAnswer::Schedule {
                name,
                paused,
                next_fire_ms,
            } => AnswerJson::Schedule {
                name: name.clone(),
                paused: *paused,
                next_fire_ms: *next_fire_ms,
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
                outcome: SignalOutcomeJson::Delivered,
                run_id,
            } => match run_id {
                Some(run_id) => format!("signal delivered to run {run_id}"),
                None => "signal delivered".to_string(),
            },
            AnswerJson::Signalled {
                outcome: SignalOutcomeJson::Buffered,
                ..
            } => "no run waits on the key: the signal is buffered for the next waiter".to_string(),
            AnswerJson::Requeued {
                run_id,
                step,
                job_id,
            } => format!("run {run_id} is active again: step {step} requeued as job {job_id}"),
            AnswerJson::Forked {
                run_id,
                from_step,
                new_run_id,
            } => format!("run {new_run_id} started from step {from_step} of run {run_id}"),
            AnswerJson::Schedule {
                name, paused: true, ..
            } => format!("schedule {name} is paused"),
            AnswerJson::Schedule { name, .. } => format!("schedule {name} is active"),
            AnswerJson::Other => "applied".to_string(),
        }
    }

    /// Whether the answer says the command did nothing it was asked to (a
    /// cancel of a run that was no longer active).
    pub fn did_nothing(&self) -> bool {
        matches!(
            self,
            AnswerJson::Cancelled {
                cancelled: false,
                ..
            }
        )
    }
}
