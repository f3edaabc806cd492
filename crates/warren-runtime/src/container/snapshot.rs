//! Snapshots of containers: the writable layer packed into a layer of the image store, as for
//! a fork ([`super::fork::snapshot`]), kept under the snapshot's own lease. A container made
//! from it is an ordinary create on the parent's stack plus that layer: it has the files, not
//! the processes (a container's processes are not saved).

use std::path::Path;
use std::sync::Arc;

use super::{create, fork, Container, ContainerRuntime};
use crate::leases::SnapshotLayers;
use crate::{Instance, RuntimeError, SandboxSpec, SavedSnapshot};

pub async fn save(
    rt: &ContainerRuntime,
    c: &Container,
    dir: &Path,
    holder: &str,
) -> Result<SavedSnapshot, RuntimeError> {
    if dir.exists() {
        return Err(RuntimeError::io(
            format!("create {}", dir.display()),
            std::io::Error::from(std::io::ErrorKind::AlreadyExists),
        ));
    }
    // A consistent copy needs the sandbox still; a paused one already is.
    let was_paused = c.is_paused();
    if !was_paused {
        c.cgroups.freeze(true).await?;
    }
    let packed = fork::snapshot(rt, c).await;
    if !was_paused {
        c.cgroups.freeze(false).await?;
    }
    let (digest, temporary) = packed?;
    let mut layers = c.record.layers.clone();
    layers.push(digest.clone());
    let leased = crate::leases::lease_to(&rt.images, holder, &layers).await;
    // The snapshot's own lease holds the layer now (or it failed and the layer goes).
    drop(temporary);
    let written = leased.and_then(|()| {
        std::fs::create_dir_all(dir)
            .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))
    });
    if let Err(e) = written {
        crate::leases::release_holder(&rt.images, holder).await;
        let images = rt.images.clone();
        let _ = tokio::task::spawn_blocking(move || images.collect(&[digest])).await;
        return Err(e);
    }
    let size_bytes = rt
        .images
        .blob_path(&digest)
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    Ok(SavedSnapshot {
        record: SnapshotLayers::record(layers),
        size_bytes,
        processes: false,
    })
}

pub async fn restore(
    rt: &ContainerRuntime,
    record: &serde_json::Value,
    spec: &SandboxSpec,
) -> Result<Arc<dyn Instance>, RuntimeError> {
    let recorded = SnapshotLayers::parse(record)?;
    let mut spec = spec.clone();
    spec.image = recorded;
    Ok(Arc::new(create::create(rt, &spec, None).await?))
}
