//! Layers: adding an EROFS image to the store with its metadata, and the conversion index
//! (OCI layer digest → layer).

use std::path::Path;
use warren_types::image::LAYER_MEDIA_TYPE;
use warren_types::LayerInfo;

use crate::files::{hex_of, now_ms, sha256_file, write_atomic};
use crate::lease::Lease;
use crate::store::ImageStore;
use crate::ImageError;

impl ImageStore {
    /// Moves a finished EROFS file into the store under its digest and records its
    /// metadata; returns the digest. With `lease`, the layer is added to that lease first
    /// (under the store's shared lock), so no collection can remove it before an image or a
    /// sandbox references it.
    pub fn add_layer(
        &self,
        file: &Path,
        source: &str,
        diff_id: Option<&str>,
        lease: Option<&Lease>,
    ) -> Result<String, ImageError> {
        let hex = sha256_file(file)?;
        let digest = format!("sha256:{hex}");
        let size = std::fs::metadata(file)
            .map_err(|e| ImageError::io(format!("stat {}", file.display()), e))?
            .len();
        let _shared = self.gc_lock(false)?;
        if let Some(l) = lease {
            l.add(self, &digest)?;
        }
        let dst = self.root().join("blobs/sha256").join(&hex);
        if dst.exists() {
            let _ = std::fs::remove_file(file);
        } else {
            std::fs::rename(file, &dst).map_err(|e| ImageError::io("store blob", e))?;
        }
        let meta_path = self.layer_meta_path(&digest)?;
        if !meta_path.exists() {
            let info = LayerInfo {
                digest: digest.clone(),
                size_bytes: size,
                created_ms: now_ms(),
                source: source.to_string(),
                media_type: LAYER_MEDIA_TYPE.to_string(),
                diff_id: diff_id.map(str::to_string),
            };
            write_atomic(
                &meta_path,
                &serde_json::to_vec_pretty(&info).expect("serializes"),
            )?;
        }
        Ok(digest)
    }

    fn layer_meta_path(&self, digest: &str) -> Result<std::path::PathBuf, ImageError> {
        Ok(self
            .root()
            .join("layers")
            .join(format!("{}.json", hex_of(digest)?)))
    }

    /// A layer's metadata. Layers stored before metadata existed get it synthesized from
    /// the blob (nothing is written: older stores stay as they are).
    pub fn layer_info(&self, digest: &str) -> Result<LayerInfo, ImageError> {
        let blob = self.blob_path(digest)?;
        let size = std::fs::metadata(&blob)
            .map_err(|_| ImageError::NotFound(digest.to_string()))?
            .len();
        if let Ok(data) = std::fs::read(self.layer_meta_path(digest)?) {
            if let Ok(mut info) = serde_json::from_slice::<LayerInfo>(&data) {
                info.size_bytes = size;
                return Ok(info);
            }
        }
        let created_ms = std::fs::metadata(&blob)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Ok(LayerInfo {
            digest: digest.to_string(),
            size_bytes: size,
            created_ms,
            source: String::new(),
            media_type: LAYER_MEDIA_TYPE.to_string(),
            diff_id: None,
        })
    }

    /// Every layer blob of the store.
    pub fn layers(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.root().join("blobs/sha256"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(|h| format!("sha256:{h}")))
                    .filter(|d| hex_of(d).is_ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The layer an OCI layer (by its compressed digest or diff id) was converted to, if it
    /// was and the layer is still stored.
    pub fn converted(&self, oci_digest: &str) -> Option<String> {
        let p = self.root().join("index").join(hex_of(oci_digest).ok()?);
        let d = std::fs::read_to_string(p).ok()?.trim().to_string();
        (hex_of(&d).is_ok() && self.blob_path(&d).ok()?.exists()).then_some(d)
    }

    /// Records that `oci_digest` converts to `layer`.
    pub(crate) fn record_conversion(
        &self,
        oci_digest: &str,
        layer: &str,
    ) -> Result<(), ImageError> {
        let p = self.root().join("index").join(hex_of(oci_digest)?);
        write_atomic(&p, layer.as_bytes())
    }
}
