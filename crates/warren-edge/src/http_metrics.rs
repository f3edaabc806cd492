//! HTTP request metrics by route, shared by warrend and the gateway.
//!
//! [`HttpMetrics::layer`] goes on an API router (inside it, where axum knows the matched route
//! template): every answered request counts once under its method, route template (never the
//! raw path, so the label set stays bounded whatever clients send) and status, and its time to
//! the response head goes into a histogram. A streamed body (exec streams, terminals) is timed
//! to its head only. Requests no route matched count under the route `unmatched`.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Instant;

/// Upper bounds (seconds) of the request time buckets.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// Labels of a counted request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

/// Labels of a timed request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The request counters of one server. Cheap to clone; clones count together.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    seconds: Family<RouteLabels, Histogram, fn() -> Histogram>,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            requests: Family::default(),
            seconds: Family::new_with_constructor(histogram),
        }
    }
}

impl HttpMetrics {
    /// Puts the counting middleware on `router` (call it after every route is added).
    pub fn layer<S: Clone + Send + Sync + 'static>(
        &self,
        router: axum::Router<S>,
    ) -> axum::Router<S> {
        router.layer(axum::middleware::from_fn_with_state(self.clone(), track))
    }

    /// Adds `warren_http_requests_total` and `warren_http_request_seconds` to `reg`.
    pub fn register(&self, reg: &mut Registry) {
        reg.register(
            "warren_http_requests",
            "HTTP requests answered, by method, route template and status",
            self.requests.clone(),
        );
        reg.register(
            "warren_http_request_seconds",
            "Time from an HTTP request to its response head, by method and route template",
            self.seconds.clone(),
        );
    }

    /// Counts one answered request (what the middleware does; public for tests).
    pub fn observe(&self, method: &str, route: &str, status: u16, secs: f64) {
        let (method, route) = (method.to_string(), route.to_string());
        self.seconds
            .get_or_create(&RouteLabels {
                method: method.clone(),
                route: route.clone(),
            })
            .observe(secs);
        self.requests
            .get_or_create(&RequestLabels {
                method,
                route,
                status,
            })
            .inc();
    }
}

/// Adds `warren_build_info` (the daemon's version, in its label) to `reg`.
pub fn register_build_info(reg: &mut Registry) {
    reg.register(
        "warren_build",
        "The daemon's build",
        prometheus_client::metrics::info::Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
}

/// The metric families of a scrape (`# TYPE name …` lines) that `doc` (the Markdown of
/// `docs/metrics.md`) does not name in backticks: what a test of each server holds empty.
pub fn undocumented(scrape: &str, doc: &str) -> Vec<String> {
    scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .map(str::to_string)
        .collect()
}

async fn track(State(m): State<HttpMetrics>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let method = req.method().clone();
    let started = Instant::now();
    let resp = next.run(req).await;
    m.observe(
        method.as_str(),
        route.as_deref().unwrap_or("unmatched"),
        resp.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    async fn hit(router: &axum::Router, path: &str) -> u16 {
        let req = axum::http::Request::get(path).body(Body::empty()).unwrap();
        router.clone().oneshot(req).await.unwrap().status().as_u16()
    }

    #[tokio::test]
    async fn requests_count_by_route_template_not_by_path() {
        let m = HttpMetrics::default();
        let router = m.layer(axum::Router::new().route("/v1/things/{id}", get(|| async { "ok" })));
        assert_eq!(hit(&router, "/v1/things/a").await, 200);
        assert_eq!(hit(&router, "/v1/things/b").await, 200);
        assert_eq!(hit(&router, "/nowhere/x").await, 404);
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains(
                "warren_http_requests_total{method=\"GET\",route=\"/v1/things/{id}\",status=\"200\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "warren_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("/v1/things/a"), "{text}");
        assert!(
            text.contains(
                "warren_http_request_seconds_count{method=\"GET\",route=\"/v1/things/{id}\"} 2"
            ),
            "{text}"
        );
    }

    #[test]
    fn undocumented_families_are_found() {
        let scrape = "# HELP a_total x\n# TYPE a_total counter\na_total 1\n# TYPE b gauge\nb 2\n";
        assert_eq!(undocumented(scrape, "| `a_total` | counter |"), vec!["b"]);
        assert!(undocumented(scrape, "`a_total` and `b`").is_empty());
    }
}
