//! Command routes: exec, streamed exec (NDJSON), background processes.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use warren_types::{ExecRequest, ExecResult, ProcessInfo};

use super::error::HttpResult;
use super::extract::{JsonBody, OptionalJsonBody, ProcessParam, QueryPairs, SandboxParam};
use crate::manager::Manager;

/// Adds [`super::REPLAYED_HEADER`] when the call was answered from the log.
pub(crate) fn mark_replayed(mut resp: Response, replayed: bool) -> Response {
    if replayed {
        resp.headers_mut().insert(
            super::REPLAYED_HEADER,
            axum::http::HeaderValue::from_static("true"),
        );
    }
    resp
}

pub async fn exec(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let r: ExecResult = m.exec(&id, req).await?;
    let replayed = r.replayed;
    Ok(mark_replayed(Json(r).into_response(), replayed))
}

pub async fn exec_stream(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let events = m.exec_stream(&id, req).await?;
    // One JSON object per line; the client disconnecting drops the stream, which kills the
    // command (unless it runs as a step: then it runs on and is logged).
    let lines = futures::stream::unfold(events, |mut events| async move {
        let ev = events.next().await?;
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), events))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

pub async fn spawn(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let (p, replayed) = m.spawn(&id, req).await?;
    Ok(mark_replayed(
        (StatusCode::CREATED, Json(p)).into_response(),
        replayed,
    ))
}

#[derive(Debug, Serialize)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

pub async fn list_procs(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<ProcessList>> {
    Ok(Json(ProcessList {
        processes: m.list_procs(&id).await?,
    }))
}

pub async fn get_proc(
    State(m): State<Manager>,
    ProcessParam(id, pid): ProcessParam,
) -> HttpResult<Json<ProcessInfo>> {
    Ok(Json(m.get_proc(&id, pid).await?))
}

pub async fn wait_proc(
    State(m): State<Manager>,
    ProcessParam(id, pid): ProcessParam,
    q: QueryPairs,
) -> HttpResult<Json<ExecResult>> {
    q.only(&["timeout_secs"], &[])?;
    let timeout = q.parsed::<f64>("timeout_secs", "a number of seconds")?;
    Ok(Json(m.wait_proc(&id, pid, timeout).await?))
}

/// `POST .../kill` body; the signal defaults to 9 (SIGKILL).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    #[serde(default = "sigkill")]
    pub signal: i32,
}

fn sigkill() -> i32 {
    9
}

impl Default for KillRequest {
    fn default() -> Self {
        KillRequest { signal: sigkill() }
    }
}

pub async fn kill_proc(
    State(m): State<Manager>,
    ProcessParam(id, pid): ProcessParam,
    q: QueryPairs,
    OptionalJsonBody(req): OptionalJsonBody<KillRequest>,
) -> HttpResult<Response> {
    q.only(&["step"], &[])?;
    let step = q.parsed::<u64>("step", "a step number")?;
    let replayed = m.kill_proc(&id, pid, req.signal, step).await?;
    Ok(mark_replayed(
        StatusCode::NO_CONTENT.into_response(),
        replayed,
    ))
}
