//! An [`ApiError`] on its way out as HTTP (feature `http`): `{"error":{"code":..,"message":..}}`
//! with the code's status and `Retry-After` when it has one. One type for every server of the
//! API (the node and the cluster gateway), so both answer errors byte for byte alike.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::{ApiError, ErrorBody, ErrorCode};

/// An error answered as JSON.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct HttpError {
    pub error: ApiError,
    /// Overrides the code's status (405, which has no code of its own; a gateway's 410).
    pub status: Option<StatusCode>,
}

impl HttpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::new(code, message).into()
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::invalid(message).into()
    }

    pub fn retry_after(mut self, secs: u64) -> Self {
        self.error.retry_after = Some(secs);
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }
}

impl From<ApiError> for HttpError {
    fn from(error: ApiError) -> Self {
        HttpError {
            error,
            status: None,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.error.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        });
        let retry = self.error.retry_after;
        let body = serde_json::to_vec(&ErrorBody { error: self.error }).unwrap_or_default();
        let mut resp = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response();
        if let Some(r) = retry {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(r));
        }
        resp
    }
}

/// Result of a handler.
pub type HttpResult<T> = Result<T, HttpError>;

/// A router built against a route list: every route added must be in the list, and
/// [`CheckedRouter::finish`] panics (at start, in every test that builds the router) when a
/// route of the list has no handler. The node and the gateway build theirs with it.
pub struct CheckedRouter<S> {
    router: axum::Router<S>,
    list: Vec<(&'static str, &'static str)>,
    seen: Vec<(&'static str, &'static str)>,
}

impl<S: Clone + Send + Sync + 'static> CheckedRouter<S> {
    /// A router for exactly the routes of `list`.
    pub fn new(list: impl IntoIterator<Item = (&'static str, &'static str)>) -> Self {
        CheckedRouter {
            router: axum::Router::new(),
            list: list.into_iter().collect(),
            seen: Vec::new(),
        }
    }

    /// Serves `method path` with `handler`.
    pub fn add<H, T>(mut self, method: &'static str, path: &'static str, handler: H) -> Self
    where
        H: axum::handler::Handler<T, S>,
        T: 'static,
    {
        use axum::routing::{on, MethodFilter};
        assert!(
            self.list.contains(&(method, path)),
            "route {method} {path} is missing from the route list"
        );
        let filter = match method {
            "GET" => MethodFilter::GET,
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "DELETE" => MethodFilter::DELETE,
            other => panic!("method {other} not used by the API"),
        };
        self.router = self.router.route(path, on(filter, handler));
        self.seen.push((method, path));
        self
    }

    /// The router; panics if a route of the list has no handler.
    pub fn finish(self) -> axum::Router<S> {
        for (method, path) in &self.list {
            assert!(
                self.seen.contains(&(method, path)),
                "route {method} {path} of the route list has no handler"
            );
        }
        self.router
    }
}
