//! Function routes: one-shot calls in warm pools.

use hyper::Method;
use warren_types::{CallRequest, CallResult, PoolsInfo};

use crate::client::{runs_for_secs, Client};
use crate::error::ClientError;
use crate::failover::Retry;

impl Client {
    /// `POST /v1/functions/call`: runs one stateless command in a warm container of the
    /// request's image and returns its outputs and requested files. A saturated pool answers
    /// [`crate::ErrorCode::Busy`] with `retry_after`.
    pub async fn call(&self, req: &CallRequest) -> Result<CallResult, ClientError> {
        self.call_json_as(
            Retry::for_method(&Method::POST),
            Method::POST,
            "/v1/functions/call",
            Some(req),
            "the call result",
            runs_for_secs(req.timeout_secs),
        )
        .await
    }

    /// `POST /run_code`: SandboxFusion's code runner, with the protocol's JSON as it is
    /// (the answer's `status` says whether the program succeeded).
    pub async fn run_code(
        &self,
        req: &serde_json::Value,
    ) -> Result<serde_json::Value, ClientError> {
        self.call_json(Method::POST, "/run_code", Some(req), "the run_code answer")
            .await
    }

    /// `GET /v1/functions/pools`.
    pub async fn function_pools(&self) -> Result<PoolsInfo, ClientError> {
        self.call_json(Method::GET, "/v1/functions/pools", None::<&()>, "the pools")
            .await
    }
}
