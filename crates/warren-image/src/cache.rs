//! The build cache: what a build step made, by the step's key (see `warren-build`, which
//! computes keys from the parent layer, the instruction after substitution and the digest of
//! the files it copies).
//!
//! An entry is `build-cache/<hex of key>` holding the layer digest. Entries do not hold their
//! layers: a collection that removes a layer removes the entries naming it, so the cache
//! never answers a layer that is gone.

use std::path::PathBuf;

use crate::files::{hex_of, write_atomic};
use crate::lease::Lease;
use crate::store::ImageStore;
use crate::ImageError;

const DIR: &str = "build-cache";

impl ImageStore {
    fn cache_path(&self, key: &str) -> Result<PathBuf, ImageError> {
        Ok(self.root().join(DIR).join(hex_of(key)?))
    }

    /// The layer cached under `key` (a `sha256:` digest), added to `lease` so no collection
    /// removes it before the build references it; `None` when there is none (or its layer
    /// is gone).
    pub fn cache_get(&self, key: &str, lease: &Lease) -> Result<Option<String>, ImageError> {
        let Ok(text) = std::fs::read_to_string(self.cache_path(key)?) else {
            return Ok(None);
        };
        let layer = text.trim();
        if hex_of(layer).is_err() {
            return Ok(None);
        }
        match lease.hold(self, layer) {
            Ok(()) => Ok(Some(layer.to_string())),
            Err(ImageError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Remembers that the step `key` made `layer`.
    pub fn cache_put(&self, key: &str, layer: &str) -> Result<(), ImageError> {
        hex_of(layer)?;
        let p = self.cache_path(key)?;
        std::fs::create_dir_all(self.root().join(DIR))
            .map_err(|e| ImageError::io("create the build cache", e))?;
        write_atomic(&p, layer.as_bytes())
    }

    /// Removes the entries naming one of `removed` (called by the collector) and entries
    /// whose layer is gone anyway.
    pub(crate) fn cache_forget(&self, removed: &[String]) {
        let Ok(rd) = std::fs::read_dir(self.root().join(DIR)) else {
            return;
        };
        for e in rd.flatten() {
            let Ok(text) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            let layer = text.trim();
            let gone = removed.iter().any(|r| r == layer)
                || self.blob_path(layer).map_or(true, |p| !p.exists());
            if gone {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// How many entries the cache holds.
    pub fn cache_len(&self) -> usize {
        std::fs::read_dir(self.root().join(DIR)).map_or(0, |rd| rd.count())
    }
}
