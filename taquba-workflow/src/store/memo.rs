//! Durable memos: [`MemoStore`] places entries in the object store under
//! the runtime's memo prefix, and a [`Memo`] is one namespace of it, scoped
//! to a step `(run_id, step_number)` or to a whole run. A memo records a
//! side effect's result so a retried step reads it instead of repeating
//! the effect. The same prefix also holds each run's result record and
//! step-output replay records, so clearing a run clears all of them.

use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use taquba::object_store::ObjectStore;
use taquba::object_store::path::Path;

use crate::error::{Error, Result};
use crate::store::blob::ObjectPrefix;
use crate::store::canonical;
use crate::store::durable;
use crate::store::keys::RunId;

/// The run-memo key of the run result record (the committed
/// [`RunOutcome`](crate::RunOutcome) and its termination). Reserved: no
/// memo writes it ([`Memo::RESERVED_KEY`]).
pub(crate) const RUN_RESULT_MEMO_KEY: &str = "workflow.outcome";

/// The prefix of every [`Memo::content_key`].
const CONTENT_KEY_PREFIX: &str = "content:";

/// The memo entries of every run, in an object store under a path prefix.
///
/// Layout: `{prefix}/runs/{run_id}/steps/{step_number}/{key}` for step
/// memos, `{prefix}/runs/{run_id}/run.{key}` for the run memo (flat in the
/// run's directory: on a local file system the run result record every
/// run gets then creates one directory, not two) and
/// `{prefix}/runs/{run_id}/replay/...` for step-output replay records. The
/// runtime's prefix is [`WorkflowRuntimeBuilder::memo_prefix`](crate::WorkflowRuntimeBuilder::memo_prefix)
/// (default `"{queue_name}-memo"`); build a `MemoStore` at the same prefix
/// to read a runtime's memos from elsewhere.
#[derive(Clone, Debug)]
pub struct MemoStore {
    objects: ObjectPrefix,
}

impl MemoStore {
    /// A memo store over `store` under `prefix`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<String>) -> Self {
        Self {
            objects: ObjectPrefix::new(store, prefix),
        }
    }

    /// The memo of step `step_number` of `run_id`.
    pub fn new_memo(&self, run_id: &RunId, step_number: u32) -> Memo {
        Memo {
            objects: self.objects.clone(),
            run_id: run_id.clone(),
            step_number: Some(step_number),
        }
    }

    /// The run-scoped memo of `run_id`, shared by all its steps.
    pub fn new_run_memo(&self, run_id: &RunId) -> Memo {
        Memo {
            objects: self.objects.clone(),
            run_id: run_id.clone(),
            step_number: None,
        }
    }

    /// Remove every memo entry of `run_id` (step memos, run memo, the run
    /// result record and step-output replay records). Returns how many
    /// objects were removed.
    ///
    /// # Errors
    /// [`Error::Store`] when listing or deleting fails; entries deleted
    /// before the failure stay deleted.
    pub async fn clear_memos_for_run(&self, run_id: &RunId) -> Result<usize> {
        // A wait must not report the result record removed here from the
        // outcomes this process keeps of lately ended runs.
        crate::run::recent_ends::forget_everywhere(run_id);
        let removed = self.objects.delete_all(&self.run_dir(run_id)).await;
        crate::run::recent_ends::forget_everywhere(run_id);
        removed
    }

    fn run_dir(&self, run_id: &RunId) -> Path {
        self.objects.path(&["runs", run_id])
    }

    /// The path of the replay record of `(run_id, step_number, payload
    /// digest)`.
    pub(crate) fn replay_path(&self, run_id: &RunId, step_number: u32, digest: &[u8]) -> Path {
        let step = step_number.to_string();
        let digest = hex::encode(digest);
        self.objects
            .path(&["runs", run_id, "replay", &step, &digest])
    }

    /// The object access under this store's prefix.
    pub(crate) fn objects(&self) -> &ObjectPrefix {
        &self.objects
    }
}

/// One memo namespace: a step's (`(run_id, step_number)`) or a run's.
///
/// Values are bytes ([`get`](Self::get) / [`put`](Self::put)) or typed
/// ([`memoized`](Self::memoized): MessagePack with named fields). A memo is
/// a retry-safety cache: readers must tolerate an absent entry by doing the
/// work again. The durable channel between steps is the `Continue` payload.
#[derive(Clone, Debug)]
pub struct Memo {
    objects: ObjectPrefix,
    run_id: RunId,
    step_number: Option<u32>,
}

impl Memo {
    /// The memo key of each run's result record (the committed
    /// [`RunOutcome`](crate::RunOutcome) and its termination) in its run
    /// memo. No memo takes it: [`put`](Self::put), [`memoized`](Self::memoized)
    /// and their variants refuse it with [`Error::InvalidMemoKey`], in step
    /// memos as in run memos. [`get`](Self::get) reads it.
    pub const RESERVED_KEY: &'static str = RUN_RESULT_MEMO_KEY;

    /// Refuse a key no memo writes (see [`Error::InvalidMemoKey`]).
    fn check_key(key: &str) -> Result<()> {
        let reason = if key == RUN_RESULT_MEMO_KEY {
            "reserved for the run result record"
        } else if key.is_empty() {
            "empty"
        } else {
            return Ok(());
        };
        Err(Error::InvalidMemoKey {
            key: key.to_string(),
            reason,
        })
    }

    /// The run this memo belongs to.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The step this memo is scoped to; `None` for a run memo.
    pub fn step_number(&self) -> Option<u32> {
        self.step_number
    }

    fn path(&self, key: &str) -> Path {
        match self.step_number {
            Some(step) => {
                let step = step.to_string();
                self.objects
                    .path(&["runs", &self.run_id, "steps", &step, key])
            }
            None => self
                .objects
                .path(&["runs", &self.run_id, &format!("run.{key}")]),
        }
    }

    /// The bytes stored under `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Store`] when the object store cannot be read.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.objects.get(&self.path(key)).await?.map(|b| b.to_vec()))
    }

    /// Store `value` under `key`, replacing any earlier value.
    ///
    /// # Cancel safety
    ///
    /// One object write, which object stores apply whole or
    /// not at all; a dropped call leaves the earlier value or `value`.
    ///
    /// # Errors
    /// [`Error::InvalidMemoKey`] for [`Memo::RESERVED_KEY`] and the empty
    /// key; [`Error::Store`] when the object store rejects the write.
    pub async fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        Self::check_key(key)?;
        self.put_reserved(key, value).await
    }

    /// [`put`](Self::put) without the key check: for the runtime's own
    /// records under reserved keys.
    pub(crate) async fn put_reserved(&self, key: &str, value: &[u8]) -> Result<()> {
        self.objects.put(&self.path(key), value).await
    }

    /// The value recorded under `key`, or else the value of `compute`,
    /// recorded before it is returned. An entry that does not decode as `R`
    /// is treated as absent and overwritten; an error from `compute` records
    /// nothing and is returned as is.
    ///
    /// # Cancel safety
    ///
    /// Dropped before `compute` returned, nothing is
    /// recorded (a retry computes again); dropped during the write, the
    /// value is recorded whole or not at all.
    ///
    /// # Errors
    /// `compute`'s error, or an [`Error`] (converted with `E: From<Error>`)
    /// when the store fails or the value cannot be encoded;
    /// [`Error::InvalidMemoKey`] for [`Memo::RESERVED_KEY`] and the empty
    /// key, before `compute` runs.
    pub async fn memoized<R, F, E>(&self, key: &str, compute: F) -> std::result::Result<R, E>
    where
        R: Serialize + DeserializeOwned,
        F: Future<Output = std::result::Result<R, E>>,
        E: From<Error>,
    {
        Self::check_key(key)?;
        if let Some(bytes) = self.get(key).await? {
            let whose = format_args!("{}/{key}", self.run_id).to_string();
            if let Some(value) = durable::decode_or_absent::<R>(&bytes, "memo entry", &whose) {
                return Ok(value);
            }
        }
        let value = compute.await?;
        let bytes = durable::try_encode(&value)?;
        self.put(key, &bytes).await?;
        Ok(value)
    }

    /// [`memoized`](Self::memoized) under the key
    /// [`content_key`](Self::content_key)`(input)`. Include an operation
    /// name in `input` when several operations may see equal inputs.
    /// # Cancel safety
    ///
    /// As [`memoized`](Self::memoized).
    ///
    /// # Errors
    /// As [`memoized`](Self::memoized), plus an encoding failure of `input`.
    pub async fn memoized_by_content<K, R, F, E>(
        &self,
        input: &K,
        compute: F,
    ) -> std::result::Result<R, E>
    where
        K: Serialize + ?Sized,
        R: Serialize + DeserializeOwned,
        F: Future<Output = std::result::Result<R, E>>,
        E: From<Error>,
    {
        let key = Self::content_key(input)?;
        self.memoized(&key, compute).await
    }

    /// The memo key derived from `input`: `content:` followed by the
    /// lowercase hex SHA-256 (64 characters) of its canonical MessagePack
    /// encoding with named fields.
    ///
    /// The canonical encoding sorts the entries of every map by their
    /// encoded key bytes, at every depth, and the elements of every
    /// `HashSet` by their encoded bytes, so equal inputs give one key
    /// whatever order their maps and sets iterate in; struct fields keep
    /// their declaration order. For an input without maps and sets it is
    /// exactly the plain encoding, so the key is 0.13's and the entries a
    /// 0.13 store holds are found. An input with a map or a set may get a
    /// key other than 0.13's (whose key depended on iteration order): its
    /// entry is recomputed once.
    ///
    /// # Errors
    /// [`Error::Serialization`] when `input` cannot be encoded.
    pub fn content_key<T>(input: &T) -> Result<String>
    where
        T: Serialize + ?Sized,
    {
        let bytes = canonical::to_vec(input)?;
        Ok(format!(
            "{CONTENT_KEY_PREFIX}{}",
            hex::encode(crate::store::keys::sha256(&bytes))
        ))
    }

    /// [`get`](Self::get) under [`content_key`](Self::content_key)`(input)`.
    ///
    /// # Errors
    /// As `get` and `content_key`.
    pub async fn content_get<T>(&self, input: &T) -> Result<Option<Vec<u8>>>
    where
        T: Serialize + ?Sized,
    {
        self.get(&Self::content_key(input)?).await
    }

    /// [`put`](Self::put) under [`content_key`](Self::content_key)`(input)`.
    /// # Cancel safety
    ///
    /// As [`put`](Self::put).
    ///
    /// # Errors
    /// As `put` and `content_key`.
    pub async fn content_put<T>(&self, input: &T, value: &[u8]) -> Result<()>
    where
        T: Serialize + ?Sized,
    {
        self.put(&Self::content_key(input)?, value).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use taquba::object_store::memory::InMemory;

    fn store() -> MemoStore {
        MemoStore::new(Arc::new(InMemory::new()), "t-memo")
    }

    #[tokio::test]
    async fn step_and_run_memos_are_separate_namespaces() {
        let memos = store();
        let run = RunId::new("r").unwrap();
        memos.new_memo(&run, 0).put("k", b"step0").await.unwrap();
        memos.new_memo(&run, 1).put("k", b"step1").await.unwrap();
        memos.new_run_memo(&run).put("k", b"run").await.unwrap();
        assert_eq!(
            memos.new_memo(&run, 0).get("k").await.unwrap().unwrap(),
            b"step0"
        );
        assert_eq!(
            memos.new_run_memo(&run).get("k").await.unwrap().unwrap(),
            b"run"
        );
        let other = RunId::new("r2").unwrap();
        memos.new_run_memo(&other).put("k", b"x").await.unwrap();
        assert_eq!(memos.clear_memos_for_run(&run).await.unwrap(), 3);
        assert!(memos.new_memo(&run, 1).get("k").await.unwrap().is_none());
        assert!(memos.new_run_memo(&other).get("k").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn run_memo_entries_sit_in_the_runs_directory() {
        use futures_util::TryStreamExt;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let memos = MemoStore::new(store.clone(), "t-memo");
        let run = RunId::new("r").unwrap();
        memos.new_run_memo(&run).put("k", b"v").await.unwrap();
        memos.new_memo(&run, 2).put("k", b"s").await.unwrap();
        let mut paths: Vec<String> = store
            .list(None)
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .unwrap();
        paths.sort();
        // One directory per run on a local file system for the run result
        // record, not two.
        assert_eq!(paths, ["t-memo/runs/r/run.k", "t-memo/runs/r/steps/2/k"]);
    }

    #[tokio::test]
    async fn memoized_computes_once_and_recomputes_over_garbage() {
        let memo = store().new_memo(&RunId::new("r").unwrap(), 0);
        let calls = std::sync::atomic::AtomicU32::new(0);
        let compute = || async {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, Error>(vec!["a".to_string()])
        };
        let first: Vec<String> = memo.memoized("k", compute()).await.unwrap();
        let second: Vec<String> = memo.memoized("k", compute()).await.unwrap();
        assert_eq!(first, second);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        memo.put("k", b"\xc1garbage").await.unwrap();
        let third: Vec<String> = memo.memoized("k", compute()).await.unwrap();
        assert_eq!(third, first);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
        let failed: std::result::Result<u32, Error> = memo
            .memoized("e", async { Err(Error::EffectsSealed) })
            .await;
        assert!(failed.is_err());
        assert!(
            memo.get("e").await.unwrap().is_none(),
            "an error stores nothing"
        );
    }

    #[test]
    fn content_keys_are_stable_digests() {
        let a = Memo::content_key(&("op", 1)).unwrap();
        let digest = a.strip_prefix("content:").unwrap();
        assert_eq!(digest.len(), 64);
        assert!(
            digest
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_eq!(a, Memo::content_key(&("op", 1)).unwrap());
        assert_ne!(a, Memo::content_key(&("op", 2)).unwrap());
    }
}
