//! The API edge of Warren, shared by `warrend` and the cluster gateway: everything between
//! a TCP or Unix socket and the API router.
//!
//! - **TLS** on TCP listeners (rustls; `--tls-cert`, `--tls-key`, and `--tls-client-ca` to
//!   require client certificates, used between gateways and nodes). Plain TCP is served only
//!   on loopback, with a warning ([`Edge::bind_tcp`]).
//! - **Tokens** from an auth file (`--auth FILE`, TOML; [`auth_file`]): tenants with the
//!   SHA-256 of their tokens, a role and quotas. Compared in constant time, re-read on SIGHUP
//!   ([`Edge::reload`]) without touching open connections; repeated failures from one source
//!   are slowed down ([`throttle`]).
//! - The **middleware** ([`authn::authenticate`]) that turns a request's token into a
//!   [`warren_types::Caller`] in its extensions. What a caller may see and do is decided by
//!   the router's owner (the node), never here.
//! - **Request ids** ([`request_id`]): `x-request-id` kept or made, in a tracing span around
//!   the request, in the response and in JSON error bodies; and the daemons' log format
//!   ([`logging`], `--log-format text|json`).
//! - **HTTP metrics** ([`http_metrics`]): requests by method, route template and status, and
//!   their time to the response head, for each server's `/metrics`.
//!
//! Plugging it into a server is a few lines:
//!
//! ```no_run
//! # async fn demo(args: warren_edge::EdgeArgs, router: axum::Router) -> Result<(), warren_edge::EdgeError> {
//! let edge = std::sync::Arc::new(warren_edge::Edge::from_args(&args)?);
//! let _reloader = edge.reload_on_sighup();
//! let listener = edge.bind_tcp("0.0.0.0:7443".parse().unwrap()).await?;
//! edge.serve_tcp(listener, edge.protect(router), std::future::pending()).await;
//! # Ok(()) }
//! ```

pub mod auth_file;
pub mod authn;
mod error;
pub mod http_metrics;
pub mod logging;
pub mod request_id;
pub mod serve;
pub mod throttle;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use tokio::net::{TcpListener, UnixListener};

pub use auth_file::{token_sha256, AuthFile, Tenant};
pub use authn::Authenticator;
pub use error::{AuthFileError, EdgeError};
pub use http_metrics::HttpMetrics;
pub use serve::Peer;
pub use tls::{Tls, TlsFiles};

/// The command-line flags of the edge, for `#[command(flatten)]`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EdgeArgs {
    /// PEM certificate chain served on TCP listeners (TLS); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require TCP clients to present a certificate signed by this CA (PEM); used between
    /// gateways and nodes.
    #[arg(long, requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Auth file (TOML): tenants, SHA-256 hashes of their tokens, roles and quotas; re-read
    /// on SIGHUP. Without it every caller is the node's administrator.
    #[arg(long)]
    pub auth: Option<PathBuf>,
}

/// Authentication and TLS of one server.
#[derive(Debug)]
pub struct Edge {
    auth: Arc<Authenticator>,
    tls: Option<Arc<Tls>>,
}

impl Edge {
    pub fn new(auth: Authenticator, tls: Option<Tls>) -> Edge {
        Edge {
            auth: Arc::new(auth),
            tls: tls.map(Arc::new),
        }
    }

    /// Reads the auth file and the TLS files named by `args`.
    pub fn from_args(args: &EdgeArgs) -> Result<Edge, EdgeError> {
        let auth = match &args.auth {
            Some(p) => Authenticator::from_file(p.clone())?,
            None => Authenticator::open(),
        };
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(Tls::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: args.tls_client_ca.clone(),
            })?),
            (None, None) if args.tls_client_ca.is_none() => None,
            _ => {
                return Err(EdgeError::Config(
                    "--tls-cert and --tls-key go together (and --tls-client-ca needs them)".into(),
                ))
            }
        };
        Ok(Edge::new(auth, tls))
    }

    pub fn authenticator(&self) -> &Arc<Authenticator> {
        &self.auth
    }

    pub fn tls(&self) -> Option<&Arc<Tls>> {
        self.tls.as_ref()
    }

    /// `app` behind the authentication middleware: every request gets a
    /// [`warren_types::Caller`] or a `401`, and a request id ([`request_id`]).
    pub fn protect(&self, app: Router) -> Router {
        app.layer(axum::middleware::from_fn_with_state(
            self.auth.clone(),
            authn::authenticate,
        ))
        // Outermost, so a refused token's answer and its log lines carry the id too.
        .layer(axum::middleware::from_fn(request_id::tag))
    }

    /// Binds a TCP listener. Without TLS only loopback addresses are accepted (with a
    /// warning): tokens would cross the network in clear.
    pub async fn bind_tcp(&self, addr: SocketAddr) -> Result<TcpListener, EdgeError> {
        if self.tls.is_none() && !addr.ip().is_loopback() {
            return Err(EdgeError::Config(format!(
                "plain HTTP is served only on loopback; give --tls-cert and --tls-key to listen on {addr}"
            )));
        }
        let l = TcpListener::bind(addr)
            .await
            .map_err(|source| EdgeError::Bind {
                addr: addr.to_string(),
                source,
            })?;
        let local = l.local_addr().unwrap_or(addr);
        match (&self.tls, self.auth.enabled()) {
            (None, _) => tracing::warn!(
                addr = %local,
                "serving plain HTTP on loopback: anyone on this host can connect; use TLS for remote access"
            ),
            (Some(t), false) if t.files().client_ca.is_none() => tracing::warn!(
                addr = %local,
                "serving TLS without --auth or --tls-client-ca: every client is the administrator"
            ),
            (Some(t), _) => tracing::info!(
                addr = %local,
                client_certificates = t.files().client_ca.is_some(),
                tokens = self.auth.enabled(),
                "serving TLS"
            ),
        }
        Ok(l)
    }

    /// Serves `app` (usually [`Edge::protect`]ed) on `listener` until `shutdown`, then waits
    /// for open connections to finish.
    pub async fn serve_tcp(
        &self,
        listener: TcpListener,
        app: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        serve::serve_tcp(listener, self.tls.clone(), app, shutdown).await
    }

    /// Serves `app` on a Unix socket: root peers act as the administrator without a token,
    /// everyone else (`--socket-group`) presents one when an auth file is in force.
    pub async fn serve_unix(
        &self,
        listener: UnixListener,
        app: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        serve::serve_unix(listener, app, shutdown).await
    }

    /// Re-reads the auth file and the TLS files. Each part that fails keeps what is in
    /// force; the error says which.
    pub fn reload(&self) -> Result<String, EdgeError> {
        let tenants = self.auth.reload()?;
        if let Some(t) = &self.tls {
            t.reload()?;
        }
        Ok(format!(
            "{tenants} tenants{}",
            if self.tls.is_some() {
                ", TLS files re-read"
            } else {
                ""
            }
        ))
    }

    /// Re-reads on every SIGHUP, logging the outcome, for as long as the task lives.
    pub fn reload_on_sighup(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let edge = self.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hup = match signal(SignalKind::hangup()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot install the SIGHUP handler: no reloads");
                    return;
                }
            };
            while hup.recv().await.is_some() {
                match edge.reload() {
                    Ok(what) => tracing::info!(%what, "SIGHUP: reloaded"),
                    Err(e) => {
                        tracing::warn!(error = %e, "SIGHUP: reload refused; the previous configuration stays")
                    }
                }
            }
        })
    }
}
