//! The gateway's routes: every route of the node API, plus the cluster routes. The contract
//! test checks [`ROUTES`] against `api/openapi.yaml` (all of it, gateway-only routes included).

use axum::extract::Request;
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{on, MethodFilter};
use axum::Router;

use crate::error::GatewayError;
use crate::metrics::Metrics;
use crate::{cluster, fanout, sandboxes, Gateway};

/// Every route the gateway serves, `(method, path)`.
pub const ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/health"),
    ("GET", "/metrics"),
    ("POST", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes"),
    ("GET", "/v1/sandboxes/{id}"),
    ("DELETE", "/v1/sandboxes/{id}"),
    ("POST", "/v1/sandboxes/{id}/pause"),
    ("POST", "/v1/sandboxes/{id}/resume"),
    ("POST", "/v1/sandboxes/{id}/fork"),
    ("GET", "/v1/sandboxes/{id}/trajectory"),
    ("GET", "/v1/sandboxes/{id}/network"),
    ("PUT", "/v1/sandboxes/{id}/network"),
    ("POST", "/v1/sandboxes/{id}/exec"),
    ("POST", "/v1/sandboxes/{id}/exec/stream"),
    ("POST", "/v1/sandboxes/{id}/processes"),
    ("GET", "/v1/sandboxes/{id}/processes"),
    ("GET", "/v1/sandboxes/{id}/processes/{pid}"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/wait"),
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/kill"),
    ("GET", "/v1/sandboxes/{id}/pty"),
    ("GET", "/v1/sandboxes/{id}/files"),
    ("PUT", "/v1/sandboxes/{id}/files"),
    ("DELETE", "/v1/sandboxes/{id}/files"),
    ("GET", "/v1/sandboxes/{id}/files/stat"),
    ("GET", "/v1/sandboxes/{id}/files/list"),
    ("POST", "/v1/sandboxes/{id}/files/mkdir"),
    ("POST", "/v1/sandboxes/{id}/files/chmod"),
    ("GET", "/v1/images"),
    ("GET", "/v1/images/{ref}"),
    ("DELETE", "/v1/images/{ref}"),
    ("POST", "/v1/images/gc"),
    ("POST", "/v1/functions/call"),
    ("GET", "/v1/functions/pools"),
    ("GET", "/v1/cluster"),
    ("POST", "/v1/cluster/nodes/{id}/drain"),
    ("POST", "/v1/cluster/nodes/{id}/undrain"),
    ("DELETE", "/v1/cluster/nodes/{id}"),
];

struct Routes {
    router: Router<Gateway>,
    seen: Vec<(&'static str, &'static str)>,
}

impl Routes {
    fn add<H, T>(mut self, method: &'static str, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, Gateway>,
        T: 'static,
    {
        assert!(
            ROUTES.contains(&(method, path)),
            "route {method} {path} is missing from ROUTES"
        );
        let filter = match method {
            "GET" => MethodFilter::GET,
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "DELETE" => MethodFilter::DELETE,
            other => panic!("method {other} not used by the API"),
        };
        self.router = self.router.route(path, on(filter, handler));
        self.seen.push((method, path));
        self
    }

    /// Every per-sandbox route of ROUTES goes to the sandbox's node.
    fn sandbox_routes(mut self) -> Self {
        for &(method, path) in ROUTES {
            if path.starts_with("/v1/sandboxes/{id}") {
                self = self.add(method, path, sandboxes::to_node);
            }
        }
        self
    }

    fn finish(self) -> Router<Gateway> {
        for r in ROUTES {
            assert!(
                self.seen.contains(r),
                "route {} {} in ROUTES has no handler",
                r.0,
                r.1
            );
        }
        self.router
    }
}

pub fn router(gw: Gateway) -> Router {
    Routes {
        router: Router::new(),
        seen: Vec::new(),
    }
    .add("GET", "/v1/health", cluster::health)
    .add("GET", "/metrics", cluster::metrics)
    .add("POST", "/v1/sandboxes", sandboxes::create)
    .add("GET", "/v1/sandboxes", sandboxes::list)
    .sandbox_routes()
    .add("GET", "/v1/images", fanout::images)
    .add("GET", "/v1/images/{ref}", fanout::first_found)
    .add("DELETE", "/v1/images/{ref}", fanout::everywhere)
    .add("POST", "/v1/images/gc", fanout::everywhere)
    .add("POST", "/v1/functions/call", sandboxes::call)
    .add("GET", "/v1/functions/pools", fanout::pools)
    .add("GET", "/v1/cluster", cluster::info)
    .add("POST", "/v1/cluster/nodes/{id}/drain", cluster::drain)
    .add("POST", "/v1/cluster/nodes/{id}/undrain", cluster::undrain)
    .add("DELETE", "/v1/cluster/nodes/{id}", cluster::forget)
    .finish()
    .fallback(no_route)
    .method_not_allowed_fallback(wrong_method)
    .layer(axum::middleware::from_fn_with_state(gw.clone(), count))
    .with_state(gw)
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
