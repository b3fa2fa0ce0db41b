//! Bounded concurrent batches that finish what they started: after an
//! error no new item starts, the items in flight run to their end, and only
//! then is the first error returned.
//!
//! The usual `buffer_unordered(n).try_collect()` returns at the first error
//! and drops the futures still in flight. A dropped commit is not lost (see
//! [`crate::run::commit`]), but the call would return while its own
//! commits are still landing, so what it reports (and what a caller retries
//! next) would be a moving target; here a returned error means nothing of
//! the call is still running.

use std::future::{Future, ready};
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::stream::{self, StreamExt};

use crate::error::Result;

/// Run `work` on every item of `items`, at most `limit` at once, and
/// collect the values (in completion order).
///
/// # Errors
/// The first error `work` returned, once every item started before it has
/// finished; no item starts after an error.
pub(crate) async fn try_join_settled<I, F, Fut, T>(
    items: I,
    limit: usize,
    work: F,
) -> Result<Vec<T>>
where
    I: IntoIterator,
    F: FnMut(I::Item) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let failed = AtomicBool::new(false);
    let mut results = std::pin::pin!(
        stream::iter(items)
            .take_while(|_| ready(!failed.load(Ordering::Relaxed)))
            .map(work)
            .buffer_unordered(limit.max(1))
    );
    let mut values = Vec::new();
    let mut first_error = None;
    while let Some(result) = results.next().await {
        match result {
            Ok(value) => values.push(value),
            Err(err) => {
                failed.store(true, Ordering::Relaxed);
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(values),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::error::Error;

    #[tokio::test(start_paused = true)]
    async fn an_error_waits_for_the_work_in_flight_and_starts_no_more() {
        let finished = Mutex::new(Vec::new());
        let started = Mutex::new(Vec::new());
        let result = try_join_settled(0..10u64, 3, |i| {
            let (finished, started) = (&finished, &started);
            async move {
                started.lock().expect("lock").push(i);
                if i == 1 {
                    return Err(Error::EffectsSealed);
                }
                // The others in flight outlive the error.
                tokio::time::sleep(Duration::from_millis(10 * (i + 1))).await;
                finished.lock().expect("lock").push(i);
                Ok(i)
            }
        })
        .await;
        assert!(matches!(result, Err(Error::EffectsSealed)));
        // 0 and 2 were in flight with 1: both finished before the return.
        assert_eq!(*finished.lock().expect("lock"), vec![0, 2]);
        assert_eq!(*started.lock().expect("lock"), vec![0, 1, 2]);
        let all = try_join_settled(0..5u64, 2, |i| async move { Ok(i) }).await;
        assert_eq!(all.expect("no error").len(), 5);
    }
}
