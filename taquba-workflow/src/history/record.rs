//! The stored history: an append-only log of entries per run, one entry
//! per settlement (a step with the attempts it settled), written without a
//! read and without a key of its own on the common path.
//!
//! The entries since the last chunk ride on records the settlement writes
//! anyway: the run's current-step pointer (`workflow/steps/{run_id}`,
//! rewritten by every continuing settlement) carries them as
//! [`PendingHistory`], and the terminal record takes the last ones when the
//! run ends. Every [`CHUNK_ENTRIES`] entries the pending ones move to a
//! chunk record, `workflow/history/{run_id}/{chunk:010}`, in the same
//! transaction; writing chunk `c` deletes chunk `c - chunks_kept`, so a
//! run keeps at least its last `history_limit` entries. An extra KV key per
//! settlement would cost the store a conflict check per concurrent
//! transaction; this layout adds one key every [`CHUNK_ENTRIES`] steps.
//!
//! A run id can run again after it terminated (a group member retried, a
//! run resubmitted); chunks carry the `execution` tag of the run (the id of
//! its step-0 job, recorded in the run record), and a reader keeps only the
//! current execution's.

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use taquba::SettlementEffects;

use crate::history::{AttemptOutcome, SignalWaitSpec, StepAttempt, cut};
pub(crate) use crate::store::durable::PendingHistory;
use crate::store::durable::{self, DurableErrorKind};
use crate::store::keys::{RunId, history_kv_key};

/// Entries a chunk record holds: the pending entries move to a chunk once
/// there are this many.
pub(crate) const CHUNK_ENTRIES: u32 = 8;

/// A chunk record: [`CHUNK_ENTRIES`] entries of one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableHistoryChunk {
    #[serde(default)]
    pub(crate) execution: Option<String>,
    pub(crate) entries: ByteBuf,
    pub(crate) count: u32,
}

/// One entry: a settlement of a step (or an ending of it from outside),
/// with the attempts it settled.
///
/// Entries are the one record written on every settlement, and a pending
/// entry is rewritten with the pointer until its chunk is written, so
/// their field names are one or two letters (still named, so fields can
/// be added): an entry of a step continuing at once is about 50 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableStepEntry {
    #[serde(rename = "s")]
    pub(crate) step: u32,
    #[serde(rename = "n")]
    pub(crate) name: String,
    #[serde(rename = "a")]
    pub(crate) attempts: Vec<DurableAttempt>,
    /// Earlier attempts of the step left out (at most
    /// `MAX_ATTEMPTS_PER_STEP` are kept, so an entry stays far below the KV
    /// value cap).
    #[serde(rename = "x", default, skip_serializing_if = "is_zero")]
    pub(crate) attempts_dropped: u32,
    /// The step's payload as it was delivered, when it was at most the
    /// runtime's step input limit (what a fork starts from); absent in
    /// entries written before it was kept.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub(crate) payload: Option<ByteBuf>,
    /// The step's job, when its payload was not kept (larger than the
    /// limit, or offloaded): a fork reads it while the queue keeps the job.
    #[serde(rename = "j", default, skip_serializing_if = "Option::is_none")]
    pub(crate) job_id: Option<String>,
    /// The version of the code that settled the step, when it differs from
    /// the version the run started on (absent: the start version; see
    /// `versioning`).
    #[serde(rename = "v", default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    /// The signal the step was woken with (after a `Trigger::OnSignal`
    /// wait), when it and the payload kept here are at most the step input
    /// limit together: a fork from the
    /// step is delivered it again. Absent when no signal woke the step
    /// (none waited for, the wait timed out, or written before signals
    /// were kept).
    #[serde(rename = "g", default, skip_serializing_if = "Option::is_none")]
    pub(crate) signal: Option<ByteBuf>,
}

/// What an entry records of its step's input: the payload itself when it
/// is small enough, else the job that holds it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum RecordedInput<'a> {
    /// Nothing (history of a step whose input is not known here).
    #[default]
    None,
    /// The payload, kept in the entry.
    Payload(&'a [u8]),
    /// The job holding the payload.
    Job(&'a str),
}

impl<'a> RecordedInput<'a> {
    /// What to record of `job`'s payload under `limit` bytes: the payload
    /// when it is inline and at most `limit` bytes, else the job's id;
    /// nothing when `limit` is 0 (recording turned off).
    pub(crate) fn of(job: &'a taquba::JobRecord, limit: usize) -> Self {
        Self::from_parts(&job.payload, job.payload_ref.is_some(), &job.id, limit)
    }

    /// [`of`](Self::of) a job `job_id` with `payload` (`offloaded` when
    /// its record holds a payload object's name instead).
    pub(crate) fn from_parts(
        payload: &'a [u8],
        offloaded: bool,
        job_id: &'a str,
        limit: usize,
    ) -> Self {
        if limit == 0 {
            Self::None
        } else if !offloaded && payload.len() <= limit {
            Self::Payload(payload)
        } else {
            Self::Job(job_id)
        }
    }

    /// Whether an entry recording this input under `limit` bytes also
    /// keeps the signal `signal`: the two share the limit (the payload kept
    /// inline and the signal at most `limit` bytes together), and a limit
    /// of 0 keeps neither.
    pub(crate) fn keeps_signal(&self, signal: &[u8], limit: usize) -> bool {
        let inline = match self {
            Self::Payload(payload) => payload.len(),
            Self::None | Self::Job(_) => 0,
        };
        limit > 0 && inline.saturating_add(signal.len()) <= limit
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl DurableStepEntry {
    /// An entry of `step` named `name` with `attempts`, keeping the last
    /// [`MAX_ATTEMPTS_PER_STEP`](crate::history::MAX_ATTEMPTS_PER_STEP).
    pub(crate) fn new(step: u32, name: String, mut attempts: Vec<DurableAttempt>) -> Self {
        let excess = attempts
            .len()
            .saturating_sub(crate::history::MAX_ATTEMPTS_PER_STEP);
        attempts.drain(..excess);
        Self {
            step,
            name,
            attempts,
            attempts_dropped: u32::try_from(excess).unwrap_or(u32::MAX),
            payload: None,
            job_id: None,
            version: None,
            signal: None,
        }
    }

    /// This entry recording `input`.
    pub(crate) fn with_input(mut self, input: RecordedInput<'_>) -> Self {
        match input {
            RecordedInput::None => {}
            RecordedInput::Payload(payload) => self.payload = Some(ByteBuf::from(payload)),
            RecordedInput::Job(job_id) => self.job_id = Some(job_id.to_string()),
        }
        self
    }
}

/// One settled attempt.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(from = "AttemptWire")]
pub(crate) struct DurableAttempt {
    pub(crate) attempt: u32,
    pub(crate) claimed_at_ms: Option<u64>,
    pub(crate) settled_at_ms: u64,
    pub(crate) outcome: DurableAttemptOutcome,
}

/// A [`DurableAttempt`] as stored: the settlement time as an offset from
/// the claim time when there is one (a few bytes instead of nine).
#[derive(Serialize, Deserialize)]
struct AttemptWire {
    a: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    c: Option<u64>,
    /// Settled at: ms after `c`, or ms since the UNIX epoch without `c`.
    t: u64,
    o: DurableAttemptOutcome,
}

/// [`AttemptWire`] by reference, for encoding without a copy.
#[derive(Serialize)]
struct AttemptWireRef<'a> {
    a: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    c: Option<u64>,
    t: u64,
    o: &'a DurableAttemptOutcome,
}

impl Serialize for DurableAttempt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = match self.claimed_at_ms {
            Some(claimed) => self.settled_at_ms.saturating_sub(claimed),
            None => self.settled_at_ms,
        };
        AttemptWireRef {
            a: self.attempt,
            c: self.claimed_at_ms,
            t,
            o: &self.outcome,
        }
        .serialize(serializer)
    }
}

impl From<AttemptWire> for DurableAttempt {
    fn from(wire: AttemptWire) -> Self {
        Self {
            attempt: wire.a,
            claimed_at_ms: wire.c,
            settled_at_ms: wire
                .c
                .map_or(wire.t, |claimed| claimed.saturating_add(wire.t)),
            outcome: wire.o,
        }
    }
}

/// An attempt's outcome as stored (tag `k`, short field names as for
/// [`DurableStepEntry`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub(crate) enum DurableAttemptOutcome {
    Continued {
        #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
        delay_ms: Option<u64>,
        #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
        signal: Option<DurableSignalWait>,
    },
    Retried {
        #[serde(rename = "e")]
        error: String,
    },
    Succeeded,
    Failed {
        #[serde(rename = "ek")]
        error_kind: DurableErrorKind,
        #[serde(rename = "e")]
        error: String,
    },
    Cancelled {
        #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    DeadLettered {
        #[serde(rename = "e")]
        error: String,
    },
    LeaseExpired,
    Interrupted,
    Requeued,
}

/// A signal wait as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableSignalWait {
    #[serde(rename = "key")]
    pub(crate) correlation_key: String,
    #[serde(rename = "ms")]
    pub(crate) timeout_ms: u64,
}

impl DurableAttemptOutcome {
    /// A continuation after `delay_ms` (`None`: at once) or on `signal`
    /// (its key and timeout in ms).
    pub(crate) fn continued(delay_ms: Option<u64>, signal: Option<(&str, u64)>) -> Self {
        Self::Continued {
            delay_ms,
            signal: signal.map(|(key, timeout_ms)| DurableSignalWait {
                correlation_key: cut(key),
                timeout_ms,
            }),
        }
    }

    pub(crate) fn retried(error: &str) -> Self {
        Self::Retried { error: cut(error) }
    }

    pub(crate) fn failed(kind: DurableErrorKind, error: &str) -> Self {
        Self::Failed {
            error_kind: kind,
            error: cut(error),
        }
    }

    pub(crate) fn cancelled(reason: Option<&str>) -> Self {
        Self::Cancelled {
            reason: reason.map(cut),
        }
    }

    pub(crate) fn dead_lettered(error: &str) -> Self {
        Self::DeadLettered { error: cut(error) }
    }
}

impl From<DurableAttemptOutcome> for AttemptOutcome {
    fn from(outcome: DurableAttemptOutcome) -> Self {
        match outcome {
            DurableAttemptOutcome::Continued { delay_ms, signal } => AttemptOutcome::Continued {
                delay_ms,
                signal: signal.map(|s| SignalWaitSpec {
                    correlation_key: s.correlation_key,
                    timeout_ms: s.timeout_ms,
                }),
            },
            DurableAttemptOutcome::Retried { error } => AttemptOutcome::Retried { error },
            DurableAttemptOutcome::Succeeded => AttemptOutcome::Succeeded,
            DurableAttemptOutcome::Failed { error_kind, error } => AttemptOutcome::Failed {
                kind: error_kind.into(),
                error,
            },
            DurableAttemptOutcome::Cancelled { reason } => AttemptOutcome::Cancelled { reason },
            DurableAttemptOutcome::DeadLettered { error } => AttemptOutcome::DeadLettered { error },
            DurableAttemptOutcome::LeaseExpired => AttemptOutcome::LeaseExpired,
            DurableAttemptOutcome::Interrupted => AttemptOutcome::Interrupted,
            DurableAttemptOutcome::Requeued => AttemptOutcome::Requeued,
        }
    }
}

impl From<DurableAttempt> for StepAttempt {
    fn from(attempt: DurableAttempt) -> Self {
        StepAttempt {
            attempt: attempt.attempt,
            claimed_at_ms: attempt.claimed_at_ms,
            settled_at_ms: attempt.settled_at_ms,
            outcome: attempt.outcome.into(),
        }
    }
}

/// The attempts of a step job before its current one, from the queue's own
/// attempt history of the job (`taquba::QueueView::attempt_history`, each
/// entry committed with the transition it records): the retries, expired
/// leases and interrupted claims since its last requeue marker, before
/// attempt `current`.
pub(crate) fn earlier_attempts(
    entries: &[taquba::JobAttempt],
    current: u32,
) -> Vec<DurableAttempt> {
    let since = entries
        .iter()
        .rposition(|e| e.outcome == taquba::AttemptOutcome::Requeued)
        .map_or(0, |marker| marker + 1);
    entries[since..]
        .iter()
        .filter(|e| e.attempt < current)
        .filter_map(|e| {
            let outcome = match e.outcome {
                taquba::AttemptOutcome::Retried => {
                    DurableAttemptOutcome::retried(e.error.as_deref().unwrap_or_default())
                }
                taquba::AttemptOutcome::LeaseExpired => DurableAttemptOutcome::LeaseExpired,
                taquba::AttemptOutcome::Interrupted => DurableAttemptOutcome::Interrupted,
                _ => return None,
            };
            Some(DurableAttempt {
                attempt: e.attempt,
                claimed_at_ms: e.claimed_at,
                settled_at_ms: e.recorded_at,
                outcome,
            })
        })
        .collect()
}

/// The error taquba 0.14 gives a claim it dead-letters when the store is
/// opened and the claim was on its last attempt: the process holding it
/// exited (`requeue_interrupted_claims`). The same crash on an earlier
/// attempt is recorded as [`taquba::AttemptOutcome::Interrupted`].
pub(crate) const INTERRUPTED_CLAIM_ERROR: &str = "claim interrupted by process exit";

/// The attempts of a step job dead-lettered outside the worker on attempt
/// `last` (its record's claim time `claimed_at_ms`: none, on a dead
/// record), as its run's reconciliation records them, from the queue's
/// attempt history `entries`: the earlier attempts (see
/// [`earlier_attempts`]) and the dead-lettered one with the claim time and
/// commit time the queue recorded, its outcome `ended` (what the
/// reconciliation ends the run with) except that a claim interrupted by a
/// process exit is recorded as [`DurableAttemptOutcome::Interrupted`], as
/// on an earlier attempt. With no entry of the dead letter in `entries`
/// (history unreadable), the last attempt is `ended` at `now_ms` with
/// `claimed_at_ms`.
pub(crate) fn dead_letter_attempts(
    entries: &[taquba::JobAttempt],
    last: u32,
    claimed_at_ms: Option<u64>,
    ended: DurableAttemptOutcome,
    now_ms: u64,
) -> Vec<DurableAttempt> {
    let mut attempts = earlier_attempts(entries, last);
    let dead = entries
        .iter()
        .rev()
        .find(|e| e.attempt == last && e.outcome == taquba::AttemptOutcome::DeadLettered);
    attempts.push(match dead {
        Some(dead) => DurableAttempt {
            attempt: dead.attempt,
            claimed_at_ms: dead.claimed_at,
            settled_at_ms: dead.recorded_at,
            outcome: match ended {
                DurableAttemptOutcome::DeadLettered { .. }
                    if dead.error.as_deref() == Some(INTERRUPTED_CLAIM_ERROR) =>
                {
                    DurableAttemptOutcome::Interrupted
                }
                ended => ended,
            },
        },
        None => DurableAttempt {
            attempt: last,
            claimed_at_ms,
            settled_at_ms: now_ms,
            outcome: ended,
        },
    });
    attempts
}

/// Decode concatenated entries; decoding stops at the first that does not
/// decode (a record of a future format is read up to it).
pub(crate) fn decode_entries(mut bytes: &[u8]) -> Vec<DurableStepEntry> {
    let mut entries = Vec::new();
    while !bytes.is_empty() {
        let mut de = rmp_serde::Deserializer::new(&mut bytes);
        match DurableStepEntry::deserialize(&mut de) {
            Ok(entry) => entries.push(entry),
            Err(err) => {
                tracing::warn!("a history entry does not decode; the rest is skipped: {err}");
                break;
            }
        }
    }
    entries
}

/// A [`DurableStepEntry`] by reference, for encoding without a copy.
#[derive(Serialize)]
struct EntryRef<'a> {
    s: u32,
    n: &'a str,
    a: &'a [DurableAttempt],
    #[serde(skip_serializing_if = "is_zero")]
    x: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    p: Option<&'a serde_bytes::Bytes>,
    #[serde(skip_serializing_if = "Option::is_none")]
    j: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    g: Option<&'a serde_bytes::Bytes>,
}

impl PendingHistory {
    /// Append `entry`.
    pub(crate) fn push(&mut self, entry: &DurableStepEntry) {
        let input = match (&entry.payload, &entry.job_id) {
            (Some(payload), _) => RecordedInput::Payload(payload),
            (None, Some(job_id)) => RecordedInput::Job(job_id),
            (None, None) => RecordedInput::None,
        };
        self.push_step_signalled(
            entry.step,
            &entry.name,
            &entry.attempts,
            entry.attempts_dropped,
            input,
            entry.version.as_deref(),
            entry.signal.as_deref().map(|signal| &signal[..]),
        );
    }

    /// Append the entry of step `step` named `name` with `attempts` (the
    /// last [`MAX_ATTEMPTS_PER_STEP`](crate::history::MAX_ATTEMPTS_PER_STEP)
    /// of them are kept, the rest counted with `dropped`), recording
    /// `input`, settled by code at `version` (`None`: the version the run
    /// started on).
    #[cfg(test)]
    pub(crate) fn push_step(
        &mut self,
        step: u32,
        name: &str,
        attempts: &[DurableAttempt],
        dropped: u32,
        input: RecordedInput<'_>,
        version: Option<&str>,
    ) {
        self.push_step_signalled(step, name, attempts, dropped, input, version, None);
    }

    /// [`push_step`](Self::push_step) of a step woken by `signal` (kept in
    /// the entry: a fork from the step is delivered it again).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_step_signalled(
        &mut self,
        step: u32,
        name: &str,
        attempts: &[DurableAttempt],
        dropped: u32,
        input: RecordedInput<'_>,
        version: Option<&str>,
        signal: Option<&[u8]>,
    ) {
        let excess = attempts
            .len()
            .saturating_sub(crate::history::MAX_ATTEMPTS_PER_STEP);
        let entry = EntryRef {
            s: step,
            n: name,
            a: &attempts[excess..],
            x: dropped.saturating_add(u32::try_from(excess).unwrap_or(u32::MAX)),
            p: match input {
                RecordedInput::Payload(payload) => Some(serde_bytes::Bytes::new(payload)),
                _ => None,
            },
            j: match input {
                RecordedInput::Job(job_id) => Some(job_id),
                _ => None,
            },
            v: version,
            g: signal.map(serde_bytes::Bytes::new),
        };
        durable::encode_into(&entry, &mut self.entries);
        self.count = self.count.saturating_add(1);
    }

    /// When the pending entries fill a chunk: the effects that write it as
    /// chunk `self.chunks` of `run_id`'s `execution` (deleting the chunk
    /// that falls out of the last `limit` entries), leaving none pending.
    pub(crate) fn flush_if_full(
        &mut self,
        run_id: &RunId,
        execution: Option<&str>,
        limit: u32,
    ) -> SettlementEffects {
        if self.count < CHUNK_ENTRIES {
            return SettlementEffects::default();
        }
        let chunk = DurableHistoryChunk {
            execution: execution.map(str::to_string),
            entries: std::mem::take(&mut self.entries),
            count: std::mem::take(&mut self.count),
        };
        let number = self.chunks;
        self.chunks = self.chunks.saturating_add(1);
        let mut effects = SettlementEffects::default();
        let kept = chunks_kept(limit);
        if let Some(old) = number.checked_sub(kept) {
            effects = effects.kv_delete(history_kv_key(run_id, old));
        }
        effects.kv_put(history_kv_key(run_id, number), durable::encode(&chunk))
    }
}

/// Chunks kept so that at least the last `limit` entries are retained.
pub(crate) fn chunks_kept(limit: u32) -> u32 {
    limit.div_ceil(CHUNK_ENTRIES)
}

/// Decode a chunk record, `None` (logged) when it does not decode.
pub(crate) fn decode_chunk(bytes: &[u8], run_id: &RunId) -> Option<DurableHistoryChunk> {
    durable::decode_or_absent(bytes, "history chunk", run_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_entry(
        attempt: u32,
        claimed_at: u64,
        outcome: taquba::AttemptOutcome,
        error: Option<&str>,
    ) -> taquba::JobAttempt {
        taquba::JobAttempt {
            attempt,
            claimed_at: Some(claimed_at),
            recorded_at: claimed_at + 5,
            outcome,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn a_reconciled_dead_letter_keeps_its_claim_time_and_the_attempts_before_it() {
        use taquba::AttemptOutcome::{DeadLettered, Retried};
        let retried = queue_entry(1, 100, Retried, Some("busy"));
        let ended = || DurableAttemptOutcome::dead_lettered("whatever the record says");
        // A crash on the last attempt: interrupted, as on an earlier one.
        let crashed = [
            retried.clone(),
            queue_entry(2, 200, DeadLettered, Some(INTERRUPTED_CLAIM_ERROR)),
        ];
        let attempts = dead_letter_attempts(&crashed, 2, None, ended(), 999);
        assert_eq!(
            attempts,
            [
                DurableAttempt {
                    attempt: 1,
                    claimed_at_ms: Some(100),
                    settled_at_ms: 105,
                    outcome: DurableAttemptOutcome::retried("busy"),
                },
                DurableAttempt {
                    attempt: 2,
                    claimed_at_ms: Some(200),
                    settled_at_ms: 205,
                    outcome: DurableAttemptOutcome::Interrupted,
                },
            ]
        );
        // Any other dead letter keeps the outcome it is ended with.
        let expired = [
            retried,
            queue_entry(2, 200, DeadLettered, Some("lease expired")),
        ];
        let attempts = dead_letter_attempts(&expired, 2, None, ended(), 999);
        assert_eq!(attempts[1].outcome, ended());
        assert_eq!(attempts[1].claimed_at_ms, Some(200));
        // A cancellation delivered before the dead letter stays one.
        let cancelled = DurableAttemptOutcome::cancelled(Some("stop"));
        let attempts = dead_letter_attempts(&crashed, 2, None, cancelled.clone(), 999);
        assert_eq!(attempts[1].outcome, cancelled);
        // No entries (the history did not read): the record's view.
        assert_eq!(
            dead_letter_attempts(&[], 3, None, ended(), 999),
            [DurableAttempt {
                attempt: 3,
                claimed_at_ms: None,
                settled_at_ms: 999,
                outcome: ended(),
            }]
        );
    }

    fn entry(step: u32) -> DurableStepEntry {
        DurableStepEntry::new(
            step,
            "charge".into(),
            vec![
                DurableAttempt {
                    attempt: 1,
                    claimed_at_ms: Some(10),
                    settled_at_ms: 12,
                    outcome: DurableAttemptOutcome::retried("503"),
                },
                DurableAttempt {
                    attempt: 2,
                    claimed_at_ms: Some(20),
                    settled_at_ms: 21,
                    outcome: DurableAttemptOutcome::continued(None, Some(("k", 5))),
                },
            ],
        )
    }

    #[test]
    fn an_entry_keeps_the_last_attempts() {
        let attempts = (1..=40)
            .map(|attempt| DurableAttempt {
                attempt,
                claimed_at_ms: None,
                settled_at_ms: 0,
                outcome: DurableAttemptOutcome::retried(&"e".repeat(2000)),
            })
            .collect();
        // A payload and a signal share the step input limit.
        let payload = vec![7; crate::history::MAX_STEP_INPUT_LIMIT - 100];
        let mut entry = DurableStepEntry::new(0, "s".into(), attempts)
            .with_input(RecordedInput::Payload(&payload));
        entry.signal = Some(ByteBuf::from(vec![8; 100]));
        assert_eq!(entry.attempts.len(), crate::history::MAX_ATTEMPTS_PER_STEP);
        assert_eq!(entry.attempts[0].attempt, 25);
        assert_eq!(entry.attempts_dropped, 24);
        let mut pending = PendingHistory::default();
        for _ in 0..CHUNK_ENTRIES {
            pending.push(&entry);
        }
        assert!(
            durable::encode(&pending).len() < taquba::MAX_KV_VALUE_SIZE,
            "a full chunk of the largest entries (payload and signal) fits a KV value"
        );
    }

    #[test]
    fn pending_entries_round_trip_and_fill_chunks() {
        let run = RunId::new("r").unwrap();
        let mut pending = PendingHistory::default();
        for step in 0..CHUNK_ENTRIES - 1 {
            pending.push(&entry(step));
            assert!(
                pending
                    .flush_if_full(&run, Some("e"), 100)
                    .kv_writes
                    .is_empty()
            );
        }
        let decoded = decode_entries(&pending.entries);
        assert_eq!(decoded.len(), (CHUNK_ENTRIES - 1) as usize);
        assert_eq!(decoded[3], entry(3));
        pending.push(&entry(CHUNK_ENTRIES - 1));
        let effects = pending.flush_if_full(&run, Some("e"), 100);
        assert_eq!(pending.count, 0);
        assert_eq!(pending.chunks, 1);
        let chunk_bytes = &effects.kv_writes[&history_kv_key(&run, 0)];
        let chunk = decode_chunk(chunk_bytes, &run).unwrap();
        assert_eq!(chunk.execution.as_deref(), Some("e"));
        assert_eq!(decode_entries(&chunk.entries).len(), CHUNK_ENTRIES as usize);
        assert!(effects.kv_deletes.is_empty());
    }

    #[test]
    fn writing_a_chunk_deletes_the_one_that_falls_out_of_the_limit() {
        let run = RunId::new("r").unwrap();
        let kept = chunks_kept(20);
        assert_eq!(kept, 3);
        let mut pending = PendingHistory {
            chunks: kept,
            ..Default::default()
        };
        for step in 0..CHUNK_ENTRIES {
            pending.push(&entry(step));
        }
        let effects = pending.flush_if_full(&run, None, 20);
        assert_eq!(effects.kv_deletes, vec![history_kv_key(&run, 0)]);
    }

    #[test]
    fn an_entry_of_a_plain_step_is_small() {
        let entry = DurableStepEntry::new(
            41,
            "FnRunner".into(),
            vec![DurableAttempt {
                attempt: 1,
                claimed_at_ms: Some(1_700_000_000_000),
                settled_at_ms: 1_700_000_000_003,
                outcome: DurableAttemptOutcome::continued(None, None),
            }],
        );
        let bytes = durable::encode(&entry);
        assert!(bytes.len() <= 56, "{} bytes", bytes.len());
        assert_eq!(decode_entries(&bytes), vec![entry.clone()]);
        // Its input costs 4 bytes beside the payload's own.
        let payload = [1u8; 16];
        let with_input = entry.with_input(RecordedInput::Payload(&payload));
        let mut pending = PendingHistory::default();
        pending.push(&with_input);
        assert_eq!(pending.entries.len(), bytes.len() + 4 + payload.len());
        assert_eq!(decode_entries(&pending.entries), vec![with_input]);
    }

    #[test]
    fn an_entry_keeps_a_small_payload_and_names_the_job_of_a_large_one() {
        let mut pending = PendingHistory::default();
        let input = |payload: &'static [u8], limit| {
            RecordedInput::from_parts(payload, false, "01JOB", limit)
        };
        pending.push_step(0, "a", &[], 0, input(b"small", 5), None);
        pending.push_step(1, "b", &[], 0, input(b"larger", 5), None);
        pending.push_step(2, "c", &[], 0, input(b"small", 0), None);
        pending.push_step(
            3,
            "d",
            &[],
            0,
            RecordedInput::from_parts(b"x", true, "01OFF", 5),
            None,
        );
        let entries = decode_entries(&pending.entries);
        assert_eq!(
            entries[0].payload.as_ref().map(|p| p.as_slice()),
            Some(&b"small"[..])
        );
        assert_eq!(entries[0].job_id, None);
        assert_eq!(entries[1].payload, None);
        assert_eq!(entries[1].job_id.as_deref(), Some("01JOB"));
        assert_eq!(
            (entries[2].payload.as_ref(), entries[2].job_id.as_ref()),
            (None, None)
        );
        assert_eq!(
            entries[3].job_id.as_deref(),
            Some("01OFF"),
            "an offloaded payload"
        );
        // Pushed again (a requeue puts entries back), the input stays.
        let mut again = PendingHistory::default();
        again.push(&entries[0]);
        assert_eq!(decode_entries(&again.entries)[0], entries[0]);
    }

    #[test]
    fn an_entry_keeps_the_version_that_settled_it() {
        let mut pending = PendingHistory::default();
        let plain = entry(0);
        pending.push(&plain);
        let newer = DurableStepEntry {
            version: Some("2.0.0".into()),
            ..entry(1)
        };
        pending.push_step(
            1,
            "charge",
            &newer.attempts,
            0,
            RecordedInput::None,
            Some("2.0.0"),
        );
        assert_eq!(decode_entries(&pending.entries), vec![plain, newer]);
    }

    #[test]
    fn a_damaged_tail_keeps_the_entries_before_it() {
        let mut pending = PendingHistory::default();
        pending.push(&entry(0));
        pending.entries.extend_from_slice(b"\xc1\xc1");
        assert_eq!(decode_entries(&pending.entries), vec![entry(0)]);
    }
}
