//! Trajectory entries: what a node logs for every call that changes a sandbox (exec, spawn,
//! kill, file writes, mkdir, remove, chmod, fork), as `GET /v1/sandboxes/{id}/trajectory`
//! exports them (one JSON object per line).
//!
//! An entry carries the request as it was made (content and stdin by sha256 digest and size,
//! never inline), the digest the node compares when a step is retried, and the result. Output
//! is inline in the export whatever its size; the node stores large output once by digest.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::ApiError;
use crate::exec::{ExecResult, OutputEncoding, ProcessInfo};

/// An exec or spawn request as logged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ExecCall {
    pub argv: Option<Vec<String>>,
    pub shell: Option<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub timeout_secs: Option<f64>,
    pub max_output_bytes: Option<u64>,
    pub encoding: OutputEncoding,
    /// sha256 (hex) of the stdin bytes, when stdin was given.
    pub stdin_sha256: Option<String>,
    pub stdin_bytes: u64,
    /// True when the output was streamed (`/exec/stream`). Not part of the request digest:
    /// a streamed and a one-shot exec of the same command are the same step.
    #[serde(default)]
    pub streamed: bool,
    /// Everything the command started was killed when it ended.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kill_tree: bool,
}

/// What was called: `kind` and `request` of an entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "request", rename_all = "snake_case")]
pub enum TrajectoryCall {
    Exec(ExecCall),
    Spawn(ExecCall),
    Kill {
        pid: u32,
        signal: i32,
    },
    WriteFile {
        path: String,
        mode: Option<u32>,
        /// sha256 (hex) of the content written.
        sha256: String,
        size: u64,
    },
    /// A tar stream unpacked under a directory.
    WriteTar {
        path: String,
        /// sha256 (hex) of the tar stream.
        sha256: String,
        size: u64,
    },
    Mkdir {
        path: String,
        parents: bool,
        mode: Option<u32>,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    /// Logged by a parent: these sandboxes were forked from it here. `n` and `labels` are the
    /// request (absent in entries of older nodes); the request digest leaves `children` out,
    /// so a retried step compares only what was asked.
    Fork {
        children: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        n: Option<u32>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        labels: BTreeMap<String, String>,
    },
    /// The first entry of a forked sandbox: its files are the parent's as of the parent's
    /// entry `parent_seq` (0 when the parent had logged nothing).
    ForkedFrom {
        parent: String,
        parent_seq: u64,
    },
    /// The sandbox was paused: by a call (`by: "call"`) or by its idle timeout (`"idle"`).
    /// Lifecycle entries take no step and are never replayed.
    Pause {
        by: String,
    },
    /// The sandbox was resumed (by a call, or by a call that reached it paused).
    Resume {},
    /// A snapshot was taken of the sandbox (`POST .../snapshot`); sandboxes made from it
    /// start with a `forked_from` entry naming this sandbox and the seq before this entry.
    Snapshot {
        snapshot: String,
    },
    /// Its network policy was replaced (`PUT .../network`).
    Network {
        policy: crate::network::NetworkPolicy,
    },
    /// A terminal (`GET .../pty`, `warren shell`): what was typed into it and what it
    /// printed, as timestamped chunks. A long session is logged in parts (`part` from 0, the
    /// last one with `ended`). No step; never replayed.
    Terminal {
        /// Which terminal of the sandbox (a number given out by the node, from 1).
        session: u64,
        part: u32,
        argv: Vec<String>,
    },
}

impl TrajectoryCall {
    /// The stable name of the kind (`exec`, `write_file`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            TrajectoryCall::Exec(_) => "exec",
            TrajectoryCall::Spawn(_) => "spawn",
            TrajectoryCall::Kill { .. } => "kill",
            TrajectoryCall::WriteFile { .. } => "write_file",
            TrajectoryCall::WriteTar { .. } => "write_tar",
            TrajectoryCall::Mkdir { .. } => "mkdir",
            TrajectoryCall::Remove { .. } => "remove",
            TrajectoryCall::Chmod { .. } => "chmod",
            TrajectoryCall::Fork { .. } => "fork",
            TrajectoryCall::ForkedFrom { .. } => "forked_from",
            TrajectoryCall::Pause { .. } => "pause",
            TrajectoryCall::Resume {} => "resume",
            TrajectoryCall::Snapshot { .. } => "snapshot",
            TrajectoryCall::Network { .. } => "network",
            TrajectoryCall::Terminal { .. } => "terminal",
        }
    }
}

/// The result of an exec as logged: the API result (output in the request's encoding) and the
/// sha256 (hex) of the captured output bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecOutcome {
    #[serde(flatten)]
    pub result: ExecResult,
    pub stdout_sha256: String,
    pub stderr_sha256: String,
    /// True when the output was not kept (the sandbox's trajectory budget or the node's
    /// state limit was reached): `stdout` is empty, its sha256 and `stdout_bytes` stand.
    #[serde(default)]
    pub stdout_omitted: bool,
    #[serde(default)]
    pub stderr_omitted: bool,
}

/// Which way a terminal chunk went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalStream {
    /// Typed into the terminal.
    Input,
    /// Printed by it.
    Output,
}

/// One chunk of a terminal session as exported: `data` is the text when the bytes are
/// UTF-8, else base64 (`encoding` says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TerminalChunk {
    /// Unix time in milliseconds.
    pub at_ms: u64,
    pub stream: TerminalStream,
    pub data: String,
    pub encoding: OutputEncoding,
    pub len: u64,
    pub sha256: String,
    /// True when the bytes were not kept (over the trajectory budget): `data` is empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
}

/// The result of a `terminal` entry: its chunks, and how the terminal ended (in the last
/// part).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TerminalOutcome {
    pub chunks: Vec<TerminalChunk>,
    /// True in the session's last part.
    pub ended: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

/// The result part of an entry (exec and spawn have one; the other kinds only succeed or fail).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TrajectoryResult {
    Exec(ExecOutcome),
    Process(ProcessInfo),
    Terminal(TerminalOutcome),
}

/// `POST /v1/sandboxes/{id}/revive` options (query parameters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReviveOptions {
    /// Stop at the first divergence (the new sandbox stays, with the steps replayed so far).
    /// By default every step is replayed and divergences are counted.
    pub stop_on_divergence: bool,
}

/// How one replayed call ended, as revive compares it: success or the error code, the exit
/// code or signal of a command, and the sha256 of its stdout and stderr.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ReplayOutcome {
    /// `None` when the call succeeded; else the error code it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_sha256: Option<String>,
    /// Why the call could not be run again (its input was not kept), when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_replayable: Option<String>,
}

/// A replayed call whose outcome differs from the logged one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The step of the logged call (`None` when it named none).
    pub step: Option<u64>,
    /// Its position in the old sandbox's log.
    pub seq: u64,
    pub kind: String,
    pub expected: ReplayOutcome,
    pub got: ReplayOutcome,
}

/// The answer of `POST /v1/sandboxes/{id}/revive`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReviveReport {
    /// The new sandbox, running.
    pub sandbox: crate::sandbox::SandboxInfo,
    /// The sandbox whose log was replayed.
    pub revived_from: String,
    /// Logged calls run again in the new sandbox.
    pub replayed: u64,
    /// Of them, calls that named a step.
    pub steps_replayed: u64,
    /// Entries not run again: lifecycle records, terminals, cancelled calls (and fork
    /// records, which are copied, not forked again).
    pub skipped: u64,
    /// The highest step of the new sandbox's log: the next step a trainer names must be
    /// above it.
    pub last_step: Option<u64>,
    /// How many replayed calls diverged.
    pub divergences: u64,
    pub first_divergence: Option<Divergence>,
    /// True when the replay stopped at the first divergence (`stop_on_divergence`).
    pub stopped: bool,
    /// Wall time of the revive (create and replay), in milliseconds.
    pub duration_ms: f64,
    /// The sum of the recorded durations of the replayed calls, in milliseconds.
    pub recorded_ms: f64,
}

/// Entries as newline-delimited JSON, one a line: the body of a trajectory export, whether a
/// node reads its own log or a trajectory store.
pub fn ndjson_lines(entries: &[TrajectoryEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        // Entries are plain data; encoding them cannot fail.
        if serde_json::to_writer(&mut out, e).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// One line of a trajectory export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryEntry {
    /// Position in the sandbox's log, from 1, in the order calls finished.
    pub seq: u64,
    /// The caller's step index, when the call named one.
    pub step: Option<u64>,
    #[serde(flatten)]
    pub call: TrajectoryCall,
    /// sha256 (hex) of the canonical request; a retried step must match it.
    pub request_sha256: String,
    /// Unix time in milliseconds.
    pub started_at_ms: u64,
    pub ended_at_ms: u64,
    pub duration_ms: f64,
    pub result: Option<TrajectoryResult>,
    /// Set when the call failed after it reached the sandbox.
    pub error: Option<ApiError>,
    /// True when the caller went away before the call finished and it was stopped.
    #[serde(default)]
    pub cancelled: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_with_kind_and_request() {
        let e = TrajectoryEntry {
            seq: 2,
            step: Some(7),
            call: TrajectoryCall::WriteFile {
                path: "/a".into(),
                mode: None,
                sha256: "00".into(),
                size: 1,
            },
            request_sha256: "ab".into(),
            started_at_ms: 1,
            ended_at_ms: 2,
            duration_ms: 1.0,
            result: None,
            error: None,
            cancelled: false,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["kind"], "write_file");
        assert_eq!(v["request"]["path"], "/a");
        let back: TrajectoryEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back, e);

        let exec = TrajectoryEntry {
            call: TrajectoryCall::Exec(ExecCall::default()),
            result: Some(TrajectoryResult::Exec(ExecOutcome {
                result: ExecResult {
                    exit_code: Some(0),
                    stdout: "hi".into(),
                    ..Default::default()
                },
                stdout_sha256: "x".into(),
                stderr_sha256: "y".into(),
                stdout_omitted: false,
                stderr_omitted: false,
            })),
            ..e
        };
        let v = serde_json::to_value(&exec).unwrap();
        assert_eq!(v["result"]["stdout"], "hi");
        let back: TrajectoryEntry = serde_json::from_value(v).unwrap();
        assert_eq!(back, exec);
    }
}
