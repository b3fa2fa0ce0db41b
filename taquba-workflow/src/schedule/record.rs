//! The stored schedule (`workflow/schedules/{name}` in the queue's KV
//! namespace, MessagePack with named fields) and what the API reports of
//! it ([`ScheduleInfo`]).

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::model::RunOptions;
use crate::schedule::spec::ScheduleSpec;
use crate::store::keys::RunId;

/// A schedule as stored. Fields added later are `#[serde(default)]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DurableSchedule {
    pub(crate) name: String,
    /// The runtime queue whose worker fires it (runtimes over one store
    /// share the KV namespace; each fires its own schedules).
    pub(crate) queue_name: String,
    pub(crate) spec: ScheduleSpec,
    /// The run input of every tick.
    #[serde(with = "serde_bytes")]
    pub(crate) input: Vec<u8>,
    #[serde(default)]
    pub(crate) headers: HashMap<String, String>,
    #[serde(default)]
    pub(crate) priority: Option<u32>,
    #[serde(default)]
    pub(crate) max_attempts_per_step: Option<u32>,
    /// Where an interval's ticks are counted from (ms): when the schedule
    /// was created or its spec last changed.
    pub(crate) anchor_ms: u64,
    /// The first tick not yet fired or skipped (ms); `None` when the timer
    /// has no further tick.
    pub(crate) next_fire_ms: Option<u64>,
    #[serde(default)]
    pub(crate) paused: bool,
    pub(crate) created_at_ms: u64,
    pub(crate) updated_at_ms: u64,
    /// The last tick fired and its run.
    #[serde(default)]
    pub(crate) last_fired_ms: Option<u64>,
    #[serde(default)]
    pub(crate) last_run_id: Option<String>,
    /// Ticks fired.
    #[serde(default)]
    pub(crate) fired: u64,
}

impl DurableSchedule {
    /// The run options of every tick.
    pub(crate) fn run_options(&self) -> RunOptions {
        RunOptions {
            headers: self.headers.clone(),
            priority: self.priority,
            max_attempts_per_step: self.max_attempts_per_step,
            run_at: None,
            concurrency_key: None,
            concurrency_limit: None,
        }
    }

    /// What the API reports.
    pub(crate) fn info(&self) -> ScheduleInfo {
        ScheduleInfo {
            name: self.name.clone(),
            queue_name: self.queue_name.clone(),
            spec: self.spec.clone(),
            paused: self.paused,
            next_fire_ms: if self.paused { None } else { self.next_fire_ms },
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            last_fired_ms: self.last_fired_ms,
            last_run_id: self
                .last_run_id
                .as_deref()
                .and_then(|id| RunId::new(id).ok()),
            fired: self.fired,
            input_len: self.input.len(),
            options: self.run_options(),
        }
    }
}

/// A schedule as the runtime and its view report it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The runtime queue whose worker fires it.
    pub queue_name: String,
    /// When it fires and its catch-up policy.
    pub spec: ScheduleSpec,
    /// Whether it is paused (no tick fires; [`next_fire_ms`](Self::next_fire_ms)
    /// is `None`).
    pub paused: bool,
    /// Its next tick, ms since the UNIX epoch (UTC); `None` while paused or
    /// when the cron expression never matches again.
    pub next_fire_ms: Option<u64>,
    /// When it was created, ms since the UNIX epoch.
    pub created_at_ms: u64,
    /// When it was last created, changed, paused, resumed or fired, ms.
    pub updated_at_ms: u64,
    /// The last tick fired, ms since the UNIX epoch.
    pub last_fired_ms: Option<u64>,
    /// The run of the last tick fired.
    pub last_run_id: Option<RunId>,
    /// Ticks fired since it was created.
    pub fired: u64,
    /// The size of the run input every tick submits, in bytes.
    pub input_len: usize,
    /// The run options every tick submits with.
    pub options: RunOptions,
}

impl ScheduleInfo {
    /// The next tick as RFC 3339 in UTC (`2026-12-02T09:00:00Z`).
    pub fn next_fire_utc(&self) -> Option<String> {
        let at = DateTime::<Utc>::from_timestamp_millis(i64::try_from(self.next_fire_ms?).ok()?)?;
        Some(at.to_rfc3339_opts(SecondsFormat::Secs, true))
    }

    /// The next tick as RFC 3339 in the schedule's zone
    /// (`2026-12-02T10:00:00+01:00` in `Europe/Paris`); in UTC for an
    /// interval.
    pub fn next_fire_local(&self) -> Option<String> {
        let at = DateTime::<Utc>::from_timestamp_millis(i64::try_from(self.next_fire_ms?).ok()?)?;
        let zone: chrono_tz::Tz = self.spec.zone().unwrap_or("UTC").parse().ok()?;
        Some(
            zone.from_utc_datetime(&at.naive_utc())
                .to_rfc3339_opts(SecondsFormat::Secs, true),
        )
    }
}
