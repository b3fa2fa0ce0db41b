//! What the kit puts around the application's code: [`TestRunner`] and the
//! job handler wrapper count calls and inject the failures queued with
//! `fail_next`; [`TestHook`] shares one terminal hook across crashes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use super::error::TestError;

use crate::hooks::terminal::TerminalHook;
use crate::jobs::{BoxFuture, Handler};
use crate::model::{RunOutcome, StepError, StepOutcome};
use crate::run::effects::TerminalEffects;
use crate::runner::{Step, StepRunner};

/// Failures queued by step name, each returned by one delivery instead of
/// calling the runner, and the names they may be queued for.
#[derive(Default)]
pub(crate) struct Faults {
    /// In the order queued.
    queued: Mutex<Vec<(String, StepError)>>,
    /// How many are queued, so a delivery with none to take does not read
    /// its step's name.
    count: AtomicUsize,
    /// The names of the steps (or jobs) the runner runs; unset when it
    /// does not say (a hand-written runner), and then any name is taken.
    known: OnceLock<Vec<String>>,
}

impl Faults {
    /// The names a failure may be queued for: the runner's steps (or the
    /// registered jobs). Set once, when the environment is built.
    pub(crate) fn know(&self, names: Option<Vec<String>>) {
        if let Some(mut names) = names {
            names.sort();
            names.dedup();
            let _ = self.known.set(names);
        }
    }

    /// Queue `error` for the next delivery of the step named `step`.
    ///
    /// # Errors
    /// [`TestError::UnknownStep`] when the runner says which steps it runs
    /// and `step` is none of them.
    pub(crate) fn push(&self, step: &str, error: StepError) -> Result<(), TestError> {
        if let Some(known) = self.known.get()
            && !known.iter().any(|name| name == step)
        {
            return Err(TestError::UnknownStep {
                name: step.to_string(),
                known: known.clone(),
            });
        }
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        queued.push((step.to_string(), error));
        self.count.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// The failure queued first for the step `name()` names, if any.
    pub(crate) fn take(&self, name: impl FnOnce() -> String) -> Option<StepError> {
        if self.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let name = name();
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        let at = queued.iter().position(|(step, _)| *step == name)?;
        let (_, error) = queued.remove(at);
        self.count.fetch_sub(1, Ordering::SeqCst);
        Some(error)
    }

    /// The failures queued and not used yet, in the order queued.
    pub(crate) fn unused(&self) -> Vec<(String, StepError)> {
        self.queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// What the wrappers share with the environment.
#[derive(Default, Clone)]
pub(crate) struct Probe {
    pub(crate) calls: Arc<AtomicUsize>,
    pub(crate) faults: Arc<Faults>,
}

/// The application's runner as the test kit runs it: every delivery is
/// counted, and one queued with `fail_next` for its step returns that error
/// instead of calling the runner. The runner is shared by every runtime the
/// environment builds, so its state survives a
/// [`crash`](super::TestRuntime::crash); it is [`inner`](Self::inner).
pub struct TestRunner<R> {
    runner: Arc<R>,
    probe: Probe,
    /// The name of a step that neither the runner nor its payload names.
    label: Arc<str>,
}

impl<R> TestRunner<R> {
    pub(crate) fn new(runner: Arc<R>, probe: Probe, label: Arc<str>) -> Self {
        Self {
            runner,
            probe,
            label,
        }
    }

    /// The application's runner.
    pub fn inner(&self) -> &R {
        &self.runner
    }
}

impl<R: StepRunner> StepRunner for TestRunner<R> {
    async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
        self.probe.calls.fetch_add(1, Ordering::SeqCst);
        let injected = self.probe.faults.take(|| {
            self.runner
                .step_name(step.step_number, &step.payload)
                .or_else(|| crate::history::naming::Naming::Envelopes.step_of(&step.payload))
                .unwrap_or_else(|| self.label.to_string())
        });
        match injected {
            Some(error) => Err(error),
            None => self.runner.run_step(step).await,
        }
    }

    fn step_name(&self, step_number: u32, payload: &[u8]) -> Option<String> {
        self.runner.step_name(step_number, payload)
    }

    fn hosted(&self) -> crate::runner::Hosted {
        self.runner.hosted()
    }

    fn code(&self) -> crate::versioning::HostedCode {
        self.runner.code()
    }
}

/// The application's terminal hook, shared by every runtime the
/// environment builds (see [`TestRunner`]).
pub struct TestHook<H> {
    hook: Arc<H>,
}

impl<H> TestHook<H> {
    pub(crate) fn new(hook: Arc<H>) -> Self {
        Self { hook }
    }

    /// The application's hook.
    pub fn inner(&self) -> &H {
        &self.hook
    }
}

impl<H: TerminalHook> TerminalHook for TestHook<H> {
    async fn on_termination(
        &self,
        outcome: &RunOutcome,
        effects: &TerminalEffects,
    ) -> Result<(), StepError> {
        self.hook.on_termination(outcome, effects).await
    }

    fn observes(&self, outcome: &RunOutcome) -> bool {
        self.hook.observes(outcome)
    }
}

/// A registered job type as the kit runs it (see [`TestRunner`]): a job's
/// step is named by the job's `NAME`.
pub(crate) struct TestHandler {
    name: &'static str,
    handler: Arc<dyn Handler>,
    probe: Probe,
}

impl TestHandler {
    pub(crate) fn wrap(
        name: &'static str,
        handler: Arc<dyn Handler>,
        probe: Probe,
    ) -> Arc<dyn Handler> {
        Arc::new(Self {
            name,
            handler,
            probe,
        })
    }
}

impl Handler for TestHandler {
    fn run<'a>(
        &'a self,
        payload: &'a [u8],
        step: &'a Step,
        state: &'a crate::jobs::StateMap,
    ) -> BoxFuture<'a, Result<StepOutcome, StepError>> {
        self.probe.calls.fetch_add(1, Ordering::SeqCst);
        match self.probe.faults.take(|| self.name.to_string()) {
            Some(error) => Box::pin(std::future::ready(Err(error))),
            None => self.handler.run(payload, step, state),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_failures_are_taken_in_order_by_name_and_only_then() {
        let faults = Faults::default();
        let mut asked = 0;
        assert!(
            faults
                .take(|| {
                    asked += 1;
                    "a".into()
                })
                .is_none()
        );
        assert_eq!(asked, 0, "with nothing queued the name is not read");
        faults.push("a", StepError::transient("first")).unwrap();
        faults.push("b", StepError::permanent("other")).unwrap();
        faults.push("a", StepError::transient("second")).unwrap();
        assert!(faults.take(|| "c".into()).is_none());
        let taken: Vec<_> = std::iter::from_fn(|| faults.take(|| "a".into()))
            .map(|error| error.message)
            .collect();
        assert_eq!(taken, ["first", "second"]);
        let unused: Vec<_> = faults
            .unused()
            .into_iter()
            .map(|(step, error)| (step, error.message))
            .collect();
        assert_eq!(unused, [("b".to_string(), "other".to_string())]);
        assert_eq!(
            faults.take(|| "b".into()).map(|error| error.kind),
            Some(crate::StepErrorKind::Permanent)
        );
        assert_eq!(faults.count.load(Ordering::SeqCst), 0);
        assert!(faults.unused().is_empty());
    }

    #[test]
    fn only_a_known_name_is_taken_once_the_names_are_known() {
        let faults = Faults::default();
        faults.know(Some(vec!["ship".into(), "ask".into()]));
        match faults.push("Ship", StepError::transient("x")) {
            Err(TestError::UnknownStep { name, known }) => {
                assert_eq!(name, "Ship");
                assert_eq!(known, ["ask", "ship"]);
            }
            other => panic!("expected UnknownStep, got {other:?}"),
        }
        faults.push("ship", StepError::transient("x")).unwrap();
        assert_eq!(faults.unused().len(), 1);

        let open = Faults::default();
        open.know(None);
        open.push("anything", StepError::transient("x")).unwrap();
    }
}
