//! The Warren cluster gateway: the node API over many nodes. Stateless; run as many as you
//! like behind any load balancer.
//!
//! - per-sandbox routes go to the node the sandbox id names (`<node>-<ulid>`), over pooled
//!   connections, streams and the PTY upgrade included ([`proxy`]);
//! - creates and function calls are placed ([`warren_cluster::place`]) on the gateway's etcd
//!   view; a node's `429` sends the request to the next candidate;
//! - listings, images and pools fan out to every node and merge;
//! - `GET /v1/cluster` and drain/undrain are the gateway's own;
//! - a trajectory whose node cannot answer for it is read from the trajectory store, and a
//!   revive of a sandbox whose node is gone is placed on a live node, which reads the store.
//!
//! What a caller sees when things fail: a node that does not answer → `503 node_unreachable`
//! at once; a node whose registration expired → `410 sandbox_lost`; every candidate refused →
//! `503 capacity_unavailable` with `Retry-After`; no node could ever fit → `422
//! unschedulable` saying what excluded how many nodes. A caller never gets another sandbox
//! under an id: sandboxes never move between nodes.
//!
//! [`Gateway::router`] is an axum `Router`; the binary serves it behind [`warren_edge`]
//! (TLS, tokens, throttling of bad tokens), exactly like `warrend`. The gateway checks a
//! token before it forwards and passes it on: nodes, which share the auth file, decide what
//! the tenant may see. The gateway's own routes need a token too; drain and undrain and
//! `/metrics` need the admin role.

pub mod bench;
mod cluster;
pub mod error;
mod events;
mod fanout;
mod fusion;
mod inflight;
mod liveness;
mod metrics;
pub mod proxy;
mod revive;
mod routes;
mod sandboxes;
mod shipped;

use std::sync::Arc;
use std::time::Duration;

use warren_cluster::ClusterView;

pub use error::{GatewayError, GatewayResult};
pub use inflight::InFlight;
pub use routes::{routes, CLUSTER_ROUTES};

/// Settings of a gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Nodes sampled per placement (power of k choices).
    pub k: usize,
    /// Most nodes asked for one create or call before answering `capacity_unavailable`.
    pub max_attempts: usize,
    /// Longest a fanned-out listing waits for one node.
    pub fanout_timeout: Duration,
    /// This gateway's name (in `/v1/health`).
    pub name: String,
    /// TLS toward `https://` nodes (roots, client certificate); `None`: the system's roots.
    pub node_tls: Option<rustls::ClientConfig>,
    /// Where nodes ship trajectories: read when a sandbox's node cannot answer for it.
    pub trajectory_store: Option<std::sync::Arc<dyn warren_blob::BlobStore>>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            k: 2,
            max_attempts: 4,
            fanout_timeout: Duration::from_secs(10),
            name: "gateway".into(),
            node_tls: None,
            trajectory_store: None,
        }
    }
}

/// A gateway over one cluster view. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Gateway {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: GatewayConfig,
    view: ClusterView,
    proxy: proxy::Proxy,
    in_flight: InFlight,
    metrics: metrics::Metrics,
}

impl Gateway {
    pub fn new(cfg: GatewayConfig, view: ClusterView) -> Self {
        Gateway {
            inner: Arc::new(Inner {
                proxy: proxy::Proxy::with_tls(cfg.node_tls.clone()),
                cfg,
                view,
                in_flight: InFlight::default(),
                metrics: metrics::Metrics::default(),
            }),
        }
    }

    /// The HTTP API of the gateway.
    pub fn router(&self) -> axum::Router {
        routes::router(self.clone())
    }

    pub fn view(&self) -> &ClusterView {
        &self.inner.view
    }

    pub fn config(&self) -> &GatewayConfig {
        &self.inner.cfg
    }

    fn proxy(&self) -> &proxy::Proxy {
        &self.inner.proxy
    }
}
