//! The part of the node API a simulated node answers: health, create, get, list (labels,
//! state, `limit`/`after` pages), delete, and an exec that runs nothing and exits 0. Every
//! other route answers `501` with code `unsupported_substrate`, saying it is simulated.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use warren_types::{
    ApiError, CreateSandboxRequest, ErrorBody, ErrorCode, ExecResult, SandboxInfo, SandboxState,
};

use crate::node::SimNode;

type St = State<Arc<SimNode>>;

pub fn router(node: Arc<SimNode>) -> Router {
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(get_one).delete(delete))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .fallback(unsupported)
        .with_state(node)
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let retry = e.retry_after;
    let mut resp = (status, Json(ErrorBody { error: e })).into_response();
    if let Some(s) = retry {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

fn not_found(id: &str) -> Response {
    error(ApiError::new(
        ErrorCode::NotFound,
        format!("no sandbox {id}"),
    ))
}

async fn health(State(n): St) -> Response {
    Json(serde_json::json!({
        "status": "ok",
        "node": n.id.as_str(),
        "version": format!("{}-simulated", env!("CARGO_PKG_VERSION")),
        "substrates": ["container"],
        "sandboxes": n.sandbox_count(),
        "simulated": true,
    }))
    .into_response()
}

async fn create(State(n): St, body: axum::body::Bytes) -> Response {
    let req: CreateSandboxRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(ApiError::invalid(format!("bad create request: {e}"))),
    };
    match n.create(req).await {
        Ok((sb, true)) => (StatusCode::CREATED, Json(sb)).into_response(),
        Ok((sb, false)) => (StatusCode::OK, Json(sb)).into_response(),
        Err(e) => error(e),
    }
}

#[derive(Serialize)]
struct SandboxList {
    sandboxes: Vec<SandboxInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<String>,
}

/// Percent-decodes one query component (`+` is a space); bad escapes stay as they are.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn list(State(n): St, RawQuery(q): RawQuery) -> Response {
    let mut labels = Vec::new();
    let mut state = None;
    let mut after = None;
    let mut limit = None;
    for pair in q
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = decode(v);
        match k {
            "label" => match v.split_once('=') {
                Some((lk, lv)) => labels.push((lk.to_string(), lv.to_string())),
                None => return error(ApiError::invalid(format!("label must be k=v, got {v:?}"))),
            },
            "state" => match SandboxState::parse(&v) {
                Some(s) => state = Some(s),
                None => return error(ApiError::invalid(format!("unknown state {v:?}"))),
            },
            "after" => match v.split_once('-') {
                Some((_, ulid)) => after = Some(ulid.to_string()),
                None => return error(ApiError::invalid(format!("after: not a sandbox id {v:?}"))),
            },
            "limit" => match v.parse::<usize>() {
                Ok(l) if (1..=100_000).contains(&l) => limit = Some(l),
                _ => {
                    return error(ApiError::invalid(format!(
                        "limit must be 1 to 100000, got {v:?}"
                    )))
                }
            },
            _ => {}
        }
    }
    let (sandboxes, cut) = n.list(&labels, state, after.as_deref(), limit);
    let next_after = if cut {
        sandboxes.last().map(|s| s.id.clone())
    } else {
        None
    };
    Json(SandboxList {
        sandboxes,
        next_after,
    })
    .into_response()
}

async fn get_one(State(n): St, Path(id): Path<String>) -> Response {
    match n.get(&id) {
        Some(sb) => Json(sb).into_response(),
        None => not_found(&id),
    }
}

async fn delete(State(n): St, Path(id): Path<String>) -> Response {
    if n.delete(&id) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        not_found(&id)
    }
}

async fn exec(State(n): St, Path(id): Path<String>) -> Response {
    if n.get(&id).is_none() {
        return not_found(&id);
    }
    Json(ExecResult {
        exit_code: Some(0),
        ..Default::default()
    })
    .into_response()
}

async fn unsupported() -> Response {
    error(ApiError::new(
        ErrorCode::UnsupportedSubstrate,
        "a simulated node answers health, create, get, list, delete and exec only",
    ))
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_components_decode() {
        assert_eq!(decode("run%3D1"), "run=1");
        assert_eq!(decode("a+b%2"), "a b%2");
        assert_eq!(decode("%zz"), "%zz");
        assert_eq!(decode("x%"), "x%");
    }
}
