//! The in-process client of Warren's v1 API: requests go straight into the router (no
//! socket, no serialisation beyond the API's own JSON) with the caller in their extensions,
//! and Warren's errors come back as Connect errors.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use tower::ServiceExt;
use warren_types::{ApiError, Caller, ErrorBody, ErrorCode};

use crate::connect::{Code, ConnectError};

/// The largest JSON answer read whole (a directory page is at most about 8 MiB).
const MAX_ANSWER: usize = 16 << 20;

#[derive(Clone)]
pub struct V1 {
    router: axum::Router,
}

/// A sandbox's routes as one caller: `/v1/sandboxes/{id}` and who asks.
#[derive(Clone)]
pub struct Sandbox {
    pub v1: V1,
    pub id: String,
    pub caller: Caller,
    base: String,
}

impl V1 {
    pub fn new(router: axum::Router) -> Self {
        V1 { router }
    }

    pub fn sandbox(&self, id: &str, caller: Caller) -> Sandbox {
        Sandbox {
            v1: self.clone(),
            id: id.to_string(),
            caller,
            base: format!("/v1/sandboxes/{}", enc(id)),
        }
    }
}

impl Sandbox {
    /// Sends `method` to `{base}{path}` with `body`; the answer whatever its status.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Body,
    ) -> Result<Response, ConnectError> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        let mut req = req
            .body(body)
            .map_err(|e| ConnectError::invalid(format!("bad request: {e}")))?;
        req.extensions_mut().insert(self.caller.clone());
        match self.v1.router.clone().oneshot(req).await {
            Ok(r) => Ok(r),
            Err(never) => match never {},
        }
    }

    /// Sends and checks the status: an error answer becomes its Connect error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&'static str>,
        body: Body,
    ) -> Result<Response, ConnectError> {
        let r = self.send(method, path, content_type, body).await?;
        if r.status().is_success() {
            Ok(r)
        } else {
            Err(error_of(r).await)
        }
    }

    /// A JSON call with a JSON answer.
    pub async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, ConnectError> {
        let r = self.json_call(method, path, body).await?;
        let bytes = read_limited(r.into_body(), MAX_ANSWER).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ConnectError::internal(format!("the node's answer did not parse: {e}")))
    }

    /// A JSON call whose answer has no body worth reading (204).
    pub async fn json_call(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<Response, ConnectError> {
        let (ct, body) = match body {
            Some(b) => (
                Some("application/json"),
                Body::from(
                    serde_json::to_vec(b).map_err(|e| ConnectError::internal(e.to_string()))?,
                ),
            ),
            None => (None, Body::empty()),
        };
        self.call(method, path, ct, body).await
    }
}

/// Reads a body up to `max` bytes.
pub async fn read_limited(body: Body, max: usize) -> Result<Bytes, ConnectError> {
    let limited = http_body_util::Limited::new(body, max);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("reading a body of at most {max} bytes: {e}"),
        )),
    }
}

/// The Connect error of a v1 error answer.
pub async fn error_of(r: Response) -> ConnectError {
    let status = r.status();
    match read_limited(r.into_body(), 1 << 20).await {
        Ok(b) => match serde_json::from_slice::<ErrorBody>(&b) {
            Ok(e) => from_api(&e.error),
            Err(_) => ConnectError::new(
                code_of_status(status),
                format!("HTTP {status}: {}", String::from_utf8_lossy(&b)),
            ),
        },
        Err(e) => e,
    }
}

fn code_of_status(s: StatusCode) -> Code {
    match s.as_u16() {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::AlreadyExists,
        429 => Code::ResourceExhausted,
        501 => Code::Unimplemented,
        502 | 503 => Code::Unavailable,
        504 => Code::DeadlineExceeded,
        _ => Code::Internal,
    }
}

/// Warren's error codes as Connect's (the SDK turns each into its own exception: not_found
/// into NotFoundException, invalid_argument into InvalidArgumentException, deadline_exceeded
/// into TimeoutException, resource_exhausted into RateLimitException, ...).
pub fn from_api(e: &ApiError) -> ConnectError {
    let code = match e.code {
        ErrorCode::InvalidRequest | ErrorCode::InvalidPath => Code::InvalidArgument,
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::InvalidState | ErrorCode::Unschedulable | ErrorCode::BuildFailed => {
            Code::FailedPrecondition
        }
        ErrorCode::Conflict => Code::AlreadyExists,
        ErrorCode::StepConflict | ErrorCode::StepInterrupted => Code::Aborted,
        ErrorCode::LimitExceeded
        | ErrorCode::Busy
        | ErrorCode::QuotaExceeded
        | ErrorCode::CapacityUnavailable => Code::ResourceExhausted,
        ErrorCode::Timeout => Code::DeadlineExceeded,
        ErrorCode::UnsupportedSubstrate => Code::Unimplemented,
        ErrorCode::SandboxLost
        | ErrorCode::NodeUnreachable
        | ErrorCode::PortUnreachable
        | ErrorCode::RegistryUnreachable => Code::Unavailable,
        ErrorCode::FileError => file_error_code(&e.message),
        ErrorCode::Unauthorized => Code::Unauthenticated,
        ErrorCode::Forbidden => Code::PermissionDenied,
        ErrorCode::StartFailed | ErrorCode::Internal => Code::Internal,
    };
    ConnectError::new(code, e.message.clone())
}

/// A file error's code from what the sandbox said (the errno's text).
fn file_error_code(msg: &str) -> Code {
    let m = msg.to_ascii_lowercase();
    if m.contains("no such file") || m.contains("not found") {
        Code::NotFound
    } else if m.contains("exists") {
        Code::AlreadyExists
    } else if m.contains("permission denied") || m.contains("not permitted") {
        Code::PermissionDenied
    } else {
        Code::InvalidArgument
    }
}

/// Percent-encodes a query value or path segment (everything but unreserved characters and
/// `/`, which Warren's paths keep readable).
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warren_errors_map_to_connect_codes() {
        let e = |c, m: &str| from_api(&ApiError::new(c, m)).code;
        assert_eq!(e(ErrorCode::NotFound, "no sandbox"), Code::NotFound);
        assert_eq!(e(ErrorCode::InvalidPath, "relative"), Code::InvalidArgument);
        assert_eq!(e(ErrorCode::Timeout, "late"), Code::DeadlineExceeded);
        assert_eq!(e(ErrorCode::QuotaExceeded, "cpu"), Code::ResourceExhausted);
        assert_eq!(e(ErrorCode::SandboxLost, "gone"), Code::Unavailable);
        assert_eq!(
            e(ErrorCode::FileError, "File exists (os error 17)"),
            Code::AlreadyExists
        );
        assert_eq!(
            e(ErrorCode::FileError, "No such file or directory"),
            Code::NotFound
        );
        assert_eq!(
            e(ErrorCode::FileError, "Is a directory"),
            Code::InvalidArgument
        );
        assert_eq!(enc("/a b/ü?&"), "/a%20b/%C3%BC%3F%26");
    }
}
