//! The kinds of logged call, each with its own typed answer: what a finished call stores in
//! its entry, and what a retried step answers from that entry.
//!
//! - [`Exec`]: a command run to its end (one-shot or streamed) → [`ExecResult`];
//! - [`Spawn`]: a background process started → [`ProcessInfo`];
//! - [`Effect`]: a call that only changes the sandbox (kill, file writes, mkdir, remove,
//!   chmod) → `()`;
//! - [`Forked`]: a fork → the children's ids (kept in the entry's request).
//!
//! A call's kind is part of its request digest, so a step's record is only ever read back
//! by the kind that wrote it; a record that does not fit its kind is a damaged log.

use warren_runtime::ExecOutput;
use warren_types::{ApiError, ExecResult, ProcessInfo, TrajectoryCall};

use super::{Blob, Blobs, Room, StoredEntry, StoredExec, StoredResult};

/// One kind of logged call.
pub trait CallKind: Send + 'static {
    /// What running the call hands over.
    type Done: Send + 'static;
    /// What the call answers.
    type Answer: Send + 'static;

    /// Stores `done` in `entry` (large output as `blobs`, output beyond `room` as sha256 and
    /// size only) and makes the call's answer.
    fn record(
        done: Self::Done,
        entry: &mut StoredEntry,
        room: &mut Room,
        blobs: &mut Vec<Blob>,
    ) -> Self::Answer;

    /// The answer `entry` (which ended without an error) recorded, marked as replayed.
    fn replay(entry: &StoredEntry, blobs: &Blobs) -> Result<Self::Answer, ApiError>;
}

fn damaged(entry: &StoredEntry, kind: &str) -> ApiError {
    ApiError::internal(format!(
        "trajectory entry {} (step {:?}) holds no {kind} result: the log is damaged",
        entry.seq, entry.step
    ))
}

/// A command run to its end.
#[derive(Debug)]
pub enum Exec {}

impl CallKind for Exec {
    type Done = ExecOutput;
    type Answer = ExecResult;

    fn record(
        out: ExecOutput,
        entry: &mut StoredEntry,
        room: &mut Room,
        blobs: &mut Vec<Blob>,
    ) -> ExecResult {
        entry.result = Some(StoredResult::Exec(StoredExec::new(
            out.exit,
            &out.stdout,
            &out.stderr,
            room,
            blobs,
        )));
        ExecResult::new(&out.exit, &out.stdout, &out.stderr, entry.encoding())
    }

    fn replay(entry: &StoredEntry, blobs: &Blobs) -> Result<ExecResult, ApiError> {
        match &entry.result {
            Some(StoredResult::Exec(e)) => Ok(ExecResult {
                replayed: true,
                ..e.result(entry.encoding(), blobs)
            }),
            _ => Err(damaged(entry, "exec")),
        }
    }
}

/// A background process started.
#[derive(Debug)]
pub enum Spawn {}

impl CallKind for Spawn {
    type Done = ProcessInfo;
    type Answer = ProcessInfo;

    fn record(
        p: ProcessInfo,
        entry: &mut StoredEntry,
        _: &mut Room,
        _: &mut Vec<Blob>,
    ) -> ProcessInfo {
        entry.result = Some(StoredResult::Process(p.clone()));
        p
    }

    fn replay(entry: &StoredEntry, _: &Blobs) -> Result<ProcessInfo, ApiError> {
        match &entry.result {
            Some(StoredResult::Process(p)) => Ok(p.clone()),
            _ => Err(damaged(entry, "process")),
        }
    }
}

/// A call that only changes the sandbox; its entry has no result.
#[derive(Debug)]
pub enum Effect {}

impl CallKind for Effect {
    type Done = ();
    type Answer = ();

    fn record((): (), _: &mut StoredEntry, _: &mut Room, _: &mut Vec<Blob>) {}

    fn replay(_: &StoredEntry, _: &Blobs) -> Result<(), ApiError> {
        Ok(())
    }
}

/// A fork: its answer is the children's ids, which its entry's request names.
#[derive(Debug)]
pub enum Forked {}

impl CallKind for Forked {
    type Done = Vec<String>;
    type Answer = Vec<String>;

    fn record(
        children: Vec<String>,
        _: &mut StoredEntry,
        _: &mut Room,
        _: &mut Vec<Blob>,
    ) -> Vec<String> {
        children
    }

    fn replay(entry: &StoredEntry, _: &Blobs) -> Result<Vec<String>, ApiError> {
        match &entry.call {
            TrajectoryCall::Fork { children, .. } => Ok(children.clone()),
            _ => Err(damaged(entry, "fork")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::{ExecCall, ExitInfo, OutputEncoding};

    fn exec_entry(encoding: OutputEncoding) -> StoredEntry {
        let call = TrajectoryCall::Exec(ExecCall {
            argv: Some(vec!["true".into()]),
            encoding,
            ..Default::default()
        });
        StoredEntry::new(call, Some(1), 0)
    }

    #[test]
    fn an_exec_answers_the_same_when_run_and_when_replayed() {
        let mut entry = exec_entry(OutputEncoding::Base64);
        let mut blobs = Vec::new();
        let big = vec![b'x'; super::super::INLINE_MAX + 10];
        let out = ExecOutput {
            stdout: big.clone(),
            stderr: b"warn".to_vec(),
            exit: ExitInfo {
                exit_code: Some(3),
                stdout_bytes: big.len() as u64,
                stderr_bytes: 4,
                duration_us: 2500,
                ..Default::default()
            },
        };
        let ran = Exec::record(out, &mut entry, &mut Room::unlimited(), &mut blobs);
        assert!(!ran.replayed);
        assert_eq!(ran.duration_ms, 2.5);
        let blobs: Blobs = blobs.into_iter().collect();
        let again = Exec::replay(&entry, &blobs).unwrap();
        assert!(again.replayed);
        assert_eq!(
            ExecResult {
                replayed: false,
                ..again
            },
            ran
        );
    }

    #[test]
    fn a_record_of_another_kind_is_a_damaged_log() {
        let mut entry = exec_entry(OutputEncoding::Utf8);
        Effect::record((), &mut entry, &mut Room::unlimited(), &mut Vec::new());
        let e = Exec::replay(&entry, &Blobs::new()).unwrap_err();
        assert_eq!(e.code, warren_types::ErrorCode::Internal);
        assert!(Spawn::replay(&entry, &Blobs::new()).is_err());
    }

    #[test]
    fn entries_written_with_the_exit_spelled_out_still_read() {
        let old = serde_json::json!({
            "exit_code": 0, "signal": null, "timed_out": false,
            "stdout": {"sha256": "x", "len": 2, "inline": "aGk="},
            "stderr": {"sha256": "y", "len": 0, "inline": ""},
            "stdout_truncated": false, "stderr_truncated": false,
            "stdout_bytes": 2, "stderr_bytes": 0, "duration_ms": 1.5
        });
        let e: StoredExec = serde_json::from_value(old).unwrap();
        let r = e.result(OutputEncoding::Utf8, &Blobs::new());
        assert_eq!((r.stdout.as_str(), r.duration_ms), ("hi", 1.5));
        let new = serde_json::to_value(&e).unwrap();
        assert!(new.get("duration_ms").is_none());
    }
}
