//! Step-output replay: with
//! [`WorkflowRuntimeBuilder::step_output_replay`](crate::WorkflowRuntimeBuilder::step_output_replay)
//! every outcome a runner returns is recorded, with the KV effects it
//! staged, before the settlement; a step delivered again with the same
//! payload replays the record instead of calling the runner. A record
//! belongs to one run: it holds the run's execution (the id of the step-0
//! job of its submission, on its run record), and a record of another is
//! not replayed, so a run id submitted again after its run ended runs its
//! steps afresh. Records are keyed by run id, step and the payload's
//! SHA-256 (as the seeds key them); the new run's record replaces the
//! earlier run's.

use std::time::Duration;

use serde_bytes::ByteBuf;

use crate::engine::RuntimeCore;
use crate::error::Result;
use crate::model::{StepOutcome, Trigger};
use crate::run::effects::StagedKv;
use crate::store::durable::{
    self, DurableKvWrite, DurableStepOutcome, DurableStepOutput, DurableTrigger,
};
use crate::store::keys::{RunId, sha256};

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn to_durable(outcome: &StepOutcome) -> DurableStepOutcome {
    match outcome {
        StepOutcome::Continue { payload, when } => DurableStepOutcome::Continue {
            payload: payload.clone(),
            trigger: match when {
                Trigger::Immediate => DurableTrigger::Immediate,
                Trigger::After(delay) => DurableTrigger::After {
                    delay_ms: millis(*delay),
                },
                Trigger::OnSignal {
                    correlation_key,
                    timeout,
                } => DurableTrigger::OnSignal {
                    correlation_key: correlation_key.clone(),
                    timeout_ms: millis(*timeout),
                },
            },
        },
        StepOutcome::Succeed { result } => DurableStepOutcome::Succeed {
            result: result.clone(),
        },
        StepOutcome::Fail { reason } => DurableStepOutcome::Fail {
            reason: reason.clone(),
        },
        StepOutcome::Cancel { reason } => DurableStepOutcome::Cancel {
            reason: reason.clone(),
        },
    }
}

/// The recorded outcome as replayed `elapsed_ms` after it was recorded: a
/// delay shrinks by the time already elapsed, so the original schedule
/// holds.
fn from_durable(outcome: DurableStepOutcome, elapsed_ms: u64) -> StepOutcome {
    match outcome {
        DurableStepOutcome::Continue { payload, trigger } => StepOutcome::Continue {
            payload,
            when: match trigger {
                DurableTrigger::Immediate => Trigger::Immediate,
                DurableTrigger::After { delay_ms } => {
                    Trigger::After(Duration::from_millis(delay_ms.saturating_sub(elapsed_ms)))
                }
                DurableTrigger::OnSignal {
                    correlation_key,
                    timeout_ms,
                } => Trigger::OnSignal {
                    correlation_key,
                    timeout: Duration::from_millis(timeout_ms),
                },
            },
        },
        DurableStepOutcome::Succeed { result } => StepOutcome::Succeed { result },
        DurableStepOutcome::Fail { reason } => StepOutcome::Fail { reason },
        DurableStepOutcome::Cancel { reason } => StepOutcome::Cancel { reason },
    }
}

impl RuntimeCore {
    /// The recorded outcome and effects of `(run_id, step_number, payload)`
    /// in the run of `run_id` whose run record holds `incarnation`, or
    /// `None` (never recorded, recorded by another run under the id, or a
    /// record that does not decode).
    pub(super) async fn load_step_output(
        &self,
        run_id: &RunId,
        incarnation: Option<&str>,
        step_number: u32,
        payload: &[u8],
    ) -> Result<Option<(StepOutcome, StagedKv)>> {
        let path = self
            .memo_store
            .replay_path(run_id, step_number, &sha256(payload));
        let Some(bytes) = self.memo_store.objects().get(&path).await? else {
            return Ok(None);
        };
        let Some(record) = durable::decode_or_absent::<DurableStepOutput>(
            &bytes,
            "step-output replay record",
            run_id,
        ) else {
            return Ok(None);
        };
        if record.incarnation.as_deref() != incarnation {
            // An earlier run's under the same run id.
            return Ok(None);
        }
        let elapsed = self.now_ms().saturating_sub(record.recorded_at_ms);
        let staged = StagedKv {
            writes: record
                .writes
                .into_iter()
                .map(|w| (w.key, w.value))
                .collect(),
            deletes: record.deletes.into_iter().map(ByteBuf::into_vec).collect(),
        };
        Ok(Some((from_durable(record.outcome, elapsed), staged)))
    }

    /// Record `outcome` and its staged effects for replay in the run of
    /// `run_id` whose run record holds `incarnation`.
    pub(super) async fn store_step_output(
        &self,
        run_id: &RunId,
        incarnation: Option<&str>,
        step_number: u32,
        payload: &[u8],
        outcome: &StepOutcome,
        staged: &StagedKv,
    ) -> Result<()> {
        let record = DurableStepOutput {
            outcome: to_durable(outcome),
            writes: staged
                .writes
                .iter()
                .map(|(key, value)| DurableKvWrite {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            deletes: staged.deletes.iter().cloned().map(ByteBuf::from).collect(),
            recorded_at_ms: self.now_ms(),
            incarnation: incarnation.map(str::to_string),
        };
        let path = self
            .memo_store
            .replay_path(run_id, step_number, &sha256(payload));
        self.memo_store
            .objects()
            .put(&path, &durable::encode(&record))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replayed_delay_keeps_the_original_schedule() {
        let recorded = to_durable(&StepOutcome::continue_after(
            vec![1],
            Duration::from_secs(10),
        ));
        assert_eq!(
            from_durable(recorded.clone(), 4_000),
            StepOutcome::continue_after(vec![1], Duration::from_secs(6))
        );
        assert_eq!(
            from_durable(recorded, 60_000),
            StepOutcome::continue_after(vec![1], Duration::ZERO)
        );
        let signal = StepOutcome::continue_on_signal(vec![], "k", Duration::from_secs(5));
        assert_eq!(from_durable(to_durable(&signal), 1_000), signal);
    }
}
