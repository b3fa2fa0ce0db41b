//! Time skipping: moving the environment's clock from one due instant to
//! the next ([`super::due`]) and running until idle at each, so that
//! everything falls due at its own time and in time order, what a step
//! schedules meanwhile included. [`Harness::skip`] serves `advance(d)`
//! (ending at exactly now + d), running until a run ends, and running
//! until nothing is due at any future time; each stops after the
//! environment's hop cap with an error naming the run that kept falling
//! due.

use std::collections::HashMap;
use std::time::Duration;

use super::due::{self, Counted, Due};
use super::error::TestError;
use super::harness::{Harness, Until};
use super::waiting::not_ended;
use crate::hooks::terminal::TerminalHook;
use crate::model::RunState;
use crate::runner::StepRunner;
use crate::store::keys::RunId;

/// The hops of one call, and which run each was for.
struct Hops {
    max: u32,
    taken: u32,
    by_run: HashMap<RunId, u32>,
}

impl Hops {
    fn new(max: u32) -> Self {
        Self {
            max,
            taken: 0,
            by_run: HashMap::new(),
        }
    }

    /// Count a hop to `due`.
    ///
    /// # Errors
    /// [`TestError::TooManyHops`] past the cap, naming the run most hops
    /// were for.
    fn take(&mut self, due: &Due) -> Result<(), TestError> {
        if self.taken >= self.max {
            let busiest = self
                .by_run
                .iter()
                .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(run, hops)| (run.clone(), *hops));
            return Err(TestError::TooManyHops {
                hops: self.taken,
                run_id: busiest.as_ref().map(|(run, _)| run.clone()),
                run_hops: busiest.map_or(0, |(_, hops)| hops),
            });
        }
        self.taken += 1;
        if let Some(run) = &due.run_id {
            *self.by_run.entry(run.clone()).or_default() += 1;
        }
        Ok(())
    }
}

impl<R: StepRunner + 'static, H: TerminalHook + 'static> Harness<R, H> {
    /// Run what is due now; then, until `until`, move the clock to the next
    /// instant something falls due and run what is due there. Returns the
    /// runner calls made.
    ///
    /// # Errors
    /// [`TestError::TooManyHops`] after the cap of clock steps;
    /// [`TestError::NotEnded`] when running until a run ends and nothing is
    /// due at any future time; [`TestError::UnknownRun`]; as
    /// [`run_until_idle`](Self::run_until_idle).
    pub(crate) async fn skip(&self, until: Until<'_>) -> Result<usize, TestError> {
        let mut hops = Hops::new(self.settings().max_hops);
        let mut calls = self.run_due_now().await?;
        let (limit, counted) = match until {
            Until::Time(target) => (target, Counted::StepsAndRetention),
            Until::Ended(_) | Until::Quiet => (u64::MAX, Counted::Steps),
        };
        loop {
            if let Until::Ended(run_id) = until
                && self.ended(run_id).await?
            {
                return Ok(calls);
            }
            let now = self.now_ms();
            let core = self.core()?;
            match due::next_due(&core, now, counted).await? {
                Some(due) if due.at_ms <= limit => {
                    hops.take(&due)?;
                    self.set_clock(due.at_ms);
                    calls += self.run_due_now().await?;
                }
                _ => {
                    return match until {
                        Until::Time(target) => {
                            if target > now {
                                self.set_clock(target);
                                calls += self.run_due_now().await?;
                            }
                            Ok(calls)
                        }
                        Until::Ended(run_id) => {
                            Err(not_ended(&self.runtime()?.view().clone(), run_id, now).await)
                        }
                        Until::Quiet => Ok(calls),
                    };
                }
            }
        }
    }

    /// Reap the leases expired by now and run until idle, unless jobs are
    /// claimed outside the worker (a test's own claims): those wait for
    /// their leases, the next hops.
    async fn run_due_now(&self) -> Result<usize, TestError> {
        let core = self.core()?;
        core.queue
            .reap_now()
            .await
            .map_err(crate::error::Error::from)?;
        if !self.worker_running() && due::held_claims(&core).await? {
            return Ok(0);
        }
        self.run_until_idle().await
    }

    /// Move the clock forward to `at_ms` (never back).
    fn set_clock(&self, at_ms: u64) {
        let now = self.now_ms();
        if at_ms > now {
            self.clock().advance(Duration::from_millis(at_ms - now));
        }
    }

    /// Whether `run_id` terminated.
    async fn ended(&self, run_id: &RunId) -> Result<bool, TestError> {
        let status = self
            .runtime()?
            .status(run_id)
            .await?
            .ok_or_else(|| TestError::UnknownRun(run_id.clone()))?;
        Ok(matches!(status.state, RunState::Terminated(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(run: &str) -> Due {
        Due {
            at_ms: 1,
            run_id: Some(RunId::new(run).unwrap()),
        }
    }

    #[test]
    fn the_cap_names_the_run_most_hops_were_for() {
        let mut hops = Hops::new(4);
        for run in ["loop", "other", "loop", "loop"] {
            hops.take(&due(run)).unwrap();
        }
        match hops.take(&due("other")) {
            Err(TestError::TooManyHops {
                hops,
                run_id,
                run_hops,
            }) => {
                assert_eq!(hops, 4);
                assert_eq!(run_id, Some(RunId::new("loop").unwrap()));
                assert_eq!(run_hops, 3);
            }
            other => panic!("expected TooManyHops, got {other:?}"),
        }
    }
}
