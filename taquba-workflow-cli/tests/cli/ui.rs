//! `taquba-workflow ui` over HTTP: every page and action against a store a
//! live owner (in this test process) writes, the dashboard running as a
//! second process; the guards (form token, same origin, Host, read-only,
//! loopback); escaping of what runs carry; and a copied store served with
//! no owner.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::{Owner, cli, copy_dir, run};
use crate::web::{Dashboard, Reply};

/// `GET path` until the page contains `part` (at most 30 s): the
/// dashboard's reader follows the owner's flushes.
pub(crate) async fn page_with(ui: &Dashboard, path: &str, part: &str) -> Reply {
    page_with_all(ui, path, &[part]).await
}

/// [`page_with`] for every one of `parts` at once.
async fn page_with_all(ui: &Dashboard, path: &str, parts: &[&str]) -> Reply {
    for _ in 0..300 {
        let reply = ui.get(path).await;
        if reply.status == 200 && parts.iter().all(|part| reply.body.contains(part)) {
            return reply;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reply = ui.get(path).await;
    panic!(
        "{path} did not show all of {parts:?} within 30 s; it shows ({}):\n{}",
        reply.status, reply.body
    );
}

/// The command page a POST redirected to.
pub(crate) fn command_path(reply: &Reply) -> String {
    let location = reply
        .header("location")
        .unwrap_or_else(|| panic!("no redirect ({}):\n{}", reply.status, reply.body));
    assert!(location.starts_with("/commands/"), "{location}");
    location.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shows_a_live_store() {
    use taquba_workflow::GroupMember;
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let ok = owner.start("ui-ok", 3, "ok", &[("team", "search")]).await;
    owner.wait(&ok).await;
    let failed = owner.start("ui-fail", 2, "fail", &[]).await;
    owner.wait(&failed).await;
    let flaky = owner.start("ui-flaky", 4, "flaky", &[]).await;
    owner.wait(&flaky).await;
    owner.start("ui-wait", 7, "signal", &[]).await;
    // Held in its first step: its input is its current job's payload.
    let held = owner.start("ui-hold", 9, "hold", &[]).await;
    let group = owner
        .runtime
        .group(taquba_workflow::RunId::new("batch-1").unwrap());
    let member = |key: &str, mode: &str| GroupMember {
        key: key.to_string(),
        input: crate::common::demo_input(1, mode),
    };
    group
        .submit(
            vec![member("a", "ok"), member("b", "timer")],
            &taquba_workflow::RunOptions::default(),
        )
        .await
        .unwrap();
    let ui = Dashboard::start(dir.path(), &[]).await;
    assert!(ui.banner.contains("loopback only"), "{}", ui.banner);

    let root = ui.get("/").await.expect(303);
    assert_eq!(root.header("location"), Some("/runs"));

    // The list, with its counts: ok and the group's ok member succeeded;
    // fail and flaky failed; the signal wait and the timer member pending;
    // hold running.
    // Every count at once: the group's members settle on their own time
    // (its `ok` member may still be pending when `hold` runs).
    let runs = page_with_all(
        &ui,
        "/runs",
        &[
            ">1</span> running",
            ">2</span> succeeded",
            ">2</span> failed",
            ">2</span> pending",
        ],
    )
    .await;
    runs.has(&[
        "ui-ok",
        "ui-fail",
        "ui-flaky",
        "ui-wait",
        ">7</span> runs",
        ">2</span> succeeded",
        ">2</span> failed",
        ">2</span> pending",
        "asked to fail with n=2",
        r#"data-refresh="on""#,
        r#"hx-trigger="every 2s""#,
    ]);
    assert!(
        runs.header("content-security-policy")
            .is_some_and(|csp| csp.contains("script-src 'self'")),
        "{:?}",
        runs.headers
    );
    ui.get("/runs?status=failed")
        .await
        .expect(200)
        .has(&["ui-fail", "ui-flaky"])
        .lacks(&["/runs/ui-ok\"", "/runs/ui-wait\""]);
    ui.get("/runs?status=active")
        .await
        .expect(200)
        .has(&["/runs/ui-wait\""])
        .lacks(&["/runs/ui-ok\""]);
    ui.get("/runs?workflow=no-such-flow")
        .await
        .expect(200)
        .has(&["No runs of workflow &quot;no-such-flow&quot;"]);
    // Search: an exact id opens the run, part of one filters.
    let exact = ui.get("/runs?q=ui-ok").await.expect(303);
    assert_eq!(exact.header("location"), Some("/runs/ui-ok"));
    ui.get("/runs?q=ui-f")
        .await
        .expect(200)
        .has(&["/runs/ui-fail\"", "/runs/ui-flaky\""])
        .lacks(&["/runs/ui-ok\""]);
    // Paging: two per page, the cursor leads on.
    let first = ui.get("/runs?limit=2").await.expect(200);
    first.has(&["Showing 2 runs", "Next page"]);
    let next = first
        .body
        .split("href=\"")
        .find_map(|s| {
            let link = s.split('"').next()?;
            link.contains("after=").then(|| link.replace("&amp;", "&"))
        })
        .expect("a next-page link");
    ui.get(&next).await.expect(200).has(&["First page"]);

    // A succeeded run: its card, steps, result, input and headers.
    ui.get("/runs/ui-ok").await.expect(200).has(&[
        "badge b-succeeded",
        "Step 0",
        "begin",
        "count",
        "finish",
        "&quot;total&quot;: 6",
        "MessagePack, shown as JSON",
        "team",
        "search",
        r#"data-refresh="off""#,
        // The version it started on, its patches, each step's version.
        r#"<dd id="run-version">demo-1</dd>"#,
        "<code>demo-patch</code>",
        "version demo-1",
    ]);
    // A waiting run: the signal it waits for, its timeout, the actions;
    // the page refreshes.
    page_with(&ui, "/runs/ui-wait", "approve:7").await.has(&[
        "Waiting for signal",
        "Times out",
        "Send signal…",
        "Cancel run…",
        r#"data-refresh="on""#,
    ]);
    // Its current step's payload, decoded: the step's fields.
    ui.get("/runs/ui-wait")
        .await
        .expect(200)
        .has(&["Current step", "&quot;total&quot;: 7"]);
    page_with(&ui, "/runs/ui-hold", "badge b-running")
        .await
        .has(&[
            "Input",
            "&quot;mode&quot;: &quot;hold&quot;",
            "&quot;n&quot;: 9",
        ])
        .lacks(&["<h2>Current step</h2>"]);
    owner.hold.add_permits(1);
    owner.wait(&held).await;
    ui.get("/runs/ui-fail")
        .await
        .expect(200)
        .has(&["badge b-failed", "asked to fail with n=2"]);
    ui.get("/runs/ui-flaky").await.expect(200).has(&[
        "flaky dependency (n=4)",
        "retried",
        "dead-lettered",
        "Requeue the failed step",
    ]);

    let groups = page_with(&ui, "/groups", "batch-1").await;
    groups.has(&["svg class=\"bar\"", "1 of 2 ended"]);
    ui.get("/groups/batch-1").await.expect(200).has(&[
        "badge b-succeeded",
        "badge b-pending",
        "Members",
    ]);
    ui.get("/dead-letters").await.expect(200).has(&[
        "ui-flaky",
        "flaky dependency (n=4)",
        "Requeue",
    ]);
    ui.get("/store").await.expect(200).has(&[
        "workflow-steps",
        "Writer",
        "Epoch",
        "Objects by prefix",
        "demo",
    ]);
    ui.get("/signal")
        .await
        .expect(200)
        .has(&["name=\"key\"", "name=\"json\"", "name=\"csrf\""]);

    let htmx = ui.get("/assets/htmx-2.0.11.min.js").await.expect(200);
    assert!(htmx.body.starts_with("var htmx"), "not htmx");
    assert!(
        htmx.header("content-type")
            .is_some_and(|t| t.starts_with("text/javascript"))
    );
    let css = ui.get("/assets/style.css").await.expect(200);
    assert!(
        css.header("content-type")
            .is_some_and(|t| t.starts_with("text/css"))
    );

    // What is not there says so, with its status.
    ui.get("/nothing-here").await.expect(404);
    ui.get("/runs/never-submitted")
        .await
        .expect(404)
        .has(&["run never-submitted not found"]);
    ui.get("/runs/bad.id")
        .await
        .expect(400)
        .has(&["a run id may contain only"]);
    ui.get("/runs?status=bogus")
        .await
        .expect(400)
        .has(&["status &quot;bogus&quot; is not one of"]);
    ui.get("/runs?limit=0").await.expect(400);
    ui.get("/groups/no-group").await.expect(404);
    ui.get("/commands/not-a-ulid").await.expect(400);
    ui.stop().await;
    drop(group);
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_run_carries_is_shown_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    // The mode ends up in the run's error ("unknown mode …"), its input
    // and, as a header, its headers.
    let id = owner
        .start(
            "ui-xss",
            1,
            "<script>alert(1)</script>",
            &[("note", "<img src=x onerror=alert(2)>")],
        )
        .await;
    assert_eq!(owner.wait(&id).await.termination.status.as_str(), "failed");
    let ui = Dashboard::start(dir.path(), &[]).await;
    let run = page_with(&ui, "/runs/ui-xss", "badge b-failed").await;
    run.has(&[
        "unknown mode &lt;script&gt;alert(1)&lt;/script&gt;",
        "&lt;img src=x onerror=alert(2)&gt;",
    ])
    .lacks(&["<script>alert(1)", "<img src=x"]);
    ui.get("/runs?status=failed")
        .await
        .expect(200)
        .has(&["unknown mode &lt;script&gt;"])
        .lacks(&["<script>alert(1)"]);
    // A search text comes back escaped too.
    ui.get("/runs?q=%3Cscript%3E")
        .await
        .expect(200)
        .has(&["&lt;script&gt;"])
        .lacks(&["<script>\""]);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_from_the_dashboard_reaches_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("ui-cancel", 1, "timer", &[]).await;
    let ui = Dashboard::start(dir.path(), &[]).await;
    page_with(&ui, "/runs/ui-cancel", "Timer: step 1 (finish) is due").await;

    // The confirmation says what the cancel does.
    let confirm = ui.get("/runs/ui-cancel/cancel").await.expect(200);
    confirm.has(&[
        "Run ui-cancel (workflow cli-demo) is pending at step 1 (finish)",
        "Its waiting step is removed and the run ends cancelled.",
        "name=\"reason\"",
    ]);
    let token = confirm.token();

    // Refused without the token, with another's token, and from another
    // origin; nothing is sent.
    ui.post("/runs/ui-cancel/cancel", &[("reason", "x")])
        .await
        .expect(403)
        .has(&["token is missing"]);
    ui.post(
        "/runs/ui-cancel/cancel",
        &[("csrf", "0000"), ("reason", "x")],
    )
    .await
    .expect(403);
    ui.post_from(
        "/runs/ui-cancel/cancel",
        &[("csrf", &token), ("reason", "x")],
        &[("Origin", "http://evil.example")],
    )
    .await
    .expect(403)
    .has(&["evil.example", "nothing was sent"]);
    ui.post_from(
        "/runs/ui-cancel/cancel",
        &[("csrf", &token), ("reason", "x")],
        &[("Sec-Fetch-Site", "cross-site")],
    )
    .await
    .expect(403);
    let inbox = dir.path().join("workflow-steps-memo/inbox/v1");
    let sent = std::fs::read_dir(&inbox)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "msgpack"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(sent, 0, "a refused form sent a command");

    // Confirmed: a command in the inbox, its page followed until applied.
    let sent = ui
        .post(
            "/runs/ui-cancel/cancel",
            &[("csrf", &token), ("reason", "no longer <needed>")],
        )
        .await
        .expect(303);
    let page = command_path(&sent);
    assert!(page.ends_with("?run=ui-cancel"), "{page}");
    let applied = page_with(&ui, &page, "badge b-applied").await;
    applied.has(&["run ui-cancel cancelled", r#"data-refresh="off""#]);
    let end = owner.wait(&id).await;
    assert_eq!(end.termination.status.as_str(), "cancelled");
    page_with(&ui, "/runs/ui-cancel", "badge b-cancelled")
        .await
        .has(&["no longer &lt;needed&gt;", r#"data-refresh="off""#])
        .lacks(&["Cancel run…"]);

    // A terminated run has nothing to cancel.
    ui.get("/runs/ui-cancel/cancel")
        .await
        .expect(409)
        .has(&["there is nothing to cancel"]);
    ui.post("/runs/ui-cancel/cancel", &[("csrf", &token)])
        .await
        .expect(409);
    ui.post("/runs/never-there/cancel", &[("csrf", &token)])
        .await
        .expect(404);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_from_the_dashboard_wakes_the_waiting_run() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("ui-signal", 5, "signal", &[]).await;
    let ui = Dashboard::start(dir.path(), &[]).await;
    let run = page_with(&ui, "/runs/ui-signal", "approve:5").await;
    run.has(&["/signal?key=approve%3A5&amp;run=ui-signal"]);
    let form = ui
        .get("/signal?key=approve%3A5&run=ui-signal")
        .await
        .expect(200);
    form.has(&["value=\"approve:5\"", "Back to run ui-signal"]);
    let token = form.token();

    // JSON that does not parse is shown with the form again.
    ui.post(
        "/signal",
        &[("csrf", &token), ("key", "approve:5"), ("json", "{nope")],
    )
    .await
    .expect(400)
    .has(&["the payload is not valid JSON", "value=\"approve:5\""]);
    ui.post("/signal", &[("csrf", &token), ("key", " "), ("json", "1")])
        .await
        .expect(400)
        .has(&["needs a key"]);

    let sent = ui
        .post(
            "/signal",
            &[
                ("csrf", &token),
                ("key", "approve:5"),
                ("json", "\"looks good\""),
                ("run", "ui-signal"),
            ],
        )
        .await
        .expect(303);
    let page = command_path(&sent);
    page_with(&ui, &page, "badge b-applied")
        .await
        .has(&["signal delivered to run ui-signal"]);
    let end = owner.wait(&id).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");
    page_with(&ui, "/runs/ui-signal", "badge b-succeeded")
        .await
        .has(&["&quot;note&quot;: &quot;looks good&quot;"]);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_requeued_from_the_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let id = owner.start("ui-requeue", 2, "flaky", &[]).await;
    assert_eq!(owner.wait(&id).await.termination.status.as_str(), "failed");
    let ok = owner.start("ui-done", 1, "ok", &[]).await;
    owner.wait(&ok).await;
    let ui = Dashboard::start(dir.path(), &[]).await;
    let dead = page_with(&ui, "/dead-letters", "ui-requeue").await;
    dead.has(&["action=\"/runs/ui-requeue/requeue\"", "2/2"]);
    let token = dead.token();
    // Only a failed run's step is requeued.
    ui.post("/runs/ui-done/requeue", &[("csrf", &token)])
        .await
        .expect(409)
        .has(&["only a failed run"]);

    owner.healed.store(true, Ordering::SeqCst);
    let sent = ui
        .post("/runs/ui-requeue/requeue", &[("csrf", &token)])
        .await
        .expect(303);
    page_with(&ui, &command_path(&sent), "badge b-applied")
        .await
        .has(&["run ui-requeue is active again: step 0 requeued"]);
    let end = owner.wait(&id).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");
    page_with(&ui, "/runs/ui-requeue", "badge b-succeeded")
        .await
        .has(&["requeued"]);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_keeps_to_its_user() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    owner.start("ui-guarded", 1, "timer", &[]).await;

    // Another machine's address needs the flag, and says why.
    let refused = run(cli(dir.path(), &["ui", "--listen", "0.0.0.0:0"]))
        .await
        .code(2);
    let err = crate::common::stderr(&refused);
    assert!(
        err.contains("--allow-remote") && err.contains("TAQUBA_WORKFLOW_UI_TOKEN"),
        "{err}"
    );

    let ui = Dashboard::start(dir.path(), &[]).await;
    // A page of another site pointing its name at 127.0.0.1 is not served.
    ui.request("GET", "/runs", &[("Host", "evil.example:8233")], b"")
        .await
        .expect(421);
    ui.stop().await;

    // Read-only: no actions shown, none taken.
    let ui = Dashboard::start(dir.path(), &["--read-only"]).await;
    assert!(ui.banner.contains("actions are off"), "{}", ui.banner);
    page_with(&ui, "/runs/ui-guarded", "Timer: step 1")
        .await
        .has(&["read-only"])
        .lacks(&["Cancel run…", "name=\"csrf\""]);
    ui.get("/runs/ui-guarded/cancel").await.expect(403);
    ui.get("/signal").await.expect(403);
    ui.post("/runs/ui-guarded/cancel", &[("csrf", "anything")])
        .await
        .expect(403)
        .has(&["read-only"]);
    ui.stop().await;
    owner.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_store_is_served_with_no_owner() {
    let live = tempfile::tempdir().unwrap();
    let owner = Owner::open(live.path()).await;
    let done = owner.start("ui-copied", 2, "ok", &[]).await;
    owner.wait(&done).await;
    owner.start("ui-parked", 1, "timer", &[]).await;
    // Let the timer run's step commit before the owner stops.
    for _ in 0..100 {
        if owner
            .runtime
            .status(&taquba_workflow::RunId::new("ui-parked").unwrap())
            .await
            .unwrap()
            .is_some_and(|s| s.current_step == 1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    owner.stop().await;
    let copy = tempfile::tempdir().unwrap();
    copy_dir(live.path(), copy.path());

    let ui = Dashboard::start(copy.path(), &[]).await;
    ui.get("/runs")
        .await
        .expect(200)
        .has(&["ui-copied", "ui-parked"]);
    ui.get("/runs/ui-copied")
        .await
        .expect(200)
        .has(&["badge b-succeeded", "&quot;total&quot;: 3"]);
    ui.get("/store").await.expect(200).has(&["Last flush"]);
    // A cancel goes to the inbox and stays pending: no owner applies it.
    let confirm = ui.get("/runs/ui-parked/cancel").await.expect(200);
    let sent = ui
        .post("/runs/ui-parked/cancel", &[("csrf", &confirm.token())])
        .await
        .expect(303);
    ui.get(&command_path(&sent)).await.expect(200).has(&[
        "badge b-pending",
        "In the inbox",
        r#"data-refresh="on""#,
    ]);
    ui.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_run_is_forked_and_restarted_from_the_dashboard() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let done = owner.start("ui-fork", 2, "ok", &[]).await;
    owner.wait(&done).await;
    owner.start("ui-fork-busy", 1, "timer", &[]).await;
    let ui = Dashboard::start(dir.path(), &[]).await;
    let page = page_with(&ui, "/runs/ui-fork", "badge b-succeeded").await;
    page.has(&[
        "action=\"/runs/ui-fork/fork\"",
        "id=\"fork\"",
        "id=\"restart\"",
    ]);
    let token = page.token();
    // Not a step, past the run's end: refused before anything is sent.
    ui.post("/runs/ui-fork/fork", &[("csrf", &token), ("step", "two")])
        .await
        .expect(400)
        .has(&["must be a step number"]);
    ui.post("/runs/ui-fork/fork", &[("csrf", &token), ("step", "99")])
        .await
        .expect(409)
        .has(&["ended at step"]);
    // An active run shows no fork, and is refused.
    page_with(&ui, "/runs/ui-fork-busy", "Timer: step 1")
        .await
        .lacks(&["/fork\""]);
    ui.post(
        "/runs/ui-fork-busy/fork",
        &[("csrf", &token), ("step", "0")],
    )
    .await
    .expect(409)
    .has(&["cancel it first"]);

    // Step 2 (the count down from 1): the fork ends as the original did.
    let sent = ui
        .post("/runs/ui-fork/fork", &[("csrf", &token), ("step", "2")])
        .await
        .expect(303);
    let path = command_path(&sent);
    page_with(&ui, &path, "badge b-applied")
        .await
        .has(&["started from step 2 of run ui-fork"]);
    // The owner names the fork by the command's id.
    let command = path.trim_start_matches("/commands/");
    let command = command.split('?').next().unwrap_or(command);
    let fork = taquba_workflow::RunId::new(command).unwrap();
    let end = owner.wait(&fork).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");
    page_with(&ui, &format!("/runs/{fork}"), "badge b-succeeded")
        .await
        .has(&["Forked from", "href=\"/runs/ui-fork\"", ", step 2"]);
    // A restart from step 0.
    let sent = ui
        .post("/runs/ui-fork/fork", &[("csrf", &token), ("step", "0")])
        .await
        .expect(303);
    page_with(&ui, &command_path(&sent), "badge b-applied")
        .await
        .has(&["started from step 0 of run ui-fork"]);
    ui.stop().await;

    // Read-only: no fork shown, none taken.
    let ui = Dashboard::start(dir.path(), &["--read-only"]).await;
    page_with(&ui, "/runs/ui-fork", "badge b-succeeded")
        .await
        .lacks(&["/fork\"", "id=\"restart\""]);
    ui.post("/runs/ui-fork/fork", &[("csrf", "anything"), ("step", "0")])
        .await
        .expect(403)
        .has(&["read-only"]);
    ui.stop().await;
    owner.stop().await;
}

/// A parent and its child (child workflows): `runs describe` prints the
/// links both ways (card and JSON), and each run page links the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_and_its_child_link_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let owner = Owner::open(dir.path()).await;
    let parent = owner.start("family-1", 3, "child", &[]).await;
    let end = owner.wait(&parent).await;
    assert_eq!(end.termination.status.as_str(), "succeeded");

    let described = crate::common::json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "family-1", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(described["children"][0], "family-1--c", "{described}");
    assert!(described.get("parent").is_none(), "{described}");
    let child = crate::common::json(
        &run(cli(
            dir.path(),
            &["runs", "describe", "family-1--c", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(child["parent"], "family-1", "{child}");
    let card = crate::common::stdout(
        &run(cli(dir.path(), &["runs", "describe", "family-1--c"]))
            .await
            .success(),
    );
    assert!(
        card.contains("Parent") && card.contains("family-1"),
        "{card}"
    );
    let card = crate::common::stdout(
        &run(cli(dir.path(), &["runs", "describe", "family-1"]))
            .await
            .success(),
    );
    assert!(
        card.contains("Children") && card.contains("family-1--c"),
        "{card}"
    );

    let ui = Dashboard::start(dir.path(), &[]).await;
    page_with_all(
        &ui,
        "/runs/family-1",
        &["id=\"run-children\"", "href=\"/runs/family-1--c\""],
    )
    .await;
    page_with_all(
        &ui,
        "/runs/family-1--c",
        &["id=\"run-parent\"", "href=\"/runs/family-1\""],
    )
    .await;
    owner.stop().await;
}
