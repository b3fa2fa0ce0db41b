//! Process figures for the benchmarks: CPU time and resident memory of
//! this process, read from the operating system.

/// Process CPU time (user + system, every thread), from `getrusage`, in µs;
/// 0 when the call fails.
pub fn cpu_micros() -> u64 {
    // SAFETY: `getrusage` writes the whole struct it is given and reads
    // nothing else; a zeroed `rusage` is a valid value of it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

/// Resident set size, from /proc/self/status, in KiB; 0 where there is no
/// such file.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Object-store calls counted by [`CountingStore`]: one counter per
/// operation and per kind of path.
pub mod calls {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::ops::Range;
    use std::sync::{Arc, Mutex, PoisonError};

    use async_trait::async_trait;
    use bytes::Bytes;
    use futures_util::stream::{BoxStream, StreamExt};
    use taquba::object_store::path::Path;
    use taquba::object_store::{
        self, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
        ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    /// An [`ObjectStore`] that passes every call to the store it wraps and
    /// counts it by operation (`put`, `get`, `head`, `list`, `delete`,
    /// `copy`) and by the path's kind: its components up to the first one
    /// that looks like an id or a file name (`bench/wal`,
    /// `bench/compacted`, `inbox`). It displays as the store it wraps, so
    /// a runtime still recognizes a wrapped `LocalFileSystem` as a local
    /// directory (whose inbox reads then go to the file system directly and
    /// are not counted here).
    #[derive(Clone)]
    pub struct CountingStore {
        inner: Arc<dyn ObjectStore>,
        counts: Arc<Mutex<BTreeMap<(String, &'static str), u64>>>,
        put_bytes: Arc<Mutex<BTreeMap<String, u64>>>,
    }

    impl CountingStore {
        /// Wrap `inner`, every counter at 0.
        pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
            Self {
                inner,
                counts: Arc::default(),
                put_bytes: Arc::default(),
            }
        }

        /// The bytes written by whole-object puts so far, by path kind
        /// (multipart uploads are counted as calls only).
        pub fn put_bytes(&self) -> BTreeMap<String, u64> {
            self.put_bytes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }

        /// The calls so far: `(path kind, operation) → count`.
        pub fn counts(&self) -> BTreeMap<(String, &'static str), u64> {
            self.counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }

        /// Set every counter back to 0.
        pub fn reset(&self) {
            self.counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            self.put_bytes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }

        fn note(&self, op: &'static str, path: Option<&Path>) {
            let kind = path.map_or_else(String::new, kind_of);
            *self
                .counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry((kind, op))
                .or_default() += 1;
        }
    }

    /// A path's kind: its leading components while they look like names
    /// (letters, `-`, `_`), at most three.
    fn kind_of(path: &Path) -> String {
        path.parts()
            .map(|part| part.as_ref().to_string())
            .take_while(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c == '-' || c == '_')
            })
            .take(3)
            .collect::<Vec<_>>()
            .join("/")
    }

    impl fmt::Debug for CountingStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&self.inner, f)
        }
    }

    impl fmt::Display for CountingStore {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Display::fmt(&self.inner, f)
        }
    }

    #[async_trait]
    impl ObjectStore for CountingStore {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.note("put", Some(location));
            *self
                .put_bytes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(kind_of(location))
                .or_default() += payload.content_length() as u64;
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.note("put", Some(location));
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.note(if options.head { "head" } else { "get" }, Some(location));
            self.inner.get_opts(location, options).await
        }

        async fn get_ranges(
            &self,
            location: &Path,
            ranges: &[Range<u64>],
        ) -> object_store::Result<Vec<Bytes>> {
            self.note("get", Some(location));
            self.inner.get_ranges(location, ranges).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            let this = self.clone();
            let counted = locations
                .map(move |location| {
                    if let Ok(path) = &location {
                        this.note("delete", Some(path));
                    }
                    location
                })
                .boxed();
            self.inner.delete_stream(counted)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.note("list", prefix);
            self.inner.list(prefix)
        }

        fn list_with_offset(
            &self,
            prefix: Option<&Path>,
            offset: &Path,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.note("list", prefix);
            self.inner.list_with_offset(prefix, offset)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.note("list", prefix);
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.note("copy", Some(to));
            self.inner.copy_opts(from, to, options).await
        }
    }
}
