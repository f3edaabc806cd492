//! The remote blob store and the node's layer cache (`--blob-store` and friends).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::info;
use warren_blob::{CacheConfig, CacheSource, LayerCache, Mode};
use warren_image::ImageStore;

#[derive(Debug, clap::Args)]
pub struct BlobArgs {
    /// Where layers missing from the image store are fetched from: a directory, file://DIR,
    /// http(s)://HOST/PREFIX (range requests) or s3://BUCKET/PREFIX (endpoint and credentials
    /// from AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "WARREN_BLOB_STORE")]
    blob_store: Option<String>,
    /// How remote layers become local: `lazy` (chunks on first read) or `eager` (whole layer
    /// downloaded and verified before it is mounted).
    #[arg(long, default_value = "lazy")]
    blob_mode: Mode,
    /// Directory of the layer cache [default: STATE_DIR/blob-cache].
    #[arg(long)]
    blob_cache: Option<PathBuf>,
    /// Size limit of the layer cache in MiB (unused layers are evicted, least recently used
    /// first).
    #[arg(long, default_value_t = 20_480)]
    blob_cache_mb: u64,
    /// Fetch the rest of a lazily loaded layer in the background after its first use.
    #[arg(long)]
    blob_prefetch: bool,
}

/// Sets up the layer cache as the image store's source of missing layers.
pub fn attach(
    args: &BlobArgs,
    state_dir: &Path,
    images: &Arc<ImageStore>,
) -> Result<Option<Arc<CacheSource>>> {
    let Some(url) = &args.blob_store else {
        return Ok(None);
    };
    let store = warren_blob::open_store(url).with_context(|| format!("blob store {url}"))?;
    let dir = args
        .blob_cache
        .clone()
        .unwrap_or_else(|| state_dir.join("blob-cache"));
    let rt = tokio::runtime::Handle::current();
    let cache = LayerCache::open(
        CacheConfig {
            dir: dir.clone(),
            limit_bytes: args.blob_cache_mb << 20,
            mode: args.blob_mode,
            prefetch: args.blob_prefetch,
        },
        store,
        rt.clone(),
    )
    .with_context(|| format!("opening the layer cache {}", dir.display()))?;
    let weak = Arc::downgrade(images);
    cache.set_evict_hook(move |digest| match weak.upgrade() {
        Some(images) => images.unmount_layer(digest),
        None => Ok(()),
    });
    let source =
        Arc::new(CacheSource::new(cache, rt).context("mounting the lazy layer file system")?);
    images.set_layer_source(source.clone());
    info!(store = %url, mode = ?args.blob_mode, cache = %dir.display(), "remote layers enabled");
    Ok(Some(source))
}
