//! Files: streamed download and upload, stat, list, mkdir, remove, chmod. Every path is
//! checked with [`warren_types::validate::sandbox_path`] (the agent resolves it again inside
//! the sandbox's root, so this is a first line, not the only one).
//!
//! Upload, mkdir, remove and chmod go through the step runner and may name a step (see
//! [`super::runner`]). An upload's content digest is only known once its body is read, so a
//! retried upload step reads (and hashes) its body before it is compared; an upload whose body
//! breaks off is logged as cancelled and frees its step.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest as _, Sha256};
use warren_runtime::{FileReader, FileWriter, RuntimeError};
use warren_types::files::{DirPage, MAX_LIST_ENTRIES};
use warren_types::validate::sandbox_path;
use warren_types::{ApiError, FileStat, SandboxId, TrajectoryCall};

use super::runner::{Begun, Fed};
use super::{ActivityGuard, Manager};
use crate::error::NodeError;
use crate::trajectory::{hex, request_digest, Effect};

/// Largest upload whose content is logged (held in memory until the upload ends); larger
/// ones are logged by digest and size, and revive cannot write them again.
pub const KEEP_MAX: u64 = 16 << 20;

/// Hashes what is left of an upload's body, and keeps its bytes for the log while they fit
/// the room the sandbox's log has left.
struct Hashed {
    hasher: Sha256,
    size: u64,
    kept: Option<Vec<u8>>,
    room: u64,
}

impl Hashed {
    fn new() -> Hashed {
        Hashed {
            hasher: Sha256::new(),
            size: 0,
            kept: None,
            room: 0,
        }
    }

    /// Keeps up to `room` bytes of the content (all of it or nothing), at most
    /// [`KEEP_MAX`].
    fn keeping(room: u64) -> Hashed {
        Hashed {
            kept: Some(Vec::new()),
            room: room.min(KEEP_MAX),
            ..Hashed::new()
        }
    }

    fn add(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.size += chunk.len() as u64;
        if self.size > self.room {
            self.kept = None;
        } else if let Some(k) = &mut self.kept {
            k.extend_from_slice(chunk);
        }
    }

    /// What the call was fed, as logged.
    fn fed(&mut self) -> Fed {
        match self.kept.take() {
            Some(k) => Fed::Kept(Bytes::from(k)),
            None => Fed::Dropped {
                sha256: hex(&self.hasher.clone().finalize().into()),
                len: self.size,
            },
        }
    }

    async fn drain<S, E>(&mut self, body: &mut S) -> Result<(), NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(interrupted)?;
            self.add(&chunk);
        }
        Ok(())
    }

    fn tar_call(self, path: &str) -> TrajectoryCall {
        TrajectoryCall::WriteTar {
            path: path.to_string(),
            sha256: hex(&self.hasher.finalize().into()),
            size: self.size,
        }
    }

    fn call(self, path: &str, mode: Option<u32>) -> TrajectoryCall {
        TrajectoryCall::WriteFile {
            path: path.to_string(),
            mode,
            sha256: hex(&self.hasher.finalize().into()),
            size: self.size,
        }
    }
}

/// How pouring a request body into the sandbox ended.
enum Poured {
    /// The body was read to its end; the write's outcome.
    Done(Result<(), RuntimeError>),
    /// The caller's body broke off: the write was cancelled inside the sandbox.
    Interrupted(NodeError),
}

/// Streams `body` into the writer `opened` chunk by chunk (nothing held beyond one chunk),
/// hashing every byte: the trajectory entry names the content it was asked to write, also
/// when the writer could not be opened or failed midway (the rest of the body is still read).
async fn pour<S, E>(
    opened: Result<FileWriter, RuntimeError>,
    body: &mut S,
    hashed: &mut Hashed,
) -> Poured
where
    S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
    E: std::fmt::Display,
{
    let mut w = match opened {
        Ok(w) => w,
        Err(e) => {
            return match hashed.drain(body).await {
                Ok(()) => Poured::Done(Err(e)),
                Err(ne) => Poured::Interrupted(ne),
            }
        }
    };
    let mut failed = None;
    while let Some(chunk) = body.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            // Dropping the writer cancels the write inside the sandbox.
            Err(e) => return Poured::Interrupted(interrupted(e)),
        };
        hashed.add(&chunk);
        if failed.is_none() && !chunk.is_empty() {
            if let Err(e) = w.write(chunk).await {
                failed = Some(e);
            }
        }
    }
    Poured::Done(match failed {
        Some(e) => Err(e),
        None => w.finish().await,
    })
}

fn interrupted(e: impl std::fmt::Display) -> NodeError {
    ApiError::invalid(format!("upload interrupted: {e}")).into()
}

/// A file streaming out of a sandbox.
pub struct FileDownload {
    reader: FileReader,
    id: SandboxId,
    _guard: ActivityGuard,
}

impl std::fmt::Debug for FileDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDownload")
            .field("sandbox", &self.id)
            .finish()
    }
}

/// What a download reads.
enum Download {
    File,
    Tar,
}

impl FileDownload {
    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, NodeError>> {
        self.reader.next().await.map(|r| {
            r.map_err(|e| {
                // Bytes were sent: the transfer can only be cut, so say why here.
                tracing::warn!(sandbox = %self.id, error = %e, "download cut short");
                NodeError::runtime(&self.id, e)
            })
        })
    }
}

/// Files in the sandboxes of the manager it holds: read, write, stat, list, mkdir, remove,
/// chmod, and tar transfers. Owns nothing of its own: every change goes through the
/// manager's step runner. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Files {
    pub(super) sandboxes: Manager,
}

impl Files {
    /// Files in the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Manager) -> Files {
        Files { sandboxes }
    }

    /// `GET /v1/sandboxes/{id}/files`. Not-found and not-a-file errors come back here, before
    /// any byte is sent.
    pub async fn read_file(&self, id: &SandboxId, path: &str) -> Result<FileDownload, NodeError> {
        self.download(id, path, Download::File).await
    }

    /// `GET /v1/sandboxes/{id}/files/tar`: a directory tree (or one file) as a tar stream.
    /// Not-found errors come back here, before any byte is sent.
    pub async fn read_tar(&self, id: &SandboxId, path: &str) -> Result<FileDownload, NodeError> {
        self.download(id, path, Download::Tar).await
    }

    /// Opens `path` for reading, as one file or as a tar stream, while the sandbox is kept
    /// ready (and counted active) until the download is dropped.
    async fn download(
        &self,
        id: &SandboxId,
        path: &str,
        what: Download,
    ) -> Result<FileDownload, NodeError> {
        let path = sandbox_path(path)?;
        let (instance, _, guard) = self.sandboxes.ready(id).await?;
        let agent = instance.agent();
        let reader = match what {
            Download::File => agent.read_file(&path).await,
            Download::Tar => agent.read_tar(&path).await,
        }
        .map_err(|e| NodeError::runtime(id, e))?;
        Ok(FileDownload {
            reader,
            id: id.clone(),
            _guard: guard,
        })
    }

    /// `PUT /v1/sandboxes/{id}/files/tar`: unpacks the tar stream `body` under the directory
    /// `path` (made when missing) as it arrives. Entries that would leave `path` are refused.
    pub async fn write_tar<S, E>(
        &self,
        id: &SandboxId,
        path: &str,
        mut body: S,
    ) -> Result<(), NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let path = sandbox_path(path)?;
        let mut run = match self.sandboxes.begin::<Effect>(id, None, None).await? {
            Begun::Replay(_) => {
                return Err(ApiError::internal("an upload without a step was replayed").into())
            }
            Begun::Run(run) => run,
        };
        let mut hashed = Hashed::keeping(run.room_left());
        let (instance, _, _busy) = run.ready().await?;
        let opened = instance.agent().write_tar(&path).await;
        let outcome = match pour(opened, &mut body, &mut hashed).await {
            Poured::Done(outcome) => outcome,
            Poured::Interrupted(e) => {
                run.cancel(hashed.tar_call(&path)).await;
                return Err(e);
            }
        };
        let outcome = outcome.map_err(|e| NodeError::runtime(id, e));
        run.feed(Some(hashed.fed()));
        run.finish(hashed.tar_call(&path), outcome).await?;
        Ok(())
    }

    /// `PUT /v1/sandboxes/{id}/files`: writes `body` to a new file beside `path`, chunk by
    /// chunk (any size; nothing is held beyond one chunk), and renames it over `path` at the
    /// end, so a failed upload leaves no partial file. A known `size` is checked against the
    /// sandbox's free space before anything is written. True when the step was replayed (then
    /// nothing was written).
    pub async fn write_file<S, E>(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        size: Option<u64>,
        step: Option<u64>,
        mut body: S,
    ) -> Result<bool, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let path = sandbox_path(path)?;
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let mut hashed = Hashed::new();
        let mut run = match self.sandboxes.begin::<Effect>(id, step, None).await? {
            Begun::Replay(known) => {
                hashed.drain(&mut body).await?;
                known.answer(&request_digest(&hashed.call(&path, mode)))?;
                return Ok(true);
            }
            Begun::Run(run) => run,
        };
        hashed = Hashed::keeping(run.room_left());
        let (instance, _, _busy) = run.ready().await?;
        let opened = instance.agent().write_file(&path, mode, size).await;
        let outcome = match pour(opened, &mut body, &mut hashed).await {
            Poured::Done(outcome) => outcome,
            Poured::Interrupted(e) => {
                run.cancel(hashed.call(&path, mode)).await;
                return Err(e);
            }
        };
        let outcome = outcome.map_err(|e| NodeError::runtime(id, e));
        run.feed(Some(hashed.fed()));
        run.finish(hashed.call(&path, mode), outcome).await?;
        Ok(false)
    }

    /// `GET /v1/sandboxes/{id}/files/stat`.
    pub async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, NodeError> {
        let path = sandbox_path(path)?;
        let (instance, _, _guard) = self.sandboxes.ready(id).await?;
        instance
            .agent()
            .stat(&path)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `GET /v1/sandboxes/{id}/files/list`: one page, in name order, after the name `after`.
    pub async fn list_dir(
        &self,
        id: &SandboxId,
        path: &str,
        after: Option<&str>,
        limit: Option<u32>,
    ) -> Result<DirPage, NodeError> {
        let path = sandbox_path(path)?;
        if let Some(a) = after {
            if a.is_empty() || a.len() > 1024 || a.contains(['/', '\0']) {
                return Err(ApiError::invalid(
                    "after must be a file name (1-1024 bytes, no '/' or NUL)",
                )
                .into());
            }
        }
        if let Some(l) = limit {
            if l == 0 || l as usize > MAX_LIST_ENTRIES {
                return Err(ApiError::invalid(format!(
                    "limit must be between 1 and {MAX_LIST_ENTRIES}"
                ))
                .into());
            }
        }
        let (instance, _, _guard) = self.sandboxes.ready(id).await?;
        let (entries, next) = instance
            .agent()
            .list(&path, after, limit)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(DirPage { entries, next })
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`. True when the step was replayed.
    pub async fn mkdir(
        &self,
        id: &SandboxId,
        path: &str,
        parents: bool,
        mode: Option<u32>,
        step: Option<u64>,
    ) -> Result<bool, NodeError> {
        let path = sandbox_path(path)?;
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let call = TrajectoryCall::Mkdir {
            path: path.clone(),
            parents,
            mode,
        };
        let sid = id.clone();
        let ran = self
            .sandboxes
            .logged::<Effect, _, _>(id, step, call, move |instance, _| async move {
                instance
                    .agent()
                    .mkdir(&path, parents, mode)
                    .await
                    .map_err(|e| NodeError::runtime(&sid, e))
            })
            .await?;
        Ok(ran.replayed)
    }

    /// `DELETE /v1/sandboxes/{id}/files`. True when the step was replayed.
    pub async fn remove(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
        step: Option<u64>,
    ) -> Result<bool, NodeError> {
        let path = sandbox_path(path)?;
        if path == "/" {
            return Err(ApiError::new(
                warren_types::ErrorCode::InvalidPath,
                "refusing to remove the sandbox's root",
            )
            .into());
        }
        let call = TrajectoryCall::Remove {
            path: path.clone(),
            recursive,
        };
        let sid = id.clone();
        let ran = self
            .sandboxes
            .logged::<Effect, _, _>(id, step, call, move |instance, _| async move {
                instance
                    .agent()
                    .remove(&path, recursive)
                    .await
                    .map_err(|e| NodeError::runtime(&sid, e))
            })
            .await?;
        Ok(ran.replayed)
    }

    /// `POST /v1/sandboxes/{id}/files/chmod`. True when the step was replayed.
    pub async fn chmod(
        &self,
        id: &SandboxId,
        path: &str,
        mode: u32,
        step: Option<u64>,
    ) -> Result<bool, NodeError> {
        let path = sandbox_path(path)?;
        if mode > 0o7777 {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let call = TrajectoryCall::Chmod {
            path: path.clone(),
            mode,
        };
        let sid = id.clone();
        let ran = self
            .sandboxes
            .logged::<Effect, _, _>(id, step, call, move |instance, _| async move {
                instance
                    .agent()
                    .chmod(&path, mode)
                    .await
                    .map_err(|e| NodeError::runtime(&sid, e))
            })
            .await?;
        Ok(ran.replayed)
    }
}
