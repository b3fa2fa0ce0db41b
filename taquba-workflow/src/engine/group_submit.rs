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
//! Which run. Every run of a member has the member's digest run id (0.13's
//! derivation). A member whose last run failed or was cancelled runs again
//! under it, and starts with nothing of the runs before it: its memo
//! entries (and run result record) are removed before the re-run's
//! transaction commits ([`clear_earlier_run`]), and its step-output replay
//! records and history name the execution that wrote them, which the re-run
//! is not. What to submit is read from the member record, which every
//! submission and termination of the member rewrites.
//!
//! Why the counter is enough. A submission reads the counter, then the
//! member records. A member that the records show as never submitted,
//! failed or cancelled can only become active through a submission of it,
//! and every member submission, in a chunk or alone, writes a new counter
//! value in its transaction; a chunk commits only if the counter still
//! holds the value read. So of two submissions that overlap, the later
//! chunk finds the counter moved, submits its members one at a time (each
//! guarded on its member record, a success answered by that record), and
//! reads the records again for the chunks left. (Submissions of one group
//! in this process also hold the group's lock, see
//! [`group_locks`](crate::coordination::group_locks); the counter keeps the
//! chunks sound without it.)
//!
//! The run-record read catches the one other way a member can be active: a
//! first run of a group forgotten by a release whose `forget` left running
//! members running, still going. It is left running and given its member
//! record back, guarded on its run record. A member that was active in the
//! records and is no longer (it terminated meanwhile) is submitted alone.

use std::collections::HashMap;

use futures_util::stream::{self, StreamExt, TryStreamExt};
use taquba::SettlementEffects;
use tracing::debug;

use crate::coordination::members::{HashedMember, Membership, new_counter_value, pending_member};
use crate::engine::RuntimeCore;
use crate::engine::submit::SubmittedAs;
use crate::error::{Error, Result};
use crate::model::RunOptions;
use crate::run::submit_batch::MAX_BATCH_BYTES;
use crate::settled::try_join_settled;
use crate::store::durable::{self, DurableMember};
use crate::store::keys::{RunId, group_submissions_kv_key, run_kv_key};

/// Members one transaction submits (fewer once their keys and inputs reach
/// [`MAX_BATCH_BYTES`]).
const CHUNK: usize = 256;
/// Attempts of a lone member submission whose guarded commit lost to a
/// concurrent writer of the member's records.
const ALONE_RETRIES: usize = 8;
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

/// A member to submit, with its input hash, what its record said and the
/// run that record calls for: the first run for a missing record, the one
/// after its last for an idle one, the active one for an active one.
struct Candidate {
    member: HashedMember,
    run_id: RunId,
    recorded: Recorded,
}

impl Candidate {
    fn membership(&self, group_id: &RunId) -> Membership {
        Membership {
            group_id: group_id.clone(),
            key: self.member.member.key.clone(),
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
/// [`Error::InvalidRunOptions`] for a concurrency key in `options`;
/// [`Error::InputMismatch`] for a member whose run is active with another
/// input; [`Error::MemberRunIdTaken`] for a member whose run id a run
/// outside the group holds; storage errors.
pub(crate) async fn submit_members(
    core: &RuntimeCore,
    group_id: &RunId,
    members: Vec<HashedMember>,
    options: &RunOptions,
) -> Result<()> {
    RuntimeCore::check_submission(options, &SettlementEffects::default())?;
    crate::coordination::keys::refuse_key(options, "a group's submission", "group members")?;
    let counter_key = group_submissions_kv_key(group_id);
    let state = read_state(core, group_id, &counter_key).await?;
    submit_from(core, group_id, members, options, state).await
}

/// The counter and member records [`read_state`] returns.
type GroupState = (Vec<u8>, HashMap<String, DurableMember>);

/// [`submit_members`] from `state`, read before any member's run record.
async fn submit_from(
    core: &RuntimeCore,
    group_id: &RunId,
    members: Vec<HashedMember>,
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
            bytes += member.member.key.len() + member.member.input.len();
            taken.push(member);
        }
        let chunk: Vec<Candidate> = candidates(group_id, taken.into_iter(), &states).collect();
        let Split {
            batch,
            mut alone,
            adopt,
        } = split_chunk(core, chunk).await?;
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
        alone.extend(adopt);
        submit_alone(core, group_id, alone, options).await?;
    }
    Ok(())
}

/// The group's submission counter, then each member record by key.
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
        .map(|m| (m.key, m.record))
        .collect();
    Ok((counter, states))
}

/// A chunk's members by what their run records say.
struct Split {
    /// Not active: committed together.
    batch: Vec<Candidate>,
    /// Active when the member records were read and no longer, or idle in
    /// the records and the run they call for active: submitted alone, so a
    /// success since is answered by its record and a run id held outside
    /// the group is refused.
    alone: Vec<Candidate>,
    /// Active without a member record (a first run of a forgotten group
    /// still going): submitted alone, which gives it its pending member
    /// record back.
    adopt: Vec<Candidate>,
}

/// Split `chunk` by the run records of the runs its members' records call
/// for. Members active with a member record are left running.
///
/// # Errors
/// [`Error::InputMismatch`] for a member without a record whose first run
/// is active with another input; storage errors.
async fn split_chunk(core: &RuntimeCore, chunk: Vec<Candidate>) -> Result<Split> {
    let read: Vec<(Candidate, bool)> = stream::iter(chunk)
        .map(|candidate| async move {
            let active = match core.view.run_record(&candidate.run_id).await? {
                Some(existing)
                    if candidate.recorded == Recorded::Missing
                        && !candidate.member.is_input(&existing.input_hash) =>
                {
                    return Err(Error::InputMismatch(candidate.run_id));
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
            (true, Recorded::Active) => {}
            (true, Recorded::Idle) | (false, Recorded::Active) => split.alone.push(candidate),
            (false, Recorded::Missing | Recorded::Idle) => split.batch.push(candidate),
        }
    }
    Ok(split)
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
    let reruns: Vec<RunId> = batch
        .iter()
        .filter(|candidate| candidate.recorded == Recorded::Idle)
        .map(|candidate| candidate.run_id.clone())
        .collect();
    try_join_settled(reruns, SUBMIT_CONCURRENCY, |run_id| async move {
        clear_earlier_run(core, &run_id).await
    })
    .await?;
    let next = new_counter_value();
    let mut merged = SettlementEffects::default();
    let mut submitted = Vec::with_capacity(batch.len());
    // The worker here claims the members' step 0 soon: it finds their
    // records in the claim path's cache instead of reading them back (each
    // ticket taken before the commit, see `record_cache`).
    let fill = options.run_at.is_none() && core.runs_worker();
    for candidate in &batch {
        let membership = candidate.membership(group_id);
        let (effects, job_id, record) = core.submission_effects(
            &candidate.run_id,
            candidate.member.member.input.clone(),
            &candidate.member.input_hash,
            options,
            SubmittedAs::Member(&membership),
            &SettlementEffects::default(),
        )?;
        // One enqueue per member (step 0), in member order.
        merged.enqueues.extend(effects.enqueues);
        merged.kv_writes.extend(effects.kv_writes);
        let cached = fill.then(|| (core.run_records.ticket(&candidate.run_id), record));
        submitted.push((candidate.run_id.clone(), job_id, cached));
    }
    // Each member's effects move the counter too; this chunk's value wins.
    merged.kv_writes.insert(counter_key.to_vec(), next.clone());
    match core
        .commits
        .compare_commit(counter_key, counter, merged)
        .await
    {
        Ok(Some(results)) => {
            #[cfg(feature = "metrics")]
            for candidate in &batch {
                crate::telemetry::metrics::run_submitted(
                    &core.queue_name,
                    core.workflow_name_of(&candidate.member.member.input)
                        .as_deref(),
                );
            }
            for ((run_id, job_id, cached), result) in submitted.into_iter().zip(results) {
                if let Some((ticket, record)) = cached {
                    core.run_records
                        .fill(ticket, &run_id, &job_id, std::sync::Arc::new(record));
                }
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

/// Remove what the earlier run of a member that is about to run again left
/// under its run id outside the queue: its memo entries, run result record
/// and replay records (the memo store's directory of the run). Called
/// before the re-run's transaction, with the group's lock held, so no
/// other submission of the member runs meanwhile; the earlier run has
/// terminated, so nothing writes there either. A crash after it and before
/// the commit leaves the member failed (or cancelled) without its result
/// record, which the next submission runs again.
///
/// # Errors
/// [`Error::Store`] when the object store cannot list or delete; the
/// member is then not submitted.
async fn clear_earlier_run(core: &RuntimeCore, run_id: &RunId) -> Result<()> {
    let removed = core.memo_store.clear_memos_for_run(run_id).await?;
    debug!(run_id = %run_id, removed, "cleared the memo entries of a member's earlier run before it runs again");
    Ok(())
}

/// Submit each of `alone` in its own transaction, as a re-submission of a
/// single member would ([`submit_member`]).
async fn submit_alone(
    core: &RuntimeCore,
    group_id: &RunId,
    alone: Vec<Candidate>,
    options: &RunOptions,
) -> Result<()> {
    try_join_settled(alone, SUBMIT_CONCURRENCY, |candidate| async move {
        let membership = candidate.membership(group_id);
        submit_member(core, &membership, &candidate.member, options).await
    })
    .await?;
    Ok(())
}

/// Submit one member, reading its member record first and guarding the
/// commit on it: a success is answered by the record (not run again); an
/// active run is left running (after checking it is this member's, with
/// this input); a failed or cancelled member runs as its next run; a member
/// without a record runs its first run, unless that run is still going (a
/// forgotten group's), which gets its pending member record back, guarded
/// on its run record. A commit that loses to a concurrent writer reads
/// again.
///
/// # Errors
/// [`Error::InputMismatch`] for another input; [`Error::MemberRunIdTaken`]
/// for a run id held by a run outside the group;
/// [`Error::InconsistentRunState`] when every attempt lost a race; storage
/// errors.
async fn submit_member(
    core: &RuntimeCore,
    membership: &Membership,
    member: &HashedMember,
    options: &RunOptions,
) -> Result<()> {
    let member_key = membership.kv_key();
    for _ in 0..ALONE_RETRIES {
        let guard = core.queue.view().kv_get(&member_key).await?;
        let record = guard.as_deref().and_then(|bytes| {
            durable::decode_or_absent::<DurableMember>(
                bytes,
                "group member record",
                &membership.key,
            )
        });
        let rerun = record.as_ref().is_some_and(|r| r.terminated.is_some());
        let run_id = match &record {
            None => membership.run_id(),
            Some(DurableMember {
                terminated: Some(termination),
                run_id,
                ..
            }) if termination.status == durable::DurableStatus::Succeeded => {
                if !member.is_input(&termination.input_hash) {
                    return Err(Error::InputMismatch(run_id.clone()));
                }
                return Ok(());
            }
            Some(DurableMember {
                terminated: Some(_),
                ..
            }) => membership.run_id(),
            Some(DurableMember { run_id, .. }) => run_id.clone(),
        };
        let run_key = run_kv_key(&run_id);
        if let Some(run_record) = core.queue.view().kv_get(&run_key).await? {
            if let Some((_, job)) = core.view.current_job(&run_id).await? {
                core.check_same_membership(&run_id, &job.headers, Some(membership))?;
            }
            let existing: durable::DurableRunRecord = durable::decode(&run_record)?;
            if !member.is_input(&existing.input_hash) {
                return Err(Error::InputMismatch(run_id));
            }
            if record.is_some() {
                // Running, as its record says (or a concurrent submission
                // started it since the read).
                return Ok(());
            }
            // A forgotten group's run still going: its record back.
            let pending = SettlementEffects::default().kv_put(
                member_key.clone(),
                durable::encode(&pending_member(membership, &run_id)),
            );
            if core
                .commits
                .compare_commit(&run_key, Some(&run_record), pending)
                .await?
                .is_some()
            {
                return Ok(());
            }
            continue;
        }
        if matches!(&record, Some(r) if r.terminated.is_none()) {
            // Active in the record, its run gone: it ended between the two
            // reads (its end rewrote the record); read again.
            continue;
        }
        if rerun {
            clear_earlier_run(core, &run_id).await?;
        }
        let (effects, job_id, _) = core.submission_effects(
            &run_id,
            member.member.input.clone(),
            &member.input_hash,
            options,
            SubmittedAs::Member(membership),
            &SettlementEffects::default(),
        )?;
        if let Some(results) = core
            .commits
            .compare_commit(&member_key, guard.as_deref(), effects)
            .await?
        {
            #[cfg(feature = "metrics")]
            crate::telemetry::metrics::run_submitted(
                &core.queue_name,
                core.workflow_name_of(&member.member.input).as_deref(),
            );
            core.submitted(run_id, job_id, &results).await?;
            return Ok(());
        }
    }
    Err(Error::InconsistentRunState(membership.run_id()))
}

/// What the member record of a member says ([`Recorded`]) and the run it
/// calls for; `None` for a success (not to be submitted again).
fn recorded(membership: &Membership, record: Option<&DurableMember>) -> Option<(Recorded, RunId)> {
    match record {
        None => Some((Recorded::Missing, membership.run_id())),
        Some(record) => match record.terminated.as_ref().map(|t| t.status) {
            None => Some((Recorded::Active, record.run_id.clone())),
            Some(durable::DurableStatus::Succeeded) => None,
            Some(_) => Some((Recorded::Idle, membership.run_id())),
        },
    }
}

/// Pair each of `members` with what its record in `states` says of it,
/// leaving out succeeded members.
fn candidates<'a>(
    group_id: &'a RunId,
    members: impl Iterator<Item = HashedMember> + 'a,
    states: &'a HashMap<String, DurableMember>,
) -> impl Iterator<Item = Candidate> + 'a {
    members.filter_map(move |member| {
        let membership = Membership {
            group_id: group_id.clone(),
            key: member.member.key.clone(),
        };
        recorded(&membership, states.get(&member.member.key)).map(|(recorded, run_id)| Candidate {
            member,
            run_id,
            recorded,
        })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use taquba::Queue;
    use taquba::object_store::memory::InMemory;

    use super::*;
    use crate::coordination::members::GroupMember;
    use crate::hooks::terminal::NoopTerminalHook;
    use crate::model::{StepError, StepOutcome};
    use crate::runner::{Step, StepRunner};
    use crate::runtime::WorkflowRuntime;
    use crate::store::keys::sha256;

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
        Vec<HashedMember>,
    ) {
        let store = Arc::new(InMemory::new());
        let queue = Arc::new(Queue::open(store.clone(), "db").await.expect("open"));
        let runtime = WorkflowRuntime::builder(queue, store, runner, NoopTerminalHook).build();
        let core = runtime.inner.core.clone();
        let worker = runtime.spawn(std::future::pending::<()>());
        let members = (0..3)
            .map(|i| {
                HashedMember::raw(GroupMember {
                    key: format!("m{i}"),
                    input: vec![i],
                })
            })
            .collect();
        (core, worker, RunId::new("g").expect("id"), members)
    }

    /// A submission that read the group before another one committed and
    /// its members succeeded must not run them again: its chunk's compare
    /// fails on the moved counter, and each member is then answered by its
    /// member record.
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
            let run_id = crate::coordination::members::member_run_id(&group_id, &member.member.key);
            core.wait_run(&run_id).await.expect("wait");
        }
        submit_from(&core, &group_id, members.clone(), &options, stale)
            .await
            .expect("stale submit");
        for member in &members {
            let run_id = crate::coordination::members::member_run_id(&group_id, &member.member.key);
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
        let chunk = candidates(&group_id, members.clone().into_iter(), &stale.1).collect();
        let Split { batch, .. } = split_chunk(&core, chunk).await.expect("split");
        assert_eq!(batch.len(), 3);

        submit_members(&core, &group_id, members.clone(), &options)
            .await
            .expect("submit");
        while runner.started.lock().expect("lock").len() < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // What `forget` removes (its members are running: the chunk below
        // is what must not start them again).
        core.group_store.remove(&group_id).await.expect("forget");
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
            let run_id = crate::coordination::members::member_run_id(&group_id, &member.member.key);
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
        let run_id = membership.run_id();
        let first = durable::encode(&pending_member(&membership, &run_id));
        let second = durable::encode(&pending_member(&membership, &run_id));
        assert_ne!(first, second);
    }

    #[test]
    fn succeeded_members_are_left_out_and_the_others_get_the_run_their_record_calls_for() {
        let group_id = RunId::new("g").expect("id");
        let membership = |key: &str| Membership {
            group_id: group_id.clone(),
            key: key.into(),
        };
        let member = |key: &str| {
            HashedMember::raw(GroupMember {
                key: key.into(),
                input: Vec::new(),
            })
        };
        let ended = |key: &str, status| DurableMember {
            run_id: membership(key).run_id(),
            terminated: Some(crate::store::durable::DurableTermination {
                status,
                error: None,
                error_kind: None,
                final_step: 0,
                terminated_at_ms: 0,
                input_hash: Vec::new(),
                submitted_at_ms: None,
                job_id: None,
                history: None,
                execution: None,
                workflow: None,
                group: None,
                cancel_reason: None,
                member: Some(membership(key).durable()),
                forked_from: None,
                concurrency: None,
                version: None,
                patches: Vec::new(),
                parent: None,
            }),
            key: None,
            version: None,
        };
        let states = HashMap::from([
            (
                "ok".to_string(),
                ended("ok", durable::DurableStatus::Succeeded),
            ),
            (
                "failed".to_string(),
                ended("failed", durable::DurableStatus::Failed),
            ),
            (
                "cancelled".to_string(),
                ended("cancelled", durable::DurableStatus::Cancelled),
            ),
            (
                "running".to_string(),
                pending_member(&membership("running"), &membership("running").run_id()),
            ),
        ]);
        let picked: Vec<(String, Recorded, RunId)> = candidates(
            &group_id,
            ["ok", "failed", "cancelled", "running", "new"]
                .into_iter()
                .map(member),
            &states,
        )
        .map(|c| (c.member.member.key, c.recorded, c.run_id))
        .collect();
        assert_eq!(
            picked,
            vec![
                (
                    "failed".to_string(),
                    Recorded::Idle,
                    membership("failed").run_id()
                ),
                (
                    "cancelled".to_string(),
                    Recorded::Idle,
                    membership("cancelled").run_id()
                ),
                (
                    "running".to_string(),
                    Recorded::Active,
                    membership("running").run_id()
                ),
                (
                    "new".to_string(),
                    Recorded::Missing,
                    membership("new").run_id()
                ),
            ]
        );
    }

    #[test]
    fn every_run_of_a_member_has_its_digest_run_id() {
        let membership = Membership {
            group_id: RunId::new("g").expect("id"),
            key: "k/1".into(),
        };
        assert_eq!(membership.run_id().as_str(), hex::encode(sha256(b"g/k/1")));
    }

    #[test]
    fn a_member_input_is_its_hash_or_the_digest_of_its_bytes() {
        let member = HashedMember {
            member: GroupMember {
                key: "k".into(),
                input: b"bytes".to_vec(),
            },
            input_hash: b"canonical".to_vec(),
        };
        assert!(member.is_input(b"canonical"));
        assert!(member.is_input(&sha256(b"bytes")));
        assert!(!member.is_input(&sha256(b"other bytes")));
    }
}
