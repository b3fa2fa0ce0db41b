//! The inbox of a local-directory store under hostile input, as written by
//! anyone who may send commands: links out of the store, names that are
//! not object names, a link loop, FIFOs, thousands of junk objects and
//! submits no in-process caller could make. The owner never follows a
//! link out of the store, never opens what is not a regular file, never
//! stalls on an entry it cannot name, applies valid commands ahead of
//! junk, and checks inbox submits as it checks in-process ones.

use crate::common;
use crate::inbox::{rejection, settled};
use crate::operator::second_process;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use taquba::object_store::ObjectStore;
use taquba_workflow::workflows::{StepContext, Transition};
use taquba_workflow::{
    MemoStore, NoopTerminalHook, RunOptions, RunSpec, RunState, Step, StepError, StepOutcome,
    StepRunner, TerminalStatus, WorkflowRuntime, WorkflowView, inbox::Command,
    inbox::CommandAnswer, inbox::CommandId, inbox::CommandState, inbox::Inbox, workflow,
};

const HOUR: Duration = Duration::from_secs(3600);

/// `slow*` runs wait an hour at step 1; the rest succeed at once.
#[derive(Clone, Default)]
struct Slow;

impl StepRunner for Slow {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        if step.run_id.to_string().starts_with("slow") && step.step_number == 0 {
            return Ok(StepOutcome::continue_after(vec![], HOUR));
        }
        Ok(StepOutcome::Succeed {
            result: b"ok".to_vec(),
        })
    }
}

fn runtime_on<R: StepRunner + 'static>(
    queue: &Arc<taquba::Queue>,
    store: &Arc<dyn ObjectStore>,
    runner: R,
) -> WorkflowRuntime<R, NoopTerminalHook> {
    WorkflowRuntime::builder(queue.clone(), store.clone(), runner, NoopTerminalHook)
        .poll_interval(Duration::from_millis(50))
        .build()
}

/// The inbox directory of the default runtime in the store at `dir`.
fn inbox_dir(dir: &FsPath) -> PathBuf {
    dir.join(MEMO_PREFIX).join("inbox").join("v1")
}

/// Every regular file under `dir`, with its bytes.
fn files_under(dir: &FsPath) -> Vec<(PathBuf, Vec<u8>)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            found.extend(files_under(&entry.path()));
        } else if kind.is_file() {
            found.push((entry.path(), std::fs::read(entry.path()).unwrap()));
        }
    }
    found.sort();
    found
}

/// A cancel of `run` encoded as command `id` would be, written by
/// another store's inbox (so the object can be planted anywhere).
async fn encoded_cancel(run: &str) -> (CommandId, Vec<u8>) {
    let elsewhere = tempfile::tempdir().unwrap();
    let store = dir_store(elsewhere.path());
    let id = Inbox::new(store, MEMO_PREFIX)
        .send(Command::cancel(rid(run), Some("planted".into())))
        .await
        .unwrap();
    let bytes = std::fs::read(inbox_dir(elsewhere.path()).join(format!("{id}.msgpack"))).unwrap();
    (id, bytes)
}

#[tokio::test(start_paused = true)]
async fn links_in_the_inbox_lead_nowhere_outside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_on(&queue, &store, Slow);
    submit_run(&runtime, "slow-target").await;
    submit_run(&runtime, "slow-real").await;
    let worker = runtime.spawn(std::future::pending::<()>());
    until_step("the target's timer", &runtime, "slow-target", 1).await;
    until_step("the real one's timer", &runtime, "slow-real", 1).await;

    // Outside the store: files (one nested), and a command object that
    // would cancel a run if it were read through a link.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join("nested")).unwrap();
    std::fs::write(outside.path().join("precious.txt"), b"keep me").unwrap();
    std::fs::write(outside.path().join("nested/deeper.txt"), b"and me").unwrap();
    let (planted, bytes) = encoded_cancel("slow-target").await;
    std::fs::write(outside.path().join("cmd.msgpack"), &bytes).unwrap();
    let before = files_under(outside.path());

    let inbox = inbox_dir(dir.path());
    std::fs::create_dir_all(&inbox).unwrap();
    symlink(outside.path(), inbox.join("zz-link")).unwrap();
    symlink(outside.path().join("nested"), inbox.join("00-nested-link")).unwrap();
    symlink(
        outside.path().join("cmd.msgpack"),
        inbox.join(format!("{planted}.msgpack")),
    )
    .unwrap();
    symlink("..", inbox.join("loop")).unwrap();

    let real = Inbox::new(store.clone(), MEMO_PREFIX)
        .send(Command::cancel(rid("slow-real"), None))
        .await
        .unwrap();
    let view = runtime.view();
    assert!(matches!(
        settled(view, &real).await,
        CommandState::Applied {
            answer: CommandAnswer::Cancelled {
                cancelled: true,
                ..
            },
            ..
        }
    ));
    // More rounds, so whatever the owner does to the links is done.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        files_under(outside.path()),
        before,
        "nothing outside was touched"
    );
    // The command behind the link was never read: not applied, not pending.
    assert_eq!(view.command(&planted).await.unwrap(), CommandState::Unknown);
    let target = runtime.status(&rid("slow-target")).await.unwrap().unwrap();
    assert_eq!(
        target.state,
        RunState::Pending,
        "the planted cancel did nothing"
    );
    // The links are left where they are.
    for name in ["zz-link", "00-nested-link", "loop"] {
        assert!(
            inbox.join(name).symlink_metadata().unwrap().is_symlink(),
            "{name}"
        );
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn entries_the_listing_cannot_name_do_not_stall_the_commands_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_on(&queue, &store, Slow);
    let inbox = inbox_dir(dir.path());
    std::fs::create_dir_all(inbox.join("sub")).unwrap();
    let odd: [&[u8]; 4] = [b"\xff\xfe.msgpack", b"a\nb", b"tab\there.msgpack", b"0\x01"];
    for name in odd {
        std::fs::write(inbox.join(OsStr::from_bytes(name)), b"junk").unwrap();
    }
    std::fs::write(inbox.join("sub").join(OsStr::from_bytes(b"\xc3\x28")), b"").unwrap();
    symlink("..", inbox.join("loop")).unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    let sender = Inbox::new(store.clone(), MEMO_PREFIX);
    let mut ids = Vec::new();
    for n in 0..3 {
        submit_run(&runtime, &format!("slow-{n}")).await;
        until_step("the timer", &runtime, &format!("slow-{n}"), 1).await;
        ids.push(
            sender
                .send(Command::cancel(rid(&format!("slow-{n}")), None))
                .await
                .unwrap(),
        );
    }
    for id in &ids {
        assert!(matches!(
            within(10, settled(runtime.view(), id)).await,
            CommandState::Applied { .. }
        ));
    }
    // What the owner could not name is left alone.
    for name in odd {
        assert!(inbox.join(OsStr::from_bytes(name)).exists());
    }
    assert!(
        inbox
            .join("sub")
            .join(OsStr::from_bytes(b"\xc3\x28"))
            .exists()
    );
    worker.shutdown().await.unwrap();
}

/// A FIFO at `path`. A reader blocked opening it (the bug this guards
/// against) would hang the test, as tokio's paused clock does not advance
/// while a blocking task runs: after [`FIFO_PATIENCE`] of real time a
/// thread opens it for writing whenever a reader waits, so such a test
/// fails on its assertions instead.
struct Fifo {
    path: PathBuf,
    done: Arc<std::sync::atomic::AtomicBool>,
}

/// How long a reader may stay blocked on a [`Fifo`] before it is released.
const FIFO_PATIENCE: Duration = Duration::from_secs(10);

impl Fifo {
    fn at(path: PathBuf) -> Self {
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo {}", path.display());
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (releasing, stop) = (path.clone(), done.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if started.elapsed() >= FIFO_PATIENCE {
                    release(&releasing);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { path, done }
    }
}

/// Open the FIFO at `path` for writing without waiting: it succeeds only
/// when a reader waits in `open`, which it releases.
fn release(path: &FsPath) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
}

impl Drop for Fifo {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::SeqCst);
        release(&self.path);
    }
}

#[tokio::test(start_paused = true)]
async fn fifos_in_the_inbox_are_never_opened() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_on(&queue, &store, Slow);
    submit_run(&runtime, "slow-1").await;
    let sender = Inbox::new(store.clone(), MEMO_PREFIX);
    let real = sender
        .send(Command::cancel(rid("slow-1"), None))
        .await
        .unwrap();
    // The touch the send wrote becomes a FIFO, and a FIFO takes a
    // command's name.
    let touch = dir.path().join(MEMO_PREFIX).join("inbox").join("touch");
    std::fs::remove_file(&touch).unwrap();
    let _touch = Fifo::at(touch);
    let named = command_id(ulid::Ulid::new());
    let _named = Fifo::at(inbox_dir(dir.path()).join(format!("{named}.msgpack")));

    // A second process asking about the FIFO-named command is answered.
    let (reader, their_store) = second_process(dir.path()).await;
    let view = WorkflowView::new(
        reader.view().clone(),
        MemoStore::new(their_store, MEMO_PREFIX),
    );
    assert_eq!(
        within(5, view.command(&named)).await.unwrap(),
        CommandState::Unknown
    );

    let worker = runtime.spawn(std::future::pending::<()>());
    assert!(matches!(
        settled(runtime.view(), &real).await,
        CommandState::Applied { .. }
    ));
    // And the owner keeps going: a later command is applied too.
    submit_run(&runtime, "slow-2").await;
    let later = sender
        .send(Command::cancel(rid("slow-2"), None))
        .await
        .unwrap();
    // (The send replaced the touch FIFO with a file: put it back.)
    let touch = dir.path().join(MEMO_PREFIX).join("inbox").join("touch");
    std::fs::remove_file(&touch).unwrap();
    let _touch_again = Fifo::at(touch);
    assert!(matches!(
        settled(runtime.view(), &later).await,
        CommandState::Applied { .. }
    ));
    worker.shutdown().await.unwrap();
    reader.close().await.unwrap();
}

/// The command id `ulid` is.
fn command_id(ulid: ulid::Ulid) -> CommandId {
    ulid.to_string().parse().expect("a ULID is a command id")
}

/// Junk objects named as commands older than a real cancel: the cancel
/// is applied in the first round that lists it, and the junk rejected in
/// bulk around it. Measured on the real clock (the figure is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_command_does_not_wait_behind_thousands_of_junk_objects() {
    const JUNK: usize = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_on(&queue, &store, Slow);
    let worker = runtime.spawn(std::future::pending::<()>());
    submit_run(&runtime, "slow-behind-junk").await;
    let view = runtime.view();
    for _ in 0..3_000 {
        let step = runtime
            .status(&rid("slow-behind-junk"))
            .await
            .unwrap()
            .map(|s| s.current_step);
        if step == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let inbox = inbox_dir(dir.path());
    std::fs::create_dir_all(&inbox).unwrap();
    let an_hour_ago = SystemTime::now() - HOUR;
    let mut junk_ids = Vec::new();
    for n in 0..JUNK {
        let id = ulid::Ulid::from_datetime(an_hour_ago + Duration::from_millis(n as u64));
        std::fs::write(inbox.join(format!("{id}.msgpack")), b"\x93junk").unwrap();
        junk_ids.push(command_id(id));
    }
    let sent = Instant::now();
    let cancel = Inbox::new(store.clone(), MEMO_PREFIX)
        .send(Command::cancel(rid("slow-behind-junk"), None))
        .await
        .unwrap();
    let mut state = CommandState::Pending;
    while sent.elapsed() < Duration::from_secs(180) {
        state = view.command(&cancel).await.unwrap();
        if matches!(state, CommandState::Applied { .. }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = sent.elapsed();
    eprintln!("a cancel behind {JUNK} junk objects was applied after {took:?}");
    assert!(matches!(state, CommandState::Applied { .. }), "{state:?}");
    assert!(
        took < Duration::from_secs(8),
        "the cancel waited {took:?} behind {JUNK} junk objects"
    );
    // The junk is rejected, each with its reason, and leaves the inbox.
    for id in [&junk_ids[0], &junk_ids[JUNK / 2], &junk_ids[JUNK - 1]] {
        let reason = rejection(settled(view, id).await);
        assert!(reason.contains("not a command"), "{reason}");
    }
    let mut left = usize::MAX;
    for _ in 0..3_000 {
        left = std::fs::read_dir(&inbox).unwrap().count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left, 0, "junk left in the inbox");
    eprintln!(
        "all {JUNK} junk objects rejected and removed {:?} after the cancel was sent",
        sent.elapsed()
    );
    worker.shutdown().await.unwrap();
}

/// The workflow the submit checks are made against.
#[derive(Default)]
pub struct Greet;

#[workflow(name = "greet", output = String)]
impl Greet {
    #[step(start)]
    async fn hello(name: String) -> Result<Transition<GreetStep>, StepError> {
        Ok(Transition::next(GreetStep::Bye { name }))
    }

    #[step]
    async fn bye(ctx: StepContext<'_>, name: String) -> Result<Transition<GreetStep>, StepError> {
        let _ = ctx.step_name();
        Ok(Transition::done(format!("bye {name}")))
    }
}

/// A submit command object written by hand (as a tool in another language
/// would, with nothing checked on the way).
#[derive(serde::Serialize)]
struct HandSubmit {
    format: u32,
    id: String,
    sent_at_ms: u64,
    command: HandSubmitKind,
}

#[derive(serde::Serialize)]
struct HandSubmitKind {
    kind: &'static str,
    run_id: String,
    #[serde(serialize_with = "as_bytes")]
    input: Vec<u8>,
    headers: HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_at_ms: Option<u64>,
}

fn as_bytes<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

/// A `#[workflow]` envelope naming `workflow` and `step`, written by hand.
fn envelope(workflow: &str, step: &str) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Envelope<'a> {
        workflow: &'a str,
        step: HashMap<&'a str, HashMap<&'a str, String>>,
    }
    rmp_serde::to_vec_named(&Envelope {
        workflow,
        step: [(step, [("name", "ada".to_string())].into())].into(),
    })
    .unwrap()
}

/// A hand-written submit: its run id, input, headers and run time, and
/// what its rejection must name.
type Case = (
    &'static str,
    Vec<u8>,
    HashMap<String, String>,
    Option<u64>,
    String,
);

#[tokio::test(start_paused = true)]
async fn inbox_submits_are_checked_like_in_process_ones() {
    let dir = tempfile::tempdir().unwrap();
    let clock = taquba::MockClock::new(T0);
    let store = dir_store(dir.path());
    let queue = open(&store, &clock).await;
    let runtime = runtime_on(&queue, &store, Greet);
    let inbox = inbox_dir(dir.path());
    std::fs::create_dir_all(&inbox).unwrap();
    let many: HashMap<String, String> = (0..18_000)
        .map(|n| (format!("h{n}"), "v".repeat(40)))
        .collect();
    let far = u64::MAX - 1;
    let cases: Vec<Case> = vec![
        (
            "unknown-workflow",
            envelope("nope", "hello"),
            HashMap::new(),
            None,
            "\"nope\"".to_string(),
        ),
        (
            "unknown-step",
            envelope("greet", "wave"),
            HashMap::new(),
            None,
            "\"wave\"".to_string(),
        ),
        (
            "random-bytes",
            b"\xc1\x07random".to_vec(),
            HashMap::new(),
            None,
            "not a `#[workflow]` step envelope".to_string(),
        ),
        (
            "many-headers",
            envelope("greet", "hello"),
            many.clone(),
            None,
            "18000 headers".to_string(),
        ),
        (
            "far-future",
            envelope("greet", "hello"),
            HashMap::new(),
            Some(far),
            far.to_string(),
        ),
    ];
    let mut sent = Vec::new();
    for (n, (run, input, headers, run_at_ms, expected)) in cases.into_iter().enumerate() {
        let id = command_id(ulid::Ulid::from_parts(T0 + n as u64, n as u128));
        let bytes = rmp_serde::to_vec_named(&HandSubmit {
            format: 1,
            id: id.to_string(),
            sent_at_ms: 0,
            command: HandSubmitKind {
                kind: "submit",
                run_id: run.to_string(),
                input,
                headers,
                run_at_ms,
            },
        })
        .unwrap();
        std::fs::write(inbox.join(format!("{id}.msgpack")), bytes).unwrap();
        sent.push((run, id, expected));
    }
    let valid = Inbox::new(store.clone(), MEMO_PREFIX)
        .send(Command::Submit(
            taquba_workflow::inbox::SubmitCommand::new(envelope("greet", "hello"))
                .run_id(rid("fine")),
        ))
        .await
        .unwrap();

    let worker = runtime.spawn(std::future::pending::<()>());
    let view = runtime.view();
    for (run, id, expected) in &sent {
        let reason = rejection(settled(view, id).await);
        assert!(reason.contains(expected.as_str()), "{run}: {reason}");
        assert!(
            runtime.status(&rid(run)).await.unwrap().is_none(),
            "{run} was not submitted"
        );
    }
    assert!(matches!(
        settled(view, &valid).await,
        CommandState::Applied { .. }
    ));
    let end = within(30, runtime.wait(&rid("fine"))).await.unwrap();
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);

    // The in-process submit holds to the same limits, naming the value.
    let err = runtime
        .submit(RunSpec {
            run_id: Some(rid("many-in-process")),
            input: envelope("greet", "hello"),
            options: RunOptions {
                headers: many,
                ..RunOptions::default()
            },
            ..RunSpec::default()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("18000 headers"), "{err}");
    let err = runtime
        .submit(RunSpec {
            run_id: Some(rid("far-in-process")),
            input: envelope("greet", "hello"),
            options: RunOptions {
                run_at: Some(UNIX_EPOCH + Duration::from_millis(far)),
                ..RunOptions::default()
            },
            ..RunSpec::default()
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains(&far.to_string()), "{err}");
    for run in ["many-in-process", "far-in-process"] {
        assert!(runtime.status(&rid(run)).await.unwrap().is_none());
    }
    worker.shutdown().await.unwrap();
}
