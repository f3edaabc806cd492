//! Errors as HTTP answers: `{"error":{"code":..,"message":..}}` with the code's status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_types::{ApiError, ErrorBody};

use crate::error::NodeError;

/// An error on its way out as JSON.
#[derive(Debug)]
pub struct HttpError {
    pub error: ApiError,
    /// Overrides the code's status (only for 405, which has no code of its own).
    pub status: Option<StatusCode>,
}

impl HttpError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::invalid(message).into()
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

impl From<NodeError> for HttpError {
    fn from(e: NodeError) -> Self {
        e.to_api().into()
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
