//! `GET/PUT /v1/sandboxes/{id}/network`: a sandbox's network policy.

use axum::extract::State;
use axum::Json;
use warren_types::{ApiError, NetworkPolicy, NetworkStatus};

use super::error::HttpResult;
use super::extract::{JsonBody, SandboxParam};
use crate::manager::{Manager, SandboxNetwork};

pub async fn get(
    State(m): State<Manager>,
    State(network): State<SandboxNetwork>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<NetworkStatus>> {
    Ok(Json(network.status_of(&m, &id)?))
}

pub async fn put(
    State(m): State<Manager>,
    State(network): State<SandboxNetwork>,
    SandboxParam(id): SandboxParam,
    JsonBody(policy): JsonBody<NetworkPolicy>,
) -> HttpResult<Json<NetworkStatus>> {
    // Runs to completion even if the client goes away: half-applied policies do not exist,
    // but the recorded policy must match the rules.
    let status = tokio::spawn(async move { network.set_policy(&m, &id, policy).await })
        .await
        .map_err(|e| ApiError::internal(format!("network task: {e}")))??;
    Ok(Json(status))
}
