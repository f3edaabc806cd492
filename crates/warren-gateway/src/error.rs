//! The gateway's own answers: the API's one error type, plus the statuses only a gateway gives
//! (`410 sandbox_lost` for a sandbox whose node's registration expired).

use axum::http::StatusCode;
use warren_types::ErrorCode;

pub use warren_types::http::{HttpError as GatewayError, HttpResult as GatewayResult};

/// The sandbox's node is not registered any more: 410 `sandbox_lost`.
pub fn lost(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorCode::SandboxLost, message).with_status(StatusCode::GONE)
}

/// The node did not answer: 503 `node_unreachable`.
pub fn unreachable(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorCode::NodeUnreachable, message)
}
