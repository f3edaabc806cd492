//! Trajectory tables in the node's redb file, and the writer that appends to them.
//!
//! - `trajectory`: (sandbox id, seq) → [`StoredEntry`] as JSON;
//! - `trajectory_steps`: (sandbox id, step) → seq (8 bytes, big-endian) and request digest
//!   (32 bytes): the index a retried step is looked up in;
//! - `blobs`: sha256 (hex) → bytes, and `blob_refs`: sha256 → how many entries refer to it.
//!
//! Appends go to one writer thread, which commits everything waiting in one transaction (one
//! fsync for the group) and then answers each append. An append's answer therefore means its
//! entry is on disk. Reads open their own read transaction and never wait for the writer.

// redb's own error type is large; it is boxed before it leaves this module.
#![allow(clippy::result_large_err)]

use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;
use warren_types::SandboxId;

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

/// Deletes a sandbox's trajectory inside `tx`, dropping blobs no other entry refers to.
pub(crate) fn clear_in(tx: &WriteTransaction, id: &SandboxId) -> Result<(), redb::Error> {
    let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
    let mut entries = tx.open_table(ENTRIES)?;
    let mut refs: Vec<String> = Vec::new();
    for item in entries.range(range.clone())? {
        let (_, v) = item?;
        if let Ok(e) = serde_json::from_slice::<StoredEntry>(v.value()) {
            refs.extend(e.blob_refs().into_iter().map(String::from));
        }
    }
    entries.retain_in(range.clone(), |_, _| false)?;
    tx.open_table(STEPS)?.retain_in(range, |_, _| false)?;
    let mut blob_refs = tx.open_table(BLOB_REFS)?;
    let mut blobs = tx.open_table(BLOBS)?;
    for d in refs {
        let n = blob_refs.get(d.as_str())?.map(|g| g.value()).unwrap_or(0);
        if n <= 1 {
            blob_refs.remove(d.as_str())?;
            blobs.remove(d.as_str())?;
        } else {
            blob_refs.insert(d.as_str(), n - 1)?;
        }
    }
    Ok(())
}

fn write_group(db: &Database, group: &[Job]) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    {
        let mut entries = tx.open_table(ENTRIES)?;
        let mut steps = tx.open_table(STEPS)?;
        let mut blobs = tx.open_table(BLOBS)?;
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
                    blobs.insert(d.as_str(), bytes.as_ref())?;
                }
                blob_refs.insert(d.as_str(), n + 1)?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}

fn writer(db: Arc<Database>, path: PathBuf, jobs: mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        let result =
            write_group(&db, &group).map_err(|e| format!("append ({}): {e}", path.display()));
        if let Err(e) = &result {
            tracing::warn!(error = %e, entries = group.len(), "trajectory append failed");
        }
        for job in group {
            let _ = job.done.send(result.clone());
        }
    }
}

impl Journal {
    /// Starts the writer over `db`; the tables must exist.
    pub(crate) fn start(db: Arc<Database>, path: PathBuf) -> Journal {
        let (tx, rx) = mpsc::channel();
        let (wdb, wpath) = (db.clone(), path.clone());
        let writer = std::thread::Builder::new()
            .name("trajectory-writer".into())
            .spawn(move || writer(wdb, wpath, rx))
            .expect("spawn the trajectory writer thread");
        Journal {
            db,
            path,
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        }
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

    /// A consistent view for reads.
    pub fn read(&self) -> Result<Reader<'_>, StoreError> {
        let tx = self
            .db
            .begin_read()
            .map_err(|e| db_err(&self.path, "read trajectory", e))?;
        Ok(Reader {
            tx,
            path: &self.path,
        })
    }
}

/// Reads of one read transaction.
pub struct Reader<'a> {
    tx: redb::ReadTransaction,
    path: &'a Path,
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
        let t = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        let range = (id.as_str(), from_seq)..=(id.as_str(), u64::MAX);
        for item in t.range(range).map_err(|e| self.err(e))?.take(limit) {
            let (k, v) = item.map_err(|e| self.err(e))?;
            match serde_json::from_slice::<StoredEntry>(v.value()) {
                Ok(e) => out.push(e),
                Err(e) => {
                    tracing::warn!(sandbox = %id, seq = k.value().1, error = %e, "unreadable trajectory entry skipped")
                }
            }
        }
        let blobs = self.blobs(&out)?;
        Ok((out, blobs))
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
        let t = self.tx.open_table(BLOBS).map_err(|e| self.err(e))?;
        for d in wanted {
            if let Some(b) = t.get(d).map_err(|e| self.err(e))? {
                out.insert(d.to_string(), bytes::Bytes::copy_from_slice(b.value()));
            }
        }
        Ok(out)
    }

    /// How many blobs are stored (for tests and metrics).
    pub fn blob_count(&self) -> Result<u64, StoreError> {
        let t = self.tx.open_table(BLOBS).map_err(|e| self.err(e))?;
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
