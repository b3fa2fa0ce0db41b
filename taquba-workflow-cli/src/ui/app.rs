//! The dashboard's shared state ([`App`]) and its routes ([`router`]).

use std::sync::Arc;

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;
use taquba_workflow::Inbox;

use crate::commands::mutate;
use crate::output::Times;
use crate::session::{Runtime, Session};
use crate::ui::pages::{actions, dead, groups, run, runs, store};
use crate::ui::security::{self, Guard};
use crate::ui::{assets, error};

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

/// Every route of the dashboard, behind [`security::guard`].
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route("/runs", get(runs::page))
        .route("/runs/{id}", get(run::page))
        .route(
            "/runs/{id}/cancel",
            get(actions::confirm_cancel).post(actions::cancel),
        )
        .route("/runs/{id}/requeue", axum::routing::post(actions::requeue))
        .route("/signal", get(actions::signal_form).post(actions::signal))
        .route("/commands/{id}", get(actions::command_page))
        .route("/groups", get(groups::list))
        .route("/groups/{id}", get(groups::page))
        .route("/dead-letters", get(dead::page))
        .route("/store", get(store::page))
        .route(assets::HTMX_PATH, get(assets::htmx))
        .route(assets::STYLE_PATH, get(assets::style))
        .route(assets::ICON_PATH, get(assets::icon))
        .fallback(error::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            security::guard,
        ))
        .with_state(app)
}
