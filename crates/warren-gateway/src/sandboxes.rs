//! Sandbox routes: per-sandbox calls go to the node the id names; creates and function calls
//! are placed; the listing fans out and merges.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tracing::{debug, warn};
use warren_cluster::{candidates, PlaceError, PlaceRequest};
use warren_types::{
    CallRequest, CreateSandboxRequest, ErrorCode, NodeId, NodeState, SandboxId, SandboxInfo,
    SnapshotId, Substrate,
};

use crate::error::{GatewayError, GatewayResult};
use crate::metrics::{Metrics, Refusal};
use crate::Gateway;

/// `/v1/sandboxes/{id}/...`: the sandbox's node answers.
///
/// A node whose registration expired is still tried at its last address: a node that is
/// alive but lost its lease for a moment (etcd trouble) answers for its sandboxes, and only a
/// node that cannot be reached makes them `410 sandbox_lost`.
///
/// A trajectory export the node cannot answer (lost, unreachable, or the sandbox is not
/// there) is read from the trajectory store when the gateway has one ([`crate::shipped`]).
pub async fn to_node(State(gw): State<Gateway>, req: Request) -> Response {
    let Some(read) = crate::shipped::wanted(&gw, &req) else {
        return forward(gw, req).await;
    };
    let resp = forward(gw.clone(), req).await;
    if crate::shipped::falls_back(resp.status()) {
        return crate::shipped::answer(&gw, read, resp).await;
    }
    resp
}

pub(crate) async fn forward(gw: Gateway, req: Request) -> Response {
    let (answer, lost) = match route(&gw, &req) {
        Err(e) => return e.into_response(),
        // A live node is waited for while it stays registered (exec may run for long).
        Ok(Target::Live(address, node)) => {
            let forwarded = gw.proxy().forward(&address, req);
            (
                crate::liveness::unless_lost(gw.view(), &node, forwarded).await,
                None,
            )
        }
        // A lost node has a moment to show it is alive after all.
        Ok(Target::Lost(address, e)) => {
            let forwarded = gw.proxy().forward(&address, req);
            (
                tokio::time::timeout(crate::liveness::LOST_NODE_WAIT, forwarded)
                    .await
                    .ok(),
                Some(e),
            )
        }
    };
    let Some(answer) = answer else {
        gw.inner.metrics.refused(Refusal::SandboxLost);
        return match lost {
            Some(e) => e.into_response(),
            None => crate::error::lost(
                "the sandbox's node stopped answering during the call and its registration \
                 expired: the call may have been carried out; the sandbox is reachable again if \
                 the node comes back",
            )
            .into_response(),
        };
    };
    match (answer, lost) {
        (Ok(resp), Some(lost)) if resp.status() == StatusCode::NOT_FOUND => {
            // Another process now answers at that address: the sandbox is not there.
            lost_answer(&gw, lost)
        }
        (Ok(resp), _) => resp,
        (Err(e), Some(lost)) if e.not_sent() => lost_answer(&gw, lost),
        (Err(e), _) => {
            gw.inner.metrics.refused(Refusal::NodeUnreachable);
            crate::error::unreachable(e.to_string())
                .retry_after(1)
                .into_response()
        }
    }
}

fn lost_answer(gw: &Gateway, e: GatewayError) -> Response {
    gw.inner.metrics.refused(Refusal::SandboxLost);
    e.into_response()
}

/// Where a per-sandbox call goes.
enum Target {
    /// A registered node's address, and the node.
    Live(String, NodeId),
    /// The last address of a node whose registration expired, and the answer when it does
    /// not answer there.
    Lost(String, GatewayError),
}

/// The node of the sandbox (or snapshot) named in the path, or of the snapshot a create
/// starts from.
fn route(gw: &Gateway, req: &Request) -> GatewayResult<Target> {
    let path = req.uri().path();
    let id_of = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|r| r.split('/').next())
            .unwrap_or("")
            .to_string()
    };
    let bad = |e: warren_types::id::IdError| GatewayError::invalid(e.to_string());
    let (node, id) = if let Some(owner) = req.extensions().get::<OwnerOf>() {
        (owner.0.node(), format!("sandbox {}", owner.0))
    } else if let Some(from) = req.extensions().get::<FromSnapshot>() {
        (from.0.node(), format!("snapshot {}", from.0))
    } else if path.starts_with("/v1/snapshots/") {
        let id: SnapshotId = id_of("/v1/snapshots/").parse().map_err(bad)?;
        (id.node(), format!("snapshot {id}"))
    } else {
        let id: SandboxId = id_of("/v1/sandboxes/").parse().map_err(bad)?;
        (id.node(), format!("sandbox {id}"))
    };
    let view = gw.view().snapshot();
    match (view.state(&node), view.members.get(&node)) {
        (Some(NodeState::Ready | NodeState::Draining), Some(m)) => {
            Ok(Target::Live(m.record.address.clone(), node))
        }
        (Some(NodeState::Lost), Some(m)) => Ok(Target::Lost(
            m.record.address.clone(),
            crate::error::lost(format!(
                "{id} is lost: its node {node} left the cluster (its registration expired) \
                 and does not answer; it is reachable again if the node comes back"
            )),
        )),
        _ => Err(GatewayError::new(
            ErrorCode::NotFound,
            format!("{id} not found: node {node} is not a member of the cluster"),
        )),
    }
}

/// The largest JSON body the gateway reads, as a node reads (`warren_node`'s
/// `MAX_JSON_BODY`): a create's or a call's files ride in it.
pub(crate) const MAX_JSON_BODY: usize = 32 << 20;

/// The headers and body of a call the gateway places. axum's `Bytes` stops at 2 MiB and
/// refuses in plain text, so a call with files that a node takes was refused here.
async fn json_body(req: Request) -> Result<(HeaderMap, Bytes), Response> {
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, MAX_JSON_BODY).await {
        Ok(b) => Ok((parts.headers, b)),
        Err(e) => Err(GatewayError::invalid(format!(
            "cannot read the body (at most {MAX_JSON_BODY} bytes): {e}"
        ))
        .into_response()),
    }
}

fn bad_json(e: serde_json::Error) -> GatewayError {
    GatewayError::invalid(format!("invalid JSON body: {e}"))
}

/// A create from a snapshot: it goes to the snapshot's node.
#[derive(Debug, Clone)]
struct FromSnapshot(SnapshotId);

/// Marks a request whose path names no sandbox (E2B's data plane and control routes) as one
/// for this sandbox's node.
#[derive(Clone)]
struct OwnerOf(SandboxId);

/// Forwards E2B's per-sandbox requests unchanged to the sandbox's node, like any
/// per-sandbox call (the node, running with `--e2b`, checks and answers them).
impl warren_e2b::Owners for Gateway {
    fn forward(
        &self,
        sandbox: &SandboxId,
        mut req: Request,
    ) -> futures::future::BoxFuture<'static, Response> {
        req.extensions_mut().insert(OwnerOf(sandbox.clone()));
        Box::pin(forward(self.clone(), req))
    }
}

/// `/v1/snapshots/{id}`: the snapshot's node answers.
pub async fn snapshot_to_node(State(gw): State<Gateway>, req: Request) -> Response {
    forward(gw, req).await
}

/// `POST /v1/sandboxes`: placed, then forwarded as it came; a create from a snapshot goes
/// to the node that holds it.
pub async fn create(State(gw): State<Gateway>, req: Request) -> Response {
    let (headers, body) = match json_body(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req: CreateSandboxRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_json(e).into_response(),
    };
    if let Some(raw) = &req.snapshot {
        let id: SnapshotId = match raw.parse() {
            Ok(id) => id,
            Err(e) => {
                return GatewayError::invalid(format!("snapshot: {e}")).into_response();
            }
        };
        let mut fwd = Request::new(Body::from(body));
        *fwd.method_mut() = Method::POST;
        *fwd.uri_mut() = axum::http::Uri::from_static("/v1/sandboxes");
        *fwd.headers_mut() = headers;
        fwd.extensions_mut().insert(FromSnapshot(id));
        return forward(gw, fwd).await;
    }
    let place = PlaceRequest {
        substrate: req.substrate,
        image: req.image.refs(),
        memory_mb: req
            .memory_mb
            .unwrap_or(warren_types::Limits::default().memory_mb),
        key: req.idempotency_key.clone(),
        call: false,
    };
    placed(&gw, place, "/v1/sandboxes", &headers, body).await
}

/// `POST /v1/functions/call`: placed like a create (no key: calls are stateless).
pub async fn call(State(gw): State<Gateway>, req: Request) -> Response {
    let (headers, body) = match json_body(req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let req: CallRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_json(e).into_response(),
    };
    let place = PlaceRequest {
        substrate: Substrate::Function,
        image: req.image.refs(),
        memory_mb: req
            .memory_mb
            .unwrap_or(warren_types::Limits::default().memory_mb),
        key: None,
        call: true,
    };
    placed(&gw, place, "/v1/functions/call", &headers, body).await
}

fn retry_after(h: &HeaderMap) -> Option<u64> {
    h.get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Asks the candidates in turn until one takes the request.
pub(crate) async fn placed(
    gw: &Gateway,
    place: PlaceRequest,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Response {
    let view = gw.view().snapshot();
    let in_flight = |id: &NodeId| {
        let rev = view.members.get(id).map(|m| m.mod_revision).unwrap_or(0);
        gw.inner.in_flight.get(id, rev)
    };
    let seed = ulid::Ulid::new().random() as u64;
    let order = match candidates(&view, &place, &in_flight, seed, gw.config().k) {
        Ok(o) => o,
        Err(PlaceError::Unschedulable(why, _)) => {
            gw.inner.metrics.refused(Refusal::Unschedulable);
            return GatewayError::new(
                ErrorCode::Unschedulable,
                format!("no node can ever take this request: {why}"),
            )
            .into_response();
        }
        Err(PlaceError::Unavailable(why, _)) => {
            gw.inner.metrics.refused(Refusal::CapacityUnavailable);
            return GatewayError::new(
                ErrorCode::CapacityUnavailable,
                format!("no node can take this request now: {why}"),
            )
            .retry_after(1)
            .into_response();
        }
    };
    let mut refusals = Vec::new();
    let mut wait: Option<u64> = None;
    let mut tried = 0;
    for node in order.iter().take(gw.config().max_attempts.max(1)) {
        let Some(m) = view.members.get(node) else {
            continue;
        };
        if tried > 0 {
            Metrics::inc(&gw.inner.metrics.retries);
        }
        tried += 1;
        let placement = gw.inner.in_flight.begin(node);
        let sent = gw
            .proxy()
            .send(&m.record.address, Method::POST, path, headers, body.clone());
        let res = match crate::liveness::unless_lost(gw.view(), node, sent).await {
            Some(r) => r,
            None => {
                // Its registration expired while the request was out: it may have been done.
                gw.inner.metrics.refused(Refusal::NodeUnreachable);
                return crate::error::unreachable(format!(
                    "node {node} stopped answering and left the cluster; the request may have \
                     been carried out there"
                ))
                .retry_after(1)
                .into_response();
            }
        };
        match res {
            Ok(resp) if place.key.is_some() && resp.status() == StatusCode::TOO_MANY_REQUESTS => {
                // A key stays with its node: another node could not know of a sandbox this
                // one makes for a retry, so the caller waits (Retry-After) and asks again.
                gw.inner.metrics.refused(Refusal::NodeBusy);
                return resp;
            }
            Err(e) if place.key.is_some() => {
                gw.inner.metrics.refused(Refusal::NodeUnreachable);
                warn!(%node, error = %e, "the idempotency key's node is unreachable");
                return crate::error::unreachable(format!(
                    "{e}; a create with an idempotency key goes to its key's node {node} alone \
                     (so that a retry finds the one sandbox); retry: the key moves only when \
                     that node drains or leaves the cluster"
                ))
                .retry_after(1)
                .into_response();
            }
            Ok(resp) if resp.status() == StatusCode::TOO_MANY_REQUESTS => {
                gw.inner.metrics.refused(Refusal::NodeBusy);
                let ra = retry_after(resp.headers()).unwrap_or(1);
                wait = Some(wait.map_or(ra, |w| w.min(ra)));
                refusals.push(format!("{node} is busy"));
                debug!(%node, retry_after = ra, "node refused; trying the next");
            }
            Ok(resp) => {
                if resp.status().is_success() {
                    Metrics::inc(&gw.inner.metrics.placed);
                    placement.placed();
                }
                return resp;
            }
            Err(e) if e.not_sent() => {
                // Nothing reached the node.
                gw.inner.metrics.refused(Refusal::NodeUnreachable);
                warn!(%node, error = %e, "node unreachable; trying the next");
                refusals.push(format!("{node} is unreachable"));
            }
            Err(e) => {
                // The node may have started it: do not start a second one elsewhere.
                gw.inner.metrics.refused(Refusal::NodeUnreachable);
                return crate::error::unreachable(format!(
                    "{e}; the request may have been carried out: retry with an idempotency key"
                ))
                .retry_after(1)
                .into_response();
            }
        }
    }
    gw.inner.metrics.refused(Refusal::CapacityUnavailable);
    GatewayError::new(
        ErrorCode::CapacityUnavailable,
        format!(
            "every node asked refused the request for now: {}",
            refusals.join(", ")
        ),
    )
    .retry_after(wait.unwrap_or(1))
    .into_response()
}

/// `GET /v1/sandboxes`: every live node's list, merged in creation order, paginated.
pub async fn list(State(gw): State<Gateway>, req: Request) -> Response {
    let query = req.uri().query().unwrap_or("").to_string();
    let pairs: Vec<(String, String)> = form_pairs(&query);
    let limit = match pairs.iter().find(|(k, _)| k == "limit") {
        None => None,
        Some((_, v)) => match v.parse::<usize>() {
            Ok(n) if (1..=100_000).contains(&n) => Some(n),
            _ => {
                return GatewayError::invalid(format!("limit must be 1 to 100000, got {v:?}"))
                    .into_response()
            }
        },
    };
    if let Some((_, a)) = pairs.iter().find(|(k, _)| k == "after") {
        if let Err(e) = a.parse::<SandboxId>() {
            return GatewayError::invalid(format!("after: {e}")).into_response();
        }
    }
    let pq = if query.is_empty() {
        "/v1/sandboxes".to_string()
    } else {
        format!("/v1/sandboxes?{query}")
    };
    let answers = crate::fanout::each_node(&gw, Method::GET, &pq, req.headers()).await;
    let mut all: Vec<SandboxInfo> = Vec::new();
    let mut unreachable = Vec::new();
    let mut more = false;
    for (node, answer) in answers {
        match answer {
            Ok((status, _, body)) if status.is_success() => {
                match serde_json::from_slice::<NodeList>(&body) {
                    Ok(l) => {
                        more |= l.next_after.is_some();
                        all.extend(l.sandboxes);
                    }
                    Err(e) => {
                        warn!(%node, error = %e, "unreadable listing");
                        unreachable.push(node.to_string());
                    }
                }
            }
            // A node refusing the query refuses it for every node: pass its answer on.
            Ok((status, headers, body)) => {
                return (status, headers, Body::from(body)).into_response();
            }
            Err(_) => unreachable.push(node.to_string()),
        }
    }
    all.sort_by_key(|a| order_key(&a.id));
    let mut next_after = None;
    if let Some(limit) = limit {
        if all.len() > limit {
            all.truncate(limit);
            more = true;
        }
        if more {
            next_after = all.last().map(|s| s.id.clone());
        }
    }
    axum::Json(serde_json::json!({
        "sandboxes": all,
        "next_after": next_after,
        "unreachable": unreachable,
    }))
    .into_response()
}

fn order_key(id: &str) -> (String, String) {
    match id.split_once('-') {
        Some((node, ulid)) => (ulid.to_string(), node.to_string()),
        None => (id.to_string(), String::new()),
    }
}

#[derive(serde::Deserialize)]
struct NodeList {
    sandboxes: Vec<SandboxInfo>,
    #[serde(default)]
    next_after: Option<String>,
}

/// Decodes `a=b&c=d` (percent-decoding included).
pub(crate) fn form_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_pairs() {
        assert_eq!(
            form_pairs("label=run%3D1&limit=5&x"),
            vec![
                ("label".to_string(), "run=1".to_string()),
                ("limit".to_string(), "5".to_string()),
                ("x".to_string(), String::new())
            ]
        );
        assert_eq!(decode("a%2"), "a%2");
    }

    #[test]
    fn orders_by_creation_then_node() {
        let mut ids = [
            "b-01jd0m7x4e8k0k9yq1w2e3r4t6",
            "a-01jd0m7x4e8k0k9yq1w2e3r4t7",
            "c-01jd0m7x4e8k0k9yq1w2e3r4t5",
        ];
        ids.sort_by_key(|i| order_key(i));
        assert_eq!(ids[0], "c-01jd0m7x4e8k0k9yq1w2e3r4t5");
        assert_eq!(ids[2], "a-01jd0m7x4e8k0k9yq1w2e3r4t7");
    }
}
