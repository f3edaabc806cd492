//! File routes: streamed download and upload, remove, stat, list, mkdir, chmod.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use warren_types::validate::sandbox_path;
use warren_types::{ChmodRequest, FileStat, MkdirRequest};

use super::error::HttpResult;
use super::extract::{JsonBody, QueryPairs, RawBody, SandboxParam};
use crate::manager::Manager;

fn path_query(q: &QueryPairs, allowed: &[&str]) -> HttpResult<String> {
    q.only(allowed, &[])?;
    Ok(sandbox_path(q.required("path")?)?)
}

pub async fn download(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    let path = path_query(&q, &["path"])?;
    let file = m.read_file(&id, &path).await?;
    let chunks = futures::stream::unfold(file, |mut file| async move {
        match file.next().await? {
            Ok(b) => Some((Ok::<Bytes, std::io::Error>(b), file)),
            // An error after the first byte can only abort the transfer.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), file)),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(chunks),
    )
        .into_response())
}

pub async fn upload(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    body: RawBody,
) -> HttpResult<StatusCode> {
    let path = path_query(&q, &["path", "mode"])?;
    let mode = q.parsed::<u32>("mode", "a decimal permission number (e.g. 420 for 0o644)")?;
    m.write_file(&id, &path, mode, body.into_data_stream())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<StatusCode> {
    let path = path_query(&q, &["path", "recursive"])?;
    m.remove(&id, &path, q.flag("recursive")?).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn stat(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Json<FileStat>> {
    let path = path_query(&q, &["path"])?;
    Ok(Json(m.stat(&id, &path).await?))
}

#[derive(Debug, Serialize)]
pub struct Entries {
    pub entries: Vec<FileStat>,
}

pub async fn list(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Json<Entries>> {
    let path = path_query(&q, &["path"])?;
    Ok(Json(Entries {
        entries: m.list_dir(&id, &path).await?,
    }))
}

pub async fn mkdir(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<MkdirRequest>,
) -> HttpResult<StatusCode> {
    let path = sandbox_path(&req.path)?;
    m.mkdir(&id, &path, req.parents, req.mode).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn chmod(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ChmodRequest>,
) -> HttpResult<StatusCode> {
    let path = sandbox_path(&req.path)?;
    m.chmod(&id, &path, req.mode).await?;
    Ok(StatusCode::NO_CONTENT)
}
