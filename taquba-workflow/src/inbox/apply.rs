//! The owner's side of the inbox: a maintenance round lists the inbox (when
//! [`InboxWatch`] says it may hold something new), and for each command object (in id order) skips it when its record says
//! it was handled, else decodes and validates it and applies it with its
//! record committed in the same transaction as its first effect, then
//! deletes the object. Errors of a command's input reject it with a
//! recorded error; storage errors leave it for the next round.

use std::time::{Duration, UNIX_EPOCH};

use futures_util::TryStreamExt;
use taquba::SettlementEffects;
use taquba::object_store::ObjectMeta;
use taquba::object_store::path::Path;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::inbox::record::{DurableAnswer, DurableCommandRecord, DurableCommandState};
use crate::inbox::wire::{self, Received};
use crate::inbox::{
    Command, CommandAnswer, CommandId, MAX_COMMAND_SIZE, inbox_dir, inbox_touch_path,
};
use crate::model::{RunOptions, RunSpec};
use crate::run::cancel::CancelRequest;
use crate::run::core::RuntimeCore;
use crate::store::durable;
use crate::store::keys::{RunId, command_kv_key};

/// Commands applied per maintenance round at most.
const COMMANDS_PER_ROUND: usize = 64;
/// Inbox entries listed per round at most. Not every store lists in name
/// order, so the listed entries are sorted before the first
/// [`COMMANDS_PER_ROUND`] are applied.
const MAX_LISTED: usize = 4096;
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

/// The longest the owner goes without listing the inbox when its touch
/// object did not change (a sender that wrote no touch, a touch lost).
const FULL_LIST_EVERY: Duration = Duration::from_secs(60);

/// When the owner lists the inbox: when the touch object senders rewrite
/// changed, when the last round left commands in it, and at least every
/// [`FULL_LIST_EVERY`]. A look at the touch is one HEAD request, a listing
/// one LIST (on S3 a tenth of the price of a LIST), so an idle owner
/// polling every 500 ms costs little.
#[derive(Debug, Default)]
pub(crate) struct InboxWatch {
    state: std::sync::Mutex<WatchState>,
}

#[derive(Debug, Default)]
struct WatchState {
    /// The touch object's identity (ETag, modification time) at the last
    /// listing; `None` before the first.
    seen: Option<Option<(Option<String>, String)>>,
    /// Whether the last listing left commands in the inbox.
    more: bool,
    /// When the inbox was last listed.
    listed_at: Option<tokio::time::Instant>,
}

impl InboxWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl RuntimeCore {
    /// The maintenance round's look at the inbox: list and apply it when the
    /// [`InboxWatch`] says so. Returns how many commands were handled.
    ///
    /// # Errors
    /// Storage errors of the look or the listing.
    pub(crate) async fn poll_inbox(&self) -> Result<usize> {
        let objects = self.memo_store.objects();
        let touch = objects
            .head_meta(&inbox_touch_path(objects))
            .await?
            .map(|meta| (meta.e_tag, meta.last_modified.to_rfc3339()));
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
        let (handled, more) = self.apply_inbox_round().await?;
        self.inbox_watch.lock().more = more;
        Ok(handled)
    }

    /// Apply the inbox's pending commands now (at most
    /// [`COMMANDS_PER_ROUND`]); returns how many were handled (applied,
    /// rejected or found handled).
    ///
    /// # Errors
    /// Storage errors of the listing (a command's own errors are logged and
    /// leave it for the next round, without holding up the others).
    pub(crate) async fn apply_inbox(&self) -> Result<usize> {
        Ok(self.apply_inbox_round().await?.0)
    }

    /// One round over the inbox: the commands handled, and whether any is
    /// left for the next round.
    async fn apply_inbox_round(&self) -> Result<(usize, bool)> {
        let objects = self.memo_store.objects();
        let dir = inbox_dir(objects);
        let mut listed: Vec<ObjectMeta> = Vec::new();
        {
            let mut listing = objects.store().list(Some(&dir));
            while let Some(meta) = listing.try_next().await? {
                listed.push(meta);
                if listed.len() == MAX_LISTED {
                    break;
                }
            }
        }
        listed.sort_by(|a, b| a.location.cmp(&b.location));
        let mut more = listed.len() > COMMANDS_PER_ROUND;
        let mut handled = 0;
        for meta in listed.into_iter().take(COMMANDS_PER_ROUND) {
            let path = meta.location.clone();
            match self.handle_object(meta).await {
                Ok(true) => handled += 1,
                Ok(false) => more = true,
                Err(err) => {
                    // Left for the next round; the others go on.
                    self.note_error(&err);
                    if self.store_closed.is_cancelled() {
                        return Err(err);
                    }
                    warn!(path = %path, "inbox command left for the next round: {err}");
                    more = true;
                }
            }
        }
        Ok((handled, more))
    }

    /// Handle one inbox object; `Ok(false)` when it stays for a later round
    /// (a cancellation waiting for its step).
    async fn handle_object(&self, meta: ObjectMeta) -> Result<bool> {
        let objects = self.memo_store.objects();
        let Some(id) = command_id_of(&inbox_dir(objects), &meta.location) else {
            warn!(path = %meta.location, "an inbox object that is not named as a command; deleted");
            return objects.delete(&meta.location).await.map(|()| true);
        };
        // The object as listed: a ULID in lower or mixed case names the
        // same command (its record is under the canonical id), and its
        // object is read and deleted where it is.
        let path = meta.location.clone();
        let record_key = command_kv_key(&id.to_string());
        let record = durable::kv_record::<DurableCommandRecord>(self.queue.view(), &record_key)
            .await
            .unwrap_or_else(|err| {
                warn!(command = %id, "command record does not decode ({err}); the command is treated as handled");
                None
            });
        if record.as_ref().is_some_and(DurableCommandRecord::is_final) {
            // Handled before a crash or a failed delete: only the object is
            // left to remove.
            return objects.delete(&path).await.map(|()| true);
        }
        let unread = Envelope {
            id: id.clone(),
            kind: "unknown",
            sent_at_ms: id.timestamp_ms(),
            sender: None,
        };
        let size = usize::try_from(meta.size).unwrap_or(usize::MAX);
        if size > MAX_COMMAND_SIZE {
            self.reject(&unread, &wire::oversized(size)).await?;
            return objects.delete(&path).await.map(|()| true);
        }
        let Some(bytes) = objects.get(&path).await? else {
            // Deleted meanwhile (by an earlier round's delete retried).
            return Ok(true);
        };
        let received = match wire::decode(&id, &bytes) {
            Ok(received) => received,
            Err(err) => {
                self.reject(&unread, &err).await?;
                return objects.delete(&path).await.map(|()| true);
            }
        };
        let envelope = Envelope {
            id: id.clone(),
            kind: received.command.kind(),
            sent_at_ms: received.sent_at_ms,
            sender: received.sender.clone(),
        };
        match self.apply_command(&envelope, received).await {
            Ok(Some(answer)) => {
                debug!(command = %id, kind = envelope.kind, ?answer, "inbox command applied");
            }
            // Accepted: finished in a later round.
            Ok(None) => return Ok(false),
            Err(err) if err.is_permanent() => {
                warn!(command = %id, kind = envelope.kind, "inbox command rejected: {err}");
                self.reject(&envelope, &err).await?;
            }
            Err(err) => return Err(err),
        }
        objects.delete(&path).await.map(|()| true)
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
            Command::Signal {
                correlation_key,
                payload,
            } => {
                let (outcome, run_id) = self
                    .signal_recorded(&correlation_key, payload, |outcome, run_id| {
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
        }
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

    /// Record the rejection of the command of `envelope` with `err`.
    async fn reject(&self, envelope: &Envelope, err: &Error) -> Result<()> {
        warn!(command = %envelope.id, kind = envelope.kind, "inbox command rejected: {err}");
        self.commit_record(
            envelope,
            DurableCommandState::Rejected {
                error: err.to_string(),
            },
        )
        .await
    }

    /// One pass of the command retention sweep.
    pub(crate) async fn sweep_commands(&self) -> Result<usize> {
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
