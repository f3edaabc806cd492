//! The node's layer cache: remote layer blobs kept locally, whole or chunk by chunk.
//!
//! Under the cache directory:
//! ```text
//! layers/<hex>          a complete layer blob, verified against its digest
//! layers/<hex>.partial  a sparse file being filled chunk by chunk (lazy mode)
//! layers/<hex>.chunks   the layer's chunk table (JSON), fetched with the metadata
//! ```
//! Partial files are not trusted across restarts (they are removed at open); complete files
//! are. Eviction removes whole layers, least recently used first, never a pinned one.

use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::{blob_key, chunks_key, hex_of, BlobError, BlobStore, ChunkTable};

/// How remote layers become local.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Chunks are fetched on first read; a sandbox starts once the metadata is local.
    Lazy,
    /// The whole blob is downloaded and verified before the layer is mounted.
    Eager,
}

/// A blob mode that is neither `lazy` nor `eager`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown blob mode {0:?} (lazy or eager)")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, UnknownMode> {
        match s {
            "lazy" => Ok(Mode::Lazy),
            "eager" | "eager-layer" => Ok(Mode::Eager),
            o => Err(UnknownMode(o.to_string())),
        }
    }
}

/// Settings of a [`LayerCache`].
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    /// Bytes of layer data kept before unpinned layers are evicted (least recently used first).
    pub limit_bytes: u64,
    pub mode: Mode,
    /// In lazy mode, fetch the rest of a layer in the background after its first read.
    pub prefetch: bool,
}

/// Counters of a cache (for tests and benchmarks).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    /// Range requests sent to the blob store for layer data.
    pub fetches: u64,
    pub fetched_bytes: u64,
    /// Chunks that failed verification (never served).
    pub corrupt_chunks: u64,
    pub evictions: u64,
    /// Bytes of layer data held locally now.
    pub local_bytes: u64,
    /// Chunk reads served from local data.
    pub hits: u64,
    /// Chunk reads that had to wait for a fetch (their own or another reader's).
    pub misses: u64,
}

#[derive(Debug)]
struct Layer {
    table: Option<Arc<ChunkTable>>,
    size: u64,
    have: Vec<bool>,
    have_count: usize,
    inflight: HashSet<usize>,
    complete: bool,
    pins: u32,
    last_used: u64,
    data: Arc<std::fs::File>,
}

impl Layer {
    fn local_bytes(&self) -> u64 {
        match (&self.table, self.complete) {
            (_, true) | (None, _) => self.size,
            (Some(t), false) => (self.have_count as u64 * t.chunk_size).min(self.size),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    layers: HashMap<String, Layer>,
    /// Layers whose metadata or whole blob is being fetched.
    preparing: HashSet<String>,
    tick: u64,
}

type EvictHook = Box<dyn Fn(&str) -> Result<(), warren_image::ImageError> + Send + Sync>;

/// The cache. Its blocking methods may be called from any thread, also from async code.
pub struct LayerCache {
    cfg: CacheConfig,
    store: Arc<dyn BlobStore>,
    rt: tokio::runtime::Handle,
    inner: Mutex<Inner>,
    cond: Condvar,
    on_evict: Mutex<Option<EvictHook>>,
    fetches: AtomicU64,
    fetched_bytes: AtomicU64,
    corrupt_chunks: AtomicU64,
    evictions: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for LayerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerCache")
            .field("cfg", &self.cfg)
            .field("store", &self.store.describe())
            .finish()
    }
}

/// Size of the pieces a whole-blob download is fetched in.
const WHOLE_PIECE: u64 = 8 << 20;

impl LayerCache {
    /// Opens the cache directory (removing partial files of an earlier run). `rt` runs the
    /// store's requests.
    pub fn open(
        cfg: CacheConfig,
        store: Arc<dyn BlobStore>,
        rt: tokio::runtime::Handle,
    ) -> Result<Arc<Self>, BlobError> {
        let dir = cfg.dir.join("layers");
        std::fs::create_dir_all(&dir)
            .map_err(|e| BlobError::io(format!("create {}", dir.display()), e))?;
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.ends_with(".partial") || n.contains(".tmp") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Arc::new(LayerCache {
            cfg,
            store,
            rt,
            inner: Mutex::new(Inner::default()),
            cond: Condvar::new(),
            on_evict: Mutex::new(None),
            fetches: AtomicU64::new(0),
            fetched_bytes: AtomicU64::new(0),
            corrupt_chunks: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }))
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn store(&self) -> &Arc<dyn BlobStore> {
        &self.store
    }

    /// Called with the digest of a layer before its files are removed; an error refuses the
    /// eviction (the node uses it to detach the layer's mounts).
    pub fn set_evict_hook(
        &self,
        f: impl Fn(&str) -> Result<(), warren_image::ImageError> + Send + Sync + 'static,
    ) {
        *self.on_evict.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(f));
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self) -> PathBuf {
        self.cfg.dir.join("layers")
    }

    fn complete_path(&self, hex: &str) -> PathBuf {
        self.dir().join(hex)
    }

    fn partial_path(&self, hex: &str) -> PathBuf {
        self.dir().join(format!("{hex}.partial"))
    }

    fn table_path(&self, hex: &str) -> PathBuf {
        self.dir().join(format!("{hex}.chunks"))
    }

    /// Runs a store request to completion from blocking code (also from inside the runtime).
    fn run<T: Send>(
        &self,
        f: impl std::future::Future<Output = Result<T, BlobError>> + Send,
    ) -> Result<T, BlobError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| self.rt.block_on(f)).join().unwrap_or_else(|_| {
                    Err(BlobError::io(
                        "store request",
                        std::io::Error::other("panicked"),
                    ))
                })
            })
        } else {
            self.rt.block_on(f)
        }
    }

    /// Makes a layer usable: fetches its metadata (chunk table, size) — and in eager mode its
    /// whole blob — so that a sandbox fails here, before anything of it exists, when the store
    /// is unreachable or the layer unknown. Idempotent; concurrent callers share one fetch.
    pub fn prepare(&self, digest: &str) -> Result<(), BlobError> {
        let hex = hex_of(digest)?.to_string();
        {
            let mut g = self.lock();
            loop {
                if let Some(l) = g.layers.get(&hex) {
                    if l.complete || self.cfg.mode == Mode::Lazy {
                        return Ok(());
                    }
                }
                if !g.preparing.contains(&hex) {
                    break;
                }
                g = self.cond.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            g.preparing.insert(hex.clone());
        }
        let res = self.prepare_now(digest, &hex);
        let mut g = self.lock();
        g.preparing.remove(&hex);
        self.cond.notify_all();
        let layer = res?;
        g.tick += 1;
        let mut layer = layer;
        layer.last_used = g.tick;
        g.layers.insert(hex.clone(), layer);
        drop(g);
        self.evict_to_fit(&hex);
        Ok(())
    }

    fn prepare_now(&self, digest: &str, hex: &str) -> Result<Layer, BlobError> {
        let complete = self.complete_path(hex);
        let table = self.load_table(digest, hex).ok();
        if let Ok(f) = std::fs::File::open(&complete) {
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            return Ok(Layer {
                table: table.map(Arc::new),
                size,
                have: Vec::new(),
                have_count: 0,
                inflight: HashSet::new(),
                complete: true,
                pins: 0,
                last_used: 0,
                data: Arc::new(f),
            });
        }
        let table = match table {
            Some(t) => t,
            None => self.fetch_table(digest, hex)?,
        };
        // The blob itself must be there too (a table alone is no layer).
        let size = self.run(self.store.head(&blob_key(hex)))?;
        if size != table.size {
            return Err(BlobError::Corrupt {
                key: digest.to_string(),
                message: format!(
                    "blob store has {size} bytes, chunk table says {}",
                    table.size
                ),
            });
        }
        match self.cfg.mode {
            Mode::Eager => {
                self.fetch_whole(digest, hex, &table)?;
                let f = std::fs::File::open(&complete)
                    .map_err(|e| BlobError::io("open cached layer", e))?;
                Ok(Layer {
                    size: table.size,
                    table: Some(Arc::new(table)),
                    have: Vec::new(),
                    have_count: 0,
                    inflight: HashSet::new(),
                    complete: true,
                    pins: 0,
                    last_used: 0,
                    data: Arc::new(f),
                })
            }
            Mode::Lazy => {
                let p = self.partial_path(hex);
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&p)
                    .map_err(|e| BlobError::io(format!("create {}", p.display()), e))?;
                f.set_len(table.size)
                    .map_err(|e| BlobError::io("size partial layer", e))?;
                let n = table.chunks.len();
                Ok(Layer {
                    size: table.size,
                    table: Some(Arc::new(table)),
                    have: vec![false; n],
                    have_count: 0,
                    inflight: HashSet::new(),
                    complete: false,
                    pins: 0,
                    last_used: 0,
                    data: Arc::new(f),
                })
            }
        }
    }

    fn load_table(&self, digest: &str, hex: &str) -> Result<ChunkTable, BlobError> {
        let data = std::fs::read(self.table_path(hex))
            .map_err(|e| BlobError::io("read chunk table", e))?;
        let t: ChunkTable = serde_json::from_slice(&data).map_err(|e| BlobError::Corrupt {
            key: digest.to_string(),
            message: format!("chunk table: {e}"),
        })?;
        t.check(digest)?;
        Ok(t)
    }

    fn fetch_table(&self, digest: &str, hex: &str) -> Result<ChunkTable, BlobError> {
        let data = self.run(self.store.get(&chunks_key(hex)))?;
        let t: ChunkTable = serde_json::from_slice(&data).map_err(|e| BlobError::Corrupt {
            key: digest.to_string(),
            message: format!("chunk table: {e}"),
        })?;
        t.check(digest)?;
        let p = self.table_path(hex);
        let tmp = p.with_extension("chunks.tmp");
        std::fs::write(&tmp, &data).map_err(|e| BlobError::io("write chunk table", e))?;
        std::fs::rename(&tmp, &p).map_err(|e| BlobError::io("write chunk table", e))?;
        Ok(t)
    }

    fn fetch_whole(&self, digest: &str, hex: &str, table: &ChunkTable) -> Result<(), BlobError> {
        let tmp = self.dir().join(format!("{hex}.tmp-whole"));
        let f = std::fs::File::create(&tmp)
            .map_err(|e| BlobError::io(format!("create {}", tmp.display()), e))?;
        let res = (|| {
            let mut h = Sha256::new();
            let mut off = 0u64;
            while off < table.size {
                let end = (off + WHOLE_PIECE).min(table.size);
                let b = self.run(self.store.get_range(&blob_key(hex), off..end))?;
                self.fetches.fetch_add(1, Ordering::Relaxed);
                self.fetched_bytes
                    .fetch_add(b.len() as u64, Ordering::Relaxed);
                if b.len() as u64 != end - off {
                    return Err(BlobError::Corrupt {
                        key: digest.to_string(),
                        message: format!(
                            "truncated: {} bytes at {off}, expected {}",
                            b.len(),
                            end - off
                        ),
                    });
                }
                h.update(&b);
                f.write_all_at(&b, off)
                    .map_err(|e| BlobError::io("write layer", e))?;
                off = end;
            }
            let found = format!("sha256:{}", hex::encode(h.finalize()));
            if found != digest {
                return Err(BlobError::Corrupt {
                    key: digest.to_string(),
                    message: format!("downloaded blob has {found}"),
                });
            }
            std::fs::rename(&tmp, self.complete_path(hex))
                .map_err(|e| BlobError::io("store layer", e))
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res
    }

    /// Size of a prepared layer.
    pub fn size(&self, hex: &str) -> Option<u64> {
        self.lock().layers.get(hex).map(|l| l.size)
    }

    /// Hex digests of the prepared layers.
    pub fn layers(&self) -> Vec<String> {
        self.lock().layers.keys().cloned().collect()
    }

    /// The complete local file of a layer, if it is fully local and verified.
    pub fn local_path(&self, digest: &str) -> Option<PathBuf> {
        let hex = hex_of(digest).ok()?;
        let g = self.lock();
        g.layers
            .get(hex)
            .filter(|l| l.complete)
            .map(|_| self.complete_path(hex))
    }

    /// Reads `len` bytes at `off` of a prepared layer, fetching and verifying missing chunks.
    pub fn read(&self, hex: &str, off: u64, len: u32) -> Result<Vec<u8>, BlobError> {
        let (size, chunk) = {
            let mut g = self.lock();
            g.tick += 1;
            let t = g.tick;
            let l = g
                .layers
                .get_mut(hex)
                .ok_or_else(|| BlobError::NotCached(hex.to_string()))?;
            l.last_used = t;
            (l.size, l.table.as_ref().map(|t| t.chunk_size).unwrap_or(1))
        };
        if off >= size {
            return Ok(Vec::new());
        }
        let end = (off + len as u64).min(size);
        let mut file = None;
        for i in (off / chunk)..end.div_ceil(chunk) {
            file = Some(self.ensure_chunk(hex, i as usize)?);
        }
        let file = file.expect("at least one chunk");
        let mut buf = vec![0u8; (end - off) as usize];
        file.read_exact_at(&mut buf, off)
            .map_err(|e| BlobError::io("read cached layer", e))?;
        Ok(buf)
    }

    /// Makes chunk `i` local (one fetch however many readers wait for it).
    fn ensure_chunk(&self, hex: &str, i: usize) -> Result<Arc<std::fs::File>, BlobError> {
        let mut g = self.lock();
        let mut first = true;
        let (table, data) = loop {
            let l = g
                .layers
                .get_mut(hex)
                .ok_or_else(|| BlobError::NotCached(hex.to_string()))?;
            if l.complete || l.have.get(i).copied().unwrap_or(false) {
                if first {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(l.data.clone());
            }
            if first {
                self.misses.fetch_add(1, Ordering::Relaxed);
                first = false;
            }
            if !l.inflight.contains(&i) {
                l.inflight.insert(i);
                break (
                    l.table.clone().expect("partial layers have a table"),
                    l.data.clone(),
                );
            }
            g = self.cond.wait(g).unwrap_or_else(|p| p.into_inner());
        };
        drop(g);
        let res = self.fetch_chunk(hex, &table, &data, i);
        let mut g = self.lock();
        let mut done = false;
        if let Some(l) = g.layers.get_mut(hex) {
            l.inflight.remove(&i);
            if res.is_ok() && !l.have[i] {
                l.have[i] = true;
                l.have_count += 1;
                done = l.have_count == l.have.len();
            }
        }
        self.cond.notify_all();
        drop(g);
        res?;
        if done {
            self.finish(hex);
        } else {
            self.evict_to_fit(hex);
        }
        Ok(data)
    }

    fn fetch_chunk(
        &self,
        hex: &str,
        table: &ChunkTable,
        file: &std::fs::File,
        i: usize,
    ) -> Result<(), BlobError> {
        let r = table.range(i);
        let b: Bytes = self.run(self.store.get_range(&blob_key(hex), r.clone()))?;
        self.fetches.fetch_add(1, Ordering::Relaxed);
        self.fetched_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        if let Err(e) = table.verify(i, &b) {
            self.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
            tracing::error!(layer = %hex, chunk = i, error = %e, "refusing a corrupt chunk");
            return Err(e);
        }
        file.write_all_at(&b, r.start)
            .map_err(|e| BlobError::io("write cached chunk", e))
    }

    /// A layer whose every chunk is local: check the whole digest, then make it a complete
    /// file (new mounts use it directly, without FUSE).
    fn finish(&self, hex: &str) {
        let p = self.partial_path(hex);
        let ok = sha256_file(&p).map(|h| h == hex).unwrap_or(false);
        let mut g = self.lock();
        let Some(l) = g.layers.get_mut(hex) else {
            return;
        };
        if !ok {
            // Every chunk matched its table but the whole does not: the table is wrong.
            tracing::error!(layer = %hex, "chunks verified but the whole blob does not match its digest");
            self.corrupt_chunks.fetch_add(1, Ordering::Relaxed);
            l.have.iter_mut().for_each(|h| *h = false);
            l.have_count = 0;
            return;
        }
        if std::fs::rename(&p, self.complete_path(hex)).is_ok() {
            l.complete = true;
            tracing::info!(layer = %hex, "layer fully local");
        }
    }

    /// Fetches every missing chunk of a prepared lazy layer (background prefetch).
    pub fn prefetch(self: &Arc<Self>, digest: &str) -> Result<(), BlobError> {
        let hex = hex_of(digest)?.to_string();
        let n = {
            let g = self.lock();
            let l = g
                .layers
                .get(&hex)
                .ok_or_else(|| BlobError::NotCached(hex.clone()))?;
            if l.complete {
                return Ok(());
            }
            l.have.len()
        };
        for i in 0..n {
            self.ensure_chunk(&hex, i)?;
        }
        Ok(())
    }

    /// Marks a layer in use (a live sandbox references it). Unknown layers are ignored.
    pub fn pin(&self, digest: &str) {
        if let Ok(hex) = hex_of(digest) {
            if let Some(l) = self.lock().layers.get_mut(hex) {
                l.pins += 1;
            }
        }
    }

    /// Releases one [`pin`](Self::pin).
    pub fn unpin(&self, digest: &str) {
        if let Ok(hex) = hex_of(digest) {
            if let Some(l) = self.lock().layers.get_mut(hex) {
                l.pins = l.pins.saturating_sub(1);
            }
        }
    }

    /// Removes a layer from the cache. Refused with `InUse` while it is pinned.
    pub fn evict(&self, digest: &str) -> Result<(), BlobError> {
        let hex = hex_of(digest)?.to_string();
        self.evict_hex(&hex)
    }

    fn evict_hex(&self, hex: &str) -> Result<(), BlobError> {
        let mut g = self.lock();
        let l = g
            .layers
            .get(hex)
            .ok_or_else(|| BlobError::NotCached(hex.to_string()))?;
        if l.pins > 0 || !l.inflight.is_empty() {
            return Err(BlobError::InUse(format!("sha256:{hex}")));
        }
        if let Some(hook) = self
            .on_evict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            if let Err(e) = hook(&format!("sha256:{hex}")) {
                tracing::warn!(layer = %hex, error = %e, "layer still mounted; not evicted");
                return Err(BlobError::InUse(format!("sha256:{hex}")));
            }
        }
        g.layers.remove(hex);
        drop(g);
        let _ = std::fs::remove_file(self.partial_path(hex));
        let _ = std::fs::remove_file(self.complete_path(hex));
        let _ = std::fs::remove_file(self.table_path(hex));
        self.evictions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(layer = %hex, "evicted from the layer cache");
        Ok(())
    }

    /// Evicts least recently used unpinned layers (never `keep`) until under the limit.
    fn evict_to_fit(&self, keep: &str) {
        loop {
            let victim = {
                let g = self.lock();
                let total: u64 = g.layers.values().map(Layer::local_bytes).sum();
                if total <= self.cfg.limit_bytes {
                    return;
                }
                g.layers
                    .iter()
                    .filter(|(h, l)| h.as_str() != keep && l.pins == 0 && l.inflight.is_empty())
                    .min_by_key(|(_, l)| l.last_used)
                    .map(|(h, _)| h.clone())
            };
            match victim {
                Some(h) => {
                    if self.evict_hex(&h).is_err() {
                        return;
                    }
                }
                None => {
                    tracing::warn!("layer cache over its limit; every layer is in use");
                    return;
                }
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        let local_bytes = self.lock().layers.values().map(Layer::local_bytes).sum();
        CacheStats {
            fetches: self.fetches.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            corrupt_chunks: self.corrupt_chunks.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            local_bytes,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

/// Hex sha256 of a file.
pub(crate) fn sha256_file(p: &Path) -> Result<String, BlobError> {
    let mut f =
        std::fs::File::open(p).map_err(|e| BlobError::io(format!("open {}", p.display()), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| BlobError::io(format!("read {}", p.display()), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
