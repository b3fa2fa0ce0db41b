//! A schedule as presented ([`ScheduleJson`]): its timer, zone, catch-up
//! policy, whether it is paused, its next tick (UTC and local) and its
//! last fired tick.

use serde::Serialize;
use taquba_workflow::schedule::ScheduleInfo;

/// A schedule, as printed and rendered.
#[derive(Debug, Clone, Serialize)]
pub struct ScheduleJson {
    /// Its name.
    pub name: String,
    /// The runtime queue whose worker fires it.
    pub queue: String,
    /// The cron expression (absent for an interval).
    pub cron: Option<String>,
    /// The interval in ms (absent for a cron expression).
    pub interval_ms: Option<u64>,
    /// The time zone of the cron expression (absent for an interval).
    pub zone: Option<String>,
    /// `cron "0 9 * * *" in Europe/Paris` or `every 15m`.
    pub when: String,
    /// `skip`, `one` or `all`.
    pub catch_up: String,
    /// Whether it is paused.
    pub paused: bool,
    /// Its next tick, ms since the Unix epoch (absent while paused).
    pub next_fire_ms: Option<u64>,
    /// Its next tick as RFC 3339 in its zone.
    pub next_fire_local: Option<String>,
    /// The last tick fired, ms.
    pub last_fired_ms: Option<u64>,
    /// The run of the last tick fired.
    pub last_run_id: Option<String>,
    /// Ticks fired.
    pub fired: u64,
    /// The size of every tick's run input, in bytes.
    pub input_bytes: usize,
    /// When it was created, ms.
    pub created_at_ms: u64,
    /// When it was last changed or fired, ms.
    pub updated_at_ms: u64,
}

impl From<&ScheduleInfo> for ScheduleJson {
    fn from(s: &ScheduleInfo) -> Self {
        let when = s.spec.to_string();
        let when = when
            .split_once(", catch-up")
            .map_or(when.clone(), |(when, _)| when.to_string());
        Self {
            name: s.name.clone(),
            queue: s.queue_name.clone(),
            cron: s.spec.expression().map(str::to_string),
            interval_ms: s
                .spec
                .interval()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            zone: s.spec.zone().map(str::to_string),
            when,
            catch_up: s.spec.catch_up_policy().to_string(),
            paused: s.paused,
            next_fire_ms: s.next_fire_ms,
            next_fire_local: s.next_fire_local(),
            last_fired_ms: s.last_fired_ms,
            last_run_id: s.last_run_id.as_ref().map(ToString::to_string),
            fired: s.fired,
            input_bytes: s.input_len,
            created_at_ms: s.created_at_ms,
            updated_at_ms: s.updated_at_ms,
        }
    }
}
