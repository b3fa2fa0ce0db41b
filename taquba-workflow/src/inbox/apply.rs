//! The owner's side of the inbox: each maintenance round lists the inbox,
//! and for each command object (in id order) skips it when its record says
//! it was handled, else decodes and validates it and applies it with its
//! record committed in the same transaction as its first effect, then
//! deletes the object. Errors of a command's input reject it with a
//! recorded error; storage errors leave it for the next round.

use std::time::{Duration, UNIX_EPOCH};

use futures_util::TryStreamExt;
use taquba::SettlementEffects;
use taquba::object_store::ObjectMeta;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::inbox::record::{DurableAnswer, DurableCommandRecord, DurableCommandState};
use crate::inbox::wire::{self, Received};
use crate::inbox::{Command, CommandAnswer, CommandId, MAX_COMMAND_SIZE, command_path, inbox_dir};
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

impl RuntimeCore {
    /// Apply the inbox's pending commands (at most [`COMMANDS_PER_ROUND`]);
    /// returns how many were handled (applied, rejected or found handled).
    ///
    /// # Errors
    /// Storage errors of the listing or of a command (the rest of the round
    /// is left for the next).
    pub(crate) async fn apply_inbox(&self) -> Result<usize> {
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
        let mut handled = 0;
        for meta in listed.into_iter().take(COMMANDS_PER_ROUND) {
            self.handle_object(meta).await?;
            handled += 1;
        }
        Ok(handled)
    }

    /// Handle one inbox object.
    async fn handle_object(&self, meta: ObjectMeta) -> Result<()> {
        let objects = self.memo_store.objects();
        let Some(id) = meta
            .location
            .filename()
            .and_then(|name| name.strip_suffix(".msgpack"))
            .and_then(|id| id.parse::<CommandId>().ok())
        else {
            warn!(path = %meta.location, "an inbox object that is not named as a command; deleted");
            return objects.delete(&meta.location).await;
        };
        let path = command_path(objects, &id);
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
            return objects.delete(&path).await;
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
            return objects.delete(&path).await;
        }
        let Some(bytes) = objects.get(&path).await? else {
            // Deleted meanwhile (by an earlier round's delete retried).
            return Ok(());
        };
        let received = match wire::decode(&id, &bytes) {
            Ok(received) => received,
            Err(err) => {
                self.reject(&unread, &err).await?;
                return objects.delete(&path).await;
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
            Ok(None) => return Ok(()),
            Err(err) if err.is_permanent() => {
                warn!(command = %id, kind = envelope.kind, "inbox command rejected: {err}");
                self.reject(&envelope, &err).await?;
            }
            Err(err) => return Err(err),
        }
        objects.delete(&path).await
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
                let run_id = submit.run_id.unwrap_or_else(RunId::generate);
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
        self.queue
            .commit_effects(self.command_record(envelope, state))
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
