//! Trajectories shipped to a blob store: the objects a node writes (`warrend
//! --trajectory-store`) and what a node or a gateway reads back once the sandbox is gone.
//!
//! Under the store's root:
//! - `trajectories/<sandbox id>/<first seq>-<last seq>.jsonl` (seqs zero-padded to 20
//!   digits): a **segment**, a header line ([`SegmentHeader`]: format, sandbox, tenant, seqs)
//!   then one [`SegmentLine`] per entry, in seq order. A segment is written whole, once per
//!   name; one sent again after a restart may overlap an earlier one, so readers skip every
//!   seq they already gave ([`TrajectoryPages`]).
//! - `trajectories/<sandbox id>/sealed.json`: the [`Seal`], written once the sandbox was
//!   deleted and every entry shipped: its last seq, so a reader knows the log is whole.
//! - `trajectories/<sandbox id>/sandbox.json`: the [`SandboxRecord`] (its record and
//!   hostname, and a fork's child's parent), written by the create or fork before it
//!   answers and again at the seal: what a node makes a new sandbox like when it revives
//!   one that is gone.
//! - `trajectories/<sandbox id>/revived.json`: the [`Revived`] mark, written by a node that
//!   revived the sandbox from the store before the new sandbox runs anything: the sandbox's
//!   own node, if it comes back, deletes the original instead of resuming it (a fence).
//! - `trajectories/blobs/<sha256 hex>`: an output (or an input: an exec's stdin, an
//!   upload's content) too large to be inline in its entry,
//!   content-addressed (uploading it again is harmless), written before the segment that
//!   refers to it.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use warren_types::{
    Caller, OutputEncoding, SandboxId, SandboxInfo, TrajectoryEntry, TrajectoryResult,
};

use crate::{BlobError, BlobStore};

mod export;
pub use export::{marker, marker_at, ndjson, OutputEncoder, Utf8Check, STREAM_OVER};

/// Format version of segments and seals.
pub const FORMAT: u32 = 1;

/// Opens a trajectory store: a directory, `file://DIR` or `s3://BUCKET/PREFIX` (an HTTP
/// store can be neither written nor listed, so it is refused).
pub fn open_trajectory_store(url: &str) -> Result<Arc<dyn BlobStore>, BlobError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(BlobError::Backend {
            store: url.to_string(),
            message: "a trajectory store must be a directory or s3://: an HTTP store can be \
                      neither written nor listed"
                .into(),
        });
    }
    crate::open_store(url)
}

/// The folder of one sandbox's segments and seal.
pub fn sandbox_prefix(id: &SandboxId) -> String {
    format!("trajectories/{id}/")
}

/// The key of the segment of `id` holding entries `first..=last`.
pub fn segment_key(id: &SandboxId, first: u64, last: u64) -> String {
    format!("trajectories/{id}/{first:020}-{last:020}.jsonl")
}

/// The key of the seal of `id`.
pub fn seal_key(id: &SandboxId) -> String {
    format!("trajectories/{id}/sealed.json")
}

/// The key of the sandbox record of `id`.
pub fn record_key(id: &SandboxId) -> String {
    format!("trajectories/{id}/sandbox.json")
}

/// The key of the revive mark of `id` (see [`Revived`]).
pub fn revived_key(id: &SandboxId) -> String {
    format!("trajectories/{id}/revived.json")
}

/// The key of an output blob.
pub fn output_key(sha256_hex: &str) -> String {
    format!("trajectories/blobs/{sha256_hex}")
}

/// `(first, last)` of a segment key's file name, `None` for any other key.
pub fn parse_segment_key(key: &str) -> Option<(u64, u64)> {
    let name = key.rsplit('/').next()?.strip_suffix(".jsonl")?;
    let (a, b) = name.split_once('-')?;
    let (first, last) = (a.parse().ok()?, b.parse().ok()?);
    (first <= last).then_some((first, last))
}

/// The first line of a segment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentHeader {
    pub format: u32,
    pub sandbox: String,
    /// The tenant owning the sandbox (`None`: created without a tenant, an administrator's).
    pub tenant: Option<String>,
    pub first_seq: u64,
    pub last_seq: u64,
}

/// One entry of a segment: the entry as the export shows it, except that an output kept as
/// a blob is left out of it (`stdout` or `stderr` empty) and named here by its sha256.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SegmentLine {
    #[serde(flatten)]
    pub entry: TrajectoryEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_blob: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_blob: Option<String>,
    /// The entry as the node stored it (with its input, and its blobs named by sha256):
    /// what revive runs again. Segments shipped before it was written lack it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<serde_json::Value>,
}

/// Format version of sandbox records.
pub const RECORD_FORMAT: u32 = 1;

/// A shipped sandbox's record (`sandbox.json`): what a new sandbox is made like.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub format: u32,
    pub sandbox: SandboxInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// A fork's child: what its files were copied from. Written by the fork before it
    /// answers, so that a revive replays the parent up to the fork even when the child's own
    /// first entry (`forked_from`, which says the same) was never shipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkOrigin>,
}

/// Where a fork's child came from: its parent and the parent's last entry at the fork.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    pub parent: String,
    pub parent_seq: u64,
}

/// Written when a deleted sandbox's log is all shipped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Seal {
    pub format: u32,
    pub sandbox: String,
    pub tenant: Option<String>,
    /// The last entry of the log (0: it had none).
    pub last_seq: u64,
    /// Unix time in milliseconds.
    pub sealed_at_ms: u64,
}

/// Format version of revive marks.
pub const REVIVED_FORMAT: u32 = 1;

/// Written (`revived.json`) when a node revives a sandbox from the store: the original is
/// fenced, its node deletes it if it ever comes back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revived {
    pub format: u32,
    /// The original sandbox.
    pub sandbox: String,
    /// The sandbox it was revived as.
    pub revived_as: String,
    /// Unix time in milliseconds.
    pub at_ms: u64,
}

/// The revive mark of `id`, if a node revived it from the store.
pub async fn revived(
    store: &dyn BlobStore,
    id: &SandboxId,
) -> Result<Option<Revived>, TrajectoryStoreError> {
    let key = revived_key(id);
    match store.get(&key).await {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| TrajectoryStoreError::Corrupt {
                    key,
                    message: e.to_string(),
                })
        }
        Err(BlobError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Errors of reading and writing shipped trajectories.
#[derive(Debug, thiserror::Error)]
pub enum TrajectoryStoreError {
    /// Nothing of the sandbox is in the store, or the caller may not see it.
    #[error("no trajectory of sandbox {0} in the trajectory store")]
    NotFound(SandboxId),
    #[error(transparent)]
    Store(#[from] BlobError),
    #[error("{key}: {message}")]
    Corrupt { key: String, message: String },
}

impl TrajectoryStoreError {
    /// The stable API error code of this error.
    pub fn code(&self) -> warren_types::ErrorCode {
        match self {
            TrajectoryStoreError::NotFound(_) => warren_types::ErrorCode::NotFound,
            TrajectoryStoreError::Store(e) => e.code(),
            TrajectoryStoreError::Corrupt { .. } => warren_types::ErrorCode::Internal,
        }
    }
}

/// A segment's bytes: the header and the lines, each a JSON object and a newline.
pub fn encode_segment(header: &SegmentHeader, lines: &[SegmentLine]) -> Bytes {
    let mut out = Vec::new();
    // Plain data: encoding cannot fail.
    let _ = serde_json::to_writer(&mut out, header);
    out.push(b'\n');
    for l in lines {
        let _ = serde_json::to_writer(&mut out, l);
        out.push(b'\n');
    }
    Bytes::from(out)
}

/// A segment read back: its header and lines.
pub fn decode_segment(
    key: &str,
    bytes: &[u8],
) -> Result<(SegmentHeader, Vec<SegmentLine>), TrajectoryStoreError> {
    let corrupt = |message: String| TrajectoryStoreError::Corrupt {
        key: key.to_string(),
        message,
    };
    let mut lines = bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    let header: SegmentHeader = serde_json::from_slice(lines.next().unwrap_or_default())
        .map_err(|e| corrupt(format!("header: {e}")))?;
    if header.format != FORMAT {
        return Err(corrupt(format!(
            "format {} (this build reads {FORMAT})",
            header.format
        )));
    }
    let entries = lines
        .map(|l| serde_json::from_slice(l).map_err(|e| corrupt(format!("entry: {e}"))))
        .collect::<Result<Vec<SegmentLine>, _>>()?;
    Ok((header, entries))
}

/// The bytes an output of `r` shows: the text itself, or decoded base64.
fn raw_bytes(text: &str, encoding: OutputEncoding) -> Vec<u8> {
    use base64::Engine;
    match encoding {
        OutputEncoding::Utf8 => text.as_bytes().to_vec(),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(text)
            .unwrap_or_default(),
    }
}

/// A line made whole again: its outputs kept as blobs put back (read from `store`), encoded
/// as the export encodes them (text when both are UTF-8, else base64).
async fn rehydrate(
    store: &dyn BlobStore,
    line: SegmentLine,
) -> Result<TrajectoryEntry, TrajectoryStoreError> {
    let SegmentLine {
        mut entry,
        stdout_blob,
        stderr_blob,
        ..
    } = line;
    if stdout_blob.is_none() && stderr_blob.is_none() {
        return Ok(entry);
    }
    let Some(TrajectoryResult::Exec(outcome)) = entry.result.as_mut() else {
        return Ok(entry);
    };
    let r = &mut outcome.result;
    let mut out = raw_bytes(&r.stdout, r.encoding);
    let mut err = raw_bytes(&r.stderr, r.encoding);
    if let Some(d) = &stdout_blob {
        out = store.get(&output_key(d)).await?.to_vec();
    }
    if let Some(d) = &stderr_blob {
        err = store.get(&output_key(d)).await?.to_vec();
    }
    let encoding = if std::str::from_utf8(&out).is_ok() && std::str::from_utf8(&err).is_ok() {
        OutputEncoding::Utf8
    } else {
        OutputEncoding::Base64
    };
    r.stdout = encoding.encode(&out);
    r.stderr = encoding.encode(&err);
    r.encoding = encoding;
    Ok(entry)
}

/// Segment keys of `id` by `(first, last)`, in seq order, and whether it is sealed.
pub async fn segments(
    store: &dyn BlobStore,
    id: &SandboxId,
) -> Result<(Vec<(u64, u64, String)>, bool), TrajectoryStoreError> {
    let keys = store.list(&sandbox_prefix(id)).await?;
    let sealed = keys.iter().any(|k| *k == seal_key(id));
    let mut segs: Vec<(u64, u64, String)> = keys
        .into_iter()
        .filter_map(|k| parse_segment_key(&k).map(|(a, b)| (a, b, k)))
        .collect();
    segs.sort();
    Ok((segs, sealed))
}

/// The last seq shipped for `id` (0 when nothing is).
pub async fn last_shipped(store: &dyn BlobStore, id: &SandboxId) -> Result<u64, BlobError> {
    let keys = store.list(&sandbox_prefix(id)).await?;
    Ok(keys
        .iter()
        .filter_map(|k| parse_segment_key(k))
        .map(|(_, last)| last)
        .max()
        .unwrap_or(0))
}

/// A shipped trajectory read back, one segment per page, every seq once, from a given seq
/// on: what `GET /v1/sandboxes/{id}/trajectory` answers for a sandbox that is not on the
/// node asked.
#[derive(Debug)]
pub struct TrajectoryPages {
    store: Arc<dyn BlobStore>,
    segments: std::vec::IntoIter<(u64, u64, String)>,
    /// The next seq to give; lower ones were given (or not asked for).
    next_seq: u64,
    /// The first segment, read when the pages were opened (for its tenant).
    first: Option<Vec<SegmentLine>>,
}

impl TrajectoryPages {
    /// The pages of `id` from `from_seq` on, for `caller`: `NotFound` when the store holds
    /// nothing of it, or it belongs to a tenant the caller does not see.
    pub async fn open(
        store: Arc<dyn BlobStore>,
        id: &SandboxId,
        from_seq: u64,
        caller: &Caller,
    ) -> Result<TrajectoryPages, TrajectoryStoreError> {
        let (segs, sealed) = segments(store.as_ref(), id).await?;
        let owner = match segs.first() {
            Some((_, _, key)) => {
                let (header, lines) = decode_segment(key, &store.get(key).await?)?;
                Some((header.tenant, Some(lines)))
            }
            None if sealed => {
                let key = seal_key(id);
                let seal: Seal = serde_json::from_slice(&store.get(&key).await?).map_err(|e| {
                    TrajectoryStoreError::Corrupt {
                        key,
                        message: e.to_string(),
                    }
                })?;
                Some((seal.tenant, None))
            }
            None => None,
        };
        let Some((tenant, first)) = owner else {
            return Err(TrajectoryStoreError::NotFound(id.clone()));
        };
        if !caller.sees(tenant.as_deref()) {
            return Err(TrajectoryStoreError::NotFound(id.clone()));
        }
        Ok(TrajectoryPages {
            store,
            segments: segs.into_iter(),
            next_seq: from_seq.max(1),
            first,
        })
    }

    /// The next page of entries; `None` after the last.
    pub async fn next_page(
        &mut self,
    ) -> Option<Result<Vec<TrajectoryEntry>, TrajectoryStoreError>> {
        let lines = match self.next_lines().await? {
            Ok(lines) => lines,
            Err(e) => return Some(Err(e)),
        };
        let mut page = Vec::with_capacity(lines.len());
        for line in lines {
            match rehydrate(self.store.as_ref(), line).await {
                Ok(e) => page.push(e),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(page))
    }

    /// The lines of the next page as shipped (outputs kept as blobs named, not read);
    /// `None` after the last.
    async fn next_lines(&mut self) -> Option<Result<Vec<SegmentLine>, TrajectoryStoreError>> {
        loop {
            let (_, last, key) = self.segments.next()?;
            let first = self.first.take();
            if last < self.next_seq {
                continue;
            }
            let lines = match first {
                Some(lines) => lines,
                None => match self.read(&key).await {
                    Ok(lines) => lines,
                    Err(e) => return Some(Err(e)),
                },
            };
            let mut page = Vec::new();
            for line in lines {
                if line.entry.seq < self.next_seq {
                    continue;
                }
                self.next_seq = line.entry.seq + 1;
                page.push(line);
            }
            if !page.is_empty() {
                return Some(Ok(page));
            }
        }
    }

    async fn read(&self, key: &str) -> Result<Vec<SegmentLine>, TrajectoryStoreError> {
        let bytes = self.store.get(key).await?;
        Ok(decode_segment(key, &bytes)?.1)
    }

    /// Every entry left (tests and small logs).
    pub async fn all(mut self) -> Result<Vec<TrajectoryEntry>, TrajectoryStoreError> {
        let mut out = Vec::new();
        while let Some(p) = self.next_page().await {
            out.extend(p?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;
    use warren_types::{ExecCall, ExecOutcome, ExecResult, NodeId, Role, TrajectoryCall};

    fn line(seq: u64, stdout: &str) -> SegmentLine {
        SegmentLine {
            entry: TrajectoryEntry {
                seq,
                step: Some(seq * 10),
                call: TrajectoryCall::Exec(ExecCall::default()),
                request_sha256: "ab".into(),
                started_at_ms: 1,
                ended_at_ms: 2,
                duration_ms: 1.0,
                result: Some(TrajectoryResult::Exec(ExecOutcome {
                    result: ExecResult {
                        exit_code: Some(0),
                        stdout: stdout.into(),
                        ..Default::default()
                    },
                    stdout_sha256: "x".into(),
                    stderr_sha256: "y".into(),
                    stdout_omitted: false,
                    stderr_omitted: false,
                })),
                error: None,
                cancelled: false,
            },
            stdout_blob: None,
            stderr_blob: None,
            stored: None,
        }
    }

    fn header(id: &SandboxId, tenant: Option<&str>, first: u64, last: u64) -> SegmentHeader {
        SegmentHeader {
            format: FORMAT,
            sandbox: id.to_string(),
            tenant: tenant.map(String::from),
            first_seq: first,
            last_seq: last,
        }
    }

    async fn put_segment(store: &LocalStore, id: &SandboxId, t: Option<&str>, seqs: &[u64]) {
        let (a, b) = (seqs[0], *seqs.last().unwrap());
        let lines: Vec<_> = seqs.iter().map(|s| line(*s, &format!("out {s}"))).collect();
        store
            .put(
                &segment_key(id, a, b),
                encode_segment(&header(id, t, a, b), &lines),
            )
            .await
            .unwrap();
    }

    fn user(tenant: &str) -> Caller {
        Caller {
            tenant: Some(tenant.into()),
            role: Role::User,
            quotas: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_segment_sent_again_never_duplicates_a_step() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalStore::new(dir.path()));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        put_segment(&store, &id, Some("a"), &[1, 2, 3]).await;
        put_segment(&store, &id, Some("a"), &[4, 5]).await;
        // The same entries sent again with other bounds (after a restart), and one more.
        put_segment(&store, &id, Some("a"), &[2, 3, 4, 5, 6]).await;
        put_segment(&store, &id, Some("a"), &[4, 5]).await;
        let read = |from| {
            let store: Arc<dyn BlobStore> = store.clone();
            let id = id.clone();
            async move {
                TrajectoryPages::open(store, &id, from, &Caller::admin())
                    .await
                    .unwrap()
                    .all()
                    .await
                    .unwrap()
            }
        };
        let all = read(1).await;
        assert_eq!(
            all.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(all[3].step, Some(40));
        let tail = read(5).await;
        assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), [5, 6]);
        assert_eq!(last_shipped(store.as_ref(), &id).await.unwrap(), 6);
    }

    #[tokio::test]
    async fn another_tenant_sees_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn BlobStore> = Arc::new(LocalStore::new(dir.path()));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let missing = TrajectoryPages::open(store.clone(), &id, 1, &Caller::admin()).await;
        assert!(matches!(missing, Err(TrajectoryStoreError::NotFound(_))));
        let seal = Seal {
            format: FORMAT,
            sandbox: id.to_string(),
            tenant: Some("a".into()),
            last_seq: 0,
            sealed_at_ms: 1,
        };
        store
            .put(&seal_key(&id), serde_json::to_vec(&seal).unwrap().into())
            .await
            .unwrap();
        let theirs = TrajectoryPages::open(store.clone(), &id, 1, &user("b")).await;
        assert!(matches!(theirs, Err(TrajectoryStoreError::NotFound(_))));
        let own = TrajectoryPages::open(store.clone(), &id, 1, &user("a"))
            .await
            .unwrap();
        assert!(own.all().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn outputs_kept_as_blobs_come_back_as_the_export_shows_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalStore::new(dir.path()));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let big = "x".repeat(10_000);
        store
            .put(&output_key("d1"), Bytes::from(big.clone()))
            .await
            .unwrap();
        store
            .put(&output_key("d2"), Bytes::from_static(&[0xff, 0xfe]))
            .await
            .unwrap();
        let mut text = line(1, "");
        text.stdout_blob = Some("d1".into());
        let mut binary = line(2, "");
        binary.stdout_blob = Some("d2".into());
        if let Some(TrajectoryResult::Exec(o)) = &mut binary.entry.result {
            o.result.stderr = "err".into();
        }
        let lines = [text, binary];
        store
            .put(
                &segment_key(&id, 1, 2),
                encode_segment(&header(&id, None, 1, 2), &lines),
            )
            .await
            .unwrap();
        let all = TrajectoryPages::open(store.clone(), &id, 1, &Caller::admin())
            .await
            .unwrap()
            .all()
            .await
            .unwrap();
        let out = |e: &TrajectoryEntry| match &e.result {
            Some(TrajectoryResult::Exec(o)) => o.result.clone(),
            _ => panic!("an exec"),
        };
        assert_eq!(out(&all[0]).stdout, big);
        assert_eq!(out(&all[1]).encoding, OutputEncoding::Base64);
        assert_eq!(out(&all[1]).stdout, "//4=");
        assert_eq!(out(&all[1]).stderr, "ZXJy");
    }
}
