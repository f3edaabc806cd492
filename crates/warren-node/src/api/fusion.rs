//! `POST /run_code` and `POST /run_jupyter`: SandboxFusion's code runner, served by the
//! function pools.
//!
//! The body is parsed and planned by `warren_fusion` into one function call, which runs
//! exactly as a `POST /v1/functions/call` of the same caller would (tenant pools, image
//! rights, limits, queueing); the result goes back in the protocol's shape. Refusals are in
//! the protocol's shape too (`{"detail": ...}` with Warren's `code` beside).

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use warren_fusion::{FusionError, JupyterPlan, Plan};
use warren_types::{CallRequest, CallResult};

use super::extract::Auth;
use crate::functions::Functions;
use crate::images::{Images, Usage};
use crate::Manager;

fn json(status: u16, body: Vec<u8>, retry_after: Option<u64>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    if let Some(r) = retry_after {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(r));
    }
    resp
}

fn refused(e: FusionError) -> Response {
    json(e.status(), e.body(), e.retry_after())
}

/// A request of the protocol as one call, and how its result is answered.
trait Planned: Sized {
    type Answer: Serialize;
    fn plan(body: &[u8]) -> Result<(Self, CallRequest), FusionError>;
    fn answer(&self, r: &CallResult, node: &str) -> Self::Answer;
}

impl Planned for Plan {
    type Answer = warren_fusion::RunCodeResponse;
    fn plan(body: &[u8]) -> Result<(Self, CallRequest), FusionError> {
        warren_fusion::parse(body).and_then(|r| Plan::new(&r))
    }
    fn answer(&self, r: &CallResult, node: &str) -> Self::Answer {
        Plan::answer(self, r, Some(node))
    }
}

impl Planned for JupyterPlan {
    type Answer = warren_fusion::RunJupyterResponse;
    fn plan(body: &[u8]) -> Result<(Self, CallRequest), FusionError> {
        warren_fusion::parse_jupyter(body).and_then(|r| JupyterPlan::new(&r))
    }
    fn answer(&self, r: &CallResult, node: &str) -> Self::Answer {
        JupyterPlan::answer(self, r, Some(node))
    }
}

pub async fn run_code(
    State(f): State<Functions>,
    State(images): State<Images>,
    State(m): State<Manager>,
    Auth(caller): Auth,
    req: Request,
) -> Response {
    run::<Plan>(f, images, m, caller, req).await
}

pub async fn run_jupyter(
    State(f): State<Functions>,
    State(images): State<Images>,
    State(m): State<Manager>,
    Auth(caller): Auth,
    req: Request,
) -> Response {
    run::<JupyterPlan>(f, images, m, caller, req).await
}

async fn run<P: Planned>(
    f: Functions,
    images: Images,
    m: Manager,
    caller: warren_types::Caller,
    req: Request,
) -> Response {
    let body = match axum::body::to_bytes(req.into_body(), warren_fusion::MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return refused(warren_fusion::body_error(e)),
    };
    let (plan, call) = match P::plan(&body) {
        Ok(p) => p,
        Err(e) => return refused(e),
    };
    if let Err(e) = images
        .check_usable(&caller, &call.image.refs(), Usage::Call)
        .await
    {
        return refused(FusionError::from_api(e.to_api()));
    }
    match f.call_as(&caller, call).await {
        Ok(r) => {
            let node = m.config().node.to_string();
            let answer = plan.answer(&r, &node);
            json(200, serde_json::to_vec(&answer).unwrap_or_default(), None)
        }
        Err(e) => refused(FusionError::from_api(e.to_api())),
    }
}
