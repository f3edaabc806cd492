//! A trajectory export as bytes (`GET /v1/sandboxes/{id}/trajectory`): ndjson lines, page by
//! page, from a task of its own through a short queue (a slow reader holds the task, never
//! memory). An exec output kept as a blob of [`STREAM_OVER`] bytes or more is never read
//! whole: its line is written around it and the output is read from its file chunk by
//! chunk and encoded on the way (JSON-escaped text or base64, exactly as the whole line
//! would show it), so an export holds about one page and a few chunks, however large an
//! output is. Terminal outputs are exported whole (their chunks are small). The chunk
//! encoding and the UTF-8 check are those of the export from the trajectory store
//! (`warren_blob::trajectory`), which reads a large output by ranges the same way.

use std::io::{self, Read};

use bytes::Bytes;
use warren_blob::trajectory::{marker, marker_at, OutputEncoder, Utf8Check};
use warren_types::{OutputEncoding, TrajectoryEntry, TrajectoryResult};

use super::trajectory::TrajectoryPages;
use super::Manager;
use crate::trajectory::{Blobs, StoredEntry, StoredExec, StoredOutput, StoredResult};

/// Outputs this large or larger are streamed from their blob files.
pub(crate) const STREAM_OVER: u64 = 1 << 20;
/// Bytes read from a blob file at a time (a multiple of 3: base64 chunks join up).
const CHUNK: usize = 3 << 14;
/// Chunks queued between the producing task and the response body.
const QUEUE: usize = 4;

type Chunk = Result<Bytes, io::Error>;

/// The reader went away: stop producing.
struct Gone;

/// Sends `bytes`; `Err(Gone)` when the response body was dropped.
async fn send(tx: &tokio::sync::mpsc::Sender<Chunk>, bytes: impl Into<Bytes>) -> Result<(), Gone> {
    tx.send(Ok(bytes.into())).await.map_err(|_| Gone)
}

impl TrajectoryPages {
    /// The export as a stream of ndjson bytes. An error after the first bytes can only end
    /// the stream with an error (the transfer is cut).
    pub fn into_stream(self) -> impl futures::Stream<Item = Chunk> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(QUEUE);
        tokio::spawn(async move {
            let mut pages = self;
            match produce(&mut pages, &tx).await {
                Ok(()) | Err(Stop::Gone) => {}
                Err(Stop::Failed(e)) => {
                    let _ = tx.send(Err(e)).await;
                }
            }
        });
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
    }
}

enum Stop {
    Gone,
    Failed(io::Error),
}

impl From<Gone> for Stop {
    fn from(_: Gone) -> Stop {
        Stop::Gone
    }
}

fn failed(e: impl std::fmt::Display) -> Stop {
    Stop::Failed(io::Error::other(e.to_string()))
}

async fn produce(
    pages: &mut TrajectoryPages,
    tx: &tokio::sync::mpsc::Sender<Chunk>,
) -> Result<(), Stop> {
    while let Some(page) = pages.next_stored(STREAM_OVER).await {
        let (entries, blobs) = page.map_err(failed)?;
        let mut lines = Vec::new();
        for e in &entries {
            match large_exec(e, &blobs) {
                None => {
                    line_into(&mut lines, &e.export(&blobs));
                    if lines.len() >= CHUNK {
                        send(tx, std::mem::take(&mut lines)).await?;
                    }
                }
                Some(exec) => {
                    if !lines.is_empty() {
                        send(tx, std::mem::take(&mut lines)).await?;
                    }
                    stream_exec(&pages.manager, e, exec, &blobs, tx).await?;
                }
            }
        }
        if !lines.is_empty() {
            send(tx, lines).await?;
        }
    }
    Ok(())
}

fn line_into(out: &mut Vec<u8>, e: &TrajectoryEntry) {
    // Entries are plain data; encoding them cannot fail.
    if serde_json::to_writer(&mut *out, e).is_ok() {
        out.push(b'\n');
    }
}

/// The exec result of `e` when one of its outputs is a blob that was not read (too large).
fn large_exec<'a>(e: &'a StoredEntry, blobs: &Blobs) -> Option<&'a StoredExec> {
    match &e.result {
        Some(StoredResult::Exec(x))
            if [&x.stdout, &x.stderr]
                .iter()
                .any(|o| o.in_blob() && !blobs.contains_key(&o.sha256)) =>
        {
            Some(x)
        }
        _ => None,
    }
}

/// Where an output's bytes are.
enum Source {
    Bytes(Bytes),
    File(std::fs::File),
}

fn source(m: &Manager, o: &StoredOutput, blobs: &Blobs) -> Result<Source, Stop> {
    if !o.in_blob() || blobs.contains_key(&o.sha256) {
        return Ok(Source::Bytes(o.bytes(blobs)));
    }
    if let Some(f) = m.journal().open_blob(&o.sha256).map_err(failed)? {
        return Ok(Source::File(f));
    }
    // Kept in the state file by an older node: read whole.
    let b = m
        .journal()
        .read()
        .and_then(|r| r.blob(&o.sha256))
        .map_err(failed)?;
    Ok(Source::Bytes(b.unwrap_or_default()))
}

/// Reads `f` from its start, chunk by chunk, while `each` (given every chunk, the last one
/// possibly short) answers true.
fn each_chunk(f: &mut std::fs::File, mut each: impl FnMut(&[u8]) -> bool) -> io::Result<()> {
    use std::io::Seek;
    f.rewind()?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = fill(f, &mut buf)?;
        if (n > 0 && !each(&buf[..n])) || n < CHUNK {
            return Ok(());
        }
    }
}

/// Reads into `buf` until it is full or the file ends; the number of bytes read.
fn fill(f: &mut std::fs::File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Whether the file is UTF-8 throughout (checked chunk by chunk).
fn file_is_utf8(f: &mut std::fs::File) -> io::Result<bool> {
    let mut check = Utf8Check::default();
    each_chunk(f, |chunk| check.push(chunk))?;
    Ok(check.finish())
}

/// One exec entry with an output streamed from its file.
async fn stream_exec(
    m: &Manager,
    e: &StoredEntry,
    exec: &StoredExec,
    blobs: &Blobs,
    tx: &tokio::sync::mpsc::Sender<Chunk>,
) -> Result<(), Stop> {
    let sources = [
        source(m, &exec.stdout, blobs)?,
        source(m, &exec.stderr, blobs)?,
    ];
    // As the whole line would say: text when both outputs are UTF-8, else base64.
    let mut utf8 = true;
    for s in &sources {
        utf8 &= match s {
            Source::Bytes(b) => std::str::from_utf8(b).is_ok(),
            Source::File(f) => {
                let mut f2 = f.try_clone().map_err(failed)?;
                tokio::task::spawn_blocking(move || file_is_utf8(&mut f2))
                    .await
                    .map_err(failed)?
                    .map_err(Stop::Failed)?
            }
        };
    }
    let encoding = if utf8 {
        OutputEncoding::Utf8
    } else {
        OutputEncoding::Base64
    };
    let markers = [marker("stdout"), marker("stderr")];
    let mut entry = e.export(blobs);
    if let Some(TrajectoryResult::Exec(o)) = &mut entry.result {
        o.result.encoding = encoding;
        let fields = [&mut o.result.stdout, &mut o.result.stderr];
        for ((field, s), mark) in fields.into_iter().zip(&sources).zip(&markers) {
            *field = match s {
                Source::Bytes(b) => encoding.encode(b),
                Source::File(_) => mark.clone(),
            };
        }
    }
    let mut line = Vec::new();
    line_into(&mut line, &entry);
    // The line around the streamed outputs, in the order they appear in it.
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    for (i, (s, mark)) in sources.iter().zip(&markers).enumerate() {
        if matches!(s, Source::File(_)) {
            let at = marker_at(&line, mark.as_bytes())
                .ok_or_else(|| failed("an exported entry lost its output marker"))?;
            cuts.push((at, i));
        }
    }
    cuts.sort();
    let mut from = 0;
    for (at, i) in cuts {
        send(tx, Bytes::copy_from_slice(&line[from..at])).await?;
        let Source::File(f) = &sources[i] else {
            continue;
        };
        stream_file(f, encoding, tx).await?;
        from = at + markers[i].len();
    }
    send(tx, Bytes::copy_from_slice(&line[from..])).await?;
    Ok(())
}

/// Sends the file's bytes as `encoding` writes them inside a JSON string.
async fn stream_file(
    f: &std::fs::File,
    encoding: OutputEncoding,
    tx: &tokio::sync::mpsc::Sender<Chunk>,
) -> Result<(), Stop> {
    let mut f = f.try_clone().map_err(failed)?;
    {
        use std::io::Seek;
        f.rewind().map_err(failed)?;
    }
    let mut enc = OutputEncoder::new(encoding);
    loop {
        // One chunk read off the async workers.
        let (file, chunk) = tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; CHUNK];
            let read = fill(&mut f, &mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            (f, read)
        })
        .await
        .map_err(failed)?;
        f = file;
        let chunk = chunk.map_err(Stop::Failed)?;
        let last = chunk.len() < CHUNK;
        let out = enc.push(&chunk);
        if !out.is_empty() {
            send(tx, out).await?;
        }
        if last {
            let rest = enc.finish();
            if !rest.is_empty() {
                send(tx, rest).await?;
            }
            return Ok(());
        }
    }
}
