//! The cluster vocabulary shared by nodes, gateways and clients: what a node publishes about
//! itself (its record in the membership store), and what `GET /v1/cluster` answers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::id::NodeId;
use crate::sandbox::Substrate;

/// Format of a [`NodeRecord`]; a gateway ignores records of a newer format it cannot read.
pub const NODE_RECORD_FORMAT: u32 = 1;

/// A node's state as a gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Registered and taking new sandboxes.
    Ready,
    /// Registered; serves its sandboxes but takes no new ones.
    Draining,
    /// Its registration expired (the node stopped renewing it): its sandboxes are unreachable.
    Lost,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Draining => "draining",
            NodeState::Lost => "lost",
        }
    }
}

/// What a node admits at most (its own admission check is the final word).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeCapacity {
    /// Most sandboxes held at once, any state.
    pub max_sandboxes: u64,
    /// Most sandboxes running (or paused) at once.
    pub max_running: u64,
    /// Most sandboxes starting at once.
    pub max_starting: u64,
    /// The host's memory, in MiB.
    pub memory_total_mb: u64,
    /// New sandboxes are refused while the host has less memory available than this, in MiB.
    pub min_free_memory_mb: u64,
    /// Largest memory limit one sandbox may ask for, in MiB.
    pub max_sandbox_memory_mb: u64,
}

/// A node's load, as last published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NodeLoad {
    pub creating: u64,
    pub running: u64,
    pub paused: u64,
    pub stopped: u64,
    pub failed: u64,
    /// Memory limits of the sandboxes that are creating or running, in MiB.
    pub memory_reserved_mb: u64,
    /// The host's available memory (`MemAvailable`), in MiB.
    pub memory_available_mb: u64,
    /// CPU pressure: PSI `some avg10`, percent (0 where the kernel has no PSI).
    pub cpu_pressure: f64,
    /// Sandboxes held, any state, by substrate name (absent in records of older nodes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_substrate: BTreeMap<String, u64>,
}

impl NodeLoad {
    /// Sandboxes held in any state.
    pub fn sandboxes(&self) -> u64 {
        self.creating + self.running + self.paused + self.stopped + self.failed
    }
}

/// A warm function pool of a node, in short.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct WarmPool {
    /// Image refs, lowest first.
    pub image: Vec<String>,
    pub memory_mb: u64,
    /// Warm containers waiting for a call.
    pub idle: u64,
    /// Warm containers running a call.
    pub busy: u64,
}

/// What a node publishes about itself under its lease (`/warren/nodes/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub format: u32,
    pub id: NodeId,
    /// Taken at boot: tells a restarted node from the one before it, and a duplicate apart.
    pub incarnation: String,
    /// Where the node serves the API (`http://host:port`).
    pub address: String,
    pub version: String,
    pub started_at_ms: u64,
    pub substrates: Vec<Substrate>,
    pub capacity: NodeCapacity,
    pub load: NodeLoad,
    #[serde(default)]
    pub pools: Vec<WarmPool>,
    /// Image refs (`name:tag`) the node has, each with its layer digests, lowest first.
    #[serde(default)]
    pub images: BTreeMap<String, Vec<String>>,
    /// Layer digests whose data is on the node's disk.
    #[serde(default)]
    pub layers: Vec<String>,
    /// The node can fetch layers it lacks from a blob store.
    #[serde(default)]
    pub blob_store: bool,
}

/// One node in `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    pub id: NodeId,
    pub state: NodeState,
    /// The last record the node published (kept for a lost node).
    #[serde(flatten)]
    pub record: NodeSummaryRecord,
    /// Placements of this gateway sent to the node and not answered yet.
    pub in_flight: u64,
}

/// The published part of a [`NodeSummary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSummaryRecord {
    pub incarnation: String,
    pub address: String,
    pub version: String,
    pub started_at_ms: u64,
    pub substrates: Vec<Substrate>,
    pub capacity: NodeCapacity,
    pub load: NodeLoad,
    pub pools: Vec<WarmPool>,
    /// Image refs the node has.
    pub images: Vec<String>,
    /// Layer digests on the node's disk.
    pub layers: Vec<String>,
}

impl From<&NodeRecord> for NodeSummaryRecord {
    fn from(r: &NodeRecord) -> Self {
        NodeSummaryRecord {
            incarnation: r.incarnation.clone(),
            address: r.address.clone(),
            version: r.version.clone(),
            started_at_ms: r.started_at_ms,
            substrates: r.substrates.clone(),
            capacity: r.capacity.clone(),
            load: r.load.clone(),
            pools: r.pools.clone(),
            images: r.images.keys().cloned().collect(),
            layers: r.layers.clone(),
        }
    }
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// Every node this gateway knows, by id.
    pub nodes: Vec<NodeSummary>,
    /// The gateway's watch on the membership store is live (false: it routes on its last view).
    pub etcd_connected: bool,
    /// The store revision the view reflects.
    pub revision: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_flattens_the_record() {
        let rec = NodeRecord {
            format: NODE_RECORD_FORMAT,
            id: "n1".parse().unwrap(),
            incarnation: "i".into(),
            address: "http://127.0.0.1:1".into(),
            version: "0".into(),
            started_at_ms: 1,
            substrates: vec![Substrate::Container],
            capacity: NodeCapacity::default(),
            load: NodeLoad::default(),
            pools: vec![],
            images: [("default:latest".to_string(), vec!["sha256:aa".into()])].into(),
            layers: vec![],
            blob_store: false,
        };
        let s = NodeSummary {
            id: rec.id.clone(),
            state: NodeState::Ready,
            record: (&rec).into(),
            in_flight: 0,
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["state"], "ready");
        assert_eq!(v["address"], "http://127.0.0.1:1");
        assert_eq!(v["images"][0], "default:latest");
        let back: NodeSummary = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        let rec2: NodeRecord = serde_json::from_str(&serde_json::to_string(&rec).unwrap()).unwrap();
        assert_eq!(rec2, rec);
    }
}
