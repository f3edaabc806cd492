//! `WriteTar`: a tar stream unpacked under a directory as its frames arrive, never outside it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use warren_proto::{Event, Kind};
use warren_types::ErrorCode;

use super::{bad_entry, io_event, BLOCK};
use crate::wire::Inbox;

/// Where the bytes of the current entry go.
pub(super) enum Sink {
    File(File, PathBuf, u32, u64),
    LongName(Vec<u8>),
    LongLink(Vec<u8>),
    Pax(Vec<u8>),
    Skip,
}

pub(super) enum State {
    Header,
    Data { left: u64, pad: u64, sink: Sink },
    End,
}

/// Unpacks a tar stream fed in chunks of any size.
pub(super) struct Unpacker {
    pub(super) dest: PathBuf,
    pub(super) block: Vec<u8>,
    pub(super) state: State,
    pub(super) long_name: Option<Vec<u8>>,
    pub(super) long_link: Option<Vec<u8>>,
    /// Directories made or touched, with their mode and mtime, applied at the end (writing
    /// their entries changes their mtime, and a read-only mode would stop those writes).
    pub(super) dirs: Vec<(PathBuf, u32, u64)>,
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

    pub(super) fn feed(&mut self, mut data: &[u8]) -> Result<(), Event> {
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
    pub(super) fn finish_empty(&mut self) -> Result<(), Event> {
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

    pub(super) fn end(mut self) -> Event {
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
