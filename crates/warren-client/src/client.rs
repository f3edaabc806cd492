//! The [`Client`] handle, its builder, and the request plumbing every route method shares:
//! connection slots, status checks, JSON bodies and error mapping.
//!
//! Route methods live next to their topic (`sandboxes`, `exec`, `files`, `pty`); this module
//! never knows a route by name.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ClientError;
use crate::stream::ByteStream;
use crate::tls::TlsSettings;
use crate::transport::{Connector, Endpoint, TlsFailure};

/// The environment variable holding the API token.
pub const TOKEN_ENV: &str = "WARREN_TOKEN";

/// A token that never shows up in `Debug` output.
#[derive(Clone, Default)]
struct Secret(Option<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Some(<token>)"
        } else {
            "None"
        })
    }
}

/// Request bodies: empty, a JSON document, or a stream of chunks.
pub(crate) type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Default cap on connections (and so on requests in flight) per client.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Largest error body read to build a [`ClientError`].
const MAX_ERROR_BODY: usize = 1 << 20;
/// Largest JSON answer read into memory.
const MAX_JSON_BODY: usize = 512 << 20;

pub(crate) const JSON: &str = "application/json";
pub(crate) const OCTET_STREAM: &str = "application/octet-stream";

/// Settings of a [`Client`]; start from [`Client::builder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: Option<String>,
    max_connections: usize,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    idle_timeout: Duration,
    token: Secret,
    tls: TlsSettings,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            url: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            idle_timeout: Duration::from_secs(60),
            token: Secret(None),
            tls: TlsSettings::default(),
        }
    }
}

impl ClientBuilder {
    /// The daemon URL (`unix:///path` or `http://host:port`); default `WARREN_URL`, else
    /// [`crate::DEFAULT_URL`].
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Most requests in flight at once, and so about the most connections in use (HTTP/1
    /// carries one request per connection; idle connections beyond this number are closed).
    /// Further calls wait for a free slot, so any number of concurrent calls can be issued
    /// without running out of file descriptors. Streams returned by the client hold their
    /// slot until dropped. Minimum 1.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long opening one connection may take.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// A limit on each call until its response headers arrive (none by default: execs may
    /// run for a long time). Streamed bodies are not limited.
    pub fn request_timeout(mut self, t: Option<Duration>) -> Self {
        self.request_timeout = t;
        self
    }

    /// How long an idle pooled connection is kept.
    pub fn idle_timeout(mut self, t: Duration) -> Self {
        self.idle_timeout = t;
        self
    }

    /// The API token sent as `Authorization: Bearer` (default: `WARREN_TOKEN`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Secret(Some(token.into()));
        self
    }

    /// A PEM file of the CAs to trust for `https` URLs instead of the system's (default:
    /// `WARREN_CA`).
    pub fn ca_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// A client certificate chain and key (PEM) presented to daemons that require one
    /// (`warrend --tls-client-ca`).
    pub fn client_identity(
        mut self,
        cert: impl Into<std::path::PathBuf>,
        key: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls.identity = Some((cert.into(), key.into()));
        self
    }

    /// Builds the client. No connection is opened until the first call (CA and certificate
    /// files are read now).
    pub fn build(self) -> Result<Client, ClientError> {
        let endpoint = match &self.url {
            Some(u) => Endpoint::parse(u)?,
            None => Endpoint::from_env()?,
        };
        let tls = if endpoint.is_tls() {
            Some(self.tls.connector()?)
        } else {
            None
        };
        let token = self.token.0.clone().or_else(|| {
            std::env::var(TOKEN_ENV)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let auth = match token {
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    ClientError::InvalidToken("the token must be printable ASCII".into())
                })?;
                v.set_sensitive(true);
                Some(v)
            }
            None => None,
        };
        let connector = Connector::new(endpoint.clone(), tls.clone(), self.connect_timeout);
        let http = HyperClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(self.idle_timeout)
            .pool_max_idle_per_host(self.max_connections)
            .build(connector);
        Ok(Client {
            inner: Arc::new(Inner {
                authority: endpoint.authority(),
                endpoint,
                http,
                slots: Arc::new(Semaphore::new(self.max_connections)),
                request_timeout: self.request_timeout,
                auth,
                tls,
            }),
        })
    }
}

/// An async client of one warrend. Cheap to clone; clones share the connection pool.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    authority: String,
    http: HyperClient<Connector, Body>,
    /// One permit per connection that may be in use.
    slots: Arc<Semaphore>,
    request_timeout: Option<Duration>,
    /// `Bearer <token>`, marked sensitive.
    auth: Option<HeaderValue>,
    tls: Option<tokio_rustls::TlsConnector>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .finish_non_exhaustive()
    }
}

/// A successful answer and the connection slot it occupies until its body is consumed.
pub(crate) struct Reply {
    pub(crate) response: Response<Incoming>,
    pub(crate) permit: OwnedSemaphorePermit,
}

impl Reply {
    /// The body as a stream; the slot is released when the stream is dropped.
    pub(crate) fn into_stream(self) -> ByteStream {
        let len = self
            .response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        ByteStream::new(self.response.into_body(), len, Some(self.permit))
    }

    /// Reads the whole body (bounded) and decodes it as `T`.
    pub(crate) async fn json<T: DeserializeOwned>(self, what: &str) -> Result<T, ClientError> {
        let body = Limited::new(self.response.into_body(), MAX_JSON_BODY)
            .collect()
            .await
            .map_err(|e| ClientError::transport(format!("reading {what}"), e))?
            .to_bytes();
        drop(self.permit);
        serde_json::from_slice(&body).map_err(|e| ClientError::decode(what.to_string(), e))
    }

    /// Reads and drops the body, so the connection goes back to the pool.
    pub(crate) async fn drain(self) -> Result<(), ClientError> {
        Limited::new(self.response.into_body(), MAX_JSON_BODY)
            .collect()
            .await
            .map_err(|e| ClientError::transport("reading the response body", e))?;
        Ok(())
    }
}

impl Client {
    /// A client for `url` with default settings.
    pub fn new(url: &str) -> Result<Client, ClientError> {
        ClientBuilder::default().url(url).build()
    }

    /// A client for `WARREN_URL`, else [`crate::DEFAULT_URL`].
    pub fn from_env() -> Result<Client, ClientError> {
        ClientBuilder::default().build()
    }

    /// Settings beyond the URL.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// Where this client connects.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }

    /// The `host[:port]` written into request URIs.
    pub(crate) fn authority(&self) -> &str {
        &self.inner.authority
    }

    /// The `Authorization` header value, when a token is configured.
    pub(crate) fn auth_header(&self) -> Option<&HeaderValue> {
        self.inner.auth.as_ref()
    }

    /// Opens a connection outside the pool (terminals).
    pub(crate) async fn connect_raw(&self) -> Result<crate::RawStream, ClientError> {
        self.inner
            .endpoint
            .connect(self.inner.tls.as_ref())
            .await
            .map_err(|e| self.connect_error(e))
    }

    /// A failed connect: TLS failures get their own variant, naming what to fix.
    pub(crate) fn connect_error(&self, e: impl Into<crate::BoxError>) -> ClientError {
        let e: crate::BoxError = e.into();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
        while let Some(err) = cur {
            if let Some(t) = err.downcast_ref::<TlsFailure>() {
                return ClientError::Tls {
                    url: t.url.clone(),
                    reason: t.reason.clone(),
                };
            }
            if let Some(io) = err.downcast_ref::<io::Error>() {
                if let Some(t) = io.get_ref().and_then(|i| i.downcast_ref::<TlsFailure>()) {
                    return ClientError::Tls {
                        url: t.url.clone(),
                        reason: t.reason.clone(),
                    };
                }
            }
            cur = err.source();
        }
        ClientError::transport(
            format!("cannot connect to warrend at {}", self.inner.endpoint),
            e,
        )
    }

    /// Sends one request and checks the status: non-2xx answers become
    /// [`ClientError::Api`] (or [`ClientError::Status`] without a JSON error body).
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Body,
        content_type: Option<&'static str>,
    ) -> Result<Reply, ClientError> {
        let permit = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let uri = format!("http://{}{}", self.inner.authority, path);
        let mut req = Request::builder().method(method.clone()).uri(uri);
        if let Some(ct) = content_type {
            req = req.header(CONTENT_TYPE, HeaderValue::from_static(ct));
        }
        if let Some(auth) = &self.inner.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(body)
            .map_err(|e| ClientError::transport(format!("building request {method} {path}"), e))?;
        let fut = self.inner.http.request(req);
        let result = match self.inner.request_timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ClientError::Timeout(t))?,
            None => fut.await,
        };
        let response = result.map_err(|e| {
            if e.is_connect() {
                self.connect_error(e)
            } else {
                ClientError::transport(format!("{method} {path} failed"), e)
            }
        })?;
        let status = response.status();
        if !status.is_success() {
            let body = Limited::new(response.into_body(), MAX_ERROR_BODY)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(self.with_url(ClientError::from_response(status.as_u16(), &body)));
        }
        Ok(Reply { response, permit })
    }

    /// Names the daemon in `401` errors, so a wrong token says where it was refused.
    pub(crate) fn with_url(&self, mut e: ClientError) -> ClientError {
        if let ClientError::Api { error, .. } = &mut e {
            if error.code == warren_types::ErrorCode::Unauthorized {
                let hint = if self.inner.auth.is_some() {
                    "the token sent was refused"
                } else {
                    "no token was sent; set WARREN_TOKEN"
                };
                error.message = format!(
                    "{} ({hint}; warrend at {})",
                    error.message, self.inner.endpoint
                );
            }
        }
        e
    }

    /// A call with an optional JSON body that answers JSON.
    pub(crate) async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        what: &str,
    ) -> Result<T, ClientError> {
        let (body, ct) = json_body(body)?;
        self.send(method, path, body, ct).await?.json(what).await
    }

    /// A call with an optional JSON body whose answer has no body worth reading (204).
    pub(crate) async fn call_empty(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<(), ClientError> {
        let (body, ct) = json_body(body)?;
        self.send(method, path, body, ct).await?.drain().await
    }
}

/// An empty request body.
pub(crate) fn empty_body() -> Body {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A request body of fixed bytes.
pub(crate) fn full_body(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_body(
    body: Option<&(impl Serialize + ?Sized)>,
) -> Result<(Body, Option<&'static str>), ClientError> {
    match body {
        None => Ok((empty_body(), None)),
        Some(b) => {
            let bytes = serde_json::to_vec(b).map_err(|e| ClientError::Encode {
                what: "the request body".into(),
                source: e,
            })?;
            Ok((full_body(bytes.into()), Some(JSON)))
        }
    }
}

/// Percent-encodes a path segment or query value (everything but unreserved characters and
/// `/`, which is kept for readable paths in query strings).
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Encodes a sandbox id as one path segment (no `/` kept).
pub(crate) fn seg(s: &str) -> String {
    enc(s).replace('/', "%2F")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding() {
        assert_eq!(enc("/a b/ü?&="), "/a%20b/%C3%BC%3F%26%3D");
        assert_eq!(enc("k=v"), "k%3Dv");
        assert_eq!(seg("n1-abc/../x"), "n1-abc%2F..%2Fx");
    }

    #[test]
    fn builder_refuses_bad_urls() {
        assert!(Client::builder().url("ftp://x").build().is_err());
        let c = Client::builder()
            .url("unix:///tmp/x.sock")
            .max_connections(0)
            .build()
            .unwrap();
        assert_eq!(
            c.endpoint().socket_path().unwrap(),
            std::path::Path::new("/tmp/x.sock")
        );
    }
}
