//! Function routes: one-shot calls in warm pools, and the pools' stats.

use axum::extract::State;
use axum::Json;
use warren_types::{CallRequest, CallResult, PoolsInfo};

use super::error::HttpResult;
use super::extract::{Auth, JsonBody};
use crate::functions::Functions;

pub async fn call(
    State(f): State<Functions>,
    State(images): State<crate::images::Images>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<CallRequest>,
) -> HttpResult<Json<CallResult>> {
    images
        .check_usable(&caller, &req.image.refs(), crate::images::Usage::Call)
        .await?;
    Ok(Json(f.call_as(&caller, req).await?))
}

/// A tenant sees its own pools; admins see every pool.
pub async fn pools(State(f): State<Functions>, Auth(caller): Auth) -> Json<PoolsInfo> {
    Json(f.info_for(caller.scope()))
}
