//! `--store`: the forms a store location takes, the object store each
//! builds, and the bounds on every call to it.
//!
//! | location | store |
//! |---|---|
//! | `/some/dir`, `./dir` | a local directory (must exist: the CLI never creates a store) |
//! | `file:///some/dir` | the same, as a URL |
//! | `s3://bucket` or `s3://bucket/prefix` | an S3 bucket (feature `aws`), under `prefix` |
//!
//! The S3 environment is the standard one: `AWS_ENDPOINT`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION` (default `us-east-1`) and `AWS_ALLOW_HTTP` (`true` for a
//! plain-HTTP endpoint such as a local S3 server).
//!
//! Each S3 HTTP request is bounded by [`S3_REQUEST_TIMEOUT`] (connect by
//! [`S3_CONNECT_TIMEOUT`]) with at most [`S3_MAX_RETRIES`] retries, and
//! [`probe`] lists the store once first, so wrong credentials fail with the
//! server's own message instead of a queue open that retries forever.
//! Every call to any store is bounded ([`BoundedStore`]). The
//! same approach as the examples' store helper, kept here so the CLI
//! depends on published crates only.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use taquba::object_store::local::LocalFileSystem;
use taquba::object_store::{self, ObjectStore};

use crate::bounded::{BoundedStore, MAX_CALLS_IN_FLIGHT, STORE_CALL_TIMEOUT};

/// The bound of one S3 HTTP request (the whole request, body included).
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound of establishing one S3 connection.
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub const S3_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of one failed S3 request (server errors, timeouts).
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub const S3_MAX_RETRIES: usize = 3;
/// The bound of [`probe`].
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why a store location could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    /// The location is neither a directory nor a supported URL.
    #[error("invalid store location {location:?}: {reason}")]
    Invalid {
        /// The location given.
        location: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A local store's directory does not exist or is not a directory.
    #[error("no store at {}: {reason}", path.display())]
    NoDirectory {
        /// The directory.
        path: PathBuf,
        /// What was found instead.
        reason: &'static str,
    },
    /// The location needs a cargo feature this build lacks.
    #[cfg_attr(feature = "aws", allow(dead_code))]
    #[error(
        "store location {location:?} needs the `{feature}` feature: install with `--features {feature}`"
    )]
    FeatureDisabled {
        /// The location given.
        location: String,
        /// The missing feature.
        feature: &'static str,
    },
    /// The object store client could not be configured.
    #[error("cannot configure the store {location:?}: {source}")]
    Configure {
        /// The location given.
        location: String,
        /// The client's error.
        source: object_store::Error,
    },
    /// The store answered the probe with an error (wrong credentials, no
    /// such bucket, endpoint down).
    #[error("the store {location} is not usable: {detail}")]
    Unreachable {
        /// The location given.
        location: String,
        /// The store's error with its chain of causes.
        detail: String,
    },
    /// An operation on the store did not finish in time.
    #[error(
        "{what} on the store {location} did not finish within {} (is the endpoint reachable and are the credentials right?)",
        humantime::format_duration(*after)
    )]
    Timeout {
        /// The operation.
        what: &'static str,
        /// The location given.
        location: String,
        /// The bound that elapsed.
        after: Duration,
    },
}

/// A parsed `--store` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local directory.
    Dir(PathBuf),
    /// An S3 bucket, optionally under a prefix (no leading or trailing
    /// `/`).
    S3 {
        /// The bucket.
        bucket: String,
        /// The prefix inside the bucket.
        prefix: Option<String>,
    },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Dir(path) => write!(f, "{}", path.display()),
            Location::S3 {
                bucket,
                prefix: None,
            } => write!(f, "s3://{bucket}"),
            Location::S3 {
                bucket,
                prefix: Some(prefix),
            } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

impl Location {
    /// Parse a location (see the [module documentation](self)).
    ///
    /// # Errors
    /// [`LocationError::Invalid`] for an empty location, an unsupported URL
    /// scheme, a relative `file://` path or an `s3://` URL without a
    /// bucket.
    pub fn parse(location: &str) -> Result<Self, LocationError> {
        let location = location.trim();
        let invalid = |reason| LocationError::Invalid {
            location: location.to_string(),
            reason,
        };
        if location.is_empty() {
            return Err(invalid("empty"));
        }
        if let Some(rest) = location.strip_prefix("s3://") {
            let (bucket, prefix) = match rest.split_once('/') {
                Some((bucket, prefix)) => (bucket, prefix.trim_matches('/')),
                None => (rest, ""),
            };
            if bucket.is_empty() {
                return Err(invalid("no bucket after `s3://`"));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            });
        }
        if let Some(path) = location.strip_prefix("file://") {
            if !path.starts_with('/') {
                return Err(invalid("a file URL needs an absolute path (`file:///dir`)"));
            }
            return Ok(Location::Dir(PathBuf::from(path)));
        }
        if location.contains("://") {
            return Err(invalid("supported URL schemes are `s3://` and `file://`"));
        }
        Ok(Location::Dir(PathBuf::from(location)))
    }

    /// The location `prefix` (slash-separated object path parts) below
    /// this one: a subdirectory, or a longer bucket prefix.
    pub fn below(&self, prefix: &str) -> Location {
        let prefix = prefix.trim_matches('/');
        match self {
            Location::Dir(root) => Location::Dir(
                prefix
                    .split('/')
                    .filter(|part| !part.is_empty())
                    .fold(root.clone(), |dir, part| dir.join(part)),
            ),
            Location::S3 {
                bucket,
                prefix: None,
            } => Location::S3 {
                bucket: bucket.clone(),
                prefix: (!prefix.is_empty()).then(|| prefix.to_string()),
            },
            Location::S3 {
                bucket,
                prefix: Some(above),
            } => Location::S3 {
                bucket: bucket.clone(),
                prefix: Some(if prefix.is_empty() {
                    above.clone()
                } else {
                    format!("{above}/{prefix}")
                }),
            },
        }
    }

    /// The object store of this location, every call to it bounded by
    /// [`STORE_CALL_TIMEOUT`] ([`BoundedStore`]). Nothing is sent to it
    /// yet: [`probe`] checks that it answers.
    ///
    /// # Errors
    /// [`LocationError::NoDirectory`] for a directory that does not exist
    /// (the CLI never creates a store), [`LocationError::FeatureDisabled`]
    /// for S3 in a build without `aws`, [`LocationError::Configure`].
    pub fn object_store(&self) -> Result<Arc<dyn ObjectStore>, LocationError> {
        let store = match self {
            Location::Dir(path) => dir_store(path),
            Location::S3 { bucket, prefix } => {
                s3_store(&self.to_string(), bucket, prefix.as_deref())
            }
        }?;
        Ok(Arc::new(BoundedStore::new(
            store,
            STORE_CALL_TIMEOUT,
            MAX_CALLS_IN_FLIGHT,
        )))
    }
}

fn dir_store(path: &Path) -> Result<Arc<dyn ObjectStore>, LocationError> {
    if !path.exists() {
        return Err(LocationError::NoDirectory {
            path: path.to_path_buf(),
            reason: "the directory does not exist",
        });
    }
    if !path.is_dir() {
        return Err(LocationError::NoDirectory {
            path: path.to_path_buf(),
            reason: "the path is a file, not a directory",
        });
    }
    let store =
        LocalFileSystem::new_with_prefix(path).map_err(|source| LocationError::Configure {
            location: path.display().to_string(),
            source,
        })?;
    Ok(Arc::new(store))
}

#[cfg(feature = "aws")]
fn s3_store(
    location: &str,
    bucket: &str,
    prefix: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, LocationError> {
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
    // The URL's bucket wins over `AWS_BUCKET`.
    builder = builder.with_bucket_name(bucket);
    if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        builder = builder.with_region("us-east-1");
    }
    let s3 = builder.build().map_err(|source| LocationError::Configure {
        location: location.to_string(),
        source,
    })?;
    Ok(match prefix {
        Some(prefix) => Arc::new(object_store::prefix::PrefixStore::new(s3, prefix)),
        None => Arc::new(s3),
    })
}

#[cfg(not(feature = "aws"))]
fn s3_store(
    location: &str,
    _bucket: &str,
    _prefix: Option<&str>,
) -> Result<Arc<dyn ObjectStore>, LocationError> {
    Err(LocationError::FeatureDisabled {
        location: location.to_string(),
        feature: "aws",
    })
}

/// Check that `store` answers: one listing, bounded by [`PROBE_TIMEOUT`].
///
/// # Errors
/// [`LocationError::Unreachable`] with the store's own error (for S3: the
/// server's code, such as `InvalidAccessKeyId` or `NoSuchBucket`);
/// [`LocationError::Timeout`] when it does not answer in time.
pub async fn probe(store: &dyn ObjectStore, location: &Location) -> Result<(), LocationError> {
    match tokio::time::timeout(PROBE_TIMEOUT, store.list_with_delimiter(None)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(source)) => Err(LocationError::Unreachable {
            location: location.to_string(),
            detail: chain(&source),
        }),
        Err(_) => Err(LocationError::Timeout {
            what: "listing",
            location: location.to_string(),
            after: PROBE_TIMEOUT,
        }),
    }
}

/// `err` and its causes, `: `-separated, without repeating a cause whose
/// text its parent already shows.
pub fn chain(err: &dyn std::error::Error) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_below_another_nests_under_it() {
        assert_eq!(
            Location::Dir("/c".into()).below("shards/3"),
            Location::Dir("/c/shards/3".into())
        );
        assert_eq!(
            Location::parse("s3://b").unwrap().below("/shards/0/"),
            Location::parse("s3://b/shards/0").unwrap()
        );
        assert_eq!(
            Location::parse("s3://b/prod").unwrap().below("shards/7"),
            Location::parse("s3://b/prod/shards/7").unwrap()
        );
    }

    #[test]
    fn locations_parse_into_their_forms() {
        assert_eq!(
            Location::parse("/tmp/wr").unwrap(),
            Location::Dir("/tmp/wr".into())
        );
        assert_eq!(
            Location::parse("file:///tmp/wr").unwrap(),
            Location::Dir("/tmp/wr".into())
        );
        assert_eq!(
            Location::parse("s3://b/some/prefix/").unwrap(),
            Location::S3 {
                bucket: "b".into(),
                prefix: Some("some/prefix".into())
            }
        );
        assert_eq!(
            Location::parse("s3://b").unwrap().to_string(),
            "s3://b".to_string()
        );
        for (bad, why) in [
            ("", "empty"),
            ("s3://", "no bucket"),
            ("file://rel", "absolute path"),
            ("gs://b", "s3://"),
        ] {
            let err = Location::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn a_missing_directory_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = Location::Dir(missing.clone())
            .object_store()
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(!missing.exists());
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let err = Location::Dir(file).object_store().map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[cfg(not(feature = "aws"))]
    #[test]
    fn s3_needs_the_aws_feature() {
        let err = Location::parse("s3://b/p")
            .unwrap()
            .object_store()
            .map(|_| ())
            .unwrap_err();
        assert!(err.to_string().contains("--features aws"), "{err}");
    }
}
