//! File calls. The agent's root is the sandbox's root, so no path can leave the sandbox; on
//! top of that, kernel filesystems (/proc, /sys) are refused and only regular files are read
//! or written, so a symlink planted by the sandbox cannot aim the agent at its own memory,
//! its control socket or a FIFO that would block it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use warren_proto::{Event, Frame, Kind};
use warren_types::{ErrorCode, FileKind, FileStat};

use crate::wire::{Inbox, Out};

const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;
const CHUNK: usize = 256 * 1024;

fn io_event(path: &str, e: &std::io::Error) -> Event {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => ErrorCode::NotFound,
        _ => ErrorCode::FileError,
    };
    // A full writable layer says which limit it hit: the quota (EDQUOT, a layer on disk) and
    // a full file system (ENOSPC, a layer in memory) both mean the sandbox's disk_mb.
    if matches!(e.raw_os_error(), Some(libc::EDQUOT | libc::ENOSPC)) {
        return Event::error(
            code,
            format!("{path}: no space left in the sandbox's writable layer (its disk_mb): {e}"),
        );
    }
    Event::error(code, format!("{path}: {e}"))
}

pub(crate) fn check_kernel_fs(path: &str, f: &File) -> Result<(), Event> {
    let st = nix::sys::statfs::fstatfs(f.as_fd())
        .map_err(|e| Event::error(ErrorCode::FileError, format!("{path}: {e}")))?;
    let t = st.filesystem_type().0 as i64;
    if t == PROC_SUPER_MAGIC || t == SYSFS_MAGIC {
        return Err(Event::error(
            ErrorCode::InvalidPath,
            format!("{path}: the file API does not touch /proc or /sys; use exec"),
        ));
    }
    Ok(())
}

/// True when `path` is on /proc or /sys (a walk does not descend there).
pub(crate) fn is_kernel_fs(path: &std::path::Path) -> bool {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .is_ok_and(|f| check_kernel_fs("", &f).is_err())
}

fn open_regular(path: &str, opts: &mut OpenOptions) -> Result<File, Event> {
    let f = opts
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| io_event(path, &e))?;
    check_kernel_fs(path, &f)?;
    let md = f.metadata().map_err(|e| io_event(path, &e))?;
    if !md.is_file() {
        return Err(Event::error(
            ErrorCode::FileError,
            format!("{path}: not a regular file"),
        ));
    }
    // Regular files ignore O_NONBLOCK; it only guarded the open against FIFOs.
    Ok(f)
}

pub async fn read(path: &str, window: u32, id: u32, mut inbox: Inbox, out: &Out) -> Event {
    let mut f = match open_regular(path, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(ev) => return ev,
    };
    let mut credit = u64::from(window);
    let mut buf = vec![0u8; CHUNK];
    loop {
        while credit == 0 {
            match inbox.recv().await {
                Some(fr) if fr.kind == Kind::Credit => {
                    credit += u64::from(fr.credit_value().unwrap_or(0))
                }
                Some(fr) if fr.kind == Kind::Cancel => {
                    return Event::error(ErrorCode::Internal, "cancelled")
                }
                Some(_) => {}
                None => return Event::Done,
            }
        }
        let want = (credit as usize).min(CHUNK);
        let n = match f.read(&mut buf[..want]) {
            Ok(0) => return Event::Done,
            Ok(n) => n,
            Err(e) => return io_event(path, &e),
        };
        credit -= n as u64;
        if out
            .send(Frame::new(id, Kind::Stdout, buf[..n].to_vec()))
            .await
            .is_err()
        {
            return Event::Done;
        }
        while let Ok(fr) = inbox.try_recv() {
            if fr.kind == Kind::Credit {
                credit += u64::from(fr.credit_value().unwrap_or(0));
            }
        }
    }
}

/// Where an upload lands: `path`, or the file its symlink names (resolved inside the
/// sandbox), with the metadata of the file it replaces.
fn upload_target(path: &str) -> Result<(PathBuf, Option<std::fs::Metadata>), Event> {
    let target = match std::fs::symlink_metadata(path) {
        Ok(md) if md.file_type().is_symlink() => {
            follow_links(Path::new(path)).map_err(|e| io_event(path, &e))?
        }
        Ok(_) => PathBuf::from(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PathBuf::from(path),
        Err(e) => return Err(io_event(path, &e)),
    };
    let existing = match std::fs::symlink_metadata(&target) {
        Ok(md) if md.is_file() => Some(md),
        Ok(_) => {
            return Err(Event::error(
                ErrorCode::FileError,
                format!("{path}: not a regular file"),
            ))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_event(path, &e)),
    };
    Ok((target, existing))
}

/// Where writing through the symlink `path` lands: links followed (inside the sandbox, where
/// the agent's `/` is the sandbox's), a dangling last link naming a file to create in a
/// directory that exists.
fn follow_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(md) if md.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(_) => return std::fs::canonicalize(&p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = p.parent().unwrap_or(Path::new("/"));
                let name = p
                    .file_name()
                    .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EISDIR))?;
                return Ok(std::fs::canonicalize(dir)?.join(name));
            }
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
}

/// Removes a partly written upload when dropped (unless it was renamed into place).
/// An upload's file while it is written: a name in the directory held open, removed through
/// that directory (not by path) unless it was renamed into place, so nothing is left behind
/// even when the sandbox moves or replaces the directory meanwhile.
struct TempFile {
    dir: File,
    name: Option<std::ffi::OsString>,
}

impl TempFile {
    /// Renames the file over `target` (a name in the same directory).
    fn commit(mut self, target: &std::ffi::OsStr) -> std::io::Result<()> {
        let Some(name) = self.name.take() else {
            return Err(std::io::Error::other("upload lost its file"));
        };
        let dir = Some(self.dir.as_raw_fd());
        nix::fcntl::renameat(dir, name.as_os_str(), dir, target).map_err(|e| {
            let _ = nix::unistd::unlinkat(
                dir,
                name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            std::io::Error::from_raw_os_error(e as i32)
        })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            let _ = nix::unistd::unlinkat(
                Some(self.dir.as_raw_fd()),
                n.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// Writes an upload to a new file beside its target and renames it into place at the end:
/// a failed, cancelled or cut-off upload leaves no partial file. A known `size` is checked
/// against the free space before anything is written, and against what arrived.
pub async fn write(path: &str, mode: Option<u32>, size: Option<u64>, mut inbox: Inbox) -> Event {
    let (target, existing) = match upload_target(path) {
        Ok(t) => t,
        Err(ev) => return ev,
    };
    let dir = target.parent().unwrap_or(Path::new("/")).to_path_buf();
    // Missing parent directories are made (as `mkdir -p`, root-owned, mode 0755), as other
    // sandboxes' file APIs do; a parent that is a file still fails.
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return io_event(path, &e);
    }
    let dir_fd = match File::open(&dir) {
        Ok(f) => f,
        Err(e) => return io_event(path, &e),
    };
    if let Err(ev) = check_kernel_fs(path, &dir_fd) {
        return ev;
    }
    if let Some(n) = size {
        if let Ok(st) = nix::sys::statvfs::fstatvfs(dir_fd.as_fd()) {
            let free = st.blocks_available() * st.fragment_size();
            if n > free {
                return Event::error(
                    ErrorCode::FileError,
                    format!("{path}: no space left: the upload is {n} bytes, {free} are free"),
                );
            }
        }
    }
    static UPLOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp_name: String = format!(
        ".{}.upload-{}-{}",
        name,
        std::process::id(),
        UPLOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
    .chars()
    .take(200)
    .collect();
    let tmp_name = std::ffi::OsString::from(tmp_name);
    // Made and later renamed or removed through the directory's fd: the sandbox may rename
    // the directory or swap its path meanwhile, and the file still goes (see `TempFile`).
    let mut f = match warren_sys::fd::create_at(&dir_fd, &tmp_name, 0o600) {
        Ok(fd) => File::from(fd),
        Err(e) => return io_event(path, &e.source),
    };
    let tmp = match dir_fd.try_clone() {
        Ok(dir) => TempFile {
            dir,
            name: Some(tmp_name),
        },
        Err(e) => {
            let _ = nix::unistd::unlinkat(
                Some(dir_fd.as_raw_fd()),
                tmp_name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
            return io_event(path, &e);
        }
    };
    let final_mode = mode
        .or_else(|| existing.as_ref().map(|m| m.mode()))
        .unwrap_or(0o644)
        & 0o7777;
    if let Some(md) = &existing {
        let _ = std::os::unix::fs::fchown(&f, Some(md.uid()), Some(md.gid()));
    }
    if let Err(e) = f.set_permissions(std::fs::Permissions::from_mode(final_mode)) {
        return io_event(path, &e);
    }
    let mut written = 0u64;
    loop {
        match inbox.recv().await {
            Some(fr) => match fr.kind {
                Kind::Stdin => {
                    written += fr.payload.len() as u64;
                    let over = size.filter(|n| written > *n);
                    let res = match over {
                        Some(n) => Err(Event::error(
                            ErrorCode::InvalidRequest,
                            format!("{path}: the upload announced {n} bytes and sent more"),
                        )),
                        None => f.write_all(&fr.payload).map_err(|e| io_event(path, &e)),
                    };
                    if let Err(ev) = res {
                        // Keep reading so the daemon's upload is not stuck on a full inbox.
                        while let Some(fr) = inbox.recv().await {
                            if fr.kind != Kind::Stdin {
                                break;
                            }
                        }
                        return ev;
                    }
                }
                Kind::Eof => break,
                Kind::Cancel => return Event::error(ErrorCode::Internal, "upload cancelled"),
                _ => {}
            },
            // The daemon went away mid-upload: nothing is kept.
            None => return Event::error(ErrorCode::Internal, "upload cut off"),
        }
    }
    if let Some(n) = size.filter(|n| *n != written) {
        return Event::error(
            ErrorCode::InvalidRequest,
            format!("{path}: the upload announced {n} bytes and sent {written}"),
        );
    }
    drop(f);
    let target_name = target.file_name().unwrap_or_default();
    if let Err(e) = tmp.commit(target_name) {
        return io_event(path, &e);
    }
    Event::Done
}

fn stat_of(name: String, p: &Path) -> std::io::Result<FileStat> {
    let md = std::fs::symlink_metadata(p)?;
    let ft = md.file_type();
    let kind = if ft.is_file() {
        FileKind::File
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_symlink() {
        FileKind::Symlink
    } else {
        FileKind::Other
    };
    let link_target = if ft.is_symlink() {
        std::fs::read_link(p)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Ok(FileStat {
        name,
        kind,
        size: md.len(),
        mode: md.mode() & 0o7777,
        uid: md.uid(),
        gid: md.gid(),
        mtime_ms: md.mtime() * 1000 + md.mtime_nsec() / 1_000_000,
        link_target,
    })
}

pub fn stat(path: &str) -> Event {
    match stat_of(path.to_string(), Path::new(path)) {
        Ok(stat) => Event::Stat { stat },
        Err(e) => io_event(path, &e),
    }
}

/// Bytes of `s` as a JSON string body (control characters take 6, quote and backslash 2).
fn json_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

/// One page of a directory: the `limit` smallest names after `after`. Memory and answer size
/// stay bounded by the page however large the directory (the sandbox decides how many files
/// it holds).
pub fn list(path: &str, after: Option<&str>, limit: Option<u32>) -> Event {
    use warren_types::files::{DEFAULT_LIST_ENTRIES, MAX_LIST_BYTES, MAX_LIST_ENTRIES};
    let rd = match std::fs::read_dir(path) {
        Ok(r) => r,
        Err(e) => return io_event(path, &e),
    };
    let limit = limit
        .map(|l| l as usize)
        .unwrap_or(DEFAULT_LIST_ENTRIES)
        .clamp(1, MAX_LIST_ENTRIES);
    let mut page = std::collections::BTreeSet::new();
    let mut more = false;
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if after.is_some_and(|a| name.as_str() <= a) {
            continue;
        }
        page.insert(name);
        if page.len() > limit {
            page.pop_last();
            more = true;
        }
    }
    let dir = Path::new(path);
    let mut entries = Vec::with_capacity(page.len());
    let mut bytes = 0usize;
    let mut next = None;
    for name in page {
        if bytes >= MAX_LIST_BYTES {
            more = true;
            break;
        }
        if let Ok(s) = stat_of(name.clone(), &dir.join(&name)) {
            // Its JSON: the strings as escaped plus the fixed fields.
            bytes += json_len(&s.name) + s.link_target.as_deref().map_or(0, json_len) + 160;
            entries.push(s);
        }
        next = Some(name);
    }
    if !more {
        next = None;
    }
    Event::Entries { entries, next }
}

pub fn mkdir(path: &str, parents: bool, mode: Option<u32>) -> Event {
    let r = if parents {
        std::fs::create_dir_all(path)
    } else {
        std::fs::create_dir(path)
    };
    if let Err(e) = r {
        return io_event(path, &e);
    }
    if let Some(m) = mode {
        if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(m & 0o7777))
        {
            return io_event(path, &e);
        }
    }
    Event::Done
}

pub fn remove(path: &str, recursive: bool) -> Event {
    if path == "/" {
        return Event::error(ErrorCode::InvalidPath, "refusing to remove /");
    }
    let md = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return io_event(path, &e),
    };
    let r = if md.is_dir() {
        if recursive {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_dir(path)
        }
    } else {
        std::fs::remove_file(path)
    };
    match r {
        Ok(()) => Event::Done,
        Err(e) => io_event(path, &e),
    }
}

pub fn chmod(path: &str, mode: u32) -> Event {
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777)) {
        Ok(()) => Event::Done,
        Err(e) => io_event(path, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    fn code_of(ev: &Event) -> Option<ErrorCode> {
        match ev {
            Event::Error { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// Runs an upload of `frames` to `path` on a current-thread runtime.
    fn upload(path: &Path, mode: Option<u32>, size: Option<u64>, frames: Vec<Frame>) -> Event {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, rx) = mpsc::channel(frames.len() + 1);
            for f in frames {
                tx.send(f).await.unwrap();
            }
            drop(tx);
            write(s(path), mode, size, rx).await
        })
    }

    fn data(b: &[u8]) -> Frame {
        Frame::new(1, Kind::Stdin, b.to_vec())
    }

    fn eof() -> Frame {
        Frame::new(1, Kind::Eof, Vec::new())
    }

    /// Names in `dir`, so a test can see that nothing was left behind.
    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn an_upload_lands_whole_with_its_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        let ev = upload(
            &p,
            Some(0o751),
            Some(6),
            vec![data(b"abc"), data(b"def"), eof()],
        );
        assert!(matches!(ev, Event::Done), "{ev:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o751);
        // Replacing a file keeps its mode when none is given.
        let ev = upload(&p, None, None, vec![data(b"x"), eof()]);
        assert!(matches!(ev, Event::Done), "{ev:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o751);
        assert_eq!(names(d.path()), ["f"]);
    }

    #[test]
    fn an_upload_through_a_symlink_replaces_the_file_it_names() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let target = d.path().join("sub/real");
        std::fs::write(&target, b"old").unwrap();
        // A relative link with `..` in it, resolved where it lies.
        let link = d.path().join("sub/../link");
        std::os::unix::fs::symlink("sub/real", d.path().join("link")).unwrap();
        let ev = upload(&link, None, None, vec![data(b"new"), eof()]);
        assert!(matches!(ev, Event::Done), "{ev:?}");
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let md = std::fs::symlink_metadata(d.path().join("link")).unwrap();
        assert!(md.file_type().is_symlink(), "the link itself stays a link");
    }

    #[test]
    fn an_upload_onto_a_directory_a_fifo_or_a_link_to_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::create_dir(d.path().join("dir")).unwrap();
        std::os::unix::fs::symlink("fifo", d.path().join("to-fifo")).unwrap();
        for name in ["fifo", "dir", "to-fifo"] {
            let ev = upload(&d.path().join(name), None, None, vec![data(b"x"), eof()]);
            assert_eq!(code_of(&ev), Some(ErrorCode::FileError), "{name}: {ev:?}");
        }
        assert_eq!(names(d.path()), ["dir", "fifo", "to-fifo"]);
    }

    #[test]
    fn a_cut_short_or_mis_sized_upload_leaves_nothing_behind() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"keep").unwrap();
        // The daemon went away before EOF.
        let ev = upload(&p, None, None, vec![data(b"partial")]);
        assert_eq!(code_of(&ev), Some(ErrorCode::Internal), "{ev:?}");
        // Fewer bytes than announced.
        let ev = upload(&p, None, Some(10), vec![data(b"abc"), eof()]);
        assert_eq!(code_of(&ev), Some(ErrorCode::InvalidRequest), "{ev:?}");
        // More bytes than announced: the same refusal as fewer.
        let ev = upload(&p, None, Some(2), vec![data(b"abc"), eof()]);
        assert_eq!(code_of(&ev), Some(ErrorCode::InvalidRequest), "{ev:?}");
        // Cancelled.
        let cancel = Frame::new(1, Kind::Cancel, Vec::new());
        let ev = upload(&p, None, None, vec![data(b"abc"), cancel]);
        assert_eq!(code_of(&ev), Some(ErrorCode::Internal), "{ev:?}");
        assert_eq!(std::fs::read(&p).unwrap(), b"keep");
        assert_eq!(names(d.path()), ["f"], "no temporary file is left");
        // Into directories that do not exist: they are made.
        let ev = upload(
            &d.path().join("no/such/f"),
            None,
            None,
            vec![data(b"x"), eof()],
        );
        assert!(matches!(ev, Event::Done), "{ev:?}");
        assert_eq!(std::fs::read(d.path().join("no/such/f")).unwrap(), b"x");
        // Under a regular file: a file error, and nothing made.
        let ev = upload(&p.join("x/f"), None, None, vec![eof()]);
        assert_eq!(code_of(&ev), Some(ErrorCode::FileError), "{ev:?}");
    }

    #[test]
    fn only_regular_files_outside_kernel_filesystems_are_opened() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // A FIFO would block a plain open: this one returns at once, refused.
        let e = open_regular(s(&fifo), OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(code_of(&e), Some(ErrorCode::FileError));
        let e = open_regular(s(d.path()), OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(code_of(&e), Some(ErrorCode::FileError));
        let e = open_regular("/proc/self/status", OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(code_of(&e), Some(ErrorCode::InvalidPath));
        let e = open_regular(s(&d.path().join("none")), OpenOptions::new().read(true));
        assert_eq!(code_of(&e.unwrap_err()), Some(ErrorCode::NotFound));
        // A link from the sandbox's files into /proc is refused too.
        let link = d.path().join("mem");
        std::os::unix::fs::symlink("/proc/self/environ", &link).unwrap();
        let e = open_regular(s(&link), OpenOptions::new().read(true)).unwrap_err();
        assert_eq!(code_of(&e), Some(ErrorCode::InvalidPath));
        assert!(is_kernel_fs(Path::new("/proc")));
        assert!(!is_kernel_fs(d.path()));
        std::fs::write(d.path().join("f"), b"x").unwrap();
        assert!(open_regular(s(&d.path().join("f")), OpenOptions::new().read(true)).is_ok());
    }

    #[test]
    fn remove_refuses_the_root_and_removes_links_not_their_targets() {
        assert_eq!(code_of(&remove("/", true)), Some(ErrorCode::InvalidPath));
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("dir");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("f"), b"x").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(remove(s(&link), true), Event::Done));
        assert!(target.join("f").exists(), "the link's target is untouched");
        let ev = remove(s(&target), false);
        assert_eq!(
            code_of(&ev),
            Some(ErrorCode::FileError),
            "not empty: {ev:?}"
        );
        assert!(matches!(remove(s(&target), true), Event::Done));
        assert_eq!(
            code_of(&remove(s(&target), true)),
            Some(ErrorCode::NotFound)
        );
    }

    #[test]
    fn a_listing_comes_in_sorted_pages() {
        let d = tempfile::tempdir().unwrap();
        for n in ["c", "a", "e", "b", "d"] {
            std::fs::write(d.path().join(n), n).unwrap();
        }
        std::os::unix::fs::symlink("a", d.path().join("l")).unwrap();
        let page = |after: Option<&str>| match list(s(d.path()), after, Some(2)) {
            Event::Entries { entries, next } => (
                entries.into_iter().map(|e| e.name).collect::<Vec<_>>(),
                next,
            ),
            other => panic!("{other:?}"),
        };
        assert_eq!(page(None), (vec!["a".into(), "b".into()], Some("b".into())));
        assert_eq!(
            page(Some("b")),
            (vec!["c".into(), "d".into()], Some("d".into()))
        );
        assert_eq!(page(Some("d")), (vec!["e".into(), "l".into()], None));
        let Event::Stat { stat } = stat(s(&d.path().join("l"))) else {
            panic!("no stat")
        };
        assert_eq!(
            (stat.kind, stat.link_target.as_deref()),
            (FileKind::Symlink, Some("a"))
        );
        assert_eq!(json_len("a\"\\\n"), 1 + 2 + 2 + 6);
    }
}
