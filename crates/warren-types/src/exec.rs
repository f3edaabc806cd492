//! Exec requests and results: one-shot commands, streamed commands and background processes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::ApiError;
use crate::validate;

/// Default cap on each captured output stream (stdout, stderr): 1 MiB.
pub const DEFAULT_OUTPUT_CAP: u64 = 1 << 20;
/// Largest cap a request may ask for: 64 MiB per stream.
pub const MAX_OUTPUT_CAP: u64 = 64 << 20;
/// Largest stdin carried inline in a request: 16 MiB.
pub const MAX_INLINE_STDIN: usize = 16 << 20;

/// How output bytes are carried in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OutputEncoding {
    /// UTF-8, invalid sequences replaced by U+FFFD.
    #[default]
    Utf8,
    /// Standard base64 of the raw bytes.
    Base64,
}

impl OutputEncoding {
    /// `bytes` as this encoding carries them in JSON.
    pub fn encode(self, bytes: &[u8]) -> String {
        use base64::Engine;
        match self {
            OutputEncoding::Utf8 => String::from_utf8_lossy(bytes).into_owned(),
            OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

/// How a command ended: the one record of a process's exit, from the agent's event to the
/// API's [`ExecResult`] and the trajectory's stored result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit status when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the command was killed by a signal.
    pub signal: Option<i32>,
    /// True when the timeout fired and the process tree was killed.
    pub timed_out: bool,
    /// Total bytes the command wrote to each stream, captured or not.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// True when a stream wrote more than its cap (the rest was counted and dropped).
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    #[serde(default)]
    pub duration_us: u64,
    /// Killed by the OOM killer (set by the node, which watches the sandbox's memory group).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

/// `POST /v1/sandboxes/{id}/exec` (and `/exec/stream`, `/processes`).
///
/// Exactly one of `argv` and `shell` is given. `shell` runs through `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Bytes fed to the command's stdin, then closed. Empty when absent.
    #[serde(default)]
    pub stdin: Option<String>,
    /// How `stdin` is written: `utf8` (the text itself, the default) or `base64` (any bytes).
    #[serde(default, skip_serializing_if = "is_utf8")]
    pub stdin_encoding: OutputEncoding,
    /// Seconds; when exceeded the whole process tree is killed. Fractions allowed.
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Cap per output stream in bytes; the rest is counted and dropped (`truncated`).
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub encoding: OutputEncoding,
    /// When the command ends, kill every process it started (background jobs, daemons,
    /// double forks), as a timeout does. Off by default: without it such processes keep
    /// running in the sandbox. Function calls always end everything they started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kill_tree: bool,
    /// The caller's step index in its trajectory. A step already logged with the same
    /// request answers the recorded result without running anything (`replayed`); one logged
    /// with a different request answers `step_conflict`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
}

fn is_utf8(e: &OutputEncoding) -> bool {
    *e == OutputEncoding::Utf8
}

impl ExecRequest {
    /// The stdin bytes, decoded per `stdin_encoding`.
    pub fn stdin_bytes(&self) -> Result<Option<Vec<u8>>, ApiError> {
        use base64::Engine as _;
        match (&self.stdin, self.stdin_encoding) {
            (None, _) => Ok(None),
            (Some(s), OutputEncoding::Utf8) => Ok(Some(s.as_bytes().to_vec())),
            (Some(s), OutputEncoding::Base64) => base64::engine::general_purpose::STANDARD
                .decode(s)
                .map(Some)
                .map_err(|e| ApiError::invalid(format!("stdin is not valid base64: {e}"))),
        }
    }

    /// A request for `argv`.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: Some(argv.into_iter().map(Into::into).collect()),
            ..Default::default()
        }
    }

    /// A request for a shell string run by `/bin/sh -c`.
    pub fn shell(cmd: impl Into<String>) -> Self {
        ExecRequest {
            shell: Some(cmd.into()),
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

    /// The output cap in bytes, after defaults.
    pub fn output_cap(&self) -> u64 {
        self.max_output_bytes.unwrap_or(DEFAULT_OUTPUT_CAP)
    }

    pub fn validate(&self) -> Result<(), ApiError> {
        match (&self.argv, &self.shell) {
            (Some(_), Some(_)) => return Err(ApiError::invalid("give argv or shell, not both")),
            (None, None) => return Err(ApiError::invalid("give argv or shell")),
            (Some(a), None) => {
                if a.is_empty() || a[0].is_empty() {
                    return Err(ApiError::invalid("argv must name a program"));
                }
                if a.len() > 65536 || a.iter().any(|s| s.contains('\0')) {
                    return Err(ApiError::invalid("argv has a NUL byte or too many entries"));
                }
            }
            (None, Some(s)) => {
                if s.contains('\0') {
                    return Err(ApiError::invalid("shell command has a NUL byte"));
                }
            }
        }
        if let Some(c) = &self.cwd {
            validate::sandbox_path(c)?;
        }
        if let Some(s) = self.step {
            validate::index("step", s)?;
        }
        for (k, v) in &self.env {
            validate::env_pair(k, v)?;
        }
        validate::command_size(&self.command(), &self.env, validate::MAX_COMMAND_BYTES)?;
        if let Some(u) = &self.user {
            validate::user(u)?;
        }
        if let Some(t) = self.timeout_secs {
            if !t.is_finite() || t <= 0.0 || t > 7.0 * 24.0 * 3600.0 {
                return Err(ApiError::invalid(
                    "timeout_secs must be > 0 and at most 7 days",
                ));
            }
        }
        if let Some(m) = self.max_output_bytes {
            if m > MAX_OUTPUT_CAP {
                return Err(ApiError::invalid(format!(
                    "max_output_bytes must be at most {MAX_OUTPUT_CAP}"
                )));
            }
        }
        if self
            .stdin_bytes()?
            .is_some_and(|s| s.len() > MAX_INLINE_STDIN)
        {
            return Err(ApiError::invalid(
                "inline stdin is larger than 16 MiB; stream it (/exec/attach) or upload a file",
            ));
        }
        Ok(())
    }
}

/// The outcome of a finished command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ExecResult {
    /// Exit status when the command exited normally.
    pub exit_code: Option<i32>,
    /// Signal number when the command was killed by a signal.
    pub signal: Option<i32>,
    /// True when the timeout fired and the process tree was killed.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Total bytes the command wrote to each stream, captured or not.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub encoding: OutputEncoding,
    pub duration_ms: f64,
    /// True when the command was killed by the OOM killer (`signal` is then 9): the sandbox
    /// ran out of memory (its processes and its writable layer share `memory_mb`).
    #[serde(default)]
    pub oom_killed: bool,
    /// True when this result was recorded by an earlier call of the same step and nothing
    /// ran now.
    #[serde(default)]
    pub replayed: bool,
}

impl ExecResult {
    /// The result of a command that ended as `exit` with this output.
    pub fn new(exit: &ExitInfo, stdout: &[u8], stderr: &[u8], encoding: OutputEncoding) -> Self {
        ExecResult {
            exit_code: exit.exit_code,
            signal: exit.signal,
            timed_out: exit.timed_out,
            stdout: encoding.encode(stdout),
            stderr: encoding.encode(stderr),
            stdout_truncated: exit.stdout_truncated,
            stderr_truncated: exit.stderr_truncated,
            stdout_bytes: exit.stdout_bytes,
            stderr_bytes: exit.stderr_bytes,
            encoding,
            duration_ms: exit.duration_us as f64 / 1000.0,
            oom_killed: exit.oom_killed,
            replayed: false,
        }
    }

    /// `exit_code == Some(0)`.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// One line of a streamed exec (`/exec/stream`, newline-delimited JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    /// Last event: the result with empty `stdout`/`stderr` (they were streamed).
    Exit {
        result: ExecResult,
    },
    /// Last event when the call failed after streaming began.
    Error {
        error: ApiError,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Exited,
}

/// A background process started with `POST /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// The process id inside the sandbox.
    pub pid: u32,
    pub argv: Vec<String>,
    pub state: ProcessState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_validation() {
        ExecRequest::argv(["true"]).validate().unwrap();
        ExecRequest::shell("echo hi").validate().unwrap();
        assert!(ExecRequest::default().validate().is_err());
        let mut both = ExecRequest::argv(["true"]);
        both.shell = Some("x".into());
        assert!(both.validate().is_err());
        let mut r = ExecRequest::argv(["true"]);
        r.timeout_secs = Some(-1.0);
        assert!(r.validate().is_err());
        let mut r = ExecRequest::argv(["true"]);
        r.cwd = Some("/../..".into());
        assert!(r.validate().is_err());
        assert!(serde_json::from_str::<ExecRequest>(r#"{"argv":["x"],"nope":1}"#).is_err());
        assert_eq!(ExecRequest::shell("x").command(), ["/bin/sh", "-c", "x"]);
    }

    #[test]
    fn events_are_tagged() {
        let e = ExecEvent::Stdout { data: "hi".into() };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"stdout","data":"hi"}"#
        );
    }
}

/// The first line of `POST /v1/sandboxes/{id}/pty/attach`: the terminal's command and size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyAttachRequest {
    /// The program and its arguments (default: the sandbox's shell).
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default = "default_rows")]
    pub rows: u16,
}

fn default_cols() -> u16 {
    80
}

fn default_rows() -> u16 {
    24
}

/// A line a client of an attached terminal sends after the request line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum PtyClientLine {
    /// Bytes typed into the terminal, base64.
    Input { data: String },
    /// The window changed.
    Resize { cols: u16, rows: u16 },
}

/// A line of an attached terminal's answer: output (base64) while it runs, then `exit` or
/// `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyServerLine {
    Output {
        data: String,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    Error {
        error: ApiError,
    },
}
