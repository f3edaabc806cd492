//! Trajectories read from the trajectory store (`--trajectory-store`): the answer to
//! `GET /v1/sandboxes/{id}/trajectory` when the sandbox's node is lost, does not answer, or
//! no longer has the sandbox (deleted). The store holds each trajectory's tenant; a user
//! sees only its own tenant's, exactly as on the node.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_blob::trajectory::{ndjson, TrajectoryPages, TrajectoryStoreError};
use warren_types::{Caller, SandboxId};

use crate::Gateway;

/// A trajectory read the store could answer: the sandbox, the first seq and the caller.
#[derive(Debug)]
pub struct Read {
    id: SandboxId,
    from_seq: u64,
    caller: Caller,
}

/// The read `req` asks for, when it is a trajectory export and the gateway has a store.
pub fn wanted(gw: &Gateway, req: &Request) -> Option<Read> {
    gw.config().trajectory_store.as_ref()?;
    if req.method() != Method::GET {
        return None;
    }
    let id = req
        .uri()
        .path()
        .strip_prefix("/v1/sandboxes/")?
        .strip_suffix("/trajectory")?
        .parse()
        .ok()?;
    let mut from_seq = 1;
    for (k, v) in form_pairs(req.uri().query().unwrap_or("")) {
        match k.as_str() {
            "from_seq" => from_seq = v.parse().ok()?,
            // Anything else is the node's to refuse.
            _ => return None,
        }
    }
    let caller = req
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::admin);
    Some(Read {
        id,
        from_seq,
        caller,
    })
}

fn form_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// True when the node's answer leaves the store to try: the sandbox is not there (404),
/// its node is lost (410) or did not answer (502, 503, 504).
pub fn falls_back(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::NOT_FOUND
            | StatusCode::GONE
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The trajectory from the store, or `node_answer` when the store has none the caller may
/// see (or cannot be read).
pub async fn answer(gw: &Gateway, read: Read, node_answer: Response) -> Response {
    let Some(store) = gw.config().trajectory_store.clone() else {
        return node_answer;
    };
    match TrajectoryPages::open(store, &read.id, read.from_seq, &read.caller).await {
        Ok(pages) => (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(ndjson(pages)),
        )
            .into_response(),
        Err(TrajectoryStoreError::NotFound(_)) => node_answer,
        Err(e) => {
            tracing::warn!(sandbox = %read.id, error = %e, "cannot read the trajectory store");
            node_answer
        }
    }
}
