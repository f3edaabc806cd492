//! The node: its parts side by side, each with one owner, as the API router's state.
//!
//! - [`Manager`] owns the registry of sandboxes and their lifecycle (create, fork, pause,
//!   delete, the reaper, recovery) and the step runner every logged call goes through;
//! - [`Images`] owns the image routes over the node's layer store;
//! - [`Functions`] owns the warm pools of the function call API;
//! - [`SandboxNetwork`] owns the node's links, rules and resolvers, and applies sandboxes'
//!   network policies (the manager calls it at create, fork, delete and recovery);
//! - [`Telemetry`] owns the sandboxes' counters, the event feed and the scrape window, and
//!   answers `/metrics`' sandbox figures and a sandbox's stats by reading the manager;
//! - [`Trajectories`] owns the trajectory shipper and the log source revive reads from, and
//!   serves export and revive (the manager seals a deleted sandbox's log through it);
//! - [`Snapshots`] owns the node's snapshots (their directory and table): saving one reads
//!   the manager's sandbox, and the manager creates sandboxes from them;
//! - [`Terminals`] owns the terminal sessions it opens in the manager's sandboxes;
//! - [`Processes`] and [`Files`] own nothing: they serve the commands and file calls into
//!   the manager's sandboxes, through its step runner ([`Files`] also packs what a sandbox
//!   changed into a layer, for builds); [`Ports`] owns nothing either: it connects to ports
//!   inside the manager's sandboxes.
//! - [`Builds`] runs image builds (each `RUN` a sandbox of the [`Manager`]).
//!
//! They reach each other in one direction only. The manager holds the parts it calls into
//! ([`crate::manager::Parts`]: network, telemetry, trajectories, snapshots), whose own calls
//! that need a sandbox are handed the manager; terminals, processes and files hold the
//! manager. A handler takes the parts it serves (axum's [`FromRef`] hands each out of the
//! node), and only the node stops them all.

use axum::extract::FromRef;
use std::sync::Arc;
use warren_image::ImageStore;
use warren_types::Substrate;

use crate::builds::Builds;
use crate::functions::{FunctionPools, Functions, NoBackend, RuntimeBackend, WarmBackend};
use crate::images::Images;
use crate::manager::{
    Files, Manager, Ports, Processes, SandboxNetwork, Snapshots, Telemetry, Terminals, Trajectories,
};

/// Every part of a node. Cheap to clone; every clone is the same node.
#[derive(Clone, Debug)]
pub struct Node {
    pub sandboxes: Manager,
    pub images: Images,
    pub functions: Functions,
    pub network: SandboxNetwork,
    pub telemetry: Telemetry,
    pub trajectories: Trajectories,
    pub snapshots: Snapshots,
    pub terminals: Terminals,
    pub processes: Processes,
    pub files: Files,
    pub ports: Ports,
    pub builds: Builds,
    /// Requests answered by the node's API router, by route and status.
    pub http: warren_edge::HttpMetrics,
}

impl Node {
    /// The node around `sandboxes`, serving `images` (the store its runtimes use) and warm
    /// function pools on its container runtime (none when it serves no containers).
    pub fn new(sandboxes: Manager, images: Option<Arc<ImageStore>>) -> Node {
        let cfg = sandboxes.config();
        let backend: Arc<dyn WarmBackend> = match sandboxes
            .substrates()
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
        if let Some(s) = &images {
            sandboxes.set_image_store(s.clone());
        }
        Node {
            builds: Builds::new(sandboxes.clone(), images.clone()),
            ports: Ports::new(sandboxes.clone()),
            images: Images::new(images),
            network: sandboxes.parts().network.clone(),
            telemetry: sandboxes.parts().telemetry.clone(),
            trajectories: sandboxes.parts().trajectories.clone(),
            snapshots: sandboxes.parts().snapshots.clone(),
            terminals: Terminals::new(sandboxes.clone()),
            processes: Processes::new(sandboxes.clone()),
            files: Files::new(sandboxes.clone()),
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
        self.telemetry.register_metrics(&mut reg, &self.sandboxes);
        self.functions.register_metrics(&mut reg);
        self.images.register_metrics(&mut reg);
        crate::metrics::host::register(&mut reg);
        let disk = self
            .sandboxes
            .substrates()
            .runtimes()
            .iter()
            .find_map(|r| r.writable_space());
        crate::metrics::host::register_writable(&mut reg, disk);
        crate::metrics::encode(&reg)
    }

    /// Destroys every warm function container (when the daemon stops), then lets the
    /// runtimes remove the node's host objects that are now unused. Sandboxes stay (see
    /// [`Manager::shutdown`]).
    pub async fn stop(&self) {
        self.functions.shutdown().await;
        for r in self.sandboxes.substrates().runtimes() {
            r.shutdown();
        }
    }
}

/// Hands each part out of the node (axum's [`FromRef`]) to the handlers that take it.
macro_rules! served_parts {
    ($($part:ty => $field:ident),* $(,)?) => {
        $(impl FromRef<Node> for $part {
            fn from_ref(node: &Node) -> $part {
                node.$field.clone()
            }
        })*
    };
}

served_parts!(
    Manager => sandboxes,
    Images => images,
    Functions => functions,
    SandboxNetwork => network,
    Telemetry => telemetry,
    Trajectories => trajectories,
    Snapshots => snapshots,
    Terminals => terminals,
    Processes => processes,
    Files => files,
    Ports => ports,
    Builds => builds,
);
