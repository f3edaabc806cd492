//! The gateway's own routes: health, metrics, the cluster view, drain and undrain.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use serde::Serialize;
use warren_types::{
    Caller, ClusterInfo, ErrorCode, NodeId, NodeState, NodeSummary, NodeSummaryRecord, Substrate,
};

use crate::error::{GatewayError, GatewayResult};
use crate::Gateway;

/// `GET /v1/health` of a gateway: the node API's health fields over the whole cluster, plus
/// what the gateway sees of it.
#[derive(Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
    /// The gateway's name (a gateway is not a node).
    pub node: String,
    pub version: &'static str,
    /// Substrates some ready node serves.
    pub substrates: Vec<&'static str>,
    /// Sandboxes held by the registered nodes, as last published; administrators only (a
    /// user token sees nothing summed over other tenants).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u64>,
    pub gateway: GatewayHealth,
    /// Who the gateway took the caller for.
    pub caller: warren_types::CallerSummary,
}

#[derive(Debug, Serialize)]
pub struct GatewayHealth {
    pub nodes_ready: usize,
    pub nodes_draining: usize,
    pub nodes_lost: usize,
    pub etcd_connected: bool,
}

pub async fn health(State(gw): State<Gateway>, who: Option<Extension<Caller>>) -> Json<Health> {
    let v = gw.view().snapshot();
    let mut substrates: Vec<Substrate> = Vec::new();
    let (mut ready, mut draining, mut lost, mut sandboxes) = (0, 0, 0, 0);
    for (id, m) in &v.members {
        match v.state(id) {
            Some(NodeState::Ready) => {
                ready += 1;
                for s in &m.record.substrates {
                    if !substrates.contains(s) {
                        substrates.push(*s);
                    }
                }
            }
            Some(NodeState::Draining) => draining += 1,
            _ => lost += 1,
        }
        if !m.lost {
            sandboxes += m.record.load.sandboxes();
        }
    }
    substrates.sort_by_key(|s| s.as_str());
    let caller = caller(who);
    Json(Health {
        status: "ok",
        node: gw.config().name.clone(),
        version: env!("CARGO_PKG_VERSION"),
        substrates: substrates.iter().map(|s| s.as_str()).collect(),
        sandboxes: caller.is_admin().then_some(sandboxes),
        gateway: GatewayHealth {
            nodes_ready: ready,
            nodes_draining: draining,
            nodes_lost: lost,
            etcd_connected: v.connected,
        },
        caller: caller.summary(),
    })
}

/// The caller the edge authenticated; without an edge layer (tests), the administrator.
fn caller(c: Option<Extension<Caller>>) -> Caller {
    c.map(|Extension(c)| c).unwrap_or_else(Caller::admin)
}

pub async fn metrics(
    State(gw): State<Gateway>,
    who: Option<Extension<Caller>>,
) -> GatewayResult<Response> {
    caller(who).require_admin("GET /metrics")?;
    let v = gw.view().snapshot();
    let mut counts = [("ready", 0u64), ("draining", 0), ("lost", 0)];
    for id in v.members.keys() {
        let i = match v.state(id) {
            Some(NodeState::Ready) => 0,
            Some(NodeState::Draining) => 1,
            _ => 2,
        };
        counts[i].1 += 1;
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        gw.inner.metrics.render(&counts),
    )
        .into_response())
}

fn summaries(gw: &Gateway) -> ClusterInfo {
    let v = gw.view().snapshot();
    let nodes = v
        .members
        .iter()
        .map(|(id, m)| NodeSummary {
            id: id.clone(),
            state: v.state(id).unwrap_or(NodeState::Lost),
            record: NodeSummaryRecord::from(&m.record),
            in_flight: gw.inner.in_flight.outstanding(id),
        })
        .collect();
    ClusterInfo {
        nodes,
        etcd_connected: v.connected,
        revision: v.revision,
    }
}

/// `GET /v1/cluster` (administrators: every node's load, pools and images, all tenants').
pub async fn info(
    State(gw): State<Gateway>,
    who: Option<Extension<Caller>>,
) -> GatewayResult<Json<ClusterInfo>> {
    caller(who).require_admin("GET /v1/cluster")?;
    Ok(Json(summaries(&gw)))
}

async fn set_drain(gw: &Gateway, raw: &str, drained: bool) -> GatewayResult<Json<NodeSummary>> {
    let id: NodeId = raw
        .parse()
        .map_err(|e: warren_types::id::IdError| GatewayError::invalid(e.to_string()))?;
    if !gw.view().snapshot().members.contains_key(&id) {
        return Err(GatewayError::new(
            ErrorCode::NotFound,
            format!("node {id} is not a member of the cluster"),
        ));
    }
    gw.view().set_drain(&id, drained).await.map_err(|e| {
        GatewayError::new(
            ErrorCode::Busy,
            format!("cannot record the drain in etcd: {e}"),
        )
        .retry_after(1)
    })?;
    summaries(gw)
        .nodes
        .into_iter()
        .find(|n| n.id == id)
        .map(Json)
        .ok_or_else(|| GatewayError::new(ErrorCode::NotFound, format!("node {id} is gone")))
}

/// `POST /v1/cluster/nodes/{id}/drain`: the node takes no new sandboxes (it keeps serving
/// the ones it has). Stored in etcd: every gateway sees it, and it outlives restarts.
pub async fn drain(
    State(gw): State<Gateway>,
    who: Option<Extension<Caller>>,
    Path(id): Path<String>,
) -> GatewayResult<Json<NodeSummary>> {
    caller(who).require_admin("draining a node")?;
    set_drain(&gw, &id, true).await
}

/// `POST /v1/cluster/nodes/{id}/undrain`.
pub async fn undrain(
    State(gw): State<Gateway>,
    who: Option<Extension<Caller>>,
    Path(id): Path<String>,
) -> GatewayResult<Json<NodeSummary>> {
    caller(who).require_admin("undraining a node")?;
    set_drain(&gw, &id, false).await
}

/// `DELETE /v1/cluster/nodes/{id}`: forgets a lost node (admin). Its sandboxes stop being
/// `sandbox_lost` and become unknown (404); a registered node is refused with `409`.
pub async fn forget(
    State(gw): State<Gateway>,
    who: Option<Extension<Caller>>,
    Path(raw): Path<String>,
) -> GatewayResult<axum::http::StatusCode> {
    caller(who).require_admin("forgetting a node")?;
    let id: NodeId = raw
        .parse()
        .map_err(|e: warren_types::id::IdError| GatewayError::invalid(e.to_string()))?;
    if !gw.view().snapshot().members.contains_key(&id) {
        return Err(GatewayError::new(
            ErrorCode::NotFound,
            format!("node {id} is not known to the cluster"),
        ));
    }
    let forgotten = gw.view().forget(&id).await.map_err(|e| {
        GatewayError::new(ErrorCode::Busy, format!("cannot forget in etcd: {e}")).retry_after(1)
    })?;
    if !forgotten {
        return Err(GatewayError::new(
            ErrorCode::Conflict,
            format!("node {id} is registered; stop it (or let its lease expire) first"),
        ));
    }
    Ok(axum::http::StatusCode::NO_CONTENT)
}
