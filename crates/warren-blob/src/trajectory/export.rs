//! A shipped trajectory as the bytes of its export (`GET /v1/sandboxes/{id}/trajectory`
//! for a sandbox not on the node asked): ndjson lines, one segment at a time, from a task
//! of its own through a short queue (a slow reader holds the task, never memory). An output
//! kept as a blob of [`STREAM_OVER`] bytes or more is never read whole: its line is written
//! around it and the blob is read by ranges of [`RANGE`] bytes (once to learn whether it is
//! UTF-8, once to send it) and encoded on the way, exactly as the whole line would show it,
//! so an export holds about one segment and a few ranges, however large an output is.
//!
//! [`OutputEncoder`] and [`Utf8Check`] are the chunk-by-chunk halves of that, shared with
//! the node's export of its own log.

use base64::Engine as _;
use bytes::Bytes;
use std::hash::{BuildHasher, Hasher};
use std::io;
use tokio::sync::mpsc;
use warren_types::{OutputEncoding, TrajectoryResult};

use super::{output_key, raw_bytes, SegmentLine, TrajectoryPages};
use crate::BlobStore;

/// Outputs this large or larger are read by ranges, never whole.
pub const STREAM_OVER: u64 = 1 << 20;
/// Bytes of a blob read at a time (a multiple of 3: base64 chunks join up).
const RANGE: u64 = 3 << 18;
/// Bytes of whole lines gathered before they are sent.
const FLUSH: usize = 64 << 10;
/// Chunks queued between the producing task and the response body.
const QUEUE: usize = 4;

type Chunk = Result<Bytes, io::Error>;

/// The pages as newline-delimited JSON, one entry per line (the body of the export). An
/// error after the first bytes can only end the stream with an error (the transfer is cut).
/// Must be called within a Tokio runtime (the bytes are made by a task of their own).
pub fn ndjson(pages: TrajectoryPages) -> impl futures::Stream<Item = Chunk> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Chunk>(QUEUE);
    tokio::spawn(async move {
        let mut pages = pages;
        if let Err(Stop::Failed(e)) = produce(&mut pages, &tx).await {
            let _ = tx.send(Err(e)).await;
        }
    });
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

/// Encodes an output chunk by chunk as it appears inside the JSON string of an exported
/// line: base64 (chunks of any length join up) or JSON-escaped text (a character cut
/// between two chunks waits for the next). The pieces joined are what
/// [`OutputEncoding::encode`] and JSON would write for the whole output.
#[derive(Debug)]
pub struct OutputEncoder {
    encoding: OutputEncoding,
    carry: Vec<u8>,
}

impl OutputEncoder {
    pub fn new(encoding: OutputEncoding) -> OutputEncoder {
        OutputEncoder {
            encoding,
            carry: Vec::new(),
        }
    }

    /// The encoded text of `chunk` (and of what earlier chunks left over).
    pub fn push(&mut self, chunk: &[u8]) -> String {
        self.carry.extend_from_slice(chunk);
        let ready = match self.encoding {
            OutputEncoding::Base64 => self.carry.len() - self.carry.len() % 3,
            OutputEncoding::Utf8 => match std::str::from_utf8(&self.carry) {
                Ok(_) => self.carry.len(),
                Err(e) if e.error_len().is_none() => e.valid_up_to(),
                // Not UTF-8 after all (the output changed since it was checked): as the
                // whole output's lossy text would show it.
                Err(_) => self.carry.len(),
            },
        };
        let out = self.encode(&self.carry[..ready]);
        self.carry.drain(..ready);
        out
    }

    /// The text of what is left (the output's end).
    pub fn finish(mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        self.encode(&rest)
    }

    fn encode(&self, bytes: &[u8]) -> String {
        match self.encoding {
            OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
            OutputEncoding::Utf8 => {
                // A string's JSON is its text escaped, between quotes.
                let quoted = serde_json::to_string(&String::from_utf8_lossy(bytes))
                    .unwrap_or_else(|_| "\"\"".into());
                quoted[1..quoted.len() - 1].to_string()
            }
        }
    }
}

/// Whether an output given chunk by chunk is UTF-8 throughout.
#[derive(Debug, Default)]
pub struct Utf8Check {
    carry: Vec<u8>,
    bad: bool,
}

impl Utf8Check {
    /// Takes the next chunk; false once the output is known not to be UTF-8.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        if self.bad {
            return false;
        }
        self.carry.extend_from_slice(chunk);
        match std::str::from_utf8(&self.carry) {
            Ok(_) => self.carry.clear(),
            // Cut in the middle of a character: keep its start for the next chunk.
            Err(e) if e.error_len().is_none() => {
                self.carry.drain(..e.valid_up_to());
            }
            Err(_) => self.bad = true,
        }
        !self.bad
    }

    /// True when every chunk was UTF-8 and none ended inside a character.
    pub fn finish(self) -> bool {
        !self.bad && self.carry.is_empty()
    }
}

/// A marker no entry can hold: random, in characters JSON writes as they are.
pub fn marker(what: &str) -> String {
    let mut a = std::collections::hash_map::RandomState::new().build_hasher();
    a.write_u64(std::process::id().into());
    let mut b = std::collections::hash_map::RandomState::new().build_hasher();
    b.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("@@warren-{what}-{:016x}{:016x}@@", a.finish(), b.finish())
}

/// Where `marker` is in `line`.
pub fn marker_at(line: &[u8], marker: &[u8]) -> Option<usize> {
    line.windows(marker.len()).position(|w| w == marker)
}

/// The reader went away, or the export failed.
enum Stop {
    Gone,
    Failed(io::Error),
}

fn failed(e: impl std::fmt::Display) -> Stop {
    Stop::Failed(io::Error::other(e.to_string()))
}

/// Sends `bytes`; `Stop::Gone` when the response body was dropped.
async fn send(tx: &mpsc::Sender<Chunk>, bytes: impl Into<Bytes>) -> Result<(), Stop> {
    tx.send(Ok(bytes.into())).await.map_err(|_| Stop::Gone)
}

/// An output of a line to export.
enum Output {
    /// In memory: inline in the segment, or a small blob.
    Bytes(Vec<u8>),
    /// A large blob: its key and size.
    Blob { key: String, size: u64 },
}

async fn produce(pages: &mut TrajectoryPages, tx: &mpsc::Sender<Chunk>) -> Result<(), Stop> {
    let store = pages.store.clone();
    while let Some(lines) = pages.next_lines().await {
        let mut out = Vec::new();
        for line in lines.map_err(failed)? {
            match outputs(store.as_ref(), &line).await? {
                None => line_into(&mut out, &line.entry),
                Some([Output::Bytes(stdout), Output::Bytes(stderr)]) => {
                    let mut entry = line.entry;
                    put_back(&mut entry, &stdout, &stderr);
                    line_into(&mut out, &entry);
                }
                Some(outputs) => {
                    if !out.is_empty() {
                        send(tx, std::mem::take(&mut out)).await?;
                    }
                    stream_line(store.as_ref(), line, outputs, tx).await?;
                }
            }
            if out.len() >= FLUSH {
                send(tx, std::mem::take(&mut out)).await?;
            }
        }
        if !out.is_empty() {
            send(tx, out).await?;
        }
    }
    Ok(())
}

fn line_into(out: &mut Vec<u8>, e: &warren_types::TrajectoryEntry) {
    // Entries are plain data; encoding them cannot fail.
    if serde_json::to_writer(&mut *out, e).is_ok() {
        out.push(b'\n');
    }
}

/// The encoding the whole line shows: text when both outputs are UTF-8, else base64.
fn encoding_of(utf8: bool) -> OutputEncoding {
    if utf8 {
        OutputEncoding::Utf8
    } else {
        OutputEncoding::Base64
    }
}

/// An exec entry's outputs put back whole, encoded as the export encodes them.
fn put_back(entry: &mut warren_types::TrajectoryEntry, stdout: &[u8], stderr: &[u8]) {
    let Some(TrajectoryResult::Exec(o)) = entry.result.as_mut() else {
        return;
    };
    let encoding =
        encoding_of(std::str::from_utf8(stdout).is_ok() && std::str::from_utf8(stderr).is_ok());
    let r = &mut o.result;
    r.stdout = encoding.encode(stdout);
    r.stderr = encoding.encode(stderr);
    r.encoding = encoding;
}

/// The outputs of an exec line that names a blob: small blobs read whole, large ones left
/// in the store. `None` for a line without blobs (exported as it is).
async fn outputs(store: &dyn BlobStore, line: &SegmentLine) -> Result<Option<[Output; 2]>, Stop> {
    let Some(TrajectoryResult::Exec(o)) = line.entry.result.as_ref() else {
        return Ok(None);
    };
    if line.stdout_blob.is_none() && line.stderr_blob.is_none() {
        return Ok(None);
    }
    let r = &o.result;
    let mut out = Vec::with_capacity(2);
    for (blob, text) in [
        (&line.stdout_blob, &r.stdout),
        (&line.stderr_blob, &r.stderr),
    ] {
        out.push(match blob {
            None => Output::Bytes(raw_bytes(text, r.encoding)),
            Some(d) => {
                let key = output_key(d);
                let size = store.head(&key).await.map_err(failed)?;
                if size < STREAM_OVER {
                    Output::Bytes(store.get(&key).await.map_err(failed)?.to_vec())
                } else {
                    Output::Blob { key, size }
                }
            }
        });
    }
    let both: [Output; 2] = out.try_into().map_err(|_| failed("two outputs"))?;
    Ok(Some(both))
}

/// A blob read range by range.
struct Ranges<'a> {
    store: &'a dyn BlobStore,
    key: &'a str,
    size: u64,
    at: u64,
}

impl<'a> Ranges<'a> {
    fn new(store: &'a dyn BlobStore, key: &'a str, size: u64) -> Ranges<'a> {
        Ranges {
            store,
            key,
            size,
            at: 0,
        }
    }

    /// The next range; `None` at the end.
    async fn next_range(&mut self) -> Result<Option<Bytes>, Stop> {
        if self.at >= self.size {
            return Ok(None);
        }
        let (at, end) = (self.at, (self.at + RANGE).min(self.size));
        let chunk = self
            .store
            .get_range(self.key, at..end)
            .await
            .map_err(failed)?;
        if chunk.len() as u64 != end - at {
            return Err(failed(format!(
                "{}: {} bytes read of {at}..{end} (the blob changed while it was exported)",
                self.key,
                chunk.len()
            )));
        }
        self.at = end;
        Ok(Some(chunk))
    }
}

/// One exec line with an output read from the store by ranges.
async fn stream_line(
    store: &dyn BlobStore,
    line: SegmentLine,
    outputs: [Output; 2],
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), Stop> {
    let mut utf8 = true;
    for o in &outputs {
        utf8 &= match o {
            Output::Bytes(b) => std::str::from_utf8(b).is_ok(),
            Output::Blob { key, size } => {
                let mut check = Utf8Check::default();
                let mut ranges = Ranges::new(store, key, *size);
                while let Some(c) = ranges.next_range().await? {
                    if !check.push(&c) {
                        break;
                    }
                }
                check.finish()
            }
        };
        if !utf8 {
            break;
        }
    }
    let encoding = encoding_of(utf8);
    let markers = [marker("stdout"), marker("stderr")];
    let mut entry = line.entry;
    if let Some(TrajectoryResult::Exec(o)) = &mut entry.result {
        o.result.encoding = encoding;
        let fields = [&mut o.result.stdout, &mut o.result.stderr];
        for ((field, out), mark) in fields.into_iter().zip(&outputs).zip(&markers) {
            *field = match out {
                Output::Bytes(b) => encoding.encode(b),
                Output::Blob { .. } => mark.clone(),
            };
        }
    }
    let mut text = Vec::new();
    line_into(&mut text, &entry);
    drop(entry);
    // The line around the streamed outputs, in the order they appear in it.
    let mut cuts = Vec::new();
    for (i, (o, mark)) in outputs.iter().zip(&markers).enumerate() {
        if matches!(o, Output::Blob { .. }) {
            let at = marker_at(&text, mark.as_bytes())
                .ok_or_else(|| failed("an exported entry lost its output marker"))?;
            cuts.push((at, i));
        }
    }
    cuts.sort();
    let mut from = 0;
    for (at, i) in cuts {
        send(tx, Bytes::copy_from_slice(&text[from..at])).await?;
        let Output::Blob { key, size } = &outputs[i] else {
            continue;
        };
        stream_blob(store, key, *size, encoding, tx).await?;
        from = at + markers[i].len();
    }
    send(tx, Bytes::copy_from_slice(&text[from..])).await?;
    Ok(())
}

/// Sends blob `key` as `encoding` writes it inside a JSON string, range by range.
async fn stream_blob(
    store: &dyn BlobStore,
    key: &str,
    size: u64,
    encoding: OutputEncoding,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), Stop> {
    let mut enc = OutputEncoder::new(encoding);
    let mut ranges = Ranges::new(store, key, size);
    while let Some(chunk) = ranges.next_range().await? {
        let out = enc.push(&chunk);
        if !out.is_empty() {
            send(tx, out).await?;
        }
    }
    let out = enc.finish();
    if !out.is_empty() {
        send(tx, out).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::{encode_segment, segment_key, SegmentHeader, FORMAT};
    use crate::LocalStore;
    use futures::StreamExt;
    use std::sync::Arc;
    use warren_types::{
        Caller, ExecCall, ExecOutcome, ExecResult, NodeId, SandboxId, TrajectoryCall,
        TrajectoryEntry,
    };

    fn exec_line(seq: u64, stdout: Option<&str>, stderr: &str) -> SegmentLine {
        SegmentLine {
            entry: TrajectoryEntry {
                seq,
                step: None,
                call: TrajectoryCall::Exec(ExecCall::default()),
                request_sha256: "ab".into(),
                started_at_ms: 1,
                ended_at_ms: 2,
                duration_ms: 1.0,
                result: Some(TrajectoryResult::Exec(ExecOutcome {
                    result: ExecResult {
                        exit_code: Some(0),
                        stderr: stderr.into(),
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
            stdout_blob: stdout.map(String::from),
            stderr_blob: None,
            stored: None,
        }
    }

    /// Large outputs (binary, and text with characters cut between ranges) and small ones
    /// export exactly as the entries read back whole show them.
    #[tokio::test]
    async fn a_streamed_export_is_the_whole_export() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(LocalStore::new(dir.path()));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let mut state = 7u64;
        let binary: Vec<u8> = (0..(2 * RANGE + 5))
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                (state >> 56) as u8
            })
            .collect();
        // Three-byte characters and a quote: ranges cut inside characters.
        let text = "é\"€\n".repeat((3 * RANGE as usize) / 7 + 11);
        let blobs = [
            ("big-bin", binary),
            ("big-text", text.into_bytes()),
            ("small", b"small \xe2\x82\xac".to_vec()),
        ];
        for (d, b) in &blobs {
            store
                .put(&output_key(d), Bytes::from(b.clone()))
                .await
                .unwrap();
        }
        let lines = [
            exec_line(1, Some("big-bin"), "err"),
            exec_line(2, None, "plain"),
            exec_line(3, Some("big-text"), "ünï"),
            exec_line(4, Some("small"), ""),
        ];
        let header = SegmentHeader {
            format: FORMAT,
            sandbox: id.to_string(),
            tenant: None,
            first_seq: 1,
            last_seq: 4,
        };
        store
            .put(&segment_key(&id, 1, 4), encode_segment(&header, &lines))
            .await
            .unwrap();
        let admin = Caller::admin();
        let open = || TrajectoryPages::open(store.clone(), &id, 1, &admin);
        let whole =
            warren_types::trajectory::ndjson_lines(&open().await.unwrap().all().await.unwrap());
        let mut streamed = Vec::new();
        let mut chunks = 0;
        let mut body = Box::pin(ndjson(open().await.unwrap()));
        while let Some(c) = body.next().await {
            let c = c.unwrap();
            assert!(
                c.len() <= 2 * RANGE as usize,
                "a chunk of {} bytes",
                c.len()
            );
            streamed.extend_from_slice(&c);
            chunks += 1;
        }
        assert!(chunks > 6, "{chunks} chunks");
        assert_eq!(streamed.len(), whole.len());
        assert!(
            streamed == whole,
            "the streamed export differs from the whole one"
        );
        let first: TrajectoryEntry =
            serde_json::from_slice(streamed.split(|b| *b == b'\n').next().unwrap()).unwrap();
        let Some(TrajectoryResult::Exec(o)) = first.result else {
            panic!("an exec");
        };
        assert_eq!(o.result.encoding, OutputEncoding::Base64);
    }

    #[test]
    fn chunks_of_any_length_encode_as_the_whole() {
        let bytes = "a€\"\u{1}b".repeat(50).into_bytes();
        for encoding in [OutputEncoding::Utf8, OutputEncoding::Base64] {
            let whole = {
                let s = serde_json::to_string(&encoding.encode(&bytes)).unwrap();
                s[1..s.len() - 1].to_string()
            };
            for size in [1, 2, 4, 7, 64] {
                let mut enc = OutputEncoder::new(encoding);
                let mut check = Utf8Check::default();
                let mut out = String::new();
                for c in bytes.chunks(size) {
                    out.push_str(&enc.push(c));
                    assert!(check.push(c));
                }
                out.push_str(&enc.finish());
                assert_eq!(out, whole, "{encoding:?} in chunks of {size}");
                assert!(check.finish());
            }
        }
        let mut check = Utf8Check::default();
        assert!(!check.push(b"ok \xff"));
        assert!(!check.finish());
    }
}
