//! The store as presented (`store info`, the dashboard's store page):
//! [`StoreInfoJson`] with what the reader sees of the writer, the
//! runtimes recorded, the queues' counts, the first dead letters and the
//! size of each top-level prefix.

use serde::Serialize;

/// `store info`, as printed.
#[derive(Debug, Serialize)]
pub struct StoreInfoJson {
    /// The store location.
    pub store: String,
    /// The queue's path in the store.
    pub db: String,
    /// What the reader knows of the writer.
    pub writer: WriterJson,
    /// The runtimes the store records.
    pub runtimes: Vec<RuntimeJson>,
    /// Job counts per queue.
    pub queues: Vec<QueueJson>,
    /// The first dead letters of each queue.
    pub dead_letters: Vec<DeadLetterJson>,
    /// Objects and bytes per top-level prefix.
    pub prefixes: Vec<PrefixJson>,
    /// Objects in the whole store.
    pub total_objects: u64,
    /// Bytes in the whole store.
    pub total_bytes: u64,
    /// Entries of a local store that are not regular files (links, FIFOs,
    /// sockets): not counted, not followed, not opened.
    pub passed_over: u64,
}

/// A runtime recorded in the store.
#[derive(Debug, Serialize)]
pub struct RuntimeJson {
    /// Its queue name.
    pub queue_name: String,
    /// Its memo prefix.
    pub memo_prefix: String,
    /// The taquba-workflow version of its last worker start.
    pub crate_version: String,
    /// When that worker started (ms since the Unix epoch).
    pub started_at_ms: u64,
    /// When that worker stopped cleanly (ms since the Unix epoch); `None`
    /// while it runs, after a crash, or when the runtime records no stop.
    pub stopped_at_ms: Option<u64>,
}

/// The writer, as the reader sees it.
#[derive(Debug, Serialize)]
pub struct WriterJson {
    /// The writer epoch in the manifest (advances with each writer open).
    pub epoch: u64,
    /// The time embedded in the newest flushed table (writer clock, ms):
    /// for display only, an idle writer leaves it old, and so does one that
    /// commits often but flushes rarely.
    pub last_flush_at_ms: Option<u64>,
    /// The sequence number up to which writes are durable (moves with every
    /// commit).
    pub durable_seq: u64,
    /// The newest object of the write-ahead log: the last commit, as the
    /// store's clock stamps it.
    pub newest_wal: Option<WalObject>,
    /// The last liveness beat, when the writer writes them.
    pub heartbeat: Option<HeartbeatJson>,
}

/// A writer's liveness beat.
#[derive(Debug, Serialize)]
pub struct HeartbeatJson {
    /// When it was written (writer clock, ms).
    pub at_ms: u64,
    /// The interval between beats (ms).
    pub interval_ms: u64,
    /// The beat counter.
    pub counter: u64,
    /// The epoch of the writer that wrote it.
    pub writer_epoch: u64,
    /// Whether it is the closing beat of a clean close.
    pub closed: bool,
}

/// One queue's counts.
#[derive(Debug, Serialize)]
pub struct QueueJson {
    /// The queue name.
    pub queue: String,
    /// Claimable now.
    pub pending: i64,
    /// Waiting for a time (timers, backoff, signal timeouts).
    pub scheduled: i64,
    /// Held by a worker.
    pub claimed: i64,
    /// Completed (cumulative).
    pub done: i64,
    /// Dead letters.
    pub dead: i64,
}

/// One dead letter.
#[derive(Debug, Serialize)]
pub struct DeadLetterJson {
    /// Its queue.
    pub queue: String,
    /// The job id.
    pub job_id: String,
    /// The run it belongs to, for a step job.
    pub run_id: Option<String>,
    /// Attempts used / allowed.
    pub attempts: u32,
    /// The attempt limit.
    pub max_attempts: u32,
    /// Its last error.
    pub last_error: Option<String>,
}

/// One top-level prefix's size.
#[derive(Debug, Serialize)]
pub struct PrefixJson {
    /// The prefix (`""` for objects at the top level).
    pub prefix: String,
    /// Objects under it.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// The newest object of the queue's write-ahead log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WalObject {
    /// Its path in the store.
    pub path: String,
    /// When the store says it was written (ms since the Unix epoch).
    pub at_ms: u64,
}

/// `store info` of a cluster root, as printed.
#[derive(Debug, Serialize)]
pub struct ClusterInfoJson {
    /// The cluster root, as given.
    pub store: String,
    /// The cluster record's format.
    pub format: u32,
    /// The routing hash the record names.
    pub hash: String,
    /// The number of shards (fixed at creation).
    pub shard_count: u32,
    /// When the cluster was created (ms since the Unix epoch, the creating
    /// process's clock).
    pub created_at_ms: u64,
    /// Each shard, in order.
    pub shards: Vec<ShardInfoJson>,
}

/// One shard of a cluster in `store info`.
#[derive(Debug, Serialize)]
pub struct ShardInfoJson {
    /// The shard.
    pub shard: u32,
    /// Its location (`{root}/shards/{k}`).
    pub location: String,
    /// The queue's path in it.
    pub db: String,
    /// Whether its queue exists (a process has opened it).
    pub open: bool,
    /// Its owner and lease epoch, when the cluster records leases (`—`
    /// until then).
    pub owner: String,
    /// What the reader sees of its writer (absent for a shard not open).
    pub writer: Option<WriterJson>,
    /// The runtimes it records.
    pub runtimes: Vec<RuntimeJson>,
    /// Job counts per queue.
    pub queues: Vec<QueueJson>,
    /// The first dead letters of each queue.
    pub dead_letters: Vec<DeadLetterJson>,
}
