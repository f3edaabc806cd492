//! Function calls: one stateless command in a pre-warmed container (`POST
//! /v1/functions/call`), and the stats of the warm pools behind them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::ApiError;
use crate::exec::{OutputEncoding, DEFAULT_OUTPUT_CAP, MAX_INLINE_STDIN, MAX_OUTPUT_CAP};
use crate::sandbox::ImageRef;
use crate::validate;

/// Default cap on each returned file: 512 KiB.
pub const DEFAULT_RETURN_CAP: u64 = 512 * 1024;
/// Largest cap on a returned file a request may ask for (one agent frame carries it).
pub const MAX_RETURN_CAP: u64 = 700 * 1024;
/// Most files written or returned by one call.
pub const MAX_CALL_FILES: usize = 256;
/// Largest total of files written by one call: 64 MiB.
pub const MAX_CALL_INPUT: usize = 64 << 20;

/// A file written into the call's fresh environment before the command starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CallFile {
    /// Absolute path inside the environment; parent directories are created.
    pub path: String,
    pub content: String,
    /// How `content` is encoded (default UTF-8 text).
    #[serde(default)]
    pub encoding: OutputEncoding,
    /// Permission bits (default 0644).
    #[serde(default)]
    pub mode: Option<u32>,
}

impl CallFile {
    /// The raw bytes of `content`.
    pub fn bytes(&self) -> Result<Vec<u8>, ApiError> {
        use base64::Engine;
        match self.encoding {
            OutputEncoding::Utf8 => Ok(self.content.clone().into_bytes()),
            OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(&self.content)
                .map_err(|e| ApiError::invalid(format!("file {}: bad base64: {e}", self.path))),
        }
    }
}

/// `POST /v1/functions/call`.
///
/// Exactly one of `argv` and `shell` is given. Calls with the same image, limits and
/// interpreter share one warm pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    #[serde(default)]
    pub image: ImageRef,
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub shell: Option<String>,
    /// Bytes fed to the command's stdin, then closed.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Files written before the command starts.
    #[serde(default)]
    pub files: Vec<CallFile>,
    /// Paths read back after the command ended.
    #[serde(default)]
    pub return_files: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: Option<String>,
    /// Seconds; when exceeded everything the call started is killed.
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Cap per output stream in bytes.
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    /// Cap per returned file in bytes.
    #[serde(default)]
    pub max_file_bytes: Option<u64>,
    /// Encoding of stdout, stderr and returned files.
    #[serde(default)]
    pub encoding: OutputEncoding,
    /// Limits of the warm containers (defaults of the node when absent).
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub disk_mb: Option<u64>,
    #[serde(default)]
    pub pids: Option<u64>,
    /// A Python interpreter (e.g. `python3`) kept started in each warm environment; calls
    /// `python3 -c CODE ...` or `python3 SCRIPT ...` are handed to it.
    #[serde(default)]
    pub interpreter: Option<String>,
    /// Modules the warm interpreter imports ahead of the call.
    #[serde(default)]
    pub preload: Vec<String>,
}

impl CallRequest {
    /// A call of `argv` in the default image.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        CallRequest {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    /// The argv to execute.
    pub fn command(&self) -> Vec<String> {
        match (&self.argv, &self.shell) {
            (Some(a), _) => a.clone(),
            (None, Some(s)) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
            (None, None) => Vec::new(),
        }
    }

    pub fn output_cap(&self) -> u64 {
        self.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_CAP)
    }

    pub fn file_cap(&self) -> u64 {
        self.max_file_bytes
            .unwrap_or(DEFAULT_RETURN_CAP)
            .min(MAX_RETURN_CAP)
    }

    /// Checks everything but the limits (see [`crate::CreateSandboxRequest::validate`]).
    pub fn validate(&self) -> Result<(), ApiError> {
        let exec = crate::ExecRequest {
            argv: self.argv.clone(),
            shell: self.shell.clone(),
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            stdin: self.stdin.clone(),
            timeout_secs: self.timeout_secs,
            max_output_bytes: self.max_output_bytes,
            user: self.user.clone(),
            ..Default::default()
        };
        exec.validate()?;
        if self.max_output_bytes.is_some_and(|m| m > MAX_OUTPUT_CAP) {
            return Err(ApiError::invalid("max_output_bytes too large"));
        }
        if self.max_file_bytes.is_some_and(|m| m > MAX_RETURN_CAP) {
            return Err(ApiError::invalid(format!(
                "max_file_bytes must be at most {MAX_RETURN_CAP}"
            )));
        }
        if self.files.len() > MAX_CALL_FILES || self.return_files.len() > MAX_CALL_FILES {
            return Err(ApiError::invalid(format!(
                "at most {MAX_CALL_FILES} files in and {MAX_CALL_FILES} out"
            )));
        }
        let mut total = 0usize;
        for f in &self.files {
            validate::sandbox_path(&f.path)?;
            if f.mode.is_some_and(|m| m > 0o7777) {
                return Err(ApiError::invalid(format!("file {}: bad mode", f.path)));
            }
            total += f.bytes()?.len();
        }
        if total > MAX_CALL_INPUT {
            return Err(ApiError::invalid("files larger than 64 MiB in total"));
        }
        for p in &self.return_files {
            validate::sandbox_path(p)?;
        }
        if self
            .stdin
            .as_ref()
            .is_some_and(|s| s.len() > MAX_INLINE_STDIN)
        {
            return Err(ApiError::invalid("stdin larger than 16 MiB"));
        }
        if let Some(i) = &self.interpreter {
            if i.is_empty() || i.len() > 256 || i.contains('\0') {
                return Err(ApiError::invalid("bad interpreter"));
            }
        }
        if self.preload.len() > 64
            || self.preload.iter().any(|m| {
                m.is_empty()
                    || m.len() > 128
                    || !m
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
            })
        {
            return Err(ApiError::invalid(
                "preload takes at most 64 module names of [A-Za-z0-9_.]",
            ));
        }
        if !self.preload.is_empty() && self.interpreter.is_none() {
            return Err(ApiError::invalid("preload needs an interpreter"));
        }
        Ok(())
    }
}

/// A file read back after a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CallFileResult {
    pub path: String,
    /// Contents in the call's `encoding` (empty when missing).
    pub content: String,
    pub encoding: OutputEncoding,
    /// Full size of the file.
    pub size: u64,
    pub truncated: bool,
    /// Why it could not be read (`not found`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The outcome of a call; the output fields mirror [`crate::ExecResult`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CallResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub encoding: OutputEncoding,
    /// Files asked for in `return_files`, in that order.
    pub files: Vec<CallFileResult>,
    /// Time in the node, queueing included.
    pub duration_ms: f64,
    /// Time spent waiting for a warm container.
    pub queued_ms: f64,
}

impl CallResult {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// One warm pool (`GET /v1/functions/pools`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PoolStats {
    /// Image refs, lowest first.
    pub image: Vec<String>,
    /// The tenant whose calls the pool serves (pools are never shared between tenants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub pids: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preload: Vec<String>,
    /// Warm containers waiting for a call.
    pub idle: u64,
    /// Warm containers running a call.
    pub busy: u64,
    /// Containers being started.
    pub starting: u64,
    /// Calls waiting for a container.
    pub queued: u64,
    pub calls: u64,
    /// Calls refused with `busy`.
    pub rejected: u64,
    /// Containers replaced after their agent died.
    pub replaced: u64,
}

/// `GET /v1/functions/pools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PoolsInfo {
    pub pools: Vec<PoolStats>,
    /// Memory reserved by warm containers (their limits), and the node's cap on it.
    pub warm_memory_mb: u64,
    pub max_warm_memory_mb: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_validation() {
        CallRequest::argv(["true"]).validate().unwrap();
        assert!(CallRequest::default().validate().is_err());
        let mut r = CallRequest::argv(["true"]);
        r.files.push(CallFile {
            path: "rel".into(),
            content: "x".into(),
            ..Default::default()
        });
        assert!(r.validate().is_err());
        let mut r = CallRequest::argv(["true"]);
        r.preload = vec!["os; import evil".into()];
        r.interpreter = Some("python3".into());
        assert!(r.validate().is_err());
        let mut r = CallRequest::argv(["true"]);
        r.files.push(CallFile {
            path: "/a".into(),
            content: "!!".into(),
            encoding: OutputEncoding::Base64,
            mode: None,
        });
        assert!(r.validate().is_err());
        assert!(serde_json::from_str::<CallRequest>(r#"{"argv":["x"],"nope":1}"#).is_err());
        let r: CallRequest =
            serde_json::from_str(r#"{"image":["a","b"],"shell":"echo hi"}"#).unwrap();
        assert_eq!(r.command(), ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(r.image.refs(), ["a", "b"]);
    }
}
