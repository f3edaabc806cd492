//! Reading a stack of layers as a sandbox would see it (overlayfs rules), without mounting
//! the stack: each layer is read through its shared read-only mount in the image store
//! (`ImageStore::ensure_mounted`, owners as stored, i.e. as sandboxes see them). A character
//! device 0/0 is a whiteout (the name is deleted below), a directory with
//! `user.overlay.opaque=y` hides everything below it. Used to find what a `COPY` or
//! `WORKDIR` writes over (existing directories keep their owner and mode) and to read the
//! files of `COPY --from`.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use crate::BuildError;

const OPAQUE: &str = "user.overlay.opaque";
/// Most symbolic links followed resolving one path (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// The merged view of layer roots (lowest first).
#[derive(Debug, Clone, Default)]
pub struct StackView {
    roots: Vec<PathBuf>,
}

/// A path found in the view: the file that shows there and its metadata.
#[derive(Debug)]
pub struct Found {
    pub real: PathBuf,
    pub meta: std::fs::Metadata,
}

fn is_whiteout(m: &std::fs::Metadata) -> bool {
    m.file_type().is_char_device() && m.rdev() == 0
}

fn is_opaque(p: &Path) -> bool {
    matches!(xattr::get(p, OPAQUE), Ok(Some(v)) if v == b"y")
}

/// `p` as normal components (`/`, `.` dropped, `..` popped, never above the root).
pub fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Why [`follow_links`] stopped.
#[derive(Debug)]
pub enum LinkError {
    /// More than [`MAX_LINKS`] links on the way.
    TooMany,
    /// A link that could not be read (its real file).
    Read(PathBuf, std::io::Error),
}

/// `rel` under a root (a build context, a view of layers) with every symlink among its
/// parents followed inside that root: a link's absolute target starts at the root and `..`
/// never climbs above it. The last component is followed too when `follow_last`.
/// `symlink_at(p)` answers the real file of `p` (relative to the root) when it is a
/// symlink, else `None`; it is asked only of paths whose parents were resolved.
pub fn follow_links(
    rel: &Path,
    follow_last: bool,
    symlink_at: impl Fn(&Path) -> Option<PathBuf>,
) -> Result<PathBuf, LinkError> {
    let mut todo: Vec<OsString> = clean(rel)
        .components()
        .map(|c| c.as_os_str().to_os_string())
        .rev()
        .collect();
    let mut done = PathBuf::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        let cand = done.join(&c);
        let last = todo.is_empty();
        match symlink_at(&cand).filter(|_| !last || follow_last) {
            Some(real) => {
                hops += 1;
                if hops > MAX_LINKS {
                    return Err(LinkError::TooMany);
                }
                let target = std::fs::read_link(&real).map_err(|e| LinkError::Read(real, e))?;
                let base = if target.is_absolute() {
                    PathBuf::new()
                } else {
                    done.clone()
                };
                let joined = clean(&base.join(target));
                for p in joined.components().rev() {
                    todo.push(p.as_os_str().to_os_string());
                }
                done = PathBuf::new();
            }
            None => done = cand,
        }
    }
    Ok(done)
}

impl StackView {
    pub fn new(roots: Vec<PathBuf>) -> StackView {
        StackView { roots }
    }

    /// Mounts (shared, read-only) each of `layers` in `store` and views them.
    pub fn of(
        store: &warren_image::ImageStore,
        layers: &[String],
    ) -> Result<StackView, BuildError> {
        let mut roots = Vec::new();
        for l in layers {
            roots.push(store.ensure_mounted(l)?);
        }
        Ok(StackView { roots })
    }

    /// The image path of `real`, a file under one of the view's layer roots.
    pub fn relative(&self, real: &Path) -> Option<PathBuf> {
        self.roots
            .iter()
            .find_map(|r| real.strip_prefix(r).ok().map(Path::to_path_buf))
    }

    /// What shows at `rel` (no symlink followed).
    pub fn lookup(&self, rel: &Path) -> Option<Found> {
        let rel = clean(rel);
        if rel.as_os_str().is_empty() {
            let real = self.roots.last()?.clone();
            let meta = std::fs::symlink_metadata(&real).ok()?;
            return Some(Found { real, meta });
        }
        let comps: Vec<_> = rel.components().collect();
        for root in self.roots.iter().rev() {
            let mut cur = root.clone();
            let mut stop_below = false;
            for (i, c) in comps.iter().enumerate() {
                cur.push(c);
                let Ok(m) = std::fs::symlink_metadata(&cur) else {
                    break;
                };
                if is_whiteout(&m) {
                    return None;
                }
                if i + 1 == comps.len() {
                    return Some(Found { real: cur, meta: m });
                }
                if !m.is_dir() {
                    // A file where a parent directory should be hides the path.
                    return None;
                }
                if is_opaque(&cur) {
                    stop_below = true;
                }
            }
            if stop_below {
                return None;
            }
        }
        None
    }

    /// `rel` with every symlink of its parents followed (inside the view); the last
    /// component is followed too when `follow_last`.
    pub fn resolve(&self, rel: &Path, follow_last: bool) -> Result<PathBuf, BuildError> {
        follow_links(rel, follow_last, |p| {
            self.lookup(p)
                .filter(|f| f.meta.file_type().is_symlink())
                .map(|f| f.real)
        })
        .map_err(|e| match e {
            LinkError::TooMany => BuildError::Invalid(format!(
                "too many symbolic links resolving /{}",
                rel.display()
            )),
            LinkError::Read(real, e) => BuildError::io(format!("read link {}", real.display()), e),
        })
    }

    /// The names in directory `rel` (merged; whiteouts and opaque directories applied),
    /// each with the file that shows.
    pub fn list(&self, rel: &Path) -> BTreeMap<OsString, PathBuf> {
        let rel = clean(rel);
        let mut out = BTreeMap::new();
        let mut hidden = std::collections::BTreeSet::new();
        for root in self.roots.iter().rev() {
            let dir = root.join(&rel);
            // This layer's directory only counts if the directory shows from here down.
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => break,
                Err(_) => continue,
            }
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    let name = e.file_name();
                    if out.contains_key(&name) || hidden.contains(&name) {
                        continue;
                    }
                    match e.metadata() {
                        Ok(m) if is_whiteout(&m) => {
                            hidden.insert(name);
                        }
                        Ok(_) => {
                            out.insert(name, e.path());
                        }
                        Err(_) => {}
                    }
                }
            }
            if is_opaque(&dir) {
                break;
            }
        }
        out
    }
}
