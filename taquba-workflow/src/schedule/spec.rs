//! When a schedule fires: [`ScheduleSpec`] (a cron expression in a time
//! zone, or a fixed interval), its [`CatchUp`] policy, the validation of
//! both and of schedule names, and the tick arithmetic (the tick after a
//! time, the ticks due up to a time). Cron expressions are parsed and
//! evaluated by `croner`, zones are `chrono-tz`'s IANA database.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_LEN: usize = 64;
/// The shortest interval of [`ScheduleSpec::every`]: one second.
pub const MIN_SCHEDULE_INTERVAL: Duration = Duration::from_secs(1);
/// The most due ticks one maintenance round fires for a schedule under
/// [`CatchUp::All`] after a downtime: the latest 100 (on-time ticks
/// included); older missed ticks are skipped.
pub const MAX_CATCH_UP_TICKS: usize = 100;
/// How late a tick may be found and still count as on time: a tick the
/// worker finds under 60 s past its time (the worker looks for due ticks
/// every [`poll_interval`](crate::WorkflowRuntimeBuilder::poll_interval))
/// fires whatever the [`CatchUp`] policy; one found 60 s or more past its
/// time is missed, and the policy decides.
pub const MISFIRE_THRESHOLD: Duration = Duration::from_secs(60);

/// What a schedule does with the ticks it missed while no worker ran (a
/// downtime, a stopped process): the ticks a maintenance round finds
/// [`MISFIRE_THRESHOLD`] or more past their time. The ticks it finds under
/// that are on time and each fire, under every policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// Fire none of the missed ticks (the on-time ones still fire): after
    /// a downtime the next run is at the first tick under
    /// [`MISFIRE_THRESHOLD`] late.
    Skip,
    /// Fire one run for all the missed ticks, as of the latest of them
    /// (the default); the on-time ones fire each after it.
    #[default]
    One,
    /// Fire every missed tick, oldest first (then the on-time ones), at
    /// most [`MAX_CATCH_UP_TICKS`] ticks in all (the latest ones).
    All,
}

impl CatchUp {
    /// The policy's name: `skip`, `one` or `all`.
    pub fn as_str(self) -> &'static str {
        match self {
            CatchUp::Skip => "skip",
            CatchUp::One => "one",
            CatchUp::All => "all",
        }
    }
}

impl std::fmt::Display for CatchUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CatchUp {
    type Err = Error;

    /// `skip`, `one` or `all`.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] naming the value.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(CatchUp::Skip),
            "one" => Ok(CatchUp::One),
            "all" => Ok(CatchUp::All),
            other => Err(Error::InvalidSchedule(format!(
                "catch-up policy {other:?} is not one of `skip`, `one`, `all`"
            ))),
        }
    }
}

/// When a schedule fires: a cron expression evaluated in a time zone
/// ([`cron`](Self::cron), [`in_zone`](Self::in_zone)) or a fixed interval
/// ([`every`](Self::every)), with the [`CatchUp`] policy for missed ticks
/// ([`catch_up`](Self::catch_up)). Validated when built, so a spec that
/// exists is one the runtime can evaluate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub(crate) when: When,
    pub(crate) catch_up: CatchUp,
}

/// The timer of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum When {
    /// A cron expression (5 fields, or 6 with seconds first) in an IANA
    /// zone.
    Cron { expression: String, zone: String },
    /// Every `interval_ms`, counted from when the schedule was created (or
    /// its spec last changed).
    Every { interval_ms: u64 },
}

impl ScheduleSpec {
    /// Fire on the cron `expression`: 5 fields (minute, hour, day of month,
    /// month, day of week) or 6 with seconds first, with croner's
    /// extensions (`L`, `W`, `#`, names, `@daily` and the like), evaluated
    /// in UTC until [`in_zone`](Self::in_zone) names a zone.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] naming the expression and what is wrong
    /// with it.
    pub fn cron(expression: &str) -> Result<Self> {
        parse_cron(expression)?;
        Ok(Self {
            when: When::Cron {
                expression: expression.trim().to_string(),
                zone: "UTC".to_string(),
            },
            catch_up: CatchUp::default(),
        })
    }

    /// Fire every `interval` (at least [`MIN_SCHEDULE_INTERVAL`], whole
    /// milliseconds), the first tick one interval after the schedule is
    /// created. A time zone does not apply.
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] naming the interval when it is under a
    /// second (zero included).
    pub fn every(interval: Duration) -> Result<Self> {
        if interval < MIN_SCHEDULE_INTERVAL {
            return Err(Error::InvalidSchedule(format!(
                "interval {interval:?} is shorter than the shortest interval, {MIN_SCHEDULE_INTERVAL:?}"
            )));
        }
        let interval_ms = u64::try_from(interval.as_millis())
            .map_err(|_| Error::InvalidSchedule(format!("interval {interval:?} is too long")))?;
        Ok(Self {
            when: When::Every { interval_ms },
            catch_up: CatchUp::default(),
        })
    }

    /// Evaluate the cron expression in the IANA zone `zone`
    /// (`"Europe/Paris"`, `"America/New_York"`, `"UTC"`): `0 9 * * *` fires
    /// at 09:00 local time, across daylight-saving changes (croner's rules:
    /// a fixed time the clocks skip fires right after the gap, one they
    /// repeat fires once; wildcard and step fields follow the wall clock).
    ///
    /// # Errors
    /// [`Error::InvalidSchedule`] naming the zone when the database has no
    /// such zone, or when the spec is an interval (a zone does not apply).
    pub fn in_zone(mut self, zone: &str) -> Result<Self> {
        let parsed = parse_zone(zone)?;
        match &mut self.when {
            When::Cron { zone, .. } => *zone = parsed.name().to_string(),
            When::Every { .. } => {
                return Err(Error::InvalidSchedule(format!(
                    "time zone {zone:?} given to an interval schedule: a zone applies to cron expressions only"
                )));
            }
        }
        Ok(self)
    }

    /// What to do with the ticks missed while no worker ran, those found
    /// [`MISFIRE_THRESHOLD`] or more past their time (default
    /// [`CatchUp::One`]); on-time ticks fire under every policy.
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// The catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// The cron expression, `None` for an interval.
    pub fn expression(&self) -> Option<&str> {
        match &self.when {
            When::Cron { expression, .. } => Some(expression),
            When::Every { .. } => None,
        }
    }

    /// The time zone of a cron expression (`"UTC"` unless
    /// [`in_zone`](Self::in_zone) named one), `None` for an interval.
    pub fn zone(&self) -> Option<&str> {
        match &self.when {
            When::Cron { zone, .. } => Some(zone),
            When::Every { .. } => None,
        }
    }

    /// The interval, `None` for a cron expression.
    pub fn interval(&self) -> Option<Duration> {
        match &self.when {
            When::Every { interval_ms } => Some(Duration::from_millis(*interval_ms)),
            When::Cron { .. } => None,
        }
    }

    /// The timer, evaluable (the record it was read from may be of another
    /// build: its expression and zone are parsed again).
    pub(crate) fn ticks(&self, anchor_ms: u64) -> Result<Ticks> {
        Ok(match &self.when {
            When::Cron { expression, zone } => Ticks::Cron {
                cron: Box::new(parse_cron(expression)?),
                zone: parse_zone(zone)?,
            },
            When::Every { interval_ms } => Ticks::Every {
                interval_ms: (*interval_ms).max(1),
                anchor_ms,
            },
        })
    }
}

impl std::fmt::Display for ScheduleSpec {
    /// `cron "0 9 * * *" in Europe/Paris` or `every 15m`; with the catch-up
    /// policy.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.when {
            When::Cron { expression, zone } => write!(f, "cron {expression:?} in {zone}")?,
            When::Every { interval_ms } => write!(f, "every {}", interval_text(*interval_ms))?,
        }
        write!(f, ", catch-up {}", self.catch_up)
    }
}

/// An interval as `90s`, `15m`, `2h`, `1d` or `1500ms`, the largest unit
/// that divides it.
fn interval_text(ms: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

fn parse_cron(expression: &str) -> Result<Cron> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expression)
        .map_err(|err| {
            Error::InvalidSchedule(format!("cron expression {expression:?} is invalid: {err}"))
        })
}

fn parse_zone(zone: &str) -> Result<Tz> {
    Tz::from_str(zone).map_err(|_| {
        Error::InvalidSchedule(format!(
            "time zone {zone:?} is not in the IANA time zone database (for example \"Europe/Paris\", \"UTC\")"
        ))
    })
}

/// Check a schedule name: 1 to [`MAX_SCHEDULE_NAME_LEN`] bytes of
/// `[A-Za-z0-9_-]` (a name is part of its ticks' run ids and its KV key).
///
/// # Errors
/// [`Error::InvalidSchedule`] naming the name and the rule it breaks.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let broken = if name.is_empty() {
        Some("it is empty".to_string())
    } else if name.len() > MAX_SCHEDULE_NAME_LEN {
        Some(format!(
            "it is {} bytes long, more than {MAX_SCHEDULE_NAME_LEN}",
            name.len()
        ))
    } else {
        name.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
            .map(|c| format!("{c:?} is not one of [A-Za-z0-9_-]"))
    };
    match broken {
        Some(reason) => Err(Error::InvalidSchedule(format!(
            "schedule name {name:?} is invalid: {reason}"
        ))),
        None => Ok(()),
    }
}

/// A spec's ticks, evaluable.
pub(crate) enum Ticks {
    Cron { cron: Box<Cron>, zone: Tz },
    Every { interval_ms: u64, anchor_ms: u64 },
}

/// `ms` in `zone`, cut to the whole second (cron ticks are whole seconds,
/// and croner compares whole seconds).
fn to_zoned(ms: u64, zone: Tz) -> Option<DateTime<Tz>> {
    let utc = DateTime::<Utc>::from_timestamp_millis(i64::try_from(ms - ms % 1_000).ok()?)?;
    Some(zone.from_utc_datetime(&utc.naive_utc()))
}

fn to_ms(at: &DateTime<Tz>) -> Option<u64> {
    u64::try_from(at.timestamp_millis()).ok()
}

impl Ticks {
    /// The first tick strictly after `ms`; `None` when there is none
    /// (a cron expression that never matches again).
    pub(crate) fn after(&self, ms: u64) -> Option<u64> {
        match self {
            Ticks::Cron { cron, zone } => {
                let at = to_zoned(ms, *zone)?;
                to_ms(&cron.find_next_occurrence(&at, false).ok()?)
            }
            Ticks::Every {
                interval_ms,
                anchor_ms,
            } => {
                if ms < *anchor_ms {
                    return anchor_ms.checked_add(*interval_ms);
                }
                let elapsed = ms - anchor_ms;
                let k = elapsed / interval_ms + 1;
                anchor_ms.checked_add(k.checked_mul(*interval_ms)?)
            }
        }
    }

    /// The last tick at or before `ms`; `None` when there is none.
    pub(crate) fn at_or_before(&self, ms: u64) -> Option<u64> {
        match self {
            Ticks::Cron { cron, zone } => {
                let at = to_zoned(ms, *zone)?;
                to_ms(&cron.find_previous_occurrence(&at, true).ok()?)
            }
            Ticks::Every {
                interval_ms,
                anchor_ms,
            } => {
                let elapsed = ms.checked_sub(*anchor_ms)?;
                let k = elapsed / interval_ms;
                (k > 0).then(|| anchor_ms + k * interval_ms)
            }
        }
    }

    /// The ticks in `from..=to`, latest `limit` of them, oldest first; and
    /// whether older ones were left out.
    pub(crate) fn due(&self, from: u64, to: u64, limit: usize) -> (Vec<u64>, bool) {
        let mut ticks = Vec::new();
        let mut cursor = self.at_or_before(to);
        while let Some(tick) = cursor.filter(|tick| *tick >= from) {
            if ticks.len() == limit {
                ticks.reverse();
                return (ticks, true);
            }
            ticks.push(tick);
            // Strictly earlier, whatever the timer answers.
            cursor = tick
                .checked_sub(1)
                .and_then(|before| self.at_or_before(before))
                .filter(|earlier| *earlier < tick);
        }
        ticks.reverse();
        (ticks, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2024-03-31 00:00:00 UTC: the night Europe/Paris moves to summer time
    // (02:00 local becomes 03:00).
    const MARCH_31: u64 = 1_711_843_200_000;
    const HOUR: u64 = 3_600_000;

    #[test]
    fn bad_input_is_refused_naming_the_value() {
        let err = ScheduleSpec::cron("61 * * * *").unwrap_err().to_string();
        assert!(err.contains("\"61 * * * *\""), "{err}");
        let err = ScheduleSpec::cron("0 9 * * *")
            .unwrap()
            .in_zone("Mars/Olympus")
            .unwrap_err()
            .to_string();
        assert!(err.contains("Mars/Olympus"), "{err}");
        let err = ScheduleSpec::every(Duration::ZERO).unwrap_err().to_string();
        assert!(err.contains("0ns"), "{err}");
        let err = ScheduleSpec::every(Duration::from_secs(60))
            .unwrap()
            .in_zone("UTC")
            .unwrap_err()
            .to_string();
        assert!(err.contains("interval"), "{err}");
        assert!(check_name("nightly_report-2").is_ok());
        for bad in ["", "a b", "é", &"x".repeat(65)] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        assert!(
            "most"
                .parse::<CatchUp>()
                .unwrap_err()
                .to_string()
                .contains("most")
        );
    }

    #[test]
    fn cron_ticks_follow_the_zone_across_daylight_saving() {
        let spec = ScheduleSpec::cron("30 2 * * *")
            .unwrap()
            .in_zone("Europe/Paris")
            .unwrap();
        let ticks = spec.ticks(0).unwrap();
        // 02:30 does not exist on March 31 in Paris: it fires right after
        // the gap, at 03:00 CEST = 01:00 UTC.
        assert_eq!(ticks.after(MARCH_31), Some(MARCH_31 + HOUR));
        // The next day, 02:30 CEST = 00:30 UTC.
        assert_eq!(
            ticks.after(MARCH_31 + HOUR),
            Some(MARCH_31 + 24 * HOUR + HOUR / 2)
        );
        let utc = ScheduleSpec::cron("30 2 * * *").unwrap().ticks(0).unwrap();
        assert_eq!(utc.after(MARCH_31), Some(MARCH_31 + 2 * HOUR + HOUR / 2));
        assert_eq!(
            utc.at_or_before(MARCH_31 + 2 * HOUR + HOUR / 2),
            Some(MARCH_31 + 2 * HOUR + HOUR / 2)
        );
    }

    #[test]
    fn interval_ticks_count_from_the_anchor() {
        let ticks = ScheduleSpec::every(Duration::from_secs(10))
            .unwrap()
            .ticks(1_000)
            .unwrap();
        assert_eq!(ticks.after(1_000), Some(11_000));
        assert_eq!(ticks.after(11_000), Some(21_000));
        assert_eq!(ticks.at_or_before(10_999), None);
        assert_eq!(ticks.at_or_before(25_000), Some(21_000));
        assert_eq!(
            ticks.due(11_000, 45_000, 10),
            (vec![11_000, 21_000, 31_000, 41_000], false)
        );
        assert_eq!(ticks.due(11_000, 45_000, 2), (vec![31_000, 41_000], true));
        assert_eq!(ticks.due(50_000, 45_000, 2), (vec![], false));
    }
}
