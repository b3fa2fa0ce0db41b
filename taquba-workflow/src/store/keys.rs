//! Identity and layout: [`RunId`], the reserved header names and every KV
//! key and object path the runtime writes. Nothing outside this module
//! spells a key.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Header naming the run a step job belongs to. Set by the runtime on every
/// step job.
pub const HEADER_RUN_ID: &str = "workflow.run_id";
/// Header holding a step job's step number (decimal `u32`). Set by the
/// runtime on every step job.
pub const HEADER_STEP: &str = "workflow.step";
/// Header marking a terminal-notification job: the job's payload is the
/// committed [`RunOutcome`](crate::RunOutcome) and the worker runs the
/// [`TerminalHook`](crate::TerminalHook) for it.
pub const HEADER_TERMINAL: &str = "workflow.terminal";
/// Header on a step that waits for a durable signal; its value is the
/// correlation key.
pub const HEADER_SIGNAL_WAIT: &str = "workflow.signal_wait";
/// Header on a step that was enqueued with a buffered signal already
/// consumed for it; its value is the correlation key.
pub const HEADER_SIGNAL_DELIVERED: &str = "workflow.signal_delivered";
/// Header on a step job an operator requeued (a dead-lettered step enqueued
/// again); its value is the requeue count.
pub(crate) const HEADER_REQUEUED: &str = "workflow.requeued";
/// Header holding the group id of a group member's step job.
pub(crate) const HEADER_GROUP: &str = "workflow.group";
/// Header holding the member key of a group member's step job.
pub(crate) const HEADER_GROUP_KEY: &str = "workflow.group_key";
/// Header holding the idempotency key of a keyed job's step job (cut to
/// 256 bytes), so the runtime's own errors can name the job by its key.
pub(crate) const HEADER_JOB_KEY: &str = "workflow.job_key";
/// Header holding the W3C `traceparent` of the trace context current when
/// the run was submitted, carried to every step job of the run (feature
/// `opentelemetry`; absent when no trace context was current).
pub const HEADER_TRACEPARENT: &str = "workflow.traceparent";
/// Header holding the W3C `tracestate` beside [`HEADER_TRACEPARENT`], when
/// the trace context had one.
pub const HEADER_TRACESTATE: &str = "workflow.tracestate";
/// Prefix of every header the runtime reserves; submissions carrying a user
/// header with this prefix are rejected with
/// [`Error::ReservedHeaderInSubmit`].
pub const RESERVED_HEADER_PREFIX: &str = "workflow.";
/// Prefix of the queue's caller KV namespace the runtime reserves for its
/// own records; staging an application effect under it fails with
/// [`Error::ReservedKvKey`].
pub const RESERVED_KV_PREFIX: &str = "workflow/";
/// The longest accepted run id, in bytes.
pub const MAX_RUN_ID_LEN: usize = 128;
/// The longest signal correlation key, in bytes. The key is part of the
/// KV keys of the signal's waiter and buffer records (which the store
/// caps at 64 KiB) and of the waiting step's header; a longer key is
/// refused with [`Error::InvalidCorrelationKey`](crate::Error::InvalidCorrelationKey)
/// by `signal`, `signal_run` and `clear_signal`, and a step continuing on
/// one fails its run permanently with that error.
pub const MAX_CORRELATION_KEY_LEN: usize = 4096;

/// The identity of a run: 1 to [`MAX_RUN_ID_LEN`] bytes of
/// `[A-Za-z0-9_-]`, so it is safe in object paths, KV keys and log lines.
///
/// Built with [`RunId::new`] (validating) or parsed with [`str::parse`].
/// When a [`RunSpec`](crate::RunSpec) carries no id the runtime generates a
/// ULID on its clock, monotonic within a millisecond (generated ids sort in
/// the order they were made). Dereferences to `str`.
///
/// Cloning one is a reference count increment: the id is shared, not
/// copied, between the records, caches and handles of a run.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(Arc<str>);

impl RunId {
    /// Validate `id` as a run id.
    ///
    /// # Errors
    /// [`Error::InvalidRunId`] naming the id and the rule it breaks: empty,
    /// longer than [`MAX_RUN_ID_LEN`] bytes, or containing a byte outside
    /// `[A-Za-z0-9_-]`.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        match Self::broken_rule(&id) {
            Some(reason) => Err(Error::InvalidRunId { run_id: id, reason }),
            None => Ok(Self(id.into())),
        }
    }

    /// [`Self::new`] over a borrowed id: one allocation (the shared id)
    /// instead of an owned copy first. For ids read back from a header, a
    /// key or a record as `&str` (a step's headers, serde, [`FromStr`]);
    /// an owned `String` goes to [`Self::new`].
    ///
    /// # Errors
    /// As [`Self::new`].
    pub(crate) fn parse_ref(id: &str) -> Result<Self> {
        match Self::broken_rule(id) {
            Some(reason) => Err(Error::InvalidRunId {
                run_id: id.to_owned(),
                reason,
            }),
            None => Ok(Self(id.into())),
        }
    }

    /// The rule of a run id that `id` breaks, if any.
    fn broken_rule(id: &str) -> Option<&'static str> {
        if id.is_empty() {
            Some("a run id must not be empty")
        } else if id.len() > MAX_RUN_ID_LEN {
            Some("a run id must be at most 128 bytes")
        } else if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            Some("a run id may contain only ASCII letters, digits, '_' and '-'")
        } else {
            None
        }
    }

    /// The run id spelling `ulid` (26 characters of Crockford base32,
    /// always valid); generated ids come from
    /// [`IdGenerator`](crate::run::ids::IdGenerator).
    pub(crate) fn from_ulid(ulid: ulid::Ulid) -> Self {
        let mut spelled = [0u8; ulid::ULID_LEN];
        Self((&*ulid.array_to_str(&mut spelled)).into())
    }

    /// The run id that is the lowercase hex SHA-256 digest of the
    /// concatenated `parts` (64 characters, always valid).
    pub(crate) fn digest(parts: &[&[u8]]) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update(part);
        }
        Self(hex::encode(hasher.finalize()).into())
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned string.
    pub fn into_string(self) -> String {
        String::from(&*self.0)
    }
}

impl Deref for RunId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RunId({:?})", self.0)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        String::from(&*id.0)
    }
}

impl FromStr for RunId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse_ref(s)
    }
}

impl PartialEq<str> for RunId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for RunId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for RunId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for RunId {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RunId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        deserializer.deserialize_str(RunIdVisitor)
    }
}

/// Reads a run id from a borrowed string without an owned copy first.
struct RunIdVisitor;

impl serde::de::Visitor<'_> for RunIdVisitor {
    type Value = RunId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a run id")
    }

    fn visit_str<E: serde::de::Error>(self, id: &str) -> std::result::Result<RunId, E> {
        RunId::parse_ref(id).map_err(E::custom)
    }

    fn visit_string<E: serde::de::Error>(self, id: String) -> std::result::Result<RunId, E> {
        RunId::new(id).map_err(E::custom)
    }

    /// A string written as bytes (as `String` reads it too): UTF-8 only.
    fn visit_bytes<E: serde::de::Error>(self, id: &[u8]) -> std::result::Result<RunId, E> {
        match std::str::from_utf8(id) {
            Ok(id) => self.visit_str(id),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Bytes(id), &self)),
        }
    }
}

/// The SHA-256 digest of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The dedup key of step `step` of `run_id`: no two pending or scheduled
/// jobs exist for one step at a time.
pub(crate) fn step_dedup_key(run_id: &RunId, step: u32) -> String {
    // Built by hand: one exact allocation and no formatting machinery, on
    // every step's enqueue.
    let mut digits = itoa::Buffer::new();
    let step = digits.format(step);
    let mut key = String::with_capacity(4 + run_id.len() + 1 + step.len());
    key.push_str("run:");
    key.push_str(run_id);
    key.push(':');
    key.push_str(step);
    key
}

fn kv_key(parts: &[&str]) -> Vec<u8> {
    let len = RESERVED_KV_PREFIX.len() + parts.iter().map(|part| part.len() + 1).sum::<usize>();
    let mut key = String::with_capacity(len);
    key.push_str(RESERVED_KV_PREFIX);
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            key.push('/');
        }
        key.push_str(part);
    }
    key.into_bytes()
}

/// The durable run record of an active run.
pub(crate) fn run_kv_key(run_id: &RunId) -> Vec<u8> {
    kv_key(&["runs", run_id])
}

/// The current-step pointer of an active run.
pub(crate) fn step_kv_key(run_id: &RunId) -> Vec<u8> {
    kv_key(&["steps", run_id])
}

/// The terminal record of a terminated run.
pub(crate) fn outcome_kv_key(run_id: &RunId) -> Vec<u8> {
    kv_key(&["outcomes", run_id])
}

/// The prefix of the run records of active runs.
pub(crate) const RUNS_PREFIX: &str = "workflow/runs/";
/// The prefix of the terminal records of terminated runs.
pub(crate) const OUTCOMES_PREFIX: &str = "workflow/outcomes/";
/// The prefix of the groups' submission counters: one key per group ever
/// submitted.
pub(crate) const GROUP_SUBMISSIONS_PREFIX: &str = "workflow/group-submissions/";
/// The expiry index of command records (command retention).
pub(crate) const COMMAND_EXPIRY_PREFIX: &str = "workflow/command-expiry/";

/// The prefix of the history records of `run_id`.
pub(crate) fn history_kv_prefix(run_id: &RunId) -> Vec<u8> {
    kv_key(&["history", run_id, ""])
}

/// The history record of step `step` of `run_id`; zero-padded so a scan of
/// the run's prefix is in step order.
pub(crate) fn history_kv_key(run_id: &RunId, step: u32) -> Vec<u8> {
    kv_key(&["history", run_id, &format!("{step:010}")])
}

/// The record of inbox command `id` (a ULID).
pub(crate) fn command_kv_key(id: &str) -> Vec<u8> {
    kv_key(&["commands", id])
}

/// The descriptor of the runtime whose queue is `queue_name`.
pub(crate) fn runtime_kv_key(queue_name: &str) -> Vec<u8> {
    kv_key(&["runtimes", queue_name])
}

/// The prefix of the runtime descriptors.
pub(crate) const RUNTIMES_PREFIX: &str = "workflow/runtimes/";

/// The worker record of the runtime whose queue is `queue_name`: its
/// last start and whether it stopped cleanly (outside
/// [`RUNTIMES_PREFIX`], whose entries are descriptors).
pub(crate) fn worker_kv_key(queue_name: &str) -> Vec<u8> {
    kv_key(&["workers", queue_name])
}

/// The record of the schedule `name` (a schedule name is a run-id-safe
/// word, so it needs no escaping).
pub(crate) fn schedule_kv_key(name: &str) -> Vec<u8> {
    kv_key(&["schedules", name])
}

/// The prefix of the schedule records.
pub(crate) const SCHEDULES_PREFIX: &str = "workflow/schedules/";

/// The expiry index of run terminal markers (memo retention).
pub(crate) const TERMINALS_PREFIX: &str = "workflow/terminals/";
/// The expiry index of group terminal markers (group retention).
pub(crate) const GROUP_TERMINALS_PREFIX: &str = "workflow/group-terminals/";

/// The waiter registered for a signal correlation key.
pub(crate) fn signal_waiter_kv_key(correlation_key: &str) -> Vec<u8> {
    let mut key = kv_key(&["signals", "waiters", ""]);
    key.extend_from_slice(correlation_key.as_bytes());
    key
}

/// The signal buffered for a correlation key with no waiter.
pub(crate) fn signal_buffer_kv_key(correlation_key: &str) -> Vec<u8> {
    let mut key = kv_key(&["signals", "buffered", ""]);
    key.extend_from_slice(correlation_key.as_bytes());
    key
}

/// The trace context of the sender of the signal that woke step job
/// `job_id` (feature `opentelemetry`), kept until that step settles.
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) fn signal_sender_kv_key(job_id: &str) -> Vec<u8> {
    kv_key(&["trace", "signal-senders", job_id])
}

/// The trace context of the sender of the signal buffered under a
/// correlation key (feature `opentelemetry`).
#[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
pub(crate) fn buffered_sender_kv_key(correlation_key: &str) -> Vec<u8> {
    let mut key = kv_key(&["trace", "buffered-senders", ""]);
    key.extend_from_slice(correlation_key.as_bytes());
    key
}

/// A buffered signal consumed for step `step` of `run_id`, kept until that
/// step settles so every redelivery observes the same value.
pub(crate) fn signal_delivered_kv_key(run_id: &RunId, step: u32) -> Vec<u8> {
    kv_key(&["signals", "delivered", run_id, &step.to_string()])
}

/// The prefix of the member records of `group_id`.
pub(crate) fn group_members_kv_prefix(group_id: &RunId) -> Vec<u8> {
    kv_key(&["groups", group_id, ""])
}

/// The longest group member key ([`GroupMember::key`](crate::GroupMember::key),
/// a job group's idempotency key), in bytes: 16 KiB. A member's records
/// (its member record, its run's terminal record) carry the key beside
/// the run's termination (an error of up to
/// [`MAX_TERMINATION_ERROR_LEN`](crate::limits::MAX_TERMINATION_ERROR_LEN), the
/// history entries of its last steps), within the queue's 256 KiB KV value
/// limit, so a longer key is refused at submission with
/// [`Error::MemberKeyTooLong`](crate::Error::MemberKeyTooLong).
pub const MAX_MEMBER_KEY_LEN: usize = 16 * 1024;

/// The longest member key a member record's KV key holds as is; a longer
/// one (a key is free text) is stored by its digest, as the store's keys
/// are limited to 64 KiB.
pub(crate) const MAX_INLINE_MEMBER_KEY_LEN: usize = 1024;
/// The byte that marks a digested member key: it never occurs in UTF-8.
pub(crate) const DIGESTED_MEMBER_KEY: u8 = 0xFF;

/// Whether `key`'s member record is stored under its digest.
pub(crate) fn member_key_is_digested(key: &str) -> bool {
    key.len() > MAX_INLINE_MEMBER_KEY_LEN
}

/// The member record of `key` in `group_id`. Keys are free text; the
/// group id cannot contain `/`, so the prefix is unambiguous. A key longer
/// than [`MAX_INLINE_MEMBER_KEY_LEN`] is replaced by
/// [`DIGESTED_MEMBER_KEY`] and its SHA-256.
pub(crate) fn group_member_kv_key(group_id: &RunId, key: &str) -> Vec<u8> {
    let mut k = group_members_kv_prefix(group_id);
    if member_key_is_digested(key) {
        k.push(DIGESTED_MEMBER_KEY);
        k.extend_from_slice(&sha256(key.as_bytes()));
    } else {
        k.extend_from_slice(key.as_bytes());
    }
    k
}

/// The claim of `group_id`'s member set: the SHA-256 of its manifest,
/// written compare-and-set by the first submission, so two first
/// submissions of different sets cannot both be accepted.
pub(crate) fn group_manifest_claim_kv_key(group_id: &RunId) -> Vec<u8> {
    kv_key(&["group-manifests", group_id])
}

/// The submission counter of `group_id`: every batched commit of its
/// members compares it and increments it, so two submissions of one group
/// cannot both commit a member.
pub(crate) fn group_submissions_kv_key(group_id: &RunId) -> Vec<u8> {
    kv_key(&["group-submissions", group_id])
}

/// The link of the child run `child` to its parent `parent` (child
/// workflows): written with the child's submission, in the settlement of
/// the parent's step that started it. The run ids cannot contain `/`, so
/// the parent's prefix is unambiguous.
pub(crate) fn child_link_kv_key(parent: &RunId, child: &RunId) -> Vec<u8> {
    kv_key(&["children", parent, child])
}

/// The prefix of the child links of `parent`.
pub(crate) fn child_links_kv_prefix(parent: &RunId) -> Vec<u8> {
    kv_key(&["children", parent, ""])
}

/// The end of the child run `child` as its parent reads it, written by the
/// child's terminating settlement.
pub(crate) fn child_end_kv_key(child: &RunId) -> Vec<u8> {
    kv_key(&["child-ends", child])
}

/// The marker of a child end whose parent is still to be woken, written
/// with the end and removed once the wake signal was sent.
pub(crate) fn child_wake_kv_key(child: &RunId) -> Vec<u8> {
    kv_key(&["child-wakes", child])
}

/// The prefix of [`child_wake_kv_key`].
pub(crate) const CHILD_WAKES_PREFIX: &str = "workflow/child-wakes/";

/// The marker of an active child run (its value the parent's id), written
/// with the child's submission and removed by its termination: what the
/// maintenance round looks at to cancel the children of a cancelled or
/// terminated parent.
pub(crate) fn child_active_kv_key(child: &RunId) -> Vec<u8> {
    kv_key(&["child-active", child])
}

/// The prefix of [`child_active_kv_key`].
pub(crate) const CHILD_ACTIVE_PREFIX: &str = "workflow/child-active/";

/// The submitter's headers of a step job: every header outside the reserved
/// prefix.
pub(crate) fn user_headers(
    headers: &std::collections::HashMap<String, String>,
) -> std::collections::HashMap<String, String> {
    headers
        .iter()
        .filter(|(name, _)| !name.starts_with(RESERVED_HEADER_PREFIX))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// The longest concurrency key
/// ([`RunOptions::concurrency_key`](crate::RunOptions::concurrency_key)),
/// in bytes. The key is part of the KV keys of its slots and waiters; a
/// longer key is refused with
/// [`Error::InvalidRunOptions`](crate::Error::InvalidRunOptions).
pub const MAX_CONCURRENCY_KEY_LEN: usize = 256;

/// The prefix of every concurrency key's slot records (runs holding a slot
/// of the key), `workflow/concurrency/held/{key}/{run_id}`.
pub(crate) const KEY_HELD_PREFIX: &str = "workflow/concurrency/held/";
/// The prefix of every concurrency key's waiter records (runs waiting for
/// a slot), `workflow/concurrency/waiting/{key}/{seq}`, in submission order.
pub(crate) const KEY_WAITING_PREFIX: &str = "workflow/concurrency/waiting/";

/// The prefix of the slot records of concurrency key `key` (which holds no
/// `/`).
pub(crate) fn key_held_prefix(key: &str) -> Vec<u8> {
    format!("{KEY_HELD_PREFIX}{key}/").into_bytes()
}

/// The slot record of `run_id` under concurrency key `key`.
pub(crate) fn key_held_kv_key(key: &str, run_id: &RunId) -> Vec<u8> {
    let mut out = key_held_prefix(key);
    out.extend_from_slice(run_id.as_bytes());
    out
}

/// The prefix of the waiter records of concurrency key `key`.
pub(crate) fn key_waiting_prefix(key: &str) -> Vec<u8> {
    format!("{KEY_WAITING_PREFIX}{key}/").into_bytes()
}

/// The waiter record number `seq` (a ULID, so records sort in submission
/// order) of concurrency key `key`.
pub(crate) fn key_waiting_kv_key(key: &str, seq: &str) -> Vec<u8> {
    let mut out = key_waiting_prefix(key);
    out.extend_from_slice(seq.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_validated_with_the_rule_they_break() {
        assert!(RunId::new("order-42_a").is_ok());
        assert!(RunId::new("x".repeat(MAX_RUN_ID_LEN)).is_ok());
        let err = RunId::new("").unwrap_err().to_string();
        assert!(err.contains("must not be empty"), "{err}");
        let err = RunId::new("x".repeat(129)).unwrap_err().to_string();
        assert!(err.contains("at most 128"), "{err}");
        let err = RunId::new("a/b").unwrap_err().to_string();
        assert!(
            err.contains("a/b") && err.contains("ASCII letters"),
            "{err}"
        );
    }

    #[test]
    fn borrowed_and_owned_run_ids_follow_one_rule() {
        for id in ["order-42_a", "", "a/b", &"x".repeat(129), &"y".repeat(128)] {
            let owned = RunId::new(id).map_err(|err| err.to_string());
            let borrowed = RunId::parse_ref(id).map_err(|err| err.to_string());
            let parsed = id.parse::<RunId>().map_err(|err| err.to_string());
            assert_eq!(owned, borrowed, "{id:?}");
            assert_eq!(owned, parsed, "{id:?}");
        }
        // Shared, not copied: a clone is the same id.
        let id = RunId::parse_ref("run-1").unwrap();
        let clone = id.clone();
        assert!(std::ptr::eq(id.as_str(), clone.as_str()));
        assert_eq!(String::from(clone), "run-1");
        assert_eq!(id.into_string(), "run-1");
    }

    #[test]
    fn step_dedup_keys_name_the_run_and_step() {
        let id = RunId::new("order-42").unwrap();
        assert_eq!(step_dedup_key(&id, 0), "run:order-42:0");
        assert_eq!(step_dedup_key(&id, 17), "run:order-42:17");
        assert_eq!(
            step_dedup_key(&id, u32::MAX),
            format!("run:order-42:{}", u32::MAX)
        );
    }

    #[test]
    fn ulid_ids_spell_the_ulid() {
        let ulid = ulid::Ulid::from_parts(1_700_000_000_000, 42);
        assert_eq!(RunId::from_ulid(ulid).as_str(), ulid.to_string());
    }

    #[test]
    fn digest_ids_are_hex_sha256() {
        let id = RunId::digest(&[b"g", b"/", b"k"]);
        assert_eq!(id.len(), 64);
        assert_eq!(id.as_str(), hex::encode(sha256(b"g/k")));
    }

    #[test]
    fn run_ids_round_trip_through_serde_and_reject_bad_ids() {
        let id = RunId::new("abc").unwrap();
        let bytes = rmp_serde::to_vec(&id).unwrap();
        assert_eq!(rmp_serde::from_slice::<RunId>(&bytes).unwrap(), id);
        let bad = rmp_serde::to_vec("a b").unwrap();
        let err = rmp_serde::from_slice::<RunId>(&bad)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a b") && err.contains("ASCII letters"),
            "{err}"
        );
        // Written as bytes: read as UTF-8, as a `String` would be.
        let as_bytes = rmp_serde::to_vec(&serde_bytes::Bytes::new(b"abc")).unwrap();
        assert_eq!(rmp_serde::from_slice::<RunId>(&as_bytes).unwrap(), id);
        let not_utf8 = rmp_serde::to_vec(&serde_bytes::Bytes::new(&[0xff, 0xfe])).unwrap();
        assert!(rmp_serde::from_slice::<RunId>(&not_utf8).is_err());
        // From an owned string (a reader that cannot lend) as well.
        let mut reader = std::io::Cursor::new(bytes);
        assert_eq!(rmp_serde::from_read::<_, RunId>(&mut reader).unwrap(), id);
    }

    #[test]
    fn long_member_keys_are_stored_by_digest() {
        let group = RunId::new("g").unwrap();
        let short = "k".repeat(MAX_INLINE_MEMBER_KEY_LEN);
        assert!(group_member_kv_key(&group, &short).ends_with(short.as_bytes()));
        let long = "k".repeat(100 * 1024);
        let key = group_member_kv_key(&group, &long);
        let prefix = group_members_kv_prefix(&group);
        assert_eq!(key.len(), prefix.len() + 1 + 32);
        assert_eq!(key[prefix.len()], DIGESTED_MEMBER_KEY);
        assert_ne!(
            key,
            group_member_kv_key(&group, &"k".repeat(100 * 1024 + 1))
        );
    }

    #[test]
    fn keys_live_under_the_reserved_prefix() {
        let id = RunId::new("r1").unwrap();
        for key in [
            run_kv_key(&id),
            step_kv_key(&id),
            outcome_kv_key(&id),
            signal_waiter_kv_key("k"),
            signal_buffer_kv_key("k"),
            signal_delivered_kv_key(&id, 3),
            group_member_kv_key(&id, "m"),
            group_submissions_kv_key(&id),
            group_manifest_claim_kv_key(&id),
            history_kv_key(&id, 7),
            command_kv_key("01ARZ3NDEKTSV4RRFFQ69G5FAV"),
            runtime_kv_key("q"),
            worker_kv_key("q"),
        ] {
            assert!(key.starts_with(RESERVED_KV_PREFIX.as_bytes()));
        }
        assert_eq!(run_kv_key(&id), b"workflow/runs/r1");
        assert!(!group_submissions_kv_key(&id).starts_with(&group_members_kv_prefix(&id)));
        assert!(TERMINALS_PREFIX.starts_with(RESERVED_KV_PREFIX));
        assert!(history_kv_key(&id, 7).starts_with(&history_kv_prefix(&id)));
        assert_eq!(history_kv_key(&id, 7), b"workflow/history/r1/0000000007");
        assert!(run_kv_key(&id).starts_with(RUNS_PREFIX.as_bytes()));
        assert!(outcome_kv_key(&id).starts_with(OUTCOMES_PREFIX.as_bytes()));
        assert!(group_submissions_kv_key(&id).starts_with(GROUP_SUBMISSIONS_PREFIX.as_bytes()));
        assert!(runtime_kv_key("q").starts_with(RUNTIMES_PREFIX.as_bytes()));
        assert!(!worker_kv_key("q").starts_with(RUNTIMES_PREFIX.as_bytes()));
        assert_eq!(worker_kv_key("q"), b"workflow/workers/q");
    }
}
