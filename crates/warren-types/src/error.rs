//! Stable, machine-readable error codes shared by the daemon, the clients and the SDK.

use serde::{Deserialize, Serialize};

/// Every error the public API can return. The serialized (snake_case) name is the stable
/// `code` clients match on; never rename a variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request body or query is malformed, has unknown fields or out-of-range values.
    InvalidRequest,
    /// A path is not absolute, contains NUL, or escapes the sandbox root.
    InvalidPath,
    /// No sandbox, process, image or file of that name.
    NotFound,
    /// The sandbox is not in a state that allows the call (e.g. stopped).
    InvalidState,
    /// The idempotency key or name is already used by a different request.
    Conflict,
    /// A node limit (sandbox count, memory) refuses the request.
    LimitExceeded,
    /// The node is saturated; retry after `retry_after` seconds.
    Busy,
    /// The call did not finish within its timeout.
    Timeout,
    /// The requested substrate is not served by this node.
    UnsupportedSubstrate,
    /// The sandbox failed to start; the message says why. Nothing was left behind.
    StartFailed,
    /// The sandbox's agent went away (sandbox crashed or was killed).
    SandboxLost,
    /// A file operation failed inside the sandbox (permission, not a directory, ...).
    FileError,
    /// A bug or an unexpected host failure.
    Internal,
    /// The request names a trajectory step that was already logged with a different request,
    /// or a step lower than one already logged. Nothing ran.
    StepConflict,
    /// No token, or a token the node does not know (HTTP 401). Nothing was done.
    Unauthorized,
    /// The caller's role may not make this call (HTTP 403).
    Forbidden,
    /// A tenant quota refuses the request; the message names the quota; retry after
    /// `retry_after` seconds.
    QuotaExceeded,
    /// Cluster gateway: every node that could take the request refused it for now (all busy,
    /// draining or short of memory); retry after `retry_after` seconds.
    CapacityUnavailable,
    /// Cluster gateway: no node of the cluster can ever take the request (substrate, image or
    /// size); the message says how many nodes each check excluded.
    Unschedulable,
    /// Cluster gateway: the sandbox's node does not answer. The sandbox may come back when
    /// its node does; nothing was moved.
    NodeUnreachable,
    /// Nothing accepts connections on the sandbox's port (HTTP 502), or what does closed the
    /// connection without an HTTP answer.
    PortUnreachable,
    /// An image build failed at one of its steps (a `RUN` that exited non-zero or timed
    /// out, a `COPY` of a missing file); the message names the step. Nothing was tagged.
    BuildFailed,
    /// A pull could not reach its registry (no connection, TLS, a timeout): the message
    /// names the registry and what failed (HTTP 502). Nothing was tagged.
    RegistryUnreachable,
    /// The step's command was running when the node's daemon went away and its result could
    /// not be recovered whole (e.g. its streamed stdin was cut off); the message says what is
    /// known. The command is not run again for this step.
    StepInterrupted,
}

impl ErrorCode {
    /// The HTTP status this code maps to.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidRequest | ErrorCode::InvalidPath => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::InvalidState
            | ErrorCode::Conflict
            | ErrorCode::StepConflict
            | ErrorCode::StepInterrupted => 409,
            ErrorCode::FileError | ErrorCode::Unschedulable | ErrorCode::BuildFailed => 422,
            ErrorCode::CapacityUnavailable | ErrorCode::NodeUnreachable => 503,
            ErrorCode::LimitExceeded | ErrorCode::Busy | ErrorCode::QuotaExceeded => 429,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::Timeout => 504,
            ErrorCode::UnsupportedSubstrate => 501,
            ErrorCode::StartFailed
            | ErrorCode::SandboxLost
            | ErrorCode::PortUnreachable
            | ErrorCode::RegistryUnreachable => 502,
            ErrorCode::Internal => 500,
        }
    }

    /// The stable string form (`"not_found"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidPath => "invalid_path",
            ErrorCode::NotFound => "not_found",
            ErrorCode::InvalidState => "invalid_state",
            ErrorCode::Conflict => "conflict",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::UnsupportedSubstrate => "unsupported_substrate",
            ErrorCode::StartFailed => "start_failed",
            ErrorCode::SandboxLost => "sandbox_lost",
            ErrorCode::FileError => "file_error",
            ErrorCode::Internal => "internal",
            ErrorCode::StepConflict => "step_conflict",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::CapacityUnavailable => "capacity_unavailable",
            ErrorCode::Unschedulable => "unschedulable",
            ErrorCode::NodeUnreachable => "node_unreachable",
            ErrorCode::PortUnreachable => "port_unreachable",
            ErrorCode::BuildFailed => "build_failed",
            ErrorCode::RegistryUnreachable => "registry_unreachable",
            ErrorCode::StepInterrupted => "step_interrupted",
        }
    }

    /// All codes, for documentation and spec tests.
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidPath,
        ErrorCode::NotFound,
        ErrorCode::InvalidState,
        ErrorCode::Conflict,
        ErrorCode::LimitExceeded,
        ErrorCode::Busy,
        ErrorCode::Timeout,
        ErrorCode::UnsupportedSubstrate,
        ErrorCode::StartFailed,
        ErrorCode::SandboxLost,
        ErrorCode::FileError,
        ErrorCode::Internal,
        ErrorCode::StepConflict,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::QuotaExceeded,
        ErrorCode::CapacityUnavailable,
        ErrorCode::Unschedulable,
        ErrorCode::NodeUnreachable,
        ErrorCode::PortUnreachable,
        ErrorCode::BuildFailed,
        ErrorCode::RegistryUnreachable,
        ErrorCode::StepInterrupted,
    ];
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An API error: a stable code plus a human message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds to wait before retrying (only with `busy`, `limit_exceeded`,
    /// `capacity_unavailable` and `quota_exceeded`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// The id of the request that failed (its `x-request-id`), set by the server's edge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            retry_after: None,
            request_id: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
}

/// The JSON body of every error response: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ApiError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_as_strings() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, code);
            assert!((400..600).contains(&code.http_status()));
        }
    }
}
