//! File calls. The agent's root is the sandbox's root, so no path can leave the sandbox; on
//! top of that, kernel filesystems (/proc, /sys) are refused and only regular files are read
//! or written, so a symlink planted by the sandbox cannot aim the agent at its own memory,
//! its control socket or a FIFO that would block it.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
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
    Event::error(code, format!("{path}: {e}"))
}

fn check_kernel_fs(path: &str, f: &File) -> Result<(), Event> {
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

pub async fn write(path: &str, mode: Option<u32>, mut inbox: Inbox) -> Event {
    let mut f = match open_regular(
        path,
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode.unwrap_or(0o644)),
    ) {
        Ok(f) => f,
        Err(ev) => return ev,
    };
    if let Some(m) = mode {
        let _ = f.set_permissions(std::fs::Permissions::from_mode(m & 0o7777));
    }
    loop {
        match inbox.recv().await {
            Some(fr) => match fr.kind {
                Kind::Stdin => {
                    if let Err(e) = f.write_all(&fr.payload) {
                        // Keep reading so the daemon's upload is not stuck on a full inbox.
                        while let Some(fr) = inbox.recv().await {
                            if fr.kind != Kind::Stdin {
                                break;
                            }
                        }
                        return io_event(path, &e);
                    }
                }
                Kind::Eof => return Event::Done,
                Kind::Cancel => return Event::error(ErrorCode::Internal, "upload cancelled"),
                _ => {}
            },
            None => return Event::Done,
        }
    }
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

pub fn list(path: &str) -> Event {
    let rd = match std::fs::read_dir(path) {
        Ok(r) => r,
        Err(e) => return io_event(path, &e),
    };
    let mut entries = Vec::new();
    for ent in rd.flatten() {
        if entries.len() >= warren_types::files::MAX_LIST_ENTRIES {
            break;
        }
        if let Ok(s) = stat_of(ent.file_name().to_string_lossy().into_owned(), &ent.path()) {
            entries.push(s);
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Event::Entries { entries }
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
