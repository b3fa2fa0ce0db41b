//! The dashboard in a real browser: headless Chromium driven over
//! WebDriver (chromedriver), against a store made by the main example
//! (`examples/word_report.rs`), served with a login token. It is sent to
//! the login form, is refused a wrong token, logs in with the right one
//! (an `HttpOnly`, `SameSite=Strict` session cookie no script can read),
//! opens the runs page, follows a finished
//! run and sees its steps and result, follows a live run and sees its page
//! refresh by itself as steps commit, takes the screenshot the README
//! shows, cancels the live run from its page and sees it cancelled (and
//! the example, which owns the store, end), then logs out and is sent to
//! the login form again.
//!
//! `bash .ci/browser.sh` installs Debian's `chromium` and
//! `chromium-driver`, builds the binaries and runs it; see
//! [`Setup`] for its environment. Without it the test says what is
//! missing and passes, unless `CI` is set.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::Locator;
use taquba_workflow_browser_test::{
    Dashboard, Driver, Setup, click, count, log_in, repo, text, wait_for,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// The run id the example printed (`submitted run ID over DIR`).
fn submitted(line: &str) -> Option<String> {
    line.strip_prefix("submitted run ")
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_browser() {
    let default_screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-run.png");
    let Some(setup) = Setup::from_env(default_screenshot) else {
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
        .stderr(Stdio::null())
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

    let ui = Dashboard::start(&setup, store.path()).await;
    let driver = Driver::start(&setup).await;
    let profile = tempfile::tempdir().unwrap();
    let client = driver.browser(&setup, profile.path()).await;

    // The runs page asks for the token first: a wrong one is refused, the
    // right one leads back to the runs.
    client
        .goto(&format!("{}/runs", ui.base))
        .await
        .expect("open /runs");
    log_in(&client, "not-the-dashboard-token").await;
    let refused = text(&client, "#login-error").await;
    assert!(refused.contains("not this dashboard"), "{refused}");
    log_in(&client, &ui.token).await;
    wait_for(&client, &format!("a[href='/runs/{live_id}']"), 30).await;
    let url = client.current_url().await.expect("the URL");
    assert_eq!(url.path(), "/runs", "{url}");
    let cookies = client.get_all_cookies().await.expect("the cookies");
    let session = cookies
        .iter()
        .find(|c| c.name() == "taquba_workflow_session")
        .unwrap_or_else(|| panic!("no session cookie in {cookies:?}"));
    assert_eq!(session.http_only(), Some(true), "{session:?}");
    assert_eq!(
        format!("{:?}", session.same_site()),
        "Some(Strict)",
        "{session:?}"
    );
    assert!(
        session.value() != ui.token && !session.value().contains(&ui.token),
        "the cookie holds the token"
    );
    let seen_by_scripts = client
        .execute("return document.cookie", vec![])
        .await
        .expect("run a script");
    assert_eq!(
        seen_by_scripts,
        serde_json::json!(""),
        "a script reads the cookie"
    );
    let counts = text(&client, "nav.counts").await;
    assert!(counts.contains("1 succeeded"), "{counts}");

    // Follow the finished run: its steps and its result.
    click(&client, &format!("a[href='/runs/{done_id}']")).await;
    wait_for(&client, "#run-state .b-succeeded", 30).await;
    let steps = count(&client, "ol.timeline li.step").await;
    assert!(steps >= 3, "{steps} steps shown");
    let timeline = text(&client, "ol.timeline").await;
    for name in ["list", "count", "report"] {
        assert!(timeline.contains(name), "no step {name:?} in:\n{timeline}");
    }
    let result = text(&client, "figure.payload").await;
    assert!(result.contains("\"files\""), "{result}");

    // Follow the live run: its page refreshes by itself as steps commit.
    click(&client, "header.top nav a[href='/runs']").await;
    click(&client, &format!("a[href='/runs/{live_id}']")).await;
    wait_for(&client, "#live[data-refresh='on']", 30).await;
    let first = count(&client, "ol.timeline .attempt").await;
    let mut seen = first;
    for _ in 0..150 {
        if seen >= first + 2 && seen >= 8 {
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
    let plan = text(&client, "section.confirm").await;
    assert!(plan.contains("ends cancelled"), "{plan}");
    client
        .find(Locator::Css("#reason"))
        .await
        .expect("the reason field")
        .send_keys("checked from the browser test")
        .await
        .expect("type the reason");
    click(&client, "#confirm-cancel").await;
    wait_for(&client, "#command-state .b-applied", 60).await;
    let answer = text(&client, "#answer").await;
    assert!(answer.contains("cancelled"), "{answer}");
    click(&client, "#run-link").await;
    wait_for(&client, "#run-state .b-cancelled", 30).await;
    let card = text(&client, "dl.card").await;
    assert!(card.contains("checked from the browser test"), "{card}");

    // Logging out ends the session: the runs page asks for the token again.
    click(&client, "#logout").await;
    wait_for(&client, "#token", 30).await;
    client
        .goto(&format!("{}/runs", ui.base))
        .await
        .expect("open /runs");
    wait_for(&client, "#token", 30).await;
    client.close().await.expect("close the session");

    // The example, which owned the store, ends: its run was cancelled.
    let status = tokio::time::timeout(Duration::from_secs(60), live.wait())
        .await
        .expect("the example ended within 60 s")
        .expect("its status");
    assert_eq!(status.code(), Some(1), "the example's exit status");
}
