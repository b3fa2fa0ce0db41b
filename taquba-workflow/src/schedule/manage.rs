//! Creating, changing, pausing, resuming and deleting schedules: each a
//! compare-and-commit on the schedule's record, so it never overwrites a
//! tick fired meanwhile (nor a tick a change it did not see).

use futures_util::TryStreamExt;
use taquba::{MAX_KV_VALUE_SIZE, SettlementEffects};

use crate::engine::RuntimeCore;
use crate::error::{Error, Result};
use crate::model::RunOptions;
use crate::schedule::record::{DurableSchedule, ScheduleInfo};
use crate::schedule::spec::{ScheduleSpec, check_name};
use crate::store::durable;
use crate::store::keys::{SCHEDULES_PREFIX, schedule_kv_key};
use crate::view::WorkflowView;

/// Attempts of a change whose compare-and-commit lost to a tick or another
/// change before the call gives up.
const CHANGE_RACE_RETRIES: usize = 8;
/// Schedule records read per page of a listing.
pub(super) const PAGE: usize = 64;

/// The stored record of `name` and its bytes (the compare value).
pub(super) async fn read(
    view: &WorkflowView,
    name: &str,
) -> Result<Option<(DurableSchedule, Vec<u8>)>> {
    let Some(bytes) = view.queue_view().kv_get(&schedule_kv_key(name)).await? else {
        return Ok(None);
    };
    Ok(Some((durable::decode(&bytes)?, bytes.to_vec())))
}

impl WorkflowView {
    /// Every schedule in the store, in name order (the schedules of every
    /// runtime over it: [`ScheduleInfo::queue_name`] says whose).
    ///
    /// # Errors
    /// Storage errors; a record that does not decode is logged and left
    /// out.
    pub async fn schedules(&self) -> Result<Vec<ScheduleInfo>> {
        let view = self.queue_view();
        let mut entries = std::pin::pin!(view.kv_entries(SCHEDULES_PREFIX.as_bytes(), .., PAGE));
        let mut schedules = Vec::new();
        while let Some((key, value)) = entries.try_next().await? {
            let whose = String::from_utf8_lossy(&key);
            if let Some(record) =
                durable::decode_or_absent::<DurableSchedule>(&value, "schedule record", &whose)
            {
                schedules.push(record.info());
            }
        }
        Ok(schedules)
    }

    /// The schedule `name`; `None` when there is none.
    ///
    /// # Errors
    /// Storage and decoding errors.
    pub async fn schedule(&self, name: &str) -> Result<Option<ScheduleInfo>> {
        Ok(read(self, name).await?.map(|(record, _)| record.info()))
    }
}

impl RuntimeCore {
    /// Create the schedule `name`, or change its spec, input and options.
    pub(crate) async fn put_schedule(
        &self,
        name: &str,
        spec: ScheduleSpec,
        input: Vec<u8>,
        options: RunOptions,
    ) -> Result<ScheduleInfo> {
        check_name(name)?;
        if options.run_at.is_some() {
            return Err(Error::InvalidSchedule(format!(
                "schedule {name:?} has a run_at option: its ticks give each run's start"
            )));
        }
        // Ticks commit outside a key's lock, and the record keeps no key.
        crate::coordination::keys::refuse_key(
            &options,
            &format!("schedule {name:?}"),
            "scheduled runs",
        )?;
        Self::check_submission(&options, &SettlementEffects::default())?;
        let key = schedule_kv_key(name);
        for _ in 0..CHANGE_RACE_RETRIES {
            let now = self.now_ms();
            // A timer with no tick after now would be stored and never
            // fire: refused (an interval past the end of time, a cron date
            // that never comes).
            if spec.ticks(now)?.after(now).is_none() {
                return Err(Error::InvalidSchedule(format!(
                    "schedule {name:?} ({spec}) has no tick after now: it would never fire"
                )));
            }
            let existing = read(&self.view, name).await?;
            let record = match &existing {
                Some((old, _)) => {
                    self.check_owner(old)?;
                    let mut record = old.clone();
                    if old.spec.when != spec.when {
                        // A new timer counts from now: ticks of the old one
                        // not fired yet are not caught up.
                        record.anchor_ms = now;
                        record.next_fire_ms = spec.ticks(now)?.after(now);
                    }
                    record.spec = spec.clone();
                    record.input = input.clone();
                    record.headers = options.headers.clone();
                    record.priority = options.priority;
                    record.max_attempts_per_step = options.max_attempts_per_step;
                    record.updated_at_ms = now;
                    record
                }
                None => DurableSchedule {
                    name: name.to_string(),
                    queue_name: self.queue_name.clone(),
                    spec: spec.clone(),
                    input: input.clone(),
                    headers: options.headers.clone(),
                    priority: options.priority,
                    max_attempts_per_step: options.max_attempts_per_step,
                    anchor_ms: now,
                    next_fire_ms: spec.ticks(now)?.after(now),
                    paused: false,
                    created_at_ms: now,
                    updated_at_ms: now,
                    last_fired_ms: None,
                    last_run_id: None,
                    fired: 0,
                },
            };
            let encoded = durable::encode(&record);
            if encoded.len() > MAX_KV_VALUE_SIZE {
                return Err(Error::InvalidSchedule(format!(
                    "schedule {name:?} is {} bytes stored (its input is {} bytes), more than the {MAX_KV_VALUE_SIZE} bytes a record may hold",
                    encoded.len(),
                    input.len()
                )));
            }
            let expected = existing.as_ref().map(|(_, bytes)| bytes.as_slice());
            let effects = SettlementEffects::default().kv_put(key.clone(), encoded);
            if self
                .commits
                .compare_commit(&key, expected, effects)
                .await?
                .is_some()
            {
                return Ok(record.info());
            }
        }
        Err(Error::InvalidSchedule(format!(
            "schedule {name:?} kept changing while it was written; try again"
        )))
    }

    /// Pause (`paused`) or resume the schedule `name`. A resumed schedule
    /// fires next at its first tick after now: the ticks it was paused
    /// over are not caught up.
    pub(crate) async fn set_schedule_paused(
        &self,
        name: &str,
        paused: bool,
    ) -> Result<ScheduleInfo> {
        let key = schedule_kv_key(name);
        for _ in 0..CHANGE_RACE_RETRIES {
            let Some((old, bytes)) = read(&self.view, name).await? else {
                return Err(Error::ScheduleNotFound(name.to_string()));
            };
            self.check_owner(&old)?;
            if old.paused == paused {
                return Ok(old.info());
            }
            let now = self.now_ms();
            let mut record = old;
            record.paused = paused;
            record.updated_at_ms = now;
            if !paused {
                record.next_fire_ms = record.spec.ticks(record.anchor_ms)?.after(now);
            }
            let effects =
                SettlementEffects::default().kv_put(key.clone(), durable::encode(&record));
            if self
                .commits
                .compare_commit(&key, Some(&bytes), effects)
                .await?
                .is_some()
            {
                return Ok(record.info());
            }
        }
        Err(Error::InvalidSchedule(format!(
            "schedule {name:?} kept changing while it was written; try again"
        )))
    }

    /// Delete the schedule `name`; `false` when there was none. Runs its
    /// ticks submitted are left alone.
    pub(crate) async fn delete_schedule(&self, name: &str) -> Result<bool> {
        let key = schedule_kv_key(name);
        for _ in 0..CHANGE_RACE_RETRIES {
            let Some((old, bytes)) = read(&self.view, name).await? else {
                return Ok(false);
            };
            self.check_owner(&old)?;
            if self.commits.kv_compare_delete(&key, &bytes).await? {
                return Ok(true);
            }
        }
        Err(Error::InvalidSchedule(format!(
            "schedule {name:?} kept changing while it was deleted; try again"
        )))
    }

    /// Refuse a change to another runtime's schedule.
    fn check_owner(&self, record: &DurableSchedule) -> Result<()> {
        if record.queue_name == self.queue_name {
            return Ok(());
        }
        Err(Error::InvalidSchedule(format!(
            "schedule {:?} belongs to the runtime of queue {:?}, not {:?}",
            record.name, record.queue_name, self.queue_name
        )))
    }
}
