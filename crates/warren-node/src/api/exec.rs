//! Command routes: exec, streamed exec (NDJSON), background processes.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use warren_types::{ExecRequest, ExecResult, ProcessInfo};

use futures::StreamExt;

use super::error::{HttpError, HttpResult};
use super::extract::{
    JsonBody, OptionalJsonBody, ProcessParam, QueryPairs, RawBody, SandboxParam, MAX_JSON_BODY,
};
use crate::manager::Processes;

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
    State(procs): State<Processes>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let r: ExecResult = procs.exec(&id, req).await?;
    let replayed = r.replayed;
    Ok(mark_replayed(Json(r).into_response(), replayed))
}

pub async fn exec_stream(
    State(procs): State<Processes>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let events = procs.exec_stream(&id, req).await?;
    Ok(ndjson(events))
}

/// Reads the first line of an attached exec's body: the request. Returns it and the bytes
/// after the newline (the start of stdin).
async fn attach_head(body: &mut axum::body::BodyDataStream) -> HttpResult<(ExecRequest, Bytes)> {
    let mut head: Vec<u8> = Vec::new();
    loop {
        let chunk = match body.next().await {
            Some(Ok(c)) => c,
            Some(Err(e)) => return Err(HttpError::invalid(format!("reading the body: {e}"))),
            None => {
                return Err(HttpError::invalid(
                    "the body must start with the exec request as one JSON line",
                ))
            }
        };
        if let Some(nl) = chunk.iter().position(|b| *b == b'\n') {
            head.extend_from_slice(&chunk[..nl]);
            let req = serde_json::from_slice::<ExecRequest>(&head).map_err(|e| {
                HttpError::invalid(format!("the exec request line is not valid: {e}"))
            })?;
            return Ok((req, chunk.slice(nl + 1..)));
        }
        head.extend_from_slice(&chunk);
        if head.len() > MAX_JSON_BODY {
            return Err(HttpError::invalid(format!(
                "the exec request line is longer than {MAX_JSON_BODY} bytes"
            )));
        }
    }
}

/// `POST /v1/sandboxes/{id}/exec/attach`: the body is the request as one JSON line, then the
/// command's stdin until the body ends (streamed, any bytes, any size); the response is the
/// NDJSON events of `/exec/stream`, sent while stdin is still coming.
pub async fn exec_attach(
    State(procs): State<Processes>,
    SandboxParam(id): SandboxParam,
    body: RawBody,
) -> HttpResult<Response> {
    let mut body = body.into_data_stream();
    let (req, first) = attach_head(&mut body).await?;
    let (events, mut sink) = procs.exec_attach(&id, req).await?;
    tokio::spawn(async move {
        if !first.is_empty() && sink.write(first).await.is_err() {
            return;
        }
        while let Some(chunk) = body.next().await {
            // A body cut off ends stdin like its end would; the command decides what that means.
            let Ok(chunk) = chunk else { break };
            if sink.write(chunk).await.is_err() {
                return;
            }
        }
        let _ = sink.close().await;
    });
    Ok(ndjson(events))
}

/// One JSON object per line; the client disconnecting drops the stream, which kills the
/// command (unless it runs as a step: then it runs on and is logged).
fn ndjson(events: crate::manager::ExecEvents) -> Response {
    let lines = futures::stream::unfold(events, |mut events| async move {
        let ev = events.next().await?;
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), events))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

pub async fn spawn(
    State(procs): State<Processes>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExecRequest>,
) -> HttpResult<Response> {
    let (p, replayed) = procs.spawn(&id, req).await?;
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
    State(procs): State<Processes>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<ProcessList>> {
    Ok(Json(ProcessList {
        processes: procs.list_procs(&id).await?,
    }))
}

pub async fn get_proc(
    State(procs): State<Processes>,
    ProcessParam(id, pid): ProcessParam,
) -> HttpResult<Json<ProcessInfo>> {
    Ok(Json(procs.get_proc(&id, pid).await?))
}

pub async fn wait_proc(
    State(procs): State<Processes>,
    ProcessParam(id, pid): ProcessParam,
    q: QueryPairs,
) -> HttpResult<Json<ExecResult>> {
    q.only(&["timeout_secs"], &[])?;
    let timeout = q.parsed::<f64>("timeout_secs", "a number of seconds")?;
    Ok(Json(procs.wait_proc(&id, pid, timeout).await?))
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
    State(procs): State<Processes>,
    ProcessParam(id, pid): ProcessParam,
    q: QueryPairs,
    OptionalJsonBody(req): OptionalJsonBody<KillRequest>,
) -> HttpResult<Response> {
    let step = q.only_step()?;
    let replayed = procs.kill_proc(&id, pid, req.signal, step).await?;
    Ok(mark_replayed(
        StatusCode::NO_CONTENT.into_response(),
        replayed,
    ))
}
