//! Each sandbox's entries as one append-only file beside the state file:
//! `<state dir>/trajectory-logs/<sandbox id>.log`.
//!
//! Why files and not redb rows: a B-tree that is only appended to splits its leaves in half
//! and redb grows its file by doubling, so a 100-byte entry cost about 250 bytes of state
//! file, and a 470-byte one about 1,600 (measured). A log file costs its entries plus a
//! 16-byte header each; a whole trajectory is one file to ship elsewhere or unlink.
//!
//! A file grows ahead of its records, by writing zeros (to a quarter past its end, rounded up
//! to 4 KiB): a sync of data written inside a file's size flushes only the data,
//! while a sync that also has to make a new size durable commits the filesystem's journal
//! (about 4 ms against 0.3 ms here). The zeros past the committed length are never read.
//!
//! A record is `len: u32 LE | crc32(seq ‖ payload): u32 LE | seq: u64 LE | payload` (the
//! payload is a [`super::StoredEntry`] as [`super::StoredEntry::encode`] wrote it).
//!
//! Crash safety, with the state file as the commit record: the journal's writer writes a
//! group's records at each file's committed length and syncs them *before* the transaction
//! that records the new length (`trajectory_logs`: sandbox → committed length, last seq)
//! commits. Readers read up to the length of their own read transaction, so they never see
//! an entry that is not committed. [`LogDir::open`] cuts every file back to its committed
//! length (a crash mid-group leaves bytes past it) and unlinks files with no length (a crash
//! before a sandbox's first commit, or after its removal committed).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::StoreError;

/// Bytes before a record's payload.
pub const HEADER: usize = 16;

/// Largest payload a record may have (a stored entry is a few KiB at most: outputs over
/// [`super::INLINE_MAX`] are blob files); a length beyond it is damage.
const MAX_PAYLOAD: u32 = 1 << 20;

/// Appends one record to `out`.
pub fn frame(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&seq.to_le_bytes());
    crc.update(payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(payload);
}

/// The log directory of one state file.
#[derive(Debug)]
pub struct LogDir {
    root: PathBuf,
    /// Bytes of all log files (their sizes, the room grown ahead included).
    bytes: AtomicU64,
}

fn io_err(path: &Path, what: &'static str, e: std::io::Error) -> StoreError {
    StoreError::Blob {
        what,
        path: path.to_path_buf(),
        source: e,
    }
}

impl LogDir {
    /// Opens (creating) the directory; cuts each file back to its committed length in
    /// `committed` (sandbox id → bytes) and removes the files it does not name.
    pub fn open(root: PathBuf, committed: &HashMap<String, u64>) -> Result<LogDir, StoreError> {
        std::fs::create_dir_all(&root).map_err(|e| io_err(&root, "create", e))?;
        let mut bytes = 0;
        for f in std::fs::read_dir(&root).map_err(|e| io_err(&root, "list", e))? {
            let f = f.map_err(|e| io_err(&root, "list", e))?;
            let name = f.file_name().to_string_lossy().into_owned();
            let len = name.strip_suffix(".log").and_then(|id| committed.get(id));
            match len {
                Some(&len) => {
                    let on_disk = f.metadata().map_or(0, |m| m.len());
                    if on_disk > len {
                        let file = std::fs::OpenOptions::new()
                            .write(true)
                            .open(f.path())
                            .map_err(|e| io_err(&f.path(), "open", e))?;
                        file.set_len(len)
                            .and_then(|_| file.sync_all())
                            .map_err(|e| io_err(&f.path(), "truncate", e))?;
                    }
                    bytes += len.min(on_disk);
                }
                None => {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        Ok(LogDir {
            root,
            bytes: AtomicU64::new(bytes),
        })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.root.join(format!("{id}.log"))
    }

    /// Writes `records` at `offset` (the committed length) of `id`'s log, creating it and
    /// growing it ahead when they reach past its size, and returns the file to sync before
    /// the length is committed.
    pub fn write_at(&self, id: &str, offset: u64, records: &[u8]) -> std::io::Result<File> {
        const STEP: u64 = 4096;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path(id))?;
        let size = file.metadata()?.len();
        let end = offset + records.len() as u64;
        if end <= size {
            file.write_all_at(records, offset)?;
            return Ok(file);
        }
        let ahead = (end + end / 4).div_ceil(STEP) * STEP;
        let mut buf = Vec::with_capacity((ahead - offset) as usize);
        buf.extend_from_slice(records);
        buf.resize((ahead - offset) as usize, 0);
        file.write_all_at(&buf, offset)?;
        self.bytes.fetch_add(ahead - size, Ordering::Relaxed);
        Ok(file)
    }

    /// Syncs the directory (after files were created in it).
    pub fn sync_dir(&self) -> std::io::Result<()> {
        File::open(&self.root)?.sync_all()
    }

    /// Unlinks `id`'s log (its removal committed).
    pub fn remove(&self, id: &str) {
        let path = self.path(id);
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        match std::fs::remove_file(&path) {
            Ok(()) => {
                let _ = self
                    .bytes
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                        Some(b.saturating_sub(size))
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(sandbox = id, error = %e, "trajectory log not removed"),
        }
    }

    /// Bytes of all log files.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads `id`'s records up to `len` bytes (its committed length in the caller's read
    /// transaction). A log removed since reads as empty.
    pub fn reader(&self, id: &str, len: u64) -> Result<Records, StoreError> {
        let path = self.path(id);
        let file = match File::open(&path) {
            Ok(f) => Some(BufReader::with_capacity(64 << 10, f)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&path, "open", e)),
        };
        Ok(Records {
            file,
            path,
            pos: 0,
            end: len,
        })
    }
}

/// The records of one log, in order.
pub struct Records {
    file: Option<BufReader<File>>,
    path: PathBuf,
    pos: u64,
    end: u64,
}

/// One record read back.
pub struct Record {
    pub seq: u64,
    pub payload: Vec<u8>,
}

impl Records {
    fn damaged(&self, why: &str) -> StoreError {
        io_err(
            &self.path,
            "read",
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{why} at byte {}", self.pos),
            ),
        )
    }

    /// The next record whose seq is at least `from` (earlier ones are skipped unread), or
    /// `None` at the committed end.
    pub fn next_from(&mut self, from: u64) -> Result<Option<Record>, StoreError> {
        loop {
            let Some(file) = self.file.as_mut() else {
                return Ok(None);
            };
            if self.pos + HEADER as u64 > self.end {
                return Ok(None);
            }
            let mut h = [0u8; HEADER];
            file.read_exact(&mut h)
                .map_err(|e| io_err(&self.path, "read", e))?;
            let len = u32::from_le_bytes(h[..4].try_into().expect("4 bytes"));
            let crc = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes"));
            let seq = u64::from_le_bytes(h[8..].try_into().expect("8 bytes"));
            let next = self.pos + HEADER as u64 + u64::from(len);
            if len > MAX_PAYLOAD || next > self.end {
                return Err(self.damaged("record length out of bounds"));
            }
            if seq < from {
                file.seek(SeekFrom::Current(i64::from(len)))
                    .map_err(|e| io_err(&self.path, "read", e))?;
                self.pos = next;
                continue;
            }
            let mut payload = vec![0u8; len as usize];
            file.read_exact(&mut payload)
                .map_err(|e| io_err(&self.path, "read", e))?;
            let mut sum = crc32fast::Hasher::new();
            sum.update(&seq.to_le_bytes());
            sum.update(&payload);
            if sum.finalize() != crc {
                return Err(self.damaged("record checksum mismatch"));
            }
            self.pos = next;
            return Ok(Some(Record { seq, payload }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(d: &LogDir, id: &str, len: u64, from: u64) -> Vec<(u64, Vec<u8>)> {
        let mut r = d.reader(id, len).unwrap();
        let mut out = Vec::new();
        while let Some(x) = r.next_from(from).unwrap() {
            out.push((x.seq, x.payload));
        }
        out
    }

    #[test]
    fn records_read_back_up_to_the_committed_length_and_open_cuts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("logs");
        let d = LogDir::open(root.clone(), &HashMap::new()).unwrap();
        let mut buf = Vec::new();
        frame(1, b"one", &mut buf);
        frame(2, b"two", &mut buf);
        let committed = buf.len() as u64;
        d.write_at("a", 0, &buf).unwrap().sync_data().unwrap();
        // A third record written but never committed (a crash before the commit).
        let mut more = Vec::new();
        frame(3, b"three", &mut more);
        d.write_at("a", committed, &more).unwrap();
        assert_eq!(
            records(&d, "a", committed, 0),
            vec![(1, b"one".to_vec()), (2, b"two".to_vec())]
        );
        assert_eq!(records(&d, "a", committed, 2), vec![(2, b"two".to_vec())]);
        assert!(records(&d, "gone", 100, 0).is_empty(), "a removed log");
        // A log nobody committed (the crash came before its first commit).
        d.write_at("b", 0, &buf).unwrap();
        drop(d);
        let d = LogDir::open(root.clone(), &[("a".to_string(), committed)].into()).unwrap();
        assert_eq!(d.bytes(), committed);
        assert_eq!(
            std::fs::metadata(root.join("a.log")).unwrap().len(),
            committed
        );
        assert!(!root.join("b.log").exists());
        // Appends grow the file ahead of them, in steps of 4 KiB, and read back the same.
        let mut c = Vec::new();
        frame(3, b"three", &mut c);
        d.write_at("a", committed, &c).unwrap();
        let size = std::fs::metadata(root.join("a.log")).unwrap().len();
        assert_eq!(size, 4096);
        assert_eq!(d.bytes(), size);
        let end = committed + c.len() as u64;
        assert_eq!(records(&d, "a", end, 3), vec![(3, b"three".to_vec())]);
        d.remove("a");
        assert_eq!(d.bytes(), 0);
        assert!(!root.join("a.log").exists());
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let d = LogDir::open(dir.path().join("logs"), &HashMap::new()).unwrap();
        let mut buf = Vec::new();
        frame(1, b"payload", &mut buf);
        let n = buf.len() as u64;
        buf[HEADER] ^= 0xff;
        d.write_at("a", 0, &buf).unwrap();
        assert!(d.reader("a", n).unwrap().next_from(0).is_err(), "checksum");
        let mut huge = Vec::new();
        frame(1, b"x", &mut huge);
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        d.write_at("b", 0, &huge).unwrap();
        assert!(
            d.reader("b", 1 << 30).unwrap().next_from(0).is_err(),
            "length"
        );
    }
}
