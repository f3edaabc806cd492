//! Forwarding to nodes over pooled HTTP/1.1 connections: bodies stream both ways, and a
//! WebSocket upgrade (the PTY route) is spliced byte for byte once the node has answered 101.
//!
//! A node that cannot be connected to answers at once: a refused connection fails in
//! microseconds, an unanswered one after a short connect timeout. Headers pass unchanged
//! (the caller's `Authorization` included: nodes authorize), except hop-by-hop ones.
//!
//! Nodes are reached at the address they advertise: `http://` (loopback or a trusted
//! network) or `https://`, where the gateway checks the node's certificate against
//! `--node-ca` and presents its own (`--node-cert`, `--node-key`) to nodes that require
//! client certificates.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tracing::debug;
use warren_types::http::{is_upgrade, strip_hop_by_hop};

/// How long connecting to a node may take before it is called unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Bodies of a known size up to this are read whole before they are passed on, so that a
/// small request or answer crosses the gateway in one write rather than a write for the
/// head and more for the body (each a wake-up of the other side). Larger or unsized bodies
/// (uploads, downloads, streams) flow through as they come.
const WHOLE_BODY: u64 = 64 * 1024;

/// Why a forward failed before a node answered.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No connection could be made: the request never reached the node.
    #[error("cannot connect to {address}: {message}")]
    Connect { address: String, message: String },
    /// The connection failed after the request may have been sent.
    #[error("{address} did not answer: {message}")]
    Failed { address: String, message: String },
    /// The node's address is not a usable URL.
    #[error("bad node address {address:?}")]
    BadAddress { address: String },
    /// The caller's request body could not be read: nothing was sent.
    #[error("reading the request body: {message}")]
    Body { message: String },
}

impl ForwardError {
    /// True when the node cannot have seen the request.
    pub fn not_sent(&self) -> bool {
        matches!(
            self,
            ForwardError::Connect { .. }
                | ForwardError::BadAddress { .. }
                | ForwardError::Body { .. }
        )
    }
}

/// The pooled client the gateway forwards through. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Proxy {
    client: Client<HttpsConnector<HttpConnector>, Body>,
}

impl Default for Proxy {
    fn default() -> Self {
        Proxy::new()
    }
}

/// A TLS configuration trusting the system's roots, presenting no certificate.
fn system_roots() -> rustls::ClientConfig {
    match warren_client::client_config(None, None) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "no system TLS roots: https nodes need --node-ca");
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth()
        }
    }
}

impl Proxy {
    /// A proxy reaching `https://` nodes with the system's roots and no client certificate.
    pub fn new() -> Self {
        Proxy::with_tls(None)
    }

    /// A proxy reaching `https://` nodes with `tls` (its roots, its client certificate);
    /// `None`: the system's roots.
    pub fn with_tls(tls: Option<rustls::ClientConfig>) -> Self {
        let mut tls = tls.unwrap_or_else(system_roots);
        // The connector sets ALPN itself (HTTP/1.1).
        tls.alpn_protocols.clear();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.set_nodelay(true);
        http.set_keepalive(Some(Duration::from_secs(30)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(512)
            .build(
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(tls)
                    .https_or_http()
                    .enable_http1()
                    .wrap_connector(http),
            );
        Proxy { client }
    }

    /// Sends `req` (its path and query) to the node at `address` (`http://host:port`) and
    /// returns the node's answer, streaming. An upgrade request is spliced through.
    pub async fn forward(
        &self,
        address: &str,
        mut req: Request<Body>,
    ) -> Result<Response<Body>, ForwardError> {
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let uri: Uri = format!("{}{pq}", address.trim_end_matches('/'))
            .parse()
            .map_err(|_| ForwardError::BadAddress {
                address: address.to_string(),
            })?;
        let upgrade = is_upgrade(req.headers());
        let upgrade_headers = upgrade.then(|| {
            (
                req.headers().get(header::UPGRADE).cloned(),
                req.headers().get(header::CONNECTION).cloned(),
            )
        });
        let client_upgrade = if upgrade {
            req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>()
        } else {
            None
        };
        *req.uri_mut() = uri;
        *req.version_mut() = axum::http::Version::HTTP_11;
        strip_hop_by_hop(req.headers_mut());
        if let Some((up, conn)) = upgrade_headers {
            if let Some(up) = up {
                req.headers_mut().insert(header::UPGRADE, up);
            }
            req.headers_mut().insert(
                header::CONNECTION,
                conn.unwrap_or(HeaderValue::from_static("upgrade")),
            );
        }
        if !upgrade && known_small(req.headers()) {
            let (parts, body) = req.into_parts();
            let bytes = whole(body).await.map_err(|e| ForwardError::Body {
                message: e.to_string(),
            })?;
            req = Request::from_parts(parts, Body::from(bytes));
        }
        let mut resp = self.client.request(req).await.map_err(|e| {
            let message = error_chain(&e);
            if e.is_connect() {
                ForwardError::Connect {
                    address: address.to_string(),
                    message,
                }
            } else {
                ForwardError::Failed {
                    address: address.to_string(),
                    message,
                }
            }
        })?;
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
            let node_side = hyper::upgrade::on(&mut resp);
            let Some(client_side) = client_upgrade else {
                return Err(ForwardError::Failed {
                    address: address.to_string(),
                    message: "the node switched protocols on a plain request".into(),
                });
            };
            tokio::spawn(async move {
                match tokio::try_join!(client_side, node_side) {
                    Ok((c, n)) => {
                        let mut c = TokioIo::new(c);
                        let mut n = TokioIo::new(n);
                        if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut n).await {
                            debug!(error = %e, "upgraded connection ended");
                        }
                    }
                    Err(e) => debug!(error = %e, "upgrade failed"),
                }
            });
            let (parts, _) = resp.into_parts();
            return Ok(Response::from_parts(parts, Body::empty()));
        }
        let (mut parts, body) = resp.into_parts();
        let small = known_small(&parts.headers);
        strip_hop_by_hop(&mut parts.headers);
        if small {
            let bytes = whole(body).await.map_err(|e| ForwardError::Failed {
                address: address.to_string(),
                message: e.to_string(),
            })?;
            return Ok(Response::from_parts(parts, Body::from(bytes)));
        }
        Ok(Response::from_parts(parts, Body::new(body)))
    }

    /// Builds and forwards a request of `method` with `body` and the caller's `headers` (its
    /// length is the body's own).
    pub async fn send(
        &self,
        address: &str,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: impl Into<Body>,
    ) -> Result<Response<Body>, ForwardError> {
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .body(body.into())
            .map_err(|_| ForwardError::BadAddress {
                address: address.to_string(),
            })?;
        for (k, v) in headers {
            if k != header::CONTENT_LENGTH {
                req.headers_mut().append(k.clone(), v.clone());
            }
        }
        self.forward(address, req).await
    }
}

/// True when the headers announce a body of at most [`WHOLE_BODY`] bytes.
fn known_small(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .is_some_and(|n| n <= WHOLE_BODY)
}

/// Reads a body to its end.
async fn whole<B: http_body::Body>(body: B) -> Result<bytes::Bytes, B::Error> {
    use http_body_util::BodyExt;
    body.collect().await.map(|c| c.to_bytes())
}

/// The error and its causes, for the message (hyper's outer error says little).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_port_is_unreachable_at_once() {
        // Bind and drop: the port is closed and the connection is refused.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let p = Proxy::new();
        let e = p
            .send(
                &format!("http://{addr}"),
                Method::GET,
                "/v1/health",
                &HeaderMap::new(),
                bytes::Bytes::new(),
            )
            .await
            .unwrap_err();
        assert!(e.not_sent(), "{e}");
    }
}
