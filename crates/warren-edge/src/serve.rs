//! Serving an axum [`Router`] on TCP (plain or TLS) and Unix listeners: one task per
//! connection, HTTP/1.1 (with upgrades, for the WebSocket terminals) or HTTP/2 (TLS clients
//! that offer `h2` in ALPN, plain clients with prior knowledge: E2B's SDKs speak it to envd),
//! the peer's address or user id put into every request's extensions as a [`Peer`], and a
//! graceful stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
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
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), svc);
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;

    /// A server answering the HTTP version each request came in.
    async fn server(tls: Option<Arc<Tls>>) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let app = Router::new().route(
            "/v",
            get(|req: axum::extract::Request| async move { format!("{:?}", req.version()) }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_tcp(listener, tls, app, async {
            let _ = rx.await;
        }));
        (addr, tx)
    }

    fn get_v(authority: &str) -> hyper::Request<Empty<Bytes>> {
        hyper::Request::get(format!("http://{authority}/v"))
            .body(Empty::new())
            .unwrap()
    }

    async fn text(resp: hyper::Response<Incoming>) -> String {
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&b).into_owned()
    }

    /// HTTP/2 with prior knowledge and HTTP/1.1 on the same plain listener.
    #[tokio::test]
    async fn plain_tcp_serves_http1_and_http2() {
        let (addr, _stop) = server(None).await;
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        let r = h2.send_request(get_v(&addr.to_string())).await.unwrap();
        assert_eq!(text(r).await, "HTTP/2.0");

        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let mut req = get_v(&addr.to_string());
        req.headers_mut()
            .insert(axum::http::header::HOST, addr.to_string().parse().unwrap());
        let r = h1.send_request(req).await.unwrap();
        assert_eq!(text(r).await, "HTTP/1.1");
    }

    /// A stop lets the request in flight on an HTTP/2 connection finish, closes idle HTTP/1.1
    /// and HTTP/2 connections, and then the server returns.
    #[tokio::test]
    async fn a_stop_finishes_requests_in_flight_on_both_versions() {
        let (entered_tx, mut entered) = tokio::sync::mpsc::channel::<()>(1);
        let release = Arc::new(tokio::sync::Notify::new());
        let r = release.clone();
        let app = Router::new()
            .route(
                "/slow",
                get(move || {
                    let (entered_tx, r) = (entered_tx.clone(), r.clone());
                    async move {
                        let _ = entered_tx.send(()).await;
                        r.notified().await;
                        "done"
                    }
                }),
            )
            .route("/v", get(|| async { "quick" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_tcp(listener, None, app, async {
            let _ = stop_rx.await;
        }));

        // Connections of both versions idle after a request, a connection that sent nothing,
        // and one HTTP/2 request in flight.
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        let idle1 = tokio::spawn(conn);
        let mut req = get_v(&addr.to_string());
        req.headers_mut()
            .insert(axum::http::header::HOST, addr.to_string().parse().unwrap());
        assert_eq!(text(h1.send_request(req).await.unwrap()).await, "quick");
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut h2_idle, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        let idle2 = tokio::spawn(conn);
        let r = h2_idle
            .send_request(get_v(&addr.to_string()))
            .await
            .unwrap();
        assert_eq!(text(r).await, "quick");
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let io = TokioIo::new(tokio::net::TcpStream::connect(addr).await.unwrap());
        let (mut h2, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::get(format!("http://{addr}/slow"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        let answer = tokio::spawn(h2.send_request(req));
        entered
            .recv()
            .await
            .expect("the request reached its handler");

        stop_tx.send(()).unwrap();
        // The idle connections close; the server waits for the request in flight.
        let bound = Duration::from_secs(10);
        tokio::time::timeout(bound, idle1)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        tokio::time::timeout(bound, idle2)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(bound, tokio::io::AsyncReadExt::read(&mut silent, &mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "a connection that sent nothing is closed");
        assert!(
            !server.is_finished(),
            "the server stopped with a request in flight"
        );

        release.notify_one();
        let resp = tokio::time::timeout(bound, answer)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(resp.version(), hyper::Version::HTTP_2);
        assert_eq!(text(resp).await, "done");
        tokio::time::timeout(bound, server).await.unwrap().unwrap();
    }

    /// Over TLS, ALPN picks HTTP/2 for a client that offers it and HTTP/1.1 otherwise.
    #[tokio::test]
    async fn tls_negotiates_http2_by_alpn() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        let tls = Tls::load(crate::tls::TlsFiles {
            cert: c,
            key: k,
            client_ca: None,
        })
        .unwrap();
        let (addr, _stop) = server(Some(Arc::new(tls))).await;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        for (offer, want) in [
            (vec![b"h2".to_vec(), b"http/1.1".to_vec()], "h2"),
            (vec![b"http/1.1".to_vec()], "http/1.1"),
        ] {
            let mut cfg = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            cfg.alpn_protocols = offer;
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let s = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                .connect("localhost".try_into().unwrap(), tcp)
                .await
                .unwrap();
            let alpn = s.get_ref().1.alpn_protocol().map(|p| p.to_vec());
            assert_eq!(alpn.as_deref(), Some(want.as_bytes()));
            let io = TokioIo::new(s);
            let got = if want == "h2" {
                let (mut h2, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                        .await
                        .unwrap();
                tokio::spawn(conn);
                text(h2.send_request(get_v("localhost")).await.unwrap()).await
            } else {
                let (mut h1, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                let mut req = get_v("localhost");
                req.headers_mut()
                    .insert(axum::http::header::HOST, "localhost".parse().unwrap());
                text(h1.send_request(req).await.unwrap()).await
            };
            assert_eq!(got, if want == "h2" { "HTTP/2.0" } else { "HTTP/1.1" });
        }
    }
}
