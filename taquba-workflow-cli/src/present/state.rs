//! The states and outcomes the presentation carries, as enums: a run's
//! state, how it ended, an error's kind, what an attempt led to, where an
//! inbox command is, what a signal did. Each is built from the runtime's
//! own type and serializes as one word (`"running"`, `"dead_lettered"`),
//! the word JSON output has always carried; [`as_str`](RunStateJson::as_str)
//! and `Display` give the same word for text and for the dashboard's CSS
//! classes (`b-running`, `o-retried`).

use std::fmt;

use serde::{Serialize, Serializer};
use taquba_workflow::{
    RunState, SignalOutcome, StepErrorKind, TerminalStatus, inbox::CommandState,
};

/// An enum whose values print as words: the enum with its variants (each
/// `Variant => "word"`), `as_str`, `Display` and `Serialize` (the word),
/// from one list, so the three cannot disagree.
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(
                $(#[$variant_meta:meta])*
                $variant:ident => $word:literal,
            )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $(
                $(#[$variant_meta])*
                $variant,
            )+
        }

        impl $name {
            /// The word this value prints as.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $word,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

words! {
    /// A run's state, flattened: the three active states and the three
    /// ways a run ends.
    pub enum RunStateJson {
        /// Its current step waits to be claimed (pending, on a timer,
        /// waiting for a signal, backing off before a retry).
        Pending => "pending",
        /// A worker holds its current step.
        Running => "running",
        /// A cancellation is requested; the run has not ended yet.
        Cancelling => "cancelling",
        /// It succeeded.
        Succeeded => "succeeded",
        /// It failed.
        Failed => "failed",
        /// It was cancelled.
        Cancelled => "cancelled",
    }
}

// The dashboard's: its filters and its command page.
#[cfg(feature = "ui")]
impl RunStateJson {
    /// Whether the run ended (succeeded, failed or cancelled).
    pub fn is_terminated(self) -> bool {
        matches!(
            self,
            RunStateJson::Succeeded | RunStateJson::Failed | RunStateJson::Cancelled
        )
    }
}

impl From<&RunState> for RunStateJson {
    fn from(state: &RunState) -> Self {
        match state {
            RunState::Pending => RunStateJson::Pending,
            RunState::Running => RunStateJson::Running,
            RunState::Cancelling => RunStateJson::Cancelling,
            RunState::Terminated(termination) => {
                TerminalStatusJson::from(termination.status).into()
            }
        }
    }
}

impl From<TerminalStatusJson> for RunStateJson {
    fn from(status: TerminalStatusJson) -> Self {
        match status {
            TerminalStatusJson::Succeeded => RunStateJson::Succeeded,
            TerminalStatusJson::Failed => RunStateJson::Failed,
            TerminalStatusJson::Cancelled => RunStateJson::Cancelled,
        }
    }
}

words! {
    /// How a run ended.
    pub enum TerminalStatusJson {
        /// It succeeded.
        Succeeded => "succeeded",
        /// It failed.
        Failed => "failed",
        /// It was cancelled.
        Cancelled => "cancelled",
    }
}

impl From<TerminalStatus> for TerminalStatusJson {
    fn from(status: TerminalStatus) -> Self {
        match status {
            TerminalStatus::Succeeded => TerminalStatusJson::Succeeded,
            TerminalStatus::Failed => TerminalStatusJson::Failed,
            TerminalStatus::Cancelled => TerminalStatusJson::Cancelled,
        }
    }
}

words! {
    /// How a step error was classified.
    pub enum ErrorKindJson {
        /// A retry may help.
        Transient => "transient",
        /// No retry can help.
        Permanent => "permanent",
    }
}

impl From<StepErrorKind> for ErrorKindJson {
    fn from(kind: StepErrorKind) -> Self {
        match kind {
            StepErrorKind::Transient => ErrorKindJson::Transient,
            StepErrorKind::Permanent => ErrorKindJson::Permanent,
        }
    }
}

words! {
    /// What one attempt of a step led to.
    pub enum AttemptOutcomeJson {
        /// The run continued with its next step (at once, after a timer,
        /// or on a signal).
        Continued => "continued",
        /// A transient error: the step is retried.
        Retried => "retried",
        /// The run succeeded.
        Succeeded => "succeeded",
        /// The run failed.
        Failed => "failed",
        /// The run was cancelled.
        Cancelled => "cancelled",
        /// The step job was dead-lettered outside the worker.
        DeadLettered => "dead_lettered",
        /// The dead-lettered step was requeued (a marker, not an attempt).
        Requeued => "requeued",
        /// The attempt's lease expired before it settled: the step is
        /// delivered again.
        LeaseExpired => "lease_expired",
        /// The process exited (or was killed) while the attempt ran: the
        /// step is delivered again, or, on its last attempt, the run fails.
        Interrupted => "interrupted",
        /// An outcome this presentation has no word for (one a later
        /// runtime version records).
        Unknown => "unknown",
    }
}

words! {
    /// Where an inbox command is.
    pub enum CommandStateJson {
        /// In the inbox, not applied yet.
        Pending => "pending",
        /// Its effect is committed; its answer follows.
        Accepted => "accepted",
        /// Applied, with its answer.
        Applied => "applied",
        /// Refused, with the error.
        Rejected => "rejected",
        /// Neither in the inbox nor recorded (or a state of a later
        /// runtime version).
        Unknown => "unknown",
    }
}

// The dashboard's: its command page stops refreshing a settled command.
#[cfg(feature = "ui")]
impl CommandStateJson {
    /// Whether the owner is done with the command (applied or rejected).
    pub fn is_settled(self) -> bool {
        matches!(self, CommandStateJson::Applied | CommandStateJson::Rejected)
    }
}

impl CommandStateJson {
    /// What the state means for the operator, for the states that are not
    /// final.
    pub fn note(self) -> Option<&'static str> {
        match self {
            CommandStateJson::Pending => {
                Some("In the inbox: the owning process applies it at its next maintenance round.")
            }
            CommandStateJson::Accepted => Some(
                "Its effect is committed; the answer follows when the running step it waits for settles.",
            ),
            CommandStateJson::Unknown => Some(
                "Neither in the inbox nor recorded: never sent here, removed by command retention, or applied a moment ago (try again).",
            ),
            CommandStateJson::Applied | CommandStateJson::Rejected => None,
        }
    }
}

impl From<&CommandState> for CommandStateJson {
    fn from(state: &CommandState) -> Self {
        match state {
            CommandState::Pending => CommandStateJson::Pending,
            CommandState::Accepted => CommandStateJson::Accepted,
            CommandState::Applied { .. } => CommandStateJson::Applied,
            CommandState::Rejected { .. } => CommandStateJson::Rejected,
            // `Unknown`, or a state of a later runtime version.
            _ => CommandStateJson::Unknown,
        }
    }
}

words! {
    /// What a signal did.
    pub enum SignalOutcomeJson {
        /// It woke a waiting run.
        Delivered => "delivered",
        /// No run waited: it is held for the next waiter.
        Buffered => "buffered",
    }
}

impl From<SignalOutcome> for SignalOutcomeJson {
    fn from(outcome: SignalOutcome) -> Self {
        match outcome {
            SignalOutcome::Delivered => SignalOutcomeJson::Delivered,
            SignalOutcome::Buffered => SignalOutcomeJson::Buffered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `value` as JSON, checked against its word.
    fn printed<T: Serialize + fmt::Display>(value: T, word: &str) -> String {
        assert_eq!(value.to_string(), word, "Display of {word}");
        serde_json::to_string(&value).unwrap()
    }

    /// The serialized form of every value: JSON output has carried these
    /// words since before the enums; a change here changes the output of
    /// every command.
    #[test]
    fn every_value_serializes_as_its_word() {
        let runs = [
            (RunStateJson::Pending, "pending"),
            (RunStateJson::Running, "running"),
            (RunStateJson::Cancelling, "cancelling"),
            (RunStateJson::Succeeded, "succeeded"),
            (RunStateJson::Failed, "failed"),
            (RunStateJson::Cancelled, "cancelled"),
        ];
        for (value, word) in runs {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
        let ends = [
            (TerminalStatusJson::Succeeded, "succeeded"),
            (TerminalStatusJson::Failed, "failed"),
            (TerminalStatusJson::Cancelled, "cancelled"),
        ];
        for (value, word) in ends {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
        for (value, word) in [
            (ErrorKindJson::Transient, "transient"),
            (ErrorKindJson::Permanent, "permanent"),
        ] {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
        let attempts = [
            (AttemptOutcomeJson::Continued, "continued"),
            (AttemptOutcomeJson::Retried, "retried"),
            (AttemptOutcomeJson::Succeeded, "succeeded"),
            (AttemptOutcomeJson::Failed, "failed"),
            (AttemptOutcomeJson::Cancelled, "cancelled"),
            (AttemptOutcomeJson::DeadLettered, "dead_lettered"),
            (AttemptOutcomeJson::Requeued, "requeued"),
            (AttemptOutcomeJson::LeaseExpired, "lease_expired"),
            (AttemptOutcomeJson::Interrupted, "interrupted"),
            (AttemptOutcomeJson::Unknown, "unknown"),
        ];
        for (value, word) in attempts {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
        let commands = [
            (CommandStateJson::Pending, "pending"),
            (CommandStateJson::Accepted, "accepted"),
            (CommandStateJson::Applied, "applied"),
            (CommandStateJson::Rejected, "rejected"),
            (CommandStateJson::Unknown, "unknown"),
        ];
        for (value, word) in commands {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
        for (value, word) in [
            (SignalOutcomeJson::Delivered, "delivered"),
            (SignalOutcomeJson::Buffered, "buffered"),
        ] {
            assert_eq!(printed(value, word), format!("\"{word}\""));
        }
    }

    #[test]
    fn runtime_values_map_to_their_words() {
        for status in [
            TerminalStatus::Succeeded,
            TerminalStatus::Failed,
            TerminalStatus::Cancelled,
        ] {
            // The runtime's own word for how a run ended.
            assert_eq!(TerminalStatusJson::from(status).as_str(), status.as_str());
            assert_eq!(
                RunStateJson::from(TerminalStatusJson::from(status)).as_str(),
                status.as_str()
            );
        }
        assert_eq!(
            RunStateJson::from(&RunState::Pending),
            RunStateJson::Pending
        );
        assert_eq!(
            RunStateJson::from(&RunState::Running),
            RunStateJson::Running
        );
        assert_eq!(
            RunStateJson::from(&RunState::Cancelling),
            RunStateJson::Cancelling
        );
        assert_eq!(
            CommandStateJson::from(&CommandState::Unknown),
            CommandStateJson::Unknown
        );
    }

    #[cfg(feature = "ui")]
    #[test]
    fn ended_runs_and_settled_commands_are_told_apart() {
        let ended = [
            RunStateJson::Succeeded,
            RunStateJson::Failed,
            RunStateJson::Cancelled,
        ];
        for state in ended {
            assert!(state.is_terminated(), "{state}");
        }
        for state in [
            RunStateJson::Pending,
            RunStateJson::Running,
            RunStateJson::Cancelling,
        ] {
            assert!(!state.is_terminated(), "{state}");
        }
        assert!(CommandStateJson::Applied.is_settled());
        assert!(CommandStateJson::Rejected.is_settled());
        assert!(!CommandStateJson::Pending.is_settled());
        assert!(!CommandStateJson::Accepted.is_settled());
        assert!(!CommandStateJson::Unknown.is_settled());
    }
}
