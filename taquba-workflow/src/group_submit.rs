//! Submission of a group's members in chunks: one queue transaction commits
//! up to [`CHUNK`] member runs at once, guarded by the group's submission
//! counter rather than by each member's run record.
//!
//! A member submitted alone costs a run-record read, a terminal-record read
//! and a transaction guarded on its run record, and the store checks
//! concurrent guarded transactions against each other at a cost quadratic
//! in their number. A chunk reads each member's run record and commits the
//! rest together.
//!
//! Why the counter is enough. A submission reads the counter, then the
//! member records. A member that the records show as never submitted,
//! failed or cancelled can only become active through a submission of its
//! run id, and every group submission commits its chunks
//! compare-and-increment on the counter: of two submissions that overlap,
//! the later chunk finds the counter moved, submits its members one at a
//! time (each guarded on its run record, a success answered by its terminal
//! record), and reads the records again for the chunks left. The run-record
//! read catches the one other way a member can be active: a run of a
//! forgotten group still going, which a new submission leaves running. Such
//! a run ending between that read and the commit is started afresh, as
//! [`RunGroup::forget`](crate::RunGroup::forget) documents for members of a
//! forgotten group. A member that was active in the records and is no longer
//! (it terminated meanwhile) is submitted alone.

use std::collections::HashMap;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use taquba::SettlementEffects;
use tracing::debug;

use crate::engine::{OnTerminated, RuntimeCore};
use crate::error::{Error, Result};
use crate::group::{GroupMember, Membership};
use crate::keys::{RunId, group_submissions_kv_key, sha256};
use crate::runtime::{RunOptions, RunSpec};
use crate::submit_batch::MAX_BATCH_BYTES;
use crate::terminal::TerminalStatus;

/// Members one transaction submits (fewer once their keys and inputs reach
/// [`MAX_BATCH_BYTES`]).
const CHUNK: usize = 256;
/// Member submissions (reads or lone commits) in flight at once; each waits
/// for the store, and concurrent commits share WAL flushes.
pub(crate) const SUBMIT_CONCURRENCY: usize = 32;

/// What the group's member records said of a member before submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    /// No record, or a termination other than a success: nothing but a
    /// submission can make it active.
    Idle,
    /// Submitted and not terminated when read.
    Active,
}

/// A member to submit, with its input hash and what its record said.
struct Candidate {
    member: GroupMember,
    input_hash: Vec<u8>,
    recorded: Recorded,
}

/// Submit the members of `members` whose last termination is not a
/// success, as group `group_id`'s members with `options`. Chunks commit in
/// order; a failure returns after the chunks committed before it.
///
/// The counter is read before the member records, so any submission that
/// commits after the records were read moves it and fails this one's
/// compare; the records are then read again for the members left.
///
/// # Errors
/// [`Error::ReservedHeaderInSubmit`] for a reserved header in `options`;
/// [`Error::InputMismatch`] for a member whose run is active with another
/// input; storage errors.
pub(crate) async fn submit_members(
    core: &RuntimeCore,
    group_id: &RunId,
    members: Vec<GroupMember>,
    options: &RunOptions,
) -> Result<()> {
    RuntimeCore::check_submission(options, &SettlementEffects::default())?;
    let counter_key = group_submissions_kv_key(group_id);
    let state = read_state(core, group_id, &counter_key).await?;
    submit_from(core, group_id, members, options, state).await
}

/// The counter and member states [`read_state`] returns.
type GroupState = (Option<Vec<u8>>, HashMap<String, Option<TerminalStatus>>);

/// [`submit_members`] from `state`, read before any member's run record.
async fn submit_from(
    core: &RuntimeCore,
    group_id: &RunId,
    members: Vec<GroupMember>,
    options: &RunOptions,
    (mut counter, mut states): GroupState,
) -> Result<()> {
    let counter_key = group_submissions_kv_key(group_id);
    let mut members = members.into_iter().peekable();
    while members.peek().is_some() {
        let mut taken = Vec::new();
        let mut bytes = 0;
        while taken.len() < CHUNK
            && bytes < MAX_BATCH_BYTES
            && let Some(member) = members.next()
        {
            bytes += member.key.len() + member.input.len();
            taken.push(member);
        }
        let chunk: Vec<Candidate> = candidates(taken.into_iter(), &states)
            .map(|(member, recorded)| Candidate {
                input_hash: sha256(&member.input).to_vec(),
                member,
                recorded,
            })
            .collect();
        let (batch, mut alone) = inactive_members(core, group_id, chunk).await?;
        if !batch.is_empty() {
            match commit_chunk(
                core,
                group_id,
                &counter_key,
                counter.as_deref(),
                batch,
                options,
            )
            .await?
            {
                Chunk::Committed(next) => counter = Some(next),
                Chunk::Rejected(rejected) => {
                    alone.extend(rejected);
                    (counter, states) = read_state(core, group_id, &counter_key).await?;
                }
            }
        }
        submit_alone(core, group_id, alone, options).await?;
    }
    Ok(())
}

/// The group's submission counter, then the status of each member record
/// by key (`None` for a member submitted and not terminated).
async fn read_state(
    core: &RuntimeCore,
    group_id: &RunId,
    counter_key: &[u8],
) -> Result<GroupState> {
    let counter = core.queue.view().kv_get(counter_key).await?.map(Vec::from);
    let states = core
        .group_store
        .members(group_id)
        .await?
        .into_iter()
        .map(|m| (m.status(), m.key))
        .map(|(status, key)| (key, status))
        .collect();
    Ok((counter, states))
}

/// Split `chunk` by its members' run records: members to commit together,
/// and members to submit alone (active when read and no longer). Members
/// with a run record are active and left running.
///
/// # Errors
/// [`Error::InputMismatch`] for an active member with another input;
/// storage errors.
async fn inactive_members(
    core: &RuntimeCore,
    group_id: &RunId,
    chunk: Vec<Candidate>,
) -> Result<(Vec<Candidate>, Vec<Candidate>)> {
    let read: Vec<(Candidate, bool)> = stream::iter(chunk)
        .map(|candidate| async move {
            let run_id = crate::group::member_run_id(group_id, &candidate.member.key);
            let active = match core.view.run_record(&run_id).await? {
                Some(existing) if existing.input_hash != candidate.input_hash => {
                    return Err(Error::InputMismatch(run_id));
                }
                Some(_) => true,
                None => false,
            };
            Ok((candidate, active))
        })
        .buffered(SUBMIT_CONCURRENCY)
        .try_collect()
        .await?;
    let mut batch = Vec::with_capacity(read.len());
    let mut alone = Vec::new();
    for (candidate, active) in read {
        match (active, candidate.recorded) {
            (true, _) => {}
            (false, Recorded::Idle) => batch.push(candidate),
            (false, Recorded::Active) => alone.push(candidate),
        }
    }
    Ok((batch, alone))
}

/// What became of a chunk's transaction.
enum Chunk {
    /// Committed; the counter's new value.
    Committed(Vec<u8>),
    /// Not committed (the counter moved, or the transaction failed): these
    /// members go alone.
    Rejected(Vec<Candidate>),
}

/// Commit `batch` in one transaction if the counter still holds `counter`,
/// incrementing it.
async fn commit_chunk(
    core: &RuntimeCore,
    group_id: &RunId,
    counter_key: &[u8],
    counter: Option<&[u8]>,
    batch: Vec<Candidate>,
    options: &RunOptions,
) -> Result<Chunk> {
    let next = next_counter(counter);
    let mut merged = SettlementEffects::default().kv_put(counter_key.to_vec(), next.clone());
    let mut submitted = Vec::with_capacity(batch.len());
    for candidate in &batch {
        let membership = Membership {
            group_id: group_id.clone(),
            key: candidate.member.key.clone(),
        };
        let run_id = membership.run_id();
        let (effects, job_id) = core.submission_effects(
            &run_id,
            candidate.member.input.clone(),
            &candidate.input_hash,
            options,
            Some(&membership),
            &SettlementEffects::default(),
        );
        // One enqueue per member (step 0), in member order.
        merged.enqueues.extend(effects.enqueues);
        merged.kv_writes.extend(effects.kv_writes);
        submitted.push((run_id, job_id));
    }
    match core
        .queue
        .kv_compare_commit(counter_key, counter, merged)
        .await
    {
        Ok(Some(results)) => {
            for ((run_id, job_id), result) in submitted.into_iter().zip(results) {
                core.submitted(run_id, job_id, std::slice::from_ref(&result))
                    .await?;
            }
            Ok(Chunk::Committed(next))
        }
        Ok(None) => {
            debug!(group_id = %group_id, members = batch.len(), "group submitted concurrently; submitting this chunk's members one at a time");
            Ok(Chunk::Rejected(batch))
        }
        Err(err) => {
            debug!(group_id = %group_id, members = batch.len(), "chunk submission failed, submitting its members one at a time: {err}");
            Ok(Chunk::Rejected(batch))
        }
    }
}

/// Submit each of `alone` in its own transaction guarded on its run
/// record, as a re-submission of a single member would.
async fn submit_alone(
    core: &RuntimeCore,
    group_id: &RunId,
    alone: Vec<Candidate>,
    options: &RunOptions,
) -> Result<()> {
    stream::iter(alone)
        .map(|candidate| async move {
            let membership = Membership {
                group_id: group_id.clone(),
                key: candidate.member.key,
            };
            let spec = RunSpec {
                run_id: Some(membership.run_id()),
                input: candidate.member.input,
                options: options.clone(),
                effects: SettlementEffects::default(),
            };
            // A member that succeeded since the scan is answered by its
            // terminal record, not run again.
            core.submit_as(spec, Some(&membership), OnTerminated::KeepSucceeded)
                .await
                .map(drop)
        })
        .buffer_unordered(SUBMIT_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The counter value after `counter` (absent or undecodable counts as 0).
fn next_counter(counter: Option<&[u8]>) -> Vec<u8> {
    let current = counter
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
        .map_or(0, u64::from_be_bytes);
    current.wrapping_add(1).to_be_bytes().to_vec()
}

/// What the member records say of each key: [`Recorded::Active`] for a
/// member submitted and not terminated, `None` for a success (not to be
/// submitted again), [`Recorded::Idle`] otherwise.
fn recorded(status: Option<Option<TerminalStatus>>) -> Option<Recorded> {
    match status {
        None => Some(Recorded::Idle),
        Some(None) => Some(Recorded::Active),
        Some(Some(TerminalStatus::Succeeded)) => None,
        Some(Some(_)) => Some(Recorded::Idle),
    }
}

/// Pair each of `members` with what `states` (member key to its record's
/// status) says of it, leaving out succeeded members.
fn candidates<'a>(
    members: impl Iterator<Item = GroupMember> + 'a,
    states: &'a HashMap<String, Option<TerminalStatus>>,
) -> impl Iterator<Item = (GroupMember, Recorded)> + 'a {
    members.filter_map(|member| {
        recorded(states.get(&member.key).copied()).map(|recorded| (member, recorded))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use taquba::Queue;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::runner::{Step, StepError, StepOutcome, StepRunner};
    use crate::runtime::WorkflowRuntime;
    use crate::terminal::NoopTerminalHook;

    /// Succeeds at once, noting each run it starts.
    #[derive(Clone, Default)]
    struct Note(Arc<Mutex<Vec<RunId>>>);

    impl StepRunner for Note {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            self.0.lock().expect("lock").push(step.run_id.clone());
            Ok(StepOutcome::Succeed { result: Vec::new() })
        }
    }

    /// A submission that read the group before another one committed and
    /// its members succeeded must not run them again: its chunk's compare
    /// fails on the moved counter, and each member is then answered by its
    /// terminal record.
    #[tokio::test(start_paused = true)]
    async fn a_submission_from_a_stale_read_does_not_run_succeeded_members_again() {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runner = Note::default();
        let runtime =
            WorkflowRuntime::builder(queue, store, runner.clone(), NoopTerminalHook).build();
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        let group_id = RunId::new("g").expect("id");
        let members: Vec<GroupMember> = (0..3)
            .map(|i| GroupMember {
                key: format!("m{i}"),
                input: vec![i],
            })
            .collect();
        let options = RunOptions::default();
        let counter_key = group_submissions_kv_key(&group_id);
        let stale = read_state(&core, &group_id, &counter_key)
            .await
            .expect("read");

        submit_members(&core, &group_id, members.clone(), &options)
            .await
            .expect("submit");
        for member in &members {
            let run_id = crate::group::member_run_id(&group_id, &member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        submit_from(&core, &group_id, members.clone(), &options, stale)
            .await
            .expect("stale submit");
        for member in &members {
            let run_id = crate::group::member_run_id(&group_id, &member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        assert_eq!(
            runner.0.lock().expect("lock").len(),
            3,
            "each member ran once"
        );
        worker.shutdown().await.expect("shutdown");
    }

    #[test]
    fn the_counter_counts_up_from_absent_or_garbage() {
        assert_eq!(next_counter(None), 1u64.to_be_bytes());
        assert_eq!(next_counter(Some(&7u64.to_be_bytes())), 8u64.to_be_bytes());
        assert_eq!(next_counter(Some(b"bad")), 1u64.to_be_bytes());
    }

    #[test]
    fn succeeded_members_are_left_out_and_active_ones_marked() {
        let member = |key: &str| GroupMember {
            key: key.into(),
            input: Vec::new(),
        };
        let states = HashMap::from([
            ("ok".to_string(), Some(TerminalStatus::Succeeded)),
            ("failed".to_string(), Some(TerminalStatus::Failed)),
            ("cancelled".to_string(), Some(TerminalStatus::Cancelled)),
            ("running".to_string(), None),
        ]);
        let picked: Vec<(String, Recorded)> = candidates(
            ["ok", "failed", "cancelled", "running", "new"]
                .into_iter()
                .map(member),
            &states,
        )
        .map(|(m, r)| (m.key, r))
        .collect();
        assert_eq!(
            picked,
            vec![
                ("failed".to_string(), Recorded::Idle),
                ("cancelled".to_string(), Recorded::Idle),
                ("running".to_string(), Recorded::Active),
                ("new".to_string(), Recorded::Idle),
            ]
        );
    }
}
