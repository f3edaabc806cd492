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
    /// Once the state file is this large, no sandbox's output is kept in its trajectory
    /// (digests and sizes only), whatever its budget.
    pub state_max_bytes: u64,
    /// Lifetime of a sandbox whose create names no `ttl_secs`.
    pub default_ttl_secs: Option<u64>,
    /// Longest lifetime from now a create or an extension may give; a sandbox without a ttl
    /// (and no default) gets this one. `None`: no cap beyond `bounds.max_ttl_secs`.
    pub max_ttl_secs: Option<u64>,
    /// Timeout of a foreground command whose request names none.
    pub default_exec_timeout_secs: Option<f64>,
    /// Caps on starting and held sandboxes and the memory kept free (see [`crate::admission`]).
    pub admission: crate::admission::AdmissionConfig,
}

/// Default of [`NodeConfig::state_max_bytes`]: 8 GiB.
pub const DEFAULT_STATE_MAX_BYTES: u64 = 8 << 30;

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
            state_max_bytes: DEFAULT_STATE_MAX_BYTES,
            default_ttl_secs: None,
            max_ttl_secs: None,
            default_exec_timeout_secs: None,
            admission: Default::default(),
        }
    }

    /// The ttl a create gets: its own, else the node's default, else the node's cap.
    pub fn ttl_for(&self, asked: Option<u64>) -> Option<u64> {
        asked.or(self.default_ttl_secs).or(self.max_ttl_secs)
    }

    /// The longest ttl a request may ask for.
    pub fn ttl_cap(&self) -> u64 {
        self.max_ttl_secs
            .unwrap_or(self.bounds.max_ttl_secs)
            .min(self.bounds.max_ttl_secs)
    }
}
