//! The harness of the dashboard's browser test (`tests/dashboard.rs`):
//! what the test needs from its machine ([`Setup`]: the built binaries,
//! chromedriver and Chromium), chromedriver on a free loopback port, a
//! headless Chromium session, `taquba-workflow ui` as a child process,
//! and waiting for and clicking elements of pages that refresh themselves.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

/// What the test needs, from the environment:
///
/// - `TAQUBA_WORKFLOW_BIN`: the built `taquba-workflow` binary;
/// - `WORD_REPORT_BIN`: the built `word_report` example;
/// - `CHROMEDRIVER` (default `/usr/bin/chromedriver`), `CHROMIUM`
///   (default `/usr/bin/chromium`);
/// - `DASHBOARD_SCREENSHOT`: where to write the run page's PNG (default:
///   the path the test gives).
pub struct Setup {
    /// The CLI.
    pub taquba_workflow: PathBuf,
    /// The main example.
    pub word_report: PathBuf,
    /// The WebDriver server.
    pub chromedriver: PathBuf,
    /// The browser.
    pub chromium: PathBuf,
    /// Where the screenshot goes.
    pub screenshot: PathBuf,
}

impl Setup {
    /// The setup, or `None` when something is missing (the reason is
    /// printed), unless `CI` is set: there a missing piece fails the test.
    /// The screenshot goes to `screenshot` unless `DASHBOARD_SCREENSHOT`
    /// says where.
    pub fn from_env(screenshot: PathBuf) -> Option<Self> {
        let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
        let or = |name: &str, default: &str| var(name).unwrap_or_else(|| PathBuf::from(default));
        let found = [
            (
                "TAQUBA_WORKFLOW_BIN",
                var("TAQUBA_WORKFLOW_BIN"),
                "the built taquba-workflow binary",
            ),
            (
                "WORD_REPORT_BIN",
                var("WORD_REPORT_BIN"),
                "the built word_report example",
            ),
            (
                "CHROMEDRIVER",
                Some(or("CHROMEDRIVER", "/usr/bin/chromedriver")),
                "apt-get install chromium-driver",
            ),
            (
                "CHROMIUM",
                Some(or("CHROMIUM", "/usr/bin/chromium")),
                "apt-get install chromium",
            ),
        ];
        let missing: Vec<String> = found
            .iter()
            .filter(|(_, path, _)| !path.as_deref().is_some_and(Path::is_file))
            .map(|(name, path, what)| match path {
                Some(path) => format!("{name}: no file at {} ({what})", path.display()),
                None => format!("{name} is not set ({what})"),
            })
            .collect();
        if !missing.is_empty() {
            let why = missing.join("; ");
            if std::env::var_os("CI").is_some() {
                panic!("the browser test cannot run in CI: {why}");
            }
            eprintln!("SKIPPED the browser test: {why}. Run it with `bash .ci/browser.sh`.");
            return None;
        }
        let [
            (_, cli, _),
            (_, example, _),
            (_, driver, _),
            (_, chromium, _),
        ] = found;
        Some(Self {
            taquba_workflow: cli?,
            word_report: example?,
            chromedriver: driver?,
            chromium: chromium?,
            screenshot: var("DASHBOARD_SCREENSHOT").unwrap_or(screenshot),
        })
    }
}

/// The repository's root (the example's default directory).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the repository root")
        .to_path_buf()
}

/// A free loopback port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// chromedriver on a free port, stopped when dropped.
pub struct Driver {
    _child: Child,
    /// Its URL.
    pub url: String,
}

impl Driver {
    /// Start chromedriver and wait (at most 20 s) until it answers.
    pub async fn start(setup: &Setup) -> Self {
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
                return Self {
                    _child: child,
                    url: format!("http://127.0.0.1:{port}"),
                };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer on port {port} within 20 s");
    }

    /// A headless Chromium session with a fresh profile in `profile`, and
    /// the flags this machine's closed network needs (no background
    /// connections).
    pub async fn browser(&self, setup: &Setup, profile: &Path) -> Client {
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,1000",
        ]
        .map(String::from)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.display()));
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), "chrome".into());
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": setup.chromium, "args": args }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a WebDriver session")
    }
}

/// The environment variable of the dashboard's login token.
pub const TOKEN_ENV: &str = "TAQUBA_WORKFLOW_UI_TOKEN";

/// `taquba-workflow --store STORE ui --listen 127.0.0.1:0` with a login
/// token ([`TOKEN_ENV`]), stopped when dropped.
pub struct Dashboard {
    _child: Child,
    _stdout: BufReader<ChildStdout>,
    /// Its base URL, `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its login token.
    pub token: String,
}

impl Dashboard {
    /// Start the dashboard with a token of this test run's own and wait
    /// (at most 60 s) for the URL it prints.
    pub async fn start(setup: &Setup, store: &Path) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let token = format!("browser-test-{}-{nanos:x}", std::process::id());
        let mut child = Command::new(&setup.taquba_workflow)
            .env_remove("TAQUBA_WORKFLOW_STORE")
            .env(TOKEN_ENV, &token)
            .arg("--store")
            .arg(store)
            .args(["ui", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start taquba-workflow ui");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(60), stdout.read_line(&mut line))
            .await
            .expect("the dashboard printed its URL within 60 s")
            .expect("read its stdout");
        let base = line
            .trim()
            .strip_prefix("taquba-workflow ui: ")
            .unwrap_or_else(|| panic!("no URL in {line:?}"))
            .trim_end_matches('/')
            .to_string();
        Self {
            _child: child,
            _stdout: stdout,
            base,
            token,
        }
    }
}

/// Log in through the form the browser is on: type `token`, submit.
pub async fn log_in(client: &Client, token: &str) {
    wait_for(client, "#token", 30)
        .await
        .send_keys(token)
        .await
        .expect("type the token");
    click(client, "#login").await;
}

/// Wait (at most `secs`) for an element matching `css`; on failure the
/// panic shows the page.
pub async fn wait_for(client: &Client, css: &str, secs: u64) -> Element {
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

/// Click the element matching `css`, again when a refresh replaced it
/// between finding and clicking it.
pub async fn click(client: &Client, css: &str) {
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

/// The text of the element matching `css`, read again when a refresh
/// replaced it.
pub async fn text(client: &Client, css: &str) -> String {
    let mut last = None;
    for _ in 0..5 {
        match wait_for(client, css, 30).await.text().await {
            Ok(text) => return text,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("cannot read {css:?}: {last:?}");
}

/// How many elements match `css` now.
pub async fn count(client: &Client, css: &str) -> usize {
    client
        .find_all(Locator::Css(css))
        .await
        .map(|found| found.len())
        .unwrap_or(0)
}
