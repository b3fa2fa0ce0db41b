//! Helpers of the durability tests: [`FaultyStore`], an object store that
//! fails chosen operations and adds latency; [`TokioClock`], a queue clock
//! that follows tokio's time (so paused-time tests drive timers); a panic
//! counter ([`count_panics`]); and cancellation injection
//! ([`poll_then_drop`], [`drop_at_each_poll`]): a future dropped after
//! exactly N polls, as a request handler's future is when its client
//! disconnects or a `tokio::time::timeout` fires.
//!
//! Test-only code: nothing here belongs in a production program.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{self, BoxStream, StreamExt};
use taquba::object_store::path::Path;
use taquba::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// The kinds of object-store operation a [`FaultyStore`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put_opts`, `put_multipart_opts`, `copy_opts` (writes).
    Put,
    /// `get_opts`, `get_ranges` (reads, heads included).
    Get,
    /// `list`, `list_with_offset`, `list_with_delimiter`.
    List,
    /// `delete_stream` (every delete).
    Delete,
}

impl Op {
    const ALL: [Op; 4] = [Op::Put, Op::Get, Op::List, Op::Delete];

    fn index(self) -> usize {
        match self {
            Op::Put => 0,
            Op::Get => 1,
            Op::List => 2,
            Op::Delete => 3,
        }
    }

    /// `"put"`, `"get"`, `"list"` or `"delete"`.
    pub fn as_str(self) -> &'static str {
        ["put", "get", "list", "delete"][self.index()]
    }
}

/// What a [`FaultyStore`] injects.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    /// The seed of the store's random choices.
    pub seed: u64,
    /// The fraction (0.0..=1.0) of each operation kind that fails, indexed
    /// as [`Op`]: put, get, list, delete.
    pub rates: [f64; 4],
    /// The fraction of failed puts and deletes that are applied before the
    /// error is returned (the request reached the server, its answer was
    /// lost).
    pub applied_fraction: f64,
    /// Added latency of every operation, uniform in this range.
    pub latency: Option<Range<Duration>>,
    /// Only paths starting with one of these prefixes are failed or
    /// consume scripted outcomes (all paths when empty); latency applies to
    /// all.
    pub only_under: Vec<String>,
}

impl FaultConfig {
    /// The same failure `rate` for every operation kind.
    pub fn uniform(seed: u64, rate: f64) -> Self {
        Self {
            seed,
            rates: [rate; 4],
            ..Self::default()
        }
    }
}

struct State {
    config: FaultConfig,
    rng: u64,
    /// Per operation kind, the outcomes of its next calls (`true` fails),
    /// consulted before the rate.
    scripts: [VecDeque<bool>; 4],
}

struct Shared {
    state: Mutex<State>,
    enabled: AtomicBool,
    calls: [AtomicU64; 4],
    injected: [AtomicU64; 4],
}

/// An [`ObjectStore`] wrapper that fails a chosen fraction or a chosen
/// sequence of puts, gets, lists and deletes and adds latency. Injected
/// errors are `object_store::Error::Generic` whose message starts with
/// `injected fault:` and names the operation and path. Clones share their
/// configuration and counters.
#[derive(Clone)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    shared: Arc<Shared>,
}

/// The text every injected error carries.
pub const INJECTED: &str = "injected fault";

impl FaultyStore {
    /// Wrap `inner`, injecting per `config` (enabled from the start).
    pub fn new(inner: Arc<dyn ObjectStore>, config: FaultConfig) -> Self {
        let rng = config.seed ^ 0x9E37_79B9_7F4A_7C15;
        Self {
            inner,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    config,
                    rng,
                    scripts: Default::default(),
                }),
                enabled: AtomicBool::new(true),
                calls: Default::default(),
                injected: Default::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turn injection (faults and latency) on or off.
    pub fn set_enabled(&self, enabled: bool) {
        self.shared.enabled.store(enabled, Ordering::SeqCst);
    }

    /// Replace the configuration.
    pub fn set_config(&self, config: FaultConfig) {
        self.lock().config = config;
    }

    /// Inject per `config` for the whole of `work` (every call it makes,
    /// not one shot), then turn injection off ([`set_enabled`](Self::set_enabled)
    /// `false`); `work`'s output.
    pub async fn during<F: Future>(&self, config: FaultConfig, work: F) -> F::Output {
        self.set_config(config);
        self.set_enabled(true);
        let output = work.await;
        self.set_enabled(false);
        output
    }

    /// Decide the next eligible calls of `op` in order (see
    /// [`FaultConfig::only_under`]): `true` fails the call; the rate decides
    /// once the script is used up.
    pub fn script(&self, op: Op, outcomes: impl IntoIterator<Item = bool>) {
        self.lock().scripts[op.index()].extend(outcomes);
    }

    /// Calls seen of `op`.
    pub fn calls(&self, op: Op) -> u64 {
        self.shared.calls[op.index()].load(Ordering::SeqCst)
    }

    /// Faults injected into `op`.
    pub fn injected(&self, op: Op) -> u64 {
        self.shared.injected[op.index()].load(Ordering::SeqCst)
    }

    /// Faults injected in all.
    pub fn injected_total(&self) -> u64 {
        Op::ALL.iter().map(|op| self.injected(*op)).sum()
    }

    /// Count a call of `op` on `path`; its latency, and whether it fails
    /// (`Some(applied)`: fail, after applying the operation when `applied`).
    fn decide(&self, op: Op, path: &str) -> (Option<Duration>, Option<bool>) {
        self.shared.calls[op.index()].fetch_add(1, Ordering::SeqCst);
        if !self.shared.enabled.load(Ordering::SeqCst) {
            return (None, None);
        }
        let mut state = self.lock();
        let latency = state.config.latency.clone().map(|range| {
            let span = range.end.saturating_sub(range.start).as_micros() as u64;
            let pick = if span == 0 {
                0
            } else {
                next(&mut state.rng) % span
            };
            range.start + Duration::from_micros(pick)
        });
        let eligible = state.config.only_under.is_empty()
            || state
                .config
                .only_under
                .iter()
                .any(|p| path.starts_with(p.as_str()));
        let fail = eligible
            && match state.scripts[op.index()].pop_front() {
                Some(fail) => fail,
                None => unit(next(&mut state.rng)) < state.config.rates[op.index()],
            };
        let fail = fail.then(|| {
            matches!(op, Op::Put | Op::Delete)
                && unit(next(&mut state.rng)) < state.config.applied_fraction
        });
        if fail.is_some() {
            self.shared.injected[op.index()].fetch_add(1, Ordering::SeqCst);
        }
        (latency, fail)
    }

    async fn enter(&self, op: Op, path: &Path) -> Option<bool> {
        let (latency, fail) = self.decide(op, path.as_ref());
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        fail
    }
}

fn fault(op: Op, path: &Path) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("{INJECTED}: {} of {path}", op.as_str()).into(),
    }
}

/// splitmix64.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner.to_string())
            .field("injected", &self.injected_total())
            .finish()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.enter(Op::Put, location).await {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(true) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(fault(Op::Put, location))
            }
            Some(false) => Err(fault(Op::Put, location)),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        match self.enter(Op::Put, location).await {
            None => self.inner.put_multipart_opts(location, opts).await,
            Some(_) => Err(fault(Op::Put, location)),
        }
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        match self.enter(Op::Get, location).await {
            None => self.inner.get_opts(location, options).await,
            Some(_) => Err(fault(Op::Get, location)),
        }
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        match self.enter(Op::Get, location).await {
            None => self.inner.get_ranges(location, ranges).await,
            Some(_) => Err(fault(Op::Get, location)),
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        locations
            .then(move |location| {
                let this = this.clone();
                async move {
                    let location = location?;
                    let fail = this.enter(Op::Delete, &location).await;
                    if fail == Some(false) {
                        return Err(fault(Op::Delete, &location));
                    }
                    let deleted = this
                        .inner
                        .delete_stream(stream::once(async move { Ok(location) }).boxed())
                        .next()
                        .await;
                    match (deleted, fail) {
                        (Some(Ok(path)), Some(true)) => Err(fault(Op::Delete, &path)),
                        (Some(result), _) => result,
                        (None, _) => Err(object_store::Error::Generic {
                            store: "FaultyStore",
                            source: "the inner store's delete stream ended early".into(),
                        }),
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let at = prefix.cloned().unwrap_or_default();
        let (_, fail) = self.decide(Op::List, at.as_ref());
        match fail {
            None => self.inner.list(prefix),
            Some(_) => stream::once(async move { Err(fault(Op::List, &at)) }).boxed(),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let at = prefix.cloned().unwrap_or_default();
        let (_, fail) = self.decide(Op::List, at.as_ref());
        match fail {
            None => self.inner.list_with_offset(prefix, offset),
            Some(_) => stream::once(async move { Err(fault(Op::List, &at)) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let at = prefix.cloned().unwrap_or_default();
        match self.enter(Op::List, &at).await {
            None => self.inner.list_with_delimiter(prefix).await,
            Some(_) => Err(fault(Op::List, &at)),
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        match self.enter(Op::Put, to).await {
            None => self.inner.copy_opts(from, to, options).await,
            Some(true) => {
                self.inner.copy_opts(from, to, options).await?;
                Err(fault(Op::Put, to))
            }
            Some(false) => Err(fault(Op::Put, to)),
        }
    }
}

/// A [`taquba::Clock`] that reads tokio's clock: under a paused test
/// runtime, time advances as the runtime auto-advances, so queue timers
/// (delays, leases, backoff, retention) fire without real waiting.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    base_ms: u64,
}

impl TokioClock {
    /// A clock reading `base_ms` now.
    pub fn new(base_ms: u64) -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            base_ms,
        }
    }
}

impl taquba::Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX / 2);
        self.base_ms.saturating_add(elapsed)
    }
}

/// Poll `future` exactly `polls` times, then drop it; `Some(output)` when
/// it completed within those polls. Between two polls the calling task
/// sleeps 1 ms (of paused or real time), so spawned tasks, timers and the
/// queue's WAL flush move on as they would while a caller waits.
///
/// The future is polled with the calling task's waker, so what it awaits
/// is registered as usual; it is polled again after the sleep whether or
/// not it was woken, which places the drop at each await in turn.
pub async fn poll_then_drop<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
        if let Poll::Ready(output) = polled {
            return Some(output);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Cancellation injection at every await point of an operation: for
/// `n = 1, 2, …`, run `setup(n)` to its end, build the operation's future
/// with `make(n)`, drop it after `n` polls ([`poll_then_drop`]) and run
/// `check(n, output)` (the output when it completed within the `n` polls),
/// until the operation completes on its own. Returns that last `n`.
///
/// # Panics
/// When the operation has not completed on its own within `max_polls`
/// polls.
pub async fn drop_at_each_poll<S, SF, M, F, C, CF>(
    max_polls: usize,
    mut setup: S,
    mut make: M,
    mut check: C,
) -> usize
where
    S: FnMut(usize) -> SF,
    SF: Future<Output = ()>,
    M: FnMut(usize) -> F,
    F: Future,
    C: FnMut(usize, Option<F::Output>) -> CF,
    CF: Future<Output = ()>,
{
    for n in 1..=max_polls {
        setup(n).await;
        let output = poll_then_drop(make(n), n).await;
        let completed = output.is_some();
        check(n, output).await;
        if completed {
            return n;
        }
    }
    panic!("the operation did not complete on its own within {max_polls} polls");
}

/// No set-up, for [`drop_at_each_poll`].
pub async fn no_setup(_n: usize) {}

static PANICS: AtomicUsize = AtomicUsize::new(0);
static HOOK: Once = Once::new();

/// Count every panic of this process from now on (the previous panic hook
/// still runs). Idempotent.
pub fn count_panics() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// Panics counted since [`count_panics`] was first called.
pub fn panics() -> usize {
    PANICS.load(Ordering::SeqCst)
}

/// What a kill -9 torture session observed.
#[derive(Debug, Clone, Default)]
pub struct TortureReport {
    /// Child processes killed with SIGKILL.
    pub kills: usize,
    /// Runs verified by the final check.
    pub runs: usize,
    /// Invariant violations the final check reported.
    pub violations: usize,
    /// The final check's `CHECK ...` line and the lines after it.
    pub check_output: String,
    /// Wall-clock time of the whole session.
    pub elapsed: Duration,
}

/// When a torture session kills its children.
#[derive(Debug, Clone)]
pub struct KillPlan {
    /// The random delay after the start of a child (so during its open,
    /// its recovery or its work).
    pub after_start_ms: Range<u64>,
    /// Every this many launches (0: never), wait until the child has
    /// opened the store and submitted its batch, then kill it after a
    /// random delay in `after_submit_ms`: a kill in the middle of steps
    /// even where opening takes longer than `after_start_ms`.
    pub mid_work_every: usize,
    /// The random delay after the child reported its submission.
    pub after_submit_ms: Range<u64>,
    /// Extra arguments of every child (`--flush-ms 50`, ...).
    pub child_args: Vec<String>,
}

/// Run a kill -9 torture session with the `torture_child` binary at
/// `child`: `kills` times, start `child work --batch k` on `store` and kill
/// it with SIGKILL at a random moment per `plan` (seeded by `seed`); then
/// run `child check` to completion. Each child's stderr goes to
/// `{state}/work-{k}.log`.
///
/// # Errors
/// A child that could not be started, a `work` child that exited by itself
/// (it serves until killed), or a failed check (its output is in the
/// message).
pub fn torture(
    child: &std::path::Path,
    store: &str,
    state: &std::path::Path,
    kills: usize,
    plan: &KillPlan,
    seed: u64,
) -> Result<TortureReport, String> {
    use std::process::{Command, Stdio};
    let started = std::time::Instant::now();
    let mut rng = seed ^ 0x5DEE_CE66_D1CE_4E5B;
    std::fs::create_dir_all(state)
        .map_err(|e| format!("cannot create {}: {e}", state.display()))?;
    let state_arg = state.to_string_lossy().into_owned();
    let base = |cmd: &mut Command| {
        cmd.arg("--store")
            .arg(store)
            .arg("--state")
            .arg(&state_arg)
            .args(&plan.child_args)
            .stdin(Stdio::null());
    };
    let mut pick = |range: &Range<u64>| {
        let span = range.end.saturating_sub(range.start).max(1);
        Duration::from_millis(range.start + next(&mut rng) % span)
    };
    for batch in 0..kills {
        let log_path = state.join(format!("work-{batch}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("cannot create {}: {e}", log_path.display()))?;
        let mut cmd = Command::new(child);
        base(&mut cmd);
        cmd.args(["work", "--batch", &batch.to_string()])
            .stdout(Stdio::piped())
            .stderr(log);
        let mut process = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", child.display()))?;
        // Forward the child's lines so the parent can wait for one.
        let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
        if let Some(stdout) = process.stdout.take() {
            std::thread::spawn(move || {
                let reader = std::io::BufReader::new(stdout);
                for line in std::io::BufRead::lines(reader).map_while(Result::ok) {
                    if lines_tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        if plan.mid_work_every > 0 && batch % plan.mid_work_every == plan.mid_work_every - 1 {
            let deadline = std::time::Instant::now() + Duration::from_secs(300);
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match lines.recv_timeout(left) {
                    Ok(line) if line.starts_with("SUBMITTED") => break,
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            std::thread::sleep(pick(&plan.after_submit_ms));
        } else {
            std::thread::sleep(pick(&plan.after_start_ms));
        }
        if let Some(status) = process.try_wait().map_err(|e| e.to_string())? {
            let stderr = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!(
                "work child of batch {batch} exited by itself ({status}): {stderr}"
            ));
        }
        // `Child::kill` sends SIGKILL on Unix.
        process.kill().map_err(|e| format!("kill: {e}"))?;
        process.wait().map_err(|e| format!("wait: {e}"))?;
    }
    let mut cmd = Command::new(child);
    base(&mut cmd);
    let output = cmd
        .args(["check", "--batches", &kills.to_string()])
        .output()
        .map_err(|e| format!("cannot start {}: {e}", child.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let check_output = stdout
        .lines()
        .skip_while(|line| !line.starts_with("CHECK"))
        .collect::<Vec<_>>()
        .join("\n");
    let field = |name: &str| -> Option<usize> {
        check_output
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
    };
    let report = TortureReport {
        kills,
        runs: field("runs").unwrap_or(0),
        violations: field("violations").unwrap_or(0),
        check_output: check_output.clone(),
        elapsed: started.elapsed(),
    };
    if !output.status.success() {
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(format!(
            "check failed ({}): {check_output}\nstderr (last lines, newest first):\n{}",
            output.status,
            tail.join("\n")
        ));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use taquba::object_store::ObjectStoreExt;
    use taquba::object_store::memory::InMemory;

    #[tokio::test(start_paused = true)]
    async fn scripted_and_rated_faults_are_injected_and_named() {
        let store = FaultyStore::new(Arc::new(InMemory::new()), FaultConfig::default());
        let path = Path::from("a/b");
        store.script(Op::Put, [true, false]);
        let err = store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("injected fault: put of a/b"),
            "{err}"
        );
        store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(store.injected(Op::Put), 1);
        store.set_config(FaultConfig {
            applied_fraction: 1.0,
            ..FaultConfig::uniform(7, 1.0)
        });
        let err = store.delete(&path).await.unwrap_err();
        assert!(err.to_string().contains(INJECTED));
        store.set_enabled(false);
        // Applied before failing: the object is gone.
        assert!(
            store
                .get(&path)
                .await
                .is_err_and(|e| matches!(e, object_store::Error::NotFound { .. }))
        );
        store.set_enabled(true);
        let listed: Vec<_> = store.list(None).collect().await;
        assert!(listed.iter().all(|r| r.is_err()));
        assert_eq!(store.injected_total(), 3);
    }
}
