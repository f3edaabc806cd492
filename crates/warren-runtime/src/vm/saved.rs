//! Snapshots of VMs kept by the API (`POST /v1/sandboxes/{id}/snapshot`): memory, devices
//! and the writable disk, like a fork's, but kept until deleted, so they must not depend on
//! caches. The disk is flattened (`qemu-img convert`): a sandbox's overlay is backed by its
//! template's disk, and templates are a bounded cache that may be pruned. The image layers
//! (the VM's read-only disks) are leased to the snapshot. A sandbox made from it is a restore
//! with a copy of that disk: the snapshot stays intact and may be deleted at any time.

use std::path::Path;
use std::sync::Arc;

use super::create::{self, DiskFrom};
use super::record::Snapshot;
use super::{snapshot, tool, Vm, VmRuntime};
use crate::leases::SnapshotLayers;
use crate::{Instance, RuntimeError, SandboxSpec, SavedSnapshot};

pub async fn save(
    rt: &VmRuntime,
    vm: &Vm,
    dir: &Path,
    holder: &str,
) -> Result<SavedSnapshot, RuntimeError> {
    let layers = vm.machine().layers.clone();
    crate::leases::lease_to(&rt.images, holder, &layers).await?;
    let saved = async {
        let snap = snapshot::save(rt, vm, dir, true).await?;
        let flat = dir.join("disk.flat.qcow2");
        let args = [
            "convert".to_string(),
            "-q".into(),
            "-O".into(),
            "qcow2".into(),
            snap.disk().display().to_string(),
            flat.display().to_string(),
        ];
        tool::run(&rt.cfg.qemu_img, &args).await?;
        std::fs::rename(&flat, snap.disk())
            .map_err(|e| RuntimeError::io(format!("rename {}", flat.display()), e))?;
        Ok::<_, RuntimeError>(snap)
    }
    .await;
    if let Err(e) = saved {
        let _ = std::fs::remove_dir_all(dir);
        crate::leases::release_holder(&rt.images, holder).await;
        return Err(e);
    }
    Ok(SavedSnapshot {
        record: SnapshotLayers::record(layers),
        size_bytes: crate::leases::disk_usage(dir),
        processes: true,
    })
}

pub async fn restore(
    rt: &VmRuntime,
    dir: &Path,
    record: &serde_json::Value,
    spec: &SandboxSpec,
) -> Result<Arc<dyn Instance>, RuntimeError> {
    let recorded = SnapshotLayers::parse(record)?;
    let snap = Snapshot::open(dir)?;
    if snap.meta.machine.nic != spec.network {
        return Err(crate::Unsupported::SnapshotNetwork {
            snapshot_has_nic: snap.meta.machine.nic,
        }
        .into());
    }
    let layers = crate::leases::acquire(&rt.images, &spec.id, &recorded).await?;
    match create::restore(rt, spec, &layers, &snap, DiskFrom::Copy).await {
        Ok(vm) => Ok(Arc::new(vm)),
        Err(e) => {
            crate::leases::release(&rt.images, &spec.id).await;
            Err(e)
        }
    }
}
