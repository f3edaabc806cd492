//! A blob store in a local directory.

use bytes::Bytes;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{BlobError, BlobStore, BlobUpload};

/// Numbers the temporary files of writes (several may write one key at once).
static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// Blobs as files under a directory (`DIR/sha256/<hex>`).
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        LocalStore { root: root.into() }
    }

    fn path(&self, key: &str) -> Result<PathBuf, BlobError> {
        if key
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(BlobError::BadDigest(key.to_string()));
        }
        Ok(self.root.join(key))
    }

    /// Where `key`'s blob goes (its directory made) and a temporary file beside it of this
    /// write alone, renamed into place once written whole: a reader never sees part of a
    /// blob, and two writers of one key never share a temporary file.
    fn staging(&self, key: &str) -> Result<(PathBuf, PathBuf), BlobError> {
        let dest = self.path(key)?;
        if let Some(d) = dest.parent() {
            std::fs::create_dir_all(d).map_err(|e| BlobError::io("create blob dir", e))?;
        }
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let tmp = dest.with_extension(format!("tmp-{}-{n}", std::process::id()));
        Ok((dest, tmp))
    }

    fn open(&self, key: &str) -> Result<std::fs::File, BlobError> {
        std::fs::File::open(self.path(key)?).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => BlobError::NotFound(key.to_string()),
            _ => BlobError::io(format!("open {key} in {}", self.root.display()), e),
        })
    }
}

#[async_trait::async_trait]
impl BlobStore for LocalStore {
    async fn head(&self, key: &str) -> Result<u64, BlobError> {
        let f = self.open(key)?;
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| BlobError::io("stat blob", e))
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        let mut f = self.open(key)?;
        f.seek(SeekFrom::Start(range.start))
            .map_err(|e| BlobError::io("seek blob", e))?;
        let mut buf = Vec::with_capacity((range.end - range.start) as usize);
        f.take(range.end - range.start)
            .read_to_end(&mut buf)
            .map_err(|e| BlobError::io("read blob", e))?;
        Ok(buf.into())
    }

    async fn get(&self, key: &str) -> Result<Bytes, BlobError> {
        let mut buf = Vec::new();
        self.open(key)?
            .read_to_end(&mut buf)
            .map_err(|e| BlobError::io("read blob", e))?;
        Ok(buf.into())
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        let (dest, tmp) = self.staging(key)?;
        std::fs::write(&tmp, &data)
            .and_then(|_| std::fs::rename(&tmp, &dest))
            .map_err(|e| {
                let _ = std::fs::remove_file(&tmp);
                BlobError::io("store blob", e)
            })
    }

    async fn put_parts(&self, key: &str) -> Result<Box<dyn BlobUpload>, BlobError> {
        let (dest, tmp) = self.staging(key)?;
        let file = std::fs::File::create(&tmp).map_err(|e| BlobError::io("create blob", e))?;
        Ok(Box::new(LocalUpload {
            file: Some(file),
            tmp,
            dest,
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        let dir = self.path(prefix.trim_end_matches('/'))?;
        let mut out = Vec::new();
        let mut stack = vec![(dir, prefix.trim_end_matches('/').to_string())];
        while let Some((dir, key)) = stack.pop() {
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(BlobError::io(format!("list {}", dir.display()), e)),
            };
            for e in rd {
                let e = e.map_err(|e| BlobError::io(format!("list {}", dir.display()), e))?;
                let name = e.file_name().to_string_lossy().into_owned();
                // Files being written (`put` renames them into place) are not blobs yet.
                if name.contains(".tmp-") {
                    continue;
                }
                let child = format!("{key}/{name}");
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((e.path(), child));
                } else {
                    out.push(child);
                }
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        self.root.display().to_string()
    }
}

/// An upload by parts to a [`LocalStore`]: a temporary file beside the blob (not listed),
/// renamed into place when complete and removed otherwise (also when dropped).
#[derive(Debug)]
struct LocalUpload {
    /// `None` once completed or aborted.
    file: Option<std::fs::File>,
    tmp: PathBuf,
    dest: PathBuf,
}

impl LocalUpload {
    fn file(&mut self) -> Result<&mut std::fs::File, BlobError> {
        self.file
            .as_mut()
            .ok_or_else(|| BlobError::io("write blob", std::io::Error::other("upload ended")))
    }
}

#[async_trait::async_trait]
impl BlobUpload for LocalUpload {
    async fn put_part(&mut self, part: Bytes) -> Result<(), BlobError> {
        self.file()?
            .write_all(&part)
            .map_err(|e| BlobError::io("write blob", e))
    }

    async fn complete(mut self: Box<Self>) -> Result<(), BlobError> {
        self.file = None;
        std::fs::rename(&self.tmp, &self.dest).map_err(|e| {
            let _ = std::fs::remove_file(&self.tmp);
            BlobError::io("store blob", e)
        })
    }

    async fn abort(mut self: Box<Self>) -> Result<(), BlobError> {
        self.file = None;
        match std::fs::remove_file(&self.tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(BlobError::io("remove a blob upload", e))
            }
            _ => Ok(()),
        }
    }
}

impl Drop for LocalUpload {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
