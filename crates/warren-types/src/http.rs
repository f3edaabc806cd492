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
