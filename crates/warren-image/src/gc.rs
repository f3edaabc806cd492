//! Garbage collection: unmount and delete layers that no image and no lease references.

use std::collections::BTreeSet;
use std::path::Path;
use warren_types::{GcReport, ImageDeleted};

use crate::files::hex_of;
use crate::store::ImageStore;
use crate::ImageError;

/// True for holders of temporary leases (`tmp-<what>-<pid>-<n>`).
pub fn is_temp_holder(holder: &str) -> bool {
    holder.starts_with("tmp-")
}

/// A temporary lease whose process is gone.
fn stale(holder: &str, pid: Option<u32>) -> bool {
    if !is_temp_holder(holder) {
        return false;
    }
    match pid {
        Some(p) => !Path::new(&format!("/proc/{p}")).exists(),
        None => false,
    }
}

impl ImageStore {
    /// Collects every layer that no image and no lease references.
    pub fn gc(&self) -> Result<GcReport, ImageError> {
        self.sweep(None)
    }

    /// Collects those of `candidates` that no image and no lease references.
    pub fn collect(&self, candidates: &[String]) -> Result<GcReport, ImageError> {
        // Fast path, without the exclusive lock (which would stall every create): most
        // candidates (a sandbox's image layers) are still referenced by an image. A layer
        // whose image is removed meanwhile is collected by that removal.
        let mut referenced = BTreeSet::new();
        for m in self.list() {
            referenced.extend(m.layers);
        }
        if candidates.iter().all(|c| referenced.contains(c)) {
            return Ok(GcReport::default());
        }
        self.sweep(Some(candidates))
    }

    /// Removes an image tag, then collects the layers it referenced that nothing else does.
    pub fn remove_and_collect(&self, r: &str) -> Result<ImageDeleted, ImageError> {
        let m = self.manifest(r)?;
        self.remove(r)?;
        let gc = self.collect(&m.layers)?;
        Ok(ImageDeleted {
            reference: format!("{}:{}", m.name, m.tag),
            gc,
        })
    }

    fn sweep(&self, candidates: Option<&[String]>) -> Result<GcReport, ImageError> {
        let _excl = self.gc_lock(true)?;
        let mut referenced = BTreeSet::new();
        for m in self.list_checked(true)? {
            referenced.extend(m.layers);
        }
        let mut leased = BTreeSet::new();
        for (holder, f) in self.leases() {
            if stale(&holder, f.pid) {
                let _ =
                    std::fs::remove_file(self.root().join("leases").join(format!("{holder}.json")));
                continue;
            }
            leased.extend(f.layers);
        }
        let mounts = warren_sys::mount::mounts_under(&self.root().join("mnt"));
        let all: BTreeSet<String> = match candidates {
            Some(c) => c.iter().filter(|d| hex_of(d).is_ok()).cloned().collect(),
            None => {
                let mut s: BTreeSet<String> = self.layers().into_iter().collect();
                // Mounts and metadata whose blob is already gone.
                for m in &mounts {
                    if let Some(name) = Path::new(m).file_name().and_then(|n| n.to_str()) {
                        let hex = name.split('.').next().unwrap_or("");
                        s.insert(format!("sha256:{hex}"));
                    }
                }
                if let Ok(rd) = std::fs::read_dir(self.root().join("layers")) {
                    for e in rd.flatten() {
                        if let Some(h) =
                            e.file_name().to_str().and_then(|n| n.strip_suffix(".json"))
                        {
                            s.insert(format!("sha256:{h}"));
                        }
                    }
                }
                s.into_iter().filter(|d| hex_of(d).is_ok()).collect()
            }
        };
        let mut report = GcReport::default();
        for d in all {
            if referenced.contains(&d) {
                continue;
            }
            if leased.contains(&d) {
                report.in_use.push(d);
                continue;
            }
            report.freed_bytes += self.delete_layer(&d, &mounts)?;
            report.removed.push(d);
        }
        if !report.removed.is_empty() {
            self.cache_forget(&report.removed);
        }
        Ok(report)
    }

    /// Unmounts a layer (its idmapped clones first) and deletes its blob, metadata and
    /// conversion-index entries. Returns the bytes freed.
    fn delete_layer(&self, digest: &str, mounts: &[String]) -> Result<u64, ImageError> {
        let hex = hex_of(digest)?;
        let mnt = self.root().join("mnt");
        let plain = mnt.join(hex).display().to_string();
        let clone_prefix = format!("{plain}.idmap-");
        let mut ours: Vec<&String> = mounts
            .iter()
            .filter(|m| **m == plain || m.starts_with(&clone_prefix))
            .collect();
        // Clones before the mount they were cloned from.
        ours.sort_by_key(|m| **m == plain);
        for m in ours {
            warren_sys::mount::umount(Path::new(m), true).map_err(|source| ImageError::Mount {
                digest: digest.to_string(),
                source,
            })?;
        }
        if let Ok(rd) = std::fs::read_dir(&mnt) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n == hex || n.starts_with(&format!("{hex}.idmap-")) {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
        }
        let blob = self.blob_path(digest)?;
        let size = std::fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
        match std::fs::remove_file(&blob) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ImageError::io(format!("remove {}", blob.display()), e)),
        }
        let _ = std::fs::remove_file(self.root().join("layers").join(format!("{hex}.json")));
        if let Ok(rd) = std::fs::read_dir(self.root().join("index")) {
            for e in rd.flatten() {
                if std::fs::read_to_string(e.path()).is_ok_and(|t| t.trim() == digest) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(size)
    }
}
