//! The durable record formats: every record the runtime stores, encoded as
//! MessagePack with named fields so fields can be added without misreading
//! older records, and the helpers that read them back.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use taquba::QueueView;
use tracing::warn;

use crate::error::Result;
use crate::model::RunTermination;
use crate::model::StepErrorKind;
use crate::model::{RunOutcome, TerminalStatus};
use crate::store::keys::RunId;

/// Encode `value` as MessagePack with named fields. The record types of
/// this module cannot fail to encode (no maps with non-string keys, no
/// unsupported types), so an error here is a programming error.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut buf = Vec::with_capacity(ENCODE_CAPACITY);
    encode_into(value, &mut buf);
    buf
}

/// The buffer a record is encoded into starts this large (bytes): most
/// records (run, terminal, pointer) fit, so encoding one allocates once
/// instead of growing the buffer five or six times.
const ENCODE_CAPACITY: usize = 256;

/// Encode `value` as [`encode`] does, appending to `buf` (no intermediate
/// buffer: for records encoded on every settlement).
pub(crate) fn encode_into<T: Serialize>(value: &T, buf: &mut Vec<u8>) {
    value
        .serialize(&mut rmp_serde::Serializer::new(buf).with_struct_map())
        .expect("durable records always encode");
}

/// Encode a caller-supplied value, reporting an encoding failure.
pub(crate) fn try_encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(rmp_serde::to_vec_named(value)?)
}

/// Decode a record.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    Ok(rmp_serde::from_slice(bytes)?)
}

/// Decode a record whose readers tolerate absence: a record that fails to
/// decode is logged (naming `what` and `whose`) and treated as absent.
pub(crate) fn decode_or_absent<T: DeserializeOwned>(
    bytes: &[u8],
    what: &str,
    whose: &dyn std::fmt::Display,
) -> Option<T> {
    match rmp_serde::from_slice(bytes) {
        Ok(value) => Some(value),
        Err(err) => {
            warn!(%whose, error = %err, "{what} does not decode; treated as absent");
            None
        }
    }
}

/// Read and decode the KV record at `key`.
pub(crate) async fn kv_record<T: DeserializeOwned>(
    view: &QueueView,
    key: &[u8],
) -> Result<Option<T>> {
    match view.kv_get(key).await? {
        Some(bytes) => decode(&bytes).map(Some),
        None => Ok(None),
    }
}

/// The durable record of an active run, under `workflow/runs/{run_id}`:
/// written with the step-0 enqueue, rewritten by a cancellation request,
/// deleted by the terminating settlement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableRunRecord {
    /// SHA-256 of the run's input, for the idempotency check.
    #[serde(with = "serde_bytes")]
    pub(crate) input_hash: Vec<u8>,
    /// When the run was submitted, ms since the UNIX epoch (queue clock).
    pub(crate) submitted_at_ms: u64,
    /// Whether a cancellation has been requested.
    #[serde(default)]
    pub(crate) cancel_requested: bool,
    /// The step job a cancellation request reached while the step was
    /// running in this process (its token fired, and the request was
    /// answered `Ok(true)`): a dead letter of that job reconciles as
    /// `Cancelled`, since it came after the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cancel_delivered_to: Option<String>,
    /// The identity of this submission of the run id: the id of its step-0
    /// job, new with every submission. The run's history records are tagged
    /// with it, and its step-output replay records hold it, so a later run
    /// under the id (a re-submission after this one terminated) never
    /// replays them. This field and the ones below are additive (`None` in
    /// records written before them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) execution: Option<String>,
    /// The workflow (or job) name, read from the input at submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workflow: Option<String>,
    /// The group the run is a member of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<RunId>,
    /// The reason given to a cancellation request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cancel_reason: Option<String>,
    /// The version of the code that submitted the run
    /// ([`StepRunner::code`](crate::StepRunner::code)); absent when it
    /// says none, and in records written before versions were kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    /// The patches the submitting code declared, sorted: what
    /// `Delivery::patched` answers from for the whole run (see
    /// `versioning`). Empty when it declared none, and in records written
    /// before patches were kept (such runs answer `false`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) patches: Vec<String>,
    /// The run and step this run was forked from
    /// (`WorkflowRuntime::fork`); absent for a run submitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) forked_from: Option<DurableForkLink>,
    /// The run whose step started this run as its child (child workflows);
    /// absent for a run submitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<RunId>,
    /// The run's concurrency key, limit and waiter number
    /// (`RunOptions::concurrency_key`); absent for a run without a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<crate::coordination::keys::DurableConcurrency>,
}

/// The link of a forked run to the run and step it was forked from, kept
/// on its run record and terminal record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableForkLink {
    pub(crate) run_id: RunId,
    pub(crate) step: u32,
}

/// The entries of a run's history not yet in a chunk, with the run's chunk
/// count: kept on the step pointer ([`DurableCurrentStep::history`]), so
/// it is a record of this module; `history::record` appends to it and
/// moves full chunks out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PendingHistory {
    /// The encoded entries, concatenated (each a self-delimiting
    /// MessagePack value), oldest first.
    #[serde(default)]
    pub(crate) entries: ByteBuf,
    /// How many entries `entries` holds.
    #[serde(default)]
    pub(crate) count: u32,
    /// Chunks written so far: the number of the next one.
    #[serde(default)]
    pub(crate) chunks: u32,
}

/// The current-step pointer of an active run, under `workflow/steps/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableCurrentStep {
    /// The step number of the run's current step.
    pub(crate) step_number: u32,
    /// The queue job id of that step.
    pub(crate) job_id: String,
    /// The run's history entries not yet in a chunk (see
    /// `history::record`); `None` in pointers written before them, with
    /// history off, and at step 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<PendingHistory>,
}

/// A terminal status as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DurableStatus {
    Succeeded,
    Failed,
    Cancelled,
}

impl From<TerminalStatus> for DurableStatus {
    fn from(status: TerminalStatus) -> Self {
        match status {
            TerminalStatus::Succeeded => Self::Succeeded,
            TerminalStatus::Failed => Self::Failed,
            TerminalStatus::Cancelled => Self::Cancelled,
        }
    }
}

impl From<DurableStatus> for TerminalStatus {
    fn from(status: DurableStatus) -> Self {
        match status {
            DurableStatus::Succeeded => Self::Succeeded,
            DurableStatus::Failed => Self::Failed,
            DurableStatus::Cancelled => Self::Cancelled,
        }
    }
}

/// An error kind as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DurableErrorKind {
    Transient,
    Permanent,
}

impl From<StepErrorKind> for DurableErrorKind {
    fn from(kind: StepErrorKind) -> Self {
        match kind {
            StepErrorKind::Transient => Self::Transient,
            StepErrorKind::Permanent => Self::Permanent,
        }
    }
}

impl From<DurableErrorKind> for StepErrorKind {
    fn from(kind: DurableErrorKind) -> Self {
        match kind {
            DurableErrorKind::Transient => Self::Transient,
            DurableErrorKind::Permanent => Self::Permanent,
        }
    }
}

/// The terminal record of a run, under `workflow/outcomes/{run_id}`, written
/// by the settlement that terminates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableTermination {
    pub(crate) status: DurableStatus,
    pub(crate) error: Option<String>,
    pub(crate) error_kind: Option<DurableErrorKind>,
    pub(crate) final_step: u32,
    pub(crate) terminated_at_ms: u64,
    /// SHA-256 of the terminated run's input, so an idempotent re-submission
    /// of a terminated job can be told apart from a different payload.
    #[serde(with = "serde_bytes", default)]
    pub(crate) input_hash: Vec<u8>,
    /// When the terminated run was submitted (queue clock, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) submitted_at_ms: Option<u64>,
    /// The queue job of the final step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) job_id: Option<String>,
    /// The run's last history entries (those not in a chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<PendingHistory>,
    /// The execution tag of the run's history records: the id of the step-0
    /// job of the submission. This field and the ones below are additive
    /// (`None` in records written before them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) execution: Option<String>,
    /// The workflow (or job) name, read from the input at submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) workflow: Option<String>,
    /// The group the run is a member of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<RunId>,
    /// The reason given to a cancellation request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cancel_reason: Option<String>,
    /// The group membership of a group member's run, so a plain submission
    /// under the member's run id is refused; absent for a plain run (and
    /// in records written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) member: Option<DurableMembership>,
    /// The run and step this run was forked from, from its run record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) forked_from: Option<DurableForkLink>,
    /// The run record's `version`, kept (absent in records written before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
    /// The run record's `patches`, kept (empty in records written before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) patches: Vec<String>,
    /// The run record's `parent`, kept (absent for a run that is no child).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<RunId>,
    /// The run record's `concurrency`, kept: the termination deletes the
    /// slot and waiter records it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<crate::coordination::keys::DurableConcurrency>,
}

impl DurableTermination {
    /// Whether `other` records the same termination as `self`, the history
    /// entries aside: the run result record is written before the
    /// terminating settlement puts the run's pending history entries on the
    /// terminal record, so the two differ in exactly that field.
    pub(crate) fn same_termination(&self, other: &Self) -> bool {
        let Self {
            status,
            error,
            error_kind,
            final_step,
            terminated_at_ms,
            input_hash,
            submitted_at_ms,
            job_id,
            history: _,
            execution,
            workflow,
            group,
            cancel_reason,
            member,
            forked_from,
            version,
            patches,
            parent,
            concurrency,
        } = self;
        *status == other.status
            && *error == other.error
            && *error_kind == other.error_kind
            && *final_step == other.final_step
            && *terminated_at_ms == other.terminated_at_ms
            && *input_hash == other.input_hash
            && *submitted_at_ms == other.submitted_at_ms
            && *job_id == other.job_id
            && *execution == other.execution
            && *workflow == other.workflow
            && *group == other.group
            && *cancel_reason == other.cancel_reason
            && *member == other.member
            && *forked_from == other.forked_from
            && *version == other.version
            && *patches == other.patches
            && *parent == other.parent
            && *concurrency == other.concurrency
    }
}

/// A run's membership of a group, as a terminal record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableMembership {
    pub(crate) group_id: RunId,
    pub(crate) key: String,
}

impl From<DurableTermination> for RunTermination {
    fn from(record: DurableTermination) -> Self {
        RunTermination {
            status: record.status.into(),
            error: record.error,
            error_kind: record.error_kind.map(Into::into),
            final_step: record.final_step,
            terminated_at_ms: record.terminated_at_ms,
        }
    }
}

/// The termination a record tells, copying only its error (not the rest
/// of the record, as cloning it whole would).
impl From<&DurableTermination> for RunTermination {
    fn from(record: &DurableTermination) -> Self {
        RunTermination {
            status: record.status.into(),
            error: record.error.clone(),
            error_kind: record.error_kind.map(Into::into),
            final_step: record.final_step,
            terminated_at_ms: record.terminated_at_ms,
        }
    }
}

/// A committed [`RunOutcome`] as stored (notification payloads, run result
/// records).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableRunOutcome {
    pub(crate) run_id: RunId,
    pub(crate) status: DurableStatus,
    #[serde(with = "serde_bytes")]
    pub(crate) result: Option<Vec<u8>>,
    pub(crate) error: Option<String>,
    pub(crate) headers: HashMap<String, String>,
    pub(crate) final_step: u32,
}

impl From<&RunOutcome> for DurableRunOutcome {
    fn from(outcome: &RunOutcome) -> Self {
        Self {
            run_id: outcome.run_id.clone(),
            status: outcome.status.into(),
            result: outcome.result.clone(),
            error: outcome.error.clone(),
            headers: outcome.headers.clone(),
            final_step: outcome.final_step,
        }
    }
}

impl From<DurableRunOutcome> for RunOutcome {
    fn from(record: DurableRunOutcome) -> Self {
        RunOutcome {
            run_id: record.run_id,
            status: record.status.into(),
            result: record.result,
            error: record.error,
            headers: record.headers,
            final_step: record.final_step,
        }
    }
}

/// The run result record, stored in the run memo under `workflow.outcome`
/// before a worker's terminating settlement: the outcome and the
/// termination it belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DurableRunResult {
    pub(crate) termination: DurableTermination,
    pub(crate) outcome: DurableRunOutcome,
}

/// [`DurableRunResult`] by reference, for writing one without copying the
/// termination and the outcome: it encodes to the same bytes (the same
/// field names, in the same order; the unit test holds them equal).
#[derive(Serialize)]
pub(crate) struct DurableRunResultRef<'a> {
    pub(crate) termination: &'a DurableTermination,
    pub(crate) outcome: DurableRunOutcomeRef<'a>,
}

/// [`DurableRunOutcome`] by reference (see [`DurableRunResultRef`]).
#[derive(Serialize)]
pub(crate) struct DurableRunOutcomeRef<'a> {
    run_id: &'a RunId,
    status: DurableStatus,
    #[serde(with = "serde_bytes")]
    result: &'a Option<Vec<u8>>,
    error: &'a Option<String>,
    headers: &'a HashMap<String, String>,
    final_step: u32,
}

impl<'a> From<&'a RunOutcome> for DurableRunOutcomeRef<'a> {
    fn from(outcome: &'a RunOutcome) -> Self {
        Self {
            run_id: &outcome.run_id,
            status: outcome.status.into(),
            result: &outcome.result,
            error: &outcome.error,
            headers: &outcome.headers,
            final_step: outcome.final_step,
        }
    }
}

/// A group member record, under `workflow/groups/{group_id}/{key}` (a
/// long key is stored by its digest, see `group_member_kv_key`, and then
/// kept in the record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableMember {
    pub(crate) run_id: RunId,
    pub(crate) terminated: Option<DurableTermination>,
    /// The member key, when the record's KV key holds its digest instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key: Option<String>,
    /// A ULID new with every write of the record, so a submission guarded
    /// on the record as read fails after any write in between (two pending
    /// records of one member would otherwise be the same bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) version: Option<String>,
}

/// What a group's manifest claim digests (its SHA-256 is the claim, under
/// `workflow/group-manifests/{group_id}`): the group and each member's key
/// and input hash, in order. A job group's input hashes are canonical, so
/// equal sets claim alike whatever order their jobs' maps iterate in.
/// Claims written before were the SHA-256 of the stored manifest.
#[derive(Debug, Serialize)]
pub(crate) struct DurableGroupClaim<'a> {
    pub(crate) group_id: &'a RunId,
    pub(crate) members: Vec<DurableClaimedMember<'a>>,
}

/// One member of a [`DurableGroupClaim`].
#[derive(Debug, Serialize)]
pub(crate) struct DurableClaimedMember<'a> {
    pub(crate) key: &'a str,
    #[serde(with = "serde_bytes")]
    pub(crate) input_hash: &'a [u8],
}

/// The waiter registered for a signal correlation key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableWaiter {
    pub(crate) run_id: RunId,
    pub(crate) step_number: u32,
    pub(crate) job_id: String,
}

/// A step outcome as stored in a step-output replay record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum DurableStepOutcome {
    Continue {
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
        trigger: DurableTrigger,
    },
    Succeed {
        #[serde(with = "serde_bytes")]
        result: Vec<u8>,
    },
    Fail {
        reason: String,
    },
    Cancel {
        reason: String,
    },
}

/// A trigger as stored; delays and timeouts in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum DurableTrigger {
    Immediate,
    After {
        delay_ms: u64,
    },
    OnSignal {
        correlation_key: String,
        timeout_ms: u64,
    },
}

/// One KV write staged by a step, as stored in a replay record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableKvWrite {
    #[serde(with = "serde_bytes")]
    pub(crate) key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub(crate) value: Vec<u8>,
}

/// A step-output replay record: the outcome the runner returned, the
/// effects it staged, when it was recorded (queue clock, ms) and the
/// incarnation of the run that recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DurableStepOutput {
    pub(crate) outcome: DurableStepOutcome,
    pub(crate) writes: Vec<DurableKvWrite>,
    pub(crate) deletes: Vec<serde_bytes::ByteBuf>,
    pub(crate) recorded_at_ms: u64,
    /// The [`DurableRunRecord::execution`] of the run that recorded it; a
    /// run of another incarnation does not replay it. Absent in records
    /// written before it was kept, which only runs whose run record has no
    /// incarnation (submitted before, and still in flight) replay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) incarnation: Option<String>,
}

/// The input of a job run: the registered type's name and the job value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DurableJobInput {
    pub(crate) name: String,
    #[serde(with = "serde_bytes")]
    pub(crate) payload: Vec<u8>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A terminal record with every optional field filled.
    pub(crate) fn full_termination() -> DurableTermination {
        DurableTermination {
            status: DurableStatus::Failed,
            error: Some("boom".into()),
            error_kind: Some(DurableErrorKind::Permanent),
            final_step: 3,
            terminated_at_ms: 1_700_000_000_000,
            input_hash: vec![7; 32],
            submitted_at_ms: Some(1_699_999_999_000),
            job_id: Some("01J-step-3".into()),
            history: None,
            execution: Some("01J-exec".into()),
            workflow: Some("order".into()),
            group: Some(RunId::new("g").unwrap()),
            cancel_reason: Some("why".into()),
            member: None,
            forked_from: Some(DurableForkLink {
                run_id: RunId::new("o").unwrap(),
                step: 1,
            }),
            version: Some("1.2.0".into()),
            patches: vec!["skip-slack-post".into()],
            parent: Some(RunId::new("p").unwrap()),
            concurrency: Some(crate::coordination::keys::DurableConcurrency {
                key: "customer-1".into(),
                limit: 2,
                seq: "01J".into(),
            }),
        }
    }

    #[test]
    fn a_run_result_written_by_reference_is_the_owned_records_bytes() {
        let termination = full_termination();
        for outcome in [
            RunOutcome {
                run_id: RunId::new("r").unwrap(),
                status: crate::model::TerminalStatus::Failed,
                result: None,
                error: Some("boom".into()),
                headers: HashMap::from([("k".to_string(), "v".to_string())]),
                final_step: 3,
            },
            RunOutcome {
                run_id: RunId::new("r").unwrap(),
                status: crate::model::TerminalStatus::Succeeded,
                result: Some(vec![1, 2, 3]),
                error: None,
                headers: HashMap::new(),
                final_step: 0,
            },
        ] {
            let owned = encode(&DurableRunResult {
                termination: termination.clone(),
                outcome: DurableRunOutcome::from(&outcome),
            });
            let by_reference = encode(&DurableRunResultRef {
                termination: &termination,
                outcome: DurableRunOutcomeRef::from(&outcome),
            });
            assert_eq!(by_reference, owned);
        }
    }

    #[test]
    fn records_round_trip_and_garbage_is_absent() {
        let record = DurableRunRecord {
            input_hash: vec![7; 32],
            submitted_at_ms: 5,
            cancel_requested: true,
            cancel_delivered_to: Some("job-1".into()),
            execution: Some("01J".into()),
            workflow: Some("order".into()),
            group: Some(RunId::new("g").unwrap()),
            cancel_reason: Some("why".into()),
            forked_from: Some(DurableForkLink {
                run_id: RunId::new("o").unwrap(),
                step: 3,
            }),
            version: Some("1.2.0".into()),
            patches: vec!["skip-slack-post".into()],
            parent: None,
            concurrency: Some(crate::coordination::keys::DurableConcurrency {
                key: "customer-1".into(),
                limit: 2,
                seq: "01J".into(),
            }),
        };
        let back: DurableRunRecord = decode(&encode(&record)).unwrap();
        assert_eq!(back, record);
        let id = RunId::new("r").unwrap();
        assert!(
            decode_or_absent::<DurableRunRecord>(b"\xff\x00garbage", "run record", &id).is_none()
        );
    }

    #[test]
    fn a_version_and_a_patch_cost_a_run_record_a_few_dozen_bytes() {
        let plain = DurableRunRecord {
            input_hash: vec![7; 32],
            submitted_at_ms: 1_700_000_000_000,
            cancel_requested: false,
            cancel_delivered_to: None,
            execution: Some("01J00000000000000000000000".into()),
            workflow: Some("notify".into()),
            group: None,
            cancel_reason: None,
            version: None,
            patches: Vec::new(),
            forked_from: None,
            parent: None,
            concurrency: None,
        };
        let versioned = DurableRunRecord {
            version: Some("2.0.0".into()),
            patches: vec!["skip-slack-post".into()],
            ..plain.clone()
        };
        let (before, after) = (encode(&plain).len(), encode(&versioned).len());
        println!("run record: {before} bytes, with a version and a patch: {after} bytes");
        assert!(after - before <= 48, "{before} -> {after}");
        // Nothing of either is written when the code says none.
        let bytes = encode(&plain);
        for field in [&b"version"[..], b"patches"] {
            assert!(!bytes.windows(field.len()).any(|w| w == field));
        }
    }

    #[test]
    fn an_added_field_defaults_when_reading_an_older_record() {
        #[derive(Serialize)]
        struct Old {
            #[serde(with = "serde_bytes")]
            input_hash: Vec<u8>,
            submitted_at_ms: u64,
        }
        let old = encode(&Old {
            input_hash: vec![1],
            submitted_at_ms: 9,
        });
        let record: DurableRunRecord = decode(&old).unwrap();
        assert!(!record.cancel_requested);
        assert_eq!(record.cancel_delivered_to, None);
        assert!(record.execution.is_none() && record.workflow.is_none());
        assert!(record.group.is_none() && record.cancel_reason.is_none());
        assert!(record.version.is_none() && record.patches.is_empty());
    }
}
