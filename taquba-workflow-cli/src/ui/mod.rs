//! `taquba-workflow ui`: a web dashboard of one store, served by this
//! process. It reads the store as the other commands do, through one
//! long-lived read-only [`taquba::QueueReader`] (so it works on a live
//! store and on a copied prefix alike), and sends cancel, signal and
//! requeue to the owning process as inbox commands, never by opening the
//! store as a writer. On a cluster root it shows every shard: listings
//! merged, a run's page and actions in the run's shard, the store page a
//! row per shard ([`app::Scope`]).
//!
//! Pages are rendered on the server ([`maud`] templates, every value
//! escaped) and refreshed in place by htmx while what they show can still
//! change; htmx and the stylesheet are compiled into the binary
//! ([`assets`]). It serves on a loopback address unless `--allow-remote`,
//! which needs a login token ([`auth`]: every request then carries the
//! token or a session's cookie), and guards itself ([`security`]): a Host
//! allowlist on loopback, a same-origin check and a per-process token on
//! every form.
//!
//! - [`app`]: the shared state and the routes.
//! - [`pages`]: one module per page (runs, a run, groups, dead letters,
//!   store, and the actions with their command page).
//! - [`layout`]: the page shell and the small pieces every page uses.

pub mod app;
pub mod assets;
pub mod auth;
pub mod error;
pub mod layout;
pub mod pages;
pub mod routes;
pub mod security;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::cli::{Global, UiArgs};
use crate::cluster::{self, ClusterSession};
use crate::error::{CliError, CliResult};
use crate::session::{self, Runtime, Session};
use crate::ui::app::{App, Scope};
use crate::ui::auth::Auth;
use crate::ui::security::Guard;

/// Serve the dashboard until Ctrl-C (or SIGTERM): read the login token
/// (if any) and check the address, open the store, bind, print the URL
/// (the first line on stdout), serve.
///
/// # Errors
/// [`CliError::Usage`] for a non-loopback address without
/// `--allow-remote`, `--allow-remote` without a token, or a token that
/// cannot be used (see [`auth::load_token`]); the store's errors;
/// [`CliError::Serve`] when the address cannot be bound or the server
/// fails.
pub async fn run(global: &Global, args: &UiArgs) -> CliResult<()> {
    let token = auth::load_token(
        std::env::var_os(auth::TOKEN_ENV),
        args.token_file.as_deref(),
    )?;
    security::check_listen(args.listen, args.allow_remote, token.is_some())?;
    let auth = token.map(|(token, source)| Auth::new(&token, source));
    let (location, store) = session::open_location(global).await?;
    let opened = match cluster::detect(&location, &store).await? {
        Some(record) => Opened::Cluster(ClusterSession::open(global, location, record).await?),
        None => {
            let session = Session::open_in(global, location, store).await?;
            match session.runtime(global).await {
                Ok(runtime) => Opened::Store(session, runtime),
                Err(e) => {
                    session.close().await;
                    return Err(e);
                }
            }
        }
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            opened.close().await;
            return Err(CliError::Serve(format!(
                "cannot listen on {}: {e}",
                args.listen
            )));
        }
    };
    let guard = match listener
        .local_addr()
        .map_err(|e| CliError::Serve(format!("cannot read the bound address: {e}")))
    {
        Ok(bound) => Guard::new(bound, args.allow_remote).map(|guard| (bound, guard)),
        Err(e) => Err(e),
    };
    let (bound, guard) = match guard {
        Ok(bound_guard) => bound_guard,
        Err(e) => {
            opened.close().await;
            return Err(e);
        }
    };
    let app = Arc::new(match opened {
        Opened::Store(session, runtime) => App::new(session, runtime, guard, args.read_only, auth),
        Opened::Cluster(cluster) => App::cluster(cluster, guard, args.read_only, auth),
    });
    announce(&app, bound, args.read_only);
    let served = axum::serve(listener, routes::router(app.clone()))
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| CliError::Serve(format!("the dashboard's server failed: {e}")));
    app.close_readers().await;
    served
}

/// What the dashboard opened before it binds.
enum Opened {
    Store(Session, Runtime),
    Cluster(ClusterSession),
}

impl Opened {
    async fn close(self) {
        match self {
            Opened::Store(session, _) => session.close().await,
            Opened::Cluster(cluster) => cluster.close().await,
        }
    }
}

/// Print the URL (the first line on stdout, for scripts), what the
/// address exposes, and where actions go.
fn announce(app: &App, bound: SocketAddr, read_only: bool) {
    use std::io::Write;
    // A closed stdout does not stop the dashboard.
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "taquba-workflow ui: http://{bound}/");
    let exposure = match (bound.ip().is_loopback(), &app.auth) {
        (true, None) => format!(
            "on loopback only: other machines cannot connect, and no login is asked (--listen ADDR --allow-remote serves others, with a token in {} or --token-file)",
            auth::TOKEN_ENV
        ),
        (true, Some(auth)) => format!(
            "on loopback only, every request needing the token from {} (log in at /login for a session of {}, or send Authorization: Bearer)",
            auth.source(),
            humantime::format_duration(auth.ttl())
        ),
        (false, Some(auth)) => format!(
            "on a non-loopback address (--allow-remote), every request needing the token from {} (log in at /login for a session of {}, or send Authorization: Bearer); this is plain http, so the token and the session cookie cross the network unencrypted: serve it behind TLS (a reverse proxy) or an SSH tunnel on any network you do not trust",
            auth.source(),
            humantime::format_duration(auth.ttl())
        ),
        // check_listen refuses it: said all the same.
        (false, None) => "on a non-loopback address with no login".to_string(),
    };
    let serving = match &app.scope {
        Scope::Store {
            session, runtime, ..
        } => format!(
            "store {} (queue path {:?}, runtime {:?})",
            session.target.location, session.target.db_path, runtime.queue_name
        ),
        Scope::Cluster { cluster, .. } => format!(
            "the cluster at {} ({} shards, {} with a queue)",
            cluster.location,
            cluster.record.shards,
            cluster.open_shards().count()
        ),
    };
    let _ = writeln!(out, "Serving {serving} {exposure}.");
    let _ = writeln!(
        out,
        "Reads follow what the owner flushed; {}. Ctrl-C stops.",
        if read_only {
            "actions are off (--read-only)"
        } else {
            "cancel, signal and requeue go to the owner's inbox"
        }
    );
    // The URL line is what a script waits for.
    let _ = out.flush();
}

/// Resolves on Ctrl-C, or SIGTERM on Unix.
async fn stopped() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            // No signal handler: serve until killed.
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
