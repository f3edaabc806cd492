//! Routes answered by several nodes: the image routes and the function pools. Each live node
//! is asked at once, bounded by the fan-out timeout; the answers are merged.

use std::collections::BTreeMap;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use serde_json::Value;
use warren_types::{ErrorCode, NodeId};

use crate::error::GatewayError;
use crate::Gateway;

/// One node's answer: status, headers, whole body.
pub type Answer = Result<(StatusCode, HeaderMap, Bytes), String>;

/// Sends the same bodiless request to every live node (ready or draining), concurrently.
pub async fn each_node(
    gw: &Gateway,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Vec<(NodeId, Answer)> {
    each_node_with(gw, method, path_and_query, headers, Bytes::new()).await
}

pub async fn each_node_with(
    gw: &Gateway,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Vec<(NodeId, Answer)> {
    let view = gw.view().snapshot();
    let timeout = gw.config().fanout_timeout;
    let asks = view.live().map(|m| {
        let id = m.record.id.clone();
        let address = m.record.address.clone();
        let method = method.clone();
        let body = body.clone();
        async move {
            let call = async {
                let resp = gw
                    .proxy()
                    .send(&address, method, path_and_query, headers, body)
                    .await
                    .map_err(|e| e.to_string())?;
                let (parts, body) = resp.into_parts();
                let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
                Ok((parts.status, parts.headers, bytes))
            };
            let answer = match tokio::time::timeout(timeout, call).await {
                Ok(a) => a,
                Err(_) => Err(format!("no answer within {timeout:?}")),
            };
            (id, answer)
        }
    });
    futures::future::join_all(asks).await
}

fn pass_on(status: StatusCode, headers: HeaderMap, body: Bytes) -> Response {
    (status, headers, Body::from(body)).into_response()
}

fn no_nodes() -> Response {
    GatewayError::new(
        ErrorCode::CapacityUnavailable,
        "no node of the cluster is registered",
    )
    .retry_after(1)
    .into_response()
}

/// `GET /v1/images`: every node's images, one entry per reference (first node's wins).
pub async fn images(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let answers = each_node(&gw, Method::GET, &pq, req.headers()).await;
    if answers.is_empty() {
        return no_nodes();
    }
    let mut merged: BTreeMap<String, Value> = BTreeMap::new();
    for (_, a) in answers {
        let Ok((status, headers, body)) = a else {
            continue;
        };
        if !status.is_success() {
            return pass_on(status, headers, body);
        }
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            continue;
        };
        for img in v["images"].as_array().cloned().unwrap_or_default() {
            let r = img["reference"].as_str().unwrap_or("").to_string();
            merged.entry(r).or_insert(img);
        }
    }
    axum::Json(serde_json::json!({ "images": merged.into_values().collect::<Vec<_>>() }))
        .into_response()
}

/// `GET /v1/images/{ref}`: the first node that has it answers.
pub async fn first_found(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let answers = each_node(&gw, Method::GET, &pq, req.headers()).await;
    let mut first_other = None;
    for (_, a) in answers {
        match a {
            Ok((s, h, b)) if s.is_success() => return pass_on(s, h, b),
            Ok((s, h, b)) => {
                first_other.get_or_insert((s, h, b));
            }
            Err(_) => {}
        }
    }
    match first_other {
        Some((s, h, b)) => pass_on(s, h, b),
        None => no_nodes(),
    }
}

/// `POST /v1/images/import` through a gateway: an archive is one stream and cannot be sent to
/// every node; the caller pulls from a registry (`/v1/images/pull`, done on every node) or
/// imports on each node.
pub async fn no_import() -> Response {
    GatewayError::invalid(
        "a gateway does not take image archives: pull from a registry \
         (POST /v1/images/pull runs on every node) or import on each node",
    )
    .into_response()
}

/// `DELETE /v1/images/{ref}`, `POST /v1/images/gc`, `POST /v1/images/pull`: done on every live node; the answer is
/// the first failure, else the first node's answer.
pub async fn everywhere(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return GatewayError::invalid(format!("reading the body: {e}")).into_response(),
    };
    let answers = each_node_with(&gw, method, &pq, &headers, body).await;
    if answers.is_empty() {
        return no_nodes();
    }
    let mut first_ok = None;
    for (node, a) in answers {
        match a {
            Ok((s, h, b)) if s.is_success() => {
                first_ok.get_or_insert((s, h, b));
            }
            Ok((s, h, b)) => return pass_on(s, h, b),
            Err(e) => {
                return crate::error::unreachable(format!("node {node}: {e}"))
                    .retry_after(1)
                    .into_response()
            }
        }
    }
    let (s, h, b) = first_ok.expect("answers is not empty");
    pass_on(s, h, b)
}

/// `GET /v1/functions/pools`: every node's pools, each marked with its node.
pub async fn pools(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let answers = each_node(&gw, Method::GET, &pq, req.headers()).await;
    let mut pools = Vec::new();
    let (mut warm, mut max_warm) = (0u64, 0u64);
    for (node, a) in answers {
        let Ok((status, headers, body)) = a else {
            continue;
        };
        if !status.is_success() {
            return pass_on(status, headers, body);
        }
        let Ok(v) = serde_json::from_slice::<Value>(&body) else {
            continue;
        };
        for mut p in v["pools"].as_array().cloned().unwrap_or_default() {
            p["node"] = Value::String(node.to_string());
            pools.push(p);
        }
        warm += v["warm_memory_mb"].as_u64().unwrap_or(0);
        max_warm += v["max_warm_memory_mb"].as_u64().unwrap_or(0);
    }
    axum::Json(serde_json::json!({
        "pools": pools,
        "warm_memory_mb": warm,
        "max_warm_memory_mb": max_warm,
    }))
    .into_response()
}
