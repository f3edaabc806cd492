//! What the daemon persists about a VM sandbox, and the snapshot format.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Bumped when the record's meaning changes; older records are refused (and torn down).
pub const RECORD_VERSION: u32 = 1;

/// Bumped when the snapshot layout or its meaning changes; older snapshots are refused.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Bumped when the VMM's command line or device layout changes: snapshots of another
/// layout cannot be restored.
pub const MACHINE_LAYOUT: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub version: u32,
    /// Host pid of the VMM and its start time (so a recycled pid is never mistaken for it).
    pub qemu_pid: u32,
    pub qemu_start_time: u64,
    /// The sandbox's directory (sockets, writable disk, logs).
    pub dir: PathBuf,
    /// Layer digests, lowest first.
    pub layers: Vec<String>,
    /// Created by restoring this template, if any.
    pub template: Option<String>,
}

/// `snapshot.json` next to a snapshot's memory and disk files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    pub format: u32,
    pub substrate: String,
    /// What the machine was made of: a snapshot only restores into the same machine.
    pub machine: MachineKey,
    pub created_ms: u64,
    /// Seconds the snapshot took to write (memory + disk).
    pub save_secs: f64,
}

/// Everything that must be equal between the VM that saved a snapshot and the one that
/// restores it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MachineKey {
    /// [`MACHINE_LAYOUT`] of the daemon that made it (command line, devices).
    pub layout: u32,
    pub substrate: String,
    pub layers: Vec<String>,
    pub memory_mb: u64,
    pub cpus: u32,
    pub disk_mb: u64,
    pub accel: String,
    pub kernel: String,
    pub initramfs: String,
    pub qemu: String,
}

impl MachineKey {
    /// A short stable name (hex of a SHA-256 of the key).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let json = serde_json::to_vec(self).expect("key serializes");
        hex::encode(Sha256::digest(json))[..24].to_string()
    }
}

/// Start time (field 22 of /proc/PID/stat) of a process.
pub fn start_time(pid: u32) -> Option<u64> {
    crate::container::start_time(pid)
}
