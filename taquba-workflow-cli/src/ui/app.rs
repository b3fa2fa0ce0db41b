//! The dashboard's shared state ([`App`]): what every request of one
//! dashboard process reads. Its routes are in [`crate::ui::routes`].

use taquba_workflow::inbox::Inbox;

use crate::commands::mutate;
use crate::output::Times;
use crate::session::{Runtime, Session};
use crate::ui::security::Guard;

/// The name the dashboard's inbox commands record as their sender's tool.
pub const SENDER_TOOL: &str = "taquba-workflow ui";

/// What every request of one dashboard process shares.
pub struct App {
    /// The open store and its reader.
    pub session: Session,
    /// The runtime whose runs it shows.
    pub runtime: Runtime,
    /// The inbox of that runtime's owner.
    pub inbox: Inbox,
    /// The request checks and the form token.
    pub guard: Guard,
    /// Whether actions are off (`--read-only`).
    pub read_only: bool,
}

impl App {
    /// The state of a dashboard over `session` showing `runtime`.
    pub fn new(session: Session, runtime: Runtime, guard: Guard, read_only: bool) -> Self {
        let inbox = mutate::inbox(&session, &runtime, SENDER_TOOL);
        Self {
            session,
            runtime,
            inbox,
            guard,
            read_only,
        }
    }

    /// Relative times as of now.
    pub fn times(&self) -> Times {
        Times::new(crate::cli::TimeFormat::Relative, Times::wall_clock_ms())
    }

    /// The store as the header shows it: `location (queue path)`.
    pub fn store_label(&self) -> String {
        format!(
            "{} · {}",
            self.session.target.location, self.session.target.db_path
        )
    }
}
