//! Request ids: every request gets one, kept for its whole way through the server.
//!
//! The id is the caller's `x-request-id` when it is sane (1-128 characters of letters,
//! digits and `-_.:/@+=`), else a new ULID. It is put back into the request's headers (so
//! a gateway forwards it to the node, which keeps it), into its extensions as a
//! [`RequestId`], into a tracing span around the request (so every log line of the request
//! carries `request_id`), into the response's `x-request-id`, and into the `error` object
//! of a JSON error answer (`request_id`, unless the answer already carries one: a node's
//! answer relayed by a gateway).

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The header that carries the id, both ways.
pub const HEADER: &str = "x-request-id";

/// Error answers larger than this keep their body as it is.
const MAX_ERROR_BODY: u64 = 64 * 1024;

/// The id of the request being served (in the request's extensions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// True for an id taken from a caller as it is.
pub fn sane(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+=".contains(&b))
}

/// A new id.
pub fn generate() -> String {
    ulid::Ulid::new().to_string().to_ascii_lowercase()
}

/// The middleware (see the module docs).
pub async fn tag(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| sane(v))
        .map(str::to_string)
        .unwrap_or_else(generate);
    // A sane id or a ULID is always a valid header value.
    let value = HeaderValue::from_str(&id).unwrap_or(HeaderValue::from_static("invalid"));
    req.headers_mut().insert(HEADER, value.clone());
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id);
    let mut resp = next.run(req).instrument(span).await;
    if is_small_json_error(&resp) {
        resp = with_id_in_body(resp, &id).await;
    }
    resp.headers_mut().insert(HEADER, value);
    resp
}

fn is_small_json_error(resp: &Response) -> bool {
    (resp.status().is_client_error() || resp.status().is_server_error())
        && resp
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
        && resp
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_ERROR_BODY)
}

/// Adds `request_id` to the `error` object of a JSON error body that has none.
async fn with_id_in_body(resp: Response, id: &str) -> Response {
    let (mut parts, body) = resp.into_parts();
    // The size is known and small: reading it cannot fail but for a broken body.
    let bytes = match axum::body::to_bytes(body, MAX_ERROR_BODY as usize).await {
        Ok(b) => b,
        Err(_) => return Response::from_parts(parts, Body::empty()),
    };
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    match value.get_mut("error").and_then(|e| e.as_object_mut()) {
        Some(err) if !err.contains_key("request_id") => {
            err.insert("request_id".into(), id.into());
        }
        _ => return Response::from_parts(parts, Body::from(bytes)),
    }
    let out = serde_json::to_vec(&value).unwrap_or_else(|_| bytes.to_vec());
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::get;
    use axum::Router;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn app() -> Router {
        Router::new()
            .route(
                "/echo",
                get(|req: Request| async move {
                    let ext = req.extensions().get::<RequestId>().unwrap().0.clone();
                    let hdr = req.headers()[HEADER].to_str().unwrap().to_string();
                    assert_eq!(ext, hdr, "the request carries its id both ways");
                    ext
                }),
            )
            .route(
                "/fail",
                get(|| async {
                    warren_types::http::HttpError::from(warren_types::ApiError::not_found(
                        "no such thing",
                    ))
                }),
            )
            .route(
                "/relayed",
                get(|| async {
                    (
                        StatusCode::NOT_FOUND,
                        [(header::CONTENT_TYPE, "application/json")],
                        r#"{"error":{"code":"not_found","message":"m","request_id":"from-node"}}"#,
                    )
                }),
            )
            .layer(axum::middleware::from_fn(tag))
    }

    async fn call(path: &str, id: Option<&str>) -> (StatusCode, String, String) {
        let mut req = Request::get(path);
        if let Some(id) = id {
            req = req.header(HEADER, id);
        }
        let resp = app()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let hdr = resp.headers()[HEADER].to_str().unwrap().to_string();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, hdr, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_sane_id_is_kept_and_a_bad_one_replaced() {
        let (_, hdr, body) = call("/echo", Some("trainer-7:step-42")).await;
        assert_eq!(
            (hdr.as_str(), body.as_str()),
            ("trainer-7:step-42", "trainer-7:step-42")
        );
        for bad in ["", "has space", "quote\"", &"x".repeat(129)] {
            let (_, hdr, body) = call("/echo", Some(bad)).await;
            assert_eq!(hdr, body);
            assert_ne!(hdr, bad);
            assert!(sane(&hdr) && hdr.len() == 26, "a fresh ULID: {hdr}");
        }
        let (_, a, _) = call("/echo", None).await;
        let (_, b, _) = call("/echo", None).await;
        assert_ne!(a, b, "each request gets its own");
    }

    #[tokio::test]
    async fn error_bodies_carry_the_id() {
        let (status, hdr, body) = call("/fail", Some("abc-1")).await;
        assert_eq!((status, hdr.as_str()), (StatusCode::NOT_FOUND, "abc-1"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["request_id"], "abc-1");
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no such thing");
        let e: warren_types::ErrorBody = serde_json::from_str(&body).unwrap();
        assert_eq!(e.error.request_id.as_deref(), Some("abc-1"));
        // An answer that already names one (a node's, relayed) keeps it.
        let (_, _, body) = call("/relayed", Some("abc-2")).await;
        assert!(body.contains("\"request_id\":\"from-node\""), "{body}");
    }
}
