//! The gateway's routes: every route of the node API, plus the cluster routes. The contract
//! test checks [`routes`] against `api/openapi.yaml` (all of it, gateway-only routes included).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;

use warren_types::http::CheckedRouter;

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::{cluster, events, fanout, fusion, revive, sandboxes, Gateway};

/// The gateway's own routes, beside the node API's ([`warren_types::routes::NODE_API`]).
pub const CLUSTER_ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/cluster"),
    ("POST", "/v1/cluster/nodes/{id}/drain"),
    ("POST", "/v1/cluster/nodes/{id}/undrain"),
    ("DELETE", "/v1/cluster/nodes/{id}"),
];

/// Every route the gateway serves, `(method, path)`: the node API's and its own.
pub fn routes() -> impl Iterator<Item = (&'static str, &'static str)> {
    warren_types::routes::NODE_API
        .iter()
        .chain(CLUSTER_ROUTES)
        .copied()
}

/// Every per-sandbox route of the node API goes to the sandbox's node, except a revive, which
/// goes to a live node when the sandbox's is gone ([`revive`]).
fn sandbox_routes(mut r: CheckedRouter<Gateway>) -> CheckedRouter<Gateway> {
    for (method, path) in routes().filter(|(_, path)| path.starts_with("/v1/sandboxes/{id}")) {
        r = if (method, path) == revive::ROUTE {
            r.add(method, path, revive::revive)
        } else {
            r.add(method, path, sandboxes::to_node)
        };
    }
    r
}

pub fn router(gw: Gateway) -> Router {
    let r = CheckedRouter::new(routes())
        .add("GET", "/v1/health", cluster::health)
        .add("GET", "/v1/events", events::events)
        .add("GET", "/metrics", cluster::metrics)
        .add("POST", "/v1/sandboxes", sandboxes::create)
        .add("GET", "/v1/sandboxes", sandboxes::list);
    let r = sandbox_routes(r)
        .add("GET", "/v1/snapshots", fanout::snapshots)
        .add("GET", "/v1/snapshots/{id}", sandboxes::snapshot_to_node)
        .add("DELETE", "/v1/snapshots/{id}", sandboxes::snapshot_to_node)
        .add("GET", "/v1/images", fanout::images)
        .add("GET", "/v1/images/{ref}", fanout::first_found)
        .add("DELETE", "/v1/images/{ref}", fanout::everywhere)
        .add("POST", "/v1/images/gc", fanout::everywhere)
        .add("POST", "/v1/images/pull", fanout::pull)
        .add("POST", "/v1/images/import", fanout::import)
        .add("POST", "/v1/images/build", fanout::build)
        .add("POST", "/v1/functions/call", sandboxes::call)
        .add("GET", "/v1/functions/pools", fanout::pools)
        .add("POST", "/run_code", fusion::run_code)
        .add("POST", "/run_jupyter", fusion::run_jupyter)
        .add("GET", "/v1/cluster", cluster::info)
        .add("POST", "/v1/cluster/nodes/{id}/drain", cluster::drain)
        .add("POST", "/v1/cluster/nodes/{id}/undrain", cluster::undrain)
        .add("DELETE", "/v1/cluster/nodes/{id}", cluster::forget)
        .finish()
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn_with_state(gw.clone(), count));
    gw.inner.metrics.http.layer(r).with_state(gw)
}

async fn no_route(req: Request) -> GatewayError {
    warren_types::ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
        .into()
}

async fn wrong_method(req: Request) -> GatewayError {
    GatewayError::invalid(format!(
        "method {} is not allowed on {}",
        req.method(),
        req.uri().path()
    ))
    .with_status(StatusCode::METHOD_NOT_ALLOWED)
}

async fn count(
    axum::extract::State(gw): axum::extract::State<Gateway>,
    req: Request,
    next: Next,
) -> Response {
    Metrics::inc(&gw.inner.metrics.requests);
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    tracing::debug!(%method, path, status = resp.status().as_u16(), us = started.elapsed().as_micros() as u64, "request");
    resp
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
