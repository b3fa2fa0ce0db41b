//! The page shell (head, navigation, footer) and the small pieces every
//! page uses: status badges, times, payloads, progress bars, the form
//! token, and the live region htmx refreshes. Every value goes through
//! maud's escaping; nothing here writes raw HTML from data.

use maud::{DOCTYPE, Markup, html};

use crate::output::{Times, iso};
use crate::payload::Decoded;
use crate::ui::app::App;
use crate::ui::assets;

/// The navigation entry a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// The run list and a run.
    Runs,
    /// Groups.
    Groups,
    /// Dead letters.
    DeadLetters,
    /// Schedules.
    Schedules,
    /// Concurrency keys.
    Keys,
    /// The store.
    Store,
    /// The signal form.
    Signal,
    /// None (an error page).
    None,
}

/// How often a live region is refreshed while what it shows can change.
pub const REFRESH_EVERY: &str = "2s";

/// A whole page of the dashboard: `title` in the head and as the heading,
/// `body` under it.
pub fn page(app: &App, section: Section, title: &str, body: Markup) -> Markup {
    shell(Some(app), section, title, body)
}

/// The page of a failed request.
pub fn error_page(title: &str, message: &str) -> Markup {
    shell(
        None,
        Section::None,
        title,
        html! {
            p.error-message { (message) }
            p { a href="/runs" { "Back to the runs" } }
        },
    )
}

fn shell(app: Option<&App>, section: Section, title: &str, body: Markup) -> Markup {
    let nav = [
        (Section::Runs, "/runs", "Runs"),
        (Section::Groups, "/groups", "Groups"),
        (Section::DeadLetters, "/dead-letters", "Dead letters"),
        (Section::Schedules, "/schedules", "Schedules"),
        (Section::Keys, "/keys", "Keys"),
        (Section::Store, "/store", "Store"),
        (Section::Signal, "/signal", "Signal"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // htmx must not inject a <style> element: the CSP allows
                // only the dashboard's stylesheet.
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false}"#;
                title { (title) " · taquba-workflow" }
                link rel="icon" href=(assets::ICON_PATH) type="image/svg+xml";
                link rel="stylesheet" href=(assets::STYLE_PATH);
                script src=(assets::HTMX_PATH) defer {}
            }
            body {
                header.top {
                    a.brand href="/runs" { "taquba-workflow" }
                    nav {
                        @for (entry, href, label) in nav {
                            a href=(href) class=[(entry == section).then_some("current")] { (label) }
                        }
                    }
                    @if let Some(app) = app {
                        div.where {
                            span.store title="The store and the queue's path in it" { (app.store_label()) }
                            @if app.read_only {
                                span.badge.b-readonly title="--read-only: no actions" { "read-only" }
                            }
                            @if app.auth.is_some() {
                                form.logout method="post" action="/logout" {
                                    button type="submit" #logout title="End this browser's session" { "Log out" }
                                }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
                footer {
                    "Reads go through a read-only QueueReader and show what the owning process flushed (about half a second behind). "
                    "Cancel, signal, requeue, fork and restart are commands in the owner's inbox: it applies them at its next maintenance round. "
                    "taquba-workflow " (env!("CARGO_PKG_VERSION")) ", htmx " (assets::HTMX_VERSION) "."
                }
            }
        }
    }
}

/// A region htmx replaces with the same region of `poll` every
/// [`REFRESH_EVERY`] while `poll` is `Some` (what it shows can still
/// change); a refreshed region without `poll` ends the refreshing.
pub fn live(poll: Option<&str>, body: Markup) -> Markup {
    let trigger = poll.map(|_| format!("every {REFRESH_EVERY}"));
    html! {
        div #live data-refresh=(if poll.is_some() { "on" } else { "off" })
            hx-get=[poll] hx-trigger=[trigger] hx-select="#live" hx-swap="outerHTML" {
            (body)
        }
    }
}

/// A state word as a coloured badge.
pub fn badge(word: &str) -> Markup {
    html! { span class={ "badge b-" (word) } { (word) } }
}

/// A time (ms since the Unix epoch) relative to now, exact on hover.
pub fn time(times: &Times, at_ms: u64) -> Markup {
    let exact = iso(at_ms);
    html! { time datetime=(exact) title=(exact) { (times.at(at_ms)) } }
}

/// [`time`] of an optional time, `-` for none.
pub fn maybe_time(times: &Times, at_ms: Option<u64>) -> Markup {
    match at_ms {
        Some(at) => time(times, at),
        None => html! { span.none { "-" } },
    }
}

/// Stored bytes, decoded, in a block with how they were decoded.
pub fn payload(decoded: &Decoded) -> Markup {
    html! {
        figure.payload {
            figcaption { (decoded.encoding()) }
            pre { code { (decoded.pretty()) } }
        }
    }
}

/// A multi-line text (an error) as preformatted text.
pub fn text_block(text: &str) -> Markup {
    html! { pre.text { (text) } }
}

/// The hidden form field carrying the form token.
pub fn token_field(app: &App) -> Markup {
    html! { input type="hidden" name="csrf" value=(app.guard.token()); }
}

/// A bar of segments, each `(class, count, label)`, as wide as its share
/// of `total` (an SVG: its widths are attributes, which the CSP allows).
pub fn bar(total: usize, segments: &[(&str, usize, &str)]) -> Markup {
    let total = total.max(segments.iter().map(|s| s.1).sum()).max(1) as f64;
    let mut x = 0.0;
    let mut rects = Vec::new();
    for (class, count, label) in segments {
        if *count == 0 {
            continue;
        }
        let width = *count as f64 / total * 100.0;
        rects.push((class.to_string(), x, width, format!("{count} {label}")));
        x += width;
    }
    html! {
        svg.bar viewBox="0 0 100 10" preserveAspectRatio="none" role="img" {
            rect.track x="0" y="0" width="100" height="10" {}
            @for (class, x, width, label) in &rects {
                rect class=(class) x=(format!("{x:.2}")) y="0" width=(format!("{width:.2}")) height="10" {
                    title { (label) }
                }
            }
        }
    }
}
