//! Writable layers on node-local disk: one file system for all of a node's container
//! sandboxes, each sandbox in a subvolume of its own that a quota holds to its `disk_mb`.
//!
//! Layout (the runtime's contract with whoever reads a writable layer from the host):
//!
//! ```text
//! <dir>/                      the file system's root (mode 0711)
//!   <sandbox id>/             a btrfs subvolume, owned by the sandbox's root, mode 0700,
//!                             limited to disk_mb (quota group of the subvolume)
//!     upper/  work/           the overlay's upper and work directories
//!     root/                   where the agent mounts the overlay (in its own namespace)
//!     dev/                    the sandbox's /dev (bound there; counts against the quota)
//!     empty/                  the empty read-only directory masks show
//!     l0 l1 ...               relative links to the layers (the overlay's lowerdir names)
//! ```
//!
//! Where `dir` is already a btrfs with quotas on, it is used as it is. Anywhere else (this
//! kernel has no project quotas for ext4 or XFS, or the host's file system has none) the node
//! makes `<dir>.img`, a sparse file of `size_mb`, formats it as btrfs once, mounts it at `dir`
//! with a loop device and turns quotas on; the mount is kept across daemon restarts like the
//! image store's layer mounts (sandboxes outlive their daemon). Each step says in the log
//! what it found.
//!
//! Over its quota a sandbox's writes fail with `EDQUOT` ("Disk quota exceeded"); the agent
//! writes nothing there itself and keeps serving. A deleted sandbox's subvolume is deleted
//! with it; the space comes back when the file system's cleaner has dropped it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{DiskRefusal, RuntimeError, StartCause};

/// How the node keeps writable layers on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct WritableConfig {
    /// The file system's mount point (or a directory of a btrfs with quotas on).
    pub dir: PathBuf,
    /// Size of the file-backed file system made where `dir` cannot hold quotas, in MiB.
    pub size_mb: u64,
    /// The sum of all sandboxes' `disk_mb` may reach this many times the file system's size.
    pub overcommit: f64,
}

/// The default `overcommit`: every quota backed by space (128 sandboxes of the default
/// 512 MiB on the default 64 GiB file system). Most sandboxes of an RL run are idle and write
/// little: a node for thousands of them is started with small quotas (`--disk-mb`), a larger
/// file system, or a larger ratio (quotas as limits, not reservations).
pub const DEFAULT_DISK_OVERCOMMIT: f64 = 1.0;

/// The node's writable-layer file system and what is committed on it.
#[derive(Debug)]
pub struct WritableStore {
    dir: PathBuf,
    /// `/sys/fs/btrfs/<fsid>/qgroups`, where each subvolume's bytes are read.
    qgroups: PathBuf,
    total_bytes: u64,
    overcommit: f64,
    how: String,
    /// Sandbox id → (quota in bytes, subvolume id).
    committed: Mutex<HashMap<String, (u64, u64)>>,
    /// When [`WritableStore::used`] last committed the file system.
    last_commit: Mutex<Option<std::time::Instant>>,
}

/// How stale a quota group's count may be when a sandbox's disk use is read.
const COMMIT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What health and `/metrics` show of the writable-layer space.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WritableSpace {
    /// Size of the file system.
    pub total_bytes: u64,
    /// Bytes in use on it (all sandboxes, all nodes sharing it).
    pub used_bytes: u64,
    /// Sum of the quotas of this node's sandboxes on disk.
    pub committed_bytes: u64,
    /// What the quotas may add up to (`total_bytes` × overcommit).
    pub capacity_bytes: u64,
    /// Sandboxes with a writable layer on disk.
    pub sandboxes: u64,
    /// What the node uses (for logs and health).
    pub how: String,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::io(what, e)
}

impl WritableStore {
    /// Finds or makes the node's writable-layer file system (see the module docs). Several
    /// daemons sharing an image store share it: a lock file beside it keeps two from making
    /// it at once.
    pub fn open(cfg: &WritableConfig) -> Result<WritableStore, RuntimeError> {
        let dir = &cfg.dir;
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
        let lock_path = dir.with_extension("lock");
        let lock = std::fs::File::create(&lock_path)
            .map_err(io(format!("create {}", lock_path.display())))?;
        let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| RuntimeError::io("lock the writable store", e.into()))?;
        let image = dir.with_extension("img");
        let mounted_here = warren_sys::btrfs::is_btrfs(dir) && !is_parent_fs(dir)?;
        let how = if warren_sys::btrfs::is_btrfs(dir) && (mounted_here || quotas_on(dir)) {
            format!("btrfs at {} with a quota per sandbox", dir.display())
        } else {
            if !image.exists() {
                make_image(&image, cfg.size_mb)?;
            }
            mount_image(&image, dir)?;
            format!(
                "btrfs in {} ({} MiB, file-backed: the file system under {} has no quotas \
                 this kernel can use) with a quota per sandbox",
                image.display(),
                file_mb(&image),
                dir.display()
            )
        };
        let mode = warren_sys::btrfs::enable_quota(dir)?;
        let how = format!(
            "{how} ({})",
            match mode {
                warren_sys::btrfs::QuotaMode::Simple => "simple quotas",
                warren_sys::btrfs::QuotaMode::Full =>
                    "full quota groups: this kernel refuses simple quotas",
            }
        );
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
                .map_err(io(format!("chmod {}", dir.display())))?;
        }
        let fsid = warren_sys::btrfs::fsid(dir)?;
        let qgroups = PathBuf::from("/sys/fs/btrfs").join(fsid).join("qgroups");
        let st = nix::sys::statvfs::statvfs(dir)
            .map_err(|e| RuntimeError::io("statvfs the writable store", e.into()))?;
        let total_bytes = st.blocks() * st.fragment_size();
        Ok(WritableStore {
            dir: dir.clone(),
            qgroups,
            total_bytes,
            overcommit: cfg.overcommit,
            how,
            committed: Mutex::new(HashMap::new()),
            last_commit: Mutex::new(None),
        })
    }

    /// What the node uses, in a sentence.
    pub fn describe(&self) -> &str {
        &self.how
    }

    /// The directory holding `id`'s writable layer (see the module docs for its layout).
    pub fn dir_of(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    /// The most `disk_mb` the quotas may add up to, in bytes.
    fn capacity(&self) -> u64 {
        (self.total_bytes as f64 * self.overcommit) as u64
    }

    /// Whether one more sandbox of `bytes` fits now: `Ok`, or why not.
    pub fn fits(&self, bytes: u64) -> Result<(), DiskRefusal> {
        let capacity = self.capacity();
        if bytes > capacity {
            return Err(DiskRefusal::TooLarge {
                asked: bytes,
                capacity,
                overcommit: self.overcommit,
            });
        }
        let committed: u64 = self.lock().values().map(|(b, _)| b).sum();
        if committed + bytes > capacity {
            return Err(DiskRefusal::Committed {
                committed,
                capacity,
                asked: bytes,
            });
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.committed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `id`'s subvolume, limited to `bytes` and owned by `owner` (host uid and gid of
    /// the sandbox's root). Refuses when the committed quotas would pass the capacity.
    pub fn prepare(&self, id: &str, bytes: u64, owner: u32) -> Result<PathBuf, RuntimeError> {
        {
            let mut c = self.lock();
            let committed: u64 = c.values().map(|(b, _)| b).sum();
            let capacity = self.capacity();
            if committed + bytes > capacity {
                return Err(RuntimeError::NoDisk(if bytes > capacity {
                    DiskRefusal::TooLarge {
                        asked: bytes,
                        capacity,
                        overcommit: self.overcommit,
                    }
                } else {
                    DiskRefusal::Committed {
                        committed,
                        capacity,
                        asked: bytes,
                    }
                }));
            }
            c.insert(id.to_string(), (bytes, 0));
        }
        match self.make(id, bytes, owner) {
            Ok((path, subvol)) => {
                if let Some(e) = self.lock().get_mut(id) {
                    e.1 = subvol;
                }
                Ok(path)
            }
            Err(e) => {
                self.remove(id);
                Err(e)
            }
        }
    }

    fn make(&self, id: &str, bytes: u64, owner: u32) -> Result<(PathBuf, u64), RuntimeError> {
        let path = self.dir_of(id);
        if path.exists() {
            // Left by a sandbox of the same id that is gone (a crash between steps).
            warren_sys::btrfs::delete_subvolume(&self.dir, id)?;
        }
        warren_sys::btrfs::create_subvolume(&self.dir, id)?;
        warren_sys::btrfs::limit_subvolume(&path, bytes)?;
        std::os::unix::fs::chown(&path, Some(owner), Some(owner))
            .map_err(io(format!("chown {}", path.display())))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                .map_err(io(format!("chmod {}", path.display())))?;
        }
        let subvol = warren_sys::btrfs::subvolume_id(&path)?;
        Ok((path, subvol))
    }

    /// Counts a sandbox that already has its subvolume (a daemon restart re-adopting it).
    pub fn adopt(&self, id: &str, bytes: u64) -> Result<PathBuf, RuntimeError> {
        let path = self.dir_of(id);
        let subvol = warren_sys::btrfs::subvolume_id(&path)?;
        // The limit is the record's; set again in case the file system was made anew.
        warren_sys::btrfs::limit_subvolume(&path, bytes)?;
        self.lock().insert(id.to_string(), (bytes, subvol));
        Ok(path)
    }

    /// Bytes `id`'s writable layer holds (its quota group's count). btrfs updates the count
    /// when it commits a transaction, so the file system is committed first unless that was
    /// done less than [`COMMIT_EVERY`] ago: what a sandbox just wrote shows in its stats,
    /// and a burst of stats calls costs one commit.
    pub fn used(&self, id: &str) -> Option<u64> {
        let subvol = self.lock().get(id).map(|(_, s)| *s).filter(|s| *s != 0)?;
        self.commit_if_stale();
        let f = self.qgroups.join(format!("0_{subvol}")).join("referenced");
        std::fs::read_to_string(f).ok()?.trim().parse().ok()
    }

    fn commit_if_stale(&self) {
        let mut last = self.last_commit.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < COMMIT_EVERY) {
            return;
        }
        if let Err(e) = warren_sys::btrfs::commit(&self.dir) {
            tracing::debug!(error = %e, "cannot commit the writable-layer file system");
        }
        *last = Some(std::time::Instant::now());
    }

    /// Deletes `id`'s subvolume (if any) and its commitment. Idempotent.
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
        if !self.dir_of(id).exists() {
            return;
        }
        // The overlay that used it goes with the sandbox's mount namespace, which the kernel
        // may still be tearing down just after the last process died: try a few times.
        for attempt in 0..20 {
            match warren_sys::btrfs::delete_subvolume(&self.dir, id) {
                Ok(()) => return,
                Err(e) if attempt < 19 && e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(25))
                }
                Err(e) => {
                    tracing::warn!(sandbox = id, error = %e, "cannot delete a writable layer");
                    return;
                }
            }
        }
    }

    /// Deletes the subvolumes of this node's sandboxes (names starting with `prefix`) that
    /// are not in `known`; returns what it removed.
    pub fn reconcile(&self, prefix: &str, known: &[&str]) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) && !known.contains(&name.as_str()) {
                self.remove(&name);
                removed.push(format!("writable layer {name}"));
            }
        }
        removed
    }

    /// The space now.
    pub fn space(&self) -> WritableSpace {
        let c = self.lock();
        let used_bytes = nix::sys::statvfs::statvfs(&self.dir)
            .map(|s| (s.blocks() - s.blocks_free()) * s.fragment_size())
            .unwrap_or(0);
        WritableSpace {
            total_bytes: self.total_bytes,
            used_bytes,
            committed_bytes: c.values().map(|(b, _)| b).sum(),
            capacity_bytes: self.capacity(),
            sandboxes: c.len() as u64,
            how: self.how.clone(),
        }
    }
}

/// True when `dir` is on the same file system as its parent (not a mount point).
fn is_parent_fs(dir: &Path) -> Result<bool, RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let a = std::fs::metadata(dir).map_err(io(format!("stat {}", dir.display())))?;
    let b = std::fs::metadata(parent).map_err(io(format!("stat {}", parent.display())))?;
    Ok(a.dev() == b.dev())
}

/// Whether the btrfs holding `dir` has quotas on already.
fn quotas_on(dir: &Path) -> bool {
    warren_sys::btrfs::fsid(dir)
        .map(|id| Path::new("/sys/fs/btrfs").join(id).join("qgroups").is_dir())
        .unwrap_or(false)
}

fn file_mb(f: &Path) -> u64 {
    std::fs::metadata(f).map(|m| m.len() >> 20).unwrap_or(0)
}

fn run(cmd: &mut std::process::Command, what: &str) -> Result<(), RuntimeError> {
    let out = warren_sys::children::output(cmd).map_err(|e| StartCause::ToolMissing {
        what: what.to_string(),
        package: "btrfs-progs",
        purpose: "writable layers on disk",
        source: e,
    })?;
    if !out.status.success() {
        return Err(StartCause::Tool {
            what: what.to_string(),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(())
}

/// Makes the sparse file `image` of `size_mb` and formats it as btrfs.
fn make_image(image: &Path, size_mb: u64) -> Result<(), RuntimeError> {
    let tmp = image.with_extension("img.new");
    let f = std::fs::File::create(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    f.set_len(size_mb << 20)
        .map_err(io(format!("size {}", tmp.display())))?;
    drop(f);
    if let Err(e) = run(
        std::process::Command::new("mkfs.btrfs")
            .arg("-q")
            .arg("-f")
            .arg(&tmp),
        "mkfs.btrfs",
    ) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, image).map_err(io(format!("rename {}", image.display())))
}

/// Mounts `image` at `dir` through a loop device that goes away with the mount.
fn mount_image(image: &Path, dir: &Path) -> Result<(), RuntimeError> {
    run(
        std::process::Command::new("mount")
            .args(["-t", "btrfs", "-o", "loop,noatime"])
            .arg(image)
            .arg(dir),
        &format!("mount {} at {}", image.display(), dir.display()),
    )?;
    if !warren_sys::btrfs::is_btrfs(dir) {
        return Err(StartCause::Mount {
            what: format!(
                "{} is not a btrfs after mounting {}",
                dir.display(),
                image.display()
            ),
        }
        .into());
    }
    // Direct I/O from the loop device to the file: its pages are cached once (by the btrfs
    // above), not a second time as the image file's.
    if let Err(e) = direct_io(image) {
        tracing::info!(error = %e, "the writable-layer loop device keeps buffered I/O");
    }
    Ok(())
}

/// Turns direct I/O on for the loop device backing `image`.
fn direct_io(image: &Path) -> Result<(), RuntimeError> {
    let out =
        warren_sys::children::output(std::process::Command::new("losetup").arg("-j").arg(image))
            .map_err(|e| RuntimeError::io("losetup -j", e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let dev = text
        .lines()
        .next()
        .and_then(|l| l.split(':').next())
        .filter(|d| d.starts_with("/dev/loop"))
        .ok_or_else(|| {
            RuntimeError::from(StartCause::Mount {
                what: format!("no loop device for {}", image.display()),
            })
        })?;
    run(
        std::process::Command::new("losetup").args(["--direct-io=on", dev]),
        "losetup --direct-io=on",
    )
}
