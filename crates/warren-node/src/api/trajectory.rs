//! `GET /v1/sandboxes/{id}/trajectory?from_seq=N`: the sandbox's trajectory as
//! newline-delimited JSON, one entry per line, streamed page by page. A sandbox that is not
//! on this node (deleted, or on a node that was lost) is read from the trajectory store
//! when the node ships there, as the caller's tenant may see it.

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::HttpResult;
use super::extract::{Auth, QueryPairs, RawSandboxParam};
use crate::error::NodeError;
use crate::manager::{Manager, Trajectories};

pub async fn export(
    State(m): State<Manager>,
    State(trajectories): State<Trajectories>,
    Auth(caller): Auth,
    RawSandboxParam(id): RawSandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    q.only(&["from_seq"], &[])?;
    let from = q.index("from_seq", "a sequence number")?.unwrap_or(1);
    let here = m
        .authorize(&caller, &id)
        .and_then(|()| trajectories.trajectory(&m, &id, from));
    let body = match here {
        Ok(pages) => Body::from_stream(pages.into_stream()),
        Err(NodeError::SandboxNotFound { .. }) if trajectories.ships_trajectories() => {
            let pages = trajectories.shipped_trajectory(&id, from, &caller).await?;
            Body::from_stream(warren_blob::trajectory::ndjson(pages))
        }
        Err(e) => return Err(e.into()),
    };
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response())
}
