//! Where the daemon listens and how connections to it are opened.
//!
//! This module owns the [`Endpoint`] (parsed from a `unix://`, `http://` or `https://` URL),
//! the raw byte stream over a Unix socket, TCP or TLS, and the connector that hyper's
//! connection pool calls. It never builds requests or looks at HTTP bodies.

use std::fmt;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::error::ClientError;
use tokio_rustls::TlsConnector;

/// The URL used when neither the caller nor `WARREN_URL` names one.
pub const DEFAULT_URL: &str = "unix:///run/warren/warren.sock";

/// The environment variable that names the daemon URL.
pub const URL_ENV: &str = "WARREN_URL";

/// How many times a connect that failed with `EAGAIN` (a full Unix listen backlog) is retried.
const CONNECT_RETRIES: u32 = 50;

/// The address of a warrend API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:///run/warren/warren.sock` (a bare absolute path is accepted too).
    Unix(PathBuf),
    /// `http://host:port`.
    Tcp { host: String, port: u16 },
    /// `https://host:port` (TLS; the certificate must name `host`).
    Tls { host: String, port: u16 },
}

impl Endpoint {
    /// Parses `unix:///path/to.sock`, `/path/to.sock`, `http://host[:port]` or
    /// `https://host[:port]`.
    pub fn parse(url: &str) -> Result<Endpoint, ClientError> {
        let bad = |reason: &str| ClientError::InvalidUrl {
            url: url.into(),
            reason: reason.into(),
        };
        let url_trimmed = url.trim();
        if let Some(path) = url_trimmed.strip_prefix("unix://") {
            if !path.starts_with('/') || path.len() < 2 {
                return Err(bad(
                    "a unix URL must name an absolute socket path (unix:///x.sock)",
                ));
            }
            return Ok(Endpoint::Unix(PathBuf::from(path)));
        }
        if url_trimmed.starts_with('/') {
            return Ok(Endpoint::Unix(PathBuf::from(url_trimmed)));
        }
        let (rest, tls) = if let Some(r) = url_trimmed.strip_prefix("http://") {
            (r, false)
        } else if let Some(r) = url_trimmed.strip_prefix("https://") {
            (r, true)
        } else {
            return Err(bad(
                "expected unix:///path/to.sock, http://host:port or https://host:port",
            ));
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            return Err(bad("an http URL must be http://host:port with no path"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed '[' in host"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(bad("junk after IPv6 host")),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| bad("port must be a number 1-65535"))?,
            None if tls => 443,
            None => 80,
        };
        if port == 0 {
            return Err(bad("port must be a number 1-65535"));
        }
        Ok(if tls {
            Endpoint::Tls { host, port }
        } else {
            Endpoint::Tcp { host, port }
        })
    }

    /// The endpoint named by `WARREN_URL` (its first URL when it lists several), else
    /// [`DEFAULT_URL`].
    pub fn from_env() -> Result<Endpoint, ClientError> {
        let mut list = Endpoint::list_from_env()?;
        Ok(list.swap_remove(0))
    }

    /// Parses one URL or several separated by commas (`http://gw1:7070,http://gw2:7070`);
    /// never empty.
    pub fn parse_list(urls: &str) -> Result<Vec<Endpoint>, ClientError> {
        let parts: Vec<&str> = urls.split(',').map(str::trim).collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(ClientError::InvalidUrl {
                url: urls.into(),
                reason: "an empty URL in the list (expected URL[,URL...])".into(),
            });
        }
        parts.into_iter().map(Endpoint::parse).collect()
    }

    /// The endpoints named by `WARREN_URL`, else [`DEFAULT_URL`].
    pub fn list_from_env() -> Result<Vec<Endpoint>, ClientError> {
        match std::env::var(URL_ENV) {
            Ok(u) if !u.trim().is_empty() => Endpoint::parse_list(&u),
            _ => Endpoint::parse_list(DEFAULT_URL),
        }
    }

    /// The socket path, for Unix endpoints.
    pub fn socket_path(&self) -> Option<&std::path::Path> {
        match self {
            Endpoint::Unix(p) => Some(p),
            Endpoint::Tcp { .. } | Endpoint::Tls { .. } => None,
        }
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, Endpoint::Tls { .. })
    }

    /// The `host[:port]` part of request URIs. Unix sockets use `localhost`, which is only
    /// what the `Host` header says.
    pub(crate) fn authority(&self) -> String {
        match self {
            Endpoint::Unix(_) => "localhost".to_string(),
            Endpoint::Tcp { host, port } | Endpoint::Tls { host, port } if host.contains(':') => {
                format!("[{host}]:{port}")
            }
            Endpoint::Tcp { host, port } | Endpoint::Tls { host, port } => {
                format!("{host}:{port}")
            }
        }
    }

    /// Opens one connection (with the TLS handshake for `https`), retrying briefly while a
    /// Unix listen backlog is full.
    pub(crate) async fn connect(&self, tls: Option<&TlsConnector>) -> io::Result<RawStream> {
        match self {
            Endpoint::Unix(path) => {
                let mut delay = Duration::from_millis(1);
                let mut tries = 0;
                loop {
                    match UnixStream::connect(path).await {
                        Ok(s) => return Ok(RawStream::Unix(s)),
                        Err(e)
                            if e.kind() == io::ErrorKind::WouldBlock && tries < CONNECT_RETRIES =>
                        {
                            tries += 1;
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(Duration::from_millis(50));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            Endpoint::Tcp { host, port } => {
                let s = TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                Ok(RawStream::Tcp(s))
            }
            Endpoint::Tls { host, port } => {
                let Some(tls) = tls else {
                    return Err(io::Error::other(TlsFailure {
                        url: self.to_string(),
                        reason: "no TLS configuration".into(),
                    }));
                };
                let s = TcpStream::connect((host.as_str(), *port)).await?;
                s.set_nodelay(true)?;
                let name = rustls_pki_types::ServerName::try_from(host.clone()).map_err(|e| {
                    io::Error::other(TlsFailure {
                        url: self.to_string(),
                        reason: format!("{host:?} is not a valid server name: {e}"),
                    })
                })?;
                let s = tls.connect(name, s).await.map_err(|e| {
                    io::Error::other(TlsFailure {
                        url: self.to_string(),
                        reason: crate::tls::explain(&e),
                    })
                })?;
                Ok(RawStream::Tls(Box::new(s)))
            }
        }
    }
}

/// A TLS handshake that failed, with what went wrong in words (carried through hyper's
/// connect error to [`crate::ClientError::Tls`]).
#[derive(Debug, thiserror::Error)]
#[error("TLS with {url} failed: {reason}")]
pub(crate) struct TlsFailure {
    pub(crate) url: String,
    pub(crate) reason: String,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix://{}", p.display()),
            Endpoint::Tcp { .. } => write!(f, "http://{}", self.authority()),
            Endpoint::Tls { .. } => write!(f, "https://{}", self.authority()),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = ClientError;
    fn from_str(s: &str) -> Result<Self, ClientError> {
        Endpoint::parse(s)
    }
}

/// One connection to the daemon, over either socket kind.
#[derive(Debug)]
pub enum RawStream {
    Unix(UnixStream),
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for RawStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            RawStream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            RawStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for RawStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RawStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            RawStream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            RawStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            RawStream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            RawStream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            RawStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            RawStream::Unix(s) => s.is_write_vectored(),
            RawStream::Tcp(s) => s.is_write_vectored(),
            RawStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawStream::Unix(s) => Pin::new(s).poll_flush(cx),
            RawStream::Tcp(s) => Pin::new(s).poll_flush(cx),
            RawStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            RawStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            RawStream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            RawStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A pooled connection as hyper sees it.
#[derive(Debug)]
pub(crate) struct Io(TokioIo<RawStream>);

impl hyper::rt::Read for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

impl Connection for Io {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// The connector hyper's pool calls for a new connection: every URI goes to the one endpoint.
#[derive(Clone)]
pub(crate) struct Connector {
    endpoint: std::sync::Arc<Endpoint>,
    tls: Option<TlsConnector>,
    timeout: Duration,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("endpoint", &self.endpoint)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Connector {
    pub(crate) fn new(endpoint: Endpoint, tls: Option<TlsConnector>, timeout: Duration) -> Self {
        Connector {
            endpoint: std::sync::Arc::new(endpoint),
            tls,
            timeout,
        }
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Io;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Io>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let endpoint = self.endpoint.clone();
        let tls = self.tls.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, endpoint.connect(tls.as_ref())).await {
                Ok(stream) => Ok(Io(TokioIo::new(stream?))),
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("connect timed out after {timeout:?}"),
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(
            Endpoint::parse("unix:///run/warren/warren.sock").unwrap(),
            Endpoint::Unix("/run/warren/warren.sock".into())
        );
        assert_eq!(
            Endpoint::parse("/tmp/w.sock").unwrap(),
            Endpoint::Unix("/tmp/w.sock".into())
        );
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:8080").unwrap(),
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 8080
            }
        );
        assert_eq!(
            Endpoint::parse("http://node1/").unwrap(),
            Endpoint::Tcp {
                host: "node1".into(),
                port: 80
            }
        );
        let v6 = Endpoint::parse("http://[::1]:7000").unwrap();
        assert_eq!(
            v6,
            Endpoint::Tcp {
                host: "::1".into(),
                port: 7000
            }
        );
        assert_eq!(v6.to_string(), "http://[::1]:7000");
        assert_eq!(
            Endpoint::parse("https://node1.example:7443").unwrap(),
            Endpoint::Tls {
                host: "node1.example".into(),
                port: 7443
            }
        );
        let e = Endpoint::parse("https://node1/").unwrap();
        assert_eq!(e.to_string(), "https://node1:443");
        assert!(e.is_tls());
        assert_eq!(
            Endpoint::parse("unix:///tmp/a.sock").unwrap().to_string(),
            "unix:///tmp/a.sock"
        );
        assert_eq!(
            Endpoint::parse_list("http://a:1, unix:///b.sock").unwrap(),
            [
                Endpoint::Tcp {
                    host: "a".into(),
                    port: 1
                },
                Endpoint::Unix("/b.sock".into())
            ]
        );
        for bad in [
            "",
            "http://a:1,",
            ",http://a:1",
            "http://a:1,,http://b:2",
            "http://a:1,x",
        ] {
            assert!(
                Endpoint::parse_list(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
        for bad in [
            "",
            "unix://",
            "unix://relative.sock",
            "http://",
            "http://h:0",
            "http://h:x",
            "http://h:1/path",
            "tcp://h:1",
            "https://",
            "https://h:1/x",
        ] {
            assert!(Endpoint::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
