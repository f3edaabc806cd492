//! `GET/PUT /v1/sandboxes/{id}/network`: a sandbox's network policy.

use axum::extract::State;
use axum::Json;
use warren_types::{ApiError, NetworkPolicy, NetworkStatus};

use super::error::HttpResult;
use super::extract::{JsonBody, SandboxParam};
use crate::manager::Manager;

pub async fn get(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<NetworkStatus>> {
    Ok(Json(m.get_network(&id)?))
}

pub async fn put(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(policy): JsonBody<NetworkPolicy>,
) -> HttpResult<Json<NetworkStatus>> {
    // Runs to completion even if the client goes away: half-applied policies do not exist,
    // but the recorded policy must match the rules.
    let status = tokio::spawn(async move { m.set_network_policy(&id, policy).await })
        .await
        .map_err(|e| ApiError::internal(format!("network task: {e}")))??;
    Ok(Json(status))
}
