//! Values at the edges of what the API takes: builder and queue options (a
//! hook timeout or a lease of `Duration::MAX`, a zero lease or poll
//! interval, unbounded concurrency, a queue name the queue refuses), the
//! longest delays and the empty signal key, an attempt limit of 0, and
//! headers, inputs, member keys and terminal records at and past their
//! limits. Each is refused naming the limit, with nothing committed, or
//! carried whole to the run's end; none panics, spins or leaves a run
//! stuck.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::*;
use crate::fixtures::{
    Counting, Scripted, Tally, TrackedMembers, ends_within, join_all, queue_with, spec,
    tokio_clock_queue, tracked_runtime,
};
use futures_util::TryStreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::{
    Error, GroupMember, RunOptions, RunOutcome, RunSpec, SignalOutcome, Step, StepError,
    StepOutcome, StepRunner, TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime,
    limits::MAX_HEADERS, limits::MAX_HEADERS_SIZE, limits::MAX_MEMBER_KEY_LEN,
};
use taquba_workflow_suite::testing::TokioClock;

// ---------------------------------------------------------------------------
// Builder and queue options at their edges.

/// `hook_timeout(Duration::MAX)`, the obvious spelling of "no timeout":
/// the builder's doc says "Before each call the notification's lease is
/// extended to cover the timeout, so a longer timeout than the lease is
/// safe". The hook must be called, once, and the run's notification
/// acknowledged; nothing may panic.
#[tokio::test(start_paused = true)]
async fn a_hook_timeout_of_duration_max_still_calls_the_hook() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Counting::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Scripted::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .hook_timeout(Duration::MAX)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("forever", "ok")).await.unwrap();
    let end = ends_within(&runtime, "forever", 30, "hook_timeout(MAX)").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        !hook.calls_of("forever").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(hook.calls_of("forever"), vec![TerminalStatus::Succeeded]);
    let stats = queue.view().stats(STEPS).await.unwrap();
    assert_eq!(
        (stats.pending, stats.claimed, stats.scheduled, stats.dead),
        (0, 0, 0, 0),
        "{stats:?}"
    );
    worker.shutdown().await.unwrap();
}

/// `max_concurrent_steps(usize::MAX)`, a plausible spelling of "no
/// bound": the doc says "The most runner (and terminal hook) calls in
/// flight at once (default 8; at least 1)". The worker must run the run,
/// not panic.
#[tokio::test(start_paused = true)]
async fn an_unbounded_max_concurrent_steps_runs_steps() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default())
        .max_concurrent_steps(usize::MAX)
        .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("many", "ok")).await.unwrap();
    let end = ends_within(&runtime, "many", 30, "usize::MAX slots").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.unwrap();
}

/// A runtime whose queue name the queue refuses (over taquba's 255
/// bytes): `submit` must refuse with an error naming the problem, and the
/// worker loop must end with that error rather than retry forever a claim
/// that can never work.
#[tokio::test(start_paused = true)]
async fn an_invalid_queue_name_is_refused_naming_it() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default())
        .queue_name("q".repeat(256))
        .build();
    let err = runtime.submit(spec("bad-queue", "ok")).await.unwrap_err();
    assert!(err.to_string().contains("255 bytes"), "unclear: {err}");
    let worker = runtime.spawn(std::future::pending::<()>());
    let ended = tokio::time::timeout(Duration::from_secs(30), worker.wait()).await;
    match ended {
        Ok(Err(err)) => assert!(err.to_string().contains("255 bytes"), "{err}"),
        Ok(Ok(())) => panic!("the worker ended without an error"),
        Err(_) => panic!("the worker loop keeps retrying a queue name that can never work"),
    }
}

/// `poll_interval(Duration::ZERO)`: the doc says it is "How long an idle
/// worker waits before re-checking the queue". An idle worker must still
/// wait (for new work, or a short floor) instead of re-claiming in a loop
/// that keeps a core busy. Under paused time such a loop also keeps the
/// clock from ever moving, so the run's first commit (which waits for a
/// WAL flush on a 1 ms timer) never returns: the test runs the paused
/// runtime on a thread of its own and gives up on it after a minute of
/// real time (it takes milliseconds when nothing spins).
#[test]
fn a_zero_poll_interval_does_not_spin_the_idle_worker() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let status = rt.block_on(async {
            let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
            let runtime = workflow_builder(&queue, &store, &Scripted::default())
                .poll_interval(Duration::ZERO)
                .build();
            let worker = runtime.spawn(std::future::pending::<()>());
            tokio::time::sleep(Duration::from_secs(1)).await;
            runtime.submit(spec("zero", "timer:500")).await.unwrap();
            let end = ends_within(&runtime, "zero", 30, "poll interval 0").await;
            worker.shutdown().await.unwrap();
            end.termination.status
        });
        let _ = done.send(status);
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(status) => assert_eq!(status, TerminalStatus::Succeeded),
        Err(_) => panic!(
            "a worker with poll_interval(0) spins: a minute of real time and the paused clock never moved"
        ),
    }
}

/// A queue whose lease is zero (`QueueConfig::lease_duration(ZERO)`): a
/// nonsensical setting, but one taquba accepts. The runtime must not
/// panic, and a run whose steps are quick must still end; a hook that
/// awaits must still be called (the default hook timeout is derived from
/// the lease).
#[tokio::test(start_paused = true)]
async fn a_zero_lease_does_not_panic_and_quick_runs_end() {
    #[derive(Clone, Default)]
    struct Awaits {
        calls: Arc<AtomicUsize>,
    }
    impl TerminalHook for Awaits {
        async fn on_termination(
            &self,
            _outcome: &RunOutcome,
            _effects: &TerminalEffects,
        ) -> Result<(), StepError> {
            tokio::time::sleep(Duration::from_millis(1)).await;
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::ZERO, Duration::ZERO).await;
    let hook = Awaits::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Scripted::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("no-lease", "timer:10")).await.unwrap();
    let end = ends_within(&runtime, "no-lease", 60, "a zero lease").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        hook.calls.load(Ordering::SeqCst) > 0
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// A queue whose lease is `Duration::MAX` (a plausible "never reap"): the
/// runtime must run steps and call the hook, not panic.
#[tokio::test(start_paused = true)]
async fn a_lease_of_duration_max_runs_steps_and_hooks() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = queue_with(store.clone(), Duration::MAX, Duration::ZERO).await;
    let hook = Counting::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Scripted::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime
        .submit(spec("forever-lease", "timer:10"))
        .await
        .unwrap();
    let end = ends_within(&runtime, "forever-lease", 60, "a MAX lease").await;
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    eventually("the hook call", || async {
        !hook.calls_of("forever-lease").is_empty()
    })
    .await;
    worker.shutdown().await.unwrap();
}

/// Runners returning the longest durations (`continue_after(MAX)`,
/// `continue_on_signal(.., MAX)`) and the empty correlation key: nothing
/// panics; the runs are readable (`status`, `view().run`, `view().runs`,
/// `view().steps`) while they wait; the signal wait is woken by a signal
/// on the empty key; the timer run is cancelled.
#[tokio::test(start_paused = true)]
async fn the_longest_delays_and_the_empty_key_are_waited_on_read_and_ended() {
    #[derive(Clone)]
    struct Extremes;
    impl StepRunner for Extremes {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            if step.step_number > 0 {
                return Ok(StepOutcome::Succeed {
                    result: step.signal.clone().unwrap_or_default(),
                });
            }
            Ok(match step.payload.as_slice() {
                b"timer" => StepOutcome::continue_after(b"later".to_vec(), Duration::MAX),
                _ => StepOutcome::continue_on_signal(b"woken".to_vec(), "", Duration::MAX),
            })
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Extremes).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    runtime.submit(spec("far-timer", "timer")).await.unwrap();
    runtime.submit(spec("empty-key", "signal")).await.unwrap();
    until_step("the timer", &runtime, "far-timer", 1).await;
    until_step("the wait", &runtime, "empty-key", 1).await;
    for id in ["far-timer", "empty-key"] {
        let details = runtime.view().run(&rid(id)).await.unwrap().unwrap();
        assert!(details.scheduled_at_ms.is_some(), "{id}: {details:?}");
        runtime.view().steps(&rid(id)).await.unwrap();
    }
    let page = runtime
        .view()
        .runs(&taquba_workflow::view::RunFilter::new())
        .await
        .unwrap();
    assert_eq!(page.runs.len(), 2);
    assert_eq!(
        runtime.signal("", b"hi".to_vec()).await.unwrap(),
        SignalOutcome::Delivered
    );
    let end = ends_within(&runtime, "empty-key", 30, "the empty key").await;
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"hi"[..])
    );
    assert!(runtime.cancel(&rid("far-timer")).await.unwrap());
    let end = ends_within(&runtime, "far-timer", 30, "the far timer").await;
    assert_eq!(end.termination.status, TerminalStatus::Cancelled);
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Submissions at their edges: attempt limits, headers, inputs.

/// An attempt limit of 0 is refused by the inbox ("an attempt limit of 0"
/// is an `InvalidCommand`), and the owner "validates each command as the
/// in-process API validates its arguments": `submit` refuses it too, or the
/// run still ends. It must not be accepted and then never run. Refused, the
/// error names the field and the value (as the inbox's does) and no run is
/// committed; accepted (what this
/// version does: `RunOptions::max_attempts_per_step` documents no
/// refusal), each step gets one attempt: a run that succeeds ends with its
/// result, and a transient failure fails its run after that one attempt.
#[tokio::test(start_paused = true)]
async fn an_attempt_limit_of_zero_is_refused_or_the_run_ends() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = Scripted::default();
    let runtime = workflow_builder(&queue, &store, &runner).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (id, input) in [("zero-attempts", "ok"), ("zero-attempts-flaky", "trans")] {
        let mut zero = spec(id, input);
        zero.options.max_attempts_per_step = Some(0);
        match runtime.submit(zero).await {
            Err(err) => {
                let message = err.to_string();
                assert!(
                    message.contains("max_attempts_per_step") && message.contains(" 0"),
                    "{id}: the refusal does not name the field and the value: {message}"
                );
                assert!(
                    runtime.status(&rid(id)).await.unwrap().is_none(),
                    "{id}: a refused submission committed a run"
                );
            }
            Ok(submitted) => {
                assert!(submitted.newly_submitted, "{id}");
                let end = ends_within(&runtime, id, 30, "zero attempts").await;
                if input == "ok" {
                    assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
                    assert_eq!(
                        end.outcome.and_then(|o| o.result).as_deref(),
                        Some(&b"ok"[..]),
                        "{id}: the result"
                    );
                } else {
                    assert_eq!(end.termination.status, TerminalStatus::Failed, "{id}");
                    assert_eq!(
                        end.termination.error.as_deref(),
                        Some("always flaky"),
                        "{id}"
                    );
                }
                assert_eq!(runner.calls_of(id), 1, "{id}: runner calls");
            }
        }
    }
    worker.shutdown().await.unwrap();
}

/// Reserved header names are refused wherever they are given, including
/// case variants that a case-insensitive header store would take for them.
#[tokio::test(start_paused = true)]
async fn reserved_headers_are_refused_in_a_submission() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    for name in ["workflow.run_id", "workflow.", "workflow.step"] {
        let mut spec = spec("hdr", "ok");
        spec.options.headers.insert(name.to_string(), "x".into());
        match runtime.submit(spec).await {
            Err(Error::ReservedHeaderInSubmit(_)) => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(runtime.status(&rid("hdr")).await.unwrap().is_none());
}

/// Headers at their edges. `RunOptions::headers` documents the rules:
/// names starting with `workflow.` are reserved, and a submission carries
/// at most `MAX_HEADERS` headers of `MAX_HEADERS_SIZE` bytes in all, or is
/// refused with `InvalidRunOptions` naming the limit and the value, with
/// nothing submitted. So an empty name (no rule against it), exactly
/// `MAX_HEADERS` headers and exactly `MAX_HEADERS_SIZE` bytes are carried:
/// the run ends `Succeeded` and the hook sees its headers intact. A 1 MiB
/// value and 5 000 headers are refused, naming the size or the count, and
/// leave no run behind. Never a panic, never a run accepted and then stuck.
#[tokio::test(start_paused = true)]
async fn headers_at_their_edges_are_refused_or_carried_to_the_end() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let hook = Recorder::default();
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Scripted::default(),
        hook.clone(),
    )
    .poll_interval(Duration::from_millis(20))
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    type Headers = std::collections::HashMap<String, String>;
    let huge: Headers = [("big".to_string(), "v".repeat(1 << 20))].into();
    let many: Headers = (0..5_000)
        .map(|i| (format!("h{i}"), format!("{i}")))
        .collect();
    // `None`: carried; `Some(text)`: refused, the error naming `text`.
    let cases: Vec<(&str, Headers, Option<String>)> = vec![
        (
            "empty-name",
            [(String::new(), "v".to_string())].into(),
            None,
        ),
        (
            "most",
            (0..MAX_HEADERS)
                .map(|i| (format!("h{i}"), format!("{i}")))
                .collect(),
            None,
        ),
        (
            "largest",
            [("big".to_string(), "v".repeat(MAX_HEADERS_SIZE - 3))].into(),
            None,
        ),
        (
            "huge-value",
            huge,
            Some(format!(
                "the 1 headers take {} bytes (names and values), more than the {MAX_HEADERS_SIZE} allowed",
                3 + (1 << 20)
            )),
        ),
        (
            "many",
            many,
            Some(format!("5000 headers, more than the {MAX_HEADERS} allowed")),
        ),
    ];
    for (id, headers, refusal) in cases {
        let mut submission = spec(id, "timer:10");
        submission.options.headers = headers.clone();
        let submitted = runtime.submit(submission).await;
        match refusal {
            Some(names) => {
                match &submitted {
                    Err(Error::InvalidRunOptions(message)) => {
                        assert_eq!(message, &names, "{id}: the refusal")
                    }
                    other => panic!("{id}: expected InvalidRunOptions, got {other:?}"),
                }
                assert!(
                    runtime.status(&rid(id)).await.unwrap().is_none(),
                    "{id}: a refused submission committed a run"
                );
            }
            None => {
                assert!(submitted.unwrap().newly_submitted, "{id}");
                let end = ends_within(&runtime, id, 60, "accepted headers").await;
                assert_eq!(end.termination.status, TerminalStatus::Succeeded, "{id}");
                eventually("the hook call", || async {
                    hook.calls().iter().any(|o| o.run_id.as_str() == id)
                })
                .await;
                let seen = hook
                    .calls()
                    .into_iter()
                    .find(|o| o.run_id.as_str() == id)
                    .unwrap();
                assert_eq!(seen.headers, headers, "{id}: headers reported");
            }
        }
    }
    let stats = queue.view().stats(STEPS).await.unwrap();
    assert_eq!(stats.dead, 0, "{stats:?}");
    worker.shutdown().await.unwrap();
}

/// An input of several MiB (larger than a queue payload usually is) runs
/// and comes back whole.
#[tokio::test(start_paused = true)]
async fn a_multi_mebibyte_input_runs_and_is_echoed_whole() {
    let (queue, store, _clock) = memory_queue().await;
    let runtime = workflow_builder(&queue, &store, &Scripted::default()).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let input: Vec<u8> = (0..(5 * 1024 * 1024))
        .map(|i| b'a' + (i % 26) as u8)
        .collect();
    let outcome = runtime
        .submit(RunSpec {
            run_id: Some(rid("big")),
            input: input.clone(),
            ..Default::default()
        })
        .await;
    match outcome {
        Ok(_) => {
            let end = within(120, runtime.wait(&rid("big"))).await.unwrap();
            assert_eq!(end.termination.status, TerminalStatus::Succeeded);
            assert_eq!(end.outcome.and_then(|o| o.result), Some(input));
        }
        Err(err) => panic!("a 5 MiB input was refused: {err}"),
    }
    worker.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------
// Group member keys and terminal records at their edges.

/// A key of 100 KB of text ("any text", but `RunGroup::submit` documents
/// `MemberKeyTooLong` for a key over `MAX_MEMBER_KEY_LEN`, 16 KiB): the
/// submission is refused, naming the key's length, the limit and the key's
/// start, without a panic, and nothing is submitted (no group, no run of
/// either member, so a resume finds no group); the runtime keeps working.
#[tokio::test(start_paused = true)]
async fn a_100_kb_member_key_is_accepted_or_refused_without_a_panic() {
    let (queue, store, _clock) = memory_queue().await;
    let runner = TrackedMembers::default();
    let tally = Tally::default();
    let rt = tracked_runtime(&queue, &store, &runner, &tally);
    let worker = rt.spawn(std::future::pending::<()>());
    let key = "x".repeat(100 * 1024);
    let members = vec![member(&key, "ok"), member("small", "ok")];
    let submitting = {
        let group = rt.group(rid("huge-key"));
        let members = members.clone();
        tokio::spawn(async move { group.submit(members, &RunOptions::default()).await })
    };
    let submitted = within(30, submitting).await;
    let group = rt.group(rid("huge-key"));
    let status = group.status().await;
    let member_runs = [
        rt.status(&member_run_id("huge-key", &key)).await.unwrap(),
        rt.status(&member_run_id("huge-key", "small"))
            .await
            .unwrap(),
    ];
    // The runtime still works.
    let other = rt.group(rid("after-huge-key"));
    other
        .submit(vec![member("a", "ok")], &RunOptions::default())
        .await
        .unwrap();
    let after = within(30, async {
        other.results().await.unwrap().try_collect::<Vec<_>>().await
    })
    .await;
    let resumed = within(30, async {
        let group = rt.group(rid("huge-key"));
        tokio::spawn(async move { group.resume(&RunOptions::default()).await }).await
    })
    .await;
    worker.shutdown().await.unwrap();
    assert!(
        after.is_ok_and(|r| r.len() == 1),
        "the runtime stopped working"
    );
    let refusal = match submitted {
        Ok(Ok(())) => panic!(
            "a {}-byte member key was accepted, over MAX_MEMBER_KEY_LEN ({MAX_MEMBER_KEY_LEN})",
            key.len()
        ),
        Ok(Err(e)) => e,
        Err(join) => panic!(
            "submitting a group with a 100 KB key panicked ({}); the group is then {:?}, \
             and resume {}",
            if join.is_panic() {
                panic_message(join.into_panic())
            } else {
                String::new()
            },
            status.map(|s| (s.total, s.pending)),
            match resumed {
                Err(j) if j.is_panic() => "panics too".to_string(),
                other => format!("gives {other:?}"),
            }
        ),
    };
    match &refusal {
        Error::MemberKeyTooLong { len, max, start } => {
            assert_eq!((*len, *max), (key.len(), MAX_MEMBER_KEY_LEN));
            assert_eq!(start, &"x".repeat(64));
        }
        other => panic!("expected MemberKeyTooLong, got {:.200}", other.to_string()),
    }
    assert!(
        refusal.to_string().contains(&format!(
            "is {} bytes long, more than the {MAX_MEMBER_KEY_LEN} bytes allowed",
            key.len()
        )),
        "the error does not name the length and the limit: {:.200}",
        refusal.to_string()
    );
    // Nothing was submitted.
    assert!(
        matches!(status, Err(Error::GroupNotFound(_))),
        "a refused group was written: {status:?}"
    );
    assert!(
        member_runs.iter().all(Option::is_none),
        "a refused group's member ran: {member_runs:?}"
    );
    assert!(
        matches!(resumed, Ok(Err(Error::GroupNotFound(_)))),
        "resume of the refused group: {resumed:?}"
    );
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic".into())
}

/// Group member keys of `MAX_MEMBER_KEY_LEN` bytes, 200 KiB and 300 KiB
/// ("The member's key (any text)"), one member of each group succeeding,
/// one failing with a 1 MiB error. A key the runtime cannot carry to the member's end must
/// be refused at submission naming its length; an accepted member must
/// end, and `results` report it. (With 200 KiB keys the submission was
/// accepted, and the failing member's termination, carrying the key twice
/// beside the error, was over the queue's 256 KiB KV value limit: it never
/// committed and `results` failed with `KvValueTooLarge`.)
#[tokio::test(start_paused = true)]
async fn huge_member_keys_are_refused_or_their_members_end() {
    #[derive(Clone)]
    struct Members;
    impl StepRunner for Members {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            match step.payload.as_slice() {
                b"fail" => Err(StepError::permanent("e".repeat(1 << 20))),
                _ => Ok(StepOutcome::Succeed {
                    result: b"ok".to_vec(),
                }),
            }
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let queue = tokio_clock_queue(store.clone(), OpenOptions::default()).await;
    let runtime = workflow_builder(&queue, &store, &Members).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    for (g, len) in [MAX_MEMBER_KEY_LEN, 200 << 10, 300 << 10]
        .into_iter()
        .enumerate()
    {
        let group = runtime.group(rid(&format!("huge-keys-{g}")));
        let key = |name: &str| format!("{name}{}", "k".repeat(len - name.len()));
        let members = vec![
            GroupMember {
                key: key("ok-"),
                input: b"ok".to_vec(),
            },
            GroupMember {
                key: key("fail-"),
                input: b"fail".to_vec(),
            },
        ];
        match within(60, group.submit(members, &RunOptions::default())).await {
            Err(err) => {
                assert!(len > MAX_MEMBER_KEY_LEN, "{len} bytes refused: {err}");
                assert!(
                    matches!(err, taquba_workflow::Error::MemberKeyTooLong { len: l, .. } if l == len),
                    "{len} bytes: {:.200}",
                    err.to_string()
                );
            }
            Ok(()) => {
                let results = join_all(&group).await;
                let mut statuses: Vec<_> = results.iter().map(|r| r.termination.status).collect();
                statuses.sort_by_key(|s| s.as_str());
                assert_eq!(
                    statuses,
                    vec![TerminalStatus::Failed, TerminalStatus::Succeeded],
                    "{len}-byte keys"
                );
            }
        }
    }
    worker.shutdown().await.unwrap();
}

/// The largest terminal record a run can have: a group member with a key
/// of `MAX_MEMBER_KEY_LEN` bytes whose last eight steps each took sixteen
/// attempts failing with 2 KiB errors (the history entries riding on the
/// terminal record), ending with a 1 MiB error. It must commit: the run
/// ends `Failed` with its error, its runner not called again.
#[tokio::test(start_paused = true)]
async fn the_largest_terminal_record_still_commits() {
    #[derive(Clone, Default)]
    struct Retries {
        calls: Arc<AtomicUsize>,
    }
    impl StepRunner for Retries {
        async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if step.step_number == 9 {
                return Err(StepError::permanent("z".repeat(1 << 20)));
            }
            if step.attempts < step.max_attempts {
                return Err(StepError::transient("r".repeat(2048)));
            }
            Ok(StepOutcome::continue_now(b"next".to_vec()))
        }
    }
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let options = OpenOptions::default()
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::ZERO)
                .lease_duration(Duration::from_secs(30))
                .max_attempts(16),
        );
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options)
            .await
            .unwrap(),
    );
    let retries = Retries::default();
    let runtime = workflow_builder(&queue, &store, &retries).build();
    let worker = runtime.spawn(std::future::pending::<()>());
    let group = runtime.group(rid("largest"));
    let key = "k".repeat(MAX_MEMBER_KEY_LEN);
    group
        .submit(
            vec![GroupMember {
                key,
                input: b"go".to_vec(),
            }],
            &RunOptions::default(),
        )
        .await
        .unwrap();
    let results = join_all(&group).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].termination.status, TerminalStatus::Failed);
    assert!(
        results[0]
            .termination
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("zzz")),
        "{:.100?}",
        results[0].termination.error
    );
    assert_eq!(
        retries.calls.load(Ordering::SeqCst),
        9 * 16 + 1,
        "runner calls"
    );
    worker.shutdown().await.unwrap();
}
