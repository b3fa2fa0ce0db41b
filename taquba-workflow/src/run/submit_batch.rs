//! Group commit of submissions under fresh run ids (ULIDs the runtime
//! generated, so no record can exist under them and no compare-and-commit
//! guard is needed): submissions that arrive while earlier batches are
//! committing share one queue transaction.
//!
//! Every submission is otherwise its own transaction, and the store checks
//! each commit for conflicts against every transaction committed while it
//! was open, so hundreds of concurrent submissions (a burst of jobs) cost
//! time quadratic in their number. Batching keeps the number of open
//! submission transactions at [`MAX_BATCHES_IN_FLIGHT`]. A lone submission
//! commits at once; batches only form while others are in flight.
//!
//! A batch commits on its own task, so a submitter that stops waiting does
//! not abandon the others. When a batch's transaction fails, each of its
//! submissions is committed alone, so an error reaches only the submission
//! it belongs to.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use taquba::{EnqueueResult, Queue, SettlementEffects};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::error::Result;

/// The most submissions one transaction carries.
const MAX_BATCH: usize = 256;
/// The payload and KV bytes past which a batch takes no more submissions
/// (a submission larger than this commits alone). Payloads under the
/// queue's offload threshold are inline, so without it 256 of them could
/// make a transaction of tens of MiB.
pub(crate) const MAX_BATCH_BYTES: usize = 4 << 20;
/// Batches committing at once (each holds a transaction until it commits,
/// then waits for the WAL flush). Submissions arriving meanwhile form the
/// next batch.
const MAX_BATCHES_IN_FLIGHT: usize = 8;

type Reply = oneshot::Sender<Result<Vec<EnqueueResult>>>;

struct Item {
    effects: SettlementEffects,
    reply: Reply,
}

#[derive(Default)]
struct Pending {
    items: Vec<Item>,
    /// A drain task is running and will take what is pushed.
    draining: bool,
}

/// What became of a batched submission.
pub(crate) enum Batched {
    /// The commit's enqueue results (this submission's only).
    Committed(Vec<EnqueueResult>),
    /// The batch's task stopped before answering (its runtime shut down):
    /// whether the submission committed is unknown; the caller looks.
    Abandoned,
}

/// The group committer of one runtime's fresh submissions.
pub(crate) struct SubmitBatcher {
    queue: Arc<Queue>,
    pending: Arc<Mutex<Pending>>,
    in_flight: Arc<Semaphore>,
}

fn lock(pending: &Mutex<Pending>) -> MutexGuard<'_, Pending> {
    // Plain vector pushes and drains: a panic cannot leave it half-updated.
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SubmitBatcher {
    pub(crate) fn new(queue: Arc<Queue>) -> Self {
        Self {
            queue,
            pending: Arc::default(),
            in_flight: Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT)),
        }
    }

    /// Commit `effects`, the whole submission of a run under a fresh id, in
    /// a batch with the submissions arriving meanwhile.
    ///
    /// # Errors
    /// The error of committing `effects` alone (a batch that fails is
    /// retried one submission at a time).
    pub(crate) async fn commit(&self, effects: SettlementEffects) -> Result<Batched> {
        let (reply, answer) = oneshot::channel();
        let start_drain = {
            let mut pending = lock(&self.pending);
            pending.items.push(Item { effects, reply });
            !std::mem::replace(&mut pending.draining, true)
        };
        if start_drain {
            tokio::spawn(drain(
                self.queue.clone(),
                self.pending.clone(),
                self.in_flight.clone(),
            ));
        }
        match answer.await {
            Ok(result) => result.map(Batched::Committed),
            Err(_) => Ok(Batched::Abandoned),
        }
    }
}

/// Take batches off `pending` as batch slots free up, until it is empty.
async fn drain(queue: Arc<Queue>, pending: Arc<Mutex<Pending>>, in_flight: Arc<Semaphore>) {
    loop {
        // The semaphore is never closed.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let batch: Vec<Item> = {
            let mut pending = lock(&pending);
            if pending.items.is_empty() {
                pending.draining = false;
                return;
            }
            let take = batch_len(pending.items.iter().map(|item| &item.effects));
            pending.items.drain(..take).collect()
        };
        // Boxed: the commit's future is tens of KiB (see `detached`).
        tokio::spawn(Box::pin(commit_batch(queue.clone(), batch, permit)));
    }
}

/// How many of `pending` (at least one) the next batch takes: up to
/// [`MAX_BATCH`], stopping once [`MAX_BATCH_BYTES`] are reached.
fn batch_len<'a>(pending: impl Iterator<Item = &'a SettlementEffects>) -> usize {
    let mut bytes = 0;
    let mut len = 0;
    for effects in pending.take(MAX_BATCH) {
        if len > 0 && bytes >= MAX_BATCH_BYTES {
            break;
        }
        bytes += effects_bytes(effects);
        len += 1;
    }
    len
}

/// The payload and KV value bytes `effects` carries.
fn effects_bytes(effects: &SettlementEffects) -> usize {
    let payloads: usize = effects.enqueues.iter().map(|e| e.payload.len()).sum();
    let values: usize = effects
        .kv_writes
        .iter()
        .map(|(key, value)| key.len() + value.len())
        .sum();
    payloads + values
}

/// Commit `batch` as one transaction and answer each submission with the
/// results of its own enqueues; on failure, commit each alone.
async fn commit_batch(queue: Arc<Queue>, mut batch: Vec<Item>, permit: OwnedSemaphorePermit) {
    if batch.len() == 1
        && let Some(item) = batch.pop()
    {
        let result = queue.commit_effects(item.effects).await;
        drop(permit);
        let _ = item.reply.send(result.map_err(Into::into));
        return;
    }
    let mut merged = SettlementEffects::default();
    for item in &batch {
        let effects = &item.effects;
        merged.enqueues.extend(effects.enqueues.iter().cloned());
        merged.kv_writes.extend(
            effects
                .kv_writes
                .iter()
                .map(|(key, value)| (key.clone(), value.clone())),
        );
        merged.kv_deletes.extend(effects.kv_deletes.iter().cloned());
        merged
            .expiry_entries
            .extend(effects.expiry_entries.iter().cloned());
    }
    match queue.commit_effects(merged).await {
        Ok(mut results) => {
            drop(permit);
            // One result per enqueue, in order: split them back.
            for item in batch.into_iter().rev() {
                let own =
                    results.split_off(results.len().saturating_sub(item.effects.enqueues.len()));
                let _ = item.reply.send(Ok(own));
            }
        }
        Err(err) => {
            tracing::debug!(
                submissions = batch.len(),
                "batched submission failed, committing one at a time: {err}"
            );
            for item in batch {
                let result = queue.commit_effects(item.effects).await;
                let _ = item.reply.send(result.map_err(Into::into));
            }
            drop(permit);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use taquba::object_store::memory::InMemory;
    use taquba::{EnqueueOptions, EnqueueRequest};

    use super::*;
    use crate::error::Error;

    fn submission(i: usize, enqueues: usize, value_len: usize) -> SettlementEffects {
        let mut effects = SettlementEffects::default()
            .kv_put(format!("test/{i}").into_bytes(), vec![b'v'; value_len]);
        for n in 0..enqueues {
            effects = effects.enqueue(EnqueueRequest {
                queue: "q".into(),
                payload: format!("{i}/{n}").into_bytes(),
                options: EnqueueOptions::default(),
            });
        }
        effects
    }

    /// Submits 50 concurrently (one batch on the test's single thread);
    /// `bad` gets an oversized KV value. Returns the answers in order.
    async fn round(
        batcher: &Arc<SubmitBatcher>,
        round: usize,
        bad: Option<usize>,
    ) -> Vec<Result<Batched>> {
        let mut tasks = Vec::new();
        for i in 0..50 {
            let batcher = batcher.clone();
            let value_len = if Some(i) == bad {
                taquba::MAX_KV_VALUE_SIZE + 1
            } else {
                8
            };
            tasks.push(tokio::spawn(async move {
                batcher
                    .commit(submission(round * 100 + i, i % 3, value_len))
                    .await
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        answers
    }

    #[test]
    fn a_batch_stops_at_its_count_or_byte_budget() {
        let small: Vec<SettlementEffects> = (0..300).map(|i| submission(i, 1, 8)).collect();
        assert_eq!(batch_len(small.iter()), MAX_BATCH);
        assert_eq!(batch_len(small[..3].iter()), 3);
        // 1 MiB values: the fifth submission passes the 4 MiB budget.
        let big: Vec<SettlementEffects> = (0..10).map(|i| submission(i, 0, 1 << 20)).collect();
        assert_eq!(batch_len(big.iter()), 4);
        // A submission over the budget on its own still commits.
        let huge = [submission(0, 0, MAX_BATCH_BYTES * 2), submission(1, 0, 8)];
        assert_eq!(batch_len(huge.iter()), 1);
        assert_eq!(batch_len(std::iter::empty()), 0);
    }

    #[tokio::test]
    async fn each_submission_of_a_batch_gets_its_own_results_and_errors() {
        let store = Arc::new(InMemory::new());
        let options =
            taquba::OpenOptions::default().flush_interval(std::time::Duration::from_millis(1));
        let queue = Arc::new(
            Queue::open_with_options(store, "db", options)
                .await
                .unwrap(),
        );
        let batcher = Arc::new(SubmitBatcher::new(queue.clone()));
        let mut payloads_by_id = HashMap::new();
        // A batch that commits whole, then one whose 17th submission fails.
        for (r, bad) in [(0, None), (1, Some(17))] {
            for (i, answer) in round(&batcher, r, bad).await.into_iter().enumerate() {
                let n = r * 100 + i;
                if Some(i) == bad {
                    assert!(
                        matches!(
                            answer,
                            Err(Error::Queue(taquba::Error::KvValueTooLarge { .. }))
                        ),
                        "the oversized submission fails alone"
                    );
                    let key = format!("test/{n}");
                    assert!(queue.view().kv_get(key.as_bytes()).await.unwrap().is_none());
                    continue;
                }
                let Ok(Batched::Committed(results)) = answer else {
                    panic!("submission {n} did not commit");
                };
                assert_eq!(
                    results.len(),
                    i % 3,
                    "submission {n}: one result per enqueue"
                );
                for (e, result) in results.into_iter().enumerate() {
                    let EnqueueResult::New(id) = result else {
                        panic!("a fresh enqueue");
                    };
                    payloads_by_id.insert(id, format!("{n}/{e}"));
                }
                let key = format!("test/{n}");
                assert!(queue.view().kv_get(key.as_bytes()).await.unwrap().is_some());
            }
        }
        // Every id answered names the job of that submission's enqueue.
        // 49 enqueues a round (i % 3 each), less the failed one's 2.
        assert_eq!(payloads_by_id.len(), 49 + 47);
        for (id, payload) in payloads_by_id {
            let job = queue.view().get_job(&id).await.unwrap().unwrap();
            assert_eq!(job.payload, payload.into_bytes());
        }
    }
}
