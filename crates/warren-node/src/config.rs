//! The node's settings: who it is, how many sandboxes it holds, and the defaults and bounds
//! applied to every create request.

use std::time::Duration;
use warren_types::sandbox::LimitBounds;
use warren_types::{Limits, NodeId};

/// Settings of one node's manager.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node: NodeId,
    /// Most sandboxes held at once (any state); more creates answer `limit_exceeded`.
    pub max_sandboxes: usize,
    /// Limits of a sandbox whose request leaves them out.
    pub defaults: Limits,
    /// Largest limits a request may ask for.
    pub bounds: LimitBounds,
    /// How often the reaper looks for expired, idle and lost sandboxes.
    pub reap_interval: Duration,
    /// Hostname of a sandbox whose request names none.
    pub default_hostname: String,
    /// Warm pools of function calls.
    pub functions: crate::functions::FunctionConfig,
    /// The confinement the node's runtime applies (reported by `/v1/health`).
    pub security: warren_runtime::security::SecurityReport,
    /// Caps on starting and held sandboxes and the memory kept free (see [`crate::admission`]).
    pub admission: crate::admission::AdmissionConfig,
}

impl NodeConfig {
    pub fn new(node: NodeId) -> Self {
        NodeConfig {
            node,
            max_sandboxes: 10_000,
            defaults: Limits::default(),
            bounds: LimitBounds::default(),
            reap_interval: Duration::from_secs(1),
            default_hostname: "sandbox".into(),
            functions: Default::default(),
            security: Default::default(),
            admission: Default::default(),
        }
    }
}
