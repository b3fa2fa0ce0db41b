//! The dashboard's login: who may read and steer the runs it serves.
//!
//! **The token.** A secret the operator chooses, taken from the
//! environment variable [`TOKEN_ENV`] or from a file (`--token-file
//! PATH`), never from the command line (where `ps` and shell histories
//! show it): [`load_token`]. It is at least [`MIN_TOKEN_LEN`] visible ASCII
//! characters (so it fits an `Authorization` header and a password
//! field). A token file must be a regular file that neither group nor
//! others can read or write (mode `0600` or `0400`), as ssh asks of a
//! private key. `--allow-remote` refuses to start without a token; on
//! loopback one is optional, and enforced when given.
//!
//! **Checking it.** [`Auth`] keeps only the SHA-256 digest of the token,
//! and compares the digest of what a request presents with it in constant
//! time ([`subtle::ConstantTimeEq`]): the time taken says nothing of how
//! many bytes matched, nor (the digests being of fixed length) of the
//! token's length.
//!
//! **Sessions.** A browser logs in once at `/login` ([`Auth::login`]);
//! the answer sets a cookie ([`SESSION_COOKIE`]) holding a random session
//! id (32 bytes from the OS's random source, hex), never the token. The
//! process keeps the digest of each live session id with its expiry
//! ([`SESSION_TTL`] after the login) in memory, at most [`MAX_SESSIONS`]
//! of them: a logout ([`Auth::logout`]) ends a session at once, a restart
//! ends them all. The cookie is `HttpOnly` (no script reads it),
//! `SameSite=Strict` (no other site's page or link sends it) and
//! `Path=/`; it is `Secure` when the browser reached the dashboard over
//! https (through a TLS-terminating proxy: the dashboard itself serves
//! plain http, where a `Secure` cookie would never come back).
//!
//! Scripts send `Authorization: Bearer TOKEN` with each request instead
//! ([`Auth::check`]).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::header::{self, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{CliError, CliResult};

/// The environment variable holding the dashboard's login token.
pub const TOKEN_ENV: &str = "TAQUBA_WORKFLOW_UI_TOKEN";
/// The shortest token accepted, in characters.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest token accepted, in characters.
pub const MAX_TOKEN_LEN: usize = 1024;
/// The name of the session cookie.
pub const SESSION_COOKIE: &str = "taquba_workflow_session";
/// How long a session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept at once; a login past it ends the session that
/// would expire first.
pub const MAX_SESSIONS: usize = 1024;

/// How to give the dashboard a token: the text every refusal for a missing
/// token ends with.
pub fn how_to_set() -> String {
    format!(
        "set the environment variable {TOKEN_ENV} to a secret of at least {MIN_TOKEN_LEN} characters (for example `export {TOKEN_ENV}=$(openssl rand -hex 32)`), or pass --token-file PATH naming a file that holds it and that only its owner can read (chmod 600 PATH); the token is never taken on the command line"
    )
}

/// Where the token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// The environment variable [`TOKEN_ENV`].
    Env,
    /// The file given to `--token-file`.
    File(String),
}

impl std::fmt::Display for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::Env => write!(f, "the environment variable {TOKEN_ENV}"),
            TokenSource::File(path) => write!(f, "the file {path}"),
        }
    }
}

/// The login token from `env` (the value of [`TOKEN_ENV`], if set) or
/// the file `file` (`--token-file`); `None` when neither is given.
/// Surrounding whitespace (a file's final newline) is trimmed.
///
/// # Errors
/// [`CliError::Usage`] naming the source (never the token) when both are
/// given, the variable is set but empty or not UTF-8, the file cannot be
/// read, is not a regular file or (on Unix) is open to group or others,
/// or the token is shorter than [`MIN_TOKEN_LEN`], longer than
/// [`MAX_TOKEN_LEN`] or holds a character that is not visible ASCII.
pub fn load_token(
    env: Option<OsString>,
    file: Option<&Path>,
) -> CliResult<Option<(String, TokenSource)>> {
    let (raw, source) = match (env, file) {
        (None, None) => return Ok(None),
        (Some(_), Some(path)) => {
            return Err(CliError::Usage(format!(
                "the dashboard's token is given twice: {TOKEN_ENV} is set and --token-file {} is passed; use one of them",
                path.display()
            )));
        }
        (Some(value), None) => {
            let text = value.into_string().map_err(|_| {
                CliError::Usage(format!(
                    "{TOKEN_ENV} is not valid UTF-8: the token must be visible ASCII characters"
                ))
            })?;
            (text, TokenSource::Env)
        }
        (None, Some(path)) => (
            read_token_file(path)?,
            TokenSource::File(path.display().to_string()),
        ),
    };
    let token = raw.trim();
    if token.is_empty() {
        return Err(CliError::Usage(format!(
            "{source} is empty: the dashboard's token must be at least {MIN_TOKEN_LEN} characters"
        )));
    }
    let chars = token.chars().count();
    if chars < MIN_TOKEN_LEN {
        return Err(CliError::Usage(format!(
            "the token in {source} is {chars} characters long: it must be at least {MIN_TOKEN_LEN} (for example `openssl rand -hex 32`)"
        )));
    }
    if chars > MAX_TOKEN_LEN {
        return Err(CliError::Usage(format!(
            "the token in {source} is {chars} characters long: it must be at most {MAX_TOKEN_LEN}"
        )));
    }
    if let Some(at) = token.chars().position(|c| !c.is_ascii_graphic()) {
        return Err(CliError::Usage(format!(
            "the token in {source} has a character that is not visible ASCII (a space, a control character or non-ASCII) at position {}: it must fit an `Authorization: Bearer` header",
            at + 1
        )));
    }
    Ok(Some((token.to_string(), source)))
}

/// The text of the token file at `path`, checked first: a regular file
/// that (on Unix) neither group nor others can read or write.
fn read_token_file(path: &Path) -> CliResult<String> {
    let shown = path.display();
    let mut file = std::fs::File::open(path)
        .map_err(|e| CliError::Usage(format!("cannot open --token-file {shown}: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| CliError::Usage(format!("cannot examine --token-file {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(CliError::Usage(format!(
            "--token-file {shown} is not a regular file"
        )));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(CliError::Usage(format!(
                "--token-file {shown} is open to group or others (mode {mode:04o}): whoever reads it can log in to the dashboard; make it readable by its owner only (chmod 600 {shown})"
            )));
        }
    }
    let mut bytes = Vec::new();
    // A token is at most MAX_TOKEN_LEN characters, plus whitespace: read
    // no more than a bit past it.
    let limit = (MAX_TOKEN_LEN * 4 + 64) as u64;
    file.by_ref()
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| CliError::Usage(format!("cannot read --token-file {shown}: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(CliError::Usage(format!(
            "--token-file {shown} is over {limit} bytes: it must hold only the token"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        CliError::Usage(format!(
            "--token-file {shown} is not valid UTF-8: the token must be visible ASCII characters"
        ))
    })
}

/// How a request showed (or failed to show) who sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer` with the token.
    Bearer,
    /// The cookie of a live session (its id).
    Session(String),
    /// An `Authorization` header that is not the token (a wrong token, or
    /// another scheme).
    Refused,
    /// Neither a header nor a live session.
    Missing,
}

impl Credential {
    /// Whether the request may be served.
    pub fn admitted(&self) -> bool {
        matches!(self, Credential::Bearer | Credential::Session(_))
    }
}

/// The token's digest and the live sessions of one dashboard process.
pub struct Auth {
    token: [u8; 32],
    source: TokenSource,
    /// The digest of each live session id, and when it expires.
    sessions: Mutex<HashMap<[u8; 32], Instant>>,
    ttl: Duration,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Auth {
    /// The login of a dashboard whose token is `token` (from `source`),
    /// sessions lasting [`SESSION_TTL`].
    pub fn new(token: &str, source: TokenSource) -> Self {
        Self::with_ttl(token, source, SESSION_TTL)
    }

    /// [`new`](Self::new) with sessions lasting `ttl`.
    pub fn with_ttl(token: &str, source: TokenSource, ttl: Duration) -> Self {
        Self {
            token: digest(token.as_bytes()),
            source,
            sessions: Mutex::new(HashMap::new()),
            ttl,
        }
    }

    /// Where the token came from.
    pub fn source(&self) -> &TokenSource {
        &self.source
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Whether `given` is the token: their SHA-256 digests compared in
    /// constant time.
    pub fn is_token(&self, given: &str) -> bool {
        bool::from(digest(given.as_bytes()).ct_eq(&self.token))
    }

    /// Who sent a request with `headers`: an `Authorization` header decides
    /// when there is one (the token as a bearer, or refused), else the
    /// session cookie.
    pub fn check(&self, headers: &HeaderMap) -> Credential {
        if let Some(value) = headers.get(header::AUTHORIZATION) {
            let bearer = value
                .to_str()
                .ok()
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token.trim());
            return match bearer {
                Some(token) if self.is_token(token) => Credential::Bearer,
                _ => Credential::Refused,
            };
        }
        match session_cookie(headers) {
            Some(id) if self.session_live(&id) => Credential::Session(id),
            _ => Credential::Missing,
        }
    }

    /// Log in with `given`: a new session's id when it is the token.
    ///
    /// # Errors
    /// `Ok(None)` for another token; [`CliError::Serve`] when the OS's
    /// random source fails.
    pub fn login(&self, given: &str) -> CliResult<Option<String>> {
        if !self.is_token(given) {
            return Ok(None);
        }
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| CliError::Serve(format!("cannot draw a session id from the OS: {e}")))?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|_, expires| *expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(first) = sessions
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(key, _)| *key)
        {
            sessions.remove(&first);
        }
        sessions.insert(digest(id.as_bytes()), now + self.ttl);
        Ok(Some(id))
    }

    /// End session `id` (nothing when it is not live).
    pub fn logout(&self, id: &str) {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.remove(&digest(id.as_bytes()));
    }

    /// Whether session `id` is live (an expired one is forgotten). The map
    /// is keyed by the id's digest, so a lookup's timing tells nothing of
    /// the live ids.
    pub fn session_live(&self, id: &str) -> bool {
        let key = digest(id.as_bytes());
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        match sessions.get(&key) {
            Some(expires) if *expires > Instant::now() => true,
            Some(_) => {
                sessions.remove(&key);
                false
            }
            None => false,
        }
    }

    /// How many sessions are kept (live or expired and not yet forgotten).
    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The `Set-Cookie` value starting session `id`; `secure` adds
    /// `Secure` (the browser reached the dashboard over https).
    pub fn session_cookie(&self, id: &str, secure: bool) -> String {
        let mut cookie = format!(
            "{SESSION_COOKIE}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
            self.ttl.as_secs()
        );
        if secure {
            cookie.push_str("; Secure");
        }
        cookie
    }
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn cleared_cookie(secure: bool) -> String {
    let mut cookie = format!("{SESSION_COOKIE}=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict");
    if secure {
        cookie.push_str("; Secure");
    }
    cookie
}

/// The session id in the request's cookies, if any.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().to_string())
        .filter(|value| !value.is_empty())
}

/// Whether the browser reached the dashboard over https: a
/// TLS-terminating proxy says so (`X-Forwarded-Proto: https`), or the
/// page the request came from was an https one (its `Origin`). Either
/// only ever adds `Secure` to the cookie, so a client that lies about it
/// only keeps its own cookie from coming back over plain http.
pub fn over_https(headers: &HeaderMap) -> bool {
    let value = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
    };
    value("x-forwarded-proto").is_some_and(|proto| proto == "https")
        || value("origin").is_some_and(|origin| origin.starts_with("https://"))
}

/// `next` when it is a path of this dashboard (`/…`, not `//host` or
/// `/\host`, which browsers read as another host), else `/runs`: where a
/// login leads, never to another site.
pub fn local_path(next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.starts_with("/\\")
                && path.len() <= 2048
                && !path.chars().any(|c| c.is_control() || c == '\\') =>
        {
            path.to_string()
        }
        _ => "/runs".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::header::HeaderValue;

    const TOKEN: &str = "correct-horse-battery-staple";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn file_with(text: &str, mode: u32) -> tempfile::TempPath {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        #[cfg(not(unix))]
        let _ = mode;
        file.into_temp_path()
    }

    fn usage(result: CliResult<Option<(String, TokenSource)>>) -> String {
        match result {
            Err(CliError::Usage(text)) => text,
            other => panic!("not a usage error: {other:?}"),
        }
    }

    #[test]
    fn the_token_comes_from_the_environment_or_a_private_file() {
        assert_eq!(load_token(None, None).unwrap(), None);
        let (token, source) = load_token(Some(format!(" {TOKEN}\n").into()), None)
            .unwrap()
            .unwrap();
        assert_eq!((token.as_str(), source), (TOKEN, TokenSource::Env));

        let private = file_with(&format!("{TOKEN}\n"), 0o600);
        let (token, source) = load_token(None, Some(&private)).unwrap().unwrap();
        assert_eq!(token, TOKEN);
        assert!(matches!(source, TokenSource::File(_)));

        let both = usage(load_token(Some(TOKEN.into()), Some(&private)));
        assert!(
            both.contains("given twice") && both.contains(TOKEN_ENV),
            "{both}"
        );
        let empty = usage(load_token(Some("  ".into()), None));
        assert!(
            empty.contains(TOKEN_ENV) && empty.contains("empty"),
            "{empty}"
        );
        let short = usage(load_token(Some("short-token".into()), None));
        assert!(short.contains("11 characters"), "{short}");
        assert!(
            !short.contains("short-token"),
            "the token is shown: {short}"
        );
        let spaced = usage(load_token(Some("a token with spaces".into()), None));
        assert!(spaced.contains("position 2"), "{spaced}");
        let missing = usage(load_token(None, Some(Path::new("/no/such/token"))));
        assert!(missing.contains("/no/such/token"), "{missing}");
    }

    #[cfg(unix)]
    #[test]
    fn a_token_file_others_can_read_is_refused() {
        for mode in [0o644, 0o640, 0o604, 0o620] {
            let open = file_with(TOKEN, mode);
            let text = usage(load_token(None, Some(&open)));
            assert!(
                text.contains(&format!("mode {mode:04o}")) && text.contains("chmod 600"),
                "{text}"
            );
        }
        assert!(load_token(None, Some(&file_with(TOKEN, 0o400))).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let text = usage(load_token(None, Some(dir.path())));
        assert!(text.contains("not a regular file"), "{text}");
    }

    #[test]
    fn only_the_token_is_admitted() {
        let auth = Auth::new(TOKEN, TokenSource::Env);
        assert!(auth.is_token(TOKEN));
        // The same length, one byte off; a prefix; longer; empty.
        let mut off = TOKEN.to_string();
        off.replace_range(TOKEN.len() - 1.., "f");
        for wrong in [off.as_str(), &TOKEN[..10], &format!("{TOKEN}x"), ""] {
            assert!(!auth.is_token(wrong), "{wrong:?}");
        }
        let bearer = |value: &str| auth.check(&headers(&[("authorization", value)]));
        assert_eq!(bearer(&format!("Bearer {TOKEN}")), Credential::Bearer);
        assert_eq!(bearer(&format!("bearer {TOKEN}")), Credential::Bearer);
        assert_eq!(bearer(&format!("Bearer {off}")), Credential::Refused);
        assert_eq!(bearer(&format!("Basic {TOKEN}")), Credential::Refused);
        assert_eq!(bearer(TOKEN), Credential::Refused);
        assert_eq!(auth.check(&HeaderMap::new()), Credential::Missing);
    }

    #[test]
    fn a_session_is_a_random_id_until_logout_or_expiry() {
        let auth = Auth::new(TOKEN, TokenSource::Env);
        assert_eq!(auth.login("wrong").unwrap(), None);
        let id = auth.login(TOKEN).unwrap().unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains(TOKEN));
        assert_ne!(auth.login(TOKEN).unwrap().unwrap(), id);
        let cookie = auth.session_cookie(&id, false);
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        assert!(!cookie.contains("Secure"));
        assert!(auth.session_cookie(&id, true).ends_with("; Secure"));

        let with = |cookie: &str| auth.check(&headers(&[("cookie", cookie)]));
        let sent = format!("theme=dark; {SESSION_COOKIE}={id}");
        assert_eq!(with(&sent), Credential::Session(id.clone()));
        assert_eq!(
            with(&format!("{SESSION_COOKIE}={}", "0".repeat(64))),
            Credential::Missing
        );
        assert_eq!(
            with(&format!("{SESSION_COOKIE}={TOKEN}")),
            Credential::Missing
        );
        auth.logout(&id);
        assert_eq!(with(&sent), Credential::Missing);

        let brief = Auth::with_ttl(TOKEN, TokenSource::Env, Duration::from_millis(1));
        let id = brief.login(TOKEN).unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!brief.session_live(&id));
        assert_eq!(brief.sessions(), 0);
    }

    #[test]
    fn sessions_are_bounded() {
        let auth = Auth::new(TOKEN, TokenSource::Env);
        let first = auth.login(TOKEN).unwrap().unwrap();
        // The first session expires strictly before the others.
        std::thread::sleep(Duration::from_millis(2));
        for _ in 0..MAX_SESSIONS {
            auth.login(TOKEN).unwrap();
        }
        assert_eq!(auth.sessions(), MAX_SESSIONS);
        assert!(!auth.session_live(&first), "the oldest session stays");
    }

    #[test]
    fn logins_lead_only_to_the_dashboard() {
        assert_eq!(
            local_path(Some("/runs/x?status=failed")),
            "/runs/x?status=failed"
        );
        for bad in [
            "//evil.example/",
            "/\\evil.example",
            "https://evil.example",
            "runs",
            "",
        ] {
            assert_eq!(local_path(Some(bad)), "/runs", "{bad}");
        }
        assert_eq!(local_path(None), "/runs");
    }

    #[test]
    fn https_is_told_by_the_proxy_or_the_origin() {
        assert!(!over_https(&headers(&[("origin", "http://dash:8233")])));
        assert!(over_https(&headers(&[("origin", "https://dash.example")])));
        assert!(over_https(&headers(&[("x-forwarded-proto", "HTTPS")])));
        assert!(!over_https(&HeaderMap::new()));
    }
}
