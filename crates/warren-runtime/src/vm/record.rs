//! What the daemon persists about a VM sandbox, and the snapshot format (its files and the
//! machine it fits); [`super::snapshot`] saves and restores them.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::RuntimeError;

/// Bumped when the record's meaning changes; older records are refused (and torn down).
pub const RECORD_VERSION: u32 = 1;

/// Bumped when the snapshot layout or its meaning changes; older snapshots are refused.
pub const SNAPSHOT_FORMAT: u32 = 1;

/// Bumped when the VMM's command line or device layout changes: snapshots of another
/// layout cannot be restored.
pub const MACHINE_LAYOUT: u32 = 3;

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
    /// The guest's RAM is the file `ram` (a template), not part of `memory`.
    #[serde(default)]
    pub ram_file: bool,
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
    /// A network interface (a sandbox created with a network policy): QEMU runs in a network
    /// namespace of its own with a tap there. Left out when false, so keys of machines
    /// without one are what they were before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub nic: bool,
}

impl MachineKey {
    /// A short stable name (hex of a SHA-256 of the key).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let json = serde_json::to_vec(self).expect("key serializes");
        hex::encode(Sha256::digest(json))[..24].to_string()
    }
}

/// Migration capabilities both ends enable. RAM in a shared file (a template) is left out
/// of the stream (`x-ignore-shared`); other RAM is written at fixed offsets of the file,
/// zero pages never (`mapped-ram`). QEMU 10.0 cannot combine the two (the save fails with
/// "Bad address"), and a stream without RAM gains nothing from `mapped-ram`.
/// Each capability is set either way: a VM restored from a template still has the
/// template's capabilities when it is saved in turn.
pub fn capabilities(ram_file: bool) -> [(&'static str, bool); 2] {
    [("x-ignore-shared", ram_file), ("mapped-ram", !ram_file)]
}

/// Hostname of a template's guest (every restored sandbox shares it).
pub const TEMPLATE_HOSTNAME: &str = "sandbox";

/// A saved VM.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub dir: PathBuf,
    pub meta: SnapshotMeta,
}

impl Snapshot {
    pub fn memory(&self) -> PathBuf {
        self.dir.join("memory")
    }

    /// The guest's RAM, when [`SnapshotMeta::ram_file`].
    pub fn ram(&self) -> PathBuf {
        self.dir.join(super::memory::RAM_FILE)
    }

    pub fn disk(&self) -> PathBuf {
        self.dir.join("disk.qcow2")
    }

    /// Opens a snapshot directory, refusing other formats.
    pub fn open(dir: &Path) -> Result<Snapshot, RuntimeError> {
        let p = dir.join("snapshot.json");
        let s = std::fs::read_to_string(&p)
            .map_err(|e| RuntimeError::io(format!("read {}", p.display()), e))?;
        let meta: SnapshotMeta = serde_json::from_str(&s).map_err(|source| {
            RuntimeError::Vmm(crate::VmmError::SnapshotRecord {
                path: p.clone(),
                source,
            })
        })?;
        if meta.format != SNAPSHOT_FORMAT {
            return Err(RuntimeError::Vmm(crate::VmmError::SnapshotFormat {
                found: meta.format,
                reads: SNAPSHOT_FORMAT,
            }));
        }
        Ok(Snapshot {
            dir: dir.to_path_buf(),
            meta,
        })
    }
}
