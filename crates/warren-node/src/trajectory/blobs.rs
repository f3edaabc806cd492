//! Output blobs as files beside the state file: `<state dir>/trajectory-blobs/<ab>/<sha256>`.
//!
//! Why files and not redb values: redb gives a value larger than a page a power-of-two run of
//! pages of its own (a 1 MiB output took 2 MiB), keeps freed pages in the file, and grows its
//! file by doubling; the bytes a sandbox prints then cost the node's disk up to four times
//! their size, and deleting the sandbox gave none of it back. A file costs its size (rounded
//! to the filesystem's block) and is gone when unlinked.
//!
//! Crash safety without a second log: the reference counts stay in redb (`blob_refs`), and a
//! file is written (fsynced, renamed into place) *before* the transaction that first refers
//! to it commits, and unlinked only *after* the transaction that drops its last reference
//! commits. A crash can therefore only leave a file nobody refers to, which [`BlobDir::open`]
//! sweeps away. Every transaction that changes reference counts holds [`BlobDir::lock`]
//! around it (taken before the transaction begins), so an unlink never races a new reference
//! to the same content.

use bytes::Bytes;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::StoreError;

/// The blob directory of one state file.
#[derive(Debug)]
pub struct BlobDir {
    root: PathBuf,
    /// Bytes of all blob files (their lengths).
    bytes: AtomicU64,
    lock: Mutex<()>,
}

fn io_err(path: &Path, what: &'static str, e: std::io::Error) -> StoreError {
    StoreError::Blob {
        what,
        path: path.to_path_buf(),
        source: e,
    }
}

/// A blob's name is a sha256 in hex: anything else found in the directory is not ours.
fn is_digest(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

impl BlobDir {
    /// Opens (creating) the directory and removes every file `keep` does not name: blobs a
    /// crash left without a reference, and unfinished writes.
    pub fn open(root: PathBuf, keep: impl Fn(&str) -> bool) -> Result<BlobDir, StoreError> {
        std::fs::create_dir_all(&root).map_err(|e| io_err(&root, "create", e))?;
        let mut bytes = 0u64;
        for shard in std::fs::read_dir(&root).map_err(|e| io_err(&root, "list", e))? {
            let shard = shard.map_err(|e| io_err(&root, "list", e))?.path();
            if !shard.is_dir() {
                let _ = std::fs::remove_file(&shard);
                continue;
            }
            for f in std::fs::read_dir(&shard).map_err(|e| io_err(&shard, "list", e))? {
                let f = f.map_err(|e| io_err(&shard, "list", e))?;
                let name = f.file_name().to_string_lossy().into_owned();
                if is_digest(&name) && keep(&name) {
                    bytes += f.metadata().map_or(0, |m| m.len());
                } else {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        Ok(BlobDir {
            root,
            bytes: AtomicU64::new(bytes),
            lock: Mutex::new(()),
        })
    }

    /// Held around every transaction that changes reference counts, from before it begins
    /// until its files are written or unlinked.
    pub fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.root.join(&digest[..2]).join(digest)
    }

    /// Writes `bytes` under `digest`, durably, before a reference to it commits. Content is
    /// addressed: a file already there holds the same bytes and is kept.
    pub fn write(&self, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
        debug_assert!(is_digest(digest));
        let path = self.path(digest);
        if path.exists() {
            return Ok(());
        }
        let dir = path.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, "create", e))?;
        let tmp = dir.join(format!(".{digest}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The name is durable once its directory is.
            std::fs::File::open(dir)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&path, "write", e));
        }
        self.bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The bytes stored under `digest`, if any.
    pub fn read(&self, digest: &str) -> Result<Option<Bytes>, StoreError> {
        if !is_digest(digest) {
            return Ok(None);
        }
        let path = self.path(digest);
        match std::fs::read(&path) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, "read", e)),
        }
    }

    /// The file of `digest`, open for reading (an export streams it), if it is stored.
    pub fn open_file(&self, digest: &str) -> Result<Option<std::fs::File>, StoreError> {
        if !is_digest(digest) {
            return Ok(None);
        }
        let path = self.path(digest);
        match std::fs::File::open(&path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, "open", e)),
        }
    }

    /// Unlinks blobs whose last reference is gone (after that transaction committed).
    pub fn remove(&self, digests: &[String]) {
        for d in digests.iter().filter(|d| is_digest(d)) {
            let path = self.path(d);
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    self.bytes.fetch_sub(len, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "could not remove a trajectory blob; it is removed at the next start")
                }
            }
        }
    }

    /// Bytes of all blob files.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// How many blob files there are (for tests).
    pub fn count(&self) -> u64 {
        let Ok(shards) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        shards
            .flatten()
            .filter_map(|s| std::fs::read_dir(s.path()).ok())
            .flat_map(|files| files.flatten())
            .filter(|f| is_digest(&f.file_name().to_string_lossy()))
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aa00000000000000000000000000000000000000000000000000000000000001";
    const B: &str = "bb00000000000000000000000000000000000000000000000000000000000002";

    #[test]
    fn blobs_are_written_once_read_back_counted_and_removed() {
        let t = tempfile::tempdir().unwrap();
        let d = BlobDir::open(t.path().join("b"), |_| true).unwrap();
        d.write(A, b"hello").unwrap();
        d.write(A, b"hello").unwrap();
        d.write(B, &[7u8; 10_000]).unwrap();
        assert_eq!(d.bytes(), 10_005);
        assert_eq!(d.count(), 2);
        assert_eq!(d.read(A).unwrap().unwrap(), &b"hello"[..]);
        assert_eq!(d.read("../../etc/passwd").unwrap(), None);
        d.remove(&[A.to_string(), "not-a-digest".into()]);
        assert_eq!(d.read(A).unwrap(), None);
        assert_eq!(d.bytes(), 10_000);
        assert_eq!(d.count(), 1);
    }

    #[test]
    fn opening_sweeps_unreferenced_blobs_and_unfinished_writes() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("b");
        {
            let d = BlobDir::open(root.clone(), |_| true).unwrap();
            d.write(A, b"kept").unwrap();
            d.write(B, b"orphan").unwrap();
        }
        std::fs::write(root.join("aa").join(format!(".{A}.tmp")), b"half").unwrap();
        let d = BlobDir::open(root.clone(), |n| n == A).unwrap();
        assert_eq!(d.count(), 1);
        assert_eq!(d.bytes(), 4);
        assert_eq!(d.read(B).unwrap(), None);
        assert!(!root.join("aa").join(format!(".{A}.tmp")).exists());
    }
}
