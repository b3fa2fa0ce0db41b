//! The dashboard's login over HTTP: `--allow-remote` refused without a
//! token (and a token never taken from the command line, nor from a file
//! others can read); with a token, every kind of route (page, htmx
//! refresh, asset, action, the fallback) refused without credentials or
//! with a wrong token, a bearer header admitted, the login form's session
//! cookie (`HttpOnly`, `SameSite=Strict`, not the token) admitted until
//! logout; and `--read-only` with a token serving no actions.

use std::path::Path;

use crate::common::{Owner, cli, run, stderr};
use crate::ui::{command_path, page_with};
use crate::web::{Dashboard, Reply, TOKEN_ENV};

/// The token of the tests' dashboards.
const TOKEN: &str = "s3cret-t0ken-of-the-login-tests";

/// Command objects in the inbox of the tests' runtime.
fn sent(store: &Path) -> usize {
    std::fs::read_dir(store.join("workflow-steps-memo/inbox/v1"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "msgpack"))
                .count()
        })
        .unwrap_or(0)
}

/// The session cookie a login set: its `name=value` and its attributes.
fn session_cookie(reply: &Reply) -> (String, String) {
    let set = reply
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no cookie set ({}):\n{}", reply.status, reply.body));
    let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
    (pair.trim().to_string(), attributes.to_string())
}

/// `bearer TOKEN`.
fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[cfg(unix)]
fn token_file(dir: &Path, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("token-{mode:o}"));
    std::fs::write(&path, format!("{TOKEN}\n")).expect("write the token file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("set its mode");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_serving_needs_a_token() {
    // The checks come before the store is opened: an empty directory does.
    let dir = tempfile::tempdir().unwrap();
    for listen in ["0.0.0.0:0", "127.0.0.1:0"] {
        let refused = run(cli(
            dir.path(),
            &["ui", "--listen", listen, "--allow-remote"],
        ))
        .await
        .code(2);
        let err = stderr(&refused);
        assert!(
            err.contains("--allow-remote needs a login token")
                && err.contains(&format!("set the environment variable {TOKEN_ENV}"))
                && err.contains("--token-file PATH")
                && err.contains("chmod 600"),
            "{err}"
        );
    }
    let err = stderr(
        &run(cli(dir.path(), &["ui", "--listen", "0.0.0.0:0"]))
            .await
            .code(2),
    );
    assert!(
        err.contains("not a loopback address") && err.contains("--allow-remote"),
        "{err}"
    );
    // Never on the command line.
    let err = stderr(
        &run(cli(dir.path(), &["ui", "--token", TOKEN]))
            .await
            .code(2),
    );
    assert!(err.contains("unexpected argument '--token'"), "{err}");
    // A token too short, or given twice.
    let mut short = cli(dir.path(), &["ui", "--allow-remote"]);
    short.env(TOKEN_ENV, "tiny");
    let err = stderr(&run(short).await.code(2));
    assert!(
        err.contains("4 characters long") && !err.contains("tiny"),
        "{err}"
    );
    #[cfg(unix)]
    {
        let private = token_file(dir.path(), 0o600);
        let mut twice = cli(
            dir.path(),
            &["ui", "--token-file", &private.display().to_string()],
        );
        twice.env(TOKEN_ENV, TOKEN);
        let err = stderr(&run(twice).await.code(2));
        assert!(err.contains("given twice"), "{err}");
        let open = token_file(dir.path(), 0o644);
        let err = stderr(
            &run(cli(
                dir.path(),
                &[
                    "ui",
                    "--allow-remote",
                    "--token-file",
                    &open.display().to_string(),
                ],
            ))
            .await
            .code(2),
        );
        assert!(
            err.contains("mode 0644") && err.contains("chmod 600") && !err.contains(TOKEN),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_needs_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("ui-secret", 1, "timer", &[]).await;
    let mut ui = Dashboard::start_with(
        dir.path(),
        "0.0.0.0:0",
        &["--allow-remote"],
        &[(TOKEN_ENV, TOKEN)],
    )
    .await;
    assert!(
        ui.banner.contains("non-loopback")
            && ui.banner.contains(TOKEN_ENV)
            && ui.banner.contains("plain http"),
        "{}",
        ui.banner
    );

    // No credentials: a browser's page goes to the login form, htmx's
    // refresh and everything else get 401, on every kind of route.
    let html = ("Accept", "text/html,application/xhtml+xml,*/*;q=0.8");
    let routes = [
        "/",
        "/runs",
        "/runs?status=all",
        "/runs/ui-secret",
        "/runs/ui-secret/cancel",
        "/groups",
        "/dead-letters",
        "/store",
        "/signal",
        "/commands/01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "/no-such-page",
        "/assets/style.css",
        "/assets/htmx-2.0.11.min.js",
        "/assets/icon.svg",
    ];
    for path in routes {
        let bare = ui.get(path).await.expect(401);
        bare.lacks(&["ui-secret", "workflow-steps", "var htmx", ":root"]);
        assert!(
            bare.header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")),
            "{path}: {:?}",
            bare.headers
        );
        let page = ui.request("GET", path, &[html], b"").await;
        let location = page.header("location").unwrap_or_default();
        assert!(
            page.status == 303 && location.starts_with("/login?next="),
            "{path}: {} {location}",
            page.status
        );
        let htmx = ui
            .request("GET", path, &[html, ("HX-Request", "true")], b"")
            .await
            .expect(401);
        assert!(
            htmx.header("hx-redirect")
                .is_some_and(|to| to.starts_with("/login?next=")),
            "{path}: {:?}",
            htmx.headers
        );
        htmx.lacks(&["ui-secret"]);
    }
    let back = ui.request("GET", "/runs/ui-secret", &[html], b"").await;
    assert_eq!(
        back.header("location"),
        Some("/login?next=%2Fruns%2Fui-secret")
    );
    for path in [
        "/runs/ui-secret/cancel",
        "/runs/ui-secret/requeue",
        "/signal",
        "/logout",
    ] {
        ui.post(path, &[("csrf", "x"), ("key", "k"), ("json", "1")])
            .await
            .expect(401)
            .lacks(&["ui-secret"]);
    }
    assert_eq!(sent(dir.path()), 0, "a refused request sent a command");

    // Wrong tokens: another one, one of the same length with its last byte
    // changed, the token under another scheme or in the session cookie.
    let mut same_length = TOKEN.to_string();
    same_length.replace_range(TOKEN.len() - 1.., "X");
    assert_eq!(same_length.len(), TOKEN.len());
    for authorization in [
        bearer("not-the-token-at-all"),
        bearer(&same_length),
        bearer(&TOKEN[..TOKEN.len() - 1]),
        format!("Basic {TOKEN}"),
        TOKEN.to_string(),
        "Bearer".to_string(),
    ] {
        ui.request(
            "GET",
            "/runs",
            &[("Authorization", authorization.as_str()), html],
            b"",
        )
        .await
        .expect(401)
        .has(&["does not carry this dashboard"])
        .lacks(&["ui-secret"]);
    }
    let as_cookie = format!("taquba_workflow_session={TOKEN}");
    ui.request("GET", "/runs", &[("Cookie", as_cookie.as_str())], b"")
        .await
        .expect(401);

    // The bearer header admits a script, to pages, assets and actions
    // (which still need the form's token).
    let authorization = bearer(TOKEN);
    let auth = ("Authorization", authorization.as_str());
    ui.request("GET", "/runs", &[auth], b"")
        .await
        .expect(200)
        .has(&["ui-secret", "Log out"]);
    ui.request("GET", "/assets/style.css", &[auth], b"")
        .await
        .expect(200);
    let confirm = ui
        .request("GET", "/runs/ui-secret/cancel", &[auth], b"")
        .await
        .expect(200);
    let origin = ui.base.clone();
    let csrf = confirm.token();
    ui.post_from(
        "/runs/ui-secret/cancel",
        &[("reason", "no form token")],
        &[auth, ("Origin", origin.as_str())],
    )
    .await
    .expect(403);
    let cancelled = ui
        .post_from(
            "/runs/ui-secret/cancel",
            &[("csrf", &csrf), ("reason", "by a script")],
            &[auth, ("Origin", origin.as_str())],
        )
        .await
        .expect(303);
    let command = command_path(&cancelled);

    // The login form: shown without credentials, and nothing else is.
    let form = ui.get("/login?next=/runs").await.expect(200);
    form.has(&[r#"type="password""#, r#"name="token""#, r#"value="/runs""#])
        .lacks(&["ui-secret", "workflow-steps", "<script"]);
    assert!(
        form.header("content-security-policy")
            .is_some_and(|csp| csp.contains("style-src 'sha256-") && !csp.contains("script-src")),
        "{:?}",
        form.headers
    );
    let wrong = ui
        .post("/login", &[("token", &same_length), ("next", "/runs")])
        .await
        .expect(401);
    wrong.has(&["not this dashboard"]).lacks(&["ui-secret"]);
    assert_eq!(wrong.header("set-cookie"), None);
    // Not from another site's page.
    ui.post_from(
        "/login",
        &[("token", TOKEN)],
        &[("Origin", "http://evil.example")],
    )
    .await
    .expect(403);

    let login = ui
        .post("/login", &[("token", TOKEN), ("next", "/runs/ui-secret")])
        .await
        .expect(303);
    assert_eq!(login.header("location"), Some("/runs/ui-secret"));
    let (cookie, attributes) = session_cookie(&login);
    let value = cookie
        .strip_prefix("taquba_workflow_session=")
        .unwrap_or_else(|| panic!("another cookie: {cookie}"));
    assert!(
        value.len() == 64 && value.chars().all(|c| c.is_ascii_hexdigit()),
        "{value}"
    );
    assert!(!value.contains(TOKEN) && value != TOKEN);
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(attributes.contains(attribute), "{attribute}: {attributes}");
    }
    assert!(!attributes.contains("Secure"), "plain http: {attributes}");
    // The cookie admits the browser: pages, htmx's refreshes, assets.
    let with_cookie = ("Cookie", cookie.as_str());
    ui.request("GET", "/runs/ui-secret", &[with_cookie, html], b"")
        .await
        .expect(200)
        .has(&["ui-secret", r#"action="/logout""#]);
    ui.request(
        "GET",
        "/runs/ui-secret",
        &[with_cookie, ("HX-Request", "true")],
        b"",
    )
    .await
    .expect(200);
    ui.request("GET", "/assets/icon.svg", &[with_cookie], b"")
        .await
        .expect(200);
    ui.request("GET", &command, &[with_cookie], b"")
        .await
        .expect(200);
    // Logged in already: the login page leads on.
    let again = ui
        .request("GET", "/login?next=/store", &[with_cookie, html], b"")
        .await
        .expect(303);
    assert_eq!(again.header("location"), Some("/store"));
    // A second login is a session of its own; a login leads only to the
    // dashboard's own pages.
    let other = ui
        .post("/login", &[("token", TOKEN), ("next", "//evil.example/x")])
        .await
        .expect(303);
    assert_eq!(other.header("location"), Some("/runs"));
    let (other_cookie, _) = session_cookie(&other);
    assert_ne!(other_cookie, cookie);
    // Behind a TLS-terminating proxy the cookie is Secure.
    let origin = ui.base.clone();
    let proxied = ui
        .post_from(
            "/login",
            &[("token", TOKEN)],
            &[("Origin", origin.as_str()), ("X-Forwarded-Proto", "https")],
        )
        .await
        .expect(303);
    let (_, proxied) = session_cookie(&proxied);
    assert!(proxied.contains("Secure"), "{proxied}");

    // Logout ends the session in the dashboard, not only in the browser.
    let out = ui
        .post_from("/logout", &[], &[with_cookie, ("Origin", origin.as_str())])
        .await
        .expect(303);
    assert_eq!(out.header("location"), Some("/login"));
    let (cleared, attributes) = session_cookie(&out);
    assert_eq!(cleared, "taquba_workflow_session=");
    assert!(attributes.contains("Max-Age=0"), "{attributes}");
    ui.request("GET", "/runs", &[with_cookie, html], b"")
        .await
        .expect(303);
    ui.request("GET", "/runs", &[with_cookie], b"")
        .await
        .expect(401)
        .lacks(&["ui-secret"]);
    // The other session lives on.
    ui.request("GET", "/runs", &[("Cookie", other_cookie.as_str())], b"")
        .await
        .expect(200);

    // The cancel sent with the bearer header reaches the owner.
    ui.always_send(&[("Authorization", bearer(TOKEN).as_str())]);
    page_with(&ui, &command, "badge b-applied").await;
    let end = owner.wait(&id).await;
    assert_eq!(end.termination.status.as_str(), "cancelled");
    ui.stop().await;
    owner.stop().await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_dashboard_with_a_token_serves_no_actions() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner.start("ui-looked-at", 1, "timer", &[]).await;
    let secrets = tempfile::tempdir().unwrap();
    let file = token_file(secrets.path(), 0o600);
    let file = file.display().to_string();
    // On loopback a token is optional, and enforced when given.
    let mut ui = Dashboard::start(dir.path(), &["--read-only", "--token-file", &file]).await;
    assert!(
        ui.banner.contains("loopback only")
            && ui.banner.contains(&file)
            && ui.banner.contains("actions are off"),
        "{}",
        ui.banner
    );
    ui.get("/runs").await.expect(401);
    ui.post("/runs/ui-looked-at/cancel", &[("csrf", "x")])
        .await
        .expect(401);

    ui.always_send(&[("Authorization", bearer(TOKEN).as_str())]);
    page_with(&ui, "/runs/ui-looked-at", "Timer: step 1")
        .await
        .has(&["read-only", "Log out"])
        .lacks(&["Cancel run…", "Send signal…", "name=\"csrf\""]);
    ui.get("/runs/ui-looked-at/cancel").await.expect(403);
    ui.get("/signal").await.expect(403);
    ui.post("/runs/ui-looked-at/cancel", &[("csrf", "anything")])
        .await
        .expect(403)
        .has(&["read-only"]);
    ui.post(
        "/signal",
        &[("csrf", "anything"), ("key", "k"), ("json", "1")],
    )
    .await
    .expect(403);

    // A browser's session is read-only all the same.
    ui.always_send(&[]);
    let login = ui
        .post(
            "/login",
            &[("token", TOKEN), ("next", "/runs/ui-looked-at")],
        )
        .await
        .expect(303);
    let (cookie, _) = session_cookie(&login);
    ui.request(
        "GET",
        "/runs/ui-looked-at",
        &[("Cookie", cookie.as_str())],
        b"",
    )
    .await
    .expect(200)
    .lacks(&["Cancel run…", "name=\"csrf\""]);
    let origin = ui.base.clone();
    ui.post_from(
        "/runs/ui-looked-at/cancel",
        &[("csrf", "anything")],
        &[("Cookie", cookie.as_str()), ("Origin", origin.as_str())],
    )
    .await
    .expect(403);
    assert_eq!(sent(dir.path()), 0, "a read-only dashboard sent a command");
    ui.stop().await;
    owner.stop().await;
}
