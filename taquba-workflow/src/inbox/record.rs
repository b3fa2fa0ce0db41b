//! The command records: under `workflow/commands/{id}`, what the owner did
//! with each command, written in the same transaction as the command's
//! first effect (or alone, for a rejection or a command with nothing to
//! change), and removed by the command retention sweep.

use serde::{Deserialize, Serialize};

use crate::coordination::signal::SignalOutcome;
use crate::inbox::{CommandAnswer, CommandState};
use crate::store::keys::RunId;

/// A command record as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableCommandRecord {
    /// `"submit"`, `"cancel"`, `"signal"`, `"requeue"`, or `"unknown"` for an
    /// object that did not decode.
    pub(crate) kind: String,
    pub(crate) state: DurableCommandState,
    /// When this state was recorded, ms since the UNIX epoch (runtime clock).
    pub(crate) at_ms: u64,
    /// When the sender wrote the command (its clock); 0 when unknown.
    #[serde(default)]
    pub(crate) sent_at_ms: u64,
    #[serde(default)]
    pub(crate) sender: Option<String>,
}

/// What the owner did with a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum DurableCommandState {
    /// The first effect committed; the answer comes later (a cancellation
    /// waiting for the step it reached).
    Accepted,
    Applied {
        answer: DurableAnswer,
    },
    Rejected {
        error: String,
    },
}

/// A command's answer as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum DurableAnswer {
    Submitted {
        run_id: RunId,
        newly_submitted: bool,
    },
    Cancelled {
        run_id: RunId,
        cancelled: bool,
    },
    Signalled {
        delivered: bool,
        #[serde(default)]
        run_id: Option<RunId>,
    },
    Requeued {
        run_id: RunId,
        step: u32,
        job_id: String,
    },
    Forked {
        run_id: RunId,
        from_step: u32,
        new_run_id: RunId,
    },
    Schedule {
        name: String,
        paused: bool,
        #[serde(default)]
        next_fire_ms: Option<u64>,
    },
}

impl DurableCommandRecord {
    /// Whether the owner is done with the command (its object can go).
    pub(crate) fn is_final(&self) -> bool {
        !matches!(self.state, DurableCommandState::Accepted)
    }
}

impl From<&CommandAnswer> for DurableAnswer {
    fn from(answer: &CommandAnswer) -> Self {
        match answer.clone() {
            CommandAnswer::Submitted {
                run_id,
                newly_submitted,
            } => Self::Submitted {
                run_id,
                newly_submitted,
            },
            CommandAnswer::Cancelled { run_id, cancelled } => Self::Cancelled { run_id, cancelled },
            CommandAnswer::Signalled { outcome, run_id } => Self::Signalled {
                delivered: outcome == SignalOutcome::Delivered,
                run_id,
            },
            CommandAnswer::Requeued {
                run_id,
                step,
                job_id,
            } => Self::Requeued {
                run_id,
                step,
                job_id,
            },
            CommandAnswer::Forked {
                run_id,
                from_step,
                new_run_id,
            } => Self::Forked {
                run_id,
                from_step,
                new_run_id,
            },
            CommandAnswer::Schedule {
                name,
                paused,
                next_fire_ms,
            } => Self::Schedule {
                name,
                paused,
                next_fire_ms,
            },
        }
    }
}

impl From<DurableAnswer> for CommandAnswer {
    fn from(answer: DurableAnswer) -> Self {
        match answer {
            DurableAnswer::Submitted {
                run_id,
                newly_submitted,
            } => Self::Submitted {
                run_id,
                newly_submitted,
            },
            DurableAnswer::Cancelled { run_id, cancelled } => Self::Cancelled { run_id, cancelled },
            DurableAnswer::Signalled { delivered, run_id } => Self::Signalled {
                outcome: if delivered {
                    SignalOutcome::Delivered
                } else {
                    SignalOutcome::Buffered
                },
                run_id,
            },
            DurableAnswer::Requeued {
                run_id,
                step,
                job_id,
            } => Self::Requeued {
                run_id,
                step,
                job_id,
            },
            DurableAnswer::Forked {
                run_id,
                from_step,
                new_run_id,
            } => Self::Forked {
                run_id,
                from_step,
                new_run_id,
            },
            DurableAnswer::Schedule {
                name,
                paused,
                next_fire_ms,
            } => Self::Schedule {
                name,
                paused,
                next_fire_ms,
            },
        }
    }
}

impl From<DurableCommandRecord> for CommandState {
    fn from(record: DurableCommandRecord) -> Self {
        match record.state {
            DurableCommandState::Accepted => CommandState::Accepted,
            DurableCommandState::Applied { answer } => CommandState::Applied {
                answer: answer.into(),
                at_ms: record.at_ms,
            },
            DurableCommandState::Rejected { error } => CommandState::Rejected {
                error,
                at_ms: record.at_ms,
            },
        }
    }
}
