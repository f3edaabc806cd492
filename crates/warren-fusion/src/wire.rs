//! The protocol's JSON: what `POST /run_code` takes and answers, field for field as
//! SandboxFusion's clients send and read them (unknown fields are ignored, as its server
//! does).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use warren_types::ImageRef;

use crate::error::FusionError;

fn ten() -> f64 {
    10.0
}

fn no_memory_limit() -> f64 {
    -1.0
}

/// `POST /run_code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCodeRequest {
    /// The program's source.
    pub code: String,
    /// One of the protocol's language names (`python`, `bash`, `cpp`, ...).
    pub language: String,
    /// Seconds the compile step may take (compiled languages).
    #[serde(default = "ten")]
    pub compile_timeout: f64,
    /// Seconds the program may run.
    #[serde(default = "ten")]
    pub run_timeout: f64,
    /// Memory limit in MiB; zero or less: the node's default limit of a call.
    #[serde(default = "no_memory_limit", rename = "memory_limit_MB")]
    pub memory_limit_mb: f64,
    /// Fed to the program's stdin, then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Files written before the program starts: path (relative to the working directory,
    /// or absolute) → base64 contents; `null` contents are skipped.
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    /// Files read back after the run, by the same names; missing ones are left out.
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Extra arguments of a test runner (`pytest`).
    #[serde(default)]
    pub args: Vec<String>,
    /// Warren's extension: the image (or image stack) to run in; the default image when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
}

/// How one step (compile or run) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandRunStatus {
    /// It ended by itself (any exit status).
    Finished,
    /// It could not be run.
    Error,
    /// It was killed at its timeout.
    TimeLimitExceeded,
}

/// One step's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandRunResult {
    pub status: CommandRunStatus,
    /// Seconds.
    pub execution_time: Option<f64>,
    /// Exit status; 128 + the signal's number when a signal ended it; absent after a timeout.
    pub return_code: Option<i32>,
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

/// The request's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// Every step finished with status 0.
    Success,
    /// A step exited non-zero or ran out of time.
    Failed,
    /// The server could not run the request; `message` says why.
    SandboxError,
}

/// The answer of `POST /run_code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunCodeResponse {
    pub status: RunStatus,
    pub message: String,
    pub compile_result: Option<CommandRunResult>,
    pub run_result: Option<CommandRunResult>,
    /// Who ran it (the node's name).
    pub executor_pod_name: Option<String>,
    /// Fetched files: name as asked → base64 contents.
    pub files: BTreeMap<String, String>,
}

impl RunCodeResponse {
    /// The server-side failure answer.
    pub fn sandbox_error(message: impl Into<String>) -> Self {
        RunCodeResponse {
            status: RunStatus::SandboxError,
            message: message.into(),
            compile_result: None,
            run_result: None,
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }
}

/// Parses a `/run_code` body; the errors are the protocol's validation errors.
pub fn parse(body: &[u8]) -> Result<RunCodeRequest, FusionError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(FusionError::invalid(&["body"], "Field required", "missing"));
    }
    let req: RunCodeRequest = serde_json::from_slice(body)
        .map_err(|e| FusionError::invalid(&["body"], e.to_string(), "json_invalid"))?;
    req.validate()?;
    Ok(req)
}

/// Longest timeout of a step: a day.
pub(crate) const MAX_TIMEOUT: f64 = 86_400.0;

impl RunCodeRequest {
    /// Checks what the types leave open.
    pub fn validate(&self) -> Result<(), FusionError> {
        if !crate::lang::known(&self.language) {
            return Err(FusionError::invalid(
                &["body", "language"],
                format!(
                    "Input should be one of {}",
                    crate::lang::KNOWN
                        .iter()
                        .map(|l| format!("'{l}'"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                "literal_error",
            ));
        }
        for (name, t) in [
            ("compile_timeout", self.compile_timeout),
            ("run_timeout", self.run_timeout),
        ] {
            if !(t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT) {
                return Err(FusionError::invalid(
                    &["body", name],
                    format!("Input should be greater than 0 and at most {MAX_TIMEOUT}"),
                    "value_error",
                ));
            }
        }
        if !self.memory_limit_mb.is_finite() || self.memory_limit_mb > (1u64 << 30) as f64 {
            return Err(FusionError::invalid(
                &["body", "memory_limit_MB"],
                "Input should be a number of MiB",
                "value_error",
            ));
        }
        Ok(())
    }

    /// The memory limit asked for, when there is one.
    pub fn memory_mb(&self) -> Option<u64> {
        (self.memory_limit_mb > 0.0).then(|| self.memory_limit_mb.ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_clients_send() {
        // The body veRL's reward code posts.
        let r = parse(
            br#"{"compile_timeout": 10, "run_timeout": 10, "code": "print(1)", "stdin": "",
                 "memory_limit_MB": 1024, "language": "python", "files": {}, "fetch_files": []}"#,
        )
        .unwrap();
        assert_eq!(r.memory_mb(), Some(1024));
        assert_eq!(r.stdin.as_deref(), Some(""));
        // The client package's body: no memory limit, null stdin, null file contents.
        let r = parse(
            br#"{"compile_timeout": 10.0, "run_timeout": 2.5, "code": "x", "stdin": null,
                 "language": "bash", "files": {"a": null}, "fetch_files": ["b"]}"#,
        )
        .unwrap();
        assert_eq!(r.memory_mb(), None);
        assert_eq!(r.files.get("a"), Some(&None));
        // Only code and language are required; unknown fields are ignored.
        let r = parse(br#"{"code": "x", "language": "python", "future": 1}"#).unwrap();
        assert_eq!((r.compile_timeout, r.run_timeout), (10.0, 10.0));
    }

    #[test]
    fn refuses_in_the_protocols_shape() {
        for (body, loc) in [
            (&br#"{"language": "python"}"#[..], "body"),
            (br#"{"code": "x", "language": "cobol"}"#, "language"),
            (
                br#"{"code": "x", "language": "python", "run_timeout": -1}"#,
                "run_timeout",
            ),
            (
                br#"{"code": "x", "language": "python", "compile_timeout": 1e999}"#,
                "body",
            ),
            (br#"{"code": 1, "language": "python"}"#, "body"),
            (b"", "body"),
            (b"[]", "body"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.status(), 422, "{e}");
            let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
            let l = v["detail"][0]["loc"].as_array().unwrap();
            assert_eq!(l.last().unwrap(), loc, "{v}");
            assert_eq!(v["code"], "invalid_request");
        }
    }
}
