//! `schedules list|describe|pause|resume` against a live owner's store,
//! pause and resume going through its inbox; and the dashboard's
//! Schedules page with its pause/resume buttons (and none under
//! `--read-only`).

use std::time::Duration;

use taquba_workflow::schedule::ScheduleSpec;

use crate::common::{Owner, cli, demo_input, json, run, stderr, stdout};

async fn owner_with_schedules(dir: &std::path::Path) -> Owner {
    let owner = Owner::open(dir).await;
    let paris = ScheduleSpec::cron("0 9 * * *")
        .expect("a valid expression")
        .in_zone("Europe/Paris")
        .expect("a known zone");
    owner
        .runtime
        .schedule("morning", paris, demo_input(1, "ok"))
        .await
        .expect("create the schedule");
    owner
        .runtime
        .schedule(
            "hourly",
            ScheduleSpec::every(Duration::from_secs(3600)).expect("a valid interval"),
            demo_input(1, "ok"),
        )
        .await
        .expect("create the schedule");
    owner
}

/// `schedules list -o json`, polled until `check` holds (at most 30 s):
/// the reader follows the owner's flushes.
async fn schedules_until(
    dir: &std::path::Path,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    for _ in 0..300 {
        let value = json(
            &run(cli(dir, &["schedules", "list", "-o", "json"]))
                .await
                .success(),
        );
        if check(&value) {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the schedules did not reach the state within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_listed_described_paused_and_resumed() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let owner = owner_with_schedules(dir.path()).await;
    let listed = schedules_until(dir.path(), |v| v.as_array().is_some_and(|a| a.len() == 2)).await;
    assert_eq!(listed[0]["name"], "hourly");
    assert_eq!(listed[0]["interval_ms"], 3_600_000);
    assert_eq!(listed[1]["name"], "morning");
    assert_eq!(listed[1]["zone"], "Europe/Paris");
    assert_eq!(listed[1]["catch_up"], "one");
    let local = listed[1]["next_fire_local"]
        .as_str()
        .expect("a local next tick")
        .to_string();
    assert!(local.contains("T09:00:00+0"), "{local}");

    let text = stdout(&run(cli(dir.path(), &["schedules", "list"])).await.success());
    assert!(
        text.contains("every 1h") && text.contains("Europe/Paris"),
        "{text}"
    );
    let card = stdout(
        &run(cli(
            dir.path(),
            &["schedules", "describe", "morning", "--time-format", "iso"],
        ))
        .await
        .success(),
    );
    assert!(
        card.contains("Next tick (local)") && card.contains(&local),
        "{card}"
    );
    assert!(
        card.contains("cron \"0 9 * * *\" in Europe/Paris"),
        "{card}"
    );

    // Paused through the owner's inbox, and waited for.
    let paused = run(cli(
        dir.path(),
        &["schedules", "pause", "morning", "--wait", "-o", "json"],
    ))
    .await
    .success();
    let value = json(&paused);
    assert_eq!(value["state"], "applied", "{value}");
    assert_eq!(value["answer"]["kind"], "schedule");
    assert_eq!(value["answer"]["paused"], true);
    assert!(stderr(&paused).contains("Pausing it"));
    schedules_until(dir.path(), |v| {
        v[1]["paused"] == true && v[1]["next_fire_ms"].is_null()
    })
    .await;
    let morning = owner.runtime.view().schedule("morning").await;
    assert!(morning.expect("read").expect("the schedule").paused);

    let resumed = json(
        &run(cli(
            dir.path(),
            &["schedules", "resume", "morning", "--wait", "-o", "json"],
        ))
        .await
        .success(),
    );
    assert_eq!(resumed["answer"]["paused"], false, "{resumed}");
    assert!(resumed["answer"]["next_fire_ms"].is_u64(), "{resumed}");

    // An unknown schedule is refused by name; nothing is sent.
    let missing = run(cli(dir.path(), &["schedules", "pause", "nightly"]))
        .await
        .code(1);
    assert!(
        stderr(&missing).contains("schedule \"nightly\" not found"),
        "{}",
        stderr(&missing)
    );
    owner.stop().await;
}

#[cfg(feature = "ui")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_schedules_and_pauses_one() {
    use crate::ui::{command_path, page_with};
    use crate::web::Dashboard;

    let dir = tempfile::tempdir().expect("a temp dir");
    let owner = owner_with_schedules(dir.path()).await;
    let ui = Dashboard::start(dir.path(), &[]).await;
    let page = page_with(&ui, "/schedules", "morning").await;
    page.has(&[
        "hourly",
        "every 1h",
        "Europe/Paris",
        "T09:00:00+0",
        "action=\"/schedules/morning/pause\"",
    ]);
    let token = page.token();
    // A form without the dashboard's token sends nothing.
    ui.post("/schedules/morning/pause", &[("csrf", "forged")])
        .await
        .expect(403);
    ui.post("/schedules/nightly/pause", &[("csrf", &token)])
        .await
        .expect(404);
    let sent = ui
        .post("/schedules/morning/pause", &[("csrf", &token)])
        .await
        .expect(303);
    page_with(&ui, &command_path(&sent), "badge b-applied")
        .await
        .has(&["schedule morning is paused"]);
    page_with(&ui, "/schedules", "action=\"/schedules/morning/resume\"").await;
    ui.stop().await;

    // Read-only: listed, with no buttons, and a post is refused.
    let ui = Dashboard::start(dir.path(), &["--read-only"]).await;
    page_with(&ui, "/schedules", "morning")
        .await
        .lacks(&["/schedules/morning/resume\"", "name=\"csrf\""]);
    ui.post("/schedules/morning/resume", &[("csrf", "anything")])
        .await
        .expect(403)
        .has(&["read-only"]);
    ui.stop().await;
    owner.stop().await;
}
