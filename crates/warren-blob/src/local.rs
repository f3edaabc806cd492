//! A blob store in a local directory.

use bytes::Bytes;
use std::io::{Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::PathBuf;

use crate::{BlobError, BlobStore};

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
        let p = self.path(key)?;
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).map_err(|e| BlobError::io("create blob dir", e))?;
        }
        let tmp = p.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, &data).map_err(|e| BlobError::io("write blob", e))?;
        std::fs::rename(&tmp, &p).map_err(|e| BlobError::io("store blob", e))
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
