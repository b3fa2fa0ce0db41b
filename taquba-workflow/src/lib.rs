//! Durable execution for Rust on object storage.
//!
//! `taquba-workflow` runs long, expensive, failure-prone work (LLM agent
//! runs, document pipelines, payment flows) as *runs*: sequences of *steps*
//! whose every transition is committed to object storage through the
//! [`taquba`] durable queue. A crash, a deploy or a Ctrl-C resumes each run
//! at its last committed step. There is no server and no database: the
//! runtime is a library embedded in one process, with its state in a local
//! directory or a bucket.
//!
//! # The model
//!
//! * A [`StepRunner`] turns one [`Step`] (its payload bytes, the run id, the
//!   step number, the delivery's handles) into a [`StepOutcome`]:
//!   [`StepOutcome::Continue`] with the next step's payload and a
//!   [`Trigger`] (now, after a delay, on a durable signal), or a terminal
//!   verdict ([`StepOutcome::Succeed`], [`StepOutcome::Fail`],
//!   [`StepOutcome::Cancel`]). An `Err(`[`StepError`]`)` is retried with the
//!   queue's backoff (transient) or dead-letters the step (permanent).
//! * Every transition is settled in **one** queue transaction: the
//!   acknowledgement of the claimed step, the enqueue of the next one, the
//!   run's current-step pointer, its terminal record and any KV effects the
//!   step staged. A crash between any two lines leaves the old state or the
//!   new one, never a mix.
//! * Delivery is at-least-once: a step whose lease expires is delivered
//!   again. [`Delivery::memo`] records expensive side effects so a retry
//!   reads the recorded value instead of paying twice, and
//!   [`WorkflowRuntimeBuilder::step_output_replay`] replays a whole
//!   recorded outcome.
//!
//! # Quick start
//!
//! ```no_run
//! use std::sync::Arc;
//! use taquba::{Queue, object_store::memory::InMemory};
//! use taquba_workflow::{
//!     NoopTerminalHook, RunSpec, Step, StepError, StepOutcome, StepRunner, WorkflowRuntime,
//! };
//!
//! struct Shout;
//!
//! impl StepRunner for Shout {
//!     async fn run_step(&self, step: &Step) -> Result<StepOutcome, StepError> {
//!         Ok(StepOutcome::Succeed { result: step.payload.to_ascii_uppercase() })
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(InMemory::new());
//! let queue = Arc::new(Queue::open(store.clone(), "demo").await?);
//! let runtime = WorkflowRuntime::builder(queue, store, Shout, NoopTerminalHook).build();
//! let worker = runtime.spawn(std::future::pending::<()>());
//! let run = runtime.submit(RunSpec { input: b"hi".to_vec(), ..Default::default() }).await?;
//! let end = runtime.wait(&run.run_id).await?;
//! assert_eq!(end.outcome.and_then(|o| o.result).as_deref(), Some(&b"HI"[..]));
//! worker.shutdown().await?;
//! # Ok(()) }
//! ```
//!
//! # Where the state lives
//!
//! * The queue's caller KV namespace, under the reserved prefix
//!   [`RESERVED_KV_PREFIX`] (`workflow/`): the run record (input hash,
//!   cancellation request, the version and patches of the code that
//!   submitted it: see [`versioning`]), the current-step pointer, the terminal record,
//!   retention markers, signal waiters and buffers, group member records
//!   and each group's submission counter.
//! * The object store passed to [`WorkflowRuntime::builder`], under the memo
//!   prefix (default `"{queue_name}-memo"`): memo entries, the run result
//!   record (`workflow.outcome` in the run memo, a key no memo write
//!   takes), step-output replay
//!   records, group manifests.
//!
//! Everything the runtime writes is MessagePack with named fields, so a
//! record written by one build is read by the next.
//!
//! # Cancel safety
//!
//! Every public async fn that commits is safe to drop at any await (a
//! request handler whose client disconnected, a `tokio::time::timeout`, an
//! aborted task): it runs on a Tokio task of its own, which a dropped
//! caller detaches rather than stops, so the call either committed nothing
//! or completes as if it had been awaited. Calls that commit more than once
//! (a cancel that records its request and then removes the step, a group
//! submitted in chunks) run whole on one such task. Each fn's
//! `# Cancel safety` section says what a dropped call leaves; reads are
//! cancel-safe by nature.
//!
//! # Time
//!
//! Every timestamp is read through a [`taquba::Clock`], by default the
//! queue's own, so a [`taquba::MockClock`] drives timers, replay schedules
//! and retention in tests ([`WorkflowRuntimeBuilder::clock`] overrides it).
//!
//! # Features
//!
//! * `macros` (default): `#[job]`, `#[workflow]` and `#[step]`.
//! * `testing`: the `testing` module, a test environment on a mock clock
//!   (run until idle, advance time, crash and reopen, inject failures).
//! * `opentelemetry`: the W3C trace context current at submission is
//!   stored with the run ([`headers::HEADER_TRACEPARENT`],
//!   [`headers::HEADER_TRACESTATE`]) and
//!   parents every step attempt's `workflow.step` span; a signal's sender
//!   is a span link of the step it wakes. (The spans themselves are always
//!   there, through `tracing`.)
//! * `metrics`: counters, histograms and gauges through the `metrics`
//!   facade (the README lists them).
//! * `webhooks`: `WebhookTerminalHook`, with a `DestinationPolicy` for
//!   where callbacks may go; `aws`, `gcp`, `azure`: `taquba`'s object
//!   stores.

#![warn(missing_docs)]

pub mod children {
    //! Child workflows: a step starts another run as its child
    //! ([`ChildrenHandle::start`] on [`Delivery::children`](crate::Delivery::children),
    //! or `ctx.start_child` in a `#[workflow]` step), committed with the
    //! step's settlement under a run id derived from the parent's and a key
    //! ([`child_run_id`]); a later step waits for its end with the durable
    //! signal wait on [`child_correlation_key`]
    //! ([`StepOutcome::continue_on_child`](crate::StepOutcome::continue_on_child),
    //! `Transition::on_child`) and reads it as a [`ChildEnd`]
    //! (`ctx.child_result`). Cancelling a parent cancels its active
    //! children first; a child whose parent ended or was cancelled is
    //! cancelled by the maintenance round. See the README's "Child
    //! workflows" section.
    pub use crate::coordination::children::{
        CHILD_CORRELATION_PREFIX, CHILD_ID_SEPARATOR, ChildEnd, ChildrenHandle,
        MAX_CHILD_RESULT_LEN, MAX_CHILDREN_PER_STEP, child_correlation_key, child_run_id,
    };
}
pub mod cluster;
mod coordination;
mod engine;
mod error;
mod fork;
mod generated;
pub mod history;
mod hooks;
pub mod inbox;
pub mod jobs;
mod model;
mod run;
pub mod runner;
mod runtime;
pub mod schedule;
mod settled;
mod store;
mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod versioning;
pub mod view;
mod worker;

#[doc(hidden)]
pub mod __private;
pub mod workflows;

// The 0.13 surface, at the paths 0.13 had.
pub use coordination::group::RunGroup;
pub use coordination::members::{GroupMember, GroupStatus, MemberResult};
pub use coordination::signal::SignalOutcome;
pub use error::{Error, Result};
pub use fork::{ForkOptions, ForkedFrom};
pub use hooks::terminal::{NoopTerminalHook, TerminalHook};
pub use model::{
    RunEnd, RunOptions, RunOutcome, RunSpec, RunState, RunStatus, RunTermination, StepError,
    StepErrorKind, StepOutcome, SubmitOutcome, TerminalStatus, Trigger,
};
pub use run::effects::{EffectsHandle, TerminalEffects};
pub use runner::{Delivery, Step, StepRunner};
pub use runtime::{RunnerHandle, WorkflowRuntime, WorkflowRuntimeBuilder};
pub use store::keys::{
    HEADER_RUN_ID, HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, HEADER_STEP, HEADER_TERMINAL,
    MAX_RUN_ID_LEN, RESERVED_HEADER_PREFIX, RESERVED_KV_PREFIX, RunId,
};
pub use store::kv::KvReadHandle;
pub use store::memo::{Memo, MemoStore};
pub use store::outage::{OutageExceeded, OutageGuard};
pub use view::WorkflowView;

#[cfg(feature = "macros")]
pub use taquba_workflow_macros::{job, workflow};

/// The limits the runtime enforces and the defaults it starts from: sizes
/// in bytes, counts, times in ms since the UNIX epoch. Each limit's
/// documentation says what is refused past it and with which
/// [`Error`].
pub mod limits {
    pub use crate::history::MAX_HISTORY_TEXT_LEN;
    pub use crate::model::{
        MAX_HEADERS, MAX_HEADERS_SIZE, MAX_RUN_AT_MS, MAX_TERMINATION_ERROR_LEN,
    };
    pub use crate::store::keys::{
        MAX_CONCURRENCY_KEY_LEN, MAX_CORRELATION_KEY_LEN, MAX_MEMBER_KEY_LEN, MAX_RUN_ID_LEN,
    };
    pub use crate::versioning::{MAX_PATCH_ID_LEN, MAX_PATCHES_SIZE};
    pub use crate::view::{DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT};

    /// The queue name of a runtime built without
    /// [`WorkflowRuntimeBuilder::queue_name`](crate::WorkflowRuntimeBuilder::queue_name)
    /// (`"workflow-steps"`); its memo prefix is then `"workflow-steps-memo"`.
    pub const DEFAULT_QUEUE_NAME: &str = crate::runtime::DEFAULT_QUEUE_NAME;
}

/// The reserved headers the runtime writes on step jobs (every name starts
/// with [`RESERVED_HEADER_PREFIX`]; a submission may not set one): the
/// 0.13 ones, also at the crate root, and the trace context a run carries
/// (feature `opentelemetry`).
pub mod headers {
    pub use crate::store::keys::{
        HEADER_RUN_ID, HEADER_SIGNAL_DELIVERED, HEADER_SIGNAL_WAIT, HEADER_STEP, HEADER_TERMINAL,
        HEADER_TRACEPARENT, HEADER_TRACESTATE, RESERVED_HEADER_PREFIX,
    };
}

/// Terminal notifications over HTTP (feature `webhooks`): the
/// [`WebhookTerminalHook`], the header that
/// names a run's destination, the
/// [`DestinationPolicy`](crate::webhooks::DestinationPolicy) that decides
/// where callbacks may go, the
/// [`WebhookDeliveryWorker`](crate::webhooks::WebhookDeliveryWorker) that
/// delivers them under it, and the delivery crate it enqueues for.
#[cfg(feature = "webhooks")]
pub mod webhooks {
    pub use crate::hooks::destination::{
        AddressClass, DestinationError, DestinationPolicy, Refusal,
    };
    pub use crate::hooks::webhook::{
        CALLBACK_URL_HEADER, DEFAULT_WEBHOOK_QUEUE, WebhookDeliveryWorker, WebhookTerminalHook,
    };
    /// The HTTP client crate of [`taquba_webhooks`] (for
    /// [`DestinationPolicy::http_client`]'s client and error).
    pub use reqwest;
    /// The webhook delivery crate the [`WebhookTerminalHook`] enqueues for
    /// (run its `WebhookWorker` on the delivery queue).
    pub use taquba_webhooks;
}

// The names added at the crate root before they moved into the modules
// above, kept so code written against those releases still builds; the
// documentation shows each at its module.
#[doc(hidden)]
pub use history::{
    AttemptOutcome, DEFAULT_HISTORY_LIMIT, MAX_ATTEMPTS_PER_STEP, MAX_HISTORY_TEXT_LEN, RunHistory,
    SignalWaitSpec, StepAttempt, StepHistory,
};
#[cfg(feature = "webhooks")]
#[doc(hidden)]
pub use hooks::webhook::{CALLBACK_URL_HEADER, DEFAULT_WEBHOOK_QUEUE, WebhookTerminalHook};
#[doc(hidden)]
pub use inbox::{
    Command, CommandAnswer, CommandId, CommandState, Inbox, MAX_COMMAND_SIZE, MAX_COMMAND_TEXT_LEN,
    SubmitCommand,
};
#[doc(hidden)]
pub use limits::DEFAULT_QUEUE_NAME;
#[doc(hidden)]
pub use model::{MAX_HEADERS, MAX_HEADERS_SIZE, MAX_RUN_AT_MS, MAX_TERMINATION_ERROR_LEN};
#[doc(hidden)]
pub use runner::Hosted;
#[doc(hidden)]
pub use store::keys::{
    HEADER_TRACEPARENT, HEADER_TRACESTATE, MAX_CORRELATION_KEY_LEN, MAX_MEMBER_KEY_LEN,
};
#[cfg(feature = "webhooks")]
#[doc(hidden)]
pub use taquba_webhooks;
#[doc(hidden)]
pub use view::{
    DEFAULT_PAGE_LIMIT, GroupPage, MAX_PAGE_LIMIT, RunDetails, RunFilter, RunPage, RunSummary,
    RuntimeInfo, SignalWait, StatusFilter,
};
