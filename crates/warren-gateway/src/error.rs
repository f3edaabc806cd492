//! The gateway's own answers: the node API's error body, with the statuses only a gateway
//! gives (`410 sandbox_lost` for a sandbox whose node's registration expired).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_types::{ApiError, ErrorBody, ErrorCode};

/// An error answered by the gateway itself.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error}")]
pub struct GatewayError {
    pub error: ApiError,
    /// Overrides the code's status.
    pub status: Option<StatusCode>,
}

impl GatewayError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::new(code, message).into()
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// The sandbox's node is not registered any more: 410 `sandbox_lost`.
    pub fn lost(message: impl Into<String>) -> Self {
        GatewayError {
            error: ApiError::new(ErrorCode::SandboxLost, message),
            status: Some(StatusCode::GONE),
        }
    }

    pub fn unreachable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NodeUnreachable, message)
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

impl From<ApiError> for GatewayError {
    fn from(error: ApiError) -> Self {
        GatewayError {
            error,
            status: None,
        }
    }
}

impl IntoResponse for GatewayError {
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

pub type GatewayResult<T> = Result<T, GatewayError>;
