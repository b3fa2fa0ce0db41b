//! Firing due ticks: the maintenance round of the worker (every
//! [`poll_interval`](crate::WorkflowRuntimeBuilder::poll_interval), and in
//! the test kit whenever the queue is idle) reads the schedules of its
//! queue and fires those whose next tick is due, on the runtime's clock.
//!
//! Which due ticks fire ([`ticks_to_fire`]): a tick the round finds under
//! [`MISFIRE_THRESHOLD`] past its time is on time and fires, whatever the
//! [`CatchUp`] policy; a tick the threshold or more past its time is
//! missed, and the policy says which of those fire (`Skip` none, `One` the
//! latest, `All` each). A round one poll interval late therefore fires
//! every tick it finds.
//!
//! Each tick is one transaction: the tick's run (run id
//! `schedule-{name}-{tick ms}`, its record, pointer and step 0) and the
//! schedule's record advanced past the tick (its next tick set to the next
//! tick the round fires, or past now after the last), committed only while
//! the record is as read. The ticks a round leaves out (missed ticks the
//! policy does not fire) all come before the first one it fires, so the
//! first commit moves the record past them. A crash before a commit leaves
//! that tick and the later ones due (the next round fires them, under the
//! policy if they are missed by then), after it the record says it fired,
//! so no tick is fired twice; two runtimes of one queue over one store race
//! on the record and one of them wins each tick. A run id that already
//! names a run (active or terminated) counts as the tick fired: the record
//! is advanced without a second run.

use futures_util::TryStreamExt;
use taquba::SettlementEffects;
use tracing::{debug, warn};

use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::model::RunSpec;
use crate::schedule::manage::PAGE;
use crate::schedule::record::DurableSchedule;
use crate::schedule::spec::{CatchUp, MAX_CATCH_UP_TICKS, MISFIRE_THRESHOLD};
use crate::store::durable;
use crate::store::keys::{RunId, SCHEDULES_PREFIX, schedule_kv_key};

/// The run id of `name`'s tick at `tick_ms`.
///
/// # Errors
/// [`Error::InvalidRunId`] only for a name no schedule can have.
pub fn tick_run_id(name: &str, tick_ms: u64) -> Result<RunId> {
    RunId::new(format!("schedule-{name}-{tick_ms}"))
}

/// Whether `run_id` has the form of a tick's run id
/// ([`tick_run_id`]): `schedule-{name}-{tick_ms}` with a name a schedule
/// can have and a tick of decimal digits.
pub(crate) fn is_tick_run_id(run_id: &str) -> bool {
    let Some(rest) = run_id.strip_prefix("schedule-") else {
        return false;
    };
    let Some((name, tick)) = rest.rsplit_once('-') else {
        return false;
    };
    crate::schedule::spec::check_name(name).is_ok()
        && !tick.is_empty()
        && tick.bytes().all(|b| b.is_ascii_digit())
}

/// The ticks of `due` (a schedule's due ticks, oldest first, none after
/// `now`) that fire at `now` under `policy`, oldest first.
///
/// A tick under [`MISFIRE_THRESHOLD`] before `now` is on time: it fires
/// under every policy. One the threshold or more before `now` is missed:
/// [`CatchUp::Skip`] fires none of them, [`CatchUp::One`] the latest,
/// [`CatchUp::All`] each. The missed ticks are a prefix of `due`, so the
/// ticks left out all come before the first tick fired.
pub(crate) fn ticks_to_fire(due: &[u64], now: u64, policy: CatchUp) -> Vec<u64> {
    let threshold = u64::try_from(MISFIRE_THRESHOLD.as_millis()).unwrap_or(u64::MAX);
    // `due` is sorted and none is after `now`: lateness falls along it.
    let on_time_from = due.partition_point(|tick| now.saturating_sub(*tick) >= threshold);
    let (missed, on_time) = due.split_at(on_time_from);
    let mut fired: Vec<u64> = match policy {
        CatchUp::Skip => Vec::new(),
        CatchUp::One => missed.last().copied().into_iter().collect(),
        CatchUp::All => missed.to_vec(),
    };
    fired.extend_from_slice(on_time);
    fired
}

impl RuntimeCore {
    /// Fire every due tick of this runtime's schedules. Errors are logged
    /// and left to the next round.
    pub(crate) async fn fire_schedules(&self) {
        if let Err(err) = self.fire_due().await {
            self.note_error(&err);
            warn!(queue = %self.queue_name, "firing schedules failed: {err}");
        }
    }

    async fn fire_due(&self) -> Result<()> {
        let now = self.now_ms();
        let mut due = Vec::new();
        {
            let view = self.view.queue_view();
            let mut entries =
                std::pin::pin!(view.kv_entries(SCHEDULES_PREFIX.as_bytes(), .., PAGE));
            while let Some((key, value)) = entries.try_next().await? {
                let whose = String::from_utf8_lossy(&key);
                let Some(record) =
                    durable::decode_or_absent::<DurableSchedule>(&value, "schedule record", &whose)
                else {
                    continue;
                };
                if record.queue_name == self.queue_name
                    && !record.paused
                    && record.next_fire_ms.is_some_and(|next| next <= now)
                {
                    due.push((record, value.to_vec()));
                }
            }
        }
        for (record, bytes) in due {
            let name = record.name.clone();
            if let Err(err) = self.fire(record, bytes, now).await {
                if err.is_store_closed() {
                    return Err(err);
                }
                self.note_error(&err);
                warn!(queue = %self.queue_name, schedule = %name, "firing the schedule failed: {err}");
            }
        }
        Ok(())
    }

    /// Fire the due ticks of `record` (stored as `bytes`) as of `now`, as
    /// [`ticks_to_fire`] says (the on-time ones, and the missed ones its
    /// catch-up policy fires), one transaction per tick.
    async fn fire(&self, record: DurableSchedule, mut bytes: Vec<u8>, now: u64) -> Result<()> {
        let Some(next) = record.next_fire_ms else {
            return Ok(());
        };
        let ticks = record.spec.ticks(record.anchor_ms)?;
        // The latest `MAX_CATCH_UP_TICKS` due ticks: the on-time ones (at
        // most 60, ticks being at least a second apart) all among them.
        let (due, left_out) = ticks.due(next, now, MAX_CATCH_UP_TICKS);
        let fired = ticks_to_fire(&due, now, record.spec.catch_up);
        if left_out && record.spec.catch_up == CatchUp::All {
            warn!(queue = %self.queue_name, schedule = %record.name, "more than {MAX_CATCH_UP_TICKS} ticks were due; the older ones are skipped");
        }
        let after_now = ticks.after(now);
        let key = schedule_kv_key(&record.name);
        let mut current = record;
        if fired.is_empty() {
            // Every due tick is skipped: only the record moves on.
            let mut advanced = current.clone();
            advanced.next_fire_ms = after_now;
            advanced.updated_at_ms = now;
            let effects =
                SettlementEffects::default().kv_put(key.clone(), durable::encode(&advanced));
            self.commits
                .compare_commit(&key, Some(&bytes), effects)
                .await?;
            debug!(schedule = %current.name, "missed ticks skipped");
            return Ok(());
        }
        for (i, tick) in fired.iter().copied().enumerate() {
            let run_id = tick_run_id(&current.name, tick)?;
            let mut advanced = current.clone();
            advanced.next_fire_ms = fired.get(i + 1).copied().or(after_now);
            advanced.last_fired_ms = Some(tick);
            advanced.last_run_id = Some(run_id.to_string());
            advanced.fired = advanced.fired.saturating_add(1);
            advanced.updated_at_ms = now;
            let encoded = durable::encode(&advanced);
            let record = SettlementEffects::default().kv_put(key.clone(), encoded.clone());
            let taken = self.view.run_record(&run_id).await?.is_some()
                || self.view.terminal_record(&run_id).await?.is_some();
            let committed = if taken {
                debug!(schedule = %current.name, run_id = %run_id, "the tick's run exists: counted as fired");
                self.commits
                    .compare_commit(&key, Some(&bytes), record)
                    .await?
                    .is_some()
            } else {
                let spec = RunSpec {
                    run_id: Some(run_id.clone()),
                    input: current.input.clone(),
                    options: current.run_options(),
                    ..RunSpec::default()
                };
                match self
                    .submit_guarded(spec, &key, &bytes, record.clone())
                    .await
                {
                    Ok(submitted) => submitted.is_some(),
                    Err(
                        err @ (Error::InvalidRunOptions(_)
                        | Error::ReservedHeaderInSubmit(_)
                        | Error::ReservedKvKey(_)),
                    ) => {
                        // The run can never be submitted (options a later
                        // build refuses): skip the tick rather than retry
                        // it forever.
                        warn!(schedule = %current.name, run_id = %run_id, "the tick's run is refused, tick skipped: {err}");
                        let mut skipped = advanced.clone();
                        skipped.last_run_id = current.last_run_id.clone();
                        skipped.last_fired_ms = current.last_fired_ms;
                        skipped.fired = current.fired;
                        let effects = SettlementEffects::default()
                            .kv_put(key.clone(), durable::encode(&skipped));
                        if self
                            .commits
                            .compare_commit(&key, Some(&bytes), effects)
                            .await?
                            .is_none()
                        {
                            return Ok(());
                        }
                        bytes = durable::encode(&skipped);
                        current = skipped;
                        continue;
                    }
                    Err(err) => return Err(err),
                }
            };
            if !committed {
                // Changed meanwhile (paused, changed, deleted, or fired by
                // another runtime of the queue): the next round reads it.
                debug!(schedule = %current.name, "schedule changed while firing; left to the next round");
                return Ok(());
            }
            debug!(schedule = %current.name, run_id = %run_id, tick, "schedule fired");
            bytes = encoded;
            current = advanced;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::MAX_SCHEDULE_NAME_LEN;

    #[test]
    fn tick_run_ids_are_told_from_other_ids() {
        let id = tick_run_id("nightly-report_2", 1_700_000_060_000).expect("valid");
        assert!(is_tick_run_id(&id));
        for other in [
            "schedule-",
            "schedule-nightly",
            "schedule--123",
            "schedule-nightly-",
            "schedule-nightly-12a",
            "schedule-night.ly-123",
            "schedules-nightly-123",
            "order-7",
        ] {
            assert!(!is_tick_run_id(other), "{other}");
        }
        let long = format!("schedule-{}-1", "n".repeat(MAX_SCHEDULE_NAME_LEN + 1));
        assert!(!is_tick_run_id(&long));
    }

    const NOW: u64 = 1_700_000_000_000;

    fn late(ms: &[u64]) -> Vec<u64> {
        ms.iter().map(|late| NOW - late).collect()
    }

    #[test]
    fn ticks_found_under_the_threshold_fire_under_every_policy() {
        // A round one poll interval (3 s) late finds three ticks of a
        // 1 s interval: none is missed, each fires whatever the policy.
        let due = late(&[2_000, 1_000, 0]);
        for policy in [CatchUp::Skip, CatchUp::One, CatchUp::All] {
            assert_eq!(ticks_to_fire(&due, NOW, policy), due, "{policy}");
        }
        assert!(ticks_to_fire(&[], NOW, CatchUp::All).is_empty());
    }

    #[test]
    fn the_policy_applies_to_the_missed_ticks_only() {
        let threshold = u64::try_from(MISFIRE_THRESHOLD.as_millis()).expect("fits");
        // Missed: 3 min, 2 min and exactly the threshold late. On time: a
        // millisecond under it, 3 s late, due now.
        let due = late(&[180_000, 120_000, threshold, threshold - 1, 3_000, 0]);
        let (missed, on_time) = due.split_at(3);
        assert_eq!(ticks_to_fire(&due, NOW, CatchUp::Skip), on_time);
        let mut one = vec![missed[2]];
        one.extend_from_slice(on_time);
        assert_eq!(ticks_to_fire(&due, NOW, CatchUp::One), one);
        assert_eq!(ticks_to_fire(&due, NOW, CatchUp::All), due);
        // Only missed ticks (a downtime): as before.
        assert!(ticks_to_fire(missed, NOW, CatchUp::Skip).is_empty());
        assert_eq!(ticks_to_fire(missed, NOW, CatchUp::One), [missed[2]]);
        assert_eq!(ticks_to_fire(missed, NOW, CatchUp::All), missed);
    }
}
