//! Tearing sandboxes down: everything a container owns on the host is its cgroups (mounts
//! and network live in its namespaces and vanish with its last process).

use warren_types::SandboxId;

use crate::cgroup::{CgroupSet, Hierarchy};
use crate::RuntimeError;

/// Kills every process of the sandbox, then removes its cgroups. Idempotent.
pub async fn kill_and_remove(cgroups: &CgroupSet) -> Result<(), RuntimeError> {
    if !cgroups.exists() {
        return Ok(());
    }
    cgroups.kill().await?;
    cgroups.remove().await
}

/// Deletes the sandbox's writable layer on disk (after its processes are gone).
pub async fn remove_writable(store: &std::sync::Arc<super::WritableStore>, id: &SandboxId) {
    let store = store.clone();
    let id = id.to_string();
    let _ = tokio::task::spawn_blocking(move || store.remove(&id)).await;
}

/// Tears down every sandbox group not in `known`.
pub async fn reconcile(h: &Hierarchy, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError> {
    let mut removed = Vec::new();
    for name in h.list() {
        if known.iter().any(|k| k.as_str() == name) {
            continue;
        }
        let set = h.set_for(&name);
        let n = set.pids().len();
        kill_and_remove(&set).await?;
        removed.push(format!("container {name} ({n} processes)"));
    }
    Ok(removed)
}
