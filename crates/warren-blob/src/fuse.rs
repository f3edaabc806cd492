//! The lazy-layer FUSE file system: one read-only regular file per prepared layer, named by
//! its hex digest, whose reads are answered by the [`LayerCache`] (fetching missing chunks).
//! The kernel's EROFS mounts such a file directly (file-backed mount), so a sandbox reads
//! through EROFS → FUSE → cache, and only the chunks it touches are ever fetched.

use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, MountOption, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use crate::{BlobError, LayerCache};

const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;
const EIO: i32 = 5;
const ENOENT: i32 = 2;
const ENOTDIR: i32 = 20;

struct LazyFs {
    cache: Arc<LayerCache>,
    rt: tokio::runtime::Handle,
    inos: HashMap<String, u64>,
    names: Vec<String>,
}

fn attr(ino: u64, size: u64, dir: bool) -> FileAttr {
    FileAttr {
        ino,
        size,
        blocks: size.div_ceil(512),
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o555 } else { 0o444 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl LazyFs {
    fn ino_of(&mut self, hex: &str) -> u64 {
        if let Some(i) = self.inos.get(hex) {
            return *i;
        }
        self.names.push(hex.to_string());
        let i = self.names.len() as u64 + ROOT;
        self.inos.insert(hex.to_string(), i);
        i
    }

    fn name_of(&self, ino: u64) -> Option<&str> {
        ino.checked_sub(ROOT + 1)
            .and_then(|i| self.names.get(i as usize))
            .map(String::as_str)
    }
}

impl Filesystem for LazyFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), i32> {
        let _ = config.set_max_readahead(128 << 10);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let name = name.to_string_lossy();
        if parent != ROOT {
            return reply.error(ENOENT);
        }
        match self.cache.size(&name) {
            Some(size) => {
                let ino = self.ino_of(&name);
                reply.entry(&TTL, &attr(ino, size, false), 0)
            }
            None => reply.error(ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == ROOT {
            return reply.attr(&TTL, &attr(ROOT, 0, true));
        }
        match self.name_of(ino).and_then(|n| self.cache.size(n)) {
            Some(size) => reply.attr(&TTL, &attr(ino, size, false)),
            None => reply.error(ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if self.name_of(ino).is_none() {
            return reply.error(ENOENT);
        }
        // Verified data never changes: let the kernel keep its page cache across opens.
        reply.opened(0, fuser::consts::FOPEN_KEEP_CACHE)
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        let Some(name) = self.name_of(ino).map(str::to_string) else {
            return reply.error(ENOENT);
        };
        let cache = self.cache.clone();
        // Answered from a blocking thread so reads of different chunks proceed in parallel.
        self.rt.spawn_blocking(move || {
            match cache.read(&name, offset.max(0) as u64, size) {
                Ok(data) => reply.data(&data),
                Err(e) => {
                    tracing::error!(layer = %name, offset, size, error = %e, "lazy layer read failed");
                    reply.error(EIO)
                }
            }
        });
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(ENOTDIR);
        }
        let mut layers = self.cache.layers();
        layers.sort();
        let mut entries = vec![
            (ROOT, FileType::Directory, ".".to_string()),
            (ROOT, FileType::Directory, "..".to_string()),
        ];
        for l in layers {
            let i = self.ino_of(&l);
            entries.push((i, FileType::RegularFile, l));
        }
        for (k, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (k + 1) as i64, kind, name) {
                break;
            }
        }
        reply.ok()
    }
}

/// A mounted lazy-layer file system; unmounted when dropped.
pub struct LazyMount {
    _session: fuser::BackgroundSession,
    dir: std::path::PathBuf,
}

impl std::fmt::Debug for LazyMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyMount").field("dir", &self.dir).finish()
    }
}

impl LazyMount {
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Mounts the lazy-layer file system of `cache` at `dir` (created if needed).
pub fn mount(
    cache: Arc<LayerCache>,
    dir: &Path,
    rt: tokio::runtime::Handle,
) -> Result<LazyMount, BlobError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BlobError::io(format!("create {}", dir.display()), e))?;
    // A mount left by a daemon that died would make the directory unusable (ENOTCONN).
    let _ = warren_sys::children::output(std::process::Command::new("umount").arg("-l").arg(dir));
    let fs = LazyFs {
        cache,
        rt,
        inos: HashMap::new(),
        names: Vec::new(),
    };
    let opts = [
        MountOption::RO,
        MountOption::FSName("warren-layers".into()),
        MountOption::Subtype("warren-layers".into()),
        MountOption::AllowOther,
        MountOption::NoExec,
        MountOption::NoSuid,
        MountOption::NoDev,
    ];
    let session = fuser::spawn_mount2(fs, dir, &opts).map_err(|e| {
        BlobError::io(
            format!("mount the lazy layer file system at {}", dir.display()),
            e,
        )
    })?;
    Ok(LazyMount {
        _session: session,
        dir: dir.to_path_buf(),
    })
}
