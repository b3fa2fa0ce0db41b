//! The command object format: MessagePack with named fields, a format
//! number and the kind as a tag, so a command written by one build is read
//! by the next, and a tool in another language can write one:
//!
//! ```text
//! {memo_prefix}/inbox/v1/{id}.msgpack, id a ULID:
//! { format: 1, id: "<the ULID>", sent_at_ms: <u64>, sender: "<text>"?,
//!   command: { kind: "submit", run_id: "<id>"?, input: <bin>,
//!              headers: {<text>: <text>}?, priority: <u32>?,
//!              max_attempts_per_step: <u32>?, run_at_ms: <u64>? }
//!          | { kind: "cancel", run_id: "<id>", reason: "<text>"? }
//!          | { kind: "signal", correlation_key: "<text>", payload: <bin> }
//!          | { kind: "requeue", run_id: "<id>" }
//!          | { kind: "signal_run", run_id: "<id>", correlation_key: "<text>", payload: <bin> }
//!          | { kind: "fork", run_id: "<id>", from_step: <u32>,
//!              new_run_id: "<id>"? }
//!          | { kind: "pause_schedule", name: "<name>" }
//!          | { kind: "resume_schedule", name: "<name>" } }
//! ```
//!
//! then a rewrite of `{memo_prefix}/inbox/touch` (any content that differs
//! from the last, e.g. the id) so the owner looks now.
//!
//! Every field is input from outside: [`decode`] bounds the size, checks
//! that the object is the one its name says, and validates every field as
//! the in-process API validates its arguments.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use taquba::MAX_KV_VALUE_SIZE;

use crate::error::{Error, Result};
use crate::inbox::{Command, CommandId, MAX_COMMAND_SIZE, MAX_COMMAND_TEXT_LEN, SubmitCommand};
use crate::store::keys::{RESERVED_HEADER_PREFIX, RunId};

/// The command format this build writes and reads.
const FORMAT: u32 = 1;

/// A command object as stored.
#[derive(Debug, Serialize, Deserialize)]
struct WireCommand {
    format: u32,
    id: String,
    sent_at_ms: u64,
    #[serde(default)]
    sender: Option<String>,
    command: WireKind,
}

/// A command's kind and fields as stored; run ids as text, so a bad one is
/// rejected by name rather than as a decoding error.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum WireKind {
    Submit {
        #[serde(default)]
        run_id: Option<String>,
        #[serde(with = "serde_bytes")]
        input: Vec<u8>,
        #[serde(default)]
        headers: HashMap<String, String>,
        #[serde(default)]
        priority: Option<u32>,
        #[serde(default)]
        max_attempts_per_step: Option<u32>,
        #[serde(default)]
        run_at_ms: Option<u64>,
    },
    Cancel {
        run_id: String,
        #[serde(default)]
        reason: Option<String>,
    },
    Signal {
        correlation_key: String,
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    Requeue {
        run_id: String,
    },
    PauseSchedule {
        name: String,
    },
    ResumeSchedule {
        name: String,
    },
    SignalRun {
        run_id: String,
        correlation_key: String,
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    Fork {
        run_id: String,
        from_step: u32,
        #[serde(default)]
        new_run_id: Option<String>,
    },
}

/// A decoded, validated command with what its envelope says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Received {
    pub(crate) command: Command,
    pub(crate) sent_at_ms: u64,
    pub(crate) sender: Option<String>,
}

/// Encode `command` as command `id`, validating it first.
pub(crate) fn encode(
    id: &CommandId,
    command: &Command,
    sent_at_ms: u64,
    sender: Option<&str>,
) -> Result<Vec<u8>> {
    validate(command)?;
    if let Some(sender) = sender {
        check_text("sender", sender)?;
    }
    let kind = match command {
        Command::Submit(submit) => WireKind::Submit {
            run_id: submit.run_id.as_ref().map(RunId::to_string),
            input: submit.input.clone(),
            headers: submit.headers.clone(),
            priority: submit.priority,
            max_attempts_per_step: submit.max_attempts_per_step,
            run_at_ms: submit.run_at_ms,
        },
        Command::Cancel { run_id, reason } => WireKind::Cancel {
            run_id: run_id.to_string(),
            reason: reason.clone(),
        },
        Command::Signal {
            correlation_key,
            payload,
        } => WireKind::Signal {
            correlation_key: correlation_key.clone(),
            payload: payload.clone(),
        },
        Command::Requeue { run_id } => WireKind::Requeue {
            run_id: run_id.to_string(),
        },
        Command::PauseSchedule { name } => WireKind::PauseSchedule { name: name.clone() },
        Command::ResumeSchedule { name } => WireKind::ResumeSchedule { name: name.clone() },
        Command::SignalRun {
            run_id,
            correlation_key,
            payload,
        } => WireKind::SignalRun {
            run_id: run_id.to_string(),
            correlation_key: correlation_key.clone(),
            payload: payload.clone(),
        },
        Command::Fork {
            run_id,
            from_step,
            new_run_id,
        } => WireKind::Fork {
            run_id: run_id.to_string(),
            from_step: *from_step,
            new_run_id: new_run_id.as_ref().map(RunId::to_string),
        },
    };
    let bytes = rmp_serde::to_vec_named(&WireCommand {
        format: FORMAT,
        id: id.to_string(),
        sent_at_ms,
        sender: sender.map(str::to_string),
        command: kind,
    })?;
    if bytes.len() > MAX_COMMAND_SIZE {
        return Err(Error::InvalidCommand(format!(
            "the {} command is {} bytes encoded, over the {MAX_COMMAND_SIZE}-byte limit",
            command.kind(),
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Decode and validate the object of command `id`.
///
/// # Errors
/// [`Error::InvalidCommand`] naming what is wrong: an object over
/// [`MAX_COMMAND_SIZE`], bytes that are not a command, another format, an
/// id that is not the object's, an invalid field.
pub(crate) fn decode(id: &CommandId, bytes: &[u8]) -> Result<Received> {
    if bytes.len() > MAX_COMMAND_SIZE {
        return Err(oversized(bytes.len()));
    }
    let wire: WireCommand = rmp_serde::from_slice(bytes).map_err(|err| {
        Error::InvalidCommand(format!(
            "the object is not a command of format {FORMAT}: {err}"
        ))
    })?;
    if wire.format != FORMAT {
        return Err(Error::InvalidCommand(format!(
            "command format {} is not supported (this runtime reads format {FORMAT})",
            wire.format
        )));
    }
    // Compared as ULIDs, which are case-insensitive: a tool may spell the
    // id in lower case, in the object's name or in its field.
    if wire.id.parse::<CommandId>().ok().as_ref() != Some(id) {
        return Err(Error::InvalidCommand(format!(
            "the object of command {id} holds command {:?}",
            wire.id
        )));
    }
    if let Some(sender) = &wire.sender {
        check_text("sender", sender)?;
    }
    let command = match wire.command {
        WireKind::Submit {
            run_id,
            input,
            headers,
            priority,
            max_attempts_per_step,
            run_at_ms,
        } => Command::Submit(SubmitCommand {
            run_id: run_id.map(RunId::new).transpose()?,
            input,
            headers,
            priority,
            max_attempts_per_step,
            run_at_ms,
        }),
        WireKind::Cancel { run_id, reason } => Command::Cancel {
            run_id: RunId::new(run_id)?,
            reason,
        },
        WireKind::Signal {
            correlation_key,
            payload,
        } => Command::Signal {
            correlation_key,
            payload,
        },
        WireKind::Requeue { run_id } => Command::Requeue {
            run_id: RunId::new(run_id)?,
        },
        WireKind::PauseSchedule { name } => Command::PauseSchedule { name },
        WireKind::ResumeSchedule { name } => Command::ResumeSchedule { name },
        WireKind::SignalRun {
            run_id,
            correlation_key,
            payload,
        } => Command::SignalRun {
            run_id: RunId::new(run_id)?,
            correlation_key,
            payload,
        },
        WireKind::Fork {
            run_id,
            from_step,
            new_run_id,
        } => Command::Fork {
            run_id: RunId::new(run_id)?,
            from_step,
            new_run_id: new_run_id.map(RunId::new).transpose()?,
        },
    };
    validate(&command)?;
    Ok(Received {
        command,
        sent_at_ms: wire.sent_at_ms,
        sender: wire.sender,
    })
}

/// The error of an object over [`MAX_COMMAND_SIZE`].
pub(crate) fn oversized(size: usize) -> Error {
    Error::InvalidCommand(format!(
        "the command object is {size} bytes, over the {MAX_COMMAND_SIZE}-byte limit"
    ))
}

/// Check every field of `command` as the in-process API checks its
/// arguments (run ids are valid by construction).
pub(crate) fn validate(command: &Command) -> Result<()> {
    match command {
        Command::Submit(submit) => {
            if let Some(name) = submit
                .headers
                .keys()
                .find(|name| name.starts_with(RESERVED_HEADER_PREFIX))
            {
                return Err(Error::ReservedHeaderInSubmit(name.clone()));
            }
            if submit.max_attempts_per_step == Some(0) {
                return Err(Error::InvalidCommand(
                    "max_attempts_per_step is 0; a step needs at least one attempt".to_string(),
                ));
            }
            crate::model::check_limits(&submit.headers, submit.run_at_ms)
        }
        Command::Cancel { reason, .. } => match reason {
            Some(reason) => check_text("cancellation reason", reason),
            None => Ok(()),
        },
        Command::Signal {
            correlation_key,
            payload,
        }
        | Command::SignalRun {
            correlation_key,
            payload,
            ..
        } => {
            check_text("correlation key", correlation_key)?;
            if payload.len() > MAX_KV_VALUE_SIZE {
                return Err(Error::Queue(taquba::Error::KvValueTooLarge {
                    size: payload.len(),
                    max: MAX_KV_VALUE_SIZE,
                }));
            }
            Ok(())
        }
        Command::Requeue { .. } | Command::Fork { .. } => Ok(()),
        Command::PauseSchedule { name } | Command::ResumeSchedule { name } => {
            crate::schedule::check_name(name)
        }
    }
}

fn check_text(what: &str, text: &str) -> Result<()> {
    if text.len() > MAX_COMMAND_TEXT_LEN {
        let start: String = text.chars().take(32).collect();
        return Err(Error::InvalidCommand(format!(
            "the {what} {start:?}… is {} bytes, over the {MAX_COMMAND_TEXT_LEN}-byte limit",
            text.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rid(id: &str) -> RunId {
        RunId::new(id).unwrap()
    }

    #[test]
    fn commands_round_trip() {
        let id = CommandId::generate();
        for command in [
            Command::Submit(
                SubmitCommand::new(b"in".to_vec())
                    .run_id(rid("r1"))
                    .header("h", "v")
                    .priority(3)
                    .max_attempts_per_step(2)
                    .run_at_ms(9),
            ),
            Command::cancel(rid("r2"), Some("stop".into())),
            Command::signal("key", b"p".to_vec()),
            Command::requeue(rid("r3")),
            Command::signal_run(rid("r4"), "key", b"p".to_vec()),
        ] {
            let bytes = encode(&id, &command, 5, Some("cli")).unwrap();
            let back = decode(&id, &bytes).unwrap();
            assert_eq!(back.command, command);
            assert_eq!(back.sent_at_ms, 5);
            assert_eq!(back.sender.as_deref(), Some("cli"));
        }
    }

    #[test]
    fn bad_objects_are_rejected_naming_the_problem() {
        let id = CommandId::generate();
        let err = decode(&id, b"\x93garbage").unwrap_err().to_string();
        assert!(err.contains("not a command"), "{err}");
        let other = CommandId::generate();
        let bytes = encode(&other, &Command::requeue(rid("r")), 0, None).unwrap();
        let err = decode(&id, &bytes).unwrap_err().to_string();
        assert!(err.contains(&other.to_string()), "{err}");
        let err = decode(&id, &vec![0; MAX_COMMAND_SIZE + 1])
            .unwrap_err()
            .to_string();
        assert!(err.contains("over the"), "{err}");

        // A bad run id and a reserved header, written by hand.
        let bad_id = rmp_serde::to_vec_named(&WireCommand {
            format: FORMAT,
            id: id.to_string(),
            sent_at_ms: 0,
            sender: None,
            command: WireKind::Cancel {
                run_id: "a/b".into(),
                reason: None,
            },
        })
        .unwrap();
        let err = decode(&id, &bad_id).unwrap_err().to_string();
        assert!(err.contains("a/b"), "{err}");
        let reserved = rmp_serde::to_vec_named(&WireCommand {
            format: FORMAT,
            id: id.to_string(),
            sent_at_ms: 0,
            sender: None,
            command: WireKind::Submit {
                run_id: None,
                input: vec![],
                headers: HashMap::from([("workflow.step".into(), "9".into())]),
                priority: None,
                max_attempts_per_step: None,
                run_at_ms: None,
            },
        })
        .unwrap();
        let err = decode(&id, &reserved).unwrap_err().to_string();
        assert!(err.contains("workflow.step"), "{err}");
        let future = rmp_serde::to_vec_named(&WireCommand {
            format: 2,
            id: id.to_string(),
            sent_at_ms: 0,
            sender: None,
            command: WireKind::Requeue { run_id: "r".into() },
        })
        .unwrap();
        let err = decode(&id, &future).unwrap_err().to_string();
        assert!(err.contains("format 2"), "{err}");
    }

    #[test]
    fn oversized_fields_are_refused_when_sent() {
        let id = CommandId::generate();
        let long = "r".repeat(MAX_COMMAND_TEXT_LEN + 1);
        let err = encode(&id, &Command::cancel(rid("r"), Some(long)), 0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cancellation reason"), "{err}");
        let big = vec![0; MAX_KV_VALUE_SIZE + 1];
        assert!(encode(&id, &Command::signal("k", big), 0, None).is_err());
        let huge = SubmitCommand::new(vec![0; MAX_COMMAND_SIZE]);
        let err = encode(&id, &Command::Submit(huge), 0, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("over the"), "{err}");
        let zero = SubmitCommand::new(vec![]).max_attempts_per_step(0);
        assert!(encode(&id, &Command::Submit(zero), 0, None).is_err());
        let far = SubmitCommand::new(vec![]).run_at_ms(crate::limits::MAX_RUN_AT_MS + 1);
        let err = encode(&id, &Command::Submit(far), 0, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&(crate::limits::MAX_RUN_AT_MS + 1).to_string()),
            "{err}"
        );
        let last = SubmitCommand::new(vec![]).run_at_ms(crate::limits::MAX_RUN_AT_MS);
        assert!(encode(&id, &Command::Submit(last), 0, None).is_ok());
        let mut many = SubmitCommand::new(vec![]);
        for n in 0..=crate::limits::MAX_HEADERS {
            many = many.header(format!("h{n}"), "v");
        }
        let err = encode(&id, &Command::Submit(many), 0, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{} headers", crate::limits::MAX_HEADERS + 1)),
            "{err}"
        );
        let big =
            SubmitCommand::new(vec![]).header("h", "v".repeat(crate::limits::MAX_HEADERS_SIZE));
        let err = encode(&id, &Command::Submit(big), 0, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("{} bytes", crate::limits::MAX_HEADERS_SIZE + 1)),
            "{err}"
        );
    }
}
