//! `COPY` and `ADD` (and the directory `WORKDIR` makes): the files a step adds, planned
//! first (so the cache key can name their digest before anything is written), then staged
//! into a directory that becomes the step's layer.
//!
//! A staged layer holds the copied files and every directory above them. A directory that
//! already shows in the stage's layers is staged with its owner, mode and time (overlayfs
//! takes a directory's attributes from the topmost layer that has it); a new one is 0755,
//! owned by the `--chown` owner or root. Files from the context are owned by root unless
//! `--chown` says otherwise and keep their mode bits and modification time; files of another
//! stage (`--from`) keep their owner.

use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::context::Context;
use crate::stack::{clean, StackView};
use crate::BuildError;

/// Where a step's sources are read.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    Context(&'a Context),
    Stack(&'a StackView),
    /// An archive `ADD` unpacked (a plain directory; its owners are kept).
    Unpacked,
}

/// What one staged entry is.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Dir,
    /// A regular file, read from `Entry::src`.
    File,
    Symlink(PathBuf),
    /// Bytes given inline (a here-document).
    Inline(Vec<u8>),
}

/// One path of the layer to stage.
#[derive(Debug, Clone)]
pub struct Entry {
    pub src: PathBuf,
    /// Relative to the image root.
    pub dest: PathBuf,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: i64,
}

/// A planned step: its entries (parents first) and their digest.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub entries: Vec<Entry>,
    pub digest: String,
}

/// Owner and mode options of a copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub chown: Option<(u32, u32)>,
    pub chmod: Option<u32>,
}

fn bad(m: impl Into<String>) -> BuildError {
    BuildError::Invalid(m.into())
}

/// Looks `name` up in the stage's `/etc/passwd` or `/etc/group` (numbers pass through).
fn lookup_id(view: &StackView, file: &str, name: &str) -> Result<u32, BuildError> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let text = view
        .lookup(Path::new(file))
        .and_then(|f| std::fs::read_to_string(&f.real).ok())
        .unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() > 2 && f[0] == name {
            if let Ok(n) = f[2].parse() {
                return Ok(n);
            }
        }
    }
    Err(bad(format!("no {name:?} in the stage's /{file}")))
}

/// `--chown=user[:group]` against the stage's users and groups.
pub fn parse_chown(spec: &str, view: &StackView) -> Result<(u32, u32), BuildError> {
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid = lookup_id(view, "etc/passwd", u)?;
    let gid = match g {
        Some(g) => lookup_id(view, "etc/group", g)?,
        None if u.parse::<u32>().is_ok() => uid,
        // A user name alone: its primary group.
        None => {
            let text = view
                .lookup(Path::new("etc/passwd"))
                .and_then(|f| std::fs::read_to_string(&f.real).ok())
                .unwrap_or_default();
            text.lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() > 3 && f[0] == u)
                .and_then(|f| f[3].parse().ok())
                .unwrap_or(uid)
        }
    };
    Ok((uid, gid))
}

/// `--chmod=0755` (octal only).
pub fn parse_chmod(spec: &str) -> Result<u32, BuildError> {
    u32::from_str_radix(spec, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| bad(format!("--chmod={spec}: give an octal mode such as 0755")))
}

impl Plan {
    /// Adds the directories above `dest` (not `dest` itself), as they show in `view` or new.
    fn parents(&mut self, view: &StackView, dest: &Path, owner: (u32, u32)) {
        let mut cur = PathBuf::new();
        let comps: Vec<_> = dest.components().collect();
        for c in comps.iter().take(comps.len().saturating_sub(1)) {
            cur.push(c);
            self.dir(view, &cur, owner);
        }
    }

    /// Adds directory `rel` unless planned: as it shows in `view`, or new.
    fn dir(&mut self, view: &StackView, rel: &Path, owner: (u32, u32)) {
        if self.entries.iter().any(|e| e.dest == rel) {
            return;
        }
        let e = match view.lookup(rel) {
            Some(f) if f.meta.is_dir() => Entry {
                src: f.real,
                dest: rel.to_path_buf(),
                kind: Kind::Dir,
                mode: f.meta.mode() & 0o7777,
                uid: f.meta.uid(),
                gid: f.meta.gid(),
                mtime: f.meta.mtime(),
            },
            _ => Entry {
                src: PathBuf::new(),
                dest: rel.to_path_buf(),
                kind: Kind::Dir,
                mode: 0o755,
                uid: owner.0,
                gid: owner.1,
                mtime: now(),
            },
        };
        self.entries.push(e);
    }

    /// Adds `src` (a file, symlink or directory with everything in it) at `dest`.
    fn add_tree(
        &mut self,
        src: &Path,
        dest: &Path,
        keep_owner: bool,
        opts: Options,
        under: &StackView,
        from: Source<'_>,
    ) -> Result<(), BuildError> {
        let m = std::fs::symlink_metadata(src)
            .map_err(|e| BuildError::io(format!("read {}", src.display()), e))?;
        let owner = opts.chown.unwrap_or(if keep_owner {
            (m.uid(), m.gid())
        } else {
            (0, 0)
        });
        let mode = opts.chmod.unwrap_or(m.mode() & 0o7777);
        let ft = m.file_type();
        if ft.is_dir() {
            if !dest.as_os_str().is_empty() {
                // An existing directory keeps its attributes; a new one takes the source's.
                match under.lookup(dest) {
                    Some(f) if f.meta.is_dir() => self.dir(under, dest, owner),
                    _ => {
                        self.entries.retain(|e| e.dest != dest);
                        self.entries.push(Entry {
                            src: src.to_path_buf(),
                            dest: dest.to_path_buf(),
                            kind: Kind::Dir,
                            mode,
                            uid: owner.0,
                            gid: owner.1,
                            mtime: m.mtime(),
                        });
                    }
                }
            }
            let mut names: Vec<(std::ffi::OsString, PathBuf)> = match from {
                Source::Stack(v) => {
                    // `src` is the file that shows; list the merged directory instead.
                    let rel = dest_rel_of(src, v);
                    v.list(&rel).into_iter().collect()
                }
                Source::Context(c) => std::fs::read_dir(src)
                    .map_err(|e| BuildError::io(format!("read {}", src.display()), e))?
                    .flatten()
                    .filter(|e| {
                        let rel = e
                            .path()
                            .strip_prefix(c.root())
                            .map(Path::to_path_buf)
                            .unwrap_or_default();
                        !c.ignored(&rel)
                    })
                    .map(|e| (e.file_name(), e.path()))
                    .collect(),
                Source::Unpacked => std::fs::read_dir(src)
                    .map_err(|e| BuildError::io(format!("read {}", src.display()), e))?
                    .flatten()
                    .map(|e| (e.file_name(), e.path()))
                    .collect(),
            };
            names.sort();
            for (name, path) in names {
                self.add_tree(&path, &dest.join(name), keep_owner, opts, under, from)?;
            }
            return Ok(());
        }
        let kind = if ft.is_symlink() {
            Kind::Symlink(
                std::fs::read_link(src)
                    .map_err(|e| BuildError::io(format!("read link {}", src.display()), e))?,
            )
        } else if ft.is_file() {
            Kind::File
        } else {
            // Devices, sockets and FIFOs are not copied.
            return Ok(());
        };
        self.entries.retain(|e| e.dest != dest);
        self.entries.push(Entry {
            src: src.to_path_buf(),
            dest: dest.to_path_buf(),
            kind,
            mode,
            uid: owner.0,
            gid: owner.1,
            mtime: m.mtime(),
        });
        Ok(())
    }

    /// Computes the digest of what the plan stages (paths, kinds, modes, owners, contents).
    fn seal(&mut self) -> Result<(), BuildError> {
        let mut h = Sha256::new();
        for e in &self.entries {
            h.update(e.dest.as_os_str().as_encoded_bytes());
            h.update(format!("\0{:o}\0{}\0{}\0", e.mode, e.uid, e.gid).as_bytes());
            match &e.kind {
                Kind::Dir => h.update(b"dir\0"),
                Kind::Symlink(t) => {
                    h.update(b"link\0");
                    h.update(t.as_os_str().as_encoded_bytes());
                }
                Kind::Inline(b) => {
                    h.update(b"file\0");
                    h.update(b);
                }
                Kind::File => {
                    h.update(b"file\0");
                    let mut f = std::fs::File::open(&e.src)
                        .map_err(|x| BuildError::io(format!("read {}", e.src.display()), x))?;
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = f
                            .read(&mut buf)
                            .map_err(|x| BuildError::io(format!("read {}", e.src.display()), x))?;
                        if n == 0 {
                            break;
                        }
                        h.update(&buf[..n]);
                    }
                }
            }
            h.update(b"\n");
        }
        self.digest = format!("sha256:{}", hex::encode(h.finalize()));
        Ok(())
    }

    /// Writes the planned entries under `dir` (an empty directory).
    pub fn stage(&self, dir: &Path) -> Result<(), BuildError> {
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |e| BuildError::io(format!("stage {what}"), e)
        };
        for e in &self.entries {
            let p = dir.join(&e.dest);
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(io(parent))?;
            }
            match &e.kind {
                Kind::Dir => {
                    if !p.is_dir() {
                        std::fs::create_dir(&p).map_err(io(&p))?;
                    }
                }
                Kind::File => {
                    std::fs::copy(&e.src, &p).map_err(io(&p))?;
                }
                Kind::Inline(b) => std::fs::write(&p, b).map_err(io(&p))?,
                Kind::Symlink(t) => std::os::unix::fs::symlink(t, &p).map_err(io(&p))?,
            }
            std::os::unix::fs::lchown(&p, Some(e.uid), Some(e.gid)).map_err(io(&p))?;
            if !matches!(e.kind, Kind::Symlink(_)) {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(e.mode))
                    .map_err(io(&p))?;
            }
        }
        // Times last, deepest first, so writing a child does not move its directory's.
        for e in self.entries.iter().rev() {
            let t = filetime::FileTime::from_unix_time(e.mtime, 0);
            let _ = filetime::set_symlink_file_times(dir.join(&e.dest), t, t);
        }
        Ok(())
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The image path of a file `real` that a [`StackView`] showed (its layer root stripped).
fn dest_rel_of(real: &Path, v: &StackView) -> PathBuf {
    v.relative(real).unwrap_or_default()
}

/// A `COPY`/`ADD` of `sources` to `dest` (absolute, already joined with the working
/// directory) over the stage's layers `under`. With `unpack` (an `ADD` from the context: a
/// scratch directory that does not exist yet), archives among the sources are unpacked
/// there and their contents added at `dest` (see [`crate::add`]).
pub fn plan_copy(
    from: Source<'_>,
    sources: &[String],
    heredocs: &[(String, Vec<u8>)],
    dest: &str,
    opts: Options,
    under: &StackView,
    unpack: Option<&Path>,
) -> Result<Plan, BuildError> {
    let mut plan = Plan::default();
    // Paths of the sources, each as (real file, name it goes by).
    let mut found: Vec<(PathBuf, String)> = Vec::new();
    let mut many = sources.len() + heredocs.len() > 1;
    for s in sources {
        match from {
            Source::Context(c) => {
                let list = c.expand(s)?;
                many |= crate::context::is_glob(s) && list.len() > 1;
                for rel in list {
                    let name = rel
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    found.push((c.root().join(&rel), name));
                }
            }
            Source::Unpacked => return Err(bad("an unpacked archive is not a source")),
            Source::Stack(v) => {
                if crate::context::is_glob(s) {
                    return Err(bad(format!("COPY --from takes no glob yet ({s:?})")));
                }
                let rel = v.resolve(Path::new(s), true)?;
                let f = v
                    .lookup(&rel)
                    .ok_or_else(|| bad(format!("{s:?} is not in the source stage")))?;
                let name = rel
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                found.push((f.real, name));
            }
        }
    }
    let dest_path = clean(Path::new(dest));
    let target_is_dir = dest.ends_with('/')
        || dest.ends_with("/.")
        || dest_path.as_os_str().is_empty()
        || under.lookup(&dest_path).is_some_and(|f| f.meta.is_dir());
    if many && !target_is_dir {
        return Err(bad(format!(
            "copying several sources to {dest:?}: the destination must end with /"
        )));
    }
    // Resolve symlinked parents of the destination (e.g. /lib -> usr/lib) in the stage.
    let dest_path = match dest_path.parent() {
        Some(p) if !p.as_os_str().is_empty() => under
            .resolve(p, true)?
            .join(dest_path.file_name().unwrap_or_default()),
        _ => dest_path,
    };
    let owner = opts.chown.unwrap_or((0, 0));
    for (i, (real, name)) in found.iter().enumerate() {
        let archive = match unpack {
            Some(_) if std::fs::symlink_metadata(real).is_ok_and(|m| m.is_file()) => {
                crate::add::archive_kind(real)?
            }
            _ => None,
        };
        if let (Some(kind), Some(scratch)) = (archive, unpack) {
            // The archive's contents go into the destination, always a directory.
            let tree = scratch.join(i.to_string());
            crate::add::unpack(real, kind, &tree)?;
            plan.parents(under, &dest_path, owner);
            if !dest_path.as_os_str().is_empty() {
                plan.dir(under, &dest_path, owner);
            }
            plan.add_tree(&tree, &dest_path, true, opts, under, Source::Unpacked)?;
            continue;
        }
        let is_dir = std::fs::symlink_metadata(real).is_ok_and(|m| m.is_dir());
        let d = if is_dir {
            dest_path.clone()
        } else if target_is_dir {
            dest_path.join(name)
        } else {
            dest_path.clone()
        };
        plan.parents(under, &d, owner);
        if is_dir && !d.as_os_str().is_empty() {
            plan.dir(under, &d, owner);
        }
        let keep_owner = matches!(from, Source::Stack(_));
        plan.add_tree(real, &d, keep_owner, opts, under, from)?;
    }
    for (name, body) in heredocs {
        let d = if target_is_dir {
            dest_path.join(name)
        } else {
            dest_path.clone()
        };
        plan.parents(under, &d, owner);
        plan.entries.push(Entry {
            src: PathBuf::new(),
            dest: d,
            kind: Kind::Inline(body.clone()),
            mode: opts.chmod.unwrap_or(0o644),
            uid: owner.0,
            gid: owner.1,
            mtime: now(),
        });
    }
    plan.seal()?;
    Ok(plan)
}

/// The directory `WORKDIR` makes when the stage lacks it (with its missing parents).
pub fn plan_mkdir(dir: &str, under: &StackView) -> Result<Option<Plan>, BuildError> {
    let rel = under.resolve(Path::new(dir), true)?;
    if rel.as_os_str().is_empty() || under.lookup(&rel).is_some_and(|f| f.meta.is_dir()) {
        return Ok(None);
    }
    let mut plan = Plan::default();
    plan.parents(under, &rel, (0, 0));
    plan.dir(under, &rel, (0, 0));
    // New directories' times do not go into the digest; it names paths, modes and owners.
    plan.seal()?;
    Ok(Some(plan))
}
