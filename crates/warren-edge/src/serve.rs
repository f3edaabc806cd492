//! Serving an axum [`Router`] on TCP (plain or TLS) and Unix listeners: one task per
//! connection (HTTP/1.1 with upgrades, for the WebSocket terminals), the peer's address or
//! user id put into every request's extensions as a [`Peer`], and a graceful stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::throttle::Source;
use crate::tls::Tls;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The other end of a request's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    Tcp(SocketAddr),
    /// A Unix-socket peer and its user id (from `SO_PEERCRED`).
    Unix {
        uid: Option<u32>,
    },
}

impl Peer {
    pub(crate) fn source(&self) -> Source {
        match self {
            Peer::Tcp(a) => Source::Ip(a.ip()),
            Peer::Unix { uid: Some(u) } => Source::Uid(*u),
            Peer::Unix { uid: None } => Source::Unknown,
        }
    }
}

/// Serves one connection until it closes, or until `stop` turns true (then the request in
/// flight finishes and the connection closes).
async fn serve_connection<I>(io: I, peer: Peer, app: Router, mut stop: watch::Receiver<bool>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(peer.clone());
        app.clone().oneshot(req)
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(io), svc)
        .with_upgrades();
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                conn.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}

/// Accepts until `shutdown` resolves, then waits for open connections to finish (callers
/// bound that wait with a timeout; dropping this future aborts them).
async fn accept_loop<A, Fut>(mut accept: A, shutdown: impl Future<Output = ()>)
where
    A: FnMut(watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>>,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            c = accept(stop_rx.clone()) => {
                if let Some(task) = c {
                    conns.spawn(task);
                }
                while conns.try_join_next().is_some() {}
            }
        }
    }
    let _ = stop_tx.send(true);
    while conns.join_next().await.is_some() {}
}

/// Waits a little after an accept error (e.g. out of file descriptors) so the loop does not
/// spin.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Serves `app` on a TCP listener, over TLS when `tls` is given.
pub async fn serve_tcp(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let listener = Arc::new(listener);
    accept_loop(
        |stop| {
            let listener = listener.clone();
            let tls = tls.clone();
            let app = app.clone();
            async move {
                let (stream, addr) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        accept_failed(e).await;
                        return None;
                    }
                };
                let _ = stream.set_nodelay(true);
                let peer = Peer::Tcp(addr);
                let task: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match tls {
                    None => Box::pin(serve_connection(stream, peer, app, stop)),
                    Some(tls) => {
                        let acceptor = tls.acceptor();
                        Box::pin(async move {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                                .await
                            {
                                Ok(Ok(s)) => serve_connection(s, peer, app, stop).await,
                                Ok(Err(e)) => {
                                    tracing::info!(%addr, error = %e, "TLS handshake refused")
                                }
                                Err(_) => tracing::info!(%addr, "TLS handshake timed out"),
                            }
                        })
                    }
                };
                Some(task)
            }
        },
        shutdown,
    )
    .await
}

/// Serves `app` on a Unix listener; each request carries its peer's user id.
pub async fn serve_unix(listener: UnixListener, app: Router, shutdown: impl Future<Output = ()>) {
    let listener = Arc::new(listener);
    accept_loop(
        |stop| {
            let listener = listener.clone();
            let app = app.clone();
            async move {
                let (stream, _) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        accept_failed(e).await;
                        return None;
                    }
                };
                let uid = stream.peer_cred().ok().map(|c| c.uid());
                let task: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> =
                    Box::pin(serve_connection(stream, Peer::Unix { uid }, app, stop));
                Some(task)
            }
        },
        shutdown,
    )
    .await
}
