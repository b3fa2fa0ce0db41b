//! What keeps the dashboard to its user.
//!
//! - [`check_listen`]: a loopback address unless `--allow-remote`, and
//!   `--allow-remote` only with a login token ([`crate::ui::auth`], which
//!   checks every request's credentials).
//! - [`Guard::host_allowed`]: on loopback, only requests naming the
//!   dashboard by a loopback name (`127.0.0.1:PORT`, `localhost:PORT`,
//!   `[::1]:PORT`) in `Host` are served, so a page of another site cannot
//!   read the dashboard by pointing its own name at 127.0.0.1 (DNS
//!   rebinding).
//! - [`Guard::same_origin`]: a request that changes something (any method
//!   but GET and HEAD) must come from the dashboard's own pages: its
//!   `Origin` (or, without one, its `Referer`) names the `Host` it was sent
//!   to, and a browser's `Sec-Fetch-Site` says `same-origin`.
//! - [`Guard::verify_token`]: every form carries the per-process token
//!   (32 bytes from the OS's random source, new with each start), which a
//!   page of another origin cannot read.
//! - [`CONTENT_SECURITY_POLICY`] and the other response headers, which
//!   the routes' middleware ([`crate::ui::routes::guard`]) sets with the
//!   checks above: a Content-Security-Policy allowing only the dashboard's own
//!   scripts and styles (no inline script runs, whatever a value holds),
//!   no framing, no MIME sniffing, no caching of pages.

use std::net::SocketAddr;

use axum::http::header::{self, HeaderMap};

use crate::error::{CliError, CliResult};
use crate::ui::auth;

/// The Content-Security-Policy of every response.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Refuse to serve on an address other machines can reach unless
/// `allow_remote`, and to serve others (`allow_remote`) without a login
/// token (`has_token`).
///
/// # Errors
/// [`CliError::Usage`] naming the address, the flag, and how to set a
/// token.
pub fn check_listen(addr: SocketAddr, allow_remote: bool, has_token: bool) -> CliResult<()> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(CliError::Usage(format!(
            "--listen {addr} is not a loopback address: whoever reaches it would read every run and could cancel, signal and requeue them; to serve other machines pass --allow-remote with a login token ({}), or listen on 127.0.0.1",
            auth::how_to_set()
        )));
    }
    if allow_remote && !has_token {
        return Err(CliError::Usage(format!(
            "--allow-remote needs a login token, so that only those who hold it read and steer the runs: {}",
            auth::how_to_set()
        )));
    }
    Ok(())
}

/// The checks of one dashboard process: its form token and the `Host`
/// values it answers.
#[derive(Debug, Clone)]
pub struct Guard {
    token: String,
    /// The `Host` values served (lowercase); `None`: any (`--allow-remote`,
    /// where the names others reach it by are not known).
    hosts: Option<Vec<String>>,
}

impl Guard {
    /// The guard of a dashboard bound to `bound`: a fresh token, and on a
    /// loopback address the loopback names of its port.
    ///
    /// # Errors
    /// [`CliError::Serve`] when the OS's random source fails.
    pub fn new(bound: SocketAddr, allow_remote: bool) -> CliResult<Self> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| CliError::Serve(format!("cannot draw the form token from the OS: {e}")))?;
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self::with_token(token, bound, allow_remote))
    }

    /// [`new`](Self::new) with a given token.
    pub fn with_token(token: String, bound: SocketAddr, allow_remote: bool) -> Self {
        let hosts = (bound.ip().is_loopback() && !allow_remote).then(|| {
            let port = bound.port();
            let ip = match bound {
                SocketAddr::V4(v4) => v4.ip().to_string(),
                SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
            };
            let mut names = vec![
                ip,
                "127.0.0.1".to_string(),
                "localhost".to_string(),
                "[::1]".to_string(),
            ];
            names.dedup();
            let mut hosts: Vec<String> = names.iter().map(|n| format!("{n}:{port}")).collect();
            if port == 80 {
                hosts.extend(names);
            }
            hosts
        });
        Self { token, hosts }
    }

    /// The token every form carries.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether `given` is this process's token (compared in constant time).
    pub fn verify_token(&self, given: &str) -> bool {
        let (a, b) = (self.token.as_bytes(), given.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Whether a request sent to `host` (its `Host` header) is served.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        match (host, &self.hosts) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(host), Some(hosts)) => {
                let host = host.to_ascii_lowercase();
                hosts.contains(&host)
            }
        }
    }

    /// Whether a state-changing request with `headers` comes from the
    /// dashboard's own pages.
    ///
    /// # Errors
    /// Why not, in words.
    pub fn same_origin(&self, headers: &HeaderMap) -> Result<(), String> {
        let text = |name: header::HeaderName| {
            headers
                .get(name)
                .map(|v| v.to_str().map(str::to_string).unwrap_or_default())
        };
        let host = text(header::HOST).unwrap_or_default().to_ascii_lowercase();
        if let Some(site) = headers.get("sec-fetch-site") {
            let site = site.to_str().unwrap_or_default();
            if site != "same-origin" && site != "none" {
                return Err(format!(
                    "the request came from another site (Sec-Fetch-Site: {site})"
                ));
            }
        }
        if let Some(origin) = text(header::ORIGIN) {
            return match authority(&origin) {
                Some(from) if from == host => Ok(()),
                _ => Err(format!(
                    "the request's Origin {origin:?} is not this dashboard ({host})"
                )),
            };
        }
        if let Some(referer) = text(header::REFERER) {
            return match authority(&referer) {
                Some(from) if from == host => Ok(()),
                _ => Err(format!(
                    "the request's Referer {referer:?} is not this dashboard ({host})"
                )),
            };
        }
        // Neither header: not a browser's cross-site request (browsers send
        // Origin with every POST); the token decides.
        Ok(())
    }
}

/// The `host[:port]` of an `http(s)://` URL or origin, lowercase.
fn authority(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    (!authority.is_empty()).then(|| authority.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::HeaderValue;

    fn loopback() -> Guard {
        Guard::with_token("t0k3n".into(), "127.0.0.1:8233".parse().unwrap(), false)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn only_loopback_addresses_without_the_flag_and_a_token() {
        let any = "0.0.0.0:8233".parse().unwrap();
        let lo = "127.0.0.1:8233".parse().unwrap();
        assert!(check_listen(lo, false, false).is_ok());
        assert!(check_listen(lo, false, true).is_ok());
        assert!(check_listen("[::1]:8233".parse().unwrap(), false, false).is_ok());
        let err = check_listen(any, false, true).unwrap_err();
        assert!(matches!(err, CliError::Usage(_)));
        let text = err.to_string();
        assert!(
            text.contains("0.0.0.0:8233") && text.contains("--allow-remote"),
            "{text}"
        );
        for addr in [any, lo] {
            let text = check_listen(addr, true, false).unwrap_err().to_string();
            assert!(
                text.contains(auth::TOKEN_ENV) && text.contains("--token-file PATH"),
                "{text}"
            );
        }
        assert!(check_listen(any, true, true).is_ok());
    }

    #[test]
    fn loopback_answers_only_its_loopback_names() {
        let guard = loopback();
        for host in [
            "127.0.0.1:8233",
            "localhost:8233",
            "LOCALHOST:8233",
            "[::1]:8233",
        ] {
            assert!(guard.host_allowed(Some(host)), "{host}");
        }
        for host in ["evil.example:8233", "127.0.0.1:9999", "localhost", ""] {
            assert!(!guard.host_allowed(Some(host)), "{host}");
        }
        assert!(!guard.host_allowed(None));
        let remote = Guard::with_token("t".into(), "0.0.0.0:8233".parse().unwrap(), true);
        assert!(remote.host_allowed(Some("dash.internal:8233")));
        let port80 = Guard::with_token("t".into(), "127.0.0.1:80".parse().unwrap(), false);
        assert!(port80.host_allowed(Some("localhost")));
    }

    #[test]
    fn forms_must_come_from_the_dashboard() {
        let guard = loopback();
        let host = ("host", "127.0.0.1:8233");
        assert!(
            guard
                .same_origin(&headers(&[host, ("origin", "http://127.0.0.1:8233")]))
                .is_ok()
        );
        let err = guard
            .same_origin(&headers(&[host, ("origin", "http://evil.example")]))
            .unwrap_err();
        assert!(err.contains("evil.example"), "{err}");
        assert!(
            guard
                .same_origin(&headers(&[host, ("origin", "null")]))
                .is_err()
        );
        assert!(
            guard
                .same_origin(&headers(&[
                    host,
                    ("referer", "http://127.0.0.1:8233/runs/x/cancel")
                ]))
                .is_ok()
        );
        assert!(
            guard
                .same_origin(&headers(&[
                    host,
                    ("referer", "http://127.0.0.1:8233.evil/")
                ]))
                .is_err()
        );
        assert!(
            guard
                .same_origin(&headers(&[
                    host,
                    ("origin", "http://127.0.0.1:8233"),
                    ("sec-fetch-site", "cross-site")
                ]))
                .is_err()
        );
        // A client that is not a browser: the token decides.
        assert!(guard.same_origin(&headers(&[host])).is_ok());
    }

    #[test]
    fn the_token_must_match_exactly() {
        let guard = loopback();
        assert!(guard.verify_token("t0k3n"));
        assert!(!guard.verify_token("t0k3"));
        assert!(!guard.verify_token("t0k3N"));
        assert!(!guard.verify_token(""));
        let fresh = Guard::new("127.0.0.1:1".parse().unwrap(), false).unwrap();
        let other = Guard::new("127.0.0.1:1".parse().unwrap(), false).unwrap();
        assert_eq!(fresh.token().len(), 64);
        assert_ne!(fresh.token(), other.token());
    }
}
