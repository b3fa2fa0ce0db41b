//! The stored history records and the effects that write them. One record
//! per (run, step) under `workflow/history/{run_id}/{step:010}`, holding the
//! step's name, the execution it belongs to and its settled attempts.
//!
//! A step's first attempt writes its record without reading (the common
//! path costs one KV put in the settlement it rides on); a later attempt,
//! a requeued step and an ending from outside the worker read the record
//! and append. Settling the first attempt of step `s` also deletes the
//! record of step `s - limit`, so a run keeps its last `limit` steps.
//!
//! A run id can run again after it terminated (a group member retried, a
//! run resubmitted); each execution's records carry its `execution` tag
//! (the id of its step-0 job, recorded in the run record), and a reader
//! keeps only the current execution's.

use serde::{Deserialize, Serialize};
use taquba::SettlementEffects;

use crate::error::Result;
use crate::history::naming::MAX_NAME_LEN;
use crate::history::{
    AttemptOutcome, MAX_ATTEMPTS_PER_STEP, SignalWaitSpec, StepAttempt, StepHistory, cut,
};
use crate::run::core::RuntimeCore;
use crate::store::durable::{self, DurableErrorKind};
use crate::store::keys::{RunId, history_kv_key};

/// The history record of one step of one execution of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableStepHistory {
    pub(crate) step: u32,
    pub(crate) name: String,
    /// The execution the record belongs to; `None` for a run recorded
    /// before executions were tagged.
    #[serde(default)]
    pub(crate) execution: Option<String>,
    pub(crate) attempts: Vec<DurableAttempt>,
    #[serde(default)]
    pub(crate) attempts_dropped: u32,
}

/// One settled attempt as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableAttempt {
    pub(crate) attempt: u32,
    #[serde(default)]
    pub(crate) claimed_at_ms: Option<u64>,
    pub(crate) settled_at_ms: u64,
    pub(crate) outcome: DurableAttemptOutcome,
}

/// An attempt's outcome as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum DurableAttemptOutcome {
    Continued {
        #[serde(default)]
        delay_ms: Option<u64>,
        #[serde(default)]
        signal: Option<DurableSignalWait>,
    },
    Retried {
        error: String,
    },
    Succeeded,
    Failed {
        error_kind: DurableErrorKind,
        error: String,
    },
    Cancelled {
        #[serde(default)]
        reason: Option<String>,
    },
    DeadLettered {
        error: String,
    },
    LeaseExpired,
    Interrupted,
    Requeued,
}

/// A signal wait as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableSignalWait {
    pub(crate) correlation_key: String,
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

impl From<DurableStepHistory> for StepHistory {
    fn from(record: DurableStepHistory) -> Self {
        StepHistory {
            step: record.step,
            name: record.name,
            attempts: record
                .attempts
                .into_iter()
                .map(|a| StepAttempt {
                    attempt: a.attempt,
                    claimed_at_ms: a.claimed_at_ms,
                    settled_at_ms: a.settled_at_ms,
                    outcome: a.outcome.into(),
                })
                .collect(),
            attempts_dropped: record.attempts_dropped,
        }
    }
}

/// One entry to record: which step of which execution, and its attempts
/// (oldest first).
pub(crate) struct Entry<'a> {
    pub(crate) run_id: &'a RunId,
    pub(crate) step: u32,
    /// The run's execution tag (its run record's).
    pub(crate) execution: Option<&'a str>,
    /// The step's name, computed only when the record is new.
    pub(crate) name: &'a (dyn Fn() -> String + Sync),
    pub(crate) attempts: Vec<DurableAttempt>,
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

impl RuntimeCore {
    /// The effects that record `entry`: a fresh record when `fresh` (the
    /// step's first settlement: nothing to read), else the stored record of
    /// the same execution with the attempts appended. Empty when history is
    /// off.
    ///
    /// # Errors
    /// Storage errors of the read (a record that does not decode is
    /// replaced).
    pub(crate) async fn history_effects(
        &self,
        entry: Entry<'_>,
        fresh: bool,
    ) -> Result<SettlementEffects> {
        let limit = self.ops.history_limit;
        if limit == 0 {
            return Ok(SettlementEffects::default());
        }
        let key = history_kv_key(entry.run_id, entry.step);
        let stored = if fresh {
            None
        } else {
            self.queue
                .view()
                .kv_get(&key)
                .await?
                .and_then(|bytes| {
                    durable::decode_or_absent::<DurableStepHistory>(
                        &bytes,
                        "step history record",
                        entry.run_id,
                    )
                })
                .filter(|record| record.execution.as_deref() == entry.execution)
        };
        let mut record = stored.unwrap_or_else(|| DurableStepHistory {
            step: entry.step,
            name: crate::history::cut_to(&(entry.name)(), MAX_NAME_LEN),
            execution: entry.execution.map(str::to_string),
            attempts: Vec::new(),
            attempts_dropped: 0,
        });
        record.attempts.extend(entry.attempts);
        if record.attempts.len() > MAX_ATTEMPTS_PER_STEP {
            let excess = record.attempts.len() - MAX_ATTEMPTS_PER_STEP;
            record.attempts.drain(..excess);
            record.attempts_dropped = record
                .attempts_dropped
                .saturating_add(u32::try_from(excess).unwrap_or(u32::MAX));
        }
        let mut effects = SettlementEffects::default().kv_put(key, durable::encode(&record));
        if fresh && let Some(old) = entry.step.checked_sub(limit) {
            effects = effects.kv_delete(history_kv_key(entry.run_id, old));
        }
        Ok(effects)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_into_the_public_shape() {
        let record = DurableStepHistory {
            step: 3,
            name: "charge".into(),
            execution: Some("e".into()),
            attempts: vec![
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
            attempts_dropped: 0,
        };
        let back: DurableStepHistory = durable::decode(&durable::encode(&record)).unwrap();
        assert_eq!(back, record);
        let public: StepHistory = back.into();
        assert_eq!(public.name, "charge");
        assert_eq!(
            public.attempts[1].outcome,
            AttemptOutcome::Continued {
                delay_ms: None,
                signal: Some(SignalWaitSpec {
                    correlation_key: "k".into(),
                    timeout_ms: 5
                })
            }
        );
    }
}
