//! The daemon's side of the agent protocol: one multiplexed connection per sandbox.
//!
//! Transport-agnostic: anything that is a connected unix stream (a socketpair for containers,
//! a chardev socket of a VMM for VMs). Each call opens a stream; the reader task routes the
//! agent's frames to the stream's channel. Output-heavy streams run with a credit window that
//! is only topped up as the consumer takes data, so a slow HTTP client or a `yes` flood never
//! grows the daemon's memory beyond the window.
//!
//! The files mirror the agent's own: `connection` (the socket, its reader and writer tasks,
//! calls answered by one event), `streams` (one call's frames, credit, stdin and the one
//! output collector), `exec` (commands, function calls, processes, held steps, ports),
//! `pty` (terminals) and `files` (file transfer and file-system calls). This module owns the
//! client side only: it never decides policy (limits, retries) — callers above do.

mod connection;
mod exec;
mod files;
mod pty;
mod streams;

use bytes::Bytes;
use warren_proto::{Event, Frame};
use warren_types::ErrorCode;

use crate::RuntimeError;

pub use connection::AgentConn;
pub use files::{FileReader, FileWriter};
pub use pty::{PtyInput, PtyOutput, PtySession};
pub use streams::{ExecStream, StdinSink};
pub use warren_types::ExitInfo;

/// Output window of streamed calls.
const WINDOW: u32 = 512 * 1024;

/// A finished command with its captured output.
#[derive(Debug, Clone, Default)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: ExitInfo,
}

/// A file read back after a function call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CollectedFile {
    pub path: String,
    pub data: Vec<u8>,
    /// Its full size (more than `data` when truncated).
    pub size: u64,
    pub truncated: bool,
    /// Why it could not be read (`not found`, ...).
    pub error: Option<String>,
}

/// A finished function call.
#[derive(Debug, Clone, Default)]
pub struct InvokeOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: ExitInfo,
    pub files: Vec<CollectedFile>,
    /// How long the call waited in the container for its call environment.
    pub cell_wait_us: u64,
}

/// One item of a streamed command or terminal.
#[derive(Debug, Clone)]
pub enum StreamItem {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitInfo),
}

fn from_event_error(code: ErrorCode, message: String) -> RuntimeError {
    RuntimeError::Agent { code, message }
}

/// An event the call does not expect at this point.
fn unexpected(ev: &Event) -> RuntimeError {
    RuntimeError::Protocol(crate::ProtocolError::Unexpected {
        event: format!("{ev:?}"),
    })
}

fn parse_event(f: &Frame) -> Result<Event, RuntimeError> {
    f.parse::<Event>()
        .map_err(|e| RuntimeError::Protocol(e.into()))
}

fn exit_info(ev: &Event) -> Option<ExitInfo> {
    match ev {
        Event::Exited(exit) => Some(*exit),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
