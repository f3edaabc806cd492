//! `GET /v1/sandboxes/{id}/stats`: what one sandbox uses now, against what it asked for.

use serde::{Deserialize, Serialize};

use crate::SandboxState;

/// A sandbox's resource use at one moment. Figures the substrate cannot read (a stopped
/// sandbox has none; a VM's writable disk is inside the guest) are `null`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxStats {
    pub id: String,
    pub state: SandboxState,
    /// When the figures were read, ms since the epoch.
    pub sampled_at_ms: u64,
    /// CPU time used since the sandbox started, in microseconds.
    pub cpu_usec: Option<u64>,
    /// CPU used over the last `window_secs`, as a share of the sandbox's CPU limit (1.0 = all
    /// of `cpus`).
    pub cpu_share: Option<f64>,
    /// The window of `cpu_share`: since the previous stats read of this sandbox (when at least
    /// a quarter of a second ago), else since it was created.
    pub window_secs: Option<f64>,
    /// The CPU limit, in cores.
    pub cpus: f64,
    pub memory_bytes: Option<u64>,
    /// Highest memory use seen by the kernel, where it keeps it.
    pub memory_peak_bytes: Option<u64>,
    pub memory_limit_bytes: u64,
    /// Bytes of the writable layer in use (where the layer lives in memory: what its files
    /// take of the memory limit).
    pub disk_bytes: Option<u64>,
    pub disk_limit_bytes: u64,
    pub pids: Option<u64>,
    pub pids_limit: u64,
    /// Processes the OOM killer has killed in the sandbox so far.
    pub oom_kills: Option<u64>,
    /// Bytes the sandbox's trajectory holds, against its budget.
    pub trajectory_bytes: u64,
    pub trajectory_budget_bytes: u64,
    /// Seconds since the sandbox's last call.
    pub idle_secs: f64,
}
