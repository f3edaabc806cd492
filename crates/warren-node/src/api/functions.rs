//! Function routes: one-shot calls in warm pools, and the pools' stats.

use axum::extract::State;
use axum::Json;
use warren_types::{CallRequest, CallResult, PoolsInfo};

use super::error::HttpResult;
use super::extract::JsonBody;
use crate::functions::Functions;

pub async fn call(
    State(f): State<Functions>,
    JsonBody(req): JsonBody<CallRequest>,
) -> HttpResult<Json<CallResult>> {
    Ok(Json(f.call(req).await.map_err(crate::NodeError::Api)?))
}

pub async fn pools(State(f): State<Functions>) -> Json<PoolsInfo> {
    Json(f.info())
}
