//! File routes: streamed download and upload, remove, stat, list, mkdir, chmod. The routes
//! that change files take `?step=N` (see the trajectory log).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warren_types::files::DirPage;
use warren_types::validate::sandbox_path;
use warren_types::{ChmodRequest, FileStat, MkdirRequest};

use super::error::HttpResult;
use super::exec::mark_replayed;
use super::extract::{JsonBody, QueryPairs, RawBody, SandboxParam};
use crate::manager::{Files, Manager};

fn step(q: &QueryPairs) -> HttpResult<Option<u64>> {
    q.index("step", "a step number")
}

fn done(replayed: bool) -> Response {
    mark_replayed(StatusCode::NO_CONTENT.into_response(), replayed)
}

fn path_query(q: &QueryPairs, allowed: &[&str]) -> HttpResult<String> {
    q.only(allowed, &[])?;
    Ok(sandbox_path(q.required("path")?)?)
}

pub async fn download(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path"])?;
    let file = files.read_file(&id, &path).await?;
    Ok(stream_out(file, "application/octet-stream"))
}

/// `GET .../files/tar?path=`: a directory tree (or one file) as a tar stream.
pub async fn download_tar(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path"])?;
    let file = files.read_tar(&id, &path).await?;
    Ok(stream_out(file, "application/x-tar"))
}

/// `PUT .../files/tar?path=`: unpacks the tar body under the directory `path`.
pub async fn upload_tar(
    State(m): State<Manager>,
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    headers: header::HeaderMap,
    body: RawBody,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path"])?;
    fits_disk(&m, &id, content_length(&headers))?;
    let body = super::extract::non_empty(body, "a tar archive").await?;
    files.write_tar(&id, &path, body).await?;
    Ok(done(false))
}

fn stream_out(file: crate::manager::FileDownload, content_type: &'static str) -> Response {
    let chunks = futures::stream::unfold(file, |mut file| async move {
        match file.next().await? {
            Ok(b) => Some((Ok::<Bytes, std::io::Error>(b), file)),
            // An error after the first byte can only abort the transfer.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), file)),
        }
    });
    (
        [(header::CONTENT_TYPE, content_type)],
        Body::from_stream(chunks),
    )
        .into_response()
}

pub async fn upload(
    State(m): State<Manager>,
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    headers: header::HeaderMap,
    body: RawBody,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path", "mode", "step", "size"])?;
    let mode = q.parsed::<u32>("mode", "a decimal permission number (e.g. 420 for 0o644)")?;
    // The body's length, when known (`size`, else Content-Length): a body larger than the
    // sandbox's whole writable layer cannot fit and is refused before anything is written;
    // the agent checks it against the free space too, and a body of another length fails.
    let size = match q.parsed::<u64>("size", "the body's length in bytes")? {
        Some(n) => Some(n),
        None => content_length(&headers),
    };
    fits_disk(&m, &id, size)?;
    let replayed = files
        .write_file(&id, &path, mode, size, step(&q)?, body.into_data_stream())
        .await?;
    Ok(done(replayed))
}

fn content_length(headers: &header::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Refuses a body announced larger than the sandbox's whole writable layer before anything
/// is written (bodies without a length stop at the layer's limit).
fn fits_disk(m: &Manager, id: &warren_types::SandboxId, size: Option<u64>) -> HttpResult<()> {
    if let Some(len) = size {
        let disk = m.get(id)?.limits.disk_mb;
        if len > disk << 20 {
            return Err(warren_types::ApiError::new(
                warren_types::ErrorCode::LimitExceeded,
                format!(
                    "the upload is {len} bytes; the sandbox's writable layer holds at most \
                     {disk} MiB (disk_mb)"
                ),
            )
            .into());
        }
    }
    Ok(())
}

pub async fn remove(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path", "recursive", "step"])?;
    let replayed = files
        .remove(&id, &path, q.flag("recursive")?, step(&q)?)
        .await?;
    Ok(done(replayed))
}

pub async fn stat(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Json<FileStat>> {
    let path = path_query(&q, &["path"])?;
    Ok(Json(files.stat(&id, &path).await?))
}

pub async fn list(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Json<DirPage>> {
    let path = path_query(&q, &["path", "after", "limit"])?;
    let limit = q.parsed::<u32>("limit", "a number of entries")?;
    let after = q.get("after");
    Ok(Json(files.list_dir(&id, &path, after, limit).await?))
}

pub async fn mkdir(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    JsonBody(req): JsonBody<MkdirRequest>,
) -> HttpResult<Response> {
    q.only(&["step"], &[])?;
    let path = sandbox_path(&req.path)?;
    let replayed = files
        .mkdir(&id, &path, req.parents, req.mode, step(&q)?)
        .await?;
    Ok(done(replayed))
}

pub async fn chmod(
    State(files): State<Files>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    JsonBody(req): JsonBody<ChmodRequest>,
) -> HttpResult<Response> {
    q.only(&["step"], &[])?;
    let path = sandbox_path(&req.path)?;
    let replayed = files.chmod(&id, &path, req.mode, step(&q)?).await?;
    Ok(done(replayed))
}
