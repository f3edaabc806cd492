//! File routes: streamed read and write, stat, list, mkdir, remove, chmod, and helpers that
//! copy between a local path and a sandbox path without holding the file in memory.

use std::path::Path;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWriteExt};
use warren_types::{ChmodRequest, FileStat, MkdirRequest};

use crate::client::{empty_body, enc, full_body, seg, Body, Client, Payload, OCTET_STREAM};
use crate::error::{BoxError, ClientError};
use crate::stream::ByteStream;

/// Chunk size used when streaming a local reader into an upload.
const UPLOAD_CHUNK: usize = 256 << 10;

#[derive(Deserialize)]
struct DirList {
    entries: Vec<FileStat>,
}

fn files_path(id: &str, suffix: &str, path: &str) -> String {
    format!("/v1/sandboxes/{}/files{suffix}?path={}", seg(id), enc(path))
}

impl Client {
    /// `GET /v1/sandboxes/{id}/files?path=`: the file's bytes as a stream.
    pub async fn read_file(&self, id: &str, path: &str) -> Result<ByteStream, ClientError> {
        let reply = self
            .send(Method::GET, &files_path(id, "", path), empty_body(), None)
            .await?;
        Ok(reply.into_stream())
    }

    /// Reads a whole (small) file into memory.
    pub async fn read_file_bytes(&self, id: &str, path: &str) -> Result<Bytes, ClientError> {
        self.read_file(id, path).await?.collect_bytes().await
    }

    /// `PUT /v1/sandboxes/{id}/files?path=&mode=`: creates or truncates the file and streams
    /// `body` into it. Any size; only one chunk is held at a time.
    pub async fn write_file<S, E>(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        body: S,
    ) -> Result<(), ClientError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let frames = body
            .map_ok(Frame::data)
            .map_err(|e| std::io::Error::other(e.into()));
        let body: Body = StreamBody::new(frames).boxed_unsync();
        self.put_file(id, path, mode, Payload::stream(body)).await
    }

    /// Streams any [`AsyncRead`] into a sandbox file.
    pub async fn write_file_from<R>(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        reader: R,
    ) -> Result<(), ClientError>
    where
        R: AsyncRead + Send + 'static,
    {
        let chunks = tokio_util::io::ReaderStream::with_capacity(reader, UPLOAD_CHUNK);
        self.write_file(id, path, mode, chunks).await
    }

    /// Writes bytes held in memory to a sandbox file.
    pub async fn write_file_bytes(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        data: impl Into<Bytes>,
    ) -> Result<(), ClientError> {
        self.put_file(id, path, mode, full_body(data.into())).await
    }

    async fn put_file(
        &self,
        id: &str,
        path: &str,
        mode: Option<u32>,
        body: Payload,
    ) -> Result<(), ClientError> {
        let mut uri = files_path(id, "", path);
        if let Some(m) = mode {
            uri.push_str(&format!("&mode={m}"));
        }
        self.send(Method::PUT, &uri, body, Some(OCTET_STREAM))
            .await?
            .drain()
            .await
    }

    /// Streams a sandbox file into a local file (created or truncated) and returns the byte
    /// count. A partly written local file is removed on error.
    pub async fn download_to(
        &self,
        id: &str,
        remote: &str,
        local: impl AsRef<Path>,
    ) -> Result<u64, ClientError> {
        let local = local.as_ref();
        let mut stream = self.read_file(id, remote).await?;
        let mut file = tokio::fs::File::create(local)
            .await
            .map_err(|e| ClientError::io(format!("creating {}", local.display()), e))?;
        let copied = async {
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| ClientError::io(format!("writing {}", local.display()), e))?;
                n += chunk.len() as u64;
            }
            file.flush()
                .await
                .map_err(|e| ClientError::io(format!("writing {}", local.display()), e))?;
            Ok::<u64, ClientError>(n)
        }
        .await;
        if copied.is_err() {
            drop(file);
            let _ = tokio::fs::remove_file(local).await;
        }
        copied
    }

    /// Streams a local file into a sandbox file and returns the byte count. The sandbox file
    /// gets `mode`, or the local file's permission bits when `mode` is `None`.
    pub async fn upload_from(
        &self,
        id: &str,
        local: impl AsRef<Path>,
        remote: &str,
        mode: Option<u32>,
    ) -> Result<u64, ClientError> {
        use std::os::unix::fs::PermissionsExt;
        let local = local.as_ref();
        let file = tokio::fs::File::open(local)
            .await
            .map_err(|e| ClientError::io(format!("opening {}", local.display()), e))?;
        let meta = file
            .metadata()
            .await
            .map_err(|e| ClientError::io(format!("reading metadata of {}", local.display()), e))?;
        if meta.is_dir() {
            return Err(ClientError::io(
                format!("{} is a directory", local.display()),
                std::io::Error::from(std::io::ErrorKind::IsADirectory),
            ));
        }
        let mode = mode.unwrap_or(meta.permissions().mode() & 0o7777);
        let counted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = counted.clone();
        let chunks = tokio_util::io::ReaderStream::with_capacity(file, UPLOAD_CHUNK).inspect_ok(
            move |c: &Bytes| {
                counter.fetch_add(c.len() as u64, std::sync::atomic::Ordering::Relaxed);
            },
        );
        self.write_file(id, remote, Some(mode), chunks).await?;
        Ok(counted.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// `GET /v1/sandboxes/{id}/files/stat?path=` (symlinks are not followed).
    pub async fn stat(&self, id: &str, path: &str) -> Result<FileStat, ClientError> {
        self.call_json(
            Method::GET,
            &files_path(id, "/stat", path),
            None::<&()>,
            "the file stat",
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/files/list?path=`: the entries of a directory.
    pub async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileStat>, ClientError> {
        let list: DirList = self
            .call_json(
                Method::GET,
                &files_path(id, "/list", path),
                None::<&()>,
                "the listing",
            )
            .await?;
        Ok(list.entries)
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    pub async fn mkdir(
        &self,
        id: &str,
        path: &str,
        parents: bool,
        mode: Option<u32>,
    ) -> Result<(), ClientError> {
        let uri = format!("/v1/sandboxes/{}/files/mkdir", seg(id));
        let req = MkdirRequest {
            path: path.to_string(),
            parents,
            mode,
        };
        self.call_empty(Method::POST, &uri, Some(&req)).await
    }

    /// `DELETE /v1/sandboxes/{id}/files?path=&recursive=`.
    pub async fn remove(&self, id: &str, path: &str, recursive: bool) -> Result<(), ClientError> {
        let mut uri = files_path(id, "", path);
        if recursive {
            uri.push_str("&recursive=true");
        }
        self.call_empty(Method::DELETE, &uri, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/files/chmod`.
    pub async fn chmod(&self, id: &str, path: &str, mode: u32) -> Result<(), ClientError> {
        let uri = format!("/v1/sandboxes/{}/files/chmod", seg(id));
        let req = ChmodRequest {
            path: path.to_string(),
            mode,
        };
        self.call_empty(Method::POST, &uri, Some(&req)).await
    }
}
