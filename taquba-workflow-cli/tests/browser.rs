//! The dashboard in a real browser: headless Chromium driven over
//! WebDriver (chromedriver), against a store made by the main example
//! (`examples/word_report.rs`). It opens the runs page, follows a finished
//! run and sees its steps, follows a live run and sees its page refresh
//! by itself as steps commit, takes the screenshot the README shows,
//! cancels the live run from its page and sees it cancelled (and the
//! example, which owns the store, end).
//!
//! Opt-in, as it needs a browser: `bash .ci/browser.sh` installs Debian's
//! `chromium` and `chromium-driver`, builds the example and runs this
//! with `--features browser-test`. Its environment:
//!
//! - `WORD_REPORT_BIN`: the built `word_report` example (required);
//! - `CHROMEDRIVER` (default `/usr/bin/chromedriver`), `CHROMIUM`
//!   (default `/usr/bin/chromium`);
//! - `DASHBOARD_SCREENSHOT`: where to write the run page's PNG (default:
//!   `dashboard-run.png` in the target's test directory).
//!
//! Without them it says what is missing and passes, unless `CI` is set,
//! where it fails.

#[path = "cli/web.rs"]
mod web;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::web::Dashboard;

/// What the test needs from its machine.
struct Setup {
    word_report: PathBuf,
    chromedriver: PathBuf,
    chromium: PathBuf,
    screenshot: PathBuf,
}

impl Setup {
    /// The setup, or `None` (with the reason printed) when something is
    /// missing outside CI.
    fn from_env() -> Option<Self> {
        let path = |var: &str, default: Option<&str>| {
            std::env::var_os(var)
                .map(PathBuf::from)
                .or_else(|| default.map(PathBuf::from))
        };
        let word_report = path("WORD_REPORT_BIN", None);
        let chromedriver = path("CHROMEDRIVER", Some("/usr/bin/chromedriver"));
        let chromium = path("CHROMIUM", Some("/usr/bin/chromium"));
        let mut missing = Vec::new();
        match &word_report {
            Some(p) if p.is_file() => {}
            Some(p) => missing.push(format!("WORD_REPORT_BIN={} is not a file", p.display())),
            None => missing
                .push("WORD_REPORT_BIN (the built word_report example) is not set".to_string()),
        }
        for (name, found) in [("chromedriver", &chromedriver), ("chromium", &chromium)] {
            if !found.as_deref().is_some_and(Path::is_file) {
                missing.push(format!(
                    "no {name} at {} (apt-get install chromium chromium-driver)",
                    found.as_deref().unwrap_or(Path::new("?")).display()
                ));
            }
        }
        if !missing.is_empty() {
            let why = missing.join("; ");
            if std::env::var_os("CI").is_some() {
                panic!("the browser test cannot run in CI: {why}");
            }
            eprintln!("SKIPPED the browser test: {why}. Run it with `bash .ci/browser.sh`.");
            return None;
        }
        let screenshot = path("DASHBOARD_SCREENSHOT", None)
            .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-run.png"));
        Some(Self {
            word_report: word_report?,
            chromedriver: chromedriver?,
            chromium: chromium?,
            screenshot,
        })
    }
}

/// The repository's root (the example's default directory).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The run id the example printed (`submitted run ID over DIR`).
fn submitted(line: &str) -> Option<String> {
    line.strip_prefix("submitted run ")
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_string)
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Start chromedriver on a free port and wait until it answers.
async fn chromedriver(setup: &Setup) -> (Child, String) {
    let port = free_port();
    let child = Command::new(&setup.chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return (child, format!("http://127.0.0.1:{port}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not answer on port {port} within 20 s");
}

/// A headless Chromium session, with the flags this machine's closed
/// network needs (no background connections) and a fresh profile.
async fn browser(setup: &Setup, webdriver: &str, profile: &Path) -> Client {
    let args = [
        "--headless=new".to_string(),
        "--no-sandbox".to_string(),
        "--disable-gpu".to_string(),
        "--disable-dev-shm-usage".to_string(),
        "--disable-quic".to_string(),
        "--no-first-run".to_string(),
        "--disable-background-networking".to_string(),
        "--disable-component-update".to_string(),
        "--disable-sync".to_string(),
        "--window-size=1280,1100".to_string(),
        format!("--user-data-dir={}", profile.display()),
    ];
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), "chrome".into());
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": setup.chromium, "args": args }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(webdriver)
        .await
        .expect("a WebDriver session")
}

/// Wait (at most `secs`) for an element matching `css`.
async fn wait_for(client: &Client, css: &str, secs: u64) -> fantoccini::elements::Element {
    match client
        .wait()
        .at_most(Duration::from_secs(secs))
        .for_element(Locator::Css(css))
        .await
    {
        Ok(element) => element,
        Err(e) => {
            let source = client.source().await.unwrap_or_default();
            panic!("no {css:?} within {secs} s ({e}); the page:\n{source}");
        }
    }
}

/// Click the element matching `css`, again if a refresh replaced it
/// between finding and clicking.
async fn click(client: &Client, css: &str) {
    let mut last = None;
    for _ in 0..5 {
        let element = wait_for(client, css, 30).await;
        match element.click().await {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("cannot click {css:?}: {last:?}");
}

/// The number of elements matching `css` now.
async fn count(client: &Client, css: &str) -> usize {
    client
        .find_all(Locator::Css(css))
        .await
        .map(|found| found.len())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_browser() {
    let Some(setup) = Setup::from_env() else {
        return;
    };
    let store = tempfile::tempdir().unwrap();

    // A finished run of the main example, over a small directory.
    let small = repo().join("taquba-workflow-macros/src");
    let finished = Command::new(&setup.word_report)
        .arg(&small)
        .arg("--store")
        .arg(store.path())
        .output()
        .await
        .expect("run the example");
    let out = String::from_utf8_lossy(&finished.stdout);
    assert!(finished.status.success(), "the example failed:\n{out}");
    let done_id = out
        .lines()
        .find_map(submitted)
        .expect("the finished run's id");

    // A live run over the whole repository, one step every 400 ms: the
    // example owns the store while the dashboard reads it.
    let mut live = Command::new(&setup.word_report)
        .arg(repo())
        .arg("--store")
        .arg(store.path())
        .args(["--slow-ms", "400"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the live example");
    let mut lines = BufReader::new(live.stdout.take().expect("stdout")).lines();
    let live_id = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the example") {
            if let Some(id) = submitted(&line) {
                return id;
            }
        }
        panic!("the live example ended before submitting its run");
    })
    .await
    .expect("the live run was submitted within 60 s");
    // Keep draining its progress lines.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let ui = Dashboard::start(store.path(), &[]).await;
    let (_driver, webdriver) = chromedriver(&setup).await;
    let profile = tempfile::tempdir().unwrap();
    let client = browser(&setup, &webdriver, profile.path()).await;

    // The runs page lists both runs with their counts.
    client
        .goto(&format!("{}/runs", ui.base))
        .await
        .expect("open /runs");
    wait_for(&client, &format!("a[href='/runs/{live_id}']"), 30).await;
    let source = client.source().await.expect("the page");
    assert!(source.contains("succeeded"), "{source}");

    // Follow the finished run: its steps, its result.
    click(&client, &format!("a[href='/runs/{done_id}']")).await;
    wait_for(&client, "#run-state .b-succeeded", 30).await;
    let steps = count(&client, "ol.timeline li.step").await;
    assert!(steps >= 3, "{steps} steps shown");
    let text = client
        .find(Locator::Css("ol.timeline"))
        .await
        .expect("the timeline")
        .text()
        .await
        .expect("its text");
    for name in ["list", "count", "report"] {
        assert!(text.contains(name), "no step {name:?} in:\n{text}");
    }
    wait_for(&client, "figure.payload", 5).await;

    // Follow the live run: its page refreshes by itself as steps commit.
    click(&client, "header.top nav a[href='/runs']").await;
    click(&client, &format!("a[href='/runs/{live_id}']")).await;
    wait_for(&client, "#live[data-refresh='on']", 30).await;
    let mut seen = count(&client, "ol.timeline .attempt").await;
    let first = seen;
    for _ in 0..150 {
        if seen >= first + 2 && seen >= 5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        seen = count(&client, "ol.timeline .attempt").await;
    }
    assert!(
        seen >= first + 2,
        "the run page did not refresh: {first} attempts, then {seen}"
    );
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    if let Some(parent) = setup.screenshot.parent() {
        std::fs::create_dir_all(parent).expect("the screenshot's directory");
    }
    std::fs::write(&setup.screenshot, &png).expect("write the screenshot");
    eprintln!("screenshot of the run page: {}", setup.screenshot.display());

    // Cancel it: the confirmation, a reason, the command until applied.
    click(&client, "#cancel").await;
    wait_for(&client, "#confirm-cancel", 30).await;
    client
        .find(Locator::Css("#reason"))
        .await
        .expect("the reason field")
        .send_keys("checked from the browser test")
        .await
        .expect("type the reason");
    click(&client, "#confirm-cancel").await;
    wait_for(&client, "#command-state .b-applied", 60).await;
    let answer = client
        .find(Locator::Css("#answer"))
        .await
        .expect("the answer")
        .text()
        .await
        .expect("its text");
    assert!(answer.contains("cancelled"), "{answer}");
    click(&client, "#run-link").await;
    wait_for(&client, "#run-state .b-cancelled", 30).await;
    let source = client.source().await.expect("the page");
    assert!(source.contains("checked from the browser test"), "{source}");
    client.close().await.expect("close the session");

    // The example, which owned the store, ends: its run was cancelled.
    let status = tokio::time::timeout(Duration::from_secs(60), live.wait())
        .await
        .expect("the example ended within 60 s")
        .expect("its status");
    assert_eq!(status.code(), Some(1), "the example's exit status");
    ui.stop().await;
}
