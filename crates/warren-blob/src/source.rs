//! The node's [`LayerSource`]: layers missing from the image store come from the cache
//! (fully local → the plain file; lazy → the layer's file on the FUSE mount).

use bytes::Bytes;
use std::path::PathBuf;
use std::sync::Arc;
use warren_image::{ImageError, LayerSource};

use crate::{blob_key, chunks_key, hex_of, BlobError, BlobStore, ChunkTable, LayerCache, Mode};

/// Serves layers from a [`LayerCache`]. Holds the lazy file system's mount (lazy mode).
#[derive(Debug)]
pub struct CacheSource {
    cache: Arc<LayerCache>,
    fuse: Option<crate::fuse::LazyMount>,
    rt: tokio::runtime::Handle,
    prefetching: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl CacheSource {
    /// In lazy mode, mounts the lazy-layer file system under the cache directory.
    pub fn new(cache: Arc<LayerCache>, rt: tokio::runtime::Handle) -> Result<Self, BlobError> {
        let fuse = match cache.config().mode {
            Mode::Lazy => {
                let dir = cache.config().dir.join("lazy");
                Some(crate::fuse::mount(cache.clone(), &dir, rt.clone())?)
            }
            Mode::Eager => None,
        };
        Ok(CacheSource {
            cache,
            fuse,
            rt,
            prefetching: Default::default(),
        })
    }

    pub fn cache(&self) -> &Arc<LayerCache> {
        &self.cache
    }

    /// With `prefetch` on, fetches the rest of a lazy layer in the background (once).
    fn maybe_prefetch(&self, digest: &str) {
        let cfg = self.cache.config();
        if cfg.mode != Mode::Lazy || !cfg.prefetch || self.cache.local_path(digest).is_some() {
            return;
        }
        let mut set = self.prefetching.lock().unwrap_or_else(|p| p.into_inner());
        if !set.insert(digest.to_string()) {
            return;
        }
        let cache = self.cache.clone();
        let d = digest.to_string();
        std::thread::spawn(move || {
            if let Err(e) = cache.prefetch(&d) {
                tracing::warn!(layer = %d, error = %e, "prefetch stopped");
            }
        });
    }
}

fn fetch_err(digest: &str, e: BlobError) -> ImageError {
    match e {
        BlobError::NotFound(_) => ImageError::NotFound(digest.to_string()),
        e => ImageError::Fetch {
            digest: digest.to_string(),
            message: e.to_string(),
        },
    }
}

impl LayerSource for CacheSource {
    fn prepare(&self, digest: &str) -> Result<bool, ImageError> {
        match self.cache.prepare(digest) {
            Ok(()) => {
                self.maybe_prefetch(digest);
                Ok(true)
            }
            Err(BlobError::NotFound(_)) => Ok(false),
            Err(e) => Err(fetch_err(digest, e)),
        }
    }

    fn mount_source(&self, digest: &str) -> Result<PathBuf, ImageError> {
        // Fast path: a fully local, verified layer is mounted without FUSE in the read path.
        if let Some(p) = self.cache.local_path(digest) {
            return Ok(p);
        }
        let hex = hex_of(digest).map_err(|e| fetch_err(digest, e))?;
        match &self.fuse {
            Some(m) => Ok(m.dir().join(hex)),
            None => Err(ImageError::NotFound(digest.to_string())),
        }
    }

    fn pin(&self, digests: &[String]) {
        digests.iter().for_each(|d| self.cache.pin(d));
    }

    fn unpin(&self, digests: &[String]) {
        digests.iter().for_each(|d| self.cache.unpin(d));
    }

    /// Blocks on the upload: call it off the runtime's threads.
    fn publish(&self, digest: &str, file: &std::path::Path) -> Result<bool, ImageError> {
        let hex = hex_of(digest)
            .map_err(|e| fetch_err(digest, e))?
            .to_string();
        let store = self.cache.store().clone();
        self.rt
            .block_on(async {
                // The chunk table goes last: a store that has it has the whole layer.
                if store.head(&chunks_key(&hex)).await.is_ok() {
                    return Ok(());
                }
                let t = publish_layer(&*store, file, crate::DEFAULT_CHUNK_SIZE).await?;
                if t.digest != digest {
                    return Err(BlobError::Corrupt {
                        key: blob_key(&hex),
                        message: format!("{} hashes to {}", file.display(), t.digest),
                    });
                }
                Ok(())
            })
            .map_err(|e| fetch_err(digest, e))?;
        Ok(true)
    }

    fn stats(&self) -> Option<warren_image::SourceStats> {
        let s = self.cache.stats();
        Some(warren_image::SourceStats {
            fetches: s.fetches,
            fetched_bytes: s.fetched_bytes,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            corrupt: s.corrupt_chunks,
            local_bytes: s.local_bytes,
        })
    }
}

/// Uploads a layer blob (by parts, [`crate::put_file`]) and its chunk table to a store;
/// returns the table.
pub async fn publish_layer(
    store: &dyn BlobStore,
    file: &std::path::Path,
    chunk_size: u64,
) -> Result<ChunkTable, BlobError> {
    let p = file.to_path_buf();
    let table = tokio::task::spawn_blocking(move || ChunkTable::compute(&p, chunk_size))
        .await
        .map_err(|e| BlobError::io("chunk table", std::io::Error::other(e)))??;
    let hex = hex_of(&table.digest)?.to_string();
    // Sent a part at a time: a layer can be far larger than what the daemon should hold.
    let f = std::fs::File::open(file)
        .map_err(|e| BlobError::io(format!("read {}", file.display()), e))?;
    crate::put_file(store, &blob_key(&hex), f).await?;
    store
        .put(
            &chunks_key(&hex),
            Bytes::from(serde_json::to_vec(&table).expect("serializes")),
        )
        .await?;
    Ok(table)
}
