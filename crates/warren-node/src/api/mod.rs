//! The v1 HTTP API: an axum [`Router`] over a [`Node`].
//!
//! Handlers take the part of the node they serve ([`crate::Manager`], [`crate::Images`],
//! [`crate::Functions`]), parse requests into its typed calls and turn the answers
//! (or [`crate::NodeError`]s) into HTTP. Every route is listed once in [`ROUTES`]; the router
//! is checked against it when built, and `tests/openapi.rs` checks it against
//! `api/openapi.yaml`. Unknown routes, wrong methods and malformed input answer JSON errors,
//! never axum's plain-text rejections.

mod drain;
mod error;
mod events;
mod exec;
mod extract;
mod files;
mod functions;
mod fusion;
mod images;
mod network;
pub mod parse;
mod ports;
mod pty;
mod sandboxes;
mod snapshots;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_events;
#[cfg(test)]
mod tests_ports;
mod trajectory;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;

use crate::node::Node;
pub use error::{HttpError, HttpResult};
pub use extract::MAX_JSON_BODY;

/// Response header set (to `true`) when a call's step was answered from the trajectory log
/// and nothing ran.
pub const REPLAYED_HEADER: &str = "warren-replayed";

use warren_types::http::CheckedRouter;
/// Every route of the API, `(method, path)` in axum/OpenAPI path syntax.
pub use warren_types::routes::NODE_API as ROUTES;

/// The API router, ready to serve.
pub fn router(node: Node) -> Router {
    let routes = CheckedRouter::new(ROUTES.iter().copied())
        .add("GET", "/v1/health", sandboxes::health)
        .add("GET", "/v1/events", events::events)
        .add("GET", "/metrics", sandboxes::metrics)
        .add("POST", "/v1/sandboxes", sandboxes::create)
        .add("GET", "/v1/sandboxes", sandboxes::list)
        .add("GET", "/v1/sandboxes/{id}", sandboxes::get)
        .add("DELETE", "/v1/sandboxes/{id}", sandboxes::delete)
        .add("POST", "/v1/sandboxes/{id}/pause", sandboxes::pause)
        .add("POST", "/v1/sandboxes/{id}/resume", sandboxes::resume)
        .add("POST", "/v1/sandboxes/{id}/fork", sandboxes::fork)
        .add("POST", "/v1/sandboxes/{id}/snapshot", snapshots::create)
        .add("POST", "/v1/sandboxes/{id}/revive", sandboxes::revive)
        .add("POST", "/v1/sandboxes/{id}/extend", sandboxes::extend)
        .add("GET", "/v1/sandboxes/{id}/stats", sandboxes::stats)
        .add("GET", "/v1/sandboxes/{id}/trajectory", trajectory::export)
        .add("GET", "/v1/sandboxes/{id}/network", network::get)
        .add("PUT", "/v1/sandboxes/{id}/network", network::put)
        .add("POST", "/v1/sandboxes/{id}/exec", exec::exec)
        .add("POST", "/v1/sandboxes/{id}/exec/stream", exec::exec_stream)
        .add("POST", "/v1/sandboxes/{id}/exec/attach", exec::exec_attach)
        .add("POST", "/v1/sandboxes/{id}/processes", exec::spawn)
        .add("GET", "/v1/sandboxes/{id}/processes", exec::list_procs)
        .add("GET", "/v1/sandboxes/{id}/processes/{pid}", exec::get_proc)
        .add(
            "POST",
            "/v1/sandboxes/{id}/processes/{pid}/wait",
            exec::wait_proc,
        )
        .add(
            "POST",
            "/v1/sandboxes/{id}/processes/{pid}/kill",
            exec::kill_proc,
        )
        .add("GET", "/v1/sandboxes/{id}/pty", pty::pty)
        .add("POST", "/v1/sandboxes/{id}/pty/attach", pty::pty_attach)
        .add("GET", "/v1/sandboxes/{id}/files", files::download)
        .add("PUT", "/v1/sandboxes/{id}/files", files::upload)
        .add("DELETE", "/v1/sandboxes/{id}/files", files::remove)
        .add("GET", "/v1/sandboxes/{id}/files/tar", files::download_tar)
        .add("PUT", "/v1/sandboxes/{id}/files/tar", files::upload_tar)
        .add("GET", "/v1/sandboxes/{id}/files/stat", files::stat)
        .add("GET", "/v1/sandboxes/{id}/files/list", files::list)
        .add("POST", "/v1/sandboxes/{id}/files/mkdir", files::mkdir)
        .add("POST", "/v1/sandboxes/{id}/files/chmod", files::chmod);
    let routes = port_routes(routes)
        .add("GET", "/v1/snapshots", snapshots::list)
        .add("GET", "/v1/snapshots/{id}", snapshots::get)
        .add("DELETE", "/v1/snapshots/{id}", snapshots::delete)
        .add("GET", "/v1/images", images::list)
        .add("GET", "/v1/images/{ref}", images::get)
        .add("DELETE", "/v1/images/{ref}", images::delete)
        .add("POST", "/v1/images/gc", images::gc)
        .add("POST", "/v1/images/import", images::import)
        .add("POST", "/v1/images/pull", images::pull)
        .add("POST", "/v1/images/build", images::build)
        .add("POST", "/v1/functions/call", functions::call)
        .add("GET", "/v1/functions/pools", functions::pools)
        .add("POST", "/run_code", fusion::run_code)
        .add("POST", "/run_jupyter", fusion::run_jupyter)
        .finish()
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(drain::drain_refused))
        .layer(axum::middleware::from_fn(log_request));
    // Outermost, so refused and failed requests are counted with the status they got.
    node.http.layer(routes).with_state(node)
}

/// Every method of `/v1/sandboxes/{id}/ports/{*target}` is forwarded to the sandbox's port.
fn port_routes(mut r: CheckedRouter<Node>) -> CheckedRouter<Node> {
    for (method, path) in ROUTES.iter().copied() {
        if path.starts_with("/v1/sandboxes/{id}/ports/") {
            r = r.add(method, path, ports::forward);
        }
    }
    r
}

async fn no_route(req: Request) -> HttpError {
    warren_types::ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()))
        .into()
}

async fn wrong_method(req: Request) -> HttpError {
    let mut e = HttpError::invalid(format!(
        "method {} is not allowed on {}",
        req.method(),
        req.uri().path()
    ));
    e.status = Some(StatusCode::METHOD_NOT_ALLOWED);
    e
}

async fn log_request(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    if status >= 500 {
        tracing::warn!(%method, path, status, ms = started.elapsed().as_millis() as u64, "request failed");
    } else {
        tracing::debug!(%method, path, status, ms = started.elapsed().as_millis() as u64, "request");
    }
    resp
}
