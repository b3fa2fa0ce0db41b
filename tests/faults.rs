//! Injected storage faults: the runtime over a [`FaultyStore`] that fails a
//! random fraction (or a scripted sequence) of puts, gets, lists and
//! deletes and adds latency.
//!
//! For every seed, a workload of multi-step runs (memo writes, KV effects,
//! signal waits, runner-issued failures and cancellations, a group, a
//! terminal hook) must end exactly as it does without faults: every run
//! terminated with the same status, result and error; each committed
//! step's effect recorded once (a step finding its own committed effect is
//! a re-execution after commit); every hook committed once; no run left
//! `Running`; every error the caller sees names its cause; no panic; and
//! the worker keeps serving runs after the faults stop.
//!
//! The queue's own storage (SlateDB) retries failed object-store calls, so
//! faults there become latency; faults on the memo prefix (memos, run
//! result records, group manifests) reach the runtime and its callers.
//!
//! CI-sized: `FAULT_SEEDS` seeds (default 6), in paused time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use taquba::object_store::ObjectStore;
use taquba::object_store::memory::InMemory;
use taquba::{OpenOptions, Queue, QueueConfig};
use taquba_workflow::{
    Error, GroupMember, RunId, RunOptions, RunOutcome, RunSpec, Step, StepError, StepOutcome,
    StepRunner, TerminalEffects, TerminalHook, TerminalStatus, WorkflowRuntime,
};
use taquba_workflow_suite::testing::{
    FaultConfig, FaultyStore, INJECTED, Op, TokioClock, count_panics, panics,
};

const T0: u64 = 1_700_000_000_000;
const MEMO_PREFIX: &str = "wf-memo";

/// What went wrong, collected across the runner, the hook and the test.
#[derive(Default)]
struct Findings {
    violations: Mutex<Vec<String>>,
    caller_errors: AtomicU64,
}

impl Findings {
    fn violation(&self, line: String) {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    fn all(&self) -> Vec<String> {
        self.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn exec_key(run_id: &str, step: u32) -> Vec<u8> {
    format!("app/exec/{run_id}/{step}").into_bytes()
}

fn hook_key(run_id: &str) -> Vec<u8> {
    format!("app/hook/{run_id}").into_bytes()
}

/// The scenarios of the workload, chosen by the run's input
/// `KIND:STEPS:ACC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `STEPS` steps, then success with the sum of the step numbers.
    Ok,
    /// `STEPS` steps, then `Fail`.
    Fail,
    /// `STEPS` steps, then a runner-issued `Cancel`.
    Cancel,
    /// Step 0 waits for the signal `sig:{run_id}`; the run succeeds with
    /// the signal's payload after `STEPS` steps.
    Signal,
}

impl Kind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Self::Ok,
            "fail" => Self::Fail,
            "cancel" => Self::Cancel,
            "signal" => Self::Signal,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Fail => "fail",
            Self::Cancel => "cancel",
            Self::Signal => "signal",
        }
    }
}

struct Runner {
    findings: Arc<Findings>,
}

fn transient(err: impl std::fmt::Display) -> StepError {
    StepError::transient(err.to_string())
}

impl StepRunner for Runner {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        let run_id = step.run_id.as_str();
        let n = step.step_number;
        if step
            .kv
            .get(&exec_key(run_id, n))
            .await
            .map_err(transient)?
            .is_some()
        {
            self.findings.violation(format!(
                "step {n} of {run_id} executed again after its commit"
            ));
        }
        let text = String::from_utf8_lossy(&step.payload).into_owned();
        let mut parts = text.splitn(3, ':');
        let (Some(kind), Some(steps), Some(acc)) = (
            parts.next().and_then(Kind::parse),
            parts.next().and_then(|s| s.parse::<u32>().ok()),
            parts.next(),
        ) else {
            return Err(StepError::permanent(format!("bad payload {text:?}")));
        };
        // A memoized computation and a run-memo write on every step.
        let acc: String = step
            .memo
            .memoized("acc", async {
                Ok::<_, StepError>(match (&step.signal, kind, n) {
                    (Some(signal), Kind::Signal, 1) => String::from_utf8_lossy(signal).into_owned(),
                    (None, Kind::Signal, 1) => "timed-out".to_string(),
                    _ => format!("{}", acc.parse::<u64>().unwrap_or(0) + u64::from(n)),
                })
            })
            .await?;
        step.run_memo
            .put("last-step", n.to_string().as_bytes())
            .await?;
        step.effects
            .put(exec_key(run_id, n), acc.as_bytes().to_vec())?;
        let next = format!("{}:{steps}:{acc}", kind.name()).into_bytes();
        if n + 1 < steps {
            return Ok(if kind == Kind::Signal && n == 0 {
                StepOutcome::continue_on_signal(
                    next,
                    format!("sig:{run_id}"),
                    Duration::from_secs(3600),
                )
            } else if n % 2 == 1 {
                StepOutcome::continue_after(next, Duration::from_millis(100))
            } else {
                StepOutcome::continue_now(next)
            });
        }
        Ok(match kind {
            Kind::Ok | Kind::Signal => StepOutcome::Succeed {
                result: acc.into_bytes(),
            },
            Kind::Fail => StepOutcome::Fail {
                reason: format!("planned failure at {acc}"),
            },
            Kind::Cancel => StepOutcome::Cancel {
                reason: format!("planned cancel at {acc}"),
            },
        })
    }
}

struct Hook {
    queue: Arc<Queue>,
    findings: Arc<Findings>,
}

impl TerminalHook for Hook {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        let key = hook_key(&outcome.run_id);
        if self
            .queue
            .view()
            .kv_get(&key)
            .await
            .map_err(transient)?
            .is_some()
        {
            self.findings.violation(format!(
                "hook of {} ran again after its commit",
                outcome.run_id
            ));
        }
        effects.put(key, outcome.status.as_str().as_bytes().to_vec())?;
        Ok(())
    }
}

/// One planned run and how it must end.
struct Planned {
    run_id: RunId,
    kind: Kind,
    steps: u32,
}

impl Planned {
    fn input(&self) -> Vec<u8> {
        format!("{}:{}:0", self.kind.name(), self.steps).into_bytes()
    }

    /// The status, result and error of the run without faults.
    fn expected(&self) -> (TerminalStatus, Option<Vec<u8>>, Option<String>) {
        let sum: u32 = (0..self.steps).sum();
        match self.kind {
            Kind::Ok => (
                TerminalStatus::Succeeded,
                Some(sum.to_string().into_bytes()),
                None,
            ),
            Kind::Fail => (
                TerminalStatus::Failed,
                None,
                Some(format!("planned failure at {sum}")),
            ),
            Kind::Cancel => (
                TerminalStatus::Cancelled,
                None,
                Some(format!("planned cancel at {sum}")),
            ),
            Kind::Signal => {
                // Step 1 holds the signal payload; later steps add their
                // numbers to it only when it is a number (it is not).
                let acc = if self.steps > 2 {
                    let mut acc = format!("payload-{}", self.run_id);
                    for n in 2..self.steps {
                        acc = format!("{}", acc.parse::<u64>().unwrap_or(0) + u64::from(n));
                    }
                    acc
                } else {
                    format!("payload-{}", self.run_id)
                };
                (TerminalStatus::Succeeded, Some(acc.into_bytes()), None)
            }
        }
    }
}

/// Retry `op` until it succeeds, checking that every error names its cause.
async fn named_retry<T, F, Fut>(findings: &Findings, what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    for _ in 0..200 {
        match op().await {
            Ok(value) => return value,
            Err(err) => {
                findings.caller_errors.fetch_add(1, Ordering::SeqCst);
                let text = err.to_string();
                let named =
                    matches!(err, Error::Store(_) | Error::Queue(_)) && text.contains(INJECTED);
                if !named {
                    findings.violation(format!(
                        "{what}: an error that does not name its cause: {text}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    panic!("{what}: still failing after 200 attempts");
}

fn rate(seed: u64, salt: u64, max: f64) -> f64 {
    let x = (seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(salt.wrapping_mul(1442695040888963407)))
        >> 33;
    (x % 1000) as f64 / 1000.0 * max
}

/// The fault plan of `seed`: up to 30 % of each memo-prefix operation fails
/// (a third of failed writes applied first), up to 5 % of the queue's own
/// operations fail, every call takes up to 3 ms.
fn plan(seed: u64) -> FaultConfig {
    FaultConfig {
        seed,
        rates: [
            rate(seed, 1, 0.3),
            rate(seed, 2, 0.3),
            rate(seed, 3, 0.3),
            rate(seed, 4, 0.3),
        ],
        applied_fraction: 0.33,
        latency: Some(Duration::ZERO..Duration::from_millis(3)),
        only_under: vec![MEMO_PREFIX.to_string()],
    }
}

struct SeedReport {
    injected: u64,
    caller_errors: u64,
    violations: Vec<String>,
}

async fn run_seed(seed: u64, queue_faults: bool) -> SeedReport {
    let findings = Arc::new(Findings::default());
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut config = plan(seed);
    if queue_faults {
        // Everything fails now and then, the queue's WAL and manifest too.
        config.only_under.clear();
        config.rates = [0.05; 4];
    }
    let faulty = FaultyStore::new(inner, config);
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let clock = Arc::new(TokioClock::new(T0));
    let options = OpenOptions::default()
        .clock(clock.clone())
        .flush_interval(Duration::from_millis(1))
        .scheduler_interval(Duration::from_millis(50))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::from_millis(10))
                .max_attempts(100),
        );
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options)
            .await
            .expect("open"),
    );
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store.clone(),
        Runner {
            findings: findings.clone(),
        },
        Hook {
            queue: queue.clone(),
            findings: findings.clone(),
        },
    )
    .memo_prefix(MEMO_PREFIX)
    .poll_interval(Duration::from_millis(50))
    .max_concurrent_steps(4)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());

    let kinds = [Kind::Ok, Kind::Fail, Kind::Cancel, Kind::Signal];
    let planned: Vec<Planned> = (0..10u64)
        .map(|i| Planned {
            run_id: RunId::new(format!("s{seed}-r{i}")).expect("run id"),
            kind: kinds[((seed + i) % 4) as usize],
            steps: 2 + ((seed + i) % 3) as u32,
        })
        .collect();
    let options = RunOptions {
        max_attempts_per_step: Some(100),
        ..RunOptions::default()
    };
    for run in &planned {
        named_retry(&findings, "submit", || {
            runtime.submit(RunSpec {
                run_id: Some(run.run_id.clone()),
                input: run.input(),
                options: options.clone(),
                ..RunSpec::default()
            })
        })
        .await;
    }
    let group = runtime.group(RunId::new(format!("s{seed}-group")).expect("group id"));
    let members: Vec<GroupMember> = (0..3)
        .map(|i| GroupMember {
            key: format!("m{i}"),
            input: format!("ok:{}:0", 2 + i).into_bytes(),
        })
        .collect();
    named_retry(&findings, "group submit", || {
        group.submit(members.clone(), &options)
    })
    .await;
    for run in planned.iter().filter(|r| r.kind == Kind::Signal) {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let payload = format!("payload-{}", run.run_id).into_bytes();
        let key = format!("sig:{}", run.run_id);
        named_retry(&findings, "signal", || {
            runtime.signal(&key, payload.clone())
        })
        .await;
    }

    for run in &planned {
        let end = tokio::time::timeout(
            Duration::from_secs(3600),
            named_retry(&findings, "wait", || runtime.wait(&run.run_id)),
        )
        .await
        .unwrap_or_else(|_| panic!("seed {seed}: run {} never terminated", run.run_id));
        let (status, result, error) = run.expected();
        let got = &end.termination;
        if got.status != status {
            findings.violation(format!(
                "{}: {:?} instead of {status:?} ({:?})",
                run.run_id, got.status, got.error
            ));
            continue;
        }
        if got.error != error {
            findings.violation(format!(
                "{}: error {:?} instead of {error:?}",
                run.run_id, got.error
            ));
        }
        let outcome = named_retry(&findings, "outcome", || runtime.outcome(&run.run_id)).await;
        match outcome {
            Some(outcome) if outcome.result == result => {}
            other => findings.violation(format!(
                "{}: outcome {:?} instead of result {:?}",
                run.run_id,
                other.map(|o| o.result),
                result
            )),
        }
        for n in 0..run.steps {
            if queue
                .view()
                .kv_get(&exec_key(&run.run_id, n))
                .await
                .ok()
                .flatten()
                .is_none()
            {
                findings.violation(format!(
                    "{}: committed effect of step {n} missing",
                    run.run_id
                ));
            }
        }
    }
    let results = tokio::time::timeout(Duration::from_secs(3600), async {
        loop {
            let stream = named_retry(&findings, "group results", || group.results()).await;
            let results: Vec<_> = stream.collect().await;
            if results.iter().all(Result::is_ok) {
                return results
                    .into_iter()
                    .filter_map(Result::ok)
                    .collect::<Vec<_>>();
            }
            for err in results.into_iter().filter_map(Result::err) {
                let text = err.to_string();
                if !text.contains(INJECTED) {
                    findings.violation(format!("group results: unnamed error {text}"));
                }
            }
        }
    })
    .await
    .expect("group finished");
    for result in &results {
        if result.termination.status != TerminalStatus::Succeeded {
            findings.violation(format!("member {}: {:?}", result.key, result.termination));
        }
    }
    let mut all: Vec<String> = planned.iter().map(|r| r.run_id.to_string()).collect();
    all.extend(results.iter().map(|r| r.run_id.to_string()));
    // Hooks commit shortly after the terminations.
    for run_id in &all {
        let mut committed = false;
        for _ in 0..2000 {
            if queue
                .view()
                .kv_get(&hook_key(run_id))
                .await
                .ok()
                .flatten()
                .is_some()
            {
                committed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !committed {
            findings.violation(format!("{run_id}: terminal hook never committed"));
        }
        let id = RunId::new(run_id.as_str()).expect("run id");
        let status = named_retry(&findings, "status", || runtime.status(&id)).await;
        if !matches!(
            status.map(|s| s.state),
            Some(taquba_workflow::RunState::Terminated(_))
        ) {
            findings.violation(format!("{run_id}: not terminated"));
        }
    }

    // The worker survived: with the faults off, a new run completes.
    faulty.set_enabled(false);
    let after = runtime
        .submit(RunSpec {
            input: b"ok:3:0".to_vec(),
            ..RunSpec::default()
        })
        .await
        .expect("submit after the faults");
    let end = tokio::time::timeout(Duration::from_secs(600), runtime.wait(&after.run_id))
        .await
        .expect("the worker still serves runs")
        .expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.expect("worker ends cleanly");
    SeedReport {
        injected: faulty.injected_total(),
        caller_errors: findings.caller_errors.load(Ordering::SeqCst),
        violations: findings.all(),
    }
}

fn seeds() -> u64 {
    std::env::var("FAULT_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6)
}

#[tokio::test(start_paused = true)]
async fn runs_end_as_without_faults_under_memo_store_faults() {
    count_panics();
    let mut injected = 0;
    let mut caller_errors = 0;
    let mut violations = Vec::new();
    let seeds = seeds();
    for seed in 0..seeds {
        let report = run_seed(seed, false).await;
        injected += report.injected;
        caller_errors += report.caller_errors;
        violations.extend(
            report
                .violations
                .into_iter()
                .map(|v| format!("seed {seed}: {v}")),
        );
    }
    println!(
        "FAULTS memo-store: seeds={seeds} injected={injected} caller_errors={caller_errors} violations={} panics={}",
        violations.len(),
        panics()
    );
    assert!(injected > 0, "no fault was injected");
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(panics(), 0, "a panic happened under faults");
}

#[tokio::test(start_paused = true)]
async fn runs_end_as_without_faults_under_queue_store_faults() {
    count_panics();
    let mut injected = 0;
    let mut violations = Vec::new();
    let seeds = seeds().div_ceil(2);
    for seed in 0..seeds {
        let report = run_seed(1000 + seed, true).await;
        injected += report.injected;
        violations.extend(
            report
                .violations
                .into_iter()
                .map(|v| format!("seed {seed}: {v}")),
        );
    }
    println!(
        "FAULTS all-paths: seeds={seeds} injected={injected} violations={} panics={}",
        violations.len(),
        panics()
    );
    assert!(injected > 0, "no fault was injected");
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(panics(), 0, "a panic happened under faults");
}

/// A scripted sequence: the run result record's write fails twice, then
/// the memo reads fail three times; the run still ends once, with its
/// result, and the worker serves the next run.
#[tokio::test(start_paused = true)]
async fn a_scripted_fault_sequence_retries_the_step_and_ends_the_run_once() {
    count_panics();
    let findings = Arc::new(Findings::default());
    let faulty = FaultyStore::new(
        Arc::new(InMemory::new()),
        FaultConfig {
            only_under: vec![MEMO_PREFIX.to_string()],
            ..FaultConfig::default()
        },
    );
    let store: Arc<dyn ObjectStore> = Arc::new(faulty.clone());
    let options = OpenOptions::default()
        .clock(Arc::new(TokioClock::new(T0)))
        .flush_interval(Duration::from_millis(1))
        .default_queue_config(
            QueueConfig::default()
                .retry_backoff_base(Duration::from_millis(10))
                .max_attempts(10),
        );
    let queue = Arc::new(
        Queue::open_with_options(store.clone(), "db", options)
            .await
            .expect("open"),
    );
    let runtime = WorkflowRuntime::builder(
        queue.clone(),
        store,
        Runner {
            findings: findings.clone(),
        },
        Hook {
            queue: queue.clone(),
            findings: findings.clone(),
        },
    )
    .memo_prefix(MEMO_PREFIX)
    .build();
    let worker = runtime.spawn(std::future::pending::<()>());
    // Step 0: memo get (miss), memo put, run-memo put; the terminal step
    // then writes the run result record. Fail: the first get, the second
    // and fourth puts.
    faulty.script(Op::Get, [true, false]);
    faulty.script(Op::Put, [false, true, false, true]);
    let run = runtime
        .submit(RunSpec {
            input: b"ok:1:0".to_vec(),
            ..RunSpec::default()
        })
        .await
        .expect("submit");
    let end = tokio::time::timeout(
        Duration::from_secs(600),
        named_retry(&findings, "wait", || runtime.wait(&run.run_id)),
    )
    .await
    .expect("terminated");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    assert_eq!(
        end.outcome.and_then(|o| o.result).as_deref(),
        Some(&b"0"[..])
    );
    assert_eq!(faulty.injected(Op::Get), 1);
    assert_eq!(faulty.injected(Op::Put), 2);
    assert!(findings.all().is_empty(), "{:?}", findings.all());
    // Total outage of the memo prefix for a while: the worker survives.
    faulty.set_config(FaultConfig {
        only_under: vec![MEMO_PREFIX.to_string()],
        ..FaultConfig::uniform(3, 1.0)
    });
    let stuck = runtime
        .submit(RunSpec {
            input: b"ok:2:0".to_vec(),
            options: RunOptions {
                max_attempts_per_step: Some(1000),
                ..RunOptions::default()
            },
            ..RunSpec::default()
        })
        .await
        .expect("submit during the outage");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let err = runtime.outcome(&stuck.run_id).await;
    assert!(matches!(&err, Ok(None) | Err(Error::Store(_))), "{err:?}");
    faulty.set_enabled(false);
    let end = tokio::time::timeout(Duration::from_secs(600), runtime.wait(&stuck.run_id))
        .await
        .expect("terminated after the outage")
        .expect("wait");
    assert_eq!(end.termination.status, TerminalStatus::Succeeded);
    worker.shutdown().await.expect("worker ends cleanly");
    assert_eq!(panics(), 0);
}
