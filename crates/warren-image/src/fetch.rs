//! Layers whose blobs are not in the store: a [`LayerSource`] (the node's blob cache) makes
//! them available. The store asks it at resolve time (so an unreachable blob store fails a
//! sandbox before anything of it exists) and for the file to mount.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{ImageError, ImageStore};

/// Provides layers that are not in the local store.
pub trait LayerSource: Send + Sync + std::fmt::Debug {
    /// Fetches what is needed to mount `digest` (at least its metadata). `Ok(false)` if the
    /// source does not know the layer.
    fn prepare(&self, digest: &str) -> Result<bool, ImageError>;
    /// The file to mount for a prepared layer (a local file, or a lazily filled one).
    fn mount_source(&self, digest: &str) -> Result<PathBuf, ImageError>;
    /// A live sandbox uses these layers (they must not be evicted).
    fn pin(&self, digests: &[String]);
    /// The sandbox is gone.
    fn unpin(&self, digests: &[String]);
    /// What the source fetched and served so far, for sources that count it.
    fn stats(&self) -> Option<SourceStats> {
        None
    }
    /// Uploads `file`, a layer made on this node (a build's), so that other nodes can fetch
    /// it. `Ok(false)`: the source takes no uploads. A layer the source has already is
    /// not sent again.
    fn publish(&self, _digest: &str, _file: &std::path::Path) -> Result<bool, ImageError> {
        Ok(false)
    }
}

/// Counters of a [`LayerSource`] (for `/metrics`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// Range requests sent to the remote store.
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Reads served from local data, and reads that had to wait for a fetch.
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Fetched data that failed verification (never served).
    pub corrupt: u64,
    /// Bytes of layer data held locally now.
    pub local_bytes: u64,
}

impl ImageStore {
    /// The counters of the layer source, when it has one that counts.
    pub fn source_stats(&self) -> Option<SourceStats> {
        self.source.get()?.stats()
    }

    /// Sets the source of layers missing from the store (once).
    pub fn set_layer_source(&self, source: Arc<dyn LayerSource>) {
        let _ = self.source.set(source);
    }

    /// Uploads the local layers among `digests` to the layer source (a blob store), for
    /// other nodes to start from; the digests it took (none without a writable source).
    /// Blocking: call it off the async threads.
    pub fn publish_layers(&self, digests: &[String]) -> Result<Vec<String>, ImageError> {
        let Some(s) = self.source.get() else {
            return Ok(Vec::new());
        };
        let mut sent = Vec::new();
        for d in digests {
            let blob = self.blob_path(d)?;
            if blob.exists() && s.publish(d, &blob)? {
                sent.push(d.clone());
            }
        }
        Ok(sent)
    }

    /// Makes sure a layer is local or available from the source.
    pub(crate) fn ensure_layer(&self, digest: &str) -> Result<(), ImageError> {
        if self.blob_path(digest)?.exists() {
            return Ok(());
        }
        match self.source.get() {
            Some(s) if s.prepare(digest)? => Ok(()),
            _ => Err(ImageError::NotFound(digest.to_string())),
        }
    }

    /// The file to mount for a layer.
    pub(crate) fn layer_file(&self, digest: &str) -> Result<PathBuf, ImageError> {
        let blob = self.blob_path(digest)?;
        if blob.exists() {
            return Ok(blob);
        }
        match self.source.get() {
            Some(s) if s.prepare(digest)? => s.mount_source(digest),
            _ => Err(ImageError::NotFound(digest.to_string())),
        }
    }

    /// Marks layers in use by a live sandbox.
    pub fn pin_layers(&self, digests: &[String]) {
        if let Some(s) = self.source.get() {
            s.pin(digests);
        }
    }

    /// Releases [`pin_layers`](Self::pin_layers).
    pub fn unpin_layers(&self, digests: &[String]) {
        if let Some(s) = self.source.get() {
            s.unpin(digests);
        }
    }

    /// Detaches every mount of one layer (plain and idmapped). Only for layers no sandbox
    /// uses; the source calls it before evicting a layer.
    pub fn unmount_layer(&self, digest: &str) -> Result<(), ImageError> {
        let hex = digest
            .strip_prefix("sha256:")
            .ok_or_else(|| ImageError::BadRef(digest.to_string()))?;
        let mnt = self.root().join("mnt");
        for m in warren_sys::mount::mounts_under(&mnt) {
            let name = Path::new(&m)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name == hex || name.starts_with(&format!("{hex}.idmap-")) {
                warren_sys::mount::umount(Path::new(&m), true).map_err(|source| {
                    ImageError::Mount {
                        digest: digest.to_string(),
                        source,
                    }
                })?;
            }
        }
        Ok(())
    }
}

/// Layers pinned for one live sandbox; unpinned when dropped.
#[derive(Debug)]
pub struct LayerPins {
    store: Arc<ImageStore>,
    layers: Vec<String>,
}

impl LayerPins {
    /// Pins `layers` until the returned guard is dropped.
    pub fn new(store: &Arc<ImageStore>, layers: &[String]) -> Self {
        store.pin_layers(layers);
        LayerPins {
            store: store.clone(),
            layers: layers.to_vec(),
        }
    }
}

impl Drop for LayerPins {
    fn drop(&mut self) {
        self.store.unpin_layers(&self.layers);
    }
}
