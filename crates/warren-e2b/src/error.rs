//! Errors of the E2B front, answered in E2B's shape: `{"code": <status>, "message": ...}`
//! with the HTTP status the SDKs map (401 → AuthenticationException, 404 → NotFound, 429 →
//! RateLimitException, ...). An error of the v1 API keeps its status, its message and its
//! `Retry-After`, and names its Warren code in the message.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::wire;

/// Why an E2B request was refused.
#[derive(Debug, thiserror::Error)]
pub enum E2bError {
    /// 400: malformed or unsupported input.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no API key, a bad one, or a bad envd access token.
    #[error("{0}")]
    Unauthorized(String),
    /// 404: no such sandbox, template or snapshot (for this caller).
    #[error("{0}")]
    NotFound(String),
    /// 409: the sandbox is not in a state the call needs (e.g. already paused).
    #[error("{0}")]
    Conflict(String),
    /// 413: a request body over the limit.
    #[error("{0}")]
    TooLarge(String),
    /// 501: a route or feature of E2B's API that Warren does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// 500: the answer of the v1 API could not be read.
    #[error("{0}")]
    Internal(String),
    /// An error answered by Warren's v1 API, relayed with its status.
    #[error("{code}: {message}")]
    Native {
        status: u16,
        /// Warren's error code (`quota_exceeded`, `image_not_found`, ...).
        code: String,
        message: String,
        retry_after: Option<u64>,
    },
}

impl E2bError {
    pub fn status(&self) -> StatusCode {
        match self {
            E2bError::BadRequest(_) => StatusCode::BAD_REQUEST,
            E2bError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            E2bError::NotFound(_) => StatusCode::NOT_FOUND,
            E2bError::Conflict(_) => StatusCode::CONFLICT,
            E2bError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            E2bError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            E2bError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            E2bError::Native { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
        }
    }

    /// The error a v1 API answer carries (`{"error": {"code", "message", "retry_after"}}`);
    /// a body of another shape is quoted as it is.
    pub fn from_native(status: StatusCode, body: &[u8]) -> E2bError {
        let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
        let err = v.as_ref().and_then(|v| v.get("error"));
        let text = |k: &str| {
            err.and_then(|e| e.get(k))
                .and_then(|m| m.as_str())
                .map(str::to_string)
        };
        let message = text("message")
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into());
        E2bError::Native {
            status: status.as_u16(),
            code: text("code").unwrap_or_else(|| "error".into()),
            message,
            retry_after: err
                .and_then(|e| e.get("retry_after"))
                .and_then(|r| r.as_u64()),
        }
    }

    /// Warren's error code, for a relayed v1 error.
    pub fn native_code(&self) -> Option<&str> {
        match self {
            E2bError::Native { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after = match &self {
            E2bError::Native { retry_after, .. } => *retry_after,
            _ => None,
        };
        let body = wire::Error {
            code: status.as_u16(),
            message: self.to_string(),
        };
        let mut resp = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        resp
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(r: Response) -> serde_json::Value {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&b).unwrap()
    }

    #[tokio::test]
    async fn native_errors_keep_status_message_and_retry_after() {
        let e = E2bError::from_native(
            StatusCode::TOO_MANY_REQUESTS,
            br#"{"error":{"code":"quota_exceeded","message":"quota max_sandboxes of tenant a exceeded","retry_after":3}}"#,
        );
        assert_eq!(e.native_code(), Some("quota_exceeded"));
        let r = e.into_response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        let v = body(r).await;
        assert_eq!(v["code"], 429);
        assert!(v["message"].as_str().unwrap().contains("max_sandboxes"));
    }

    #[tokio::test]
    async fn odd_bodies_are_quoted() {
        let r = E2bError::from_native(StatusCode::BAD_GATEWAY, b"upstream broke").into_response();
        assert_eq!(r.status(), 502);
        assert!(body(r).await["message"]
            .as_str()
            .unwrap()
            .contains("upstream broke"));
        let r = E2bError::NotFound("sandbox x not found".into()).into_response();
        assert_eq!(
            body(r).await,
            serde_json::json!({"code": 404, "message": "sandbox x not found"})
        );
    }
}
