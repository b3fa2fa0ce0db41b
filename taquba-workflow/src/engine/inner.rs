//! The state a runtime's public face ([`WorkflowRuntime`](crate::WorkflowRuntime))
//! and its worker loop (`worker::driver`) share: the engine with the
//! application's runner and terminal hook. Both import it from here, so
//! neither imports the other for it.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::RuntimeCore;

/// The state a runtime shares between its clones: the engine and the
/// application's runner and hook.
pub(crate) struct RuntimeInner<R, H> {
    pub(crate) core: Arc<RuntimeCore>,
    pub(crate) runner: R,
    pub(crate) terminal_hook: Arc<H>,
    /// The bound on one `on_termination` call.
    pub(crate) hook_timeout: Duration,
}
