//! Refusals in the protocol's shape: validation errors as `422 {"detail": [{"loc", "msg",
//! "type"}]}`, other refusals as `{"detail": message}` with their HTTP status, both with
//! Warren's stable `code` beside; and the server-side failures that the protocol answers
//! `200` with `status: "SandboxError"`.

use serde_json::json;
use warren_types::{ApiError, ErrorCode};

/// Why a `/run_code` request got no run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FusionError {
    /// The request does not validate (HTTP 422).
    #[error("{}: {msg}", loc.join("."))]
    Invalid {
        loc: Vec<String>,
        msg: String,
        /// The protocol's error type (`missing`, `literal_error`, ...).
        kind: &'static str,
    },
    /// The node refused the call (busy, quota, unknown image, forbidden, ...).
    #[error("{}", error.message)]
    Refused { error: ApiError },
    /// The request is fine but this server cannot run it; answered as the protocol's
    /// `SandboxError` (HTTP 200).
    #[error("{0}")]
    Sandbox(String),
}

impl FusionError {
    pub fn invalid(loc: &[&str], msg: impl Into<String>, kind: &'static str) -> Self {
        FusionError::Invalid {
            loc: loc.iter().map(|s| s.to_string()).collect(),
            msg: msg.into(),
            kind,
        }
    }

    /// A refusal of the function substrate, kept as it is unless it is the server's own
    /// failure (which the protocol reports as a `SandboxError`).
    pub fn from_api(error: ApiError) -> Self {
        match error.code {
            ErrorCode::InvalidRequest | ErrorCode::InvalidPath => FusionError::Invalid {
                loc: vec!["body".into()],
                msg: error.message,
                kind: "value_error",
            },
            ErrorCode::Internal
            | ErrorCode::SandboxLost
            | ErrorCode::StartFailed
            | ErrorCode::Timeout
            | ErrorCode::FileError => FusionError::Sandbox(error.message),
            _ => FusionError::Refused { error },
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            FusionError::Invalid { .. } => 422,
            FusionError::Refused { error } => error.code.http_status(),
            FusionError::Sandbox(_) => 200,
        }
    }

    /// Seconds a client should wait before retrying, when the refusal says.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            FusionError::Refused { error } => error.retry_after,
            _ => None,
        }
    }

    /// The JSON body of the answer.
    pub fn body(&self) -> Vec<u8> {
        let v = match self {
            FusionError::Invalid { loc, msg, kind } => json!({
                "detail": [{"loc": loc, "msg": msg, "type": kind}],
                "code": ErrorCode::InvalidRequest,
            }),
            FusionError::Refused { error } => json!({
                "detail": error.message,
                "code": error.code,
            }),
            // `RunCodeResponse::sandbox_error` and `RunJupyterResponse::sandbox_error` in one
            // (each reader ignores the other's fields), written here so errors need nothing
            // of `wire`.
            FusionError::Sandbox(m) => json!({
                "status": "SandboxError",
                "message": m,
                "compile_result": null,
                "run_result": null,
                "driver": null,
                "cells": [],
                "executor_pod_name": null,
                "files": {},
            }),
        };
        v.to_string().into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substrate_refusals_keep_their_status() {
        let mut e = ApiError::new(ErrorCode::Busy, "full");
        e.retry_after = Some(2);
        let busy = FusionError::from_api(e);
        assert_eq!((busy.status(), busy.retry_after()), (429, Some(2)));
        let v: serde_json::Value = serde_json::from_slice(&busy.body()).unwrap();
        assert_eq!(
            (v["detail"].as_str(), v["code"].as_str()),
            (Some("full"), Some("busy"))
        );
        let gone = FusionError::from_api(ApiError::new(ErrorCode::NotFound, "no image x"));
        assert_eq!(gone.status(), 404);
        let lost = FusionError::from_api(ApiError::new(ErrorCode::SandboxLost, "agent died"));
        assert_eq!(lost.status(), 200);
        let v: serde_json::Value = serde_json::from_slice(&lost.body()).unwrap();
        assert_eq!(v["status"], "SandboxError");
        assert_eq!(v["message"], "agent died");
        let typed: crate::RunCodeResponse = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(typed, crate::RunCodeResponse::sandbox_error("agent died"));
        let typed: crate::RunJupyterResponse = serde_json::from_value(v).unwrap();
        assert_eq!(
            typed,
            crate::RunJupyterResponse::sandbox_error("agent died")
        );
    }
}
