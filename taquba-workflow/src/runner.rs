//! The runner-facing types: the [`StepRunner`] trait an application
//! implements, the [`Step`] and [`Delivery`] it receives, and the
//! [`StepOutcome`] / [`StepError`] it returns.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::ops::{Deref, DerefMut};

use taquba::LeaseHandle;
use tokio_util::sync::CancellationToken;

use crate::coordination::children::ChildrenHandle;
use crate::model::{StepError, StepOutcome};
use crate::run::effects::EffectsHandle;
use crate::store::keys::RunId;
use crate::store::kv::KvReadHandle;
use crate::store::memo::{Memo, MemoStore};
use crate::versioning::{HostedCode, RunCode};
use crate::workflows::envelope::EnvelopeHead;

/// The per-step logic of a workflow: bytes in ([`Step::payload`]), a
/// decision out ([`StepOutcome`]). The runtime persists everything else.
///
/// Delivery is at-least-once: a step whose lease expires, or whose process
/// crashes before the settlement commits, runs again with the same
/// `(run_id, step_number, payload)`. Implementations must be idempotent for
/// that triple; [`Delivery::memo`] records expensive side effects so a retry
/// does not repeat them.
///
/// A runner that panics is treated as a transient error carrying the panic
/// message: the step is retried, and dead-letters (the run ends `Failed`,
/// naming the panic) once its attempts are exhausted.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a step runner",
    label = "implement `taquba_workflow::StepRunner` for `{Self}`",
    note = "a step runner is `impl StepRunner for T {{ async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {{ .. }} }}` with `T: Send + Sync`"
)]
pub trait StepRunner: Send + Sync {
    /// Run one step and decide what happens next.
    ///
    /// # Errors
    /// [`StepError::transient`] retries the step with the queue's backoff
    /// up to its attempt limit, then dead-letters it and fails the run;
    /// [`StepError::permanent`] dead-letters at once and fails the run.
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send;

    /// The name of step `step_number` with `payload` in its run's history
    /// ([`WorkflowView::steps`](crate::WorkflowView::steps)), asked once per
    /// step (when its first attempt settles). The default names nothing:
    /// the runtime then reads the name of a `#[workflow]` step or a job from
    /// the payload, and otherwise uses the runner's type name (its last
    /// path segment). Keep it cheap and stable: a step must get the same
    /// name on every delivery. At most 256 bytes are kept.
    fn step_name(&self, step_number: u32, payload: &[u8]) -> Option<String> {
        let _ = (step_number, payload);
        None
    }

    /// The workflows (or jobs) this runner can run, by name, asked once
    /// when the runtime is built. The owner checks the input of every
    /// inbox submit against it before it records the run, so a run no
    /// step of this runner could start is rejected with a recorded reason
    /// naming the value, instead of being accepted and failing later.
    /// `#[workflow]` types, the [`Workflows`](crate::workflows::Workflows)
    /// router and [`JobRunner`](crate::jobs::JobRunner)s say what they host;
    /// the default, [`Hosted::Unknown`], checks nothing.
    fn hosted(&self) -> Hosted {
        Hosted::Unknown
    }

    /// What code this runner runs, per workflow: its version and the
    /// patches it declares ([`versioning`](crate::versioning)), asked once
    /// when the runtime is built. A submission records the version and
    /// patches of its workflow's code in the run record; each step's
    /// history entry records the version of the code that settled it;
    /// [`Delivery::patched`] answers from the recorded patches.
    /// `#[workflow]` types say theirs (`#[workflow(version = "...",
    /// patches = [...])]`, the crate's version by default) and the
    /// [`Workflows`](crate::workflows::Workflows) router merges them; the
    /// default says nothing (no version, no patch).
    fn code(&self) -> HostedCode {
        HostedCode::default()
    }
}

/// A shared runner runs steps as the runner it points to: hand one runner
/// to several runtimes (the shards of a
/// [`ClusterRuntime`](crate::cluster::ClusterRuntime)) as an `Arc`.
impl<T: StepRunner + ?Sized> StepRunner for std::sync::Arc<T> {
    fn run_step(&self, step: &Step) -> impl Future<Output = Result<StepOutcome, StepError>> + Send {
        (**self).run_step(step)
    }

    fn step_name(&self, step_number: u32, payload: &[u8]) -> Option<String> {
        (**self).step_name(step_number, payload)
    }

    fn hosted(&self) -> Hosted {
        (**self).hosted()
    }

    fn code(&self) -> HostedCode {
        (**self).code()
    }
}

/// What a [`StepRunner`] can run, by name ([`StepRunner::hosted`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hosted {
    /// The runner does not say: any input is accepted.
    #[default]
    Unknown,
    /// `#[workflow]`s: each workflow's name with the names of its steps.
    /// An input must be a step envelope
    /// ([`encode_input`](crate::workflows::encode_input)) of one of them
    /// that names one of its steps.
    Workflows(BTreeMap<String, BTreeSet<String>>),
    /// Job types by name: an input must be a job input naming one of
    /// them.
    Jobs(BTreeSet<String>),
}

impl Hosted {
    /// One workflow, `name`, with the steps `steps`.
    pub fn workflow(name: &str, steps: &[&str]) -> Self {
        Self::Workflows(BTreeMap::from([(
            name.to_string(),
            steps.iter().map(|step| step.to_string()).collect(),
        )]))
    }

    /// Every step name this describes, as a run's history names its steps
    /// (the steps of every workflow, or the job names), sorted and without
    /// duplicates; `None` for [`Hosted::Unknown`]. Tools that take a step
    /// name check it against this (the test kit's `fail_next` refuses a
    /// name not in it).
    pub fn step_names(&self) -> Option<Vec<String>> {
        let names: BTreeSet<&String> = match self {
            Hosted::Unknown => return None,
            Hosted::Workflows(workflows) => workflows.values().flatten().collect(),
            Hosted::Jobs(jobs) => jobs.iter().collect(),
        };
        Some(names.into_iter().cloned().collect())
    }

    /// Whether a run whose first step's payload is `input` can run here;
    /// the reason names the value when it cannot.
    pub(crate) fn check(&self, input: &[u8]) -> Result<(), String> {
        match self {
            Hosted::Unknown => Ok(()),
            Hosted::Workflows(workflows) => {
                let Ok(head) = rmp_serde::from_slice::<EnvelopeHead>(input) else {
                    return Err(format!(
                        "the input ({} bytes) is not a `#[workflow]` step envelope (this runtime hosts the workflows {})",
                        input.len(),
                        list(workflows.keys())
                    ));
                };
                let Some(steps) = workflows.get(&head.workflow) else {
                    return Err(format!(
                        "the input names workflow {:?}, which this runtime does not host (it hosts {})",
                        head.workflow,
                        list(workflows.keys())
                    ));
                };
                if !steps.contains(&head.step.0) {
                    return Err(format!(
                        "the input names step {:?} of workflow {:?}, which has no such step (its steps are {})",
                        head.step.0,
                        head.workflow,
                        list(steps.iter())
                    ));
                }
                Ok(())
            }
            Hosted::Jobs(jobs) => match crate::history::naming::job_name(input) {
                Some(name) if jobs.contains(&name) => Ok(()),
                Some(name) => Err(format!(
                    "the input names job {name:?}, which this runner does not register (it registers {})",
                    list(jobs.iter())
                )),
                None => Err(format!(
                    "the input ({} bytes) is not a job input (this runner registers {})",
                    input.len(),
                    list(jobs.iter())
                )),
            },
        }
    }
}

/// `` `a`, `b` `` (or `none`).
fn list<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<String> = names.map(|name| format!("`{name}`")).collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// One delivery of a step job: who it belongs to and the handles a runner
/// uses during the step. [`Step`] and
/// [`JobContext`](crate::jobs::JobContext) dereference to it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The run the step belongs to.
    pub run_id: RunId,
    /// The submitter's headers ([`RunOptions::headers`](crate::RunOptions::headers)),
    /// without the reserved `workflow.` ones.
    pub headers: HashMap<String, String>,
    /// The queue job id of this step.
    pub job_id: String,
    /// Attempts consumed including this one (1 on the first delivery).
    pub attempts: u32,
    /// The step's attempt limit.
    pub max_attempts: u32,
    /// Fired when the run is cancelled from outside
    /// ([`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel)). The
    /// runner's outcome is then discarded and the run ends `Cancelled`, so a
    /// runner that watches the token only returns sooner.
    pub cancel_token: CancellationToken,
    /// The step's lease: extend it ([`LeaseHandle::ensure_at_least`]) before
    /// a call that may outlive it, or the reaper delivers the step again.
    pub lease: LeaseHandle,
    /// Durable memo scoped to `(run_id, step_number)`.
    pub memo: Memo,
    /// Durable memo shared by every step of the run.
    pub run_memo: Memo,
    /// KV writes and deletes committed with this step's settlement.
    pub effects: EffectsHandle,
    /// Reads of committed KV state.
    pub kv: KvReadHandle,
    /// Child runs started with this step's settlement (see
    /// [`children`](crate::children)).
    pub children: ChildrenHandle,
    /// The run's code: the version and patches it started with, and the
    /// code running this step ([`patched`](Self::patched)).
    pub code: RunCode,
}

impl Delivery {
    /// Whether a transient error from this attempt dead-letters the step
    /// (`attempts >= max_attempts`).
    pub fn is_last_attempt(&self) -> bool {
        self.attempts >= self.max_attempts
    }

    /// Whether the run started on code that declared the patch `id`
    /// ([`RunCode::patched`]): `true` for runs submitted on code declaring
    /// it, `false` for runs submitted before, the same on every attempt of
    /// every step of the run (see [`versioning`](crate::versioning)).
    ///
    /// # Errors
    /// A permanent [`StepError`] naming the patch when the running code
    /// does not declare `id`.
    pub fn patched(&self, id: &str) -> Result<bool, StepError> {
        self.code.patched(id)
    }

    /// A delivery bound to no queue, for unit tests of runners: run id
    /// `"detached"`, first of three attempts, a token never fired by the
    /// runtime, a detached lease, memos in a private in-memory store,
    /// effects that are staged and dropped, KV reads that find nothing, a
    /// [`RunCode`] declaring no patch (set [`code`](Self::code) to test
    /// [`patched`](Self::patched)).
    pub fn detached() -> Self {
        let run_id = RunId::new("detached").expect("a valid literal id");
        let children = ChildrenHandle::detached(run_id.clone());
        let memos = MemoStore::new(
            std::sync::Arc::new(taquba::object_store::memory::InMemory::new()),
            "detached-memo",
        );
        Self {
            memo: memos.new_memo(&run_id, 0),
            run_memo: memos.new_run_memo(&run_id),
            run_id,
            headers: HashMap::new(),
            job_id: "detached".to_string(),
            attempts: 1,
            max_attempts: 3,
            cancel_token: CancellationToken::new(),
            lease: LeaseHandle::detached(),
            effects: EffectsHandle::detached(),
            kv: KvReadHandle::detached(),
            children,
            code: RunCode::default(),
        }
    }
}

/// One step of a run as the runner sees it. Dereferences to its
/// [`Delivery`].
#[derive(Debug, Clone)]
pub struct Step {
    /// The delivery: run id, headers, attempts, handles.
    pub delivery: Delivery,
    /// 0 for the run's first step, then +1 per `Continue`.
    pub step_number: u32,
    /// The step's payload: the run's input for step 0, the previous step's
    /// `Continue` payload after.
    pub payload: Vec<u8>,
    /// For a step after [`Trigger::OnSignal`](crate::Trigger::OnSignal): `Some(payload)` when the
    /// signal arrived, `None` when the wait timed out. `None` otherwise.
    /// The same value on every redelivery.
    pub signal: Option<Vec<u8>>,
}

impl Step {
    /// A step 0 with `payload` over a [`Delivery::detached`], for tests.
    pub fn detached(payload: impl Into<Vec<u8>>) -> Self {
        Self {
            delivery: Delivery::detached(),
            step_number: 0,
            payload: payload.into(),
            signal: None,
        }
    }

    /// See [`Delivery::is_last_attempt`].
    pub fn is_last_attempt(&self) -> bool {
        self.delivery.is_last_attempt()
    }
}

impl Deref for Step {
    type Target = Delivery;
    fn deref(&self) -> &Delivery {
        &self.delivery
    }
}

impl DerefMut for Step {
    fn deref_mut(&mut self) -> &mut Delivery {
        &mut self.delivery
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn hosted_names_check_an_input_naming_the_value() {
        #[derive(serde::Serialize)]
        struct Env<'a> {
            workflow: &'a str,
            step: std::collections::BTreeMap<&'a str, (u32,)>,
        }
        let env = |workflow: &str, step: &str| {
            rmp_serde::to_vec_named(&Env {
                workflow,
                step: [(step, (1,))].into(),
            })
            .unwrap()
        };
        let hosted = Hosted::workflow("order", &["charge", "ship"]);
        assert_eq!(hosted.check(&env("order", "ship")), Ok(()));
        let err = hosted.check(&env("order", "refund")).unwrap_err();
        assert!(
            err.contains("\"refund\"") && err.contains("`charge`, `ship`"),
            "{err}"
        );
        let err = hosted.check(&env("invoice", "charge")).unwrap_err();
        assert!(
            err.contains("\"invoice\"") && err.contains("`order`"),
            "{err}"
        );
        let err = hosted.check(b"\xc1 raw").unwrap_err();
        assert!(err.contains("not a `#[workflow]` step envelope"), "{err}");
        assert_eq!(Hosted::Unknown.check(b"anything"), Ok(()));
        let jobs = Hosted::Jobs(["math.add".to_string()].into());
        let job = crate::store::durable::encode(&crate::store::durable::DurableJobInput {
            name: "math.mul".into(),
            payload: vec![],
        });
        let err = jobs.check(&job).unwrap_err();
        assert!(
            err.contains("\"math.mul\"") && err.contains("`math.add`"),
            "{err}"
        );
        assert!(jobs.check(&env("order", "ship")).is_err());
    }
    use std::time::Duration;

    use super::*;
    use crate::model::Trigger;

    #[test]
    fn constructors_build_the_triggers() {
        assert_eq!(
            StepOutcome::continue_after(vec![1], Duration::from_secs(2)),
            StepOutcome::Continue {
                payload: vec![1],
                when: Trigger::After(Duration::from_secs(2))
            }
        );
        assert!(matches!(
            StepOutcome::continue_on_signal(vec![], "k", Duration::ZERO),
            StepOutcome::Continue { when: Trigger::OnSignal { ref correlation_key, .. }, .. } if correlation_key == "k"
        ));
    }

    #[test]
    fn a_detached_step_is_a_first_attempt_of_step_zero() {
        let step = Step::detached(b"x".to_vec());
        assert_eq!(step.step_number, 0);
        assert_eq!(step.run_id, "detached");
        assert!(!step.is_last_attempt());
        assert_eq!(StepError::transient("boom").to_string(), "boom");
    }
}
