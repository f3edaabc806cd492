//! Where the files of an image archive are read from: a directory (an OCI image layout) or a
//! tar file (`docker save`, an OCI archive), read in place without unpacking it.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::ImageError;

/// Named files of an archive.
pub(crate) enum Source {
    Dir(PathBuf),
    /// The tar file and, per member name, (offset of its data, size).
    Tar {
        path: PathBuf,
        members: HashMap<String, (u64, u64)>,
    },
}

fn clean(name: &str) -> String {
    name.trim_start_matches("./")
        .trim_start_matches('/')
        .to_string()
}

impl Source {
    pub(crate) fn open(path: &Path) -> Result<Source, ImageError> {
        let name = path.display().to_string();
        let meta = std::fs::metadata(path)
            .map_err(|e| ImageError::archive(&name, format!("cannot read it: {e}")))?;
        if meta.is_dir() {
            return Ok(Source::Dir(path.to_path_buf()));
        }
        let f = File::open(path).map_err(|e| ImageError::archive(&name, e.to_string()))?;
        let mut ar = tar::Archive::new(f);
        let mut members = HashMap::new();
        let entries = ar
            .entries()
            .map_err(|e| ImageError::archive(&name, format!("not a tar archive: {e}")))?;
        for e in entries {
            let e = e.map_err(|e| ImageError::archive(&name, format!("not a tar archive: {e}")))?;
            if !e.header().entry_type().is_file() {
                continue;
            }
            let p = e
                .path()
                .map_err(|e| ImageError::archive(&name, e.to_string()))?
                .to_string_lossy()
                .into_owned();
            members.insert(clean(&p), (e.raw_file_position(), e.size()));
        }
        if members.is_empty() {
            return Err(ImageError::archive(
                &name,
                "not a tar archive (no files in it)",
            ));
        }
        Ok(Source::Tar {
            path: path.to_path_buf(),
            members,
        })
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Source::Dir(p) | Source::Tar { path: p, .. } => p.display().to_string(),
        }
    }

    pub(crate) fn exists(&self, member: &str) -> bool {
        match self {
            Source::Dir(d) => safe_join(d, member).is_some_and(|p| p.is_file()),
            Source::Tar { members, .. } => members.contains_key(&clean(member)),
        }
    }

    /// Opens a member; also returns its size.
    pub(crate) fn read(&self, member: &str) -> Result<(Box<dyn Read + Send>, u64), ImageError> {
        let missing = || ImageError::archive(self.name(), format!("{member} is missing"));
        match self {
            Source::Dir(d) => {
                let p = safe_join(d, member).ok_or_else(missing)?;
                let f = File::open(&p).map_err(|_| missing())?;
                let size = f.metadata().map(|m| m.len()).unwrap_or(0);
                Ok((Box::new(f), size))
            }
            Source::Tar { path, members } => {
                let (off, size) = *members.get(&clean(member)).ok_or_else(missing)?;
                let mut f = File::open(path)
                    .map_err(|e| ImageError::archive(self.name(), e.to_string()))?;
                f.seek(SeekFrom::Start(off))
                    .map_err(|e| ImageError::archive(self.name(), e.to_string()))?;
                Ok((Box::new(f.take(size)), size))
            }
        }
    }

    /// Reads a small member (a manifest or config) whole.
    pub(crate) fn read_small(&self, member: &str) -> Result<Vec<u8>, ImageError> {
        let (mut r, size) = self.read(member)?;
        if size > 64 << 20 {
            return Err(ImageError::archive(
                self.name(),
                format!("{member} is too large ({size} bytes)"),
            ));
        }
        let mut v = Vec::with_capacity(size as usize);
        r.read_to_end(&mut v)
            .map_err(|e| ImageError::archive(self.name(), format!("reading {member}: {e}")))?;
        Ok(v)
    }
}

/// `dir/member` when `member` stays inside `dir`.
fn safe_join(dir: &Path, member: &str) -> Option<PathBuf> {
    let rel = Path::new(member.trim_start_matches("./"));
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    Some(dir.join(rel))
}
