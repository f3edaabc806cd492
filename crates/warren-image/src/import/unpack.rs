//! Unpacking one OCI layer (a tar stream) into a directory the way overlayfs wants it as a
//! lower layer: `.wh.<name>` becomes a character device 0/0 named `<name>` (a whiteout) and
//! `.wh..wh..opq` becomes `user.overlay.opaque=y` on its directory (sandboxes mount their
//! overlay with `userxattr`). Owners, modes (set-id bits included), modification times,
//! extended attributes (PAX `SCHILY.xattr.*`), hard links, symlinks, devices and FIFOs are
//! kept. Runs as root; nothing is ever written outside `root` (no `..`, no path through a
//! symlink).

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

/// The xattr that marks an opaque directory for overlayfs mounted with `userxattr`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Counts of what a layer held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    pub bytes: u64,
}

/// Why a layer could not be unpacked (the caller names the layer).
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The tar stream is malformed or unsafe.
    #[error("{0}")]
    Bad(String),
    /// The stream failed (decompression, truncation) or the host did.
    #[error("{0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for UnpackError {
    fn from(e: std::io::Error) -> Self {
        UnpackError::Io(e)
    }
}

struct DirAttrs {
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: Option<u64>,
}

/// `path` as normal components only (leading `/` and `./` dropped); `None` if it has `..`.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Makes sure every directory on the way to `rel`'s parent exists and is a real directory
/// (never a symlink); returns the parent.
fn parent_dir(root: &Path, rel: &Path) -> Result<PathBuf, UnpackError> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match std::fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(UnpackError::Bad(format!(
                        "{} goes through {} which is not a directory",
                        rel.display(),
                        cur.strip_prefix(root).unwrap_or(&cur).display()
                    )))
                }
                Err(_) => {
                    std::fs::create_dir(&cur)?;
                    std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o755))?;
                }
            }
        }
    }
    Ok(cur)
}

/// Removes whatever is at `p` (a later entry of the same layer replaces an earlier one);
/// a directory is kept when the new entry is a directory too.
fn clear(p: &Path, new_is_dir: bool) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => {
            if new_is_dir {
                Ok(())
            } else {
                std::fs::remove_dir_all(p)
            }
        }
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    }
}

fn whiteout(p: &Path) -> std::io::Result<()> {
    clear(p, false)?;
    mknod(
        p,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0),
        makedev(0, 0),
    )
    .map_err(std::io::Error::from)
}

/// Unpacks a tar stream into `root` (an empty directory). Reads the stream to its end.
pub fn unpack<R: Read>(reader: R, root: &Path) -> Result<(UnpackStats, R), UnpackError> {
    let mut ar = tar::Archive::new(reader);
    let mut stats = UnpackStats::default();
    let mut dirs: BTreeMap<PathBuf, DirAttrs> = BTreeMap::new();
    {
        let entries = ar.entries().map_err(|e| UnpackError::Bad(e.to_string()))?;
        for entry in entries {
            let mut e = entry.map_err(classify)?;
            stats.entries += 1;
            let raw = e.path().map_err(classify)?.into_owned();
            let rel = relative(&raw)
                .ok_or_else(|| UnpackError::Bad(format!("{} escapes the layer", raw.display())))?;
            let h = e.header();
            let kind = h.entry_type();
            let mode = h.mode().map_err(classify)?;
            let uid = h.uid().map_err(classify)?;
            let gid = h.gid().map_err(classify)?;
            let mtime = h.mtime().ok();
            if rel.as_os_str().is_empty() {
                if kind.is_dir() {
                    dirs.insert(
                        rel,
                        DirAttrs {
                            mode,
                            uid,
                            gid,
                            mtime,
                        },
                    );
                }
                continue;
            }
            let parent = parent_dir(root, &rel)?;
            let name = rel
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name == ".wh..wh..opq" {
                xattr::set(&parent, OPAQUE_XATTR, b"y")?;
                stats.opaque_dirs += 1;
                continue;
            }
            if let Some(hidden) = name.strip_prefix(".wh.") {
                whiteout(&parent.join(hidden))?;
                stats.whiteouts += 1;
                continue;
            }
            let dst = parent.join(&name);
            clear(&dst, kind.is_dir())?;
            use tar::EntryType as T;
            match kind {
                T::Directory => {
                    if !dst.is_dir() {
                        std::fs::create_dir(&dst)?;
                    }
                    dirs.insert(
                        rel.clone(),
                        DirAttrs {
                            mode,
                            uid,
                            gid,
                            mtime,
                        },
                    );
                }
                T::Regular | T::Continuous | T::GNUSparse => {
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&dst)?;
                    stats.bytes += std::io::copy(&mut e, &mut f)?;
                }
                T::Symlink => {
                    let target = e.link_name().map_err(classify)?.ok_or_else(|| {
                        UnpackError::Bad(format!("symlink {} has no target", rel.display()))
                    })?;
                    std::os::unix::fs::symlink(&*target, &dst)?;
                }
                T::Link => {
                    let target = e.link_name().map_err(classify)?.ok_or_else(|| {
                        UnpackError::Bad(format!("hard link {} has no target", rel.display()))
                    })?;
                    let trel = relative(&target).ok_or_else(|| {
                        UnpackError::Bad(format!("hard link {} escapes the layer", rel.display()))
                    })?;
                    let tparent = parent_dir(root, &trel)?;
                    let src = tparent.join(trel.file_name().unwrap_or_default());
                    match std::fs::symlink_metadata(&src) {
                        Ok(m) if !m.is_dir() => std::fs::hard_link(&src, &dst)?,
                        _ => {
                            return Err(UnpackError::Bad(format!(
                                "hard link {} points to {} which is not in the layer",
                                rel.display(),
                                trel.display()
                            )))
                        }
                    }
                    // A hard link shares its target's inode: owner, mode and times are the
                    // target's.
                    continue;
                }
                T::Char | T::Block => {
                    let major = h.device_major().map_err(classify)?.unwrap_or(0);
                    let minor = h.device_minor().map_err(classify)?.unwrap_or(0);
                    let k = if kind == T::Char {
                        SFlag::S_IFCHR
                    } else {
                        SFlag::S_IFBLK
                    };
                    mknod(
                        &dst,
                        k,
                        Mode::from_bits_truncate(0),
                        makedev(major.into(), minor.into()),
                    )
                    .map_err(std::io::Error::from)?;
                }
                T::Fifo => {
                    nix::unistd::mkfifo(&dst, Mode::from_bits_truncate(0o600))
                        .map_err(std::io::Error::from)?;
                }
                other => {
                    return Err(UnpackError::Bad(format!(
                        "{} has an unsupported entry type {other:?}",
                        rel.display()
                    )))
                }
            }
            // Extended attributes first (setting some may need the file's current owner).
            if let Ok(Some(exts)) = e.pax_extensions() {
                for ext in exts.flatten() {
                    let Ok(key) = ext.key() else { continue };
                    if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
                        if let Err(err) = xattr::set(&dst, attr, ext.value_bytes()) {
                            // Symlinks cannot carry user.* attributes; anything else is an error.
                            if kind != T::Symlink {
                                return Err(UnpackError::Io(err));
                            }
                        }
                    }
                }
            }
            if kind.is_dir() {
                continue;
            }
            std::os::unix::fs::lchown(&dst, Some(uid as u32), Some(gid as u32))?;
            if kind != T::Symlink {
                // After chown, which clears set-id bits.
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode & 0o7777))?;
            }
            if let Some(t) = mtime {
                let ft = filetime::FileTime::from_unix_time(t as i64, 0);
                filetime::set_symlink_file_times(&dst, ft, ft)?;
            }
        }
    }
    // Directories last, deepest first: their times would change with every entry added.
    for (rel, a) in dirs.iter().rev() {
        let p = root.join(rel);
        std::os::unix::fs::lchown(&p, Some(a.uid as u32), Some(a.gid as u32))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(a.mode & 0o7777))?;
    }
    set_dir_times(root, &dirs)?;
    let mut inner = ar.into_inner();
    // Whatever follows the end-of-archive blocks still counts for the digest.
    std::io::copy(&mut inner, &mut std::io::sink())?;
    Ok((stats, inner))
}

/// Sets every directory's mtime (recorded ones as recorded, others left as created).
fn set_dir_times(root: &Path, dirs: &BTreeMap<PathBuf, DirAttrs>) -> std::io::Result<()> {
    for (rel, a) in dirs.iter().rev() {
        if let Some(t) = a.mtime {
            let ft = filetime::FileTime::from_unix_time(t as i64, 0);
            filetime::set_symlink_file_times(root.join(rel), ft, ft)?;
        }
    }
    Ok(())
}

/// tar's errors are `io::Error`s: malformed headers are `InvalidData`/`Other` with a
/// message; stream failures carry their kind.
fn classify(e: std::io::Error) -> UnpackError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => UnpackError::Io(e),
        _ => UnpackError::Bad(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_never_escape() {
        assert_eq!(relative(Path::new("./a/b")), Some(PathBuf::from("a/b")));
        assert_eq!(relative(Path::new("/a")), Some(PathBuf::from("a")));
        assert_eq!(relative(Path::new("a/../../b")), None);
    }
}
