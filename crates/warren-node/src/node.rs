//! The node: its parts side by side, each with one owner, as the API router's state.
//!
//! - [`Manager`] owns the sandboxes (lifecycle, calls, trajectory, recovery, reaper);
//! - [`Images`] owns the image routes over the node's layer store;
//! - [`Functions`] owns the warm pools of the function call API.
//!
//! None of them reaches into another: a handler takes the part it serves (axum's
//! [`FromRef`] hands each out of the node), and only the node stops them all.

use axum::extract::FromRef;
use std::sync::Arc;
use warren_image::ImageStore;
use warren_types::Substrate;

use crate::functions::{FunctionPools, Functions, NoBackend, RuntimeBackend, WarmBackend};
use crate::images::Images;
use crate::manager::Manager;

/// Every part of a node. Cheap to clone; every clone is the same node.
#[derive(Clone, Debug)]
pub struct Node {
    pub sandboxes: Manager,
    pub images: Images,
    pub functions: Functions,
    /// Requests answered by the node's API router, by route and status.
    pub http: warren_edge::HttpMetrics,
}

impl Node {
    /// The node around `sandboxes`, serving `images` (the store its runtimes use) and warm
    /// function pools on its container runtime (none when it serves no containers).
    pub fn new(sandboxes: Manager, images: Option<Arc<ImageStore>>) -> Node {
        let cfg = sandboxes.config();
        let backend: Arc<dyn WarmBackend> = match sandboxes
            .runtimes()
            .iter()
            .find(|r| r.substrate() == Substrate::Container)
        {
            Some(r) => Arc::new(RuntimeBackend {
                runtime: r.clone(),
                node: cfg.node.clone(),
            }),
            None => Arc::new(NoBackend),
        };
        let pools = FunctionPools::new(cfg.functions.clone(), backend);
        let functions = Functions::new(pools, cfg.defaults.clone(), cfg.bounds.clone());
        Node {
            images: Images::new(images),
            functions,
            sandboxes,
            http: warren_edge::HttpMetrics::default(),
        }
    }

    /// The Prometheus text of `/metrics`: one registry per scrape, into which each part
    /// registers its own figures, encoded once.
    pub fn render_metrics(&self) -> String {
        let mut reg = crate::metrics::Registry::default();
        crate::metrics::register_build_info(&mut reg);
        self.http.register(&mut reg);
        self.sandboxes.register_metrics(&mut reg);
        self.functions.register_metrics(&mut reg);
        self.images.register_metrics(&mut reg);
        crate::metrics::host::register(&mut reg);
        crate::metrics::encode(&reg)
    }

    /// Destroys every warm function container (when the daemon stops), then lets the
    /// runtimes remove the node's host objects that are now unused. Sandboxes stay (see
    /// [`Manager::shutdown`]).
    pub async fn stop(&self) {
        self.functions.shutdown().await;
        for r in self.sandboxes.runtimes() {
            r.shutdown();
        }
    }
}

impl FromRef<Node> for Manager {
    fn from_ref(node: &Node) -> Manager {
        node.sandboxes.clone()
    }
}

impl FromRef<Node> for Images {
    fn from_ref(node: &Node) -> Images {
        node.images.clone()
    }
}

impl FromRef<Node> for Functions {
    fn from_ref(node: &Node) -> Functions {
        node.functions.clone()
    }
}
