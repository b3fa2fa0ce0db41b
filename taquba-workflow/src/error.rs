//! The crate's error type. Every variant names the value it rejects, so a
//! log line is enough to find the bad input.

use taquba::object_store;

use crate::store::keys::RunId;

/// The result type of the crate's fallible operations.
pub type Result<T> = std::result::Result<T, Error>;

/// Errors returned by the runtime, its view, memos, groups and jobs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step job lacks a header the runtime sets on every step job (the
    /// header name is given). Seen on a job enqueued on the runtime's queue
    /// by something other than the runtime.
    #[error("step job is missing the `{0}` header")]
    MissingHeader(&'static str),
    /// A step job's reserved header does not parse (for example a step
    /// number that is not a `u32`).
    #[error("step job header `{header}` has an invalid value {value:?}")]
    InvalidStepHeader {
        /// The header name.
        header: &'static str,
        /// The value found.
        value: String,
    },
    /// A submission carries a user header under
    /// [`RESERVED_HEADER_PREFIX`](crate::RESERVED_HEADER_PREFIX) (the
    /// header name is given), in its options or on an enqueue of its
    /// effects; also returned by
    /// [`TerminalEffects::enqueue`](crate::TerminalEffects::enqueue) for
    /// such a header. Those headers make a job a step or a notification of
    /// a runtime, so a caller's enqueue carrying one would forge one.
    #[error("header `{0}` uses the reserved `workflow.` prefix")]
    ReservedHeaderInSubmit(String),
    /// A run id breaks the rules of [`RunId::new`].
    #[error("invalid run id {run_id:?}: {reason}")]
    InvalidRunId {
        /// The rejected id.
        run_id: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A child run key gives no valid child run id (see
    /// [`child_run_id`](crate::children::child_run_id)): the key is empty,
    /// holds a byte outside `[A-Za-z0-9_-]`, or makes the id longer than
    /// [`MAX_RUN_ID_LEN`](crate::MAX_RUN_ID_LEN).
    #[error("invalid child key {key:?} of run `{parent}`: {reason}")]
    InvalidChildKey {
        /// The parent run.
        parent: RunId,
        /// The rejected key.
        key: String,
        /// The rule it breaks.
        reason: String,
    },
    /// A child's derived run id names a run that is not a child of this
    /// parent (a run submitted under it, or a child of another parent whose
    /// id and key concatenate the same).
    #[error("child run id `{child}` of run `{parent}` is taken by another run")]
    ChildRunIdTaken {
        /// The parent that tried to start the child.
        parent: RunId,
        /// The derived child run id.
        child: RunId,
    },
    /// A run with this id is active (or, for a job, recorded) with a
    /// different input: submissions are idempotent on `(run_id, input)`.
    #[error("run `{0}` already exists with a different input")]
    InputMismatch(RunId),
    /// The run's durable records disagree with each other (for example a
    /// current-step pointer whose job does not exist). The runtime never
    /// writes such a state; it indicates outside interference.
    #[error("run `{0}` has inconsistent durable state")]
    InconsistentRunState(RunId),
    /// An application KV effect names a key under the reserved
    /// [`RESERVED_KV_PREFIX`](crate::RESERVED_KV_PREFIX) (the key is given,
    /// lossily decoded as UTF-8).
    #[error("kv key {0:?} is under the reserved `workflow/` prefix")]
    ReservedKvKey(String),
    /// One step staged both a write and a delete of the key given.
    #[error("kv key {0:?} is both written and deleted by one step")]
    ConflictingKvEffect(String),
    /// An effect was staged through a handle whose step already returned;
    /// it could not join the step's settlement, so it is rejected.
    #[error("effects handle is sealed: the step that owns it has returned")]
    EffectsSealed,
    /// The queue reported an error.
    #[error("queue error: {0}")]
    Queue(#[source] taquba::Error),
    /// The object store reported an error.
    #[error("object store error: {0}")]
    Store(#[source] object_store::Error),
    /// The object store failed every call for longer than the outage
    /// budget of the [`OutageGuard`](crate::OutageGuard) the queue was
    /// opened on: the queue stops writing (nothing committed is lost) and
    /// the worker stops. Reopen the queue once the store is back; every run
    /// resumes where it was.
    #[error("store outage: {0}")]
    StoreOutage(crate::store::outage::OutageExceeded),
    /// A value could not be encoded as MessagePack.
    #[error("serialization error: {0}")]
    Serialization(#[from] rmp_serde::encode::Error),
    /// Bytes could not be decoded as the expected MessagePack value.
    #[error("deserialization error: {0}")]
    Deserialization(#[from] rmp_serde::decode::Error),
    /// No run with this id is known (never submitted, or its records were
    /// removed by retention).
    #[error("run `{0}` not found")]
    RunNotFound(RunId),
    /// A member of a group's manifest has no member record: it was never
    /// submitted (for example the submission that wrote the manifest
    /// stopped early). [`RunGroup::resume`](crate::RunGroup::resume)
    /// submits it.
    #[error("member {key:?} of group `{group_id}` was never submitted")]
    MemberNotSubmitted {
        /// The group.
        group_id: RunId,
        /// The member key.
        key: String,
    },
    /// Two members of one group submission share the key given.
    #[error("duplicate group member key {0:?}")]
    DuplicateMemberKey(String),
    /// A group was submitted again with a different member set.
    #[error("group `{0}` was submitted before with a different member set")]
    GroupMismatch(RunId),
    /// No group with this id has a manifest.
    #[error("group `{0}` not found")]
    GroupNotFound(RunId),
    /// A plain submission (a run, a typed workflow start, a keyed job) named
    /// the run id of a group member's run (the hex SHA-256 of
    /// `{group_id}/{key}`): a terminated member's (a plain run under it
    /// would overwrite its terminal and result records), or an active
    /// member's with another input. (An active member's run submitted
    /// plain with its own input is a duplicate, as in 0.13:
    /// `newly_submitted == false`.) Submit the member through its group.
    #[error(
        "run id `{run_id}` belongs to member {key:?} of group `{group_id}`; submit it through the group"
    )]
    GroupMemberRunId {
        /// The run id submitted.
        run_id: RunId,
        /// The group whose member the run id names.
        group_id: RunId,
        /// The member's key.
        key: String,
    },
    /// A group member's run id is held by an active run that is not that
    /// member (a plain run submitted under the digest, or a member of
    /// another group): the member cannot be submitted under it.
    #[error(
        "member {key:?} of group `{group_id}` cannot be submitted: its run id `{run_id}` is held by a run outside the group"
    )]
    MemberRunIdTaken {
        /// The group.
        group_id: RunId,
        /// The member's key.
        key: String,
        /// The member's run id.
        run_id: RunId,
    },
    /// A memo key no memo takes: the reserved key of the run result record
    /// ([`Memo::RESERVED_KEY`](crate::Memo::RESERVED_KEY), `workflow.outcome`),
    /// whose overwrite would erase or forge a run's committed outcome, or
    /// the empty key (its object path would be the step memo's directory).
    #[error("memo key {key:?} is not allowed: {reason}")]
    InvalidMemoKey {
        /// The rejected key.
        key: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// [`WorkflowRuntime::signal_run`](crate::WorkflowRuntime::signal_run)
    /// named a run that is not waiting for a signal on the key given: not
    /// yet (its step that continues on the signal has not settled), no
    /// longer (the wait timed out, a signal woke it, the run ended), or on
    /// another key. Nothing was delivered or buffered. Not permanent: the
    /// run may wait on the key later.
    #[error(
        "run `{run_id}` is not waiting for a signal on {correlation_key:?}; nothing was delivered or buffered"
    )]
    NotWaitingForSignal {
        /// The run the signal was addressed to.
        run_id: RunId,
        /// The correlation key.
        correlation_key: String,
    },
    /// A signal correlation key longer than
    /// [`MAX_CORRELATION_KEY_LEN`](crate::limits::MAX_CORRELATION_KEY_LEN) bytes
    /// (given to `signal`, `signal_run`, `clear_signal`, or
    /// [`Trigger::OnSignal`](crate::Trigger::OnSignal)). Nothing was
    /// delivered, buffered or waited for.
    #[error(
        "signal correlation key {start:?}… is {len} bytes long, more than the {max} bytes allowed"
    )]
    InvalidCorrelationKey {
        /// The key's length, in bytes.
        len: usize,
        /// The longest key allowed, in bytes.
        max: usize,
        /// The key's first 64 bytes (at a character boundary).
        start: String,
    },
    /// A group member key longer than
    /// [`MAX_MEMBER_KEY_LEN`](crate::limits::MAX_MEMBER_KEY_LEN) bytes, given to a
    /// group's `submit`. Nothing was submitted.
    #[error("group member key {start:?}… is {len} bytes long, more than the {max} bytes allowed")]
    MemberKeyTooLong {
        /// The key's length, in bytes.
        len: usize,
        /// The longest key allowed, in bytes.
        max: usize,
        /// The key's first 64 bytes (at a character boundary).
        start: String,
    },
    /// The Tokio runtime shut down while an operation ran on a task of its
    /// own (every call that commits does, so a dropped caller cannot stop
    /// it halfway): whether it took effect is unknown. Look at the state
    /// (or call again) once a runtime runs.
    #[error(
        "the Tokio runtime shut down before the operation finished; whether it took effect is unknown"
    )]
    RuntimeShutdown,
    /// A submission's options break a limit (the message names it and
    /// the value): more than [`MAX_HEADERS`](crate::limits::MAX_HEADERS) headers,
    /// headers over [`MAX_HEADERS_SIZE`](crate::limits::MAX_HEADERS_SIZE) bytes,
    /// a run time past [`MAX_RUN_AT_MS`](crate::limits::MAX_RUN_AT_MS). Nothing
    /// was submitted.
    #[error("invalid run options: {0}")]
    InvalidRunOptions(String),
    /// An inbox command (or its object) is invalid; the message names the
    /// field and the value.
    #[error("invalid command: {0}")]
    InvalidCommand(String),
    /// An inbox command cannot be applied to the state it finds (the
    /// message names the run and what is in the way), for example a
    /// requeue of a run that did not fail by a dead letter.
    #[error("command refused: {0}")]
    CommandRefused(String),
    /// A fork or restart ([`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork))
    /// of a run that is still active, without
    /// [`ForkOptions::cancel_active`](crate::ForkOptions::cancel_active):
    /// cancel it first, or ask the fork to.
    #[error(
        "run `{0}` is active; cancel it first (or fork with cancel_active) to fork or restart it"
    )]
    RunActive(RunId),
    /// A step a fork would start from cannot be forked (the message names
    /// the run, the step and why: an unknown run, a step the run never
    /// reached, or a step whose input is no longer recorded).
    #[error("step {step} of run `{run_id}` can no longer be forked: {reason}")]
    StepNotForkable {
        /// The run.
        run_id: RunId,
        /// The step.
        step: u32,
        /// Why it cannot be forked.
        reason: String,
    },
    /// A fork's [`ForkOptions::run_id`](crate::ForkOptions::run_id) is the
    /// id of a run that is not that fork (another run, or a fork of
    /// another run or step).
    #[error("run id `{0}` is taken by a run that is not this fork")]
    ForkRunIdTaken(RunId),
    /// A schedule's name, spec, options or size is refused, or the change
    /// cannot be applied (another runtime's schedule); the message names
    /// the value. Nothing was committed.
    #[error("invalid schedule: {0}")]
    InvalidSchedule(String),
    /// No schedule has this name.
    #[error("schedule `{0}` not found")]
    ScheduleNotFound(String),
    /// The runner's code ([`StepRunner::code`](crate::StepRunner::code))
    /// declares a patch over
    /// [`MAX_PATCH_ID_LEN`](crate::limits::MAX_PATCH_ID_LEN) bytes, or
    /// patches over [`MAX_PATCHES_SIZE`](crate::limits::MAX_PATCHES_SIZE)
    /// bytes together; the message names the workflow and the patch. Every
    /// submission of the runtime is refused with it, nothing submitted.
    #[error("invalid code declaration: {0}")]
    InvalidCode(String),
}

impl From<taquba::Error> for Error {
    /// [`Error::StoreOutage`] when an [`OutageGuard`](crate::OutageGuard)
    /// ended the call, else [`Error::Queue`].
    fn from(err: taquba::Error) -> Self {
        match crate::store::outage::outage_in(&err) {
            Some(outage) => Error::StoreOutage(outage),
            None => Error::Queue(err),
        }
    }
}

impl From<object_store::Error> for Error {
    /// [`Error::StoreOutage`] when an [`OutageGuard`](crate::OutageGuard)
    /// ended the call, else [`Error::Store`].
    fn from(err: object_store::Error) -> Self {
        match crate::store::outage::outage_in(&err) {
            Some(outage) => Error::StoreOutage(outage),
            None => Error::Store(err),
        }
    }
}

impl Error {
    /// Whether the queue's store is closed to this process for good: it was
    /// closed, or another process opened the same store and fenced this one
    /// (a store has one writer). No retry can succeed; the worker loop stops
    /// with this error and waits fail with it.
    pub fn is_store_closed(&self) -> bool {
        matches!(self, Error::StoreOutage(_))
            || matches!(self, Error::Queue(err) if Self::is_queue_store_closed(err))
    }

    /// [`is_store_closed`](Self::is_store_closed) for an error of the queue.
    pub(crate) fn is_queue_store_closed(err: &taquba::Error) -> bool {
        matches!(
            err,
            taquba::Error::Storage(err) if matches!(err.kind(), slatedb::ErrorKind::Closed(_))
        )
    }

    /// Whether retrying the operation cannot change the outcome: bad input,
    /// malformed records, conflicts with recorded state. Storage errors are
    /// transient.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::Queue(err) => err.is_permanent(),
            Error::Store(_) | Error::RuntimeShutdown | Error::NotWaitingForSignal { .. } => false,
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_value() {
        let id = RunId::new("r-1").unwrap();
        assert_eq!(
            Error::InputMismatch(id.clone()).to_string(),
            "run `r-1` already exists with a different input"
        );
        assert!(
            Error::ReservedKvKey("workflow/x".into())
                .to_string()
                .contains("workflow/x")
        );
        assert!(Error::ReservedHeaderInSubmit("workflow.a".into()).is_permanent());
        assert!(
            !Error::Store(object_store::Error::NotFound {
                path: "p".into(),
                source: "gone".into()
            })
            .is_permanent()
        );
    }
}
