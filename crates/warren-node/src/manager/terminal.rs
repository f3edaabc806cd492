//! Terminals, a part of its own above the manager ([`Terminals`]): opening one in a sandbox,
//! and its record: what is typed into it and what it prints, logged in the sandbox's
//! trajectory as `terminal` entries (no step; never replayed).
//!
//! The terminal's bridge hands each chunk to a [`TerminalLog`] as it passes (it never
//! waits for the log); one task per terminal gathers them and appends a part of the session
//! when it holds [`PART_BYTES`] or [`PART_CHUNKS`], when it has held chunks for
//! [`PART_SECS`], and when the terminal ends (that part says `ended`, with the exit). Chunks
//! of one direction that follow each other within [`MERGE_MS`] are one chunk. The bytes are
//! kept under the sandbox's trajectory budget like exec output; past it, digests and sizes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use warren_types::{ApiError, ExecRequest, SandboxId, TerminalStream, TrajectoryCall};

use super::exec::{exec_spec, PtyRequest, TerminalSession};
use super::{now_ms, Manager, Sandbox};
use crate::error::NodeError;
use crate::trajectory::{Room, StoredEntry, StoredResult, StoredTerminal};

/// A part is appended once its chunks hold this many bytes...
const PART_BYTES: usize = 64 << 10;
/// ...or this many chunks...
const PART_CHUNKS: usize = 512;
/// ...or once it has held chunks this long.
const PART_SECS: u64 = 5;
/// Chunks of one direction this close together are merged (up to [`MERGE_MAX`] bytes).
const MERGE_MS: u64 = 20;
const MERGE_MAX: usize = 4096;

enum Piece {
    Chunk(u64, TerminalStream, bytes::Bytes),
    End {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

/// Where a terminal's bridge reports what passes through it. Dropping it ends the session's
/// record.
#[derive(Debug)]
pub struct TerminalLog {
    tx: mpsc::UnboundedSender<Piece>,
}

impl TerminalLog {
    /// Bytes typed into the terminal.
    pub fn input(&self, b: &bytes::Bytes) {
        let _ = self
            .tx
            .send(Piece::Chunk(now_ms(), TerminalStream::Input, b.clone()));
    }

    /// Bytes the terminal printed.
    pub fn output(&self, b: &bytes::Bytes) {
        let _ = self
            .tx
            .send(Piece::Chunk(now_ms(), TerminalStream::Output, b.clone()));
    }

    /// How the terminal's command ended.
    pub fn exit(&self, exit_code: Option<i32>, signal: Option<i32>) {
        let _ = self.tx.send(Piece::End { exit_code, signal });
    }
}

/// A session's record on its way into the log.
struct Recorder {
    manager: Manager,
    sandbox: Arc<Sandbox>,
    session: u64,
    argv: Vec<String>,
    part: u32,
    chunks: Vec<(u64, TerminalStream, Vec<u8>)>,
    bytes: usize,
    started_ms: u64,
}

impl Recorder {
    fn add(&mut self, at: u64, stream: TerminalStream, b: &[u8]) {
        if self.chunks.is_empty() {
            self.started_ms = at;
        }
        self.bytes += b.len();
        if let Some(last) = self.chunks.last_mut() {
            if last.1 == stream && at.saturating_sub(last.0) <= MERGE_MS && last.2.len() < MERGE_MAX
            {
                last.2.extend_from_slice(b);
                return;
            }
        }
        self.chunks.push((at, stream, b.to_vec()));
    }

    fn full(&self) -> bool {
        self.bytes >= PART_BYTES || self.chunks.len() >= PART_CHUNKS
    }

    /// Appends the chunks held as one part.
    async fn flush(&mut self, end: Option<(Option<i32>, Option<i32>)>) {
        let m = &self.manager;
        let call = TrajectoryCall::Terminal {
            session: self.session,
            part: self.part,
            argv: self.argv.clone(),
        };
        let mut entry = StoredEntry::new(call, None, self.started_ms);
        let budget = self.sandbox.lock().info.limits.trajectory_mb << 20;
        let state_full = m.journal().state_bytes() >= m.config().state_max_bytes;
        let mut room = Room::new(
            budget.saturating_sub(self.sandbox.log.stored_bytes()),
            state_full,
        );
        let mut blobs = Vec::new();
        let mut part = StoredTerminal::new(&self.chunks, &mut room, &mut blobs);
        if let Some((exit_code, signal)) = end {
            part.ended = true;
            part.exit_code = exit_code;
            part.signal = signal;
        }
        entry.result = Some(StoredResult::Terminal(part));
        self.chunks.clear();
        self.bytes = 0;
        self.part += 1;
        self.started_ms = now_ms();
        match self
            .sandbox
            .log
            .append(m.journal(), entry, None, blobs)
            .await
        {
            Ok(_) => {
                crate::metrics::Metrics::inc(&m.inner.parts.telemetry.metrics().trajectory_appends)
            }
            Err(e) => {
                tracing::warn!(sandbox = %self.sandbox.id, error = %e, "cannot log a terminal")
            }
        }
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Piece>) {
        let mut exit = None;
        loop {
            let wait = if self.chunks.is_empty() {
                Duration::from_secs(3600)
            } else {
                Duration::from_millis((self.started_ms + PART_SECS * 1000).saturating_sub(now_ms()))
            };
            match tokio::time::timeout(wait, rx.recv()).await {
                Ok(Some(Piece::Chunk(at, stream, b))) => {
                    self.add(at, stream, &b);
                    if self.full() {
                        self.flush(None).await;
                    }
                }
                Ok(Some(Piece::End { exit_code, signal })) => exit = Some((exit_code, signal)),
                Ok(None) => break,
                Err(_) => {
                    if !self.chunks.is_empty() {
                        self.flush(None).await;
                    }
                }
            }
        }
        self.flush(Some(exit.unwrap_or((None, None)))).await;
    }
}

/// Owns the node's terminal sessions: opens them in the sandboxes of the manager it is
/// given, numbers them, and records them. Cheap to clone; every clone is the same.
#[derive(Clone, Debug)]
pub struct Terminals {
    sandboxes: Manager,
    /// The last session number given out.
    sessions: Arc<AtomicU64>,
}

impl Terminals {
    /// Terminals in the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Manager) -> Terminals {
        Terminals {
            sandboxes,
            // Numbers stay unique across restarts of the daemon.
            sessions: Arc::new(AtomicU64::new(now_ms() * 1000)),
        }
    }

    /// `GET /v1/sandboxes/{id}/pty`: starts a terminal.
    pub async fn pty(&self, id: &SandboxId, req: PtyRequest) -> Result<TerminalSession, NodeError> {
        let exec = ExecRequest {
            argv: Some(req.argv),
            cwd: req.cwd,
            env: req.env,
            user: req.user,
            ..Default::default()
        };
        exec.validate()?;
        if req.cols == 0 || req.rows == 0 {
            return Err(ApiError::invalid("cols and rows must be at least 1").into());
        }
        let (instance, info, guard) = self.sandboxes.ready(id).await?;
        let mut spec = exec_spec(&info, &exec)?;
        if !spec.env.iter().any(|(k, _)| k == "TERM") {
            spec.env.push(("TERM".into(), "xterm-256color".into()));
        }
        // A container mounts its devpts with its first terminal (docs/density.md).
        instance
            .prepare_terminal()
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        let argv = spec.argv.clone();
        let session = instance
            .agent()
            .pty(spec, req.cols, req.rows)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        let (input, output) = session.split();
        let log = self.record(guard.sandbox.clone(), argv);
        Ok(TerminalSession {
            input,
            output,
            guard,
            log,
        })
    }

    /// Starts the record of a terminal running `argv` in `sandbox`.
    fn record(&self, sandbox: Arc<Sandbox>, argv: Vec<String>) -> TerminalLog {
        let (tx, rx) = mpsc::unbounded_channel();
        let session = self.sessions.fetch_add(1, Ordering::Relaxed) + 1;
        let rec = Recorder {
            manager: self.sandboxes.clone(),
            sandbox,
            session,
            argv,
            part: 0,
            chunks: Vec::new(),
            bytes: 0,
            started_ms: now_ms(),
        };
        tokio::spawn(rec.run(rx));
        TerminalLog { tx }
    }
}
