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

/// The largest message this server reads (a request envelope or a unary body). envd's
/// requests are small; stdin chunks and file uploads go elsewhere or in many messages.
pub const MAX_MESSAGE: usize = 16 << 20;

/// One decoded envelope of a request stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub payload: Bytes,
}

/// Reads envelopes out of a request body as its chunks arrive: bytes go in with
/// [`EnvelopeReader::push`], whole messages come out of [`EnvelopeReader::next`]. Every
/// malformed input is a [`ConnectError`], never a panic.
#[derive(Debug)]
pub struct EnvelopeReader {
    buf: BytesMut,
    max: usize,
}

impl Default for EnvelopeReader {
    fn default() -> Self {
        Self::new(MAX_MESSAGE)
    }
}

impl EnvelopeReader {
    /// A reader refusing messages over `max` bytes.
    pub fn new(max: usize) -> Self {
        EnvelopeReader {
            buf: BytesMut::new(),
            max,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole message, `Ok(None)` when more bytes are needed. A client's stream
    /// carries messages only: the end-of-stream flag, a compressed message (no compression is
    /// negotiated) and unknown flags are refused, and so is a length over the limit, before
    /// its bytes are waited for.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ConnectError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::Internal,
                "a compressed message, but no compression was negotiated",
            ));
        }
        if flags & FLAG_END_STREAM != 0 {
            return Err(ConnectError::invalid(
                "a request stream must not carry an end-of-stream message",
            ));
        }
        if flags != 0 {
            return Err(ConnectError::invalid(format!(
                "unknown envelope flags {flags:#04x}"
            )));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > self.max {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!(
                    "a message of {len} bytes is over the limit of {} bytes",
                    self.max
                ),
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let mut msg = self.buf.split_to(5 + len);
        let payload = msg.split_off(5).freeze();
        Ok(Some(Frame { payload }))
    }

    /// Checks that the stream ended between messages.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ConnectError::invalid(format!(
                "the request stream ended inside a message ({} bytes left over)",
                self.buf.len()
            )))
        }
    }
}

/// Decodes a message in `codec`.
pub fn decode<M>(codec: Codec, bytes: &[u8]) -> Result<M, ConnectError>
where
    M: prost::Message + Default + serde::de::DeserializeOwned,
{
    match codec {
        Codec::Proto => M::decode(bytes)
            .map_err(|e| ConnectError::invalid(format!("the request is not a valid message: {e}"))),
        Codec::Json => {
            // An empty body is the empty message (as protobuf's binary form would be).
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(M::default());
            }
            serde_json::from_slice(bytes)
                .map_err(|e| ConnectError::invalid(format!("the request is not valid JSON: {e}")))
        }
    }
}

/// Encodes a message in `codec`.
pub fn encode<M: prost::Message + serde::Serialize>(codec: Codec, msg: &M) -> Vec<u8> {
    match codec {
        Codec::Proto => msg.encode_to_vec(),
        Codec::Json => serde_json::to_vec(msg).unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// A unary call's answer.
pub fn unary_ok<M: prost::Message + serde::Serialize>(codec: Codec, msg: &M) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, codec.unary_content_type())],
        encode(codec, msg),
    )
        .into_response()
}

/// A message of a server stream, enveloped.
pub fn stream_message<M: prost::Message + serde::Serialize>(codec: Codec, msg: &M) -> Bytes {
    envelope(0, &encode(codec, msg))
}

/// The deadline a client set (`Connect-Timeout-Ms`, at most 10 digits), if any.
pub fn timeout(headers: &HeaderMap) -> Result<Option<std::time::Duration>, ConnectError> {
    let Some(v) = headers.get("connect-timeout-ms") else {
        return Ok(None);
    };
    let s = v.to_str().unwrap_or("");
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ConnectError::invalid(format!(
            "Connect-Timeout-Ms must be 1 to 10 digits, got {s:?}"
        )));
    }
    Ok(Some(std::time::Duration::from_millis(
        s.parse().unwrap_or(u64::MAX),
    )))
}

/// Refuses a request body in an encoding other than identity (none is negotiated).
pub fn check_identity(headers: &HeaderMap, kind: CallKind) -> Result<(), ConnectError> {
    let name = match kind {
        CallKind::Unary(_) => header::CONTENT_ENCODING.as_str(),
        CallKind::Stream(_) => "connect-content-encoding",
    };
    match headers.get(name).map(|v| v.to_str().unwrap_or("?")) {
        None | Some("identity") => Ok(()),
        Some(other) => Err(ConnectError::new(
            Code::Unimplemented,
            format!("request compression {other:?} is not supported (only identity)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &[u8], max: usize) -> Result<Vec<Bytes>, ConnectError> {
        let mut r = EnvelopeReader::new(max);
        let mut out = Vec::new();
        // Byte by byte: every split point of the input is tried.
        for b in input {
            r.push(std::slice::from_ref(b));
            while let Some(f) = r.next_frame()? {
                out.push(f.payload);
            }
        }
        r.finish()?;
        Ok(out)
    }

    #[test]
    fn envelopes_round_trip_across_any_split() {
        let mut input = envelope(0, b"{\"a\":1}").to_vec();
        input.extend_from_slice(&envelope(0, b""));
        input.extend_from_slice(&envelope(0, &[7u8; 300]));
        let out = read_all(&input, 1024).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(&out[0][..], b"{\"a\":1}");
        assert!(out[1].is_empty());
        assert_eq!(out[2].len(), 300);
    }

    #[test]
    fn malformed_envelopes_are_connect_errors() {
        let truncated = &envelope(0, b"hello")[..7];
        assert_eq!(
            read_all(truncated, 1024).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            read_all(&[0, 0, 0], 1024).unwrap_err().code,
            Code::InvalidArgument
        );
        let oversized = [0, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            read_all(&oversized, 1024).unwrap_err().code,
            Code::ResourceExhausted
        );
        let compressed = envelope(FLAG_COMPRESSED, b"x");
        assert_eq!(
            read_all(&compressed, 1024).unwrap_err().code,
            Code::Internal
        );
        let end = envelope(FLAG_END_STREAM, b"{}");
        assert_eq!(
            read_all(&end, 1024).unwrap_err().code,
            Code::InvalidArgument
        );
        let bad_flags = envelope(0x80, b"x");
        assert_eq!(
            read_all(&bad_flags, 1024).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn every_byte_string_decodes_or_errs() {
        // A cheap exhaustive sweep over short inputs (the fuzz target goes further).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..64 {
            for _ in 0..200 {
                let input: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        if seed.is_multiple_of(3) {
                            0
                        } else {
                            seed as u8
                        }
                    })
                    .collect();
                let _ = read_all(&input, 32);
                for codec in [Codec::Proto, Codec::Json] {
                    use crate::pb::{filesystem as fs, process as pr};
                    let _ = decode::<pr::StartRequest>(codec, &input);
                    let _ = decode::<pr::StreamInputRequest>(codec, &input);
                    let _ = decode::<pr::SendInputRequest>(codec, &input);
                    let _ = decode::<pr::SendSignalRequest>(codec, &input);
                    let _ = decode::<pr::UpdateRequest>(codec, &input);
                    let _ = decode::<pr::SelectorOnly>(codec, &input);
                    let _ = decode::<fs::PathRequest>(codec, &input);
                    let _ = decode::<fs::ListDirRequest>(codec, &input);
                    let _ = decode::<fs::MoveRequest>(codec, &input);
                    let _ = decode::<fs::WatchRequest>(codec, &input);
                    let _ = decode::<fs::WatcherId>(codec, &input);
                }
            }
        }
    }

    #[test]
    fn content_types_name_the_call_kind() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/connect+json; charset=utf-8"),
        );
        assert_eq!(CallKind::of(&h), Some(CallKind::Stream(Codec::Json)));
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/proto"),
        );
        assert_eq!(CallKind::of(&h), Some(CallKind::Unary(Codec::Proto)));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(CallKind::of(&h), None);
        h.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(
            timeout(&h).unwrap(),
            Some(std::time::Duration::from_millis(1500))
        );
        h.insert("connect-timeout-ms", HeaderValue::from_static("-1"));
        assert!(timeout(&h).is_err());
    }

    #[test]
    fn errors_have_connects_shape() {
        let e = ConnectError::new(Code::NotFound, "no process 7");
        let r = e.clone().into_response(CallKind::Unary(Codec::Json));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            String::from_utf8_lossy(&end_stream(Some(&e))[5..]),
            r#"{"error":{"code":"not_found","message":"no process 7"}}"#
        );
        assert_eq!(end_stream(None)[0], FLAG_END_STREAM);
    }
}
