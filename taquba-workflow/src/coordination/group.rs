//! Run groups: a durable set of runs of one runtime named by a group id.
//! The membership is a manifest object under the memo prefix; each member's
//! state is a record in the queue's KV namespace, written with the member's
//! submission and rewritten by the settlement that terminates it.
//! [`jobs::JobGroup`](crate::jobs::JobGroup) is the typed presentation.

use std::collections::HashSet;
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt};
use tracing::warn;

use crate::engine::RuntimeCore;
use crate::engine::group_submit::{self, SUBMIT_CONCURRENCY};
use crate::error::{Error, Result};
use crate::model::{RunOptions, RunTermination};
use crate::run::commit::detached;
use crate::settled::try_join_settled;
use crate::store::durable::DurableMember;
use crate::store::keys::RunId;

use crate::coordination::members::{
    GroupMember, GroupStatus, GroupStore, HashedMember, Manifest, MemberResult, MemberState,
    StoredAttempts, StoredInputHash, check_member_key, group_status, raw_input_hash, same_set,
};

/// Members a results stream waits on at once. Already terminated members
/// are yielded as soon as they enter the window, so memory stays bounded
/// for any group size.
const RESULTS_WINDOW: usize = 256;
/// A durable group of runs of one runtime, from
/// [`WorkflowRuntime::group`](crate::WorkflowRuntime::group) or
/// [`WorkflowRuntime::new_group`](crate::WorkflowRuntime::new_group). Cheap
/// to clone.
///
/// Members are keyed; a member's run id derives from the group id and its
/// key (hex SHA-256 of `{group_id}/{key}`, as in 0.13), the same for every
/// run of the member, and belongs to the group: a plain submission
/// under it is refused ([`Error::GroupMemberRunId`]), so the group always
/// reports its member's own run; only an active member's run submitted
/// plain with its own input is answered, as a duplicate (as in 0.13). The
/// manifest is durable, so [`results`](Self::results), [`status`](Self::status),
/// [`cancel`](Self::cancel) and [`forget`](Self::forget) work after a
/// restart. A second [`submit`](Self::submit) of the same set (or
/// [`resume`](Self::resume)) runs again only the members that did not
/// succeed, each as a new run that starts clean.
#[derive(Clone)]
pub struct RunGroup {
    core: Arc<RuntimeCore>,
    id: RunId,
}

impl std::fmt::Debug for RunGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunGroup").field("id", &self.id).finish()
    }
}

impl RunGroup {
    pub(crate) fn new(core: Arc<RuntimeCore>, id: RunId) -> Self {
        Self { core, id }
    }

    /// The group id.
    pub fn id(&self) -> &RunId {
        &self.id
    }

    fn store(&self) -> &GroupStore {
        &self.core.group_store
    }

    pub(crate) async fn manifest(&self) -> Result<Manifest> {
        self.store()
            .read_manifest(&self.id)
            .await?
            .ok_or_else(|| Error::GroupNotFound(self.id.clone()))
    }

    pub(crate) async fn members(&self) -> Result<Vec<MemberState>> {
        self.store().members(&self.id).await
    }

    /// Submit `members` (in this order) with `options` applied to each.
    /// The first submission writes the manifest; a later one must name the
    /// same members in the same order with the same inputs (of concurrent
    /// first submissions of different sets, one is accepted), and submits
    /// again every member whose last termination is not a success (members
    /// still active are left running). Members are committed up to 256 per
    /// transaction, in order, so a group of any size submits in bounded
    /// memory; a failure returns after the members committed so far (every
    /// commit in flight when it happened has finished by then), and a
    /// re-submission or [`resume`](Self::resume) completes the rest.
    ///
    /// A member run again (its last run failed or was cancelled) keeps the
    /// member's run id (which [`MemberResult::run_id`] reports) and starts
    /// clean: the earlier run's memo entries and run result record are
    /// removed before the re-run commits, and its step-output replay
    /// records and history entries, which name the run's execution, are
    /// not the re-run's. A crash between the two leaves the member failed
    /// (or cancelled) without its recorded outcome; the next submission
    /// runs it again.
    ///
    /// Submissions and resumes of one group (from any runtime over the
    /// queue in this process) run one at a time, and wait for a
    /// [`forget`](Self::forget) in progress.
    ///
    /// # Cancel safety
    ///
    /// The whole submission runs on a task of its own.
    /// Dropped at any await, it either wrote nothing (the group is not
    /// found) or submits every member as if awaited.
    ///
    /// # Errors
    /// [`Error::DuplicateMemberKey`] for two members with one key;
    /// [`Error::MemberKeyTooLong`] for a key over
    /// [`MAX_MEMBER_KEY_LEN`](crate::limits::MAX_MEMBER_KEY_LEN) bytes;
    /// [`Error::GroupMismatch`] for a member set that differs from the
    /// manifest; [`Error::MemberRunIdTaken`] for a member whose run id an
    /// active run outside the group holds; errors of
    /// [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit).
    pub async fn submit(&self, members: Vec<GroupMember>, options: &RunOptions) -> Result<()> {
        let members = members.into_iter().map(HashedMember::raw).collect();
        self.submit_hashed(members, options, raw_input_hash).await
    }

    /// [`submit`](Self::submit) of members whose input hashes are given,
    /// `stored_hash` hashing the inputs of the stored manifest alike (a job
    /// group's canonical hashes), on a task of its own.
    pub(crate) async fn submit_hashed(
        &self,
        members: Vec<HashedMember>,
        options: &RunOptions,
        stored_hash: StoredInputHash,
    ) -> Result<()> {
        let (group, options) = (self.clone(), options.clone());
        let span = crate::telemetry::spans::submit_group(&self.core.queue_name, &self.id);
        detached(crate::telemetry::spans::within(span, async move {
            group.submit_here(members, &options, stored_hash).await
        }))
        .await
    }

    async fn submit_here(
        &self,
        members: Vec<HashedMember>,
        options: &RunOptions,
        stored_hash: StoredInputHash,
    ) -> Result<()> {
        let mut seen = HashSet::with_capacity(members.len());
        for member in &members {
            check_member_key(&member.member.key)?;
            if !seen.insert(member.member.key.as_str()) {
                return Err(Error::DuplicateMemberKey(member.member.key.clone()));
            }
        }
        drop(seen);
        let _lock = self.core.group_locks.lock(&self.id).await;
        let members = match self.store().read_manifest(&self.id).await? {
            Some(existing) => same_set(existing.members, members, stored_hash)
                .ok_or_else(|| Error::GroupMismatch(self.id.clone()))?,
            None => {
                self.store()
                    .claim_and_write_manifest(&self.id, &members)
                    .await?;
                members
            }
        };
        self.submit_members(members, options).await
    }

    /// Submit the manifest's members whose last termination is not a
    /// success, as a re-[`submit`](Self::submit) would.
    ///
    /// # Cancel safety
    ///
    /// As [`submit`](Self::submit), the whole call runs on a
    /// task of its own and completes when dropped.
    ///
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; submission
    /// errors.
    pub async fn resume(&self, options: &RunOptions) -> Result<()> {
        self.resume_hashed(options, raw_input_hash, None).await
    }

    /// [`resume`](Self::resume) hashing the manifest's inputs with
    /// `stored_hash`, on a task of its own. With `stored_attempts`, options
    /// that set no attempt limit take the one it reads from the first
    /// member's stored input (a job's [`Job::max_attempts`](crate::jobs::Job::max_attempts),
    /// as its group's submission applied it).
    pub(crate) async fn resume_hashed(
        &self,
        options: &RunOptions,
        stored_hash: StoredInputHash,
        stored_attempts: Option<StoredAttempts>,
    ) -> Result<()> {
        let (group, mut options) = (self.clone(), options.clone());
        let span = crate::telemetry::spans::submit_group(&self.core.queue_name, &self.id);
        detached(crate::telemetry::spans::within(span, async move {
            let _lock = group.core.group_locks.lock(&group.id).await;
            let manifest = group.manifest().await?;
            if options.max_attempts_per_step.is_none()
                && let (Some(attempts_of), Some(first)) =
                    (stored_attempts, manifest.members.first())
            {
                options.max_attempts_per_step = attempts_of(&first.input)?;
            }
            let members = manifest
                .members
                .into_iter()
                .map(|member| {
                    Ok(HashedMember {
                        input_hash: stored_hash(&member.input)?,
                        member,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            group.submit_members(members, &options).await
        }))
        .await
    }

    async fn submit_members(&self, members: Vec<HashedMember>, options: &RunOptions) -> Result<()> {
        group_submit::submit_members(&self.core, &self.id, members, options).await
    }

    /// Wait until member `key` terminates; its result.
    async fn wait_member(&self, key: String) -> Result<MemberResult> {
        let Some(record) = self.store().member(&self.id, &key).await? else {
            return Err(Error::MemberNotSubmitted {
                group_id: self.id.clone(),
                key,
            });
        };
        // A termination still being committed by this process is left to
        // the wait, which reports it once it is durable.
        if record.terminated.is_some() && self.core.read_termination_is_durable(&record.run_id)? {
            return self.member_result(key, record).await;
        }
        // The member record is rewritten by the commit that ends the run,
        // which is what the wait reports.
        let end = self.core.wait_run(&record.run_id).await?;
        Ok(MemberResult {
            key,
            run_id: record.run_id,
            termination: end.termination,
            outcome: end.outcome,
        })
    }

    /// The members' results as they terminate (members already terminated
    /// first, then in completion order). Once the last one is yielded the
    /// group's retention marker is written (with
    /// [`group_retention`](crate::WorkflowRuntimeBuilder::group_retention)).
    /// The members still running are waited on 256 at a time, in manifest
    /// order, so the waits' memory is bounded for any group size.
    ///
    /// # Cancel safety
    ///
    /// Reads and waits; the retention marker and any
    /// dead-letter reconciliation a wait performs commit on tasks of their
    /// own, so dropping the stream leaves nothing half-written.
    ///
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; in the stream,
    /// [`Error::MemberNotSubmitted`] for a manifest member without a record,
    /// and storage errors.
    pub async fn results(&self) -> Result<impl Stream<Item = Result<MemberResult>> + use<>> {
        let manifest = self.manifest().await?;
        // The members terminated now, from one scan of the records, come
        // first, whatever their place in the manifest; the window then waits
        // on the rest in manifest order.
        let mut terminated = Vec::new();
        let mut yielded = HashSet::new();
        {
            let in_manifest: HashSet<&str> =
                manifest.members.iter().map(|m| m.key.as_str()).collect();
            for state in self.members().await? {
                if state.record.terminated.is_some()
                    && in_manifest.contains(state.key.as_str())
                    // A termination still committing is left to the wait.
                    && self
                        .core
                        .read_termination_is_durable(&state.record.run_id)
                        .unwrap_or(false)
                {
                    yielded.insert(state.key.clone());
                    terminated.push(state);
                }
            }
        }
        let group = self.clone();
        let terminated = stream::iter(terminated)
            .map(move |state| {
                let group = group.clone();
                async move { Box::pin(group.member_result(state.key, state.record)).await }
            })
            .buffer_unordered(SUBMIT_CONCURRENCY);
        let group = self.clone();
        let left = manifest
            .members
            .into_iter()
            .map(|member| member.key)
            .filter(move |key| !yielded.contains(key));
        let waits = stream::iter(left)
            .map(move |key| {
                let group = group.clone();
                // Boxed, so the window moves pointers, not wait futures.
                async move { Box::pin(group.wait_member(key)).await }
            })
            .buffer_unordered(RESULTS_WINDOW);
        let group = self.clone();
        let marker = stream::once(async move {
            if let Err(err) = group.core.mark_group_terminated(&group.id).await {
                warn!(group_id = %group.id, "group retention marker write failed: {err}");
            }
        })
        .filter_map(|()| async { None });
        // Boxed, so callers can `.next()` it without pinning.
        Ok(terminated.chain(waits).chain(marker).boxed())
    }

    async fn member_result(&self, key: String, record: DurableMember) -> Result<MemberResult> {
        let terminated = record
            .terminated
            .ok_or_else(|| Error::InconsistentRunState(record.run_id.clone()))?;
        // The member's own termination: a record another run under the id
        // wrote does not match it.
        let outcome = self
            .core
            .outcome_of_termination(&record.run_id, &terminated)
            .await?;
        let termination: RunTermination = terminated.into();
        Ok(MemberResult {
            key,
            run_id: record.run_id,
            termination,
            outcome,
        })
    }

    /// Member counts by state.
    ///
    /// Counts only durable ends, as
    /// [`WorkflowRuntime::status`](crate::WorkflowRuntime::status) reports
    /// them: while a member's ending commit of this process waits for its
    /// flush (a crash would lose it, and the member would run again), the
    /// count waits for that commit to report (at most a flush on a healthy
    /// store), then reads the members again. Read-only: dropping the future
    /// at any await is safe.
    ///
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; storage errors;
    /// the store-closed error once another process opened the store.
    pub async fn status(&self) -> Result<GroupStatus> {
        let manifest = self.manifest().await?;
        loop {
            let members = self.members().await?;
            let mut in_flight = Vec::new();
            for member in &members {
                if member.record.terminated.is_some()
                    && !self
                        .core
                        .read_termination_is_durable(&member.record.run_id)?
                {
                    in_flight.push(&member.record.run_id);
                }
            }
            if in_flight.is_empty() {
                return Ok(group_status(&self.id, manifest.members.len(), &members));
            }
            // Every such end at once, then one more read of the members.
            for run_id in in_flight {
                self.core.termination_reported(run_id).await?;
            }
        }
    }

    /// Cancel every active member as
    /// [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel) does;
    /// returns how many of those cancellations answered `true` (the
    /// requests this call recorded that end their member `Cancelled`).
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, it cancels every member active when it started, as if
    /// awaited.
    ///
    /// # Errors
    /// Storage errors, once every member cancellation in flight finished;
    /// [`Error::RuntimeShutdown`].
    pub async fn cancel(&self) -> Result<usize> {
        let group = self.clone();
        detached(async move { group.cancel_here().await }).await
    }

    async fn cancel_here(&self) -> Result<usize> {
        let active: Vec<RunId> = self
            .members()
            .await?
            .into_iter()
            .filter(|m| m.status().is_none())
            .map(|m| m.record.run_id)
            .collect();
        let core = &self.core;
        let recorded = try_join_settled(active, SUBMIT_CONCURRENCY, |run_id| async move {
            core.cancel(&run_id).await
        })
        .await?;
        Ok(recorded.into_iter().filter(|r| *r).count())
    }

    /// Remove the group's state: manifest, member records, and the memo
    /// entries (run result and replay records included), terminal records
    /// and memo-retention markers of every run of every member. A later
    /// [`submit`](Self::submit) under the id starts afresh.
    ///
    /// Members still active are ended first: each is cancelled as
    /// [`cancel`](Self::cancel) cancels it (a waiting step is removed, a
    /// running step's cancel token fires) and waited for, and only once
    /// every one ended is anything removed, so no run of the group is left
    /// running on state that is gone. A running step that ignores its token
    /// is waited for until it returns (so a step of one of the group's own
    /// members must not call it: it would wait for itself). Submissions and
    /// resumes of the group wait for a `forget` in progress (and it for
    /// them).
    ///
    /// # Cancel safety
    ///
    /// Runs whole on a task of its own
    /// ([cancel safety](crate#cancel-safety)). Dropped at
    /// any await, it ends the active members and removes the group's state
    /// as if awaited.
    ///
    /// # Errors
    /// Storage errors; what was removed before the error stays removed, and
    /// a later `forget` removes the rest. [`Error::RuntimeShutdown`].
    pub async fn forget(&self) -> Result<()> {
        let group = self.clone();
        detached(async move { group.core.forget_group(&group.id).await }).await
    }
}

#[cfg(test)]
mod tests {
    use futures_util::TryStreamExt;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::RunOutcome;
    use crate::model::{StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;
    use crate::store::durable::{self, DurableTermination};
    use crate::store::durable::{DurableRunOutcome, DurableRunResult};
    use crate::store::keys::sha256;
    use crate::store::memo::RUN_RESULT_MEMO_KEY;
    use taquba::Queue;

    struct Echo;

    impl StepRunner for Echo {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            Ok(StepOutcome::Succeed {
                result: step.payload.clone(),
            })
        }
    }

    fn gm(key: &str, input: &[u8]) -> GroupMember {
        GroupMember {
            key: key.into(),
            input: input.to_vec(),
        }
    }

    /// Hashes an input by its bytes with ASCII case folded: "equal" inputs
    /// that are not the same bytes, as a job group's canonical hash has.
    fn folded(input: &[u8]) -> Result<Vec<u8>> {
        Ok(sha256(&input.to_ascii_lowercase()).to_vec())
    }

    fn folded_member(key: &str, input: &[u8]) -> HashedMember {
        HashedMember {
            member: gm(key, input),
            input_hash: folded(input).expect("hash"),
        }
    }

    /// A set matches the stored manifest when its keys are the same in the
    /// same order and each input is the same bytes or hashes alike; the
    /// stored inputs are what is submitted, with the new hashes.
    #[test]
    fn a_set_is_the_stored_one_by_keys_in_order_and_inputs_or_their_hashes() {
        let stored = vec![gm("a", b"Alpha"), gm("b", b"beta")];
        let same = same_set(
            stored.clone(),
            vec![folded_member("a", b"ALPHA"), folded_member("b", b"beta")],
            folded,
        )
        .expect("the same set");
        assert_eq!(same[0].member, gm("a", b"Alpha"), "the stored input");
        assert_eq!(same[0].input_hash, folded(b"alpha").expect("hash"));

        let raw = |k: &str, i: &[u8]| HashedMember::raw(gm(k, i));
        for other in [
            vec![raw("a", b"Alpha")],
            vec![raw("b", b"beta"), raw("a", b"Alpha")],
            vec![raw("a", b"Alpha"), raw("c", b"beta")],
            vec![raw("a", b"ALPHA"), raw("b", b"beta")],
        ] {
            assert!(
                same_set(stored.clone(), other, raw_input_hash).is_none(),
                "raw inputs compare as bytes"
            );
        }
        // A stored input that does not hash (a job that no longer decodes)
        // matches only the same bytes.
        fn undecodable(_: &[u8]) -> Result<Vec<u8>> {
            Err(Error::EffectsSealed)
        }
        assert!(
            same_set(
                stored.clone(),
                vec![folded_member("a", b"ALPHA"), folded_member("b", b"beta")],
                undecodable
            )
            .is_none()
        );
        assert!(
            same_set(
                stored,
                vec![folded_member("a", b"Alpha"), folded_member("b", b"beta")],
                undecodable
            )
            .is_some()
        );
    }

    /// A run result record is the member's only when its whole terminal
    /// record matches the member's, the input hash included: one written
    /// by another run that ended the same way in the same millisecond
    /// (the same status, step and time) is not reported as the member's.
    #[tokio::test(start_paused = true)]
    async fn a_result_record_with_another_input_hash_is_not_the_members() {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runtime = WorkflowRuntime::builder(queue, store, Echo, NoopTerminalHook).build();
        let worker = runtime.spawn(std::future::pending::<()>());
        let group = runtime.group(RunId::new("g").expect("id"));
        let member = GroupMember {
            key: "a".into(),
            input: b"own".to_vec(),
        };
        group
            .submit(vec![member], &RunOptions::default())
            .await
            .expect("submit");
        let results: Vec<MemberResult> = group
            .results()
            .await
            .expect("results")
            .try_collect()
            .await
            .expect("results");
        assert_eq!(
            results[0]
                .outcome
                .as_ref()
                .and_then(|o| o.result.as_deref()),
            Some(&b"own"[..])
        );
        let core = &runtime.inner.core;
        let record = core
            .group_store
            .member(group.id(), "a")
            .await
            .expect("read")
            .expect("the member record");
        let terminated = record.terminated.clone().expect("terminated");
        // While this process keeps the member's end (it committed it), the
        // member's outcome is what that commit reported, whatever the store
        // holds now.
        let kept = results[0].outcome.clone();
        let forged_elsewhere = DurableTermination {
            input_hash: sha256(b"another input").to_vec(),
            ..terminated.clone()
        };
        let mut outcome: RunOutcome = kept.clone().expect("outcome");
        outcome.result = Some(b"forged".to_vec());
        core.memo_store
            .new_run_memo(&record.run_id)
            .put_reserved(
                RUN_RESULT_MEMO_KEY,
                &durable::encode(&DurableRunResult {
                    termination: forged_elsewhere,
                    outcome: DurableRunOutcome::from(&outcome),
                }),
            )
            .await
            .expect("write");
        let answered = group
            .member_result("a".into(), record.clone())
            .await
            .expect("member result")
            .outcome;
        assert_eq!(answered, kept);
        // From the store alone (a process that did not commit the end):
        // the result record must match the member's whole termination.
        let forge = |termination: DurableTermination| async {
            crate::run::recent_ends::forget_everywhere(&record.run_id);
            let mut outcome: RunOutcome = results[0].outcome.clone().expect("outcome");
            outcome.result = Some(b"forged".to_vec());
            let forged = DurableRunResult {
                termination,
                outcome: DurableRunOutcome::from(&outcome),
            };
            core.memo_store
                .new_run_memo(&record.run_id)
                .put_reserved(RUN_RESULT_MEMO_KEY, &durable::encode(&forged))
                .await
                .expect("write");
            group
                .member_result("a".into(), record.clone())
                .await
                .expect("member result")
                .outcome
        };
        let other_input = DurableTermination {
            input_hash: sha256(b"another input").to_vec(),
            ..terminated.clone()
        };
        assert!(forge(other_input).await.is_none());
        let plain_run = DurableTermination {
            member: None,
            ..terminated.clone()
        };
        assert!(forge(plain_run).await.is_none());
        // The check is on the record itself: the member's own termination
        // matches.
        assert!(forge(terminated).await.is_some());
        worker.shutdown().await.expect("shutdown");
    }
}
