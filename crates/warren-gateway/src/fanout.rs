//! Routes answered by several nodes: the image routes and the function pools. Each live node
//! is asked at once, bounded by the fan-out timeout (an archive import by its own, longer
//! one); the answers are merged.

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
pub type Answer = Result<(StatusCode, HeaderMap, Bytes), NoAnswer>;

/// Why a node gave no answer to a request sent to every node.
#[derive(Debug, thiserror::Error)]
pub enum NoAnswer {
    /// The request's body could not be made for this node (the spooled archive cannot be
    /// reopened): nothing was sent.
    #[error("reopen the archive: {0}")]
    Body(#[source] std::io::Error),
    /// The node could not be reached or did not answer.
    #[error("{0}")]
    Forward(#[from] crate::proxy::ForwardError),
    /// The node's answer broke off.
    #[error("{0}")]
    Read(#[source] axum::Error),
    /// The node did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
}

/// Why an archive could not be received into the gateway's temporary file.
#[derive(Debug, thiserror::Error)]
enum SpoolError {
    #[error("create a temporary file: {0}")]
    Create(#[source] std::io::Error),
    #[error("write the temporary file: {0}")]
    Write(#[source] std::io::Error),
    /// The caller's body broke off.
    #[error("{0}")]
    Receive(#[source] axum::Error),
}

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
    let timeout = gw.config().fanout_timeout;
    let body = move || Ok(Body::from(body.clone()));
    each_node_streaming(gw, method, path_and_query, headers, body, timeout).await
}

/// Sends a request to every live node at once, each with its own body from `body()`, each
/// answer bounded by `timeout`.
async fn each_node_streaming(
    gw: &Gateway,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: impl Fn() -> Result<Body, NoAnswer>,
    timeout: std::time::Duration,
) -> Vec<(NodeId, Answer)> {
    let view = gw.view().snapshot();
    let asks = view.live().map(|m| {
        let id = m.record.id.clone();
        let address = m.record.address.clone();
        let method = method.clone();
        let body = body();
        async move {
            let call = async {
                let resp = gw
                    .proxy()
                    .send(&address, method, path_and_query, headers, body?)
                    .await?;
                let (parts, body) = resp.into_parts();
                let bytes = body.collect().await.map_err(NoAnswer::Read)?.to_bytes();
                Ok((parts.status, parts.headers, bytes))
            };
            let answer = match tokio::time::timeout(timeout, call).await {
                Ok(a) => a,
                Err(_) => Err(NoAnswer::Timeout(timeout)),
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

/// Every live node's answer to a listing, merged into one list `field` keyed (and ordered)
/// by each item's `key`; the first node's item wins. A node's error answer is passed on.
async fn merged_list(gw: &Gateway, req: Request, field: &str, key: &str) -> Response {
    let pq = req.uri().to_string();
    let headers = req.headers().clone();
    drop(req);
    let answers = each_node(gw, Method::GET, &pq, &headers).await;
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
        for item in v[field].as_array().cloned().unwrap_or_default() {
            let k = item[key].as_str().unwrap_or("").to_string();
            merged.entry(k).or_insert(item);
        }
    }
    let mut out = serde_json::Map::new();
    out.insert(field.into(), Value::Array(merged.into_values().collect()));
    axum::Json(Value::Object(out)).into_response()
}

/// `GET /v1/images`: every node's images, one entry per reference (first node's wins).
pub async fn images(State(gw): State<Gateway>, req: Request) -> Response {
    merged_list(&gw, req, "images", "reference").await
}

/// `GET /v1/snapshots`: every live node's, merged in id order (a snapshot is on one node).
pub async fn snapshots(State(gw): State<Gateway>, req: Request) -> Response {
    merged_list(&gw, req, "snapshots", "id").await
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

/// How long one node may take to receive and convert an archive.
const IMPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// `POST /v1/images/import` through a gateway: the archive is received once into a
/// temporary file of the gateway's (removed when the import ends), then sent to every live
/// node at once, each reading the file from its start. The answer is the first failure,
/// else the first node's answer, as for a pull.
pub async fn import(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let headers = req.headers().clone();
    if gw.view().snapshot().live().next().is_none() {
        return no_nodes();
    }
    let spool = match spool(req.into_body()).await {
        Ok(f) => f,
        Err(e) => {
            return GatewayError::invalid(format!("receiving the archive: {e}")).into_response()
        }
    };
    let path = spool.path().to_path_buf();
    let body = || {
        let f = std::fs::File::open(&path).map_err(NoAnswer::Body)?;
        Ok(Body::from_stream(tokio_util::io::ReaderStream::new(
            tokio::fs::File::from_std(f),
        )))
    };
    let answers = each_node_streaming(&gw, Method::POST, &pq, &headers, body, IMPORT_TIMEOUT).await;
    drop(spool);
    imported(&gw, answers).await
}

/// `POST /v1/images/pull`: pulled on every live node, answered as an import.
pub async fn pull(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let headers = req.headers().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return GatewayError::invalid(format!("reading the body: {e}")).into_response(),
    };
    let body = move || Ok(Body::from(body.clone()));
    let answers = each_node_streaming(&gw, Method::POST, &pq, &headers, body, IMPORT_TIMEOUT).await;
    imported(&gw, answers).await
}

/// How long an import's answer waits for the nodes' records to show the new image.
const PUBLISHED_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The answer to an import or pull on every node. On success it is given once this
/// gateway's view shows the image on the nodes that took it (or after [`PUBLISHED_WAIT`]),
/// so that a create naming the image right after is placed rather than refused.
async fn imported(gw: &Gateway, answers: Vec<(NodeId, Answer)>) -> Response {
    let took: Vec<NodeId> = answers
        .iter()
        .filter(|(_, a)| matches!(a, Ok((s, _, _)) if s.is_success()))
        .map(|(n, _)| n.clone())
        .collect();
    let reference = answers.iter().find_map(|(_, a)| match a {
        Ok((s, _, b)) if s.is_success() => serde_json::from_slice::<Value>(b).ok()?["image"]
            ["reference"]
            .as_str()
            .map(str::to_string),
        _ => None,
    });
    let resp = first_failure_or_ok(answers);
    if let (true, Some(r)) = (resp.status().is_success(), reference) {
        until_published(gw, &r, &took).await;
    }
    resp
}

/// Waits, at most [`PUBLISHED_WAIT`], until the view shows image `reference` on each of
/// `nodes` that is still registered.
async fn until_published(gw: &Gateway, reference: &str, nodes: &[NodeId]) {
    let want = warren_cluster::place::normalize_ref(reference);
    gw.view()
        .wait_for(PUBLISHED_WAIT, |v| {
            nodes.iter().all(|n| {
                v.members
                    .get(n)
                    .is_none_or(|m| m.lost || m.record.images.contains_key(&want))
            })
        })
        .await;
}

/// Writes a request body to a new temporary file.
async fn spool(body: Body) -> Result<tempfile::NamedTempFile, SpoolError> {
    use tokio::io::AsyncWriteExt;
    let tmp = tempfile::Builder::new()
        .prefix("warren-gateway-import-")
        .tempfile()
        .map_err(SpoolError::Create)?;
    let mut out = tokio::fs::File::from_std(tmp.reopen().map_err(SpoolError::Create)?);
    let mut body = body.into_data_stream();
    while let Some(chunk) = futures::StreamExt::next(&mut body).await {
        let chunk = chunk.map_err(SpoolError::Receive)?;
        out.write_all(&chunk).await.map_err(SpoolError::Write)?;
    }
    out.flush().await.map_err(SpoolError::Write)?;
    Ok(tmp)
}

/// `DELETE /v1/images/{ref}`, `POST /v1/images/gc`: done on every live node; the answer is
/// the first failure, else the first node's answer. A node without the image does not fail
/// a removal that another node did.
pub async fn everywhere(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let method = req.method().clone();
    let headers = req.headers().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return GatewayError::invalid(format!("reading the body: {e}")).into_response(),
    };
    let removal = method == Method::DELETE;
    let mut answers = each_node_with(&gw, method, &pq, &headers, body).await;
    if removal
        && answers
            .iter()
            .any(|(_, a)| matches!(a, Ok((s, _, _)) if s.is_success()))
    {
        // Removed somewhere: the nodes that never had it are not a failure.
        answers.retain(|(_, a)| !matches!(a, Ok((s, _, _)) if *s == StatusCode::NOT_FOUND));
    }
    first_failure_or_ok(answers)
}

/// The first failure among `answers`, else the first success.
fn first_failure_or_ok(answers: Vec<(NodeId, Answer)>) -> Response {
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

/// `POST /v1/images/build`: placed on one live, undrained node serving containers — the one
/// with the most memory available — and streamed through. The image is that node's (with a
/// blob store configured, other nodes start from its layers as they do from any layer).
pub async fn build(State(gw): State<Gateway>, req: Request) -> Response {
    let view = gw.view().snapshot();
    let node = view
        .live()
        .filter(|m| !view.drained.contains(&m.record.id))
        .filter(|m| {
            m.record
                .substrates
                .contains(&warren_types::Substrate::Container)
        })
        .max_by_key(|m| m.record.load.memory_available_mb)
        .map(|m| m.record.address.clone());
    let Some(address) = node else {
        return no_nodes();
    };
    match gw.proxy().forward(&address, req).await {
        Ok(resp) => resp,
        Err(e) => crate::error::unreachable(format!("the build's node: {e}")).into_response(),
    }
}
