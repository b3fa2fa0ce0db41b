//! The outage budget: an object store wrapper that turns a store outage
//! longer than a budget into an error SlateDB does not retry.
//!
//! SlateDB retries a failed object-store call forever (taquba 0.14 exposes
//! no bound), so during an outage of the whole store every commit, and a
//! shutdown's drain, waits for the store to come back. [`OutageGuard`]
//! wraps the store a queue is opened on: once every call has failed for
//! longer than the budget (a run of transient failures with no success in
//! between, measured on the monotonic clock), the next failure is answered
//! as `NotSupported` carrying [`OutageExceeded`], which SlateDB passes up
//! instead of retrying. The queue then fails its writes; the runtime
//! reports [`Error::StoreOutage`](crate::Error::StoreOutage), its worker
//! stops, and everything committed before stays committed: reopen the
//! queue (or restart the process) once the store is back and every run
//! resumes where it was.
//!
//! Failures that are answers rather than an outage (not found, already
//! exists, precondition failed, not modified, not implemented, not
//! supported) pass through and do not count.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use taquba::object_store::path::Path;
use taquba::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use tokio::time::Instant;

/// An outage that lasted past its budget: every call of the store failed
/// for `lasted_ms` (the guard's view), over `budget_ms`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the object store has failed every call for {lasted_ms} ms, past the outage budget of {budget_ms} ms (last error: {last_error})"
)]
pub struct OutageExceeded {
    /// How long every call had been failing, ms.
    pub lasted_ms: u64,
    /// The budget, ms.
    pub budget_ms: u64,
    /// The last failure the store answered.
    pub last_error: String,
}

struct State {
    /// Since when every call has failed (`None` while calls succeed).
    failing_since: Option<Instant>,
}

/// An object store whose outages end in an error after a budget. SlateDB
/// retries a failed call forever; once every call of the wrapped store has
/// failed for longer than the budget (a run of transient failures with no
/// success between them, on the monotonic clock; answers such as "not
/// found" do not count), the next failure is answered as `NotSupported`
/// carrying [`OutageExceeded`], which SlateDB does not retry: the queue's
/// writes fail, the runtime reports
/// [`Error::StoreOutage`](crate::Error::StoreOutage) and its worker stops,
/// and a queue reopened once the store is back resumes every run. Open the
/// queue, and build the runtime, on the guard instead of the store
/// (docs/storage.md, "Storage outages"). Cheap to clone; clones share the
/// outage's state.
#[derive(Clone)]
pub struct OutageGuard {
    inner: Arc<dyn ObjectStore>,
    budget: Duration,
    state: Arc<Mutex<State>>,
}

impl OutageGuard {
    /// Wrap `inner`: a run of transient failures lasting longer than
    /// `budget` fails the next call with [`OutageExceeded`] (as
    /// `object_store::Error::NotSupported`, which SlateDB does not retry).
    /// Choose a budget longer than the blips you want ridden out (SlateDB
    /// backs off up to 1 s between retries): a minute or more.
    pub fn new(inner: Arc<dyn ObjectStore>, budget: Duration) -> Self {
        Self {
            inner,
            budget,
            state: Arc::new(Mutex::new(State {
                failing_since: None,
            })),
        }
    }

    /// The budget.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// How long every call has been failing, `None` while the store
    /// answers.
    pub fn failing_for(&self) -> Option<Duration> {
        self.state
            .lock()
            .ok()
            .and_then(|state| state.failing_since)
            .map(|since| since.elapsed())
    }

    /// Note `result`: a success ends an outage; a transient failure starts
    /// or extends one, and past the budget becomes [`OutageExceeded`].
    fn observe<T>(&self, result: object_store::Result<T>) -> object_store::Result<T> {
        let Ok(mut state) = self.state.lock() else {
            return result;
        };
        match result {
            Ok(value) => {
                state.failing_since = None;
                Ok(value)
            }
            Err(err) if !is_transient(&err) => Err(err),
            Err(err) => {
                let since = *state.failing_since.get_or_insert_with(Instant::now);
                let lasted = since.elapsed();
                if lasted <= self.budget {
                    return Err(err);
                }
                Err(object_store::Error::NotSupported {
                    source: Box::new(OutageExceeded {
                        lasted_ms: millis(lasted),
                        budget_ms: millis(self.budget),
                        last_error: err.to_string(),
                    }),
                })
            }
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whether `err` is a failure to reach the store, rather than its answer.
fn is_transient(err: &object_store::Error) -> bool {
    !matches!(
        err,
        object_store::Error::NotFound { .. }
            | object_store::Error::AlreadyExists { .. }
            | object_store::Error::Precondition { .. }
            | object_store::Error::NotModified { .. }
            | object_store::Error::NotImplemented { .. }
            | object_store::Error::NotSupported { .. }
    )
}

/// The [`OutageExceeded`] in `err`'s chain of sources, if any.
pub(crate) fn outage_in(err: &(dyn std::error::Error + 'static)) -> Option<OutageExceeded> {
    let mut current = Some(err);
    while let Some(err) = current {
        if let Some(outage) = err.downcast_ref::<OutageExceeded>() {
            return Some(outage.clone());
        }
        current = err.source();
    }
    None
}

impl fmt::Debug for OutageGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OutageGuard")
            .field("inner", &self.inner.to_string())
            .field("budget", &self.budget)
            .finish()
    }
}

impl fmt::Display for OutageGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OutageGuard({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for OutageGuard {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.observe(self.inner.put_opts(location, payload, opts).await)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.observe(self.inner.put_multipart_opts(location, opts).await)
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.observe(self.inner.get_opts(location, options).await)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.observe(self.inner.get_ranges(location, ranges).await)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        self.inner
            .delete_stream(locations)
            .map(move |deleted| this.observe(deleted))
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let this = self.clone();
        self.inner
            .list(prefix)
            .map(move |item| this.observe(item))
            .boxed()
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let this = self.clone();
        self.inner
            .list_with_offset(prefix, offset)
            .map(move |item| this.observe(item))
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.observe(self.inner.list_with_delimiter(prefix).await)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.observe(self.inner.copy_opts(from, to, options).await)
    }
}

#[cfg(test)]
mod tests {
    use taquba::object_store::ObjectStoreExt;
    use taquba::object_store::memory::InMemory;

    use super::*;

    /// A store failing every call while `down` is set.
    #[derive(Debug)]
    struct Flaky {
        inner: InMemory,
        down: std::sync::atomic::AtomicBool,
    }

    impl fmt::Display for Flaky {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Flaky")
        }
    }

    fn down() -> object_store::Error {
        object_store::Error::Generic {
            store: "Flaky",
            source: "the store is down".into(),
        }
    }

    #[async_trait]
    impl ObjectStore for Flaky {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(down());
            }
            self.inner.put_opts(location, payload, opts).await
        }
        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }
        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.inner.get_opts(location, options).await
        }
        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }
        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }
        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }
        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_past_the_budget_becomes_an_error_slatedb_does_not_retry() {
        let flaky = Arc::new(Flaky {
            inner: InMemory::new(),
            down: std::sync::atomic::AtomicBool::new(true),
        });
        let guard = OutageGuard::new(flaky.clone(), Duration::from_secs(60));
        let path = Path::from("a");
        // Within the budget: the store's own error, to be retried.
        let err = guard
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        assert!(matches!(err, object_store::Error::Generic { .. }), "{err}");
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(matches!(
            guard.put(&path, PutPayload::from_static(b"x")).await,
            Err(object_store::Error::Generic { .. })
        ));
        assert!(
            guard
                .failing_for()
                .is_some_and(|d| d >= Duration::from_secs(59))
        );
        // Past it: NotSupported carrying the outage.
        tokio::time::advance(Duration::from_secs(2)).await;
        let err = guard
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap_err();
        let outage = outage_in(&err).expect("the outage in the chain");
        assert_eq!(outage.budget_ms, 60_000);
        assert!(outage.lasted_ms >= 61_000, "{outage:?}");
        assert!(
            err.to_string().contains("outage budget of 60000 ms"),
            "{err}"
        );
        // A success ends the outage.
        flaky.down.store(false, std::sync::atomic::Ordering::SeqCst);
        guard
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap();
        assert_eq!(guard.failing_for(), None);
        // An answer is not an outage.
        let missing = guard.get(&Path::from("nothing")).await.unwrap_err();
        assert!(matches!(missing, object_store::Error::NotFound { .. }));
        assert_eq!(guard.failing_for(), None);
    }
}
