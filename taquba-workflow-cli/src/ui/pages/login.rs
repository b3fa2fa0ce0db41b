//! Logging in and out ([`crate::ui::auth`] has the design):
//!
//! - `GET /login[?next=PATH]`: the form (a password field for the token).
//!   It is the one page served without credentials, and shows nothing of
//!   the store; it loads nothing either (no stylesheet, no script: those
//!   need credentials too), its few styles inline and allowed by their
//!   hash in its Content-Security-Policy ([`LOGIN_CSP`]).
//! - `POST /login`: the token checked; on success a session cookie and a
//!   redirect to `next` (a path of the dashboard only), else the form
//!   again with 401.
//! - `POST /logout`: the session ended (in the process, not only in the
//!   browser) and the cookie removed.
//!
//! Without a token configured both lead to the runs.

use std::sync::{Arc, LazyLock};

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::ui::app::App;
use crate::ui::auth::{self, Auth, Credential};
use crate::ui::error::UiError;
use crate::ui::pages::url;

/// The login page's only styles (inline: the stylesheet needs
/// credentials).
const LOGIN_STYLE: &str = "body{margin:0;font:15px/1.5 system-ui,-apple-system,\"Segoe UI\",Roboto,sans-serif;background:#f6f7f9;color:#1c2330}main{max-width:380px;margin:12vh auto;padding:24px 28px;background:#fff;border:1px solid #dde1e8;border-radius:8px}h1{font-size:19px;margin:0 0 12px}label{display:block;margin:12px 0;color:#5d6778}input[type=password]{display:block;width:100%;box-sizing:border-box;margin-top:4px;padding:7px 9px;border:1px solid #dde1e8;border-radius:6px;font:inherit}button{padding:7px 16px;border:1px solid #1f4e79;border-radius:6px;background:#1f4e79;color:#fff;font:inherit;cursor:pointer}.error{color:#c53030}.note{color:#5d6778;font-size:13px}";

/// The Content-Security-Policy of the login page: the dashboard's, with
/// its inline styles allowed by their SHA-256 hash instead of the
/// stylesheet.
pub static LOGIN_CSP: LazyLock<String> = LazyLock::new(|| {
    let hash = base64(&Sha256::digest(LOGIN_STYLE.as_bytes()));
    format!(
        "default-src 'none'; style-src 'sha256-{hash}'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
});

/// Standard base64 (with padding) of `bytes`: the form of a CSP hash.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The query of the login page.
#[derive(Debug, Default, Deserialize)]
pub struct LoginQuery {
    /// Where to go once logged in.
    pub next: Option<String>,
}

/// The login form (no `Debug`: it holds the token as typed).
#[derive(Default, Deserialize)]
pub struct LoginForm {
    /// The token typed in.
    #[serde(default)]
    pub token: String,
    /// Where to go once logged in.
    #[serde(default)]
    pub next: String,
}

/// The login page, with `error` above the form.
fn login_page(next: &str, error: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Log in · taquba-workflow" }
                style { (PreEscaped(LOGIN_STYLE)) }
            }
            body {
                main {
                    h1 { "taquba-workflow" }
                    @if let Some(error) = error {
                        p.error #login-error { (error) }
                    }
                    form method="post" action="/login" {
                        input type="hidden" name="next" value=(next);
                        label { "Token"
                            input type="password" name="token" #token autocomplete="current-password" required autofocus;
                        }
                        button type="submit" #login { "Log in" }
                    }
                    p.note {
                        "The dashboard's token, as its operator set it (" code { (auth::TOKEN_ENV) } " or " code { "--token-file" } "). "
                        "Logged in already, from a link of another site? "
                        a #continue href=(next) { "Continue" }
                        " (the session cookie is sent only from the dashboard's own pages)."
                    }
                }
            }
        }
    }
}

/// The login page's response: `status`, the page, its CSP.
fn login_response(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let mut response = (status, login_page(next, error)).into_response();
    if let Ok(csp) = HeaderValue::from_str(&LOGIN_CSP) {
        response
            .headers_mut()
            .insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    response
}

/// `GET /login[?next=PATH]`: the form; straight to `next` for a browser
/// already logged in, or when the dashboard has no token.
pub async fn page(
    State(app): State<Arc<App>>,
    Query(query): Query<LoginQuery>,
    headers: HeaderMap,
) -> Response {
    let next = auth::local_path(query.next.as_deref());
    match &app.auth {
        Some(auth) if !auth.check(&headers).admitted() => {
            login_response(StatusCode::OK, &next, None)
        }
        _ => Redirect::to(&next).into_response(),
    }
}

/// `POST /login`: a session for the right token.
///
/// # Errors
/// 401 with the form again for another token; 500 when the OS's random
/// source fails.
pub async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = auth::local_path(Some(&form.next));
    let Some(auth) = &app.auth else {
        return Redirect::to(&next).into_response();
    };
    match auth.login(form.token.trim()) {
        Ok(Some(id)) => {
            let cookie = auth.session_cookie(&id, auth::over_https(&headers));
            with_cookie(Redirect::to(&next).into_response(), &cookie)
        }
        Ok(None) => login_response(
            StatusCode::UNAUTHORIZED,
            &next,
            Some("That is not this dashboard's token."),
        ),
        Err(e) => UiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Not logged in",
            e.to_string(),
        )
        .into_response(),
    }
}

/// `POST /logout`: end the session and remove its cookie.
pub async fn logout(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let Some(auth) = &app.auth else {
        return Redirect::to("/runs").into_response();
    };
    end_session(auth, &headers);
    with_cookie(
        Redirect::to("/login").into_response(),
        &auth::cleared_cookie(auth::over_https(&headers)),
    )
}

fn end_session(auth: &Auth, headers: &HeaderMap) {
    if let Credential::Session(id) = auth.check(headers) {
        auth.logout(&id);
    }
}

fn with_cookie(mut response: Response, cookie: &str) -> Response {
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// Where an unauthenticated request is sent: a browser's page to the login
/// form (coming back to the page), htmx's refresh of a region to the same
/// (through `HX-Redirect`, with 401), anything else (a script, a form's
/// POST, an asset, a wrong token) a bare 401 naming the ways in. None of
/// them says anything of the store.
pub fn unauthenticated(
    method: &axum::http::Method,
    uri: &axum::http::Uri,
    headers: &HeaderMap,
    credential: &Credential,
) -> Response {
    let wanted = uri
        .path_and_query()
        .map_or("/runs", |p| p.as_str())
        .to_string();
    let to_login = url("/login", &[("next", &auth::local_path(Some(&wanted)))]);
    let page = matches!(*method, axum::http::Method::GET | axum::http::Method::HEAD);
    let htmx = headers.contains_key("hx-request");
    let html = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if *credential == Credential::Missing && page && html && !htmx {
        return Redirect::to(&to_login).into_response();
    }
    let mut response = UiError::new(
        StatusCode::UNAUTHORIZED,
        "Log in first",
        match credential {
            Credential::Refused => "The Authorization header does not carry this dashboard's token: nothing was read or sent.",
            _ => "This dashboard needs its token: log in at /login, or send Authorization: Bearer TOKEN. Nothing was read or sent.",
        },
    )
    .into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"taquba-workflow ui\""),
    );
    if htmx && let Ok(value) = HeaderValue::from_str(&to_login) {
        headers.insert("hx-redirect", value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_one() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foob"), "Zm9vYg==");
        assert_eq!(
            base64(&Sha256::digest(b"")),
            "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }

    #[test]
    fn the_login_page_shows_nothing_it_was_not_given() {
        let page = login_page("/runs/a?b=<c>", Some("x")).into_string();
        assert!(page.contains(r#"type="password""#));
        assert!(page.contains("/runs/a?b=&lt;c&gt;"));
        assert!(!page.contains("<script"));
        assert!(LOGIN_CSP.contains("style-src 'sha256-"));
    }
}
