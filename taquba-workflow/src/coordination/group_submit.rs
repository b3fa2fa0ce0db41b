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
//! run id, and every member submission, in a chunk or alone, writes a new
//! counter value in its transaction; a chunk commits only if the counter
//! still holds the value read. So of two submissions that overlap, the
//! later chunk finds the counter moved, submits its members one at a time
//! (each guarded on its run record, a success answered by its terminal
//! record), and reads the records again for the chunks left.
//!
//! The run-record read catches the one other way a member can be active: a
//! run of a forgotten group still going. It is left running and given its
//! member record back, guarded on its run record. Such a run ending between
//! that read and a chunk's commit is started afresh, as members of a
//! forgotten group are. A member that was active in the records and is no
//! longer (it terminated meanwhile) is submitted alone.

use std::collections::HashMap;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use taquba::SettlementEffects;
use tracing::debug;

use crate::coordination::group::{GroupMember, Membership};
use crate::error::{Error, Result};
use crate::model::TerminalStatus;
use crate::model::{RunOptions, RunSpec};
use crate::run::core::{OnTerminated, RuntimeCore};
use crate::run::submit_batch::MAX_BATCH_BYTES;
use crate::settled::try_join_settled;
use crate::store::durable;
use crate::store::keys::{RunId, group_submissions_kv_key, run_kv_key, sha256};

/// Members one transaction submits (fewer once their keys and inputs reach
/// [`MAX_BATCH_BYTES`]).
const CHUNK: usize = 256;
/// Attempts to give a running member its record back while its run record
/// keeps changing under the compare.
const ADOPT_RETRIES: usize = 8;
/// Member submissions (reads or lone commits) in flight at once; each waits
/// for the store, and concurrent commits share WAL flushes.
pub(crate) const SUBMIT_CONCURRENCY: usize = 32;

/// What the group's member records said of a member before submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    /// No record: never submitted, or forgotten (perhaps while running).
    Missing,
    /// A termination other than a success: nothing but a submission can
    /// make it active.
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

impl Candidate {
    fn new((member, recorded): (GroupMember, Recorded)) -> Self {
        Self {
            input_hash: sha256(&member.input).to_vec(),
            member,
            recorded,
        }
    }
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
type GroupState = (Vec<u8>, HashMap<String, Option<TerminalStatus>>);

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
            .map(Candidate::new)
            .collect();
        let Split {
            batch,
            mut alone,
            adopt,
        } = split_chunk(core, group_id, chunk).await?;
        if !batch.is_empty() {
            match commit_chunk(core, group_id, &counter_key, Some(&counter), batch, options).await?
            {
                Chunk::Committed(next) => counter = next,
                Chunk::Rejected(rejected) => {
                    alone.extend(rejected);
                    (counter, states) = read_state(core, group_id, &counter_key).await?;
                }
            }
        }
        submit_alone(core, group_id, alone, options).await?;
        adopt_running(core, group_id, adopt, options).await?;
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
    let counter = match core.queue.view().kv_get(counter_key).await? {
        Some(value) => value.to_vec(),
        // Never compared against "absent": `forget` deletes the counter,
        // so absent could come back after a submission that followed this
        // read. A group's first submission (or the first after `forget`)
        // creates it; whichever creation commits first is the value.
        None => {
            let value = new_counter_value();
            let create = SettlementEffects::default().kv_put(counter_key.to_vec(), value.clone());
            match core
                .commits
                .compare_commit(counter_key, None, create)
                .await?
            {
                Some(_) => value,
                None => core
                    .queue
                    .view()
                    .kv_get(counter_key)
                    .await?
                    .map(|v| v.to_vec())
                    // Created and deleted again by a `forget` meanwhile: a
                    // value nothing holds, so the first chunk goes alone.
                    .unwrap_or_default(),
            }
        }
    };
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

/// A chunk's members by what their run records say.
struct Split {
    /// Not active: committed together.
    batch: Vec<Candidate>,
    /// Active when the member records were read and no longer: submitted
    /// alone, so a success since is answered by its terminal record.
    alone: Vec<Candidate>,
    /// Active without a member record (a run of a forgotten group still
    /// going): given its pending member record back.
    adopt: Vec<Candidate>,
}

/// Split `chunk` by its members' run records. Members active with a member
/// record are left running.
///
/// # Errors
/// [`Error::InputMismatch`] for an active member with another input;
/// storage errors.
async fn split_chunk(core: &RuntimeCore, group_id: &RunId, chunk: Vec<Candidate>) -> Result<Split> {
    let read: Vec<(Candidate, bool)> = stream::iter(chunk)
        .map(|candidate| async move {
            let run_id = crate::coordination::group::member_run_id(group_id, &candidate.member.key);
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
    let mut split = Split {
        batch: Vec::with_capacity(read.len()),
        alone: Vec::new(),
        adopt: Vec::new(),
    };
    for (candidate, active) in read {
        match (active, candidate.recorded) {
            (true, Recorded::Missing) => split.adopt.push(candidate),
            (true, _) => {}
            (false, Recorded::Missing | Recorded::Idle) => split.batch.push(candidate),
            (false, Recorded::Active) => split.alone.push(candidate),
        }
    }
    Ok(split)
}

/// Write the pending member record of each of `adopt`, runs still going
/// whose record a `forget` removed, so `results` and `status` count them
/// again. Each write is guarded on the run record as read, so a run that
/// ended meanwhile (its end writes the record) is not marked pending; such
/// a member is submitted as a lone member would be.
async fn adopt_running(
    core: &RuntimeCore,
    group_id: &RunId,
    adopt: Vec<Candidate>,
    options: &RunOptions,
) -> Result<()> {
    let ended: Vec<Option<Candidate>> =
        try_join_settled(adopt, SUBMIT_CONCURRENCY, |candidate| async move {
            let membership = Membership {
                group_id: group_id.clone(),
                key: candidate.member.key.clone(),
            };
            let run_id = membership.run_id();
            let run_key = run_kv_key(&run_id);
            for _ in 0..ADOPT_RETRIES {
                let Some(record) = core.queue.view().kv_get(&run_key).await? else {
                    return Ok(Some(candidate));
                };
                // Only this member's own run is taken back: a plain run
                // (or another group's member) under the digest is not it.
                if let Some((_, job)) = core.view.current_job(&run_id).await? {
                    core.check_same_membership(&run_id, &job.headers, Some(&membership))?;
                }
                let pending = SettlementEffects::default().kv_put(
                    membership.kv_key(),
                    durable::encode(&crate::coordination::group::pending_member(&membership)),
                );
                if core
                    .commits
                    .compare_commit(&run_key, Some(&record), pending)
                    .await?
                    .is_some()
                {
                    return Ok(None);
                }
            }
            Err(Error::InconsistentRunState(run_id))
        })
        .await?;
    submit_alone(
        core,
        group_id,
        ended.into_iter().flatten().collect(),
        options,
    )
    .await
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
    let next = new_counter_value();
    let mut merged = SettlementEffects::default();
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
    // Each member's effects move the counter too; this chunk's value wins.
    merged.kv_writes.insert(counter_key.to_vec(), next.clone());
    match core
        .commits
        .compare_commit(counter_key, counter, merged)
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
    try_join_settled(alone, SUBMIT_CONCURRENCY, |candidate| async move {
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
    .await?;
    Ok(())
}

/// A value the submission counter never held before (a new ULID): every
/// member submission writes one, so a compare against a value read earlier
/// fails after any submission in between.
pub(crate) fn new_counter_value() -> Vec<u8> {
    ulid::Ulid::new().to_bytes().to_vec()
}

/// What the member records say of each key: [`Recorded::Active`] for a
/// member submitted and not terminated, `None` for a success (not to be
/// submitted again), [`Recorded::Idle`] otherwise.
fn recorded(status: Option<Option<TerminalStatus>>) -> Option<Recorded> {
    match status {
        None => Some(Recorded::Missing),
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
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;

    /// Succeeds at once, noting each run it starts.
    #[derive(Clone, Default)]
    struct Note(Arc<Mutex<Vec<RunId>>>);

    impl StepRunner for Note {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            self.0.lock().expect("lock").push(step.run_id.clone());
            Ok(StepOutcome::Succeed { result: Vec::new() })
        }
    }

    /// A runtime over an in-memory store running `runner`, its engine and
    /// worker, a group id and three members.
    async fn started<R: StepRunner + 'static>(
        runner: R,
    ) -> (
        Arc<RuntimeCore>,
        crate::RunnerHandle,
        RunId,
        Vec<GroupMember>,
    ) {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        let members = (0..3)
            .map(|i| GroupMember {
                key: format!("m{i}"),
                input: vec![i],
            })
            .collect();
        (core, worker, RunId::new("g").expect("id"), members)
    }

    /// A submission that read the group before another one committed and
    /// its members succeeded must not run them again: its chunk's compare
    /// fails on the moved counter, and each member is then answered by its
    /// terminal record.
    #[tokio::test(start_paused = true)]
    async fn a_submission_from_a_stale_read_does_not_run_succeeded_members_again() {
        let runner = Note::default();
        let (core, worker, group_id, members) = started(runner.clone()).await;
        let options = RunOptions::default();
        let counter_key = group_submissions_kv_key(&group_id);
        let stale = read_state(&core, &group_id, &counter_key)
            .await
            .expect("read");

        submit_members(&core, &group_id, members.clone(), &options)
            .await
            .expect("submit");
        for member in &members {
            let run_id = crate::coordination::group::member_run_id(&group_id, &member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        submit_from(&core, &group_id, members.clone(), &options, stale)
            .await
            .expect("stale submit");
        for member in &members {
            let run_id = crate::coordination::group::member_run_id(&group_id, &member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        assert_eq!(
            runner.0.lock().expect("lock").len(),
            3,
            "each member ran once"
        );
        worker.shutdown().await.expect("shutdown");
    }

    /// Holds every step until the gate opens, noting each run it starts.
    #[derive(Clone)]
    struct Held {
        started: Arc<Mutex<Vec<RunId>>>,
        gate: tokio::sync::watch::Receiver<bool>,
    }

    impl StepRunner for Held {
        async fn run_step(&self, step: &Step) -> std::result::Result<StepOutcome, StepError> {
            self.started.lock().expect("lock").push(step.run_id.clone());
            let mut gate = self.gate.clone();
            gate.wait_for(|open| *open).await.expect("gate");
            Ok(StepOutcome::Succeed { result: Vec::new() })
        }
    }

    /// A chunk read before another submission started its members and a
    /// `forget` removed the counter must not commit (it would start the
    /// running members a second time): the counter it compares against is
    /// never "absent", which `forget` brings back.
    #[tokio::test(start_paused = true)]
    async fn a_chunk_read_before_a_submission_and_a_forget_does_not_commit() {
        let (open, gate) = tokio::sync::watch::channel(false);
        let runner = Held {
            started: Arc::default(),
            gate,
        };
        let (core, worker, group_id, members) = started(runner.clone()).await;
        let options = RunOptions::default();
        let counter_key = group_submissions_kv_key(&group_id);
        let stale = read_state(&core, &group_id, &counter_key)
            .await
            .expect("read");
        // This submission's chunk, split before any member ran: all to be
        // committed together.
        let chunk = candidates(members.clone().into_iter(), &stale.1)
            .map(Candidate::new)
            .collect();
        let Split { batch, .. } = split_chunk(&core, &group_id, chunk).await.expect("split");
        assert_eq!(batch.len(), 3);

        submit_members(&core, &group_id, members.clone(), &options)
            .await
            .expect("submit");
        while runner.started.lock().expect("lock").len() < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        core.group_store.forget(&group_id).await.expect("forget");
        let Chunk::Rejected(rejected) = commit_chunk(
            &core,
            &group_id,
            &counter_key,
            Some(&stale.0),
            batch,
            &options,
        )
        .await
        .expect("commit") else {
            panic!("a chunk read before the group was submitted and forgotten committed");
        };
        assert_eq!(rejected.len(), 3);
        open.send_replace(true);
        for member in &members {
            let run_id = crate::coordination::group::member_run_id(&group_id, &member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        assert_eq!(runner.started.lock().expect("lock").len(), 3);
        worker.shutdown().await.expect("shutdown");
    }

    /// Two pending records of one member differ, so a lone submission
    /// guarded on the record it read fails after another submission's
    /// write (the same bytes again would let both commit).
    #[test]
    fn every_write_of_a_member_record_is_distinct() {
        let membership = Membership {
            group_id: RunId::new("g").expect("id"),
            key: "m".into(),
        };
        let first = durable::encode(&crate::coordination::group::pending_member(&membership));
        let second = durable::encode(&crate::coordination::group::pending_member(&membership));
        assert_ne!(first, second);
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
                ("new".to_string(), Recorded::Missing),
            ]
        );
    }
}
