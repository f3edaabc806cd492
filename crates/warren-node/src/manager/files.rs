//! Files: streamed download and upload, stat, list, mkdir, remove, chmod. Every path is
//! checked with [`warren_types::validate::sandbox_path`] (the agent resolves it again inside
//! the sandbox's root, so this is a first line, not the only one).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use warren_runtime::FileReader;
use warren_types::validate::sandbox_path;
use warren_types::{ApiError, FileStat, SandboxId};

use super::{ActivityGuard, Manager};
use crate::error::NodeError;

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

impl FileDownload {
    /// The next chunk; `None` at the end.
    pub async fn next(&mut self) -> Option<Result<Bytes, NodeError>> {
        self.reader
            .next()
            .await
            .map(|r| r.map_err(|e| NodeError::runtime(&self.id, e)))
    }
}

impl Manager {
    /// `GET /v1/sandboxes/{id}/files`. Not-found and not-a-file errors come back here, before
    /// any byte is sent.
    pub async fn read_file(&self, id: &SandboxId, path: &str) -> Result<FileDownload, NodeError> {
        let path = sandbox_path(path)?;
        let (instance, _, guard) = self.running(id)?;
        let reader = instance
            .agent()
            .read_file(&path)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(FileDownload {
            reader,
            id: id.clone(),
            _guard: guard,
        })
    }

    /// `PUT /v1/sandboxes/{id}/files`: creates or truncates `path` and writes `body` to it
    /// chunk by chunk (any size; nothing is held beyond one chunk).
    pub async fn write_file<S, E>(
        &self,
        id: &SandboxId,
        path: &str,
        mode: Option<u32>,
        mut body: S,
    ) -> Result<(), NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let path = sandbox_path(path)?;
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let (instance, _, _guard) = self.running(id)?;
        let mut w = instance
            .agent()
            .write_file(&path, mode)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        while let Some(chunk) = body.next().await {
            // Dropping the writer on an interrupted upload cancels it inside the sandbox.
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("upload interrupted: {e}")))?;
            if !chunk.is_empty() {
                w.write(chunk)
                    .await
                    .map_err(|e| NodeError::runtime(id, e))?;
            }
        }
        w.finish().await.map_err(|e| NodeError::runtime(id, e))
    }

    /// `GET /v1/sandboxes/{id}/files/stat`.
    pub async fn stat(&self, id: &SandboxId, path: &str) -> Result<FileStat, NodeError> {
        let path = sandbox_path(path)?;
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .stat(&path)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `GET /v1/sandboxes/{id}/files/list`.
    pub async fn list_dir(&self, id: &SandboxId, path: &str) -> Result<Vec<FileStat>, NodeError> {
        let path = sandbox_path(path)?;
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .list(&path)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    pub async fn mkdir(
        &self,
        id: &SandboxId,
        path: &str,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<(), NodeError> {
        let path = sandbox_path(path)?;
        if mode.is_some_and(|m| m > 0o7777) {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .mkdir(&path, parents, mode)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `DELETE /v1/sandboxes/{id}/files`.
    pub async fn remove(
        &self,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<(), NodeError> {
        let path = sandbox_path(path)?;
        if path == "/" {
            return Err(ApiError::new(
                warren_types::ErrorCode::InvalidPath,
                "refusing to remove the sandbox's root",
            )
            .into());
        }
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .remove(&path, recursive)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }

    /// `POST /v1/sandboxes/{id}/files/chmod`.
    pub async fn chmod(&self, id: &SandboxId, path: &str, mode: u32) -> Result<(), NodeError> {
        let path = sandbox_path(path)?;
        if mode > 0o7777 {
            return Err(ApiError::invalid("mode must be at most 0o7777 (4095)").into());
        }
        let (instance, _, _guard) = self.running(id)?;
        instance
            .agent()
            .chmod(&path, mode)
            .await
            .map_err(|e| NodeError::runtime(id, e))
    }
}
