//! Each sandbox's entries as one append-only file beside the state file:
//! `<state dir>/trajectory-logs/<sandbox id>.log`.
//!
//! Why files and not redb rows: a B-tree that is only appended to splits its leaves in half
//! and redb grows its file by doubling, so a 100-byte entry cost about 250 bytes of state
//! file, and a 470-byte one about 1,600 (measured). A log file costs its entries plus a
//! 16-byte header each; a whole trajectory is one file to ship elsewhere or unlink.
//!
//! A file grows ahead of its records, by writing zeros (a quarter past its end and at least
//! 16 KiB, rounded up to 4 KiB): a sync of data written inside a file's size flushes only the data,
//! while a sync that also has to make a new size durable commits the filesystem's journal
//! (about 4 ms against 0.3 ms here). The zeros past the committed length are never read.
//!
//! A record is `len: u32 LE | crc32(seq ‖ payload): u32 LE | seq: u64 LE | payload` (the
//! payload is a [`super::StoredEntry`] as [`super::StoredEntry::encode`] wrote it).
//!
//! Crash safety, with the state file as the index: the journal's writer writes a group's
//! records at each file's indexed length and syncs them *before* the transaction that records
//! the new length (`trajectory_logs`: sandbox → length, last seq) commits, and answers the
//! group's appends only then. Readers read up to the length of their own read transaction,
//! so they never see an entry that is not committed. That transaction is not synced itself
//! (the journal makes the index durable from time to time): after a crash, a file may hold
//! answered records past its indexed length. [`LogDir::tail`] finds them (each record is
//! framed by its length and checked by its CRC and its seq, the next one), the journal
//! indexes them, and [`LogDir::cut`] cuts every file back to its (recovered) length — a torn
//! record of a group that never answered goes — and unlinks files with no length (a crash
//! after a removal committed; a log's first group is always committed durably).

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

/// Short logs grow by this at least: a step of 4 KiB took a journal commit every dozen entries
/// of a few hundred bytes.
const MIN_AHEAD: u64 = 16 << 10;

/// The checksum a record of `seq` and `payload` carries.
fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&seq.to_le_bytes());
    crc.update(payload);
    crc.finalize()
}

/// The fields of a record's header, as read (not yet checked).
struct Header {
    len: u32,
    crc: u32,
    seq: u64,
}

impl Header {
    fn parse(h: &[u8; HEADER]) -> Header {
        Header {
            len: u32::from_le_bytes(h[..4].try_into().expect("4 bytes")),
            crc: u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")),
            seq: u64::from_le_bytes(h[8..].try_into().expect("8 bytes")),
        }
    }
}

/// Appends one record to `out`.
pub fn frame(seq: u64, payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&checksum(seq, payload).to_le_bytes());
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
        Self::open_unchecked(root)?.cut(committed)
    }

    /// Opens (creating) the directory as it is, to read the tails past the index
    /// ([`LogDir::tail`]) before [`LogDir::cut`].
    pub fn open_unchecked(root: PathBuf) -> Result<LogDir, StoreError> {
        std::fs::create_dir_all(&root).map_err(|e| io_err(&root, "create", e))?;
        Ok(LogDir {
            root,
            bytes: AtomicU64::new(0),
        })
    }

    /// Cuts each file back to its committed length in `committed` (sandbox id → bytes) and
    /// removes the files it does not name.
    pub fn cut(self, committed: &HashMap<String, u64>) -> Result<LogDir, StoreError> {
        let root = &self.root;
        let mut bytes = 0;
        for f in std::fs::read_dir(root).map_err(|e| io_err(root, "list", e))? {
            let f = f.map_err(|e| io_err(root, "list", e))?;
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
        self.bytes.store(bytes, Ordering::Relaxed);
        Ok(self)
    }

    fn path(&self, id: &str) -> PathBuf {
        self.root.join(format!("{id}.log"))
    }

    fn open_for_write(&self, id: &str) -> std::io::Result<File> {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path(id))
    }

    /// Makes `id`'s log ahead of its first record: [`MIN_AHEAD`] bytes of zeros (none of them
    /// a record), and returns the file to sync. A longer file is left as it is.
    pub fn start(&self, id: &str) -> std::io::Result<File> {
        let file = self.open_for_write(id)?;
        let size = file.metadata()?.len();
        if size < MIN_AHEAD {
            file.write_all_at(&vec![0u8; (MIN_AHEAD - size) as usize], size)?;
            self.bytes.fetch_add(MIN_AHEAD - size, Ordering::Relaxed);
        }
        Ok(file)
    }

    /// Writes `records` at `offset` (the committed length) of `id`'s log, creating it and
    /// growing it ahead when they reach past its size, and returns the file to sync before
    /// the length is committed.
    pub fn write_at(&self, id: &str, offset: u64, records: &[u8]) -> std::io::Result<File> {
        const STEP: u64 = 4096;
        let file = self.open_for_write(id)?;
        let size = file.metadata()?.len();
        let end = offset + records.len() as u64;
        if end <= size {
            file.write_all_at(records, offset)?;
            return Ok(file);
        }
        let ahead = (end + (end / 4).max(MIN_AHEAD)).div_ceil(STEP) * STEP;
        let mut buf = Vec::with_capacity((ahead - offset) as usize);
        buf.extend_from_slice(records);
        buf.resize((ahead - offset) as usize, 0);
        file.write_all_at(&buf, offset)?;
        self.bytes.fetch_add(ahead - size, Ordering::Relaxed);
        Ok(file)
    }

    /// The whole records of `id`'s log past `len` (the length its index recorded), each the
    /// next seq after `last_seq`: what a group synced but whose index commit was not yet
    /// durable when the node stopped. The scan stops at the first record that is torn (cut
    /// short by the end of the file), fails its checksum, has a length out of bounds or is not
    /// the next seq (the zeros a file is grown ahead with are such a record). A log that is
    /// not there has no tail.
    pub fn tail(&self, id: &str, len: u64, last_seq: u64) -> Result<Tail, StoreError> {
        let path = self.path(id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Tail {
                    end: len,
                    last_seq,
                    records: Vec::new(),
                })
            }
            Err(e) => return Err(io_err(&path, "open", e)),
        };
        let size = file.metadata().map_err(|e| io_err(&path, "stat", e))?.len();
        let mut r = BufReader::with_capacity(64 << 10, file);
        r.seek(SeekFrom::Start(len))
            .map_err(|e| io_err(&path, "read", e))?;
        let mut tail = Tail {
            end: len,
            last_seq,
            records: Vec::new(),
        };
        loop {
            if tail.end + HEADER as u64 > size {
                break;
            }
            let mut h = [0u8; HEADER];
            r.read_exact(&mut h).map_err(|e| io_err(&path, "read", e))?;
            let Header { len: n, crc, seq } = Header::parse(&h);
            let next = tail.end + HEADER as u64 + u64::from(n);
            if n > MAX_PAYLOAD || next > size || seq != tail.last_seq + 1 {
                break;
            }
            let mut payload = vec![0u8; n as usize];
            r.read_exact(&mut payload)
                .map_err(|e| io_err(&path, "read", e))?;
            if checksum(seq, &payload) != crc {
                break;
            }
            tail.records.push(Record {
                seq,
                payload,
                at: tail.end,
            });
            tail.end = next;
            tail.last_seq = seq;
        }
        Ok(tail)
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

    /// The record `seq` of `id`'s log, read where a step row says it starts (`at`), within
    /// the committed length `len`: two positioned reads, however long the log. `None` when
    /// no such record starts there (the caller then scans); damage is an error.
    pub fn read_at(
        &self,
        id: &str,
        len: u64,
        at: u64,
        seq: u64,
    ) -> Result<Option<Record>, StoreError> {
        let path = self.path(id);
        if at.saturating_add(HEADER as u64) > len {
            return Ok(None);
        }
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path, "open", e)),
        };
        let mut h = [0u8; HEADER];
        file.read_exact_at(&mut h, at)
            .map_err(|e| io_err(&path, "read", e))?;
        let h = Header::parse(&h);
        if h.seq != seq || h.len > MAX_PAYLOAD || at + HEADER as u64 + u64::from(h.len) > len {
            return Ok(None);
        }
        let mut payload = vec![0u8; h.len as usize];
        file.read_exact_at(&mut payload, at + HEADER as u64)
            .map_err(|e| io_err(&path, "read", e))?;
        if checksum(seq, &payload) != h.crc {
            return Err(io_err(
                &path,
                "read",
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("record checksum mismatch at byte {at}"),
                ),
            ));
        }
        Ok(Some(Record { seq, payload, at }))
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

/// The whole records found past a log's indexed length ([`LogDir::tail`]).
pub struct Tail {
    /// Where the last of them ends (the indexed length when there are none).
    pub end: u64,
    /// The seq of the last of them (the indexed last seq when there are none).
    pub last_seq: u64,
    pub records: Vec<Record>,
}

/// One record read back.
pub struct Record {
    pub seq: u64,
    pub payload: Vec<u8>,
    /// Where it starts in its file (what a step row keeps to read it again at once).
    pub at: u64,
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
            let Header { len, crc, seq } = Header::parse(&h);
            let next = self.pos + HEADER as u64 + u64::from(len);
            if len > MAX_PAYLOAD || next > self.end {
                return Err(self.damaged("record length out of bounds"));
            }
            if seq < from {
                // Relative: within the buffer it moves no file offset and reads nothing (a
                // plain seek drops the buffer, so each skipped record cost a 64 KiB read).
                file.seek_relative(i64::from(len))
                    .map_err(|e| io_err(&self.path, "read", e))?;
                self.pos = next;
                continue;
            }
            let mut payload = vec![0u8; len as usize];
            file.read_exact(&mut payload)
                .map_err(|e| io_err(&self.path, "read", e))?;
            if checksum(seq, &payload) != crc {
                return Err(self.damaged("record checksum mismatch"));
            }
            let at = self.pos;
            self.pos = next;
            return Ok(Some(Record { seq, payload, at }));
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
        // Appends grow the file at least 16 KiB ahead of them, in pages, and read back the
        // same.
        let mut c = Vec::new();
        frame(3, b"three", &mut c);
        d.write_at("a", committed, &c).unwrap();
        let size = std::fs::metadata(root.join("a.log")).unwrap().len();
        let end = committed + c.len() as u64;
        assert_eq!(size, (end + (16 << 10)).div_ceil(4096) * 4096);
        assert_eq!(d.bytes(), size);
        assert_eq!(records(&d, "a", end, 3), vec![(3, b"three".to_vec())]);
        d.remove("a");
        assert_eq!(d.bytes(), 0);
        assert!(!root.join("a.log").exists());
    }

    #[test]
    fn a_record_reads_at_once_where_it_starts_and_nowhere_else() {
        let dir = tempfile::tempdir().unwrap();
        let d = LogDir::open(dir.path().join("logs"), &HashMap::new()).unwrap();
        let mut buf = Vec::new();
        for seq in 1..=50u64 {
            frame(seq, format!("entry {seq}").as_bytes(), &mut buf);
        }
        let len = buf.len() as u64;
        d.write_at("a", 0, &buf).unwrap();
        let mut r = d.reader("a", len).unwrap();
        let mut starts = Vec::new();
        while let Some(x) = r.next_from(0).unwrap() {
            let again = d
                .read_at("a", len, x.at, x.seq)
                .unwrap()
                .expect("read at its start");
            assert_eq!((again.seq, again.payload), (x.seq, x.payload));
            starts.push((x.seq, x.at));
        }
        assert_eq!(starts.len(), 50);
        let (seq, at) = starts[20];
        assert!(
            d.read_at("a", len, at, seq + 1).unwrap().is_none(),
            "another seq"
        );
        assert!(
            d.read_at("a", len, at + 1, seq).unwrap().is_none(),
            "not a start"
        );
        assert!(
            d.read_at("a", at + 4, at, seq).unwrap().is_none(),
            "past the committed length"
        );
        assert!(
            d.read_at("gone", len, at, seq).unwrap().is_none(),
            "a removed log"
        );
    }

    fn tail_seqs(d: &LogDir, id: &str, len: u64, last: u64) -> (u64, u64, Vec<u64>) {
        let t = d.tail(id, len, last).unwrap();
        (t.end, t.last_seq, t.records.iter().map(|r| r.seq).collect())
    }

    /// Three records indexed, then what a group wrote and synced past the index.
    fn indexed_and_past(d: &LogDir, id: &str, past: &[u8]) -> u64 {
        let mut buf = Vec::new();
        for seq in 1..=3 {
            frame(seq, format!("entry {seq}").as_bytes(), &mut buf);
        }
        let indexed = buf.len() as u64;
        d.write_at(id, 0, &buf).unwrap();
        d.write_at(id, indexed, past).unwrap();
        indexed
    }

    #[test]
    fn records_past_the_index_are_recovered_up_to_the_zeros_grown_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let d = LogDir::open(dir.path().join("logs"), &HashMap::new()).unwrap();
        let mut past = Vec::new();
        frame(4, b"entry 4", &mut past);
        frame(5, b"entry 5", &mut past);
        let indexed = indexed_and_past(&d, "a", &past);
        let end = indexed + past.len() as u64;
        assert!(
            std::fs::metadata(d.path("a")).unwrap().len() > end,
            "zeros past the end"
        );
        assert_eq!(tail_seqs(&d, "a", indexed, 3), (end, 5, vec![4, 5]));
        assert_eq!(records(&d, "a", end, 4).len(), 2, "they read back");
        // Nothing past the index, and no file at all.
        assert_eq!(tail_seqs(&d, "a", end, 5), (end, 5, vec![]));
        assert_eq!(tail_seqs(&d, "gone", 0, 0), (0, 0, vec![]));
    }

    #[test]
    fn a_torn_record_past_the_index_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let d = LogDir::open(dir.path().join("logs"), &HashMap::new()).unwrap();
        let mut past = Vec::new();
        frame(4, b"entry 4", &mut past);
        let whole = past.len() as u64;
        frame(5, b"entry 5, cut short by the crash", &mut past);
        past.truncate(past.len() - 5);
        let indexed = indexed_and_past(&d, "a", &past);
        // The file's own end cuts the record (no zeros grown ahead of it).
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(d.path("a"))
            .unwrap();
        file.set_len(indexed + past.len() as u64).unwrap();
        assert_eq!(
            tail_seqs(&d, "a", indexed, 3),
            (indexed + whole, 4, vec![4])
        );
        // A header cut short too.
        file.set_len(indexed + whole + 7).unwrap();
        assert_eq!(
            tail_seqs(&d, "a", indexed, 3),
            (indexed + whole, 4, vec![4])
        );
    }

    #[test]
    fn a_corrupted_record_past_the_index_ends_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let d = LogDir::open(dir.path().join("logs"), &HashMap::new()).unwrap();
        let mut past = Vec::new();
        frame(4, b"entry 4", &mut past);
        let whole = past.len() as u64;
        frame(5, b"entry 5", &mut past);
        frame(6, b"entry 6", &mut past);
        // A payload byte of seq 5 flipped: 5 and everything after it are dropped.
        past[whole as usize + HEADER] ^= 0x40;
        let indexed = indexed_and_past(&d, "a", &past);
        assert_eq!(
            tail_seqs(&d, "a", indexed, 3),
            (indexed + whole, 4, vec![4])
        );

        // A record that is whole but not the next seq (a gap, or a stale record) ends it too.
        let mut gap = Vec::new();
        frame(4, b"entry 4", &mut gap);
        frame(9, b"entry 9", &mut gap);
        let indexed = indexed_and_past(&d, "b", &gap);
        assert_eq!(
            tail_seqs(&d, "b", indexed, 3),
            (indexed + whole, 4, vec![4])
        );
        // A length out of bounds.
        let mut huge = Vec::new();
        frame(4, b"x", &mut huge);
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        let indexed = indexed_and_past(&d, "c", &huge);
        assert_eq!(tail_seqs(&d, "c", indexed, 3), (indexed, 3, vec![]));
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
