//! Function routes: one-shot calls in warm pools, and the pools' stats.

use axum::extract::State;
use axum::Json;
use warren_types::{CallRequest, CallResult, PoolsInfo};

use super::error::HttpResult;
use super::extract::{Auth, JsonBody};
use crate::manager::Manager;

pub async fn call(
    State(m): State<Manager>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<CallRequest>,
) -> HttpResult<Json<CallResult>> {
    Ok(Json(m.call_function(&caller, req).await?))
}

/// A tenant sees its own pools; admins see every pool.
pub async fn pools(State(m): State<Manager>, Auth(caller): Auth) -> Json<PoolsInfo> {
    Json(m.functions().info_for(caller.scope()))
}
