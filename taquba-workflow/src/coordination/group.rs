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
use taquba::{Queue, QueueView, SettlementEffects};
use tracing::warn;

use crate::coordination::group_submit::{self, SUBMIT_CONCURRENCY};
use crate::error::{Error, Result};
use crate::model::{RunOptions, RunTermination};
use crate::model::{RunOutcome, TerminalStatus};
use crate::run::core::RuntimeCore;
use crate::store::blob::ObjectPrefix;
use crate::store::durable::{self, DurableMember, DurableTermination};
use crate::store::keys::{
    DIGESTED_MEMBER_KEY, HEADER_GROUP, HEADER_GROUP_KEY, RunId, group_manifest_claim_kv_key,
    group_member_kv_key, group_members_kv_prefix, group_submissions_kv_key, member_key_is_digested,
    outcome_kv_key, sha256,
};
use crate::store::memo::MemoStore;

/// Members a results stream waits on at once. Already terminated members
/// are yielded as soon as they enter the window, so memory stays bounded
/// for any group size.
const RESULTS_WINDOW: usize = 256;
/// Records read per page and deleted per transaction.
const PAGE: usize = 1000;

/// The run id of member `key` of `group_id`: hex SHA-256 of
/// `{group_id}/{key}`, so keys may hold any text and groups never share
/// runs.
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

    pub(crate) fn run_id(&self) -> RunId {
        member_run_id(&self.group_id, &self.key)
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
    /// The member's run.
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
}

impl GroupStore {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        prefix: impl Into<String>,
        memo_store: MemoStore,
        queue: Arc<Queue>,
    ) -> Self {
        Self {
            objects: ObjectPrefix::new(store, prefix),
            memo_store,
            queue,
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
    /// those of the set that claimed the group first write (the same)
    /// manifest.
    ///
    /// # Errors
    /// [`Error::GroupMismatch`] when the group is claimed for another set;
    /// storage errors.
    async fn claim_and_write_manifest(&self, manifest: &Manifest) -> Result<()> {
        let encoded = durable::encode(manifest);
        let digest = sha256(&encoded).to_vec();
        let key = group_manifest_claim_kv_key(&manifest.group_id);
        let claim = SettlementEffects::default().kv_put(key.clone(), digest.clone());
        if self
            .queue
            .kv_compare_commit(&key, None, claim)
            .await?
            .is_none()
        {
            // Claimed already: by this set (a concurrent or crashed first
            // submission of it, which writes the same manifest) or not.
            let claimed = self.queue.view().kv_get(&key).await?;
            if claimed.as_deref() != Some(digest.as_slice()) {
                return Err(Error::GroupMismatch(manifest.group_id.clone()));
            }
        }
        self.objects
            .put(&self.manifest_path(&manifest.group_id), &encoded)
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

    /// Remove a group's state: the memo entries, terminal records and
    /// history records of its manifest's members, its member records and
    /// its manifest.
    pub(crate) async fn forget(&self, group_id: &RunId) -> Result<()> {
        let mut keys = Vec::new();
        if let Some(manifest) = self.read_manifest(group_id).await? {
            let run_ids: Vec<RunId> = manifest
                .members
                .iter()
                .map(|m| member_run_id(group_id, &m.key))
                .collect();
            let memos = &self.memo_store;
            stream::iter(run_ids.clone())
                .map(|run_id| async move { memos.clear_memos_for_run(&run_id).await })
                .buffer_unordered(SUBMIT_CONCURRENCY)
                .try_collect::<Vec<usize>>()
                .await?;
            for run_id in &run_ids {
                keys.push(outcome_kv_key(run_id));
                keys.extend(crate::history::read::history_keys(self.queue.view(), run_id).await?);
                if keys.len() >= PAGE {
                    self.delete_keys(std::mem::take(&mut keys)).await?;
                }
            }
        }
        let prefix = group_members_kv_prefix(group_id);
        let member_keys: Vec<Vec<u8>> = {
            let view = self.queue.view();
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
        self.objects.delete(&self.manifest_path(group_id)).await
    }

    async fn delete_keys(&self, keys: Vec<Vec<u8>>) -> Result<()> {
        self.queue
            .commit_effects(SettlementEffects::default().kv_deletes(keys))
            .await?;
        Ok(())
    }
}

/// A durable group of runs of one runtime, from
/// [`WorkflowRuntime::group`](crate::WorkflowRuntime::group) or
/// [`WorkflowRuntime::new_group`](crate::WorkflowRuntime::new_group). Cheap
/// to clone.
///
/// Members are keyed; a member's run id derives from the group id and its
/// key. The manifest is durable, so [`results`](Self::results),
/// [`status`](Self::status), [`cancel`](Self::cancel) and
/// [`forget`](Self::forget) work after a restart. A second
/// [`submit`](Self::submit) of the same set (or [`resume`](Self::resume))
/// runs again only the members that did not succeed.
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
    /// again every member
    /// whose last termination is not a success (members still active are
    /// left running). Members are committed up to 256 per transaction, in
    /// order, so a group of any size submits in bounded memory; a failure
    /// returns after the members committed so far, and a re-submission
    /// completes the rest.
    ///
    /// # Errors
    /// [`Error::DuplicateMemberKey`] for two members with one key;
    /// [`Error::GroupMismatch`] for a member set that differs from the
    /// manifest; errors of [`WorkflowRuntime::submit`](crate::WorkflowRuntime::submit).
    pub async fn submit(&self, members: Vec<GroupMember>, options: &RunOptions) -> Result<()> {
        let mut seen = HashSet::with_capacity(members.len());
        for member in &members {
            if !seen.insert(member.key.as_str()) {
                return Err(Error::DuplicateMemberKey(member.key.clone()));
            }
        }
        drop(seen);
        let manifest = Manifest {
            group_id: self.id.clone(),
            members,
        };
        match self.store().read_manifest(&self.id).await? {
            Some(existing) if existing.members != manifest.members => {
                return Err(Error::GroupMismatch(self.id.clone()));
            }
            Some(_) => {}
            None => self.store().claim_and_write_manifest(&manifest).await?,
        }
        self.submit_members(manifest.members, options).await
    }

    /// Submit the manifest's members whose last termination is not a
    /// success, as a re-[`submit`](Self::submit) would.
    ///
    /// # Errors
    /// [`Error::GroupNotFound`] for a group never submitted; submission
    /// errors.
    pub async fn resume(&self, options: &RunOptions) -> Result<()> {
        let manifest = self.manifest().await?;
        self.submit_members(manifest.members, options).await
    }

    async fn submit_members(&self, members: Vec<GroupMember>, options: &RunOptions) -> Result<()> {
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
        let termination: RunTermination = record
            .terminated
            .ok_or_else(|| Error::InconsistentRunState(record.run_id.clone()))?
            .into();
        let outcome = self
            .core
            .view
            .run_result_of(&record.run_id, &termination)
            .await?
            .map(|result| result.outcome);
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
    /// returns how many requests were recorded.
    ///
    /// # Errors
    /// Storage errors.
    pub async fn cancel(&self) -> Result<usize> {
        let active: Vec<RunId> = self
            .members()
            .await?
            .into_iter()
            .filter(|m| m.status().is_none())
            .map(|m| m.record.run_id)
            .collect();
        let core = &self.core;
        let recorded: Vec<bool> = stream::iter(active)
            .map(|run_id| async move { core.cancel(&run_id).await })
            .buffer_unordered(SUBMIT_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(recorded.into_iter().filter(|r| *r).count())
    }

    /// Remove the group's state: manifest, member records, and its members'
    /// memo entries, run result records and terminal records. A later
    /// [`submit`](Self::submit) under the id starts afresh. Members still
    /// running are not cancelled (call [`cancel`](Self::cancel) first): each
    /// writes its member record when it ends, and a later `submit` takes a
    /// member still running back into the group without starting it again.
    ///
    /// # Errors
    /// Storage errors; what was removed before the error stays removed.
    pub async fn forget(&self) -> Result<()> {
        self.store().forget(&self.id).await
    }
}

/// The member record written with a member's submission.
pub(crate) fn pending_member(membership: &Membership) -> DurableMember {
    member_record(membership, None)
}

/// The member record written by the settlement terminating a member.
pub(crate) fn terminated_member(
    membership: &Membership,
    termination: DurableTermination,
) -> DurableMember {
    member_record(membership, Some(termination))
}

fn member_record(membership: &Membership, terminated: Option<DurableTermination>) -> DurableMember {
    DurableMember {
        run_id: membership.run_id(),
        terminated,
        key: member_key_is_digested(&membership.key).then(|| membership.key.clone()),
        version: Some(ulid::Ulid::new().to_string()),
    }
}
