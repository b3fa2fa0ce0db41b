//! [`KvReadHandle`]: a step's read access to committed state in the queue's
//! caller KV namespace.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use taquba::Queue;

use crate::error::Result;

/// Reads of the queue's caller KV namespace from inside a step. Answers from
/// committed state only: effects staged by the running step through
/// [`Delivery::effects`](crate::Delivery::effects) are not visible until its
/// settlement commits.
#[derive(Clone, Default)]
pub struct KvReadHandle {
    queue: Option<Arc<Queue>>,
}

impl KvReadHandle {
    /// A handle bound to no queue: every read finds nothing. For tests.
    pub fn detached() -> Self {
        Self { queue: None }
    }

    pub(crate) fn for_queue(queue: Arc<Queue>) -> Self {
        Self { queue: Some(queue) }
    }

    /// The committed value at `key`, or `None`.
    ///
    /// # Errors
    /// [`Error::Queue`](crate::Error::Queue) when the store cannot be read.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Bytes>> {
        match &self.queue {
            Some(queue) => Ok(queue.view().kv_get(key).await?),
            None => Ok(None),
        }
    }
}

impl fmt::Debug for KvReadHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvReadHandle")
            .field("detached", &self.queue.is_none())
            .finish()
    }
}
