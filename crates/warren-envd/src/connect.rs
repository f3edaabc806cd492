//! The Connect protocol's wire: error codes and their HTTP statuses, the error body, the
//! envelope (one flag byte, a big-endian `u32` length, the message) of streaming calls, and
//! the content types that say which encoding (JSON or protobuf) a call uses.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};

/// Connect's error codes (the names are the wire form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The code as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status a unary call's error is answered with.
    pub fn http_status(self) -> StatusCode {
        let n = match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        };
        StatusCode::from_u16(n).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

/// A Connect error: a code and a message, answered in the protocol's own shape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Code::Internal, message)
    }

    /// `{"code": ..., "message": ...}`, the body of a unary error and the `error` of an
    /// end-of-stream message.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }

    /// The error as the answer to a call of `kind`: a unary call's status and JSON body, or a
    /// streaming call's `200` with the end-of-stream message alone.
    pub fn into_response(self, kind: CallKind) -> Response {
        match kind {
            CallKind::Unary(_) => {
                let body = self.to_json().to_string();
                (
                    self.code.http_status(),
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    )],
                    body,
                )
                    .into_response()
            }
            CallKind::Stream(codec) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, codec.stream_content_type())],
                end_stream(Some(&self)),
            )
                .into_response(),
        }
    }
}

/// A message's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    Json,
    Proto,
}

impl Codec {
    pub fn unary_content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Codec::Json => "application/json",
            Codec::Proto => "application/proto",
        })
    }

    pub fn stream_content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Codec::Json => "application/connect+json",
            Codec::Proto => "application/connect+proto",
        })
    }
}

/// How a call is framed: a unary call's bare message, or a streaming call's envelopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    Unary(Codec),
    Stream(Codec),
}

impl CallKind {
    /// The kind a request's `Content-Type` names (parameters such as `; charset=utf-8` are
    /// ignored), or `None` for a type Connect does not define.
    pub fn of(headers: &HeaderMap) -> Option<CallKind> {
        let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        let ct = ct.split(';').next().unwrap_or("").trim();
        Some(match ct.to_ascii_lowercase().as_str() {
            "application/json" => CallKind::Unary(Codec::Json),
            "application/proto" => CallKind::Unary(Codec::Proto),
            "application/connect+json" => CallKind::Stream(Codec::Json),
            "application/connect+proto" => CallKind::Stream(Codec::Proto),
            _ => return None,
        })
    }

    /// The kind of `headers`' call, a unary JSON call when the type says nothing (the form
    /// errors about a bad request are answered in).
    pub fn of_or_unary(headers: &HeaderMap) -> CallKind {
        Self::of(headers).unwrap_or(CallKind::Unary(Codec::Json))
    }

    pub fn codec(self) -> Codec {
        match self {
            CallKind::Unary(c) | CallKind::Stream(c) => c,
        }
    }
}

/// Flag of a compressed envelope.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag of the end-of-stream envelope.
pub const FLAG_END_STREAM: u8 = 0x02;

/// An envelope: a message (or the end of the stream) in a streaming call.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + payload.len());
    b.put_u8(flags);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.freeze()
}

/// The end-of-stream envelope: `{}` or `{"error": {...}}` (always JSON).
pub fn end_stream(error: Option<&ConnectError>) -> Bytes {
    let body = match error {
        None => b"{}".to_vec(),
        Some(e) => serde_json::json!({ "error": e.to_json() })
            .to_string()
            .into_bytes(),
    };
    envelope(FLAG_END_STREAM, &body)
}
