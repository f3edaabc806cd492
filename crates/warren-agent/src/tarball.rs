//! Directory copies as tar streams: `ReadTar` packs a file or a directory tree (regular files,
//! directories and symlinks, with modes and mtimes; other kinds are skipped) into a ustar/GNU
//! stream sent as credit-limited STDOUT frames; `WriteTar` unpacks the STDIN frames of such a
//! stream under a directory as they arrive.
//!
//! Unpacking never writes outside its destination: an entry naming `..` or an absolute path
//! is refused, no entry is written through a symlink (one in the archive or one already
//! there), and a hard link may only point at a path inside the destination. The agent's root
//! is the sandbox's root, so even a bypass could not reach the host; these checks keep an
//! archive from landing somewhere in the sandbox its sender did not name. Files are owned by
//! the agent's user (root in the sandbox), like `docker cp`; the size is bounded by the
//! sandbox's own disk.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use warren_proto::{Event, Frame, Kind};
use warren_types::ErrorCode;

use crate::wire::{Inbox, Out};

const BLOCK: usize = 512;
const CHUNK: usize = 256 * 1024;

fn io_event(path: &Path, e: &std::io::Error) -> Event {
    let code = match e.kind() {
        std::io::ErrorKind::NotFound => ErrorCode::NotFound,
        _ => ErrorCode::FileError,
    };
    Event::error(code, format!("{}: {e}", path.display()))
}

fn bad_entry(name: &str, why: &str) -> Event {
    Event::error(ErrorCode::InvalidPath, format!("tar entry {name:?}: {why}"))
}

/// Sends bytes as STDOUT frames, never more than the daemon's credit allows.
struct Sender<'a> {
    id: u32,
    credit: u64,
    inbox: Inbox,
    out: &'a Out,
}

/// Why sending stopped.
enum Stop {
    Cancelled,
    Gone,
}

impl Sender<'_> {
    async fn send(&mut self, mut data: &[u8]) -> Result<(), Stop> {
        while !data.is_empty() {
            while let Ok(fr) = self.inbox.try_recv() {
                self.take(&fr)?;
            }
            while self.credit == 0 {
                match self.inbox.recv().await {
                    Some(fr) => self.take(&fr)?,
                    None => return Err(Stop::Gone),
                }
            }
            let n = (self.credit as usize).min(data.len()).min(CHUNK);
            self.out
                .send(Frame::new(self.id, Kind::Stdout, data[..n].to_vec()))
                .await
                .map_err(|_| Stop::Gone)?;
            self.credit -= n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    fn take(&mut self, fr: &Frame) -> Result<(), Stop> {
        match fr.kind {
            Kind::Credit => self.credit += u64::from(fr.credit_value().unwrap_or(0)),
            Kind::Cancel => return Err(Stop::Cancelled),
            _ => {}
        }
        Ok(())
    }
}

/// Header blocks for one entry: a GNU long-name (and long-link) entry first when a name does
/// not fit the 100 bytes of the ustar field.
fn header_blocks(
    name: &str,
    md: &std::fs::Metadata,
    kind: tar::EntryType,
    size: u64,
    link: Option<&[u8]>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(BLOCK * 2);
    let long = |out: &mut Vec<u8>, kind: tar::EntryType, value: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(value.len() as u64 + 1);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_mode(0o644);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(value);
        out.push(0);
        out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    };
    if name.len() > 100 {
        long(&mut out, tar::EntryType::GNULongName, name.as_bytes());
    }
    if let Some(l) = link.filter(|l| l.len() > 100) {
        long(&mut out, tar::EntryType::GNULongLink, l);
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(md.mode() & 0o7777);
    h.set_uid(u64::from(md.uid()));
    h.set_gid(u64::from(md.gid()));
    h.set_mtime(md.mtime().max(0) as u64);
    let n = name.len().min(100);
    h.as_old_mut().name[..n].copy_from_slice(&name.as_bytes()[..n]);
    if let Some(l) = link {
        let n = l.len().min(100);
        h.as_old_mut().linkname[..n].copy_from_slice(&l[..n]);
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out
}

/// `ReadTar`: packs `path` (a directory's contents, or one file under its own name).
pub async fn read(path: &str, window: u32, id: u32, inbox: Inbox, out: &Out) -> Event {
    let root = PathBuf::from(path);
    let md = match std::fs::symlink_metadata(&root) {
        Ok(m) => m,
        Err(e) => return io_event(&root, &e),
    };
    if let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&root)
    {
        if let Err(ev) = crate::files::check_kernel_fs(path, &f) {
            return ev;
        }
    }
    let mut tx = Sender {
        id,
        credit: u64::from(window),
        inbox,
        out,
    };
    // (path on disk, name in the archive); names of a directory's entries are relative to it.
    let mut todo: Vec<(PathBuf, String)> = if md.is_dir() {
        children(&root, "")
    } else {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "file".into());
        vec![(root.clone(), name)]
    };
    todo.reverse();
    let mut buf = vec![0u8; CHUNK];
    while let Some((p, name)) = todo.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue; // gone meanwhile
        };
        let ft = md.file_type();
        let sent = if ft.is_dir() && crate::files::is_kernel_fs(&p) {
            // /proc and /sys (mounted inside the tree) are not files: not copied.
            Ok(())
        } else if ft.is_dir() {
            let mut kids = children(&p, &name);
            kids.reverse();
            todo.extend(kids);
            tx.send(&header_blocks(
                &format!("{name}/"),
                &md,
                tar::EntryType::Directory,
                0,
                None,
            ))
            .await
        } else if ft.is_symlink() {
            let Ok(target) = std::fs::read_link(&p) else {
                continue;
            };
            let target = target.as_os_str().as_encoded_bytes().to_vec();
            tx.send(&header_blocks(
                &name,
                &md,
                tar::EntryType::Symlink,
                0,
                Some(&target),
            ))
            .await
        } else if ft.is_file() {
            let mut f = match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(&p)
            {
                Ok(f) => f,
                // Removed, or replaced by a link or a socket, since it was listed: a tree
                // that changes while it is packed loses that entry, not the whole archive.
                Err(e) if p != root && vanished(&e) => continue,
                Err(e) => return io_event(&p, &e),
            };
            // The size in the header is what is sent: a file growing meanwhile is cut, one
            // shrinking is padded with zeros.
            let size = md.len();
            let r = tx
                .send(&header_blocks(
                    &name,
                    &md,
                    tar::EntryType::Regular,
                    size,
                    None,
                ))
                .await;
            if let Err(s) = r {
                return stopped(s);
            }
            let mut left = size;
            while left > 0 {
                let want = (left as usize).min(CHUNK);
                let n = match f.read(&mut buf[..want]) {
                    Ok(0) => {
                        buf[..want].fill(0);
                        want
                    }
                    Ok(n) => n,
                    Err(e) => return io_event(&p, &e),
                };
                if let Err(s) = tx.send(&buf[..n]).await {
                    return stopped(s);
                }
                left -= n as u64;
            }
            let pad = (BLOCK - (size as usize % BLOCK)) % BLOCK;
            tx.send(&vec![0u8; pad]).await
        } else {
            // Devices, FIFOs and sockets are not copied.
            Ok(())
        };
        if let Err(s) = sent {
            return stopped(s);
        }
    }
    match tx.send(&[0u8; BLOCK * 2]).await {
        Ok(()) => Event::Done,
        Err(s) => stopped(s),
    }
}

/// Whether opening a listed file failed because it is no longer a regular file at that path.
fn vanished(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ELOOP | libc::ENXIO | libc::ENOTDIR)
    )
}

fn stopped(s: Stop) -> Event {
    match s {
        Stop::Cancelled => Event::error(ErrorCode::Internal, "cancelled"),
        Stop::Gone => Event::Done,
    }
}

/// A directory's entries as (path, archive name), sorted by name.
fn children(dir: &Path, prefix: &str) -> Vec<(PathBuf, String)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, String)> = rd
        .flatten()
        .map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let name = if prefix.is_empty() {
                n
            } else {
                format!("{prefix}/{n}")
            };
            (e.path(), name)
        })
        .collect();
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

/// Where the bytes of the current entry go.
enum Sink {
    File(File, PathBuf, u32, u64),
    LongName(Vec<u8>),
    LongLink(Vec<u8>),
    Pax(Vec<u8>),
    Skip,
}

enum State {
    Header,
    Data { left: u64, pad: u64, sink: Sink },
    End,
}

/// Unpacks a tar stream fed in chunks of any size.
struct Unpacker {
    dest: PathBuf,
    block: Vec<u8>,
    state: State,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    /// Directories made or touched, with their mode and mtime, applied at the end (writing
    /// their entries changes their mtime, and a read-only mode would stop those writes).
    dirs: Vec<(PathBuf, u32, u64)>,
}

/// The relative path an entry names, refused when it could leave the destination.
fn clean(name: &[u8]) -> Result<PathBuf, Event> {
    let shown = String::from_utf8_lossy(name).into_owned();
    if name.first() == Some(&b'/') {
        return Err(bad_entry(&shown, "absolute paths are not unpacked"));
    }
    let mut p = PathBuf::new();
    for c in name.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(bad_entry(&shown, "`..` would leave the destination")),
            c => p.push(os(c)),
        }
    }
    Ok(p)
}

/// `OsStr` from raw bytes (on Unix any bytes are one).
fn os(b: &[u8]) -> &std::ffi::OsStr {
    std::os::unix::ffi::OsStrExt::from_bytes(b)
}

impl Unpacker {
    /// Makes the directories leading to `rel` (under the destination), refusing to go through
    /// a symlink or a non-directory; returns the full path.
    fn parents(&self, rel: &Path, shown: &str) -> Result<PathBuf, Event> {
        let mut at = self.dest.clone();
        let comps: Vec<_> = rel.components().collect();
        for c in comps.iter().take(comps.len().saturating_sub(1)) {
            at.push(c);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(bad_entry(
                        shown,
                        &format!(
                            "{} is a symlink; nothing is unpacked through one",
                            at.display()
                        ),
                    ))
                }
                Ok(_) => {
                    return Err(bad_entry(
                        shown,
                        &format!("{} is not a directory", at.display()),
                    ))
                }
                Err(_) => std::fs::create_dir(&at).map_err(|e| io_event(&at, &e))?,
            }
        }
        Ok(self.dest.join(rel))
    }

    /// Removes what is at `p` (not a directory) so a new entry can take its place.
    fn clear(p: &Path) -> Result<(), Event> {
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => Err(Event::error(
                ErrorCode::FileError,
                format!("{}: a directory is in the way", p.display()),
            )),
            Ok(_) => std::fs::remove_file(p).map_err(|e| io_event(p, &e)),
            Err(_) => Ok(()),
        }
    }

    fn header(&mut self) -> Result<State, Event> {
        if self.block.iter().all(|b| *b == 0) {
            return Ok(State::End);
        }
        let h = tar::Header::from_byte_slice(&self.block);
        let sum: u64 = self
            .block
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(*b)
                }
            })
            .sum();
        if h.cksum().ok().map(u64::from) != Some(sum) {
            return Err(Event::error(
                ErrorCode::InvalidRequest,
                "not a tar stream (bad header checksum)",
            ));
        }
        let size = h
            .entry_size()
            .map_err(|e| Event::error(ErrorCode::InvalidRequest, format!("tar header: {e}")))?;
        let pad = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
        let kind = h.entry_type();
        let data = |sink| {
            Ok(State::Data {
                left: size,
                pad,
                sink,
            })
        };
        match kind {
            tar::EntryType::GNULongName => return data(Sink::LongName(Vec::new())),
            tar::EntryType::GNULongLink => return data(Sink::LongLink(Vec::new())),
            tar::EntryType::XHeader => return data(Sink::Pax(Vec::new())),
            tar::EntryType::XGlobalHeader => return data(Sink::Skip),
            _ => {}
        }
        let name = self
            .long_name
            .take()
            .unwrap_or_else(|| h.path_bytes().into_owned());
        let link = self
            .long_link
            .take()
            .or_else(|| h.link_name_bytes().map(|l| l.into_owned()));
        let shown = String::from_utf8_lossy(&name).into_owned();
        let rel = clean(&name)?;
        let mode = h.mode().unwrap_or(0o644) & 0o7777;
        let mtime = h.mtime().unwrap_or(0);
        if rel.as_os_str().is_empty() {
            // The destination itself (`./`).
            if kind == tar::EntryType::Directory {
                self.dirs.push((self.dest.clone(), mode, mtime));
            }
            return data(Sink::Skip);
        }
        let target = self.parents(&rel, &shown)?;
        match kind {
            tar::EntryType::Directory => {
                match std::fs::symlink_metadata(&target) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        Self::clear(&target)?;
                        std::fs::create_dir(&target).map_err(|e| io_event(&target, &e))?;
                    }
                    Err(_) => std::fs::create_dir(&target).map_err(|e| io_event(&target, &e))?,
                }
                // Writable by its owner until the end, whatever its final mode.
                let _ = std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700));
                self.dirs.push((target, mode, mtime));
                data(Sink::Skip)
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                Self::clear(&target)?;
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&target)
                    .map_err(|e| io_event(&target, &e))?;
                data(Sink::File(f, target, mode, mtime))
            }
            tar::EntryType::Symlink => {
                let link = link.ok_or_else(|| bad_entry(&shown, "a symlink without a target"))?;
                Self::clear(&target)?;
                std::os::unix::fs::symlink(os(&link), &target)
                    .map_err(|e| io_event(&target, &e))?;
                set_mtime(&target, mtime, false);
                data(Sink::Skip)
            }
            tar::EntryType::Link => {
                let link = link.ok_or_else(|| bad_entry(&shown, "a hard link without a target"))?;
                let src_rel = clean(&link)?;
                let src = self.parents(&src_rel, &shown)?;
                match std::fs::symlink_metadata(&src) {
                    Ok(m) if m.is_file() => {}
                    _ => {
                        return Err(bad_entry(
                            &shown,
                            "a hard link must name a file unpacked before it",
                        ))
                    }
                }
                Self::clear(&target)?;
                std::fs::hard_link(&src, &target).map_err(|e| io_event(&target, &e))?;
                data(Sink::Skip)
            }
            // Devices, FIFOs and anything else are not unpacked.
            _ => data(Sink::Skip),
        }
    }

    fn feed(&mut self, mut data: &[u8]) -> Result<(), Event> {
        while !data.is_empty() {
            match &mut self.state {
                State::End => return Ok(()),
                State::Header => {
                    let n = (BLOCK - self.block.len()).min(data.len());
                    self.block.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    if self.block.len() == BLOCK {
                        let next = self.header();
                        self.block.clear();
                        self.state = next?;
                        self.finish_empty()?;
                    }
                }
                State::Data { left, pad, sink } => {
                    if *left > 0 {
                        let n = (*left as usize).min(data.len());
                        match sink {
                            Sink::File(f, p, ..) => {
                                f.write_all(&data[..n]).map_err(|e| io_event(p, &e))?
                            }
                            Sink::LongName(v) | Sink::LongLink(v) | Sink::Pax(v) => {
                                if v.len() + n > 1 << 20 {
                                    return Err(Event::error(
                                        ErrorCode::InvalidRequest,
                                        "tar name or extended header over 1 MiB",
                                    ));
                                }
                                v.extend_from_slice(&data[..n])
                            }
                            Sink::Skip => {}
                        }
                        *left -= n as u64;
                        data = &data[n..];
                    } else {
                        let n = (*pad as usize).min(data.len());
                        *pad -= n as u64;
                        data = &data[n..];
                    }
                    self.finish_empty()?;
                }
            }
        }
        Ok(())
    }

    /// Closes the current entry once its data and padding are through.
    fn finish_empty(&mut self) -> Result<(), Event> {
        let State::Data {
            left: 0, pad: 0, ..
        } = &self.state
        else {
            return Ok(());
        };
        let State::Data { sink, .. } = std::mem::replace(&mut self.state, State::Header) else {
            return Ok(());
        };
        match sink {
            Sink::File(f, p, mode, mtime) => {
                f.set_permissions(std::fs::Permissions::from_mode(mode))
                    .map_err(|e| io_event(&p, &e))?;
                let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime);
                let _ = f.set_times(std::fs::FileTimes::new().set_accessed(t).set_modified(t));
            }
            Sink::LongName(v) => self.long_name = Some(trim_nul(v)),
            Sink::LongLink(v) => self.long_link = Some(trim_nul(v)),
            Sink::Pax(v) => {
                for (k, val) in pax_records(&v) {
                    match k {
                        b"path" => self.long_name = Some(val.to_vec()),
                        b"linkpath" => self.long_link = Some(val.to_vec()),
                        _ => {}
                    }
                }
            }
            Sink::Skip => {}
        }
        Ok(())
    }

    fn end(mut self) -> Event {
        if !matches!(self.state, State::Header | State::End) || !self.block.is_empty() {
            return Event::error(
                ErrorCode::InvalidRequest,
                "the tar stream ended in the middle of an entry",
            );
        }
        // Deepest first, so a parent's mtime is set after its children changed it.
        self.dirs
            .sort_by_key(|(p, ..)| std::cmp::Reverse(p.components().count()));
        for (p, mode, mtime) in &self.dirs {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode));
            set_mtime(p, *mtime, true);
        }
        Event::Done
    }
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// `len key=value\n` records of a PAX extended header.
fn pax_records(mut v: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut out = Vec::new();
    while let Some(sp) = v.iter().position(|b| *b == b' ') {
        let Some(len) = std::str::from_utf8(&v[..sp])
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
        else {
            break;
        };
        if len <= sp + 1 || len > v.len() {
            break;
        }
        let rec = &v[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        if let Some(eq) = rec.iter().position(|b| *b == b'=') {
            out.push((&rec[..eq], &rec[eq + 1..]));
        }
        v = &v[len..];
    }
    out
}

fn set_mtime(p: &Path, mtime: u64, follow: bool) {
    let t = nix::sys::time::TimeSpec::new(mtime as i64, 0);
    let flag = if follow {
        nix::sys::stat::UtimensatFlags::FollowSymlink
    } else {
        nix::sys::stat::UtimensatFlags::NoFollowSymlink
    };
    let _ = nix::sys::stat::utimensat(None, p, &t, &t, flag);
}

/// `WriteTar`: unpacks the STDIN frames under `path` (made when missing) until EOF.
pub async fn write(path: &str, mut inbox: Inbox) -> Event {
    let dest = PathBuf::from(path);
    match std::fs::symlink_metadata(&dest) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Event::error(ErrorCode::FileError, format!("{path}: not a directory")),
        Err(_) => {
            if let Err(e) = std::fs::create_dir_all(&dest) {
                return io_event(&dest, &e);
            }
        }
    }
    if let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(&dest)
    {
        if let Err(ev) = crate::files::check_kernel_fs(path, &f) {
            return ev;
        }
    }
    let mut u = Unpacker {
        dest,
        block: Vec::with_capacity(BLOCK),
        state: State::Header,
        long_name: None,
        long_link: None,
        dirs: Vec::new(),
    };
    loop {
        match inbox.recv().await {
            Some(fr) => match fr.kind {
                Kind::Stdin => {
                    if let Err(ev) = u.feed(&fr.payload) {
                        // Keep reading so the daemon's upload is not stuck on a full inbox.
                        while let Some(fr) = inbox.recv().await {
                            if fr.kind != Kind::Stdin {
                                break;
                            }
                        }
                        return ev;
                    }
                }
                Kind::Eof => return u.end(),
                Kind::Cancel => return Event::error(ErrorCode::Internal, "upload cancelled"),
                _ => {}
            },
            None => return Event::Done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unpacker(dest: &Path) -> Unpacker {
        Unpacker {
            dest: dest.to_path_buf(),
            block: Vec::new(),
            state: State::Header,
            long_name: None,
            long_link: None,
            dirs: Vec::new(),
        }
    }

    fn entry(
        b: &mut tar::Builder<Vec<u8>>,
        name: &str,
        kind: tar::EntryType,
        data: &[u8],
        link: Option<&str>,
    ) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o750
        } else {
            0o640
        });
        h.set_mtime(1_000_000);
        // Raw names: the builder's own checks would refuse the hostile ones.
        let n = name.len().min(100);
        h.as_old_mut().name[..n].copy_from_slice(&name.as_bytes()[..n]);
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }

    fn unpack(dest: &Path, tar: &[u8], chunk: usize) -> Event {
        let mut u = unpacker(dest);
        for c in tar.chunks(chunk) {
            if let Err(e) = u.feed(c) {
                return e;
            }
        }
        u.end()
    }

    #[test]
    fn unpacks_files_dirs_symlinks_with_modes_and_mtimes_in_any_chunking() {
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "d/", tar::EntryType::Directory, b"", None);
        entry(&mut b, "d/f", tar::EntryType::Regular, &[7u8; 1500], None);
        entry(&mut b, "d/l", tar::EntryType::Symlink, b"", Some("f"));
        let long = format!("d/{}", "x".repeat(150));
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o755);
        b.append_data(&mut h, &long, &b"hi"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        for chunk in [1, 511, 512, 4096, 1 << 20] {
            let t = tempfile::tempdir().unwrap();
            assert_eq!(unpack(t.path(), &tar, chunk), Event::Done, "chunk {chunk}");
            let f = t.path().join("d/f");
            assert_eq!(std::fs::read(&f).unwrap(), vec![7u8; 1500]);
            let md = std::fs::metadata(&f).unwrap();
            assert_eq!((md.mode() & 0o7777, md.mtime()), (0o640, 1_000_000));
            assert_eq!(
                std::fs::read_link(t.path().join("d/l")).unwrap(),
                Path::new("f")
            );
            assert_eq!(std::fs::read(t.path().join(&long)).unwrap(), b"hi");
            let dmd = std::fs::metadata(t.path().join("d")).unwrap();
            assert_eq!((dmd.mode() & 0o7777, dmd.mtime()), (0o750, 1_000_000));
        }
    }

    #[test]
    fn traversal_and_symlink_escapes_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let cases: Vec<Vec<u8>> = vec![
            {
                let mut b = tar::Builder::new(Vec::new());
                entry(&mut b, "../escape", tar::EntryType::Regular, b"x", None);
                b.into_inner().unwrap()
            },
            {
                let mut b = tar::Builder::new(Vec::new());
                entry(&mut b, "/abs", tar::EntryType::Regular, b"x", None);
                b.into_inner().unwrap()
            },
            {
                // A symlink to outside, then a file through it.
                let mut b = tar::Builder::new(Vec::new());
                let out = outside.path().to_str().unwrap().to_string();
                entry(&mut b, "link", tar::EntryType::Symlink, b"", Some(&out));
                entry(&mut b, "link/owned", tar::EntryType::Regular, b"x", None);
                b.into_inner().unwrap()
            },
            {
                let mut b = tar::Builder::new(Vec::new());
                entry(
                    &mut b,
                    "h",
                    tar::EntryType::Link,
                    b"",
                    Some("../../etc/passwd"),
                );
                b.into_inner().unwrap()
            },
        ];
        for tar in cases {
            let t = tempfile::tempdir().unwrap();
            let ev = unpack(t.path(), &tar, 512);
            assert!(
                matches!(&ev, Event::Error { code, .. } if *code == ErrorCode::InvalidPath),
                "{ev:?}"
            );
        }
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_cut_stream_or_junk_is_an_error() {
        let mut b = tar::Builder::new(Vec::new());
        entry(&mut b, "f", tar::EntryType::Regular, &[1u8; 2000], None);
        let tar = b.into_inner().unwrap();
        let t = tempfile::tempdir().unwrap();
        let ev = unpack(t.path(), &tar[..1200], 100);
        assert!(matches!(ev, Event::Error { .. }), "{ev:?}");
        let t = tempfile::tempdir().unwrap();
        let ev = unpack(t.path(), &[b'j'; 1024], 100);
        assert!(matches!(ev, Event::Error { .. }), "{ev:?}");
    }

    #[test]
    fn packed_headers_read_back_with_the_tar_crate() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let md = std::fs::symlink_metadata(&p).unwrap();
        let long = "n".repeat(120);
        let link = "l".repeat(130);
        let mut bytes = header_blocks(
            &long,
            &md,
            tar::EntryType::Symlink,
            0,
            Some(link.as_bytes()),
        );
        bytes.extend_from_slice(&[0u8; 1024]);
        let mut a = tar::Archive::new(&bytes[..]);
        let e = a.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(e.path().unwrap().to_str().unwrap(), long);
        assert_eq!(e.link_name().unwrap().unwrap().to_str().unwrap(), link);
    }
}
