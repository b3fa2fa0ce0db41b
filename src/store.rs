//! Where a program's state lives: a local directory, or an S3 bucket.
//!
//! Every example and test takes its store through
//! [`store_from_env_or_url`] and opens its queue through [`open_queue`]:
//!
//! | location | store |
//! |---|---|
//! | `/some/dir`, `./dir` | a local directory (created if missing) |
//! | `file:///some/dir` | the same, as a URL |
//! | `s3://bucket` or `s3://bucket/prefix` | an S3 bucket (feature `aws`), under `prefix`; endpoint, credentials and region from the environment |
//! | none given, `AWS_BUCKET` set | the S3 bucket named by the environment (feature `aws`) |
//! | none given otherwise | the caller's default directory |
//!
//! The S3 environment is the standard one: `AWS_ENDPOINT`, `AWS_BUCKET`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (default
//! `us-east-1`) and `AWS_ALLOW_HTTP` (`true` for a plain-HTTP endpoint such
//! as a local S3 server).
//!
//! Every S3 call path is bounded: each HTTP request by
//! [`S3_REQUEST_TIMEOUT`] (connect by [`S3_CONNECT_TIMEOUT`]) with at most
//! [`S3_MAX_RETRIES`] retries, and [`open_queue`] first probes the store
//! (one listing, so wrong credentials fail with the server's own message)
//! and then bounds the queue's open by [`open_timeout`]: the queue retries
//! storage errors without end, so without the bound a wrong endpoint would
//! hang the program.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::{self, ObjectStore};
use taquba::{OpenOptions, Queue};

/// The bound of one S3 HTTP request (the whole request, body included).
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound of establishing one S3 connection.
pub const S3_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of one failed S3 request (server errors, timeouts) before the
/// error is returned.
pub const S3_MAX_RETRIES: usize = 3;
/// The bound of the reachability probe of [`open_queue`].
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// The default bound of a queue's open; see [`open_timeout`].
pub const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// The environment variable overriding [`DEFAULT_OPEN_TIMEOUT`], in whole
/// seconds.
pub const OPEN_TIMEOUT_ENV: &str = "TAQUBA_OPEN_TIMEOUT_SECS";

/// Why a store could not be chosen or a queue not opened on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The directory of a local store could not be created.
    #[error("cannot create the store directory {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The file system's error.
        source: std::io::Error,
    },
    /// The location is neither a directory nor a supported URL.
    #[error("invalid store location {location:?}: {reason}")]
    InvalidLocation {
        /// The location given.
        location: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The location needs a cargo feature this build lacks.
    #[error(
        "store location {location:?} needs the `{feature}` feature: rebuild with `--features {feature}`"
    )]
    FeatureDisabled {
        /// The location given.
        location: String,
        /// The missing feature.
        feature: &'static str,
    },
    /// The object store client could not be configured (a local store on
    /// an invalid path, an S3 configuration missing its bucket, ...).
    #[error("cannot configure the store {location:?}: {source}")]
    Configure {
        /// The location given.
        location: String,
        /// The client's error.
        source: object_store::Error,
    },
    /// The store answered the probe with an error (wrong credentials, no
    /// such bucket, endpoint down).
    #[error("the store {store} is not usable: {detail}")]
    Unreachable {
        /// The store, as it displays itself.
        store: String,
        /// The store's error with its chain of causes.
        detail: String,
        /// The store's error.
        source: object_store::Error,
    },
    /// An operation on the store did not finish in time.
    #[error(
        "{what} on the store {store} did not finish within {after:?} (is the endpoint reachable and are the credentials right?)"
    )]
    Timeout {
        /// The operation.
        what: &'static str,
        /// The store, as it displays itself.
        store: String,
        /// The bound that elapsed.
        after: Duration,
    },
    /// The queue's open returned an error.
    #[error("opening the queue on the store {store} failed: {source}")]
    Open {
        /// The store, as it displays itself.
        store: String,
        /// The queue's error.
        source: taquba::Error,
    },
}

/// The object store at `location`, or (with `None`) the S3 bucket of the
/// environment when `AWS_BUCKET` is set, else a local store in
/// `default_dir`. See the [module documentation](self) for the forms a
/// location takes. Directories are created if missing.
///
/// # Errors
/// [`StoreError::InvalidLocation`] for an unsupported URL scheme or an
/// empty location, [`StoreError::FeatureDisabled`] for an S3 location in a
/// build without the `aws` feature, [`StoreError::CreateDir`] and
/// [`StoreError::Configure`] when the store cannot be set up. Nothing is
/// sent to the store yet: [`open_queue`] checks that it answers.
pub fn store_from_env_or_url(
    location: Option<&str>,
    default_dir: &Path,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    match location.map(str::trim) {
        None => match std::env::var("AWS_BUCKET") {
            Ok(bucket) if !bucket.is_empty() => s3_store("AWS_BUCKET", None, None),
            _ => dir_store(default_dir),
        },
        Some("") => Err(StoreError::InvalidLocation {
            location: String::new(),
            reason: "empty",
        }),
        Some(url) if url.starts_with("s3://") => {
            let rest = &url["s3://".len()..];
            let (bucket, prefix) = match rest.split_once('/') {
                Some((bucket, prefix)) => (bucket, Some(prefix.trim_matches('/'))),
                None => (rest, None),
            };
            if bucket.is_empty() {
                return Err(StoreError::InvalidLocation {
                    location: url.to_string(),
                    reason: "no bucket after `s3://`",
                });
            }
            s3_store(url, Some(bucket), prefix.filter(|p| !p.is_empty()))
        }
        Some(url) if url.starts_with("file://") => {
            let path = &url["file://".len()..];
            if !path.starts_with('/') {
                return Err(StoreError::InvalidLocation {
                    location: url.to_string(),
                    reason: "a file URL needs an absolute path (`file:///dir`)",
                });
            }
            dir_store(Path::new(path))
        }
        Some(url) if url.contains("://") => Err(StoreError::InvalidLocation {
            location: url.to_string(),
            reason: "supported URL schemes are `s3://` and `file://`",
        }),
        Some(dir) => dir_store(Path::new(dir)),
    }
}

/// A local store rooted at `dir`, created if missing.
///
/// # Errors
/// [`StoreError::CreateDir`], [`StoreError::Configure`].
pub fn dir_store(dir: &Path) -> Result<Arc<dyn ObjectStore>, StoreError> {
    if dir.exists() && !dir.is_dir() {
        return Err(StoreError::CreateDir {
            path: dir.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the path is a file, not a directory",
            ),
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let store = LocalFileSystem::new_with_prefix(dir).map_err(|source| StoreError::Configure {
        location: dir.display().to_string(),
        source,
    })?;
    Ok(Arc::new(store))
}

#[cfg(feature = "aws")]
fn s3_store(
    location: &str,
    bucket: Option<&str>,
    prefix: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use object_store::{ClientOptions, RetryConfig};

    // The bounds first: `with_client_options` replaces every client
    // option, so the environment (`AWS_ALLOW_HTTP` among them) is applied
    // after it, as `AmazonS3Builder::from_env` would.
    let mut builder = AmazonS3Builder::new()
        .with_client_options(
            ClientOptions::new()
                .with_timeout(S3_REQUEST_TIMEOUT)
                .with_connect_timeout(S3_CONNECT_TIMEOUT),
        )
        .with_retry(RetryConfig {
            max_retries: S3_MAX_RETRIES,
            retry_timeout: S3_REQUEST_TIMEOUT,
            ..RetryConfig::default()
        });
    for (name, value) in std::env::vars() {
        if name.starts_with("AWS_")
            && let Ok(key) = name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
        {
            builder = builder.with_config(key, value);
        }
    }
    if let Some(bucket) = bucket {
        builder = builder.with_bucket_name(bucket);
    }
    if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        builder = builder.with_region("us-east-1");
    }
    let configure = |source| StoreError::Configure {
        location: location.to_string(),
        source,
    };
    let s3 = builder.build().map_err(configure)?;
    Ok(match prefix {
        Some(prefix) => Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)),
        None => Arc::new(s3),
    })
}

#[cfg(not(feature = "aws"))]
fn s3_store(
    location: &str,
    _bucket: Option<&str>,
    _prefix: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(StoreError::FeatureDisabled {
        location: location.to_string(),
        feature: "aws",
    })
}

/// The bound of a queue's open: `TAQUBA_OPEN_TIMEOUT_SECS` seconds when set
/// to a positive integer, else [`DEFAULT_OPEN_TIMEOUT`].
pub fn open_timeout() -> Duration {
    std::env::var(OPEN_TIMEOUT_ENV)
        .ok()
        .and_then(|secs| secs.trim().parse::<u64>().ok())
        .filter(|secs| *secs > 0)
        .map_or(DEFAULT_OPEN_TIMEOUT, Duration::from_secs)
}

/// Check that `store` answers: one listing, bounded by [`PROBE_TIMEOUT`].
///
/// # Errors
/// [`StoreError::Unreachable`] with the store's own error (for S3: the
/// server's code, such as `InvalidAccessKeyId` or `NoSuchBucket`);
/// [`StoreError::Timeout`] when it does not answer in time.
pub async fn probe(store: &dyn ObjectStore) -> Result<(), StoreError> {
    match tokio::time::timeout(PROBE_TIMEOUT, store.list_with_delimiter(None)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(StoreError::Unreachable {
            store: store.to_string(),
            detail: chain(&source),
            source,
        }),
        Err(_) => Err(StoreError::Timeout {
            what: "listing",
            store: store.to_string(),
            after: PROBE_TIMEOUT,
        }),
    }
}

/// `err` and its causes, `: `-separated, without repeating a cause whose
/// text its parent already shows.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// Open the queue at `path` in `store` with `options`: [`probe`] the store,
/// then open within [`open_timeout`].
///
/// # Errors
/// The probe's errors; [`StoreError::Timeout`] when the open does not
/// finish in time (the queue retries storage errors without end);
/// [`StoreError::Open`] when it fails.
pub async fn open_queue(
    store: Arc<dyn ObjectStore>,
    path: &str,
    options: OpenOptions,
) -> Result<Arc<Queue>, StoreError> {
    probe(store.as_ref()).await?;
    let after = open_timeout();
    let name = store.to_string();
    match tokio::time::timeout(after, Queue::open_with_options(store, path, options)).await {
        Ok(Ok(queue)) => Ok(Arc::new(queue)),
        Ok(Err(source)) => Err(StoreError::Open {
            store: name,
            source,
        }),
        Err(_) => Err(StoreError::Timeout {
            what: "opening the queue",
            store: name,
            after,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_not_a_store_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("afile");
        std::fs::write(&file, b"x").expect("write");
        let err = dir_store(&file).expect_err("a file is rejected");
        let message = err.to_string();
        assert!(
            message.contains("afile") && message.contains("not a directory"),
            "{message}"
        );
    }

    #[test]
    fn locations_are_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        let store = store_from_env_or_url(Some(sub.to_str().unwrap()), dir.path()).unwrap();
        assert!(store.to_string().contains("LocalFileSystem"), "{store}");
        assert!(sub.is_dir());
        let url = format!("file://{}", dir.path().join("c").display());
        store_from_env_or_url(Some(&url), dir.path()).unwrap();
        assert!(dir.path().join("c").is_dir());
        let err = store_from_env_or_url(Some("gs://b"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("s3://"), "{err}");
        let err = store_from_env_or_url(Some("file://rel"), dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::InvalidLocation { .. }), "{err}");
        let err = store_from_env_or_url(Some("s3://"), dir.path()).unwrap_err();
        assert!(err.to_string().contains("no bucket"), "{err}");
        #[cfg(not(feature = "aws"))]
        {
            let err = store_from_env_or_url(Some("s3://bucket/p"), dir.path()).unwrap_err();
            assert!(err.to_string().contains("--features aws"), "{err}");
        }
    }
}
