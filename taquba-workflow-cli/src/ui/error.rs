//! [`UiError`]: a request that cannot be answered with its page, shown as
//! an error page with its status code (404 for an unknown run, group or
//! command, 400 for a bad value, 403 for a refused form, 409 for an action
//! that does not apply, 500 for a store that failed).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::error::CliError;
use crate::ui::layout;

/// A failed request: its status, a title and what went wrong.
#[derive(Debug)]
pub struct UiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The page's title.
    pub title: String,
    /// What happened, naming the value involved.
    pub message: String,
}

/// The result of a handler.
pub type UiResult<T> = Result<T, UiError>;

impl UiError {
    /// An error page.
    pub fn new(status: StatusCode, title: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status,
            title: title.into(),
            message: message.into(),
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "Not found", message)
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "Bad request", message)
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "Refused", message)
    }
}

impl From<CliError> for UiError {
    fn from(e: CliError) -> Self {
        let message = e.to_string();
        match e {
            CliError::RunNotFound(_) | CliError::RunNotInCluster { .. } => Self::not_found(message),
            CliError::Usage(_) => Self::bad_request(message),
            CliError::Refused(_) => Self::new(StatusCode::CONFLICT, "Does not apply", message),
            _ => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "The store did not answer",
                message,
            ),
        }
    }
}

impl From<taquba_workflow::Error> for UiError {
    fn from(e: taquba_workflow::Error) -> Self {
        CliError::from(e).into()
    }
}

impl From<taquba::Error> for UiError {
    fn from(e: taquba::Error) -> Self {
        CliError::from(e).into()
    }
}

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        (self.status, layout::error_page(&self.title, &self.message)).into_response()
    }
}

/// The fallback route: 404.
pub async fn not_found(uri: axum::http::Uri) -> UiError {
    UiError::not_found(format!("No page at {}.", uri.path()))
}
