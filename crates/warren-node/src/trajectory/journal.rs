//! Trajectory tables in the node's redb file, and the writer that appends to them.
//!
//! - `trajectory`: (sandbox id, seq) → [`StoredEntry`] (deflated JSON, [`StoredEntry::encode`]);
//! - `trajectory_steps`: (sandbox id, step) → seq (8 bytes, big-endian) and request digest
//!   (32 bytes): the index a retried step is looked up in;
//! - `blob_refs`: sha256 (hex) → how many entries refer to that output, whose bytes are a
//!   file of the [`BlobDir`] beside the state file; `blobs` (sha256 → bytes) is where older
//!   nodes kept them, still read and emptied, never written.
//!
//! Appends go to one writer thread, which commits everything waiting in one transaction (one
//! fsync for the group) and then answers each append. An append's answer therefore means its
//! entry is on disk. Reads open their own read transaction and never wait for the writer.

// redb's own error type is large; it is boxed before it leaves this module.
#![allow(clippy::result_large_err)]

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use warren_types::SandboxId;

use super::blobs::BlobDir;
use super::{Blob, Blobs, Digest, StoredEntry};
use crate::error::StoreError;

const ENTRIES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("trajectory");
const STEPS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("trajectory_steps");
const BLOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("blobs");
const BLOB_REFS: TableDefinition<&str, u64> = TableDefinition::new("blob_refs");

/// Most appends committed in one transaction.
const MAX_GROUP: usize = 512;

/// One entry on its way to disk.
#[derive(Debug)]
pub struct Append {
    pub sandbox: SandboxId,
    pub seq: u64,
    /// The step and request digest to index, for calls that named a step.
    pub step: Option<(u64, Digest)>,
    /// The encoded [`StoredEntry`].
    pub entry: Vec<u8>,
    pub blobs: Vec<Blob>,
}

struct Job {
    /// `None`: a barrier, answered once everything queued before it is committed.
    append: Option<Append>,
    done: oneshot::Sender<Result<(), String>>,
}

/// The trajectory side of the state file.
pub struct Journal {
    db: Arc<Database>,
    path: PathBuf,
    blobs: Arc<BlobDir>,
    /// Taken on drop, which stops the writer.
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Closing the channel ends the writer after it commits what it holds; joining it
        // releases its handle on the database, so the file can be opened again at once.
        self.jobs.lock().expect("journal lock").take();
        if let Some(w) = self.writer.lock().expect("journal lock").take() {
            let _ = w.join();
        }
    }
}

fn db_err(path: &Path, what: &'static str, e: impl Into<redb::Error>) -> StoreError {
    StoreError::Db {
        what,
        path: path.to_path_buf(),
        source: Box::new(e.into()),
    }
}

fn step_value(seq: u64, digest: &Digest) -> [u8; 40] {
    let mut v = [0u8; 40];
    v[..8].copy_from_slice(&seq.to_be_bytes());
    v[8..].copy_from_slice(digest);
    v
}

fn parse_step_value(v: &[u8]) -> Option<(u64, Digest)> {
    if v.len() != 40 {
        return None;
    }
    let seq = u64::from_be_bytes(v[..8].try_into().ok()?);
    let digest: Digest = v[8..].try_into().ok()?;
    Some((seq, digest))
}

/// Creates the tables (so readers never meet a missing table).
pub(crate) fn create_tables(tx: &WriteTransaction) -> Result<(), redb::Error> {
    tx.open_table(ENTRIES)?;
    tx.open_table(STEPS)?;
    tx.open_table(BLOBS)?;
    tx.open_table(BLOB_REFS)?;
    Ok(())
}

/// Most entries (and step index rows) one transaction deletes, so removing a long
/// trajectory holds the writer lock for short commits only. Entries are removed key by key:
/// redb's range `retain_in` grew the state file by several times what it removed (9 MB of
/// entries left a 38 MB file; see the store's tests).
pub(crate) const CLEAR_BATCH: usize = 256;

/// Deletes up to [`CLEAR_BATCH`] of a sandbox's entries and step index rows inside `tx`;
/// true when nothing of the trajectory is left. Adds to `unreferenced` the blobs no entry
/// refers to any more: the caller unlinks them ([`BlobDir::remove`]) once `tx` committed,
/// holding [`BlobDir::lock`] from before `tx` began.
pub(crate) fn clear_some(
    tx: &WriteTransaction,
    id: &SandboxId,
    unreferenced: &mut Vec<String>,
) -> Result<bool, redb::Error> {
    let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
    let mut entries = tx.open_table(ENTRIES)?;
    let mut seqs = Vec::new();
    let mut refs: Vec<String> = Vec::new();
    for item in entries.range(range.clone())?.take(CLEAR_BATCH) {
        let (k, v) = item?;
        seqs.push(k.value().1);
        if let Ok(e) = StoredEntry::decode(v.value()) {
            refs.extend(e.blob_refs().into_iter().map(String::from));
        }
    }
    for seq in &seqs {
        entries.remove((id.as_str(), *seq))?;
    }
    let mut steps = tx.open_table(STEPS)?;
    let mut step_keys = Vec::new();
    for item in steps.range(range)?.take(CLEAR_BATCH) {
        step_keys.push(item?.0.value().1);
    }
    for step in &step_keys {
        steps.remove((id.as_str(), *step))?;
    }
    let mut blob_refs = tx.open_table(BLOB_REFS)?;
    let mut legacy = tx.open_table(BLOBS)?;
    for d in refs {
        let n = blob_refs.get(d.as_str())?.map(|g| g.value()).unwrap_or(0);
        if n <= 1 {
            blob_refs.remove(d.as_str())?;
            legacy.remove(d.as_str())?;
            unreferenced.push(d);
        } else {
            blob_refs.insert(d.as_str(), n - 1)?;
        }
    }
    Ok(seqs.len() < CLEAR_BATCH && step_keys.len() < CLEAR_BATCH)
}

/// Every digest referred to, for the sweep of the blob directory at open.
fn referenced(db: &Database) -> Result<HashSet<String>, redb::Error> {
    let tx = db.begin_read()?;
    let t = tx.open_table(BLOB_REFS)?;
    let mut out = HashSet::new();
    for item in t.iter()? {
        out.insert(item?.0.value().to_string());
    }
    Ok(out)
}

fn write_group(db: &Database, files: &BlobDir, group: &[Job]) -> Result<(), redb::Error> {
    // New output is written to its file before the transaction that refers to it commits.
    let _files = files.lock();
    let tx = db.begin_write()?;
    {
        let mut entries = tx.open_table(ENTRIES)?;
        let mut steps = tx.open_table(STEPS)?;
        let mut blob_refs = tx.open_table(BLOB_REFS)?;
        for a in group.iter().filter_map(|j| j.append.as_ref()) {
            let id = a.sandbox.as_str();
            entries.insert((id, a.seq), a.entry.as_slice())?;
            if let Some((step, digest)) = &a.step {
                steps.insert((id, *step), step_value(a.seq, digest).as_slice())?;
            }
            for (d, bytes) in &a.blobs {
                let n = blob_refs.get(d.as_str())?.map(|g| g.value()).unwrap_or(0);
                if n == 0 {
                    // The append fails as a whole, saying which file could not be written.
                    files
                        .write(d, bytes)
                        .map_err(|e| redb::Error::Io(std::io::Error::other(e.to_string())))?;
                }
                blob_refs.insert(d.as_str(), n + 1)?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

fn writer(db: Arc<Database>, files: Arc<BlobDir>, path: PathBuf, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        let result = write_group(&db, &files, &group)
            .map_err(|e| format!("append ({}): {e}", path.display()));
        if let Err(e) = &result {
            tracing::warn!(error = %e, entries = group.len(), "trajectory append failed");
        }
        for job in group {
            let _ = job.done.send(result.clone());
        }
    }
}

impl Journal {
    /// Starts the writer over `db` (the tables must exist), with the output blobs in
    /// `blob_dir`, from which files no entry refers to are removed first.
    pub(crate) fn start(
        db: Arc<Database>,
        path: PathBuf,
        blob_dir: PathBuf,
    ) -> Result<Journal, StoreError> {
        let keep = referenced(&db).map_err(|e| db_err(&path, "read blob references", e))?;
        let blobs = Arc::new(BlobDir::open(blob_dir, |d| keep.contains(d))?);
        let (tx, rx) = mpsc::channel();
        let (wdb, wfiles, wpath) = (db.clone(), blobs.clone(), path.clone());
        let writer = std::thread::Builder::new()
            .name("trajectory-writer".into())
            .spawn(move || writer(wdb, wfiles, wpath, rx))
            .expect("spawn the trajectory writer thread");
        Ok(Journal {
            db,
            path,
            blobs,
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The output blob files.
    pub(crate) fn blob_dir(&self) -> &BlobDir {
        &self.blobs
    }

    fn gone(&self) -> StoreError {
        StoreError::Append {
            path: self.path.clone(),
            message: "the trajectory writer stopped".into(),
        }
    }

    /// Queues an append; the receiver answers once it is committed. Queue order is commit
    /// order, so a caller that queues under a lock keeps its entries in sequence.
    pub fn queue(
        &self,
        append: Append,
    ) -> Result<oneshot::Receiver<Result<(), String>>, StoreError> {
        let (done, rx) = oneshot::channel();
        let jobs = self.jobs.lock().expect("journal lock");
        jobs.as_ref()
            .ok_or_else(|| self.gone())?
            .send(Job {
                append: Some(append),
                done,
            })
            .map_err(|_| self.gone())?;
        Ok(rx)
    }

    /// Waits until every append queued before this call is committed.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        let (done, rx) = oneshot::channel();
        {
            let jobs = self.jobs.lock().expect("journal lock");
            jobs.as_ref()
                .ok_or_else(|| self.gone())?
                .send(Job { append: None, done })
                .map_err(|_| self.gone())?;
        }
        self.committed(rx).await
    }

    /// Waits for a queued append to be committed.
    pub async fn committed(
        &self,
        rx: oneshot::Receiver<Result<(), String>>,
    ) -> Result<(), StoreError> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(StoreError::Append {
                path: self.path.clone(),
                message,
            }),
            Err(_) => Err(self.gone()),
        }
    }

    /// Bytes of the node's state on disk: the state file and the output blob files.
    pub fn state_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len()) + self.blobs.bytes()
    }

    /// A consistent view for reads.
    pub fn read(&self) -> Result<Reader<'_>, StoreError> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| db_err(&self.path, "read trajectory", e))?;
        Ok(Reader {
            tx,
            path: &self.path,
            files: &self.blobs,
        })
    }
}

/// Reads of one read transaction.
pub struct Reader<'a> {
    tx: redb::ReadTransaction,
    path: &'a Path,
    files: &'a BlobDir,
}

impl Reader<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_err(self.path, "read trajectory", e)
    }

    /// The last sequence number used by `id` (0 when none), and its highest logged step.
    pub fn tail(&self, id: &SandboxId) -> Result<(u64, Option<u64>), StoreError> {
        let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
        let entries = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let seq = match entries
            .range(range.clone())
            .map_err(|e| self.err(e))?
            .next_back()
        {
            Some(item) => item.map_err(|e| self.err(e))?.0.value().1,
            None => 0,
        };
        let steps = self.tx.open_table(STEPS).map_err(|e| self.err(e))?;
        let step = match steps.range(range).map_err(|e| self.err(e))?.next_back() {
            Some(item) => Some(item.map_err(|e| self.err(e))?.0.value().1),
            None => None,
        };
        Ok((seq, step))
    }

    /// Bytes `id`'s log holds against its budget (see [`StoredEntry::budget_bytes`]).
    pub fn stored_bytes(&self, id: &SandboxId) -> Result<u64, StoreError> {
        let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
        let t = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let mut total = 0;
        for item in t.range(range).map_err(|e| self.err(e))? {
            let (_, v) = item.map_err(|e| self.err(e))?;
            let v = v.value();
            total += match StoredEntry::decode(v) {
                Ok(e) => e.budget_bytes(v.len()),
                Err(_) => v.len() as u64,
            };
        }
        Ok(total)
    }

    /// The seq and request digest logged for `step`.
    pub fn step(&self, id: &SandboxId, step: u64) -> Result<Option<(u64, Digest)>, StoreError> {
        let steps = self.tx.open_table(STEPS).map_err(|e| self.err(e))?;
        let v = steps.get((id.as_str(), step)).map_err(|e| self.err(e))?;
        Ok(v.and_then(|g| parse_step_value(g.value())))
    }

    /// Up to `limit` entries from `from_seq` on, with the blobs they refer to.
    pub fn entries(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
    ) -> Result<(Vec<StoredEntry>, Blobs), StoreError> {
        let (entries, blobs, _) = self.entries_within(id, from_seq, limit, u64::MAX)?;
        Ok((entries, blobs))
    }

    /// Like [`Reader::entries`], but stops once the entries and their output take `max_bytes`
    /// (at least one entry is returned), so a page's memory does not grow with the log. The
    /// flag is true when the page stopped at a bound (more entries may follow).
    pub fn entries_within(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
        max_bytes: u64,
    ) -> Result<(Vec<StoredEntry>, Blobs, bool), StoreError> {
        let t = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let range = (id.as_str(), from_seq)..=(id.as_str(), u64::MAX);
        for item in t.range(range).map_err(|e| self.err(e))?.take(limit) {
            if bytes >= max_bytes {
                break;
            }
            let (k, v) = item.map_err(|e| self.err(e))?;
            match StoredEntry::decode(v.value()) {
                Ok(e) => {
                    bytes += e.budget_bytes(v.value().len());
                    out.push(e)
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, seq = k.value().1, error = %e, "unreadable trajectory entry skipped")
                }
            }
        }
        let blobs = self.blobs(&out)?;
        let more = out.len() == limit || bytes >= max_bytes;
        Ok((out, blobs, more))
    }

    /// One entry and the blobs it refers to.
    pub fn entry(
        &self,
        id: &SandboxId,
        seq: u64,
    ) -> Result<Option<(StoredEntry, Blobs)>, StoreError> {
        let (mut v, blobs) = self.entries(id, seq, 1)?;
        Ok(match v.pop() {
            Some(e) if e.seq == seq => Some((e, blobs)),
            _ => None,
        })
    }

    fn blobs(&self, entries: &[StoredEntry]) -> Result<Blobs, StoreError> {
        let mut out = Blobs::new();
        let wanted: Vec<&str> = entries.iter().flat_map(|e| e.blob_refs()).collect();
        if wanted.is_empty() {
            return Ok(out);
        }
        let legacy = self.tx.open_table(BLOBS).map_err(|e| self.err(e))?;
        for d in wanted {
            if let Some(b) = self.files.read(d)? {
                out.insert(d.to_string(), b);
            } else if let Some(b) = legacy.get(d).map_err(|e| self.err(e))? {
                out.insert(d.to_string(), bytes::Bytes::copy_from_slice(b.value()));
            }
        }
        Ok(out)
    }

    /// How many distinct outputs are stored as blobs (for tests and metrics).
    pub fn blob_count(&self) -> Result<u64, StoreError> {
        let t = self.tx.open_table(BLOB_REFS).map_err(|e| self.err(e))?;
        t.len().map_err(|e| self.err(e))
    }
}

#[cfg(test)]
mod bench {
    use super::*;

    /// How long one append waits for its commit, alone (no group to share the fsync with):
    /// `cargo test -p warren-node --release -- --ignored append_latency --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, not a check: run by hand with --ignored"]
    async fn append_latency() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let store = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let id: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
        let log = crate::trajectory::SandboxLog::empty(&id);
        let mut ts = Vec::new();
        for i in 0..2000u64 {
            let e = StoredEntry::new(
                warren_types::TrajectoryCall::Kill { pid: 1, signal: 9 },
                None,
                i,
            );
            let t = std::time::Instant::now();
            log.append(store.journal(), e, None, Vec::new())
                .await
                .unwrap();
            ts.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ts.sort_by(f64::total_cmp);
        println!(
            "append p50 {:.3} ms p90 {:.3} ms p99 {:.3} ms",
            ts[1000], ts[1800], ts[1980]
        );
    }
}
