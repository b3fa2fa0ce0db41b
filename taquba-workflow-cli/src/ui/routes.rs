//! The dashboard's routes ([`router`]) and the middleware in front of
//! every one of them ([`guard`]): the checks of [`crate::ui::security`],
//! the login of [`crate::ui::auth`] (when the dashboard has a token), the
//! bound on serving one request ([`REQUEST_TIMEOUT`]) and the response
//! headers.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::ui::app::App;
use crate::ui::error::UiError;
use crate::ui::pages::{actions, dead, groups, keys, login, run, runs, schedules, store};
use crate::ui::security::CONTENT_SECURITY_POLICY;
use crate::ui::{assets, error};

/// The longest a request is served: past it the answer is 504 (every call
/// to the store is bounded too, see [`crate::bounded`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The one path served without credentials: the login form and its POST.
pub const LOGIN_PATH: &str = "/login";

/// Every route of the dashboard, behind [`guard`].
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(|| async { Redirect::to("/runs") }))
        .route(LOGIN_PATH, get(login::page).post(login::login))
        .route("/logout", axum::routing::post(login::logout))
        .route("/runs", get(runs::page))
        .route("/runs/{id}", get(run::page))
        .route(
            "/runs/{id}/cancel",
            get(actions::confirm_cancel).post(actions::cancel),
        )
        .route("/runs/{id}/requeue", axum::routing::post(actions::requeue))
        .route("/runs/{id}/fork", axum::routing::post(actions::fork))
        .route("/signal", get(actions::signal_form).post(actions::signal))
        .route("/commands/{id}", get(actions::command_page))
        .route("/groups", get(groups::list))
        .route("/groups/{id}", get(groups::page))
        .route("/dead-letters", get(dead::page))
        .route("/schedules", get(schedules::page))
        .route("/keys", get(keys::page))
        .route(
            "/schedules/{name}/pause",
            axum::routing::post(schedules::pause),
        )
        .route(
            "/schedules/{name}/resume",
            axum::routing::post(schedules::resume),
        )
        .route("/store", get(store::page))
        .route(assets::HTMX_PATH, get(assets::htmx))
        .route(assets::STYLE_PATH, get(assets::style))
        .route(assets::ICON_PATH, get(assets::icon))
        .fallback(error::not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// The middleware of every route: the Host allowlist, the same-origin
/// check of state-changing requests, the credentials of every request but
/// the login form's when the dashboard has a token (pages, htmx's
/// refreshes, assets and actions alike), and the security headers of
/// every response.
pub async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    let mut response = if !app.guard.host_allowed(host) {
        UiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "Not this dashboard",
            format!(
                "This dashboard answers only to its loopback names (Host {:?} is not one of them).",
                host.unwrap_or("")
            ),
        )
        .into_response()
    } else if !matches!(*request.method(), Method::GET | Method::HEAD)
        && let Err(why) = app.guard.same_origin(request.headers())
    {
        UiError::new(
            StatusCode::FORBIDDEN,
            "Refused: not from this dashboard",
            format!("{why}: nothing was sent."),
        )
        .into_response()
    } else if let Some(auth) = &app.auth
        && request.uri().path() != LOGIN_PATH
        && let credential = auth.check(request.headers())
        && !credential.admitted()
    {
        login::unauthenticated(
            request.method(),
            request.uri(),
            request.headers(),
            &credential,
        )
    } else {
        match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
            Ok(response) => response,
            Err(_) => UiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "The store did not answer",
                format!(
                    "The page was not ready within {}: the store did not answer in time.",
                    humantime::format_duration(REQUEST_TIMEOUT)
                ),
            )
            .into_response(),
        }
    };
    let headers = response.headers_mut();
    // A page with its own policy (the login form's) keeps it.
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
