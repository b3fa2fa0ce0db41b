//! Run groups: a durable set of runs of one runtime named by a group id.
//! The membership is a manifest object under the memo prefix; each member's
//! state is a record in the queue's KV namespace, written with the member's
//! submission and rewritten by the settlement that terminates it.
//! [`jobs::JobGroup`](crate::jobs::JobGroup) is the typed presentation.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures_util::stream::{self, Stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;
use taquba::{ExpiryIndex, Queue, QueueView, SettlementEffects};
use tracing::warn;

use crate::coordination::group_submit::{self, HashedMember, SUBMIT_CONCURRENCY, StoredInputHash};
use crate::error::{Error, Result};
use crate::model::{RunOptions, RunTermination};
use crate::model::{RunOutcome, TerminalStatus};
use crate::run::commit::{Committer, detached};
use crate::run::core::RuntimeCore;
use crate::settled::try_join_settled;
use crate::store::blob::ObjectPrefix;
use crate::store::durable::{
    self, DurableClaimedMember, DurableGroupClaim, DurableMember, DurableMembership,
    DurableTermination,
};
use crate::store::keys::{
    DIGESTED_MEMBER_KEY, HEADER_GROUP, HEADER_GROUP_KEY, MAX_MEMBER_KEY_LEN, RunId,
    group_manifest_claim_kv_key, group_member_kv_key, group_members_kv_prefix,
    member_key_is_digested, sha256,
};
use crate::store::memo::MemoStore;

/// Members a results stream waits on at once. Already terminated members
/// are yielded as soon as they enter the window, so memory stays bounded
/// for any group size.
const RESULTS_WINDOW: usize = 256;
/// Records read per page and deleted per transaction.
const PAGE: usize = 1000;

/// The run id of member `key` of `group_id`: the hex SHA-256 of
/// `{group_id}/{key}` (0.13's derivation), so keys may hold any text and
/// groups never share runs. Every run of the member has it: a member run
/// again after it failed or was cancelled keeps its id and starts clean
/// through `group_submit` (its memo entries are cleared before the re-run
/// commits; its replay records and history carry the run's execution).
pub(crate) fn member_run_id(group_id: &RunId, key: &str) -> RunId {
    RunId::digest(&[group_id.as_bytes(), b"/", key.as_bytes()])
}

/// A run's membership of a group, carried on every step job in the
/// reserved group headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Membership {
    pub(crate) group_id: RunId,
    pub(crate) key: String,
}

impl Membership {
    pub(crate) fn from_headers(headers: &HashMap<String, String>) -> Result<Option<Self>> {
        let (Some(group_id), Some(key)) =
            (headers.get(HEADER_GROUP), headers.get(HEADER_GROUP_KEY))
        else {
            return Ok(None);
        };
        Ok(Some(Self {
            group_id: RunId::new(group_id.as_str())?,
            key: key.clone(),
        }))
    }

    pub(crate) fn reserved_headers(&self) -> Vec<(&'static str, String)> {
        vec![
            (HEADER_GROUP, self.group_id.to_string()),
            (HEADER_GROUP_KEY, self.key.clone()),
        ]
    }

    pub(crate) fn kv_key(&self) -> Vec<u8> {
        group_member_kv_key(&self.group_id, &self.key)
    }

    /// The run id of every run of this member.
    pub(crate) fn run_id(&self) -> RunId {
        member_run_id(&self.group_id, &self.key)
    }

    /// The membership as a terminal record keeps it.
    pub(crate) fn durable(&self) -> DurableMembership {
        DurableMembership {
            group_id: self.group_id.clone(),
            key: self.key.clone(),
        }
    }
}

/// One member of a [`RunGroup`]: a key unique in the group and the input of
/// its run's step 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// The member's key (any text).
    pub key: String,
    /// The member run's input.
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
}

/// The members of a group in submission order, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub(crate) group_id: RunId,
    pub(crate) members: Vec<GroupMember>,
}

/// A [`Manifest`] to encode, borrowing its members (the same bytes).
#[derive(Serialize)]
struct ManifestRef<'a> {
    group_id: &'a RunId,
    members: Vec<&'a GroupMember>,
}

/// `new` as the members of a group whose manifest holds `stored`: the
/// stored members (the inputs the group's runs are submitted with) with
/// `new`'s hashes, when both name the same keys in the same order with the
/// same inputs (equal bytes, or a stored input that `stored_hash` hashes as
/// the new one is hashed); `None` for another set.
fn same_set(
    stored: Vec<GroupMember>,
    new: Vec<HashedMember>,
    stored_hash: StoredInputHash,
) -> Option<Vec<HashedMember>> {
    if stored.len() != new.len() {
        return None;
    }
    stored
        .into_iter()
        .zip(new)
        .map(|(stored, new)| {
            let same = stored.key == new.member.key
                && (stored.input == new.member.input
                    || stored_hash(&stored.input).is_ok_and(|hash| hash == new.input_hash));
            same.then_some(HashedMember {
                member: stored,
                input_hash: new.input_hash,
            })
        })
        .collect()
}

/// Member counts of a group, from its manifest and member records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group_id: RunId,
    /// Members in the manifest.
    pub total: usize,
    /// Members submitted and not terminated.
    pub pending: usize,
    /// Members whose last termination is a success.
    pub succeeded: usize,
    /// Members whose last termination is a failure.
    pub failed: usize,
    /// Members whose last termination is a cancellation.
    pub cancelled: usize,
}

/// A terminated member, as [`RunGroup::results`] yields it.
#[derive(Debug, Clone)]
pub struct MemberResult {
    /// The member's key.
    pub key: String,
    /// The member's run id: the hex SHA-256 of `{group_id}/{key}`, the
    /// same for every run of the member (a re-run keeps it; see
    /// [`RunGroup::submit`]).
    pub run_id: RunId,
    /// Its last termination.
    pub termination: RunTermination,
    /// Its committed outcome, when a worker recorded one.
    pub outcome: Option<RunOutcome>,
}

/// A member record with its key.
pub(crate) struct MemberState {
    pub(crate) key: String,
    pub(crate) record: DurableMember,
}

impl MemberState {
    pub(crate) fn status(&self) -> Option<TerminalStatus> {
        self.record.terminated.as_ref().map(|t| t.status.into())
    }
}

/// Every member record of `group_id` in key order, read through `view` (a
/// writer's or a reader's); an undecodable record is skipped.
pub(crate) async fn members_in(view: &QueueView, group_id: &RunId) -> Result<Vec<MemberState>> {
    let prefix = group_members_kv_prefix(group_id);
    let mut entries = std::pin::pin!(view.kv_entries(&prefix, .., PAGE));
    let mut members = Vec::new();
    while let Some((kv_key, value)) = entries.try_next().await? {
        let suffix = &kv_key[prefix.len()..];
        let whose = format!("{group_id}/{}", String::from_utf8_lossy(suffix));
        let Some(record) =
            durable::decode_or_absent::<DurableMember>(&value, "group member record", &whose)
        else {
            continue;
        };
        let key = match (suffix.first(), &record.key) {
            (Some(&DIGESTED_MEMBER_KEY), Some(key)) => key.clone(),
            (Some(&DIGESTED_MEMBER_KEY), None) => {
                warn!(group_id = %group_id, "digested member record without its key; skipped");
                continue;
            }
            _ => String::from_utf8_lossy(suffix).into_owned(),
        };
        members.push(MemberState { key, record });
    }
    Ok(members)
}

/// The path of `group_id`'s manifest under the memo prefix `objects`.
pub(crate) fn manifest_path(objects: &ObjectPrefix, group_id: &RunId) -> Path {
    objects.path(&["groups", group_id, "manifest"])
}

/// The counts of a group of `total` manifest members from its member
/// records.
pub(crate) fn group_status(group_id: &RunId, total: usize, members: &[MemberState]) -> GroupStatus {
    let mut status = GroupStatus {
        group_id: group_id.clone(),
        total,
        pending: 0,
        succeeded: 0,
        failed: 0,
        cancelled: 0,
    };
    for member in members {
        match member.status() {
            None => status.pending += 1,
            Some(TerminalStatus::Succeeded) => status.succeeded += 1,
            Some(TerminalStatus::Failed) => status.failed += 1,
            Some(TerminalStatus::Cancelled) => status.cancelled += 1,
        }
    }
    status
}

/// The durable state of groups: manifests at
/// `{memo_prefix}/groups/{group_id}/manifest`, member records under
/// `workflow/groups/{group_id}/`, the submission counter at
/// `workflow/group-submissions/{group_id}`.
#[derive(Clone)]
pub(crate) struct GroupStore {
    objects: ObjectPrefix,
    memo_store: MemoStore,
    queue: Arc<Queue>,
    commits: Committer,
    terminals: ExpiryIndex,
}

impl GroupStore {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        prefix: impl Into<String>,
        memo_store: MemoStore,
        commits: Committer,
        terminals: ExpiryIndex,
    ) -> Self {
        Self {
            objects: ObjectPrefix::new(store, prefix),
            memo_store,
            queue: commits.queue().clone(),
            commits,
            terminals,
        }
    }

    fn manifest_path(&self, group_id: &RunId) -> Path {
        manifest_path(&self.objects, group_id)
    }

    pub(crate) async fn read_manifest(&self, group_id: &RunId) -> Result<Option<Manifest>> {
        match self.objects.get(&self.manifest_path(group_id)).await? {
            Some(bytes) => durable::decode(&bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Write the manifest of a group that has none, after claiming the
    /// group for its member set: of concurrent first submissions, only
    /// those of the set that claimed the group first write the manifest
    /// (the same one, but for the order a job's maps iterate in). A claim
    /// is the SHA-256 of the set's [`DurableGroupClaim`]; one written as
    /// the SHA-256 of the stored manifest (before claims were canonical)
    /// accepts the set whose manifest encodes to the same bytes.
    ///
    /// # Errors
    /// [`Error::GroupMismatch`] when the group is claimed for another set;
    /// storage errors.
    async fn claim_and_write_manifest(
        &self,
        group_id: &RunId,
        members: &[HashedMember],
    ) -> Result<()> {
        let encoded = durable::encode(&ManifestRef {
            group_id,
            members: members.iter().map(|m| &m.member).collect(),
        });
        let digest = sha256(&durable::encode(&DurableGroupClaim {
            group_id,
            members: members
                .iter()
                .map(|m| DurableClaimedMember {
                    key: &m.member.key,
                    input_hash: &m.input_hash,
                })
                .collect(),
        }))
        .to_vec();
        let key = group_manifest_claim_kv_key(group_id);
        let claim = SettlementEffects::default().kv_put(key.clone(), digest.clone());
        if self
            .commits
            .compare_commit(&key, None, claim)
            .await?
            .is_none()
        {
            // Claimed already: by this set (a concurrent or crashed first
            // submission of it, which writes the same manifest) or not.
            let claimed = self.queue.view().kv_get(&key).await?;
            let legacy = sha256(&encoded);
            if claimed.as_deref() != Some(digest.as_slice())
                && claimed.as_deref() != Some(legacy.as_slice())
            {
                return Err(Error::GroupMismatch(group_id.clone()));
            }
        }
        self.objects
            .put(&self.manifest_path(group_id), &encoded)
            .await
    }

    pub(crate) async fn member(
        &self,
        group_id: &RunId,
        key: &str,
    ) -> Result<Option<DurableMember>> {
        durable::kv_record(self.queue.view(), &group_member_kv_key(group_id, key)).await
    }

    /// Every member record of `group_id` in key order; an undecodable record
    /// is skipped.
    pub(crate) async fn members(&self, group_id: &RunId) -> Result<Vec<MemberState>> {
        members_in(self.queue.view(), group_id).await
    }

    /// Delete the manifest of `group_id` (the last step of its removal).
    pub(crate) async fn delete_manifest(&self, group_id: &RunId) -> Result<()> {
        self.objects.delete(&self.manifest_path(group_id)).await
    }

    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    pub(crate) fn memo_store(&self) -> &MemoStore {
        &self.memo_store
    }

    pub(crate) fn commits(&self) -> &Committer {
        &self.commits
    }

    /// The index of run terminal markers (memo retention), whose entries of
    /// member runs a removal deletes.
    pub(crate) fn terminals(&self) -> &ExpiryIndex {
        &self.terminals
    }
}

/// A durable group of runs of one runtime, from
/// [`WorkflowRuntime::group`](crate::WorkflowRuntime::group) or
/// [`WorkflowRuntime::new_group`](crate::WorkflowRuntime::new_group). Cheap
/// to clone.
///
/// Members are keyed; a member's run id derives from the group id and its
/// key (hex SHA-256 of `{group_id}/{key}`, as in 0.13), the same for every
/// run of the member, and belongs to the group: a plain submission
/// under it is refused ([`Error::GroupMemberRunId`]), so the group always
/// reports its member's own run. The manifest is durable, so
/// [`results`](Self::results), [`status`](Self::status),
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
    /// Cancel safety: the whole submission runs on a task of its own.
    /// Dropped at any await, it either wrote nothing (the group is not
    /// found) or submits every member as if awaited.
    ///
    /// # Errors
    /// [`Error::DuplicateMemberKey`] for two members with one key;
    /// [`Error::MemberKeyTooLong`] for a key over
    /// [`MAX_MEMBER_KEY_LEN`](crate::MAX_MEMBER_KEY_LEN) bytes;
    /// [`Error::GroupMismatch`] for a member set that differs from the
    /// manifest; [`Error::MemberRunIdTaken`] for a member whose run id an
    /// active run outside the group holds; errors of
    /// [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit).
    pub async fn submit(&self, members: Vec<GroupMember>, options: &RunOptions) -> Result<()> {
        let members = members.into_iter().map(HashedMember::raw).collect();
        self.submit_hashed(members, options, group_submit::raw_input_hash)
            .await
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
    /// Cancel safety: as [`submit`](Self::submit), the whole call runs on a
    /// task of its own and completes when dropped.
    ///
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; submission
    /// errors.
    pub async fn resume(&self, options: &RunOptions) -> Result<()> {
        self.resume_hashed(options, group_submit::raw_input_hash)
            .await
    }

    /// [`resume`](Self::resume) hashing the manifest's inputs with
    /// `stored_hash`, on a task of its own.
    pub(crate) async fn resume_hashed(
        &self,
        options: &RunOptions,
        stored_hash: StoredInputHash,
    ) -> Result<()> {
        let (group, options) = (self.clone(), options.clone());
        let span = crate::telemetry::spans::submit_group(&self.core.queue_name, &self.id);
        detached(crate::telemetry::spans::within(span, async move {
            let _lock = group.core.group_locks.lock(&group.id).await;
            let members = group
                .manifest()
                .await?
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
    /// Cancel safety: reads and waits; the retention marker and any
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
            .view
            .run_result_of(&record.run_id, &terminated)
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
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; storage errors.
    pub async fn status(&self) -> Result<GroupStatus> {
        let manifest = self.manifest().await?;
        let members = self.members().await?;
        Ok(group_status(&self.id, manifest.members.len(), &members))
    }

    /// Cancel every active member as
    /// [`WorkflowRuntime::cancel`](crate::WorkflowRuntime::cancel) does;
    /// returns how many of those cancellations answered `true` (the
    /// requests this call recorded that end their member `Cancelled`).
    ///
    /// Cancel safety: the whole call runs on a task of its own. Dropped at
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
    /// Cancel safety: the whole call runs on a task of its own. Dropped at
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

/// Refuse a member key over [`MAX_MEMBER_KEY_LEN`].
fn check_member_key(key: &str) -> Result<()> {
    if key.len() <= MAX_MEMBER_KEY_LEN {
        return Ok(());
    }
    let mut end = 64.min(key.len());
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    Err(Error::MemberKeyTooLong {
        len: key.len(),
        max: MAX_MEMBER_KEY_LEN,
        start: key[..end].to_string(),
    })
}

/// The member record written with the submission of the member's run
/// `run_id`.
pub(crate) fn pending_member(membership: &Membership, run_id: &RunId) -> DurableMember {
    member_record(membership, run_id, None)
}

/// The member record written by the settlement terminating the member's run
/// `run_id`.
pub(crate) fn terminated_member(
    membership: &Membership,
    run_id: &RunId,
    termination: DurableTermination,
) -> DurableMember {
    member_record(membership, run_id, Some(termination))
}

fn member_record(
    membership: &Membership,
    run_id: &RunId,
    terminated: Option<DurableTermination>,
) -> DurableMember {
    DurableMember {
        run_id: run_id.clone(),
        terminated,
        key: member_key_is_digested(&membership.key).then(|| membership.key.clone()),
        version: Some(ulid::Ulid::new().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use futures_util::TryStreamExt;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;
    use crate::store::durable::{DurableRunOutcome, DurableRunResult};
    use crate::store::memo::RUN_RESULT_MEMO_KEY;

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
                same_set(stored.clone(), other, group_submit::raw_input_hash).is_none(),
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
        let forge = |termination: DurableTermination| async {
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
