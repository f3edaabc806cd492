//! The one error type of the client. API errors keep the daemon's stable code and the HTTP
//! status; everything else says which step failed.

use std::time::Duration;

use warren_types::{ApiError, ErrorCode};

/// A boxed error from the HTTP or WebSocket stack.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything a client call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon URL is not `unix:///path` or `http://host:port`.
    #[error("invalid daemon URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// The configured token cannot be sent in a header.
    #[error("invalid token: {0}")]
    InvalidToken(String),

    /// The TLS handshake with the daemon failed; `reason` says what to fix.
    #[error("TLS with {url} failed: {reason}")]
    Tls { url: String, reason: String },

    /// A CA, certificate or key file of the client is unusable.
    #[error("TLS file {path}: {reason}")]
    TlsConfig {
        path: std::path::PathBuf,
        reason: String,
    },

    /// The daemon answered with an error body (`{"error":{"code":...}}`).
    #[error("{error} (HTTP {status})")]
    Api { status: u16, error: ApiError },

    /// The daemon answered with an error status but no JSON error body.
    #[error("HTTP {status}: {body}")]
    Status { status: u16, body: String },

    /// The connection failed, broke, or the HTTP exchange was malformed.
    #[error("{context}")]
    Transport {
        context: String,
        #[source]
        source: BoxError,
    },

    /// A body did not decode as the expected JSON type.
    #[error("cannot decode {what}")]
    Decode {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A request body could not be encoded as JSON.
    #[error("cannot encode {what}")]
    Encode {
        what: String,
        #[source]
        source: serde_json::Error,
    },

    /// A local file or stream operation failed (uploads, downloads).
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The WebSocket of a terminal session failed.
    #[error("terminal websocket: {context}")]
    WebSocket {
        context: String,
        #[source]
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },

    /// The daemon broke the protocol (a stream ended early, an unknown frame, ...).
    #[error("protocol error: {0}")]
    Protocol(String),

    /// The client-side request timeout fired.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
}

impl ClientError {
    /// The API error, when the daemon sent one.
    pub fn api_error(&self) -> Option<&ApiError> {
        match self {
            ClientError::Api { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The stable error code, when the daemon sent one.
    pub fn code(&self) -> Option<ErrorCode> {
        self.api_error().map(|e| e.code)
    }

    /// The HTTP status, when the daemon answered at all.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } | ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// True for `unauthorized` answers (no token, or one the daemon does not know).
    pub fn is_unauthorized(&self) -> bool {
        self.code() == Some(ErrorCode::Unauthorized)
    }

    /// True for `not_found` answers.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(ErrorCode::NotFound)
    }

    pub(crate) fn transport(
        context: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> ClientError {
        ClientError::Transport {
            context: context.into(),
            source: source.into(),
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ClientError {
        ClientError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn decode(what: impl Into<String>, source: serde_json::Error) -> ClientError {
        ClientError::Decode {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn websocket(
        context: impl Into<String>,
        source: tokio_tungstenite::tungstenite::Error,
    ) -> ClientError {
        ClientError::WebSocket {
            context: context.into(),
            source: Box::new(source),
        }
    }

    /// Builds the error for a non-2xx answer from its status and body.
    pub(crate) fn from_response(status: u16, body: &[u8]) -> ClientError {
        match serde_json::from_slice::<warren_types::ErrorBody>(body) {
            Ok(b) => ClientError::Api {
                status,
                error: b.error,
            },
            Err(_) => {
                let text = String::from_utf8_lossy(body);
                let mut text = text.trim().to_string();
                if text.len() > 1024 {
                    let mut end = 1024;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                    text.push_str("...");
                }
                ClientError::Status { status, body: text }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_map_to_api_errors() {
        let e = ClientError::from_response(
            404,
            br#"{"error":{"code":"not_found","message":"no sandbox n1-x"}}"#,
        );
        assert!(e.is_not_found());
        assert_eq!(e.status(), Some(404));
        assert_eq!(e.to_string(), "not_found: no sandbox n1-x (HTTP 404)");

        let e = ClientError::from_response(
            429,
            br#"{"error":{"code":"busy","message":"later","retry_after":2}}"#,
        );
        assert_eq!(e.api_error().unwrap().retry_after, Some(2));

        let e = ClientError::from_response(502, b"Bad Gateway\n");
        assert!(matches!(&e, ClientError::Status { status: 502, body } if body == "Bad Gateway"));
        assert_eq!(e.code(), None);
    }
}
