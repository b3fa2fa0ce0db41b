//! [`BoundedStore`]: every call the command line and the dashboard make to
//! the object store, bounded. A call that does not answer within its
//! bound fails with an error naming the operation, the path and the bound,
//! so no command and no request hangs on the store (a FIFO planted in a
//! local store blocks whoever opens it; an NFS mount can stall).
//!
//! A call that timed out may still hold a thread (a blocking open cannot
//! be interrupted), so the calls in flight are capped: each holds a permit
//! of [`MAX_CALLS_IN_FLIGHT`] until its inner call returns, timed out or
//! not. Once every permit is held by calls that never return, further
//! calls fail after their bound instead of taking another thread: a
//! dashboard serving request after request against a stuck store holds at
//! most that many threads, and keeps answering (with errors) instead of
//! running out.

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::{BoxStream, StreamExt};
use taquba::object_store::path::Path;
use taquba::object_store::{
    self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use tokio::sync::Semaphore;

/// The bound of one call to the store (a listing: of each of its items).
pub const STORE_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Calls to the store in flight at once, the ones that timed out and have
/// not returned included.
pub const MAX_CALLS_IN_FLIGHT: usize = 64;

/// An object store whose every call is bounded (see the module
/// documentation). It displays as the store it wraps, so what the store
/// is (a local directory, a bucket) is still told by its display.
#[derive(Clone)]
pub struct BoundedStore {
    inner: Arc<dyn ObjectStore>,
    bound: Duration,
    calls: Arc<Semaphore>,
    in_flight: usize,
}

impl BoundedStore {
    /// `inner` with each call bounded by `bound` and at most `in_flight`
    /// calls in flight.
    pub fn new(inner: Arc<dyn ObjectStore>, bound: Duration, in_flight: usize) -> Self {
        let in_flight = in_flight.max(1);
        Self {
            inner,
            bound,
            calls: Arc::new(Semaphore::new(in_flight)),
            in_flight,
        }
    }

    /// Run `call` on a task of its own holding a permit until it returns;
    /// wait for it at most the bound.
    async fn bounded<T, F>(
        &self,
        what: &'static str,
        path: &Path,
        call: F,
    ) -> object_store::Result<T>
    where
        T: Send + 'static,
        F: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        let late = |why: &str| {
            object_store::Error::Generic {
            store: "taquba-workflow",
            source: format!(
                "{what} of {path:?} {why} within {} (the store is stuck: is something other than a file at that path?)",
                humantime::format_duration(self.bound)
            )
            .into(),
        }
        };
        let permit = tokio::time::timeout(self.bound, self.calls.clone().acquire_owned())
            .await
            .map_err(|_| {
                late(&format!(
                    "did not start: the {} calls in flight did not return",
                    self.in_flight
                ))
            })?
            .map_err(|_| late("did not start: the store is closed"))?;
        let task = tokio::spawn(async move {
            let result = call.await;
            drop(permit);
            result
        });
        match tokio::time::timeout(self.bound, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(object_store::Error::Generic {
                store: "taquba-workflow",
                source: Box::new(join),
            }),
            Err(_) => Err(late("did not answer")),
        }
    }

    /// `items` with each item awaited at most the bound.
    fn bounded_stream<T: Send + 'static>(
        &self,
        what: &'static str,
        at: Option<&Path>,
        items: BoxStream<'static, object_store::Result<T>>,
    ) -> BoxStream<'static, object_store::Result<T>> {
        let bound = self.bound;
        let at = at.map(ToString::to_string).unwrap_or_default();
        futures_util::stream::unfold(Some(items), move |items| {
            let at = at.clone();
            async move {
                let mut items = items?;
                match tokio::time::timeout(bound, items.next()).await {
                    Ok(Some(item)) => Some((item, Some(items))),
                    Ok(None) => None,
                    Err(_) => Some((
                        Err(object_store::Error::Generic {
                            store: "taquba-workflow",
                            source: format!(
                                "{what} of {at:?} did not answer within {}",
                                humantime::format_duration(bound)
                            )
                            .into(),
                        }),
                        None,
                    )),
                }
            }
        })
        .boxed()
    }
}

impl fmt::Display for BoundedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl fmt::Debug for BoundedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedStore")
            .field("inner", &self.inner.to_string())
            .field("bound", &self.bound)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ObjectStore for BoundedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let (inner, at) = (self.inner.clone(), location.clone());
        self.bounded("a write", location, async move {
            inner.put_opts(&at, payload, opts).await
        })
        .await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        let (inner, at) = (self.inner.clone(), location.clone());
        self.bounded("a multipart write", location, async move {
            inner.put_multipart_opts(&at, opts).await
        })
        .await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let (inner, at) = (self.inner.clone(), location.clone());
        self.bounded("a read", location, async move {
            inner.get_opts(&at, options).await
        })
        .await
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let (inner, at, ranges) = (self.inner.clone(), location.clone(), ranges.to_vec());
        self.bounded("a ranged read", location, async move {
            inner.get_ranges(&at, &ranges).await
        })
        .await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let deleted = self.inner.delete_stream(locations);
        self.bounded_stream("a delete", None, deleted)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let items = self.inner.list(prefix);
        self.bounded_stream("a listing", prefix, items)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let items = self.inner.list_with_offset(prefix, offset);
        self.bounded_stream("a listing", prefix, items)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let (inner, at) = (self.inner.clone(), prefix.cloned());
        let shown = prefix.cloned().unwrap_or_default();
        self.bounded("a listing", &shown, async move {
            inner.list_with_delimiter(at.as_ref()).await
        })
        .await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let (inner, from, at) = (self.inner.clone(), from.clone(), to.clone());
        self.bounded("a copy", to, async move {
            inner.copy_opts(&from, &at, options).await
        })
        .await
    }

    async fn rename_opts(
        &self,
        from: &Path,
        to: &Path,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        let (inner, from, at) = (self.inner.clone(), from.clone(), to.clone());
        self.bounded("a rename", to, async move {
            inner.rename_opts(&from, &at, options).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taquba::object_store::ObjectStoreExt;
    use taquba::object_store::memory::InMemory;

    /// A store whose reads never answer, counting the reads started.
    #[derive(Debug, Default)]
    struct Stuck {
        started: std::sync::atomic::AtomicUsize,
        memory: InMemory,
    }

    impl fmt::Display for Stuck {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Stuck")
        }
    }

    #[async_trait]
    impl ObjectStore for Stuck {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.memory.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.memory.put_multipart_opts(location, opts).await
        }

        async fn get_opts(&self, _: &Path, _: GetOptions) -> object_store::Result<GetResult> {
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending().await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.memory.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.memory.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.memory.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            o: CopyOptions,
        ) -> object_store::Result<()> {
            self.memory.copy_opts(from, to, o).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stuck_call_fails_in_time_and_stuck_calls_are_capped() {
        let stuck = Arc::new(Stuck::default());
        let store = BoundedStore::new(stuck.clone(), Duration::from_secs(5), 3);
        assert_eq!(store.to_string(), "Stuck");
        let path = Path::from("inbox/touch");
        for _ in 0..10 {
            let err = store.get(&path).await.map(|_| ()).unwrap_err().to_string();
            assert!(err.contains("\"inbox/touch\""), "{err}");
            assert!(err.contains("within 5s"), "{err}");
        }
        // The inner store saw three reads: the others never took a task
        // (or a thread).
        assert_eq!(stuck.started.load(std::sync::atomic::Ordering::SeqCst), 3);
        // With every permit held by a call that never returns, any call
        // fails in time, saying why.
        let err = store
            .put(&path, PutPayload::from_static(b"x"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the 3 calls in flight did not return"),
            "{err}"
        );
        // A store that answers is not slowed.
        let fine = BoundedStore::new(Arc::new(InMemory::new()), Duration::from_secs(5), 3);
        for _ in 0..10 {
            fine.put(&path, PutPayload::from_static(b"x"))
                .await
                .unwrap();
            fine.get(&path).await.unwrap();
        }
    }
}
