//! `POST /v1/sandboxes/{id}/snapshot`, `GET /v1/snapshots`, `GET`/`DELETE /v1/snapshots/{id}`
//! (see `manager::snapshots`). A create from a snapshot is `POST /v1/sandboxes` with
//! `snapshot`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use warren_types::{CreateSnapshotRequest, SnapshotId, SnapshotInfo, SnapshotList};

use super::error::HttpResult;
use super::extract::{Auth, OptionalJsonBody, SandboxParam};
use super::sandboxes::detached;
use crate::manager::{Manager, Snapshots};

/// The snapshot id of the path, checked.
fn snapshot_id(raw: &str) -> HttpResult<String> {
    let id: SnapshotId = raw
        .parse()
        .map_err(|e: warren_types::id::IdError| warren_types::ApiError::invalid(e.to_string()))?;
    Ok(id.to_string())
}

pub async fn create(
    State(m): State<Manager>,
    State(snapshots): State<Snapshots>,
    Auth(caller): Auth,
    SandboxParam(id): SandboxParam,
    OptionalJsonBody(req): OptionalJsonBody<CreateSnapshotRequest>,
) -> HttpResult<(StatusCode, Json<SnapshotInfo>)> {
    // Like fork: once started it finishes even if the client goes away.
    let info = detached("snapshot", async move {
        snapshots.snapshot_as(&m, &caller, &id, req).await
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn list(State(snapshots): State<Snapshots>, Auth(caller): Auth) -> Json<SnapshotList> {
    Json(SnapshotList {
        snapshots: snapshots.list_as(&caller),
    })
}

pub async fn get(
    State(snapshots): State<Snapshots>,
    Auth(caller): Auth,
    Path(raw): Path<String>,
) -> HttpResult<Json<SnapshotInfo>> {
    let id = snapshot_id(&raw)?;
    Ok(Json(snapshots.info_as(&caller, &id)?))
}

pub async fn delete(
    State(m): State<Manager>,
    State(snapshots): State<Snapshots>,
    Auth(caller): Auth,
    Path(raw): Path<String>,
) -> HttpResult<StatusCode> {
    let id = snapshot_id(&raw)?;
    detached("delete snapshot", async move {
        snapshots.delete_as(&m, &caller, &id).await
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}
