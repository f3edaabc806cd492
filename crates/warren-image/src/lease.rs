//! Leases: which layers live sandboxes (and forks, builds and imports in progress) hold.
//!
//! A lease is a file `leases/<holder>.json` listing layer digests. A sandbox's holder is its
//! id; temporary holders (`tmp-<what>-<pid>-<n>`) belong to one process and are dropped with
//! it (or found stale by the collector once that process is gone). Leases are written under
//! the store's shared lock and read by the collector under the exclusive one, so a layer is
//! either leased before a collection starts or not removed by it... and a sandbox's layers
//! are leased before they are mounted.

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;
use warren_types::GcReport;

use crate::files::{now_ms, seq, write_atomic};
use crate::store::ImageStore;
use crate::ImageError;

/// What a lease file holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LeaseFile {
    pub layers: Vec<String>,
    /// The process a temporary lease belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default)]
    pub created_ms: u64,
}

/// A temporary lease owned by this process; dropping it releases it (its layers stay until
/// an image or another lease references them, or the next collection).
#[derive(Debug)]
pub struct Lease {
    holder: String,
    path: PathBuf,
    layers: Mutex<Vec<String>>,
}

impl Lease {
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Adds a layer to the lease. The caller holds the store's shared lock.
    pub(crate) fn add(&self, _store: &ImageStore, digest: &str) -> Result<(), ImageError> {
        let mut layers = self.layers.lock().unwrap_or_else(|p| p.into_inner());
        if !layers.iter().any(|l| l == digest) {
            layers.push(digest.to_string());
        }
        let f = LeaseFile {
            layers: layers.clone(),
            pid: Some(std::process::id()),
            created_ms: now_ms(),
        };
        write_atomic(&self.path, &serde_json::to_vec(&f).expect("serializes"))
    }

    /// Adds a stored layer to the lease (under the store's shared lock); `NotFound` if the
    /// layer is not (or no longer) in the store.
    pub fn hold(&self, store: &ImageStore, digest: &str) -> Result<(), ImageError> {
        let _shared = store.gc_lock(false)?;
        if !store.blob_path(digest)?.exists() {
            return Err(ImageError::NotFound(digest.to_string()));
        }
        self.add(store, digest)
    }

    /// The layers added so far.
    pub fn layers(&self) -> Vec<String> {
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn check_holder(h: &str) -> Result<(), ImageError> {
    if !h.is_empty()
        && h.len() <= 128
        && !h.starts_with('.')
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        Ok(())
    } else {
        Err(ImageError::BadRef(format!("bad lease holder {h:?}")))
    }
}

impl ImageStore {
    /// The store-wide lock: shared while leasing or adding, exclusive while collecting.
    pub(crate) fn gc_lock(&self, exclusive: bool) -> Result<Flock<File>, ImageError> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root().join("gc.lock"))
            .map_err(|e| ImageError::io("open gc.lock", e))?;
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        Flock::lock(f, arg).map_err(|(_, e)| ImageError::io("lock gc.lock", e.into()))
    }

    fn lease_path(&self, holder: &str) -> PathBuf {
        self.root().join("leases").join(format!("{holder}.json"))
    }

    /// A temporary lease for this process (a build, an import, a fork snapshot).
    pub fn temp_lease(&self, what: &str) -> Result<Lease, ImageError> {
        let holder = format!("tmp-{what}-{}-{}", std::process::id(), seq());
        check_holder(&holder)?;
        Ok(Lease {
            path: self.lease_path(&holder),
            holder,
            layers: Mutex::new(Vec::new()),
        })
    }

    /// Resolves `refs` (lowest first) and leases the layers to `holder` in one step, so no
    /// collection can remove them before the holder mounts them. Returns the layers.
    pub fn acquire(&self, holder: &str, refs: &[String]) -> Result<Vec<String>, ImageError> {
        check_holder(holder)?;
        let _shared = self.gc_lock(false)?;
        let layers = self.resolve(refs)?;
        self.write_lease(holder, &layers)?;
        Ok(layers)
    }

    /// Leases known layers to `holder` (re-adopting a sandbox). Fails with `NotFound` if a
    /// layer is no longer stored.
    pub fn lease_layers(&self, holder: &str, layers: &[String]) -> Result<(), ImageError> {
        check_holder(holder)?;
        let _shared = self.gc_lock(false)?;
        for l in layers {
            if !self.blob_path(l)?.exists() {
                return Err(ImageError::NotFound(l.clone()));
            }
        }
        self.write_lease(holder, layers)
    }

    fn write_lease(&self, holder: &str, layers: &[String]) -> Result<(), ImageError> {
        let f = LeaseFile {
            layers: layers.to_vec(),
            pid: None,
            created_ms: now_ms(),
        };
        write_atomic(
            &self.lease_path(holder),
            &serde_json::to_vec(&f).expect("serializes"),
        )
    }

    /// Drops `holder`'s lease; returns the layers it held (empty if it had none).
    pub fn release(&self, holder: &str) -> Vec<String> {
        if check_holder(holder).is_err() {
            return Vec::new();
        }
        let p = self.lease_path(holder);
        let layers = std::fs::read(&p)
            .ok()
            .and_then(|d| serde_json::from_slice::<LeaseFile>(&d).ok())
            .map(|f| f.layers)
            .unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        layers
    }

    /// Drops `holder`'s lease and collects the layers it held that nothing references any
    /// more (fork snapshots, layers of images removed while in use).
    pub fn release_and_collect(&self, holder: &str) -> Result<GcReport, ImageError> {
        let layers = self.release(holder);
        if layers.is_empty() {
            return Ok(GcReport::default());
        }
        self.collect(&layers)
    }

    /// Every lease: holder → what it holds.
    pub fn leases(&self) -> Vec<(String, LeaseFile)> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(self.root().join("leases")) else {
            return out;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(holder) = name.strip_suffix(".json") else {
                continue;
            };
            let f = std::fs::read(e.path())
                .ok()
                .and_then(|d| serde_json::from_slice::<LeaseFile>(&d).ok())
                .unwrap_or_default();
            out.push((holder.to_string(), f));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Drops the leases of holders named `<prefix>...` that are not in `known` (sandboxes a
    /// node no longer has) and collects what they held. Returns the holders dropped.
    pub fn release_stale(
        &self,
        prefix: &str,
        known: &[&str],
    ) -> Result<(Vec<String>, GcReport), ImageError> {
        let mut dropped = Vec::new();
        let mut layers = Vec::new();
        for (holder, _) in self.leases() {
            if holder.starts_with(prefix) && !known.contains(&holder.as_str()) {
                layers.extend(self.release(&holder));
                dropped.push(holder);
            }
        }
        layers.sort();
        layers.dedup();
        let report = if layers.is_empty() {
            GcReport::default()
        } else {
            self.collect(&layers)?
        };
        Ok((dropped, report))
    }
}
