//! The durable state of run groups, outside the engine: a member's run id
//! and membership, the manifest of members ([`GroupStore`], under the memo
//! prefix) and each member's record (in the queue's KV namespace, written
//! with the member's submission and rewritten by the settlement that
//! terminates it), and the counts read from them. [`RunGroup`](crate::RunGroup)(crate::RunGroup)
//! (in `coordination::group`) is the public face; the engine submits and
//! removes members through these types.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::stream::TryStreamExt;
use serde::{Deserialize, Serialize};
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;
use taquba::{ExpiryIndex, Queue, QueueView, SettlementEffects};
use tracing::warn;

use crate::error::{Error, Result};
use crate::model::RunTermination;
use crate::model::{RunOutcome, TerminalStatus};
use crate::run::commit::Committer;
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
            group_id: RunId::parse_ref(group_id)?,
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

/// One member of a [`RunGroup`](crate::RunGroup): a key unique in the group and the input of
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
pub(crate) fn same_set(
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

/// A terminated member, as [`RunGroup::results`](crate::RunGroup::results) yields it.
#[derive(Debug, Clone)]
pub struct MemberResult {
    /// The member's key.
    pub key: String,
    /// The member's run id: the hex SHA-256 of `{group_id}/{key}`, the
    /// same for every run of the member (a re-run keeps it; see
    /// [`RunGroup::submit`](crate::RunGroup::submit)).
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
    pub(crate) async fn claim_and_write_manifest(
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

/// Refuse a member key over [`MAX_MEMBER_KEY_LEN`].
pub(crate) fn check_member_key(key: &str) -> Result<()> {
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

/// A group member with the hash its input is recorded and compared under:
/// the SHA-256 of the input for a run group's member, that of the job's
/// canonical encoding for a job group's (so equal jobs whose maps iterate
/// in other orders are one input).
#[derive(Debug, Clone)]
pub(crate) struct HashedMember {
    pub(crate) member: GroupMember,
    pub(crate) input_hash: Vec<u8>,
}

impl HashedMember {
    /// A run group's member: hashed as bytes.
    pub(crate) fn raw(member: GroupMember) -> Self {
        Self {
            input_hash: sha256(&member.input).to_vec(),
            member,
        }
    }

    /// Whether a run recorded with `recorded` (an input hash) has this
    /// member's input: its hash, or the SHA-256 of its bytes, under which a
    /// job group's members were recorded before their hash was canonical.
    pub(crate) fn is_input(&self, recorded: &[u8]) -> bool {
        recorded == self.input_hash.as_slice() || recorded == sha256(&self.member.input)
    }
}

/// How the stored input of a group's manifest member is hashed, as
/// [`HashedMember::input_hash`] is.
pub(crate) type StoredInputHash = fn(&[u8]) -> Result<Vec<u8>>;

/// The attempt limit the stored input of a group's manifest member carries
/// (a job's own), if any.
pub(crate) type StoredAttempts = fn(&[u8]) -> Result<Option<u32>>;

/// [`StoredInputHash`] of a run group: the SHA-256 of the bytes.
pub(crate) fn raw_input_hash(input: &[u8]) -> Result<Vec<u8>> {
    Ok(sha256(input).to_vec())
}

/// A value the submission counter never held before (a new ULID): every
/// member submission writes one, so a compare against a value read earlier
/// fails after any submission in between.
pub(crate) fn new_counter_value() -> Vec<u8> {
    ulid::Ulid::new().to_bytes().to_vec()
}
