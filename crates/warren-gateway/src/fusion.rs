//! `POST /run_code` and `POST /run_jupyter` (SandboxFusion's code runner): placed like a
//! function call, forwarded as they came, and the gateway's own refusals (no node can take it
//! now, or ever) answered in the protocol's shape, as the node answers its own.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_cluster::PlaceRequest;
use warren_fusion::{FusionError, JupyterPlan, Plan};
use warren_types::{ApiError, ErrorBody, Substrate};

use crate::sandboxes::placed;
use crate::Gateway;

/// Largest refusal body the gateway rewrites (its own are far smaller).
const MAX_REFUSAL: usize = 64 << 10;

fn answer(e: &FusionError) -> Response {
    let mut resp = (
        StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        e.body(),
    )
        .into_response();
    if let Some(r) = e.retry_after() {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(r));
    }
    resp
}

/// The body, up to the size a node reads (axum's `Bytes` stops at 2 MiB and refuses in
/// plain text, so files a node takes were refused here).
async fn body(req: Request) -> Result<(HeaderMap, Bytes), Response> {
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, warren_fusion::MAX_BODY).await {
        Ok(b) => Ok((parts.headers, b)),
        Err(e) => Err(answer(&warren_fusion::body_error(e))),
    }
}

pub async fn run_code(State(gw): State<Gateway>, req: Request) -> Response {
    let (headers, body) = match body(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match warren_fusion::parse(&body).and_then(|r| Plan::new(&r)) {
        Ok((_, call)) => forward(gw, "/run_code", call, headers, body).await,
        Err(e) => answer(&e),
    }
}

pub async fn run_jupyter(State(gw): State<Gateway>, req: Request) -> Response {
    let (headers, body) = match body(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match warren_fusion::parse_jupyter(&body).and_then(|r| JupyterPlan::new(&r)) {
        Ok((_, call)) => forward(gw, "/run_jupyter", call, headers, body).await,
        Err(e) => answer(&e),
    }
}

async fn forward(
    gw: Gateway,
    path: &str,
    call: warren_types::CallRequest,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let place = PlaceRequest {
        substrate: Substrate::Function,
        image: call.image.refs(),
        memory_mb: call
            .memory_mb
            .unwrap_or(warren_types::Limits::default().memory_mb),
        key: None,
        call: true,
    };
    let resp = placed(&gw, place, path, &headers, body).await;
    if resp.status().is_success() {
        return resp;
    }
    // A node's refusal is already in the protocol's shape; the gateway's own is Warren's.
    let (parts, body) = resp.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_REFUSAL).await else {
        return Response::from_parts(parts, Body::empty());
    };
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(ErrorBody { error }) => {
            let e = FusionError::Refused {
                error: ApiError {
                    request_id: None,
                    ..error
                },
            };
            // Keep the gateway's status (e.g. 503 for a node that does not answer).
            let mut resp = answer(&e);
            *resp.status_mut() = parts.status;
            if let Some(r) = parts.headers.get(header::RETRY_AFTER) {
                resp.headers_mut().insert(header::RETRY_AFTER, r.clone());
            }
            resp
        }
        Err(_) => Response::from_parts(parts, Body::from(bytes)),
    }
}
