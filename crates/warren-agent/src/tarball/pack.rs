//! `ReadTar`: a file or a directory tree packed into a tar stream of credit-limited frames.

use std::fs::OpenOptions;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use warren_proto::{Event, Frame, Kind};
use warren_types::ErrorCode;

use super::{io_event, BLOCK, CHUNK};
use crate::wire::{Inbox, Out};

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
pub(super) fn header_blocks(
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
