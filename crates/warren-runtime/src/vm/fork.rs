//! Fork of a VM: the parent is snapshotted once (memory, devices, writable disk) into a
//! scratch directory, and each child is a restore of it with a copy of that disk, its own
//! hostname and a fresh agent session. Children share nothing writable with the parent or
//! with each other: each has its own RAM (restored from the stream) and its own disk. The
//! parent is left as it was (running, or paused). On error no child is left behind.

use futures::future::join_all;
use std::sync::Arc;

use super::create::{self, DiskFrom};
use super::{snapshot, Vm, VmRuntime};
use crate::{Instance, RuntimeError, SandboxSpec};

pub async fn fork(
    rt: &VmRuntime,
    parent: &Vm,
    children: &[SandboxSpec],
) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let scratch = rt.cfg.root.join("forks");
    std::fs::create_dir_all(&scratch)
        .map_err(|e| RuntimeError::io(format!("create {}", scratch.display()), e))?;
    let dir = scratch.join(format!("{}-{}-{n}", parent.id, std::process::id()));
    let snap = snapshot::save(rt, parent, &dir, true).await?;
    let restores = children.iter().map(|spec| {
        let snap = &snap;
        async move {
            // The parent's own layers, never its image refs again: a tag replaced since the
            // parent started must not put other disks under its memory and writable disk.
            let layers =
                crate::leases::acquire(&rt.images, &spec.id, &parent.record.layers).await?;
            match create::restore(rt, spec, &layers, snap, DiskFrom::Copy).await {
                Ok(vm) => Ok(Arc::new(vm) as Arc<dyn Instance>),
                Err(e) => {
                    crate::leases::release(&rt.images, &spec.id).await;
                    Err(e)
                }
            }
        }
    });
    let results = join_all(restores).await;
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove a fork's snapshot");
    }
    let mut made = Vec::new();
    let mut failed = None;
    for r in results {
        match r {
            Ok(i) => made.push(i),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    if let Some(e) = failed {
        for i in made {
            if let Err(e) = i.destroy().await {
                tracing::warn!(error = %e, "cannot remove the child of a failed fork");
            }
        }
        return Err(e);
    }
    Ok(made)
}

/// Removes scratch snapshots of forks whose daemon died mid-fork (named
/// `<parent>-<daemon pid>-<n>`; a live pid's are left alone).
pub fn remove_stale(root: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(root.join("forks")) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn scratch_snapshots_of_dead_daemons_are_removed() {
        let root = tempfile::tempdir_in("/tmp").unwrap();
        let forks = root.path().join("forks");
        let live = forks.join(format!("n1-01abc-{}-0", std::process::id()));
        // Pids above pid_max never run.
        let dead = forks.join("n1-01abc-99999999-3");
        for d in [&live, &dead] {
            std::fs::create_dir_all(d).unwrap();
        }
        super::remove_stale(root.path());
        assert!(live.exists() && !dead.exists());
    }
}
