//! `POST /v1/sandboxes/{id}/revive` through a gateway. A revive makes a *new* sandbox, so it
//! need not go to the node the id names:
//!
//! - that node is a live member: it revives (from its own log, or from the trajectory store
//!   when the sandbox was deleted there);
//! - that node is lost (its registration expired and it does not answer at its last address)
//!   or no longer a member: the revive is placed like a create, on a live node, which reads
//!   the log from the trajectory store the nodes share. Placement uses the old sandbox's
//!   substrate, image and memory when the gateway has the store too (`sandbox.json`), else a
//!   create's defaults. The node answers as for any revive (a tenant that does not own the
//!   trajectory gets `404`, like a missing one).
//!
//! A revive that reached the old node and got no answer is never sent elsewhere: it may
//! have made a sandbox there.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warren_cluster::PlaceRequest;
use warren_types::SandboxId;

use crate::error::GatewayError;
use crate::Gateway;

/// Largest revive request body read (the API defines none; a query carries the options).
const MAX_BODY: usize = 64 << 10;

/// The route a revive comes by.
pub const ROUTE: (&str, &str) = ("POST", "/v1/sandboxes/{id}/revive");

/// The sandbox id of a revive's path.
fn sandbox_id(req: &Request) -> Option<SandboxId> {
    req.uri()
        .path()
        .strip_prefix("/v1/sandboxes/")?
        .strip_suffix("/revive")?
        .parse()
        .ok()
}

/// Where the revive goes: to the old node, or placed.
enum Way {
    Owner,
    /// The old node is lost: tried there first (it may be back), placed when it does not
    /// answer.
    OwnerThenPlace,
    Place,
}

fn way(gw: &Gateway, id: &SandboxId) -> Way {
    let node = id.node();
    let view = gw.view().snapshot();
    match (view.state(&node), view.members.get(&node)) {
        (Some(warren_types::NodeState::Lost), Some(_)) => Way::OwnerThenPlace,
        (Some(_), Some(_)) => Way::Owner,
        _ => Way::Place,
    }
}

/// Answers a revive (see the module docs).
pub async fn revive(State(gw): State<Gateway>, req: Request) -> Response {
    let Some(id) = sandbox_id(&req) else {
        // A bad id: the node's answer, as for any per-sandbox call.
        return crate::sandboxes::forward(gw, req).await;
    };
    let way = way(&gw, &id);
    if let Way::Owner = way {
        return crate::sandboxes::forward(gw, req).await;
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return GatewayError::invalid(format!("revive request body: {e}")).into_response()
        }
    };
    if let Way::OwnerThenPlace = way {
        let again = Request::from_parts(parts.clone(), axum::body::Body::from(body.clone()));
        let resp = crate::sandboxes::forward(gw.clone(), again).await;
        // 410 is the gateway's own answer: the old node did not answer, nothing was made.
        if !is_lost(&resp) {
            return resp;
        }
    }
    let place = placement(&gw, &id).await;
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string());
    tracing::debug!(sandbox = %id, "the sandbox's node is gone: revive placed on a live node");
    crate::sandboxes::placed(&gw, place, &path, &parts.headers, body).await
}

/// The gateway's own `410 sandbox_lost` (nodes never answer 410): the old node did not
/// answer.
fn is_lost(resp: &Response) -> bool {
    resp.status() == StatusCode::GONE
}

/// The old sandbox's substrate, image and memory from its record in the trajectory store,
/// else a create's defaults.
async fn placement(gw: &Gateway, id: &SandboxId) -> PlaceRequest {
    let default = PlaceRequest {
        substrate: Default::default(),
        image: Vec::new(),
        memory_mb: warren_types::Limits::default().memory_mb,
        key: None,
        call: false,
    };
    let Some(store) = gw.config().trajectory_store.clone() else {
        return default;
    };
    let record: Option<warren_blob::trajectory::SandboxRecord> = store
        .get(&warren_blob::trajectory::record_key(id))
        .await
        .ok()
        .and_then(|b: Bytes| serde_json::from_slice(&b).ok());
    match record {
        Some(r) => PlaceRequest {
            substrate: r.sandbox.substrate,
            image: r.sandbox.image,
            memory_mb: r.sandbox.limits.memory_mb,
            ..default
        },
        None => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_read_from_the_path() {
        let id = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5";
        let req = |p: &str| {
            Request::builder()
                .method("POST")
                .uri(p)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let r = req(&format!(
            "/v1/sandboxes/{id}/revive?stop_on_divergence=true"
        ));
        assert_eq!(sandbox_id(&r).map(|i| i.to_string()), Some(id.to_string()));
        assert!(sandbox_id(&req("/v1/sandboxes/not-an-id/revive")).is_none());
        assert_eq!(
            ROUTE.1.replace("{id}", id),
            format!("/v1/sandboxes/{id}/revive")
        );
    }
}
