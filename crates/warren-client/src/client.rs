//! The [`Client`] handle, its builder, and the request plumbing every route method shares:
//! connection slots, failover over several URLs, status checks, JSON bodies and error mapping.
//!
//! Route methods live next to their topic (`sandboxes`, `exec`, `files`, `pty`); this module
//! never knows a route by name.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ClientError;
use crate::failover::{parse_retry_after, Attempt, Plan, Retry, Step};
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

/// What a request sends: bytes, which can be sent again (to another URL), or a stream, which
/// is sent once.
pub(crate) enum Payload {
    Bytes(Bytes),
    Stream(Option<Body>),
}

impl Payload {
    pub(crate) fn stream(body: Body) -> Payload {
        Payload::Stream(Some(body))
    }

    /// The body of one attempt; `None` once a stream was handed out.
    fn take(&mut self) -> Option<Body> {
        match self {
            Payload::Bytes(b) => Some(
                Full::new(b.clone())
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            ),
            Payload::Stream(s) => s.take(),
        }
    }
}

/// Default cap on connections (and so on requests in flight) per client.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;
/// Default number of waits (`Retry-After` or backoff) a call that is safe to repeat may make.
pub const DEFAULT_MAX_RETRIES: u32 = 5;
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
    max_retries: u32,
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
            max_retries: DEFAULT_MAX_RETRIES,
            token: Secret(None),
            tls: TlsSettings::default(),
        }
    }
}

impl ClientBuilder {
    /// The daemon URL (`unix:///path` or `http://host:port`), or several separated by commas
    /// (the gateways of a cluster); default `WARREN_URL`, else [`crate::DEFAULT_URL`].
    ///
    /// With several URLs, calls go to the one that answered last; a call moves on to the next
    /// URL when its request could not be sent, and calls that are safe to repeat also when
    /// the connection broke or the server answered `503` (see [`ClientBuilder::max_retries`]).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// How many times a call that is safe to repeat (a read, a create with an idempotency
    /// key) waits and tries again after `429`/`503` answers or broken connections on every
    /// URL. Each wait is the server's `Retry-After` (at most 30 s), else a short backoff.
    /// `0` turns waiting off; moving on to the next URL still happens.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
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
        let endpoints = match &self.url {
            Some(u) => Endpoint::parse_list(u)?,
            None => Endpoint::list_from_env()?,
        };
        let tls = if endpoints.iter().any(Endpoint::is_tls) {
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
        let targets = endpoints
            .into_iter()
            .map(|endpoint| {
                let connector = Connector::new(endpoint.clone(), tls.clone(), self.connect_timeout);
                let http = HyperClient::builder(TokioExecutor::new())
                    .pool_timer(TokioTimer::new())
                    .pool_idle_timeout(self.idle_timeout)
                    .pool_max_idle_per_host(self.max_connections)
                    .build(connector);
                Target {
                    authority: endpoint.authority(),
                    endpoint,
                    http,
                }
            })
            .collect();
        Ok(Client {
            inner: Arc::new(Inner {
                targets,
                preferred: AtomicUsize::new(0),
                slots: Arc::new(Semaphore::new(self.max_connections)),
                request_timeout: self.request_timeout,
                max_retries: self.max_retries,
                auth,
                tls,
            }),
        })
    }
}

/// An async client of a warrend, or of the gateways of a cluster. Cheap to clone; clones
/// share the connection pools.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// One per URL, in the order given; never empty.
    targets: Vec<Target>,
    /// The target that answered last: calls start there.
    preferred: AtomicUsize,
    /// One permit per connection that may be in use.
    slots: Arc<Semaphore>,
    request_timeout: Option<Duration>,
    max_retries: u32,
    /// `Bearer <token>`, marked sensitive.
    auth: Option<HeaderValue>,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// One URL and its connection pool.
struct Target {
    endpoint: Endpoint,
    authority: String,
    http: HyperClient<Connector, Body>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoints: Vec<&Endpoint> = self.inner.targets.iter().map(|t| &t.endpoint).collect();
        f.debug_struct("Client")
            .field("endpoints", &endpoints)
            .finish_non_exhaustive()
    }
}

/// How one attempt ended.
enum Sent {
    Answer(Response<Incoming>),
    Failed(ClientError, Attempt),
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

    /// Where this client connects: the first of its URLs.
    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.targets[0].endpoint
    }

    /// Every URL of this client, in the order given.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.inner.targets.iter().map(|t| &t.endpoint)
    }

    /// The URL the next call goes to first (the one that answered last).
    pub fn current_endpoint(&self) -> &Endpoint {
        &self.inner.targets[self.preferred()].endpoint
    }

    fn preferred(&self) -> usize {
        self.inner.preferred.load(Ordering::Relaxed) % self.inner.targets.len()
    }

    /// Opens a raw connection to the preferred URL, else to the next ones in turn (for
    /// upgrades such as the terminal WebSocket); returns the stream and the authority to
    /// name in the request.
    pub(crate) async fn connect_raw(
        &self,
    ) -> Result<(crate::transport::RawStream, &str), ClientError> {
        let n = self.inner.targets.len();
        let first = self.preferred();
        let mut last = None;
        for i in 0..n {
            let idx = (first + i) % n;
            let t = &self.inner.targets[idx];
            match t.endpoint.connect(self.inner.tls.as_ref()).await {
                Ok(s) => {
                    self.inner.preferred.store(idx, Ordering::Relaxed);
                    return Ok((s, t.authority.as_str()));
                }
                Err(e) => last = Some(connect_error(&t.endpoint, e)),
            }
        }
        Err(last.expect("a client has at least one URL"))
    }

    /// The `Authorization` header value, when a token is configured.
    pub(crate) fn auth_header(&self) -> Option<&HeaderValue> {
        self.inner.auth.as_ref()
    }

    /// Names the daemon in `401` errors, so a wrong token says where it was refused.
    pub(crate) fn with_url(&self, endpoint: &Endpoint, mut e: ClientError) -> ClientError {
        if let ClientError::Api { error, .. } = &mut e {
            if error.code == warren_types::ErrorCode::Unauthorized {
                let hint = if self.inner.auth.is_some() {
                    "the token sent was refused"
                } else {
                    "no token was sent; set WARREN_TOKEN"
                };
                error.message = format!("{} ({hint}; warrend at {endpoint})", error.message);
            }
        }
        e
    }

    /// Sends one request and checks the status: non-2xx answers become
    /// [`ClientError::Api`] (or [`ClientError::Status`] without a JSON error body). `GET`s
    /// may be repeated (see [`Client::send_as`]).
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        body: Payload,
        content_type: Option<&'static str>,
    ) -> Result<Reply, ClientError> {
        let retry = Retry::for_method(&method);
        self.send_as(retry, method, path, body, content_type, None)
            .await
    }

    /// [`Client::send`] with the call's own retry class: the request goes to the preferred
    /// URL, then on as `crate::failover` rules. `runs_for`: how long the server may take to
    /// answer by the call's own terms (an exec's `timeout_secs`); the client's request timeout
    /// is a bound on hung calls, so it never cuts a call short of that.
    pub(crate) async fn send_as(
        &self,
        retry: Retry,
        method: Method,
        path: &str,
        mut body: Payload,
        content_type: Option<&'static str>,
        runs_for: Option<Duration>,
    ) -> Result<Reply, ClientError> {
        let permit = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let n = self.inner.targets.len();
        let first = self.preferred();
        let mut idx = first;
        let mut plan = Plan::new(n, self.inner.max_retries, retry);
        loop {
            let Some(attempt_body) = body.take() else {
                // Not reached: a stream is never sent twice (see below).
                return Err(ClientError::Protocol(format!(
                    "{method} {path}: the streamed request body cannot be sent again"
                )));
            };
            let target = &self.inner.targets[idx];
            let (err, attempt) = match self
                .send_once(target, &method, path, attempt_body, content_type, runs_for)
                .await?
            {
                Sent::Answer(response) => {
                    if idx != first {
                        self.inner.preferred.store(idx, Ordering::Relaxed);
                    }
                    return Ok(Reply { response, permit });
                }
                Sent::Failed(err, attempt) => (err, attempt),
            };
            // hyper consumed a streamed body even when it could not connect.
            let step = if matches!(body, Payload::Stream(_)) {
                Step::GiveUp
            } else {
                plan.after(&attempt)
            };
            match step {
                Step::NextUrl => idx = (idx + 1) % n,
                Step::Wait(d) => {
                    tokio::time::sleep(d).await;
                    idx = self.preferred();
                }
                Step::GiveUp => {
                    if attempt != Attempt::NotSent && idx != first {
                        // It answered: later calls start with it.
                        self.inner.preferred.store(idx, Ordering::Relaxed);
                    }
                    return Err(err);
                }
            }
        }
    }

    /// One attempt against one URL. `Err` only for failures no other URL can mend (a
    /// request that cannot be built, the client's own timeout).
    async fn send_once(
        &self,
        target: &Target,
        method: &Method,
        path: &str,
        body: Body,
        content_type: Option<&'static str>,
        runs_for: Option<Duration>,
    ) -> Result<Sent, ClientError> {
        let uri = format!("http://{}{}", target.authority, path);
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
        let fut = target.http.request(req);
        let result = match answer_timeout(self.inner.request_timeout, runs_for) {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ClientError::Timeout(t))?,
            None => fut.await,
        };
        let response = match result {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Ok(Sent::Failed(
                    connect_error(&target.endpoint, e),
                    Attempt::NotSent,
                ));
            }
            Err(e) => {
                let context = format!("{method} {path} failed at {}", target.endpoint);
                return Ok(Sent::Failed(
                    ClientError::transport(context, e),
                    Attempt::Broken,
                ));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(Sent::Answer(response));
        }
        let header_wait = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let body = Limited::new(response.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let err = self.with_url(
            &target.endpoint,
            ClientError::from_response(status.as_u16(), &body),
        );
        let api = err.api_error();
        let attempt = Attempt::Status {
            status: status.as_u16(),
            retry_after: header_wait
                .or_else(|| api.and_then(|e| e.retry_after).map(Duration::from_secs)),
            code: api
                .map(|e| e.code.as_str().to_string())
                .or_else(|| error_code_of(&body)),
        };
        Ok(Sent::Failed(err, attempt))
    }

    /// Sends one request to the preferred URL (moving on only when it cannot be sent) and
    /// hands back the answer whatever its status, with its connection slot: for routes
    /// whose answers are not Warren's own (a sandbox's ports).
    pub(crate) async fn send_raw(
        &self,
        method: Method,
        path: &str,
        headers: &hyper::HeaderMap,
        body: Body,
    ) -> Result<Reply, ClientError> {
        let permit = self
            .inner
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the slot semaphore is never closed");
        let target = &self.inner.targets[self.preferred()];
        let uri = format!("http://{}{}", target.authority, path);
        let mut req = Request::builder().method(method.clone()).uri(uri);
        for (k, v) in headers {
            if k != AUTHORIZATION {
                req = req.header(k, v);
            }
        }
        if let Some(auth) = &self.inner.auth {
            req = req.header(AUTHORIZATION, auth.clone());
        }
        let req = req
            .body(body)
            .map_err(|e| ClientError::transport(format!("building request {method} {path}"), e))?;
        let fut = target.http.request(req);
        let result = match self.inner.request_timeout {
            Some(t) => tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ClientError::Timeout(t))?,
            None => fut.await,
        };
        let response = result.map_err(|e| {
            if e.is_connect() {
                connect_error(&target.endpoint, e)
            } else {
                ClientError::transport(format!("{method} {path} failed at {}", target.endpoint), e)
            }
        })?;
        Ok(Reply { response, permit })
    }

    /// A call with an optional JSON body that answers JSON.
    pub(crate) async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        what: &str,
    ) -> Result<T, ClientError> {
        let retry = Retry::for_method(&method);
        self.call_json_as(retry, method, path, body, what, None)
            .await
    }

    /// [`Client::call_json`] with the call's own retry class and running time (see
    /// [`Client::send_as`]).
    pub(crate) async fn call_json_as<T: DeserializeOwned>(
        &self,
        retry: Retry,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        what: &str,
        runs_for: Option<Duration>,
    ) -> Result<T, ClientError> {
        let (body, ct) = json_body(body)?;
        self.send_as(retry, method, path, body, ct, runs_for)
            .await?
            .json(what)
            .await
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

/// How long a call may wait for its answer: the client's request timeout, or longer when the
/// call says it runs longer (plus [`ANSWER_SLACK`] for the answer to travel). No request
/// timeout: no bound.
fn answer_timeout(request: Option<Duration>, runs_for: Option<Duration>) -> Option<Duration> {
    let request = request?;
    Some(match runs_for {
        Some(r) => request.max(r.saturating_add(ANSWER_SLACK)),
        None => request,
    })
}

/// What a call that runs for a known time is given on top of it for the answer to arrive.
const ANSWER_SLACK: Duration = Duration::from_secs(30);

/// The running time a request's `timeout_secs` gives it (none when absent or out of range; the
/// server refuses out-of-range values itself).
pub(crate) fn runs_for_secs(secs: Option<f64>) -> Option<Duration> {
    secs.and_then(|s| Duration::try_from_secs_f64(s).ok())
}

/// An empty request body.
pub(crate) fn empty_body() -> Payload {
    Payload::Bytes(Bytes::new())
}

/// A request body of fixed bytes.
pub(crate) fn full_body(bytes: Bytes) -> Payload {
    Payload::Bytes(bytes)
}

/// The `code` of an error body whose code this client does not know (a newer server's).
fn error_code_of(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(v.get("error")?.get("code")?.as_str()?.to_string())
}

fn json_body(
    body: Option<&(impl Serialize + ?Sized)>,
) -> Result<(Payload, Option<&'static str>), ClientError> {
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

/// A failed connect: TLS failures get their own variant, naming what to fix.
fn connect_error(endpoint: &Endpoint, e: impl Into<crate::BoxError>) -> ClientError {
    let e: crate::BoxError = e.into();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
    while let Some(err) = cur {
        let tls = err.downcast_ref::<TlsFailure>().or_else(|| {
            err.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<TlsFailure>())
        });
        if let Some(t) = tls {
            return ClientError::Tls {
                url: t.url.clone(),
                reason: t.reason.clone(),
            };
        }
        cur = err.source();
    }
    ClientError::transport(format!("cannot connect to warrend at {endpoint}"), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_runs_longer_is_waited_for() {
        let s = Duration::from_secs;
        assert_eq!(answer_timeout(None, Some(s(900))), None);
        assert_eq!(answer_timeout(Some(s(90)), None), Some(s(90)));
        assert_eq!(answer_timeout(Some(s(90)), Some(s(10))), Some(s(90)));
        assert_eq!(answer_timeout(Some(s(90)), Some(s(900))), Some(s(930)));
        assert_eq!(runs_for_secs(Some(1.5)), Some(Duration::from_millis(1500)));
        assert_eq!(runs_for_secs(Some(-1.0)), None);
        assert_eq!(runs_for_secs(Some(f64::NAN)), None);
        assert_eq!(runs_for_secs(Some(f64::INFINITY)), None);
        assert_eq!(runs_for_secs(None), None);
    }

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
