//! The files the pages load, compiled into the binary: htmx (vendored,
//! see `assets/README.md`), the stylesheet and the icon. Nothing is loaded
//! from elsewhere.

use axum::http::header;
use axum::response::IntoResponse;

/// The version of the embedded htmx.
pub const HTMX_VERSION: &str = "2.0.11";
/// Where htmx is served (its version in the name, so it is cached for
/// good).
pub const HTMX_PATH: &str = "/assets/htmx-2.0.11.min.js";
/// Where the stylesheet is served.
pub const STYLE_PATH: &str = "/assets/style.css";
/// Where the icon is served.
pub const ICON_PATH: &str = "/assets/icon.svg";

const HTMX: &str = include_str!("../../assets/htmx-2.0.11.min.js");
const STYLE: &str = include_str!("../../assets/style.css");
const ICON: &str = r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" fill="#1f4e79"/><path d="M4 4h8v2H9v6H7V6H4z" fill="#fff"/></svg>"##;

/// `GET /assets/htmx-2.0.11.min.js`.
pub async fn htmx() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        HTMX,
    )
}

/// `GET /assets/style.css` (revalidated on every load: it changes with
/// the binary, under the same name).
pub async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        STYLE,
    )
}

/// `GET /assets/icon.svg`.
pub async fn icon() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        ICON,
    )
}
