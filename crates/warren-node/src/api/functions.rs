//! Function routes: one-shot calls in warm pools, and the pools' stats.

use axum::extract::State;
use axum::Json;
use warren_types::{CallRequest, CallResult, PoolsInfo};

use super::error::HttpResult;
use super::extract::JsonBody;
use crate::manager::Manager;

pub async fn call(
    State(m): State<Manager>,
    JsonBody(req): JsonBody<CallRequest>,
) -> HttpResult<Json<CallResult>> {
    let cfg = m.config();
    let r = m
        .functions()
        .call(req, &cfg.defaults, &cfg.bounds)
        .await
        .map_err(crate::NodeError::Api)?;
    Ok(Json(r))
}

pub async fn pools(State(m): State<Manager>) -> Json<PoolsInfo> {
    Json(m.functions().info())
}
