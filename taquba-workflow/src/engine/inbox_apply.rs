//! The owner's side of the inbox: a maintenance round lists the inbox (when
//! [`InboxWatch`] says it may hold something new) through
//! [`InboxObjects`] (which never follows a link out of the store nor opens
//! what is not a regular file), then:
//!
//! 1. objects not named as a command are deleted;
//! 2. commands whose record says they were handled (before a crash or a
//!    failed delete) have only their object deleted;
//! 3. the others are read in id order, within a budget of objects and
//!    bytes, and decoded and validated;
//! 4. those that decode are applied first, in id order, each with its
//!    record committed in the same transaction as its first effect;
//! 5. those that do not (and those the apply rejects) are rejected in
//!    bulk: their records in one transaction per
//!    [`REJECTIONS_PER_COMMIT`], then their objects deleted.
//!
//! So junk in the inbox costs a share of one round, not a round each, and
//! never holds up a valid command behind it. Entries the listing passes
//! over (links, directories, FIFOs, names that are not object names) are
//! logged once each and left where they are. Storage errors leave a
//! command for the next round.

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, UNIX_EPOCH};

use futures_util::{StreamExt, stream};
use taquba::SettlementEffects;
use taquba::object_store::path::Path;
use tracing::{debug, warn};

use crate::engine::RuntimeCore;
use crate::engine::cancel::CancelRequest;
use crate::error::{Error, Result};
use crate::inbox::objects::{InboxEntry, InboxObjects, TouchSeen};
use crate::inbox::record::{DurableAnswer, DurableCommandRecord, DurableCommandState};
use crate::inbox::wire::{self, Received};
use crate::inbox::{Command, CommandAnswer, CommandId, MAX_COMMAND_SIZE};
use crate::model::{RunOptions, RunSpec};
use crate::run::compose::merge_effects;
use crate::store::durable;
use crate::store::keys::{RunId, command_kv_key};

/// Commands applied per maintenance round at most.
const COMMANDS_PER_ROUND: usize = 64;
/// Inbox entries listed per round at most. Not every store lists in name
/// order, so the listed entries are sorted before they are handled.
const MAX_LISTED: usize = 4096;
/// Command objects read per round at most (valid or not).
const READS_PER_ROUND: usize = MAX_LISTED;
/// Bytes of command objects read per round at most (at least one object
/// is read): what a round holds in memory.
const READ_BYTES_PER_ROUND: u64 = 16 * 1024 * 1024;
/// Command objects read (and command records looked up) at once.
const READ_CONCURRENCY: usize = 16;
/// Rejection records committed in one transaction at most.
pub(super) const REJECTIONS_PER_COMMIT: usize = 1024;
/// Names of passed-over inbox entries remembered, so each is logged once.
const LOGGED_NAMES: usize = 4096;
/// The longest a cancellation waits for the step it reached in one round
/// (a step claimed by another runtime over the queue); it resumes in the
/// next round, its request already recorded.
const CANCEL_STEP_WAIT: Duration = Duration::from_secs(1);

/// What a command object says about itself before it is read.
struct Envelope {
    id: CommandId,
    kind: &'static str,
    sent_at_ms: u64,
    sender: Option<String>,
}

impl Envelope {
    /// The envelope of a command whose object was not (or could not be)
    /// read.
    fn unread(id: &CommandId) -> Self {
        Self {
            id: id.clone(),
            kind: "unknown",
            sent_at_ms: id.timestamp_ms(),
            sender: None,
        }
    }
}

/// The longest the owner goes without listing the inbox when its touch
/// object did not change (a sender that wrote no touch, a touch lost).
const FULL_LIST_EVERY: Duration = Duration::from_secs(60);

/// When the owner lists the inbox: when the touch object senders rewrite
/// changed, when the last round left commands in it, and at least every
/// [`FULL_LIST_EVERY`]. A look at the touch is one HEAD request, a listing
/// one LIST (on S3 a tenth of the price of a LIST), so an idle owner
/// polling every 500 ms costs little.
#[derive(Debug, Default)]
pub(super) struct InboxWatch {
    state: std::sync::Mutex<WatchState>,
}

#[derive(Debug, Default)]
struct WatchState {
    /// The touch object's identity (ETag, modification time) at the last
    /// listing; `None` before the first.
    seen: Option<TouchSeen>,
    /// Whether the last listing left commands in the inbox.
    more: bool,
    /// When the inbox was last listed.
    listed_at: Option<tokio::time::Instant>,
    /// What was logged once (passed-over entries, a touch that is not a
    /// file), at most [`LOGGED_NAMES`].
    logged: HashSet<String>,
}

impl InboxWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Whether `what` is logged for the first time (remembered, unless
    /// [`LOGGED_NAMES`] are already: then it is not logged again either).
    pub(super) fn first_time(&self, what: &str) -> bool {
        let mut state = self.lock();
        if state.logged.contains(what) {
            return false;
        }
        if state.logged.len() == LOGGED_NAMES {
            return false;
        }
        state.logged.insert(what.to_string())
    }
}

/// A command read this round.
struct Read {
    id: CommandId,
    location: Path,
    outcome: ReadOutcome,
}

enum ReadOutcome {
    /// Handled before: only its object is left to delete.
    Handled,
    /// Gone since the listing.
    Gone,
    /// Decoded and validated.
    Valid(Box<Received>),
    /// Rejected without applying it.
    Invalid(Error),
    /// A storage error: left for the next round.
    Failed(Error),
}

/// The outcome of one round.
#[derive(Debug, Default)]
struct Round {
    /// Commands applied, rejected or found handled, and junk deleted.
    handled: usize,
    /// Whether the inbox holds more for the next round.
    more: bool,
}

impl RuntimeCore {
    /// The maintenance round's look at the inbox: list and apply it when the
    /// [`InboxWatch`] says so. Returns how many commands were handled.
    ///
    /// # Errors
    /// Storage errors of the look or the listing.
    pub(super) async fn poll_inbox(&self) -> Result<usize> {
        let inbox = InboxObjects::new(self.memo_store.objects());
        let touch = inbox.touch().await?;
        if let Some((None, what)) = &touch
            && self.inbox_watch.first_time("touch: not a file")
        {
            warn!(
                queue = %self.queue_name,
                "the inbox touch object is {what}, not a regular file: it is not opened; the inbox is listed every {FULL_LIST_EVERY:?} and when a round leaves commands"
            );
        }
        {
            let mut state = self.inbox_watch.lock();
            let due = state.seen.as_ref() != Some(&touch)
                || state.more
                || state
                    .listed_at
                    .is_none_or(|at| at.elapsed() >= FULL_LIST_EVERY);
            if !due {
                return Ok(0);
            }
            // Noted before the listing: a touch written during it changes
            // it again, and the next round lists again.
            state.seen = Some(touch);
            state.listed_at = Some(tokio::time::Instant::now());
        }
        let round = self.apply_inbox_round(&inbox).await?;
        self.inbox_watch.lock().more = round.more;
        Ok(round.handled)
    }

    /// Apply the inbox's pending commands now (at most
    /// [`COMMANDS_PER_ROUND`]); returns how many were handled (applied,
    /// rejected or found handled).
    ///
    /// # Errors
    /// Storage errors of the listing (a command's own errors are logged and
    /// leave it for the next round, without holding up the others).
    pub(crate) async fn apply_inbox(&self) -> Result<usize> {
        let inbox = InboxObjects::new(self.memo_store.objects());
        Ok(self.apply_inbox_round(&inbox).await?.handled)
    }

    /// One round over the inbox (see the module documentation).
    async fn apply_inbox_round(&self, inbox: &InboxObjects) -> Result<Round> {
        let listing = inbox.list(MAX_LISTED).await?;
        for skipped in &listing.skipped {
            if self.inbox_watch.first_time(skipped) {
                warn!(
                    queue = %self.queue_name,
                    dir = %inbox.dir(),
                    "an inbox entry passed over and left in place: {skipped}"
                );
            }
        }
        let mut round = Round {
            more: listing.truncated,
            ..Round::default()
        };
        let mut entries = listing.entries;
        entries.sort_by(|a, b| a.location.cmp(&b.location));
        let dir = inbox.dir();
        let mut junk = Vec::new();
        let mut candidates: VecDeque<(CommandId, InboxEntry)> = VecDeque::new();
        let mut ids = HashSet::new();
        for entry in entries {
            match command_id_of(&dir, &entry.location) {
                None => junk.push(entry.location),
                // A second object of one command (its id in another case):
                // handled once the first is.
                Some(id) if !ids.insert(id.clone()) => round.more = true,
                Some(id) => candidates.push_back((id, entry)),
            }
        }
        if !junk.is_empty() {
            warn!(queue = %self.queue_name, count = junk.len(), first = %junk[0], "inbox objects that are not named as commands; deleted");
            round.handled += junk.len();
        }

        let (reads, left) = self.read_commands(inbox, candidates).await;
        round.more |= left;
        let mut done = junk;
        let mut rejections: Vec<(Envelope, Path, Error)> = Vec::new();
        let mut valid = Vec::new();
        for read in reads {
            match read.outcome {
                ReadOutcome::Handled => {
                    round.handled += 1;
                    done.push(read.location);
                }
                ReadOutcome::Gone => round.handled += 1,
                ReadOutcome::Invalid(err) => {
                    rejections.push((Envelope::unread(&read.id), read.location, err));
                }
                ReadOutcome::Failed(err) => {
                    self.note_error(&err);
                    if self.store_closed.is_cancelled() {
                        return Err(err);
                    }
                    warn!(path = %read.location, "inbox command left for the next round: {err}");
                    round.more = true;
                }
                ReadOutcome::Valid(received) => valid.push((read.id, read.location, *received)),
            }
        }

        // The commands that decode first, in id order.
        for (id, location, received) in valid {
            let envelope = Envelope {
                id: id.clone(),
                kind: received.command.kind(),
                sent_at_ms: received.sent_at_ms,
                sender: received.sender.clone(),
            };
            match self.apply_command(&envelope, received).await {
                Ok(Some(answer)) => {
                    debug!(command = %id, kind = envelope.kind, ?answer, "inbox command applied");
                    round.handled += 1;
                    done.push(location);
                }
                // Accepted: finished in a later round.
                Ok(None) => round.more = true,
                Err(err) if err.is_permanent() => rejections.push((envelope, location, err)),
                Err(err) => {
                    self.note_error(&err);
                    if self.store_closed.is_cancelled() {
                        return Err(err);
                    }
                    warn!(command = %id, "inbox command left for the next round: {err}");
                    round.more = true;
                }
            }
        }

        // Then the rest, rejected in bulk.
        for chunk in rejections.chunks(REJECTIONS_PER_COMMIT) {
            match self.reject_all(chunk).await {
                Ok(()) => {
                    round.handled += chunk.len();
                    done.extend(chunk.iter().map(|(_, location, _)| location.clone()));
                }
                Err(err) => {
                    self.note_error(&err);
                    if self.store_closed.is_cancelled() {
                        return Err(err);
                    }
                    warn!(
                        count = chunk.len(),
                        "inbox rejections left for the next round: {err}"
                    );
                    round.more = true;
                }
            }
        }
        if let Err(err) = inbox.delete_all(done).await {
            // Their records say they were handled: the next round deletes
            // what is left.
            warn!(queue = %self.queue_name, "deleting handled inbox objects failed: {err}");
            round.more = true;
        }
        Ok(round)
    }

    /// Look up the records of `candidates` and read the objects of those
    /// not handled yet, in id order, until [`COMMANDS_PER_ROUND`] decode,
    /// [`READS_PER_ROUND`] are read or [`READ_BYTES_PER_ROUND`] bytes are;
    /// with whether candidates are left for the next round.
    async fn read_commands(
        &self,
        inbox: &InboxObjects,
        candidates: VecDeque<(CommandId, InboxEntry)>,
    ) -> (Vec<Read>, bool) {
        let total = candidates.len();
        let mut reads = Vec::new();
        let (mut valid, mut read, mut bytes) = (0, 0, 0u64);
        let mut looked = stream::iter(candidates)
            .map(|(id, entry)| self.read_command(inbox, id, entry))
            .buffered(READ_CONCURRENCY);
        while let Some((next, cost)) = looked.next().await {
            if matches!(next.outcome, ReadOutcome::Valid(_)) {
                valid += 1;
            }
            read += usize::from(cost > 0);
            bytes = bytes.saturating_add(cost);
            reads.push(next);
            if valid == COMMANDS_PER_ROUND
                || read >= READS_PER_ROUND
                || bytes >= READ_BYTES_PER_ROUND
            {
                // Reads in flight are dropped: their objects are read again
                // next round.
                break;
            }
        }
        let left = reads.len() < total;
        (reads, left)
    }

    /// Look up command `id`'s record and, when it is not handled, read and
    /// decode its object; with the bytes read.
    async fn read_command(
        &self,
        inbox: &InboxObjects,
        id: CommandId,
        entry: InboxEntry,
    ) -> (Read, u64) {
        let location = entry.location;
        let outcome = |outcome| Read {
            id: id.clone(),
            location: location.clone(),
            outcome,
        };
        let record_key = command_kv_key(&id.to_string());
        let record = durable::kv_record::<DurableCommandRecord>(self.queue.view(), &record_key)
            .await
            .unwrap_or_else(|err| {
                warn!(command = %id, "command record does not decode ({err}); the command is treated as handled");
                None
            });
        if record.as_ref().is_some_and(DurableCommandRecord::is_final) {
            return (outcome(ReadOutcome::Handled), 0);
        }
        let size = usize::try_from(entry.size).unwrap_or(usize::MAX);
        if size > MAX_COMMAND_SIZE {
            return (outcome(ReadOutcome::Invalid(wire::oversized(size))), 0);
        }
        let bytes = match inbox.read(&location).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return (outcome(ReadOutcome::Gone), 0),
            Err(err) => return (outcome(ReadOutcome::Failed(err)), 0),
        };
        let cost = u64::try_from(bytes.len()).unwrap_or(u64::MAX).max(1);
        let decoded = wire::decode(&id, &bytes).and_then(|received| {
            self.check_received(&received)?;
            Ok(received)
        });
        let read = match decoded {
            Ok(received) => outcome(ReadOutcome::Valid(Box::new(received))),
            Err(err) => outcome(ReadOutcome::Invalid(err)),
        };
        (read, cost)
    }

    /// What the owner checks of a decoded command beyond its fields (which
    /// [`wire::decode`] checked as the in-process API checks its
    /// arguments): a submit's input against what the runner hosts.
    fn check_received(&self, received: &Received) -> Result<()> {
        if let Command::Submit(submit) = &received.command {
            self.ops
                .hosted
                .check(&submit.input)
                .map_err(Error::InvalidCommand)?;
        }
        Ok(())
    }

    /// Apply `received`; `Ok(None)` when its effect is committed and its
    /// answer comes in a later round.
    async fn apply_command(
        &self,
        envelope: &Envelope,
        received: Received,
    ) -> Result<Option<CommandAnswer>> {
        match received.command {
            Command::Submit(submit) => {
                let run_id = submit.run_id.unwrap_or_else(|| self.new_run_id());
                let spec = RunSpec {
                    run_id: Some(run_id.clone()),
                    input: submit.input,
                    options: RunOptions {
                        headers: submit.headers,
                        priority: submit.priority,
                        max_attempts_per_step: submit.max_attempts_per_step,
                        run_at: submit
                            .run_at_ms
                            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                        concurrency_key: None,
                        concurrency_limit: None,
                    },
                    effects: SettlementEffects::default(),
                };
                let answer = CommandAnswer::Submitted {
                    run_id: run_id.clone(),
                    newly_submitted: true,
                };
                let with_submission = self.command_record(envelope, applied(&answer));
                let outcome = self.submit_recorded(spec, with_submission).await?;
                if outcome.newly_submitted {
                    return Ok(Some(answer));
                }
                // A duplicate: nothing committed, so the record goes alone.
                let answer = CommandAnswer::Submitted {
                    run_id,
                    newly_submitted: false,
                };
                self.commit_record(envelope, applied(&answer)).await?;
                Ok(Some(answer))
            }
            Command::Cancel { run_id, reason } => self.apply_cancel(envelope, run_id, reason).await,
            Command::PauseSchedule { name } => self.apply_schedule(envelope, &name, true).await,
            Command::ResumeSchedule { name } => self.apply_schedule(envelope, &name, false).await,
            Command::Signal {
                correlation_key,
                payload,
            } => {
                let (outcome, run_id) = self
                    .signal_recorded(&correlation_key, payload, None, |outcome, run_id| {
                        self.command_record(
                            envelope,
                            applied(&CommandAnswer::Signalled {
                                outcome,
                                run_id: run_id.cloned(),
                            }),
                        )
                    })
                    .await?;
                Ok(Some(CommandAnswer::Signalled { outcome, run_id }))
            }
            Command::SignalRun {
                run_id,
                correlation_key,
                payload,
            } => {
                let (outcome, run_id) = self
                    .signal_recorded(
                        &correlation_key,
                        payload,
                        Some(&run_id),
                        |outcome, run_id| {
                            self.command_record(
                                envelope,
                                applied(&CommandAnswer::Signalled {
                                    outcome,
                                    run_id: run_id.cloned(),
                                }),
                            )
                        },
                    )
                    .await
                    // Not waiting is final for a command: a retry in a later
                    // round could wake a later wait the sender never meant.
                    .map_err(|err| match err {
                        Error::NotWaitingForSignal { .. } => Error::CommandRefused(err.to_string()),
                        err => err,
                    })?;
                Ok(Some(CommandAnswer::Signalled { outcome, run_id }))
            }
            Command::Requeue { run_id } => {
                let (step, job_id) = self
                    .requeue_recorded(&run_id, |step, job_id| {
                        self.command_record(
                            envelope,
                            applied(&CommandAnswer::Requeued {
                                run_id: run_id.clone(),
                                step,
                                job_id: job_id.to_string(),
                            }),
                        )
                    })
                    .await?;
                Ok(Some(CommandAnswer::Requeued {
                    run_id,
                    step,
                    job_id,
                }))
            }
            Command::Fork {
                run_id,
                from_step,
                new_run_id,
            } => {
                // The command's id names the fork when the sender named
                // none: applied again after a crash, it finds the fork made.
                let new_run_id = match new_run_id {
                    Some(id) => id,
                    None => RunId::new(envelope.id.to_string())?,
                };
                let options = crate::fork::ForkOptions::new().run_id(new_run_id);
                let made = self.fork(&run_id, from_step, &options).await?;
                let answer = CommandAnswer::Forked {
                    run_id,
                    from_step,
                    new_run_id: made.run_id,
                };
                self.commit_record(envelope, applied(&answer)).await?;
                Ok(Some(answer))
            }
        }
    }

    /// Pause (`paused`) or resume a schedule, then record the answer. Both
    /// are idempotent, so a round that ends between the two commits is
    /// redone whole by the next.
    async fn apply_schedule(
        &self,
        envelope: &Envelope,
        name: &str,
        paused: bool,
    ) -> Result<Option<CommandAnswer>> {
        let info = self.set_schedule_paused(name, paused).await?;
        let answer = CommandAnswer::Schedule {
            name: info.name,
            paused: info.paused,
            next_fire_ms: info.next_fire_ms,
        };
        self.commit_record(envelope, applied(&answer)).await?;
        Ok(Some(answer))
    }

    /// Apply a cancellation: the request is recorded with the command's
    /// `Accepted` record, then the step is reached within
    /// [`CANCEL_STEP_WAIT`]; the answer is recorded once it is known. A
    /// command found `Accepted` (a round that ended before the answer)
    /// resumes with the request already recorded.
    async fn apply_cancel(
        &self,
        envelope: &Envelope,
        run_id: RunId,
        reason: Option<String>,
    ) -> Result<Option<CommandAnswer>> {
        let request = CancelRequest {
            reason,
            with_request: self.command_record(envelope, DurableCommandState::Accepted),
        };
        let reached =
            tokio::time::timeout(CANCEL_STEP_WAIT, self.cancel_as(&run_id, request)).await;
        let cancelled = match reached {
            Ok(Ok(reached)) => reached.unwrap_or(false),
            // A storage error is retried next round (the request may be
            // recorded: the retry finds it); any other rejects the command.
            Ok(Err(err)) => return Err(err),
            Err(_) => return Ok(None),
        };
        let answer = CommandAnswer::Cancelled { run_id, cancelled };
        self.commit_record(envelope, applied(&answer)).await?;
        Ok(Some(answer))
    }

    /// The effects that record `state` for the command of `envelope`, with
    /// its retention entry once the state is final.
    fn command_record(&self, envelope: &Envelope, state: DurableCommandState) -> SettlementEffects {
        let at_ms = self.now_ms();
        let record = DurableCommandRecord {
            kind: envelope.kind.to_string(),
            state,
            at_ms,
            sent_at_ms: envelope.sent_at_ms,
            sender: envelope.sender.clone(),
        };
        let id = envelope.id.to_string();
        let effects =
            SettlementEffects::default().kv_put(command_kv_key(&id), durable::encode(&record));
        if record.is_final() {
            effects.expiry_entry(&self.command_expiry, at_ms, id.as_bytes())
        } else {
            effects
        }
    }

    async fn commit_record(&self, envelope: &Envelope, state: DurableCommandState) -> Result<()> {
        self.commits
            .commit(self.command_record(envelope, state))
            .await?;
        Ok(())
    }

    /// Record the rejections of `chunk` in one transaction.
    async fn reject_all(&self, chunk: &[(Envelope, Path, Error)]) -> Result<()> {
        let mut effects = SettlementEffects::default();
        for (envelope, _, err) in chunk {
            warn!(command = %envelope.id, kind = envelope.kind, "inbox command rejected: {err}");
            merge_effects(
                &mut effects,
                self.command_record(
                    envelope,
                    DurableCommandState::Rejected {
                        error: err.to_string(),
                    },
                ),
            );
        }
        self.commits.commit(effects).await?;
        Ok(())
    }

    /// One pass of the command retention sweep.
    pub(super) async fn sweep_commands(&self) -> Result<usize> {
        let now = self.now_ms();
        Ok(self
            .command_expiry
            .pass(
                &self.queue,
                now,
                self.ops.command_retention,
                |_, suffix| async move {
                    let id = String::from_utf8_lossy(&suffix).into_owned();
                    taquba::Expired::Delete(
                        SettlementEffects::default().kv_delete(command_kv_key(&id)),
                    )
                },
            )
            .await?)
    }
}

fn applied(answer: &CommandAnswer) -> DurableCommandState {
    DurableCommandState::Applied {
        answer: DurableAnswer::from(answer),
    }
}

/// The command an inbox object at `location` is: a file directly in the
/// inbox directory `dir` named `{ULID}.msgpack` (the ULID in any case).
/// Anything else under the directory (a nested object, another name) is
/// not a command.
fn command_id_of(dir: &Path, location: &Path) -> Option<CommandId> {
    let mut rest = location.prefix_match(dir)?;
    let name = rest.next()?;
    if rest.next().is_some() {
        return None;
    }
    name.as_ref().strip_suffix(".msgpack")?.parse().ok()
}
