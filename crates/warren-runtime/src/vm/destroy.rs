//! Tearing VM sandboxes down: kill the VMM through the sandbox's cgroups, then remove its
//! directory (sockets, writable disk, logs). Shared bases and templates stay.

use std::path::Path;
use warren_types::SandboxId;

use super::VmRuntime;
use crate::cgroup::CgroupSet;
use crate::RuntimeError;

/// Kills the sandbox's VMM and removes everything it owned. Idempotent.
pub async fn destroy(cgroups: &CgroupSet, dir: &Path) -> Result<(), RuntimeError> {
    if cgroups.exists() {
        cgroups.kill().await?;
        cgroups.remove().await?;
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io(format!("remove {}", dir.display()), e)),
    }
}

/// Removes sandbox directories (and their cgroups) of this substrate that no known sandbox
/// owns, and half-written snapshots.
pub async fn reconcile(rt: &VmRuntime, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError> {
    let mut removed = Vec::new();
    let dir = rt.sandboxes_dir();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Ok(removed);
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if known.iter().any(|k| k.as_str() == name) {
            continue;
        }
        let sub = std::fs::read_to_string(e.path().join("substrate")).unwrap_or_default();
        if !sub.is_empty() && sub != rt.substrate.as_str() {
            continue;
        }
        destroy(&rt.hierarchy.set_for(&name), &e.path()).await?;
        removed.push(format!("{} {name}", rt.substrate.as_str()));
    }
    if let Ok(rd) = std::fs::read_dir(rt.cfg.root.join("templates")) {
        for e in rd.flatten() {
            // Half-written snapshots of a daemon that died while saving (another daemon may
            // be writing its own right now: only old ones go).
            let partial = e
                .path()
                .extension()
                .is_some_and(|x| x.to_string_lossy().starts_with("partial-"));
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > std::time::Duration::from_secs(3600));
            if partial && old {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(removed)
}
