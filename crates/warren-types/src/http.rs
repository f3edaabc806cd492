//! An [`ApiError`] on its way out as HTTP (feature `http`): `{"error":{"code":..,"message":..}}`
//! with the code's status and `Retry-After` when it has one. One type for every server of the
//! API (the node and the cluster gateway), so both answer errors byte for byte alike.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
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
            "PATCH" => MethodFilter::PATCH,
            "HEAD" => MethodFilter::HEAD,
            "OPTIONS" => MethodFilter::OPTIONS,
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

/// Headers that concern one connection only, never passed on by a proxy.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers (those listed by HTTP/1.1 and those the `Connection`
/// header names) and `Host`, as a proxy does before passing a message on.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<String> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()))
        .collect();
    for n in named {
        h.remove(n.as_str());
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
    h.remove(header::HOST);
}

/// True when the headers ask for a protocol upgrade (`Connection: upgrade` and `Upgrade`).
pub fn is_upgrade(h: &HeaderMap) -> bool {
    h.get(header::UPGRADE).is_some()
        && h.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .map(|s| s.to_ascii_lowercase().contains("upgrade"))
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_authorization_stays() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::HOST, "gw".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert_eq!(h[header::AUTHORIZATION], "Bearer x");
    }

    #[test]
    fn upgrades_need_both_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        assert!(!is_upgrade(&h));
        h.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        assert!(is_upgrade(&h));
    }
}
