//! The trajectory log: every call that changes a sandbox (exec, spawn, kill, file writes,
//! mkdir, remove, chmod, fork), in the order the calls finished, durable before the call
//! answers.
//!
//! - [`journal`] owns the redb tables (entries, the step index, output blob references) and
//!   the one writer thread that commits appends in groups (one fsync for every append waiting);
//! - [`blobs`] owns the output blob files beside the state file;
//! - [`steps`] owns a sandbox's in-memory side: the next sequence number and which steps are
//!   running now, so a step is run at most once however many times it is asked for;
//! - [`kinds`] owns what each kind of call (exec, spawn, calls that only change files or
//!   processes) stores in its entry and answers from it;
//! - this file owns the stored entry format and the request digest.
//!
//! Output larger than [`INLINE_MAX`] is stored once by sha256 as a blob file and counted by
//! reference; smaller output is inline in the entry. Once a sandbox's log holds its budget
//! (`Limits::trajectory_mb`), or the node's state file its limit, output is kept as sha256 and
//! size only and the entry says so (`omitted`): what a sandbox prints cannot grow the node's
//! disk beyond the budget. A sandbox's trajectory is deleted with the sandbox (in the same
//! transaction): export it before deleting.
//!
//! This module never runs anything in a sandbox and never decides whether a call may run;
//! the manager's step runner does, with [`steps::Claim`].

pub mod blobs;
mod codec;
pub mod journal;
pub mod kinds;
pub mod logs;
pub mod source;
pub mod steps;
pub mod store_source;
pub mod terminal;
#[cfg(test)]
mod tests_recover;

use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use warren_types::{
    ApiError, ExecOutcome, ExecResult, ExitInfo, OutputEncoding, ProcessInfo, TrajectoryCall,
    TrajectoryEntry, TrajectoryResult,
};

use crate::clock::now_ms;

pub use codec::DecodeError;
pub use journal::Journal;
pub use kinds::{CallKind, Effect, Exec, Forked, Spawn};
pub use source::{LogPage, LogSource};
pub use steps::{Claim, Finished, SandboxLog, StepGuard};
pub use store_source::StoreLogSource;
pub use terminal::StoredTerminal;

/// Format version of stored entries.
pub const FORMAT: u32 = 1;

/// Output up to this many bytes is kept inline in its entry; larger output goes to the blob
/// table, once per distinct content.
pub const INLINE_MAX: usize = 4096;

/// A sha256.
pub type Digest = [u8; 32];

pub fn sha256(bytes: &[u8]) -> Digest {
    Sha256::digest(bytes).into()
}

pub fn hex(d: &Digest) -> String {
    hex::encode(d)
}

/// The digest a retried step is compared by: the canonical JSON of the call. For execs the
/// `streamed` flag is left out (a streamed and a one-shot run of a command are one step), for
/// forks the children (known only once the fork ran).
pub fn request_digest(call: &TrajectoryCall) -> Digest {
    let canonical = match call {
        TrajectoryCall::Exec(e) if e.streamed => {
            let mut e = e.clone();
            e.streamed = false;
            serde_json::to_vec(&TrajectoryCall::Exec(e))
        }
        TrajectoryCall::Fork { n, labels, .. } => serde_json::to_vec(&TrajectoryCall::Fork {
            children: Vec::new(),
            n: *n,
            labels: labels.clone(),
        }),
        other => serde_json::to_vec(other),
    };
    // Serializing these types cannot fail (string keys, no maps with other keys).
    sha256(&canonical.unwrap_or_default())
}

/// A logged entry with the blobs it refers to: what a step's record is read back from, and
/// what a running step hands to the calls that waited for it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub entry: StoredEntry,
    pub blobs: Blobs,
}

/// Captured output as stored: its digest and size, and the bytes themselves (base64) when
/// small enough to be inline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredOutput {
    pub sha256: String,
    pub len: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
    /// Not kept (over the budget): only the digest and the size are stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omitted: bool,
}

/// A blob to store with an entry: digest (hex) and bytes.
pub type Blob = (String, Bytes);

/// Blobs read back: digest (hex) → bytes.
pub type Blobs = HashMap<String, Bytes>;

impl StoredOutput {
    /// Stores `bytes` inline, or returns the blob to write.
    pub fn new(bytes: &[u8], blobs: &mut Vec<Blob>) -> StoredOutput {
        let digest = hex(&sha256(bytes));
        let inline = if bytes.len() <= INLINE_MAX {
            Some(base64::engine::general_purpose::STANDARD.encode(bytes))
        } else {
            if !blobs.iter().any(|(d, _)| *d == digest) {
                blobs.push((digest.clone(), Bytes::copy_from_slice(bytes)));
            }
            None
        };
        StoredOutput {
            sha256: digest,
            len: bytes.len() as u64,
            inline,
            omitted: false,
        }
    }

    /// Keeps `bytes` (as [`StoredOutput::new`]) when `keep`, else only their digest and size.
    pub fn kept_if(keep: bool, bytes: &[u8], blobs: &mut Vec<Blob>) -> StoredOutput {
        if keep {
            return StoredOutput::new(bytes, blobs);
        }
        StoredOutput {
            sha256: hex(&sha256(bytes)),
            len: bytes.len() as u64,
            inline: None,
            omitted: true,
        }
    }

    /// True when the bytes are in the blob table.
    pub fn in_blob(&self) -> bool {
        self.inline.is_none() && !self.omitted
    }

    /// The bytes, from the entry or from `blobs` (digest → bytes, read by the caller).
    pub fn bytes(&self, blobs: &Blobs) -> Bytes {
        match &self.inline {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map(Bytes::from)
                .unwrap_or_default(),
            None => blobs.get(&self.sha256).cloned().unwrap_or_default(),
        }
    }
}

/// How much output a sandbox's log may still keep: the rest of its budget, nothing once the
/// node's state file is full.
#[derive(Debug, Clone, Copy)]
pub struct Room {
    left: u64,
    state_full: bool,
}

impl Room {
    /// `left` bytes of room; none at all when `state_full`.
    pub fn new(left: u64, state_full: bool) -> Room {
        Room { left, state_full }
    }

    /// Room for everything.
    pub fn unlimited() -> Room {
        Room::new(u64::MAX, false)
    }

    /// True (and the room shrinks) when `n` bytes fit.
    pub fn keep(&mut self, n: usize) -> bool {
        let fits = !self.state_full && n as u64 <= self.left;
        if fits {
            self.left -= n as u64;
        }
        fits
    }
}

/// An exec's result as stored: how it ended and its output (raw, encoded again on the way
/// out).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredExec {
    #[serde(flatten)]
    pub exit: ExitInfo,
    pub stdout: StoredOutput,
    pub stderr: StoredOutput,
    /// Entries written before the exit was stored whole carry its duration here.
    #[serde(default, skip_serializing)]
    pub duration_ms: Option<f64>,
}

impl StoredExec {
    /// The result of `exit` with this output, its bytes stored inline or as `blobs` while
    /// `room` has room for them, else as sha256 and size only.
    pub fn new(
        exit: ExitInfo,
        stdout: &[u8],
        stderr: &[u8],
        room: &mut Room,
        blobs: &mut Vec<Blob>,
    ) -> Self {
        let (keep_out, keep_err) = (room.keep(stdout.len()), room.keep(stderr.len()));
        StoredExec {
            exit,
            stdout: StoredOutput::kept_if(keep_out, stdout, blobs),
            stderr: StoredOutput::kept_if(keep_err, stderr, blobs),
            duration_ms: None,
        }
    }

    /// The exec result as the API shows it (a replayed step: in the request's encoding).
    pub fn result(&self, encoding: OutputEncoding, blobs: &Blobs) -> ExecResult {
        self.result_of(
            &self.stdout.bytes(blobs),
            &self.stderr.bytes(blobs),
            encoding,
        )
    }

    /// The exec result as the export shows it: as text when both outputs are UTF-8, as
    /// base64 only when one is not (so binary output keeps its bytes), whatever encoding the
    /// request asked for its answer.
    pub fn exported(&self, blobs: &Blobs) -> ExecResult {
        let (out, err) = (self.stdout.bytes(blobs), self.stderr.bytes(blobs));
        let encoding = if std::str::from_utf8(&out).is_ok() && std::str::from_utf8(&err).is_ok() {
            OutputEncoding::Utf8
        } else {
            OutputEncoding::Base64
        };
        self.result_of(&out, &err, encoding)
    }

    fn result_of(&self, out: &[u8], err: &[u8], encoding: OutputEncoding) -> ExecResult {
        let mut exit = self.exit;
        if let Some(ms) = self.duration_ms {
            exit.duration_us = (ms * 1000.0).round() as u64;
        }
        ExecResult::new(&exit, out, err, encoding)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredResult {
    Exec(StoredExec),
    Process(ProcessInfo),
    Terminal(StoredTerminal),
}

impl StoredResult {
    /// The outputs it holds (an exec's stdout and stderr, a terminal's chunks).
    fn outputs(&self) -> Vec<&StoredOutput> {
        match self {
            StoredResult::Exec(e) => vec![&e.stdout, &e.stderr],
            StoredResult::Process(_) => Vec::new(),
            StoredResult::Terminal(t) => t.chunks.iter().map(|c| &c.data).collect(),
        }
    }
}

/// One entry as stored under `(sandbox id, seq)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEntry {
    pub format: u32,
    pub seq: u64,
    pub step: Option<u64>,
    #[serde(flatten)]
    pub call: TrajectoryCall,
    /// Left out of the stored bytes when it is the digest of `call` (recomputed on read).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_sha256: String,
    pub started_at_ms: u64,
    pub ended_at_ms: u64,
    pub duration_ms: f64,
    pub result: Option<StoredResult>,
    pub error: Option<ApiError>,
    #[serde(default)]
    pub cancelled: bool,
    /// What the call was fed (an upload's content, an exec's stdin), kept under the same
    /// budget as output, so that revive can run it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<StoredOutput>,
}

impl StoredEntry {
    /// A new entry (its `seq` is set when it is appended).
    pub fn new(call: TrajectoryCall, step: Option<u64>, started_at_ms: u64) -> StoredEntry {
        let ended = now_ms();
        StoredEntry {
            format: FORMAT,
            seq: 0,
            step,
            request_sha256: hex(&request_digest(&call)),
            call,
            started_at_ms,
            ended_at_ms: ended,
            duration_ms: ended.saturating_sub(started_at_ms) as f64,
            result: None,
            error: None,
            cancelled: false,
            input: None,
        }
    }

    /// Every output and input it holds.
    fn outputs(&self) -> Vec<&StoredOutput> {
        let mut all = self.result.as_ref().map_or(Vec::new(), |r| r.outputs());
        all.extend(self.input.as_ref());
        all
    }

    /// Bytes this entry adds to its sandbox's budget: its encoding plus its output in blobs.
    pub fn budget_bytes(&self, encoded_len: usize) -> u64 {
        let blobs: u64 = self
            .outputs()
            .into_iter()
            .filter(|o| o.in_blob())
            .map(|o| o.len)
            .sum();
        encoded_len as u64 + blobs
    }

    /// Digests of the blobs this entry refers to.
    pub fn blob_refs(&self) -> Vec<&str> {
        self.blob_refs_under(u64::MAX)
    }

    /// The digest of what this entry was fed when it is kept as a blob (what revive reads;
    /// outputs it compares by digest only).
    pub fn input_ref(&self) -> Option<&str> {
        self.input
            .as_ref()
            .filter(|i| i.in_blob())
            .map(|i| i.sha256.as_str())
    }

    /// Digests of the blobs this entry refers to that are shorter than `max_len` bytes.
    pub fn blob_refs_under(&self, max_len: u64) -> Vec<&str> {
        let mut refs: Vec<&str> = self
            .outputs()
            .into_iter()
            .filter(|o| o.in_blob() && o.len < max_len)
            .map(|o| o.sha256.as_str())
            .collect();
        // One reference per distinct blob of the entry (a file written twice with the same
        // content is one blob).
        refs.sort_unstable();
        refs.dedup();
        refs
    }

    /// How the call asked for its output.
    pub fn encoding(&self) -> OutputEncoding {
        match &self.call {
            TrajectoryCall::Exec(e) | TrajectoryCall::Spawn(e) => e.encoding,
            _ => OutputEncoding::Utf8,
        }
    }

    /// The entry as exported.
    pub fn export(&self, blobs: &Blobs) -> TrajectoryEntry {
        let result = self.result.as_ref().map(|r| match r {
            StoredResult::Exec(e) => TrajectoryResult::Exec(ExecOutcome {
                result: e.exported(blobs),
                stdout_sha256: e.stdout.sha256.clone(),
                stderr_sha256: e.stderr.sha256.clone(),
                stdout_omitted: e.stdout.omitted,
                stderr_omitted: e.stderr.omitted,
            }),
            StoredResult::Process(p) => TrajectoryResult::Process(p.clone()),
            StoredResult::Terminal(t) => TrajectoryResult::Terminal(t.exported(blobs)),
        });
        TrajectoryEntry {
            seq: self.seq,
            step: self.step,
            call: self.call.clone(),
            request_sha256: self.request_sha256.clone(),
            started_at_ms: self.started_at_ms,
            ended_at_ms: self.ended_at_ms,
            duration_ms: self.duration_ms,
            result,
            error: self.error.clone(),
            cancelled: self.cancelled,
        }
    }
}

impl StoredEntry {
    /// The entry as a shipped segment holds it: as exported, but an output kept as a blob is
    /// left out and named by its sha256 (it is uploaded beside the segment), and the stored
    /// entry itself beside (what revive reads back, see [`store_source`]).
    pub fn shipped(&self) -> warren_blob::trajectory::SegmentLine {
        let (out, err) = match &self.result {
            Some(StoredResult::Exec(e)) => (
                e.stdout.in_blob().then(|| e.stdout.sha256.clone()),
                e.stderr.in_blob().then(|| e.stderr.sha256.clone()),
            ),
            _ => (None, None),
        };
        warren_blob::trajectory::SegmentLine {
            entry: self.export(&Blobs::new()),
            stdout_blob: out,
            stderr_blob: err,
            stored: serde_json::to_value(self).ok(),
        }
    }
}

/// An exec of a capped `yes` flood past its budget (output kept as digest and size only), as
/// a hostile sandbox logs them: what tests of the stored size measure.
#[cfg(test)]
pub(crate) fn flood_entry(i: u64) -> StoredEntry {
    let call = TrajectoryCall::Exec(warren_types::ExecCall {
        shell: Some(format!("echo {i}; yes | head -c 4194304")),
        max_output_bytes: Some(1 << 20),
        ..Default::default()
    });
    let mut e = StoredEntry::new(call, None, now_ms());
    let out = format!("{i}\n").repeat(1000);
    e.result = Some(StoredResult::Exec(StoredExec::new(
        ExitInfo {
            exit_code: Some(0),
            stdout_bytes: 4 << 20,
            stdout_truncated: true,
            ..Default::default()
        },
        out.as_bytes(),
        b"",
        &mut Room::new(0, false),
        &mut Vec::new(),
    )));
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::ExecCall;

    #[test]
    fn digests_ignore_streaming_but_not_the_command() {
        let a = ExecCall {
            argv: Some(vec!["echo".into(), "hi".into()]),
            ..Default::default()
        };
        let streamed = ExecCall {
            streamed: true,
            ..a.clone()
        };
        let other = ExecCall {
            argv: Some(vec!["echo".into(), "ho".into()]),
            ..Default::default()
        };
        let d = |c: &ExecCall| request_digest(&TrajectoryCall::Exec(c.clone()));
        assert_eq!(d(&a), d(&streamed));
        assert_ne!(d(&a), d(&other));
        assert_ne!(
            d(&a),
            request_digest(&TrajectoryCall::Spawn(a.clone())),
            "the kind is part of the request"
        );
    }

    #[test]
    fn large_output_goes_to_one_blob() {
        let mut blobs = Vec::new();
        let small = StoredOutput::new(b"hi", &mut blobs);
        assert!(small.inline.is_some() && blobs.is_empty());
        let gone = StoredOutput::kept_if(false, b"hi", &mut blobs);
        assert!(gone.omitted && gone.inline.is_none() && blobs.is_empty());
        assert_eq!((gone.len, gone.sha256.clone()), (2, small.sha256.clone()));
        assert!(gone.bytes(&HashMap::new()).is_empty());
        let big = vec![7u8; INLINE_MAX + 1];
        let a = StoredOutput::new(&big, &mut blobs);
        let b = StoredOutput::new(&big, &mut blobs);
        assert_eq!(blobs.len(), 1);
        assert_eq!(a, b);
        assert!(a.inline.is_none());
        let map: Blobs = blobs.into_iter().collect();
        assert_eq!(a.bytes(&map), big);
        assert_eq!(small.bytes(&map), &b"hi"[..]);
    }
}
