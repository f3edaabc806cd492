//! A sandbox's lease on its image layers (see `warren_image::lease`), shared by every
//! substrate: taken when the image is resolved, before anything is mounted or attached, so no
//! collection removes a layer a live sandbox uses; dropped when the sandbox goes, and the
//! layers nothing else references are collected then.

use std::sync::Arc;
use warren_image::ImageStore;
use warren_types::SandboxId;

use crate::{RuntimeError, StartCause};

/// Resolves `refs` to layers and leases them to `id`. Off the async workers: resolving may
/// fetch remote layer metadata (blocking I/O).
pub(crate) async fn acquire(
    images: &Arc<ImageStore>,
    id: &SandboxId,
    refs: &[String],
) -> Result<Vec<String>, RuntimeError> {
    let (images, refs, holder) = (images.clone(), refs.to_vec(), id.to_string());
    tokio::task::spawn_blocking(move || images.acquire(&holder, &refs))
        .await
        .map_err(|e| StartCause::task("image resolve", e))?
        .map_err(image_error)
}

/// An image store error as the runtime reports it: an unknown image is `ImageNotFound`.
pub(crate) fn image_error(e: warren_image::ImageError) -> RuntimeError {
    match e {
        warren_image::ImageError::NotFound(r) => RuntimeError::ImageNotFound(r),
        e => RuntimeError::Image(e),
    }
}

/// Leases known layers to `id` (a sandbox adopted from before leases existed, or whose
/// lease was lost). Never fails the caller.
pub(crate) async fn lease(images: &Arc<ImageStore>, id: &SandboxId, layers: &[String]) {
    let (images, holder, layers) = (images.clone(), id.to_string(), layers.to_vec());
    if let Ok(Err(e)) =
        tokio::task::spawn_blocking(move || images.lease_layers(&holder, &layers)).await
    {
        tracing::warn!(sandbox = %id, error = %e, "cannot lease the sandbox's layers");
    }
}

/// Drops `id`'s lease and collects the layers nothing else references (a fork's snapshot,
/// layers of images removed while it ran). Never fails the caller.
pub(crate) async fn release(images: &Arc<ImageStore>, id: &SandboxId) {
    let images = images.clone();
    let holder = id.to_string();
    match tokio::task::spawn_blocking(move || images.release_and_collect(&holder)).await {
        Ok(Ok(r)) if !r.removed.is_empty() => {
            tracing::debug!(sandbox = %id, removed = ?r.removed, "collected layers");
        }
        Ok(Err(e)) => tracing::warn!(sandbox = %id, error = %e, "collecting layers"),
        _ => {}
    }
}

/// Leases `layers` to a holder that is not a sandbox (a snapshot).
pub(crate) async fn lease_to(
    images: &Arc<ImageStore>,
    holder: &str,
    layers: &[String],
) -> Result<(), RuntimeError> {
    let (images, holder, layers) = (images.clone(), holder.to_string(), layers.to_vec());
    tokio::task::spawn_blocking(move || images.lease_layers(&holder, &layers))
        .await
        .map_err(|e| StartCause::task("lease", e))?
        .map_err(image_error)
}

/// Drops a holder's lease (a snapshot's) and collects what nothing else holds. Never fails
/// the caller.
pub(crate) async fn release_holder(images: &Arc<ImageStore>, holder: &str) {
    let (images, h) = (images.clone(), holder.to_string());
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || images.release_and_collect(&h)).await {
        tracing::warn!(holder, error = %e, "collecting layers");
    }
}

/// What a snapshot of any substrate records beside its directory: the image layers leased to
/// it (a container's packed writable layer last).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SnapshotLayers {
    pub layers: Vec<String>,
}

impl SnapshotLayers {
    pub fn record(layers: Vec<String>) -> serde_json::Value {
        serde_json::to_value(SnapshotLayers { layers }).expect("a list of strings serializes")
    }

    pub fn parse(record: &serde_json::Value) -> Result<Vec<String>, RuntimeError> {
        serde_json::from_value::<SnapshotLayers>(record.clone())
            .map(|r| r.layers)
            .map_err(|e| StartCause::Snapshot(crate::SnapshotError::Unreadable(e)).into())
    }
}

/// Removes a snapshot of any substrate: its directory, then `holder`'s lease on its layers
/// (what nothing else holds is collected).
pub(crate) async fn remove_snapshot(images: &Arc<ImageStore>, dir: &std::path::Path, holder: &str) {
    let _ = std::fs::remove_dir_all(dir);
    release_holder(images, holder).await;
}

/// Bytes of the files under `dir` as allocated on disk (sparse files count what they hold).
pub(crate) fn disk_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some(if m.is_dir() {
                disk_usage(&e.path())
            } else {
                m.blocks() * 512
            })
        })
        .sum()
}
