//! Fork and restart: a new run, under a new id linked to the original,
//! that starts at a recorded step of an ended run with the payload that
//! step was delivered with (`view::step_input`); the steps before it are
//! not run again. A restart is the fork from step 0. The new run's first
//! step, run record (with the link) and pointer commit in one
//! compare-and-commit on its run record, as a submission does. A fork that
//! cancels an active original reads the step's input from the active run
//! first (refusing with the run untouched when it cannot), then cancels
//! the run, waits for its end, and forks from the input read: the cancel
//! may delete the job that held the only copy.

use taquba::SettlementEffects;
use tracing::debug;

use crate::engine::cancel::CancelRequest;
use crate::engine::{RuntimeCore, StepEnqueueOpts};
use crate::error::{Error, Result};
use crate::fork::ForkOptions;
use crate::model::SubmitOutcome;
use crate::store::durable::{self, DurableForkLink, DurableRunRecord};
use crate::store::keys::{
    HEADER_SIGNAL_DELIVERED, RunId, run_kv_key, sha256, signal_delivered_kv_key,
};
use crate::view::StepStart;

/// Attempts of a fork whose compare-and-commit lost to a concurrent
/// writer of the new run's record before the call gives up.
const FORK_RACE_RETRIES: usize = 4;

impl RuntimeCore {
    /// Fork `run_id` from step `from_step` (see
    /// [`WorkflowRuntime::fork`](crate::WorkflowRuntime::fork)).
    pub(crate) async fn fork(
        &self,
        run_id: &RunId,
        from_step: u32,
        options: &ForkOptions,
    ) -> Result<SubmitOutcome> {
        let link = DurableForkLink {
            run_id: run_id.clone(),
            step: from_step,
        };
        // A retried fork under the id it was given answers the fork made.
        if let Some(new_id) = &options.run_id
            && let Some(made) = self.fork_made(new_id, &link).await?
        {
            return Ok(made);
        }
        let start = match self.view.run_record(run_id).await? {
            None => self.view.step_start(run_id, from_step).await?,
            Some(_) if !options.cancel_active => return Err(Error::RunActive(run_id.clone())),
            Some(_) => self.cancel_to_fork(run_id, from_step).await?,
        };
        let payload = start.payload;
        // The submitter's headers carry over, from the recorded outcome.
        let original = self.view.run(run_id).await?;
        let headers = original
            .as_ref()
            .map(|details| details.headers.clone())
            .unwrap_or_default();
        let workflow = self.workflow_name_of(&payload);
        // A fork goes on from where the original was, so it keeps the code
        // version and patches the original started with: a later step
        // branches as the original's earlier steps did. A restart runs
        // every step again on the code at hand, so it is a new start.
        let (version, patches) = match original {
            Some(details) if from_step > 0 => (details.version, details.patches),
            _ => {
                let code = self.ops.code.of(workflow.as_deref());
                (code.version.clone(), code.patches.iter().cloned().collect())
            }
        };
        let new_id = options.run_id.clone().unwrap_or_else(|| self.new_run_id());
        let run_key = run_kv_key(&new_id);
        for _ in 0..FORK_RACE_RETRIES {
            let step = self.prepare_step(
                &new_id,
                from_step,
                payload.clone(),
                &headers,
                StepEnqueueOpts {
                    run_at: None,
                    priority: None,
                    max_attempts: None,
                    // A step a signal woke is delivered it again, as an
                    // inbox-delivered signal is: stored for the step.
                    reserved_headers: match start.signal {
                        Some(_) => vec![(HEADER_SIGNAL_DELIVERED, "fork".to_string())],
                        None => Vec::new(),
                    },
                },
            );
            let job_id = step.job_id.clone();
            let record = DurableRunRecord {
                input_hash: sha256(&payload).to_vec(),
                submitted_at_ms: self.now_ms(),
                cancel_requested: false,
                cancel_delivered_to: None,
                execution: Some(job_id.clone()),
                workflow: workflow.clone(),
                group: None,
                cancel_reason: None,
                forked_from: Some(link.clone()),
                concurrency: None,
                version: version.clone(),
                patches: patches.clone(),
                parent: None,
            };
            let mut effects =
                Self::step_effects(&new_id, from_step, step, SettlementEffects::default())
                    .kv_put(run_key.clone(), durable::encode(&record));
            if let Some(signal) = &start.signal {
                effects =
                    effects.kv_put(signal_delivered_kv_key(&new_id, from_step), signal.clone());
            }
            if self
                .commits
                .compare_commit(&run_key, None, effects)
                .await?
                .is_some()
            {
                debug!(run_id = %new_id, forked_from = %run_id, step = from_step, "run forked");
                return Ok(SubmitOutcome {
                    run_id: new_id,
                    newly_submitted: true,
                    job_id,
                });
            }
            // Another writer of the new id committed first: this fork
            // retried, or another run.
            if let Some(made) = self.fork_made(&new_id, &link).await? {
                return Ok(made);
            }
        }
        Err(Error::InconsistentRunState(new_id))
    }

    /// End the active run `run_id` to fork it from step `from_step`, and
    /// what the fork starts with. Whatever can refuse the fork is checked
    /// first, with the run untouched: the step's input is read from the
    /// active run's records (`view::step_input`) and held here, since the
    /// cancel may delete the job holding its only copy (a current step's
    /// payload over the step input limit). Then the run is cancelled and
    /// waited for. A step's input does not change once its job is
    /// enqueued, so the input read is the step's whatever the run did
    /// between the read and its end (moved past the step, ended on its
    /// own); the run's records at its end only add the signal that woke
    /// the step when it was woken after the read.
    ///
    /// A run that ended before the read is forked as an ended run.
    ///
    /// Interrupted after the cancel request (the process ends; the public
    /// call runs on a task of its own, so a dropped call is not), the run
    /// is cancelled without the fork: the request is durable and its
    /// current step is ended by whichever process holds it. A retry under
    /// the same [`ForkOptions::run_id`] then forks the ended run from its
    /// records, which no longer hold the input of a step whose only copy
    /// was the job the cancel deleted.
    ///
    /// # Errors
    /// [`Error::StepNotForkable`] (the run has not reached the step, or
    /// the step's input is no longer recorded), before anything is
    /// committed; storage errors (after the cancel request, the run may be
    /// cancelled without the fork).
    async fn cancel_to_fork(&self, run_id: &RunId, from_step: u32) -> Result<StepStart> {
        match self
            .view
            .active_step_start(run_id, from_step, self.ops.step_input_limit)
            .await?
        {
            Some(read) => self.end_to_fork(run_id, from_step, read).await,
            None => self.view.step_start(run_id, from_step).await,
        }
    }

    /// Cancel `run_id` and wait for its end, to fork it from step
    /// `from_step` with `read`, the step's start read before (see
    /// [`cancel_to_fork`](Self::cancel_to_fork)): `read`, with the signal
    /// the step's entry kept at the run's end when the read found none (a
    /// signal that woke the step after the read).
    ///
    /// # Errors
    /// Storage errors of the cancel and the wait.
    async fn end_to_fork(
        &self,
        run_id: &RunId,
        from_step: u32,
        read: StepStart,
    ) -> Result<StepStart> {
        let request = CancelRequest {
            reason: Some(format!("cancelled to fork it from step {from_step}")),
            ..Default::default()
        };
        // `None`: the run ended on its own since the read.
        let _: Option<bool> = self.cancel_as(run_id, request).await?;
        self.wait_run(run_id).await?;
        if read.signal.is_some() {
            return Ok(read);
        }
        let signal = match self.view.ended_step_signal(run_id, from_step).await {
            Ok(signal) => signal,
            Err(err) => {
                // The fork goes on with the input read.
                debug!(run_id = %run_id, step = from_step, "the signal of the forked step is not read at the run's end: {err}");
                None
            }
        };
        Ok(StepStart { signal, ..read })
    }

    /// The answer to a fork under `new_id` of `link` already made
    /// (`newly_submitted: false`), `None` when no run has the id.
    ///
    /// # Errors
    /// [`Error::ForkRunIdTaken`] when a run that is not that fork has it.
    async fn fork_made(
        &self,
        new_id: &RunId,
        link: &DurableForkLink,
    ) -> Result<Option<SubmitOutcome>> {
        let (forked_from, job_id) = match self.view.run_record(new_id).await? {
            Some(record) => {
                let job_id = self
                    .view
                    .current_job(new_id)
                    .await?
                    .map(|(pointer, _)| pointer.job_id)
                    .unwrap_or_default();
                (record.forked_from, job_id)
            }
            None => match self.view.terminal_record(new_id).await? {
                Some(termination) => (termination.forked_from, String::new()),
                None => return Ok(None),
            },
        };
        if forked_from.as_ref() != Some(link) {
            return Err(Error::ForkRunIdTaken(new_id.clone()));
        }
        Ok(Some(SubmitOutcome {
            run_id: new_id.clone(),
            newly_submitted: false,
            job_id,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use taquba::object_store::memory::InMemory;
    use taquba::{MockClock, OpenOptions, Queue};

    use super::*;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{RunSpec, RunState, StepError, StepOutcome, TerminalStatus};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;

    const HOUR: Duration = Duration::from_secs(3600);

    /// Step 0 continues to step 1 with a payload over the step input limit
    /// (2000 bytes), waiting for the signal `one:{run}`; step 1 continues
    /// to step 2, waiting for `two:{run}`; step 2 succeeds.
    struct Waits;

    impl StepRunner for Waits {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            Ok(match step.step_number {
                0 => StepOutcome::continue_on_signal(
                    vec![b'x'; 2000],
                    format!("one:{}", step.run_id),
                    HOUR,
                ),
                1 => StepOutcome::continue_on_signal(
                    b"small".to_vec(),
                    format!("two:{}", step.run_id),
                    HOUR,
                ),
                _ => StepOutcome::Succeed { result: Vec::new() },
            })
        }
    }

    async fn runtime() -> WorkflowRuntime<Waits, NoopTerminalHook> {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(
            Queue::open_with_options(
                store.clone(),
                "db",
                OpenOptions::default().clock(Arc::new(MockClock::new(1_000_000))),
            )
            .await
            .expect("open"),
        );
        WorkflowRuntime::builder(queue, store, Waits, NoopTerminalHook).build()
    }

    /// Wait until `run_id`'s status satisfies `done`.
    async fn until(
        runtime: &WorkflowRuntime<Waits, NoopTerminalHook>,
        run_id: &RunId,
        done: impl Fn(&crate::model::RunStatus) -> bool,
    ) {
        for _ in 0..1000 {
            let status = runtime.status(run_id).await.expect("status");
            if status.as_ref().is_some_and(&done) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{run_id} never got there");
    }

    fn waiting_at(step: u32) -> impl Fn(&crate::model::RunStatus) -> bool {
        move |status| status.current_step == step && status.state == RunState::Pending
    }

    /// Submit run `id` and wait until it waits at step 1 (its large
    /// payload's step).
    async fn waiting_at_step_one(
        runtime: &WorkflowRuntime<Waits, NoopTerminalHook>,
        id: &str,
    ) -> RunId {
        let run_id = RunId::new(id).expect("id");
        runtime
            .submit(RunSpec {
                run_id: Some(run_id.clone()),
                input: b"zero".to_vec(),
                ..Default::default()
            })
            .await
            .expect("submit");
        until(runtime, &run_id, waiting_at(1)).await;
        run_id
    }

    /// A cancelling fork whose run moves on between the read of the step's
    /// input and the cancel (the step is signalled and settles, its job is
    /// deleted, a later step is current; or the run ends on its own) forks
    /// from the input read, which the ended run's records no longer hold,
    /// with the signal that woke the step after the read.
    #[tokio::test(start_paused = true)]
    async fn a_run_that_moves_on_after_the_read_is_forked_from_the_input_read() {
        let runtime = runtime().await;
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        for (id, ends_on_its_own) in [("moved", false), ("ended", true)] {
            let run_id = waiting_at_step_one(&runtime, id).await;
            let read = core
                .view
                .active_step_start(&run_id, 1, core.ops.step_input_limit)
                .await
                .expect("read")
                .expect("active");
            assert_eq!(read.payload, vec![b'x'; 2000]);
            assert_eq!(read.signal, None, "not woken yet");

            // The run moves on: step 1 is woken and settles.
            runtime
                .signal(&format!("one:{id}"), b"woke".to_vec())
                .await
                .expect("signal");
            until(&runtime, &run_id, waiting_at(2)).await;
            if ends_on_its_own {
                runtime
                    .signal(&format!("two:{id}"), Vec::new())
                    .await
                    .expect("signal");
                runtime.wait(&run_id).await.expect("ended");
            }

            let start = core.end_to_fork(&run_id, 1, read).await.expect("ended");
            assert_eq!(start.payload, vec![b'x'; 2000], "{id}");
            assert_eq!(start.signal.as_deref(), Some(&b"woke"[..]), "{id}");
            let end = runtime.wait(&run_id).await.expect("ended");
            let status = match ends_on_its_own {
                true => TerminalStatus::Succeeded,
                false => TerminalStatus::Cancelled,
            };
            assert_eq!(end.termination.status, status, "{id}");
            // The ended run's records no longer hold the input: only the
            // read made before the cancel does.
            let err = runtime
                .view()
                .step_input(&run_id, 1)
                .await
                .expect_err("step 1's job is gone");
            assert!(
                matches!(err, Error::StepNotForkable { step: 1, .. }),
                "{err}"
            );
        }
        worker.shutdown().await.expect("shutdown");
    }

    /// Whatever refuses the fork of an active run refuses it before the
    /// cancel: a step the run has not reached, one before the step a
    /// forked run started from.
    #[tokio::test(start_paused = true)]
    async fn a_cancelling_fork_refused_leaves_the_run_active() {
        let runtime = runtime().await;
        let worker = runtime.spawn(std::future::pending::<()>());
        let run_id = waiting_at_step_one(&runtime, "busy").await;
        let cancelling = ForkOptions::new().cancel_active(true);
        let err = runtime
            .fork(&run_id, 2, cancelling.clone())
            .await
            .expect_err("step 2 not reached");
        assert!(
            matches!(err, Error::StepNotForkable { step: 2, .. })
                && err.to_string().contains("has not reached step 2"),
            "{err}"
        );
        // A fork of the run from step 1, itself active at step 1: its step
        // 0 is the original's.
        let fork = runtime
            .fork(
                &run_id,
                1,
                cancelling.clone().run_id(RunId::new("f").expect("id")),
            )
            .await
            .expect("fork");
        until(&runtime, &fork.run_id, waiting_at(1)).await;
        let err = runtime
            .fork(&fork.run_id, 0, cancelling)
            .await
            .expect_err("before the fork's first step");
        assert!(err.to_string().contains("fork `busy` instead"), "{err}");
        let status = runtime.status(&fork.run_id).await.expect("status");
        assert!(
            status.is_some_and(|s| s.state == RunState::Pending),
            "the refused fork left the run waiting"
        );
        worker.shutdown().await.expect("shutdown");
    }
}
