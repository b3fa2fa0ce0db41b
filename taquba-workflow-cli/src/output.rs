//! The output layer: every command hands its answer here as a serializable
//! value plus its text form (a [`Table`] or a [`Card`]); [`Output`] prints
//! it as text, JSON or JSON lines. Times in text follow `--time-format`;
//! JSON carries them as the store does, milliseconds since the Unix epoch
//! (fields named `*_ms`).
//!
//! A closed stdout (`| head`) ends the output quietly.

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{ContentArrangement, Table as ComfyTable, presets};
use serde::Serialize;
use taquba_workflow::limits::MAX_RUN_AT_MS;

use crate::cli::{Format, TimeFormat};
use crate::error::CliResult;

/// How text shows times and durations.
#[derive(Debug, Clone, Copy)]
pub struct Times {
    format: TimeFormat,
    now_ms: u64,
}

impl Times {
    /// Times shown in `format`, relative to `now_ms`.
    pub fn new(format: TimeFormat, now_ms: u64) -> Self {
        Self { format, now_ms }
    }

    /// The time "now" is, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The current wall-clock time in ms since the Unix epoch.
    pub fn wall_clock_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// The time `at_ms` (ms since the Unix epoch): `3m 12s ago` / `in 40s`
    /// or RFC 3339.
    pub fn at(&self, at_ms: u64) -> String {
        match self.format {
            TimeFormat::Iso => iso(at_ms),
            TimeFormat::Relative if at_ms <= self.now_ms => {
                let ago = self.now_ms - at_ms;
                if ago < 1000 {
                    "just now".to_string()
                } else {
                    format!("{} ago", short_duration(ago))
                }
            }
            TimeFormat::Relative => format!("in {}", short_duration(at_ms - self.now_ms)),
        }
    }

    /// [`at`](Self::at) of an optional time, `-` for none.
    pub fn maybe_at(&self, at_ms: Option<u64>) -> String {
        at_ms.map_or_else(|| "-".to_string(), |ms| self.at(ms))
    }
}

/// `at_ms` as RFC 3339 in UTC with milliseconds; a time RFC 3339 cannot
/// write (past 9999-12-31, [`MAX_RUN_AT_MS`]) as its milliseconds, so a
/// stored far-future time is shown, never a panic.
pub fn iso(at_ms: u64) -> String {
    match UNIX_EPOCH.checked_add(Duration::from_millis(at_ms)) {
        Some(at) if at_ms <= MAX_RUN_AT_MS => humantime::format_rfc3339_millis(at).to_string(),
        _ => format!("{at_ms} ms after the epoch (past year 9999)"),
    }
}

/// A duration of `ms` cut to its two largest units: `850ms`, `12s`,
/// `3m 12s`, `2h 5m`, `3d 4h`.
pub fn short_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms / 1000;
    let units = [(86_400, "d"), (3600, "h"), (60, "m"), (1, "s")];
    let mut parts = Vec::new();
    let mut rest = secs;
    for (size, name) in units {
        let n = rest / size;
        rest %= size;
        if n > 0 || !parts.is_empty() {
            parts.push((n, name));
        }
        if parts.len() == 2 {
            break;
        }
    }
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, name)| format!("{n}{name}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table: a header row and rows of cells, printed without borders with
/// columns aligned (as `kubectl get` does).
#[derive(Debug)]
pub struct Table {
    inner: ComfyTable,
    rows: usize,
}

impl Table {
    /// A table with these column headers.
    pub fn new(header: &[&str]) -> Self {
        let mut inner = ComfyTable::new();
        inner
            .load_preset(presets::NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled)
            .set_header(header.iter().map(|h| h.to_uppercase()));
        Self { inner, rows: 0 }
    }

    /// Add a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.inner.add_row(cells);
        self.rows += 1;
    }

    /// The table as text.
    pub fn render(&self) -> String {
        // comfy-table pads every cell by one space on each side: trim the
        // line ends so the output has no trailing blanks.
        self.inner
            .to_string()
            .lines()
            .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A key/value card with optional sections (a title line and indented
/// lines under it), as `temporal workflow describe` prints one.
#[derive(Debug, Default)]
pub struct Card {
    fields: Vec<(String, String)>,
    sections: Vec<(String, Vec<String>)>,
}

impl Card {
    /// An empty card.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `key: value`.
    pub fn field(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        self.fields.push((key.to_string(), value.into()));
        self
    }

    /// Add `key: value` when `value` is `Some`.
    pub fn field_opt(&mut self, key: &str, value: Option<impl Into<String>>) -> &mut Self {
        if let Some(value) = value {
            self.field(key, value);
        }
        self
    }

    /// Add a section: a title and its lines (printed indented).
    pub fn section(&mut self, title: &str, lines: Vec<String>) -> &mut Self {
        self.sections.push((title.to_string(), lines));
        self
    }

    fn render(&self) -> String {
        let width = self
            .fields
            .iter()
            .map(|(key, _)| key.chars().count())
            .max()
            .unwrap_or(0);
        let mut out = String::new();
        for (key, value) in &self.fields {
            let mut lines = value.lines();
            let first = lines.next().unwrap_or("");
            out.push_str(&format!(
                "{key:<width$}  {first}",
                width = width + 1,
                key = format!("{key}:")
            ));
            out.push('\n');
            for line in lines {
                out.push_str(&format!("{:width$}  {line}\n", "", width = width + 1));
            }
        }
        for (title, lines) in &self.sections {
            out.push('\n');
            out.push_str(title);
            out.push('\n');
            for line in lines {
                out.push_str("  ");
                out.push_str(line);
                out.push('\n');
            }
        }
        out.trim_end().to_string()
    }
}

/// Where answers go: stdout, in the chosen format.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    format: Format,
    time_format: TimeFormat,
}

impl Output {
    /// Print in `format`, times in `time_format` relative to the moment
    /// each answer is printed.
    pub fn new(format: Format, time_format: TimeFormat) -> Self {
        Self {
            format,
            time_format,
        }
    }

    /// The time formatting of text output.
    pub fn times(&self) -> Times {
        Times::new(self.time_format, Times::wall_clock_ms())
    }

    /// The output format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Print a listing: `items` as a JSON array, or one JSON object per
    /// line, or the `table` with an optional `footer` line (text, on stdout
    /// after a blank line).
    ///
    /// # Errors
    /// Writing stdout failed (other than a closed pipe).
    pub fn list<T: Serialize>(
        &self,
        items: &[T],
        table: impl FnOnce(&Times) -> Table,
        footer: Option<String>,
    ) -> CliResult<()> {
        match self.format {
            Format::Json => emit(&json_pretty(&items)),
            Format::Jsonl => {
                let lines: Vec<String> = items.iter().map(json_line).collect();
                emit(&lines.join("\n"))
            }
            Format::Text => {
                let table = table(&self.times());
                let mut text = if table.rows == 0 {
                    String::new()
                } else {
                    table.render()
                };
                if let Some(footer) = footer {
                    if !text.is_empty() {
                        text.push_str("\n\n");
                    }
                    text.push_str(&footer);
                }
                emit(&text)
            }
        }
    }

    /// Print one answer: `item` as JSON (pretty for `json`, one line for
    /// `jsonl`) or the `card`.
    ///
    /// # Errors
    /// Writing stdout failed (other than a closed pipe).
    pub fn one<T: Serialize>(&self, item: &T, card: impl FnOnce(&Times) -> Card) -> CliResult<()> {
        match self.format {
            Format::Json => emit(&json_pretty(item)),
            Format::Jsonl => emit(&json_line(item)),
            Format::Text => emit(&card(&self.times()).render()),
        }
    }
}

fn json_pretty<T: Serialize + ?Sized>(value: &T) -> String {
    // Serializing plain data (strings, numbers, maps with string keys)
    // cannot fail.
    serde_json::to_string_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

fn json_line<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()))
}

/// Write `text` and a newline to stdout; a closed pipe is not an error.
fn emit(text: &str) -> CliResult<()> {
    if text.is_empty() {
        return Ok(());
    }
    let mut out = io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_two_largest_units() {
        assert_eq!(short_duration(850), "850ms");
        assert_eq!(short_duration(12_400), "12s");
        assert_eq!(short_duration(192_000), "3m 12s");
        assert_eq!(short_duration(3_600_000 + 5 * 60_000 + 7_000), "1h 5m");
        assert_eq!(short_duration(3 * 86_400_000 + 4 * 3_600_000 + 1), "3d 4h");
        // A zero middle unit is not shown.
        assert_eq!(short_duration(86_400_000 + 30_000), "1d");
        assert_eq!(short_duration(3_600_000 + 30_000), "1h");
    }

    #[test]
    fn times_are_relative_or_iso() {
        let now = 1_700_000_000_000;
        let relative = Times::new(TimeFormat::Relative, now);
        assert_eq!(relative.at(now - 192_000), "3m 12s ago");
        assert_eq!(relative.at(now + 40_000), "in 40s");
        assert_eq!(relative.at(now - 10), "just now");
        assert_eq!(relative.maybe_at(None), "-");
        let iso = Times::new(TimeFormat::Iso, now);
        assert_eq!(iso.at(now), "2023-11-14T22:13:20.000Z");
        assert_eq!(iso.at(MAX_RUN_AT_MS), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn far_future_times_are_shown_not_panicked_on() {
        let iso = Times::new(TimeFormat::Iso, 1_700_000_000_000);
        for at in [MAX_RUN_AT_MS + 1, u64::MAX - 1, u64::MAX] {
            let text = iso.at(at);
            assert!(text.contains(&at.to_string()), "{text}");
            assert!(text.contains("past year 9999"), "{text}");
        }
        let relative = Times::new(TimeFormat::Relative, 1_700_000_000_000);
        assert!(relative.at(u64::MAX).starts_with("in "));
    }

    #[test]
    fn tables_align_columns_without_borders() {
        let mut table = Table::new(&["status", "run id"]);
        table.row(vec!["running".into(), "a".into()]);
        table.row(vec!["ok".into(), "bbb".into()]);
        assert_eq!(table.render(), "STATUS   RUN ID\nrunning  a\nok       bbb");
    }

    #[test]
    fn cards_align_values_and_indent_sections() {
        let mut card = Card::new();
        card.field("Run", "r1").field("State", "running\nsince now");
        card.field_opt("Group", None::<String>);
        card.section("Headers", vec!["a = b".into()]);
        assert_eq!(
            card.render(),
            "Run:    r1\nState:  running\n        since now\n\nHeaders\n  a = b"
        );
    }
}
