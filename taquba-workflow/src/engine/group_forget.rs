//! Removal of a group's state: [`RunGroup::forget`](crate::RunGroup::forget)
//! ends the members still active first (each cancelled as
//! [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel) does, then
//! waited for), and the group retention sweep removes a group only when no
//! member ran since a results consumer observed the last termination. Both
//! hold the group's lock, so no submission starts a member in between.
//!
//! What is removed: for every run of every member (the manifest's members
//! and any member record, each run from the first up to the one its member
//! record names), the memo entries (run result and replay records
//! included), the terminal record and the run's memo-retention marker (its
//! time is the terminal record's); then the member records, the submission
//! counter, the manifest claim, and last the manifest, so a removal that
//! failed part-way is found and finished by the next one.

use std::collections::BTreeSet;

use futures_util::TryStreamExt;
use taquba::SettlementEffects;
use tracing::warn;

use crate::coordination::members::{GroupStore, Membership};
use crate::engine::RuntimeCore;
use crate::engine::group_submit::SUBMIT_CONCURRENCY;
use crate::error::{Error, Result};
use crate::settled::try_join_settled;
use crate::store::durable::{self, DurableTermination};
use crate::store::keys::{
    RunId, group_manifest_claim_kv_key, group_members_kv_prefix, group_submissions_kv_key,
    outcome_kv_key,
};

/// Records deleted per transaction.
const PAGE: usize = 1000;
/// Rounds of ending the active members before a `forget` removes the group
/// regardless. One suffices (no member starts while the group's lock is
/// held); a member record that names a run whose records are gone (left by
/// outside interference) stays "active" for good, and is removed with the
/// rest after these.
const END_ROUNDS: usize = 3;

impl RuntimeCore {
    /// [`RunGroup::forget`](crate::RunGroup::forget): cancel every active
    /// member, wait until each ended, then remove the group's state.
    pub(crate) async fn forget_group(&self, group_id: &RunId) -> Result<()> {
        let _lock = self.group_locks.lock(group_id).await;
        for _ in 0..END_ROUNDS {
            let active: Vec<RunId> = self
                .group_store
                .members(group_id)
                .await?
                .into_iter()
                .filter(|member| member.status().is_none())
                .map(|member| member.record.run_id)
                .collect();
            if active.is_empty() {
                break;
            }
            try_join_settled(active, SUBMIT_CONCURRENCY, |run_id| async move {
                self.cancel(&run_id).await?;
                match self.wait_run(&run_id).await {
                    Ok(_) | Err(Error::RunNotFound(_)) => Ok(()),
                    Err(err) => Err(err),
                }
            })
            .await?;
        }
        self.group_store.remove(group_id).await
    }

    /// The group retention sweep's removal of `group_id`, whose marker a
    /// results consumer wrote at `marked_at_ms`: removed when no member is
    /// active and none terminated after the marker ([`Swept::Removed`]);
    /// otherwise the group was submitted (or resumed) again since, and it
    /// is kept until a consumer observes the re-run's end
    /// ([`Swept::RanSince`]). A group whose lock is held (a submission or a
    /// `forget` in progress) is left for the next pass ([`Swept::Busy`]),
    /// so the sweep never waits behind one.
    pub(super) async fn remove_group_unchanged_since(
        &self,
        group_id: &RunId,
        marked_at_ms: u64,
    ) -> Result<Swept> {
        let Some(_lock) = self.group_locks.try_lock(group_id) else {
            return Ok(Swept::Busy);
        };
        let ran_since = self
            .group_store
            .members(group_id)
            .await?
            .iter()
            .any(|member| {
                member
                    .record
                    .terminated
                    .as_ref()
                    .is_none_or(|t| t.terminated_at_ms > marked_at_ms)
            });
        if ran_since {
            return Ok(Swept::RanSince);
        }
        self.group_store.remove(group_id).await?;
        Ok(Swept::Removed)
    }
}

/// What the retention sweep did with an expired group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Swept {
    /// Removed.
    Removed,
    /// Kept: members ran since the marker.
    RanSince,
    /// Not looked at: its lock is held.
    Busy,
}

impl GroupStore {
    /// Remove the state of `group_id` (see the module doc). The caller holds
    /// the group's lock and has ended its members.
    pub(crate) async fn remove(&self, group_id: &RunId) -> Result<()> {
        // Each member's run id; and a run id a member record names beside
        // it (a record written by a build that numbered re-runs).
        let mut runs: BTreeSet<RunId> = BTreeSet::new();
        let membership = |key: String| Membership {
            group_id: group_id.clone(),
            key,
        };
        if let Some(manifest) = self.read_manifest(group_id).await? {
            for member in manifest.members {
                runs.insert(membership(member.key).run_id());
            }
        }
        for member in self.members(group_id).await? {
            runs.insert(membership(member.key).run_id());
            runs.insert(member.record.run_id);
        }
        let run_keys: Vec<Vec<Vec<u8>>> =
            try_join_settled(runs, SUBMIT_CONCURRENCY, |run_id| self.clear_run(run_id)).await?;
        let mut keys = Vec::new();
        for key in run_keys.into_iter().flatten() {
            keys.push(key);
            if keys.len() == PAGE {
                self.delete_keys(std::mem::take(&mut keys)).await?;
            }
        }
        let prefix = group_members_kv_prefix(group_id);
        let member_keys: Vec<Vec<u8>> = {
            let view = self.queue().view();
            let entries = view.kv_entries(&prefix, .., PAGE);
            entries.map_ok(|(key, _)| key).try_collect().await?
        };
        for key in member_keys.into_iter().chain([
            group_submissions_kv_key(group_id),
            group_manifest_claim_kv_key(group_id),
        ]) {
            keys.push(key);
            if keys.len() == PAGE {
                self.delete_keys(std::mem::take(&mut keys)).await?;
            }
        }
        if !keys.is_empty() {
            self.delete_keys(keys).await?;
        }
        self.delete_manifest(group_id).await
    }

    /// Clear the memo entries of the member run `run_id`; the KV keys of its
    /// terminal record, memo-retention marker and history records, to
    /// delete.
    async fn clear_run(&self, run_id: RunId) -> Result<Vec<Vec<u8>>> {
        self.memo_store().clear_memos_for_run(&run_id).await?;
        let outcome_key = outcome_kv_key(&run_id);
        let mut keys = Vec::with_capacity(2);
        if let Some(bytes) = self.queue().view().kv_get(&outcome_key).await? {
            match durable::decode_or_absent::<DurableTermination>(
                &bytes,
                "terminal record",
                &run_id,
            ) {
                Some(termination) => keys.push(
                    self.terminals()
                        .entry_key(termination.terminated_at_ms, run_id.as_bytes()),
                ),
                None => {
                    warn!(run_id = %run_id, "its retention marker, if any, is left to the sweep")
                }
            }
        }
        keys.push(outcome_key);
        keys.extend(crate::history::read::history_keys(self.queue().view(), &run_id).await?);
        Ok(keys)
    }

    async fn delete_keys(&self, keys: Vec<Vec<u8>>) -> Result<()> {
        self.commits()
            .commit(SettlementEffects::default().kv_deletes(keys))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures_util::TryStreamExt;
    use taquba::object_store::memory::InMemory;
    use taquba::{MockClock, OpenOptions, Queue};

    use super::*;
    use crate::coordination::members::GroupMember;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{RunOptions, StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;

    struct Done;

    impl StepRunner for Done {
        async fn run_step(&self, _: &Step) -> std::result::Result<StepOutcome, StepError> {
            Ok(StepOutcome::Succeed { result: Vec::new() })
        }
    }

    /// An expired group whose lock is held (a submission or `forget` in
    /// progress) is not waited for: the pass keeps its marker and goes on,
    /// and a later pass removes it once the lock is free.
    #[tokio::test(start_paused = true)]
    async fn the_sweep_skips_a_group_busy_with_a_submission_and_removes_it_later() {
        let clock = MockClock::new(1_000_000);
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(
            Queue::open_with_options(
                store.clone(),
                "db",
                OpenOptions::default().clock(Arc::new(clock.clone())),
            )
            .await
            .expect("open"),
        );
        let runtime = WorkflowRuntime::builder(queue, store, Done, NoopTerminalHook)
            .group_retention(Duration::from_secs(1))
            .build();
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        let group = runtime.group(RunId::new("busy").expect("id"));
        group
            .submit(
                vec![GroupMember {
                    key: "a".into(),
                    input: Vec::new(),
                }],
                &RunOptions::default(),
            )
            .await
            .expect("submit");
        let _: Vec<_> = group
            .results()
            .await
            .expect("results")
            .try_collect()
            .await
            .expect("results");
        worker.shutdown().await.expect("shutdown");
        clock.advance(Duration::from_secs(2));

        let held = core.group_locks.lock(group.id()).await;
        let pass = tokio::time::timeout(Duration::from_secs(1), core.sweep_once()).await;
        assert_eq!(
            pass.expect("the pass does not wait").expect("pass"),
            0,
            "nothing removed"
        );
        assert!(group.status().await.is_ok(), "kept while busy");
        drop(held);
        assert_eq!(core.sweep_once().await.expect("pass"), 1);
        assert!(matches!(group.status().await, Err(Error::GroupNotFound(_))));
    }
}
