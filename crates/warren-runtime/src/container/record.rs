//! What the daemon persists about a container sandbox to re-adopt it after a restart.

use serde::{Deserialize, Serialize};

/// Bumped when the record's meaning changes; older records are refused (and torn down).
pub const RECORD_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub version: u32,
    /// Host pid of the agent (PID 1 of the sandbox).
    pub agent_pid: u32,
    /// Its start time in clock ticks since boot, so a recycled pid is never mistaken for it.
    pub agent_start_time: u64,
    /// Layer digests, lowest first.
    pub layers: Vec<String>,
    /// The host directory of its writable layer on disk (see `writable.rs`); absent for a
    /// writable layer in memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_dir: Option<std::path::PathBuf>,
    /// Host uid/gid of its root, from the node's id pool; absent for a sandbox mapped to the
    /// shared `id_base` (made before the pool existed, or by a node without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_base: Option<u32>,
}
