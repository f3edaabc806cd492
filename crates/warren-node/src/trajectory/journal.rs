//! Trajectory tables in the node's redb file, and the writer that appends to them.
//!
//! - `trajectory_logs`: sandbox id → (committed length, last seq) of its log file, where its
//!   entries are ([`super::logs`]); the length is what makes an entry committed;
//! - `trajectory`: (sandbox id, seq) → [`StoredEntry`], where older nodes kept entries: still
//!   read (before the log file's entries) and emptied with the sandbox, never written;
//! - `trajectory_steps`: (sandbox id, step) → seq (8 bytes, big-endian) and request digest
//!   (32 bytes): the index a retried step is looked up in;
//! - `blob_refs`: sha256 (hex) → how many entries refer to that output, whose bytes are a
//!   file of the [`BlobDir`] beside the state file; `blobs` (sha256 → bytes) is where older
//!   nodes kept them, still read and emptied, never written.
//!
//! Appends go to one writer thread, which writes everything waiting to the log files, syncs
//! them (in parallel when the group spans several sandboxes), commits their new lengths in
//! one transaction, and then answers each append. An append's answer therefore means its
//! entry is on disk. Reads open their own read transaction and never wait for the writer.
//!
//! One sync per group: the transaction is committed without a sync of its own (redb's
//! `Durability::None`), and made durable at least every [`DURABLE_EVERY`], with a group that
//! starts a log, and when the writer stops. A crash in between loses index rows, never
//! entries: at open, [`recover`] reads each log past its indexed length and indexes the whole
//! records it finds there (the log's framing and per-record checksums tell where they end).

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
use super::logs::{self, LogDir};
use super::{Blob, Blobs, Digest, StoredEntry};
use crate::error::{AppendFailure, JournalError, StoreError};

const ENTRIES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("trajectory");
const STEPS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("trajectory_steps");
const BLOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("blobs");
const BLOB_REFS: TableDefinition<&str, u64> = TableDefinition::new("blob_refs");
const LOGS: TableDefinition<&str, (u64, u64)> = TableDefinition::new("trajectory_logs");

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
    /// `None` (and no `start`): a barrier, answered once everything queued before it is
    /// committed.
    append: Option<Append>,
    /// A log to make ahead of its first entry ([`Journal::start_log`]).
    start: Option<SandboxId>,
    done: oneshot::Sender<Result<(), AppendFailure>>,
}

/// Answers once a queued job is committed, or why it was not (see [`Journal::committed`]).
pub type Commit = oneshot::Receiver<Result<(), AppendFailure>>;

/// The trajectory side of the state file.
pub struct Journal {
    db: Arc<Database>,
    path: PathBuf,
    blobs: Arc<BlobDir>,
    logs: Arc<LogDir>,
    /// Groups committed so far (each one write, one sync per log file, one transaction).
    groups: Arc<std::sync::atomic::AtomicU64>,
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

/// A step row: the entry's seq, its request digest, and where its record starts in the log
/// file (`u64::MAX`: an entry kept as a row of its own). Rows of 40 bytes (from before the
/// offset was kept) read as having none: such a step is found by scanning its log.
fn step_value(seq: u64, digest: &Digest, at: Option<u64>) -> [u8; 48] {
    let mut v = [0u8; 48];
    v[..8].copy_from_slice(&seq.to_be_bytes());
    v[8..40].copy_from_slice(digest);
    v[40..].copy_from_slice(&at.unwrap_or(u64::MAX).to_be_bytes());
    v
}

/// A logged step: the seq of its entry, its request digest and where its record starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoggedStep {
    pub seq: u64,
    pub digest: Digest,
    pub at: Option<u64>,
}

fn parse_step_value(v: &[u8]) -> Option<LoggedStep> {
    if v.len() != 40 && v.len() != 48 {
        return None;
    }
    let seq = u64::from_be_bytes(v[..8].try_into().ok()?);
    let digest: Digest = v[8..40].try_into().ok()?;
    let at = match v.get(40..48) {
        Some(b) => Some(u64::from_be_bytes(b.try_into().ok()?)).filter(|&a| a != u64::MAX),
        None => None,
    };
    Some(LoggedStep { seq, digest, at })
}

/// Creates the tables (so readers never meet a missing table).
pub(crate) fn create_tables(tx: &WriteTransaction) -> Result<(), redb::Error> {
    tx.open_table(ENTRIES)?;
    tx.open_table(STEPS)?;
    tx.open_table(BLOBS)?;
    tx.open_table(BLOB_REFS)?;
    tx.open_table(LOGS)?;
    Ok(())
}

/// What a removal dropped, to unlink once its transaction committed: output blobs no entry
/// refers to any more, and log files (by sandbox id).
#[derive(Debug, Default)]
pub(crate) struct Gone {
    pub blobs: Vec<String>,
    pub logs: Vec<String>,
}

/// A log file step that failed.
fn log_err(what: &'static str) -> impl Fn(std::io::Error) -> JournalError {
    move |source| JournalError::Log { what, source }
}

/// Most entries (and step index rows) one transaction deletes, so removing a long
/// trajectory holds the writer lock for short commits only. Entries are removed key by key:
/// redb's range `retain_in` grew the state file by several times what it removed (9 MB of
/// entries left a 38 MB file; see the store's tests).
pub(crate) const CLEAR_BATCH: usize = 256;

/// Deletes a sandbox's log (its committed length: the file goes once `tx` committed) and up
/// to [`CLEAR_BATCH`] of its older entries and step index rows inside `tx`; true when nothing
/// of the trajectory is left. Adds to `gone` what the caller unlinks ([`Journal::unlink`])
/// once `tx` committed, holding [`BlobDir::lock`] from before `tx` began.
pub(crate) fn clear_some(
    tx: &WriteTransaction,
    logs: &LogDir,
    id: &SandboxId,
    gone: &mut Gone,
) -> Result<bool, JournalError> {
    let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
    let mut refs: Vec<String> = Vec::new();
    let mut lens = tx.open_table(LOGS)?;
    let committed = lens.get(id.as_str())?.map(|g| g.value());
    if let Some((len, _)) = committed {
        // Every entry's blob references go in this one transaction (a sandbox's blobs are
        // bounded by its budget), with the length that makes its entries exist.
        let mut records = logs.reader(id.as_str(), len)?;
        while let Some(r) = records.next_from(0)? {
            if let Ok(e) = StoredEntry::decode(&r.payload) {
                refs.extend(e.blob_refs().into_iter().map(String::from));
            }
        }
        lens.remove(id.as_str())?;
        gone.logs.push(id.to_string());
    }
    let mut entries = tx.open_table(ENTRIES)?;
    let mut seqs = Vec::new();
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
            gone.blobs.push(d);
        } else {
            blob_refs.insert(d.as_str(), n - 1)?;
        }
    }
    Ok(seqs.len() < CLEAR_BATCH && step_keys.len() < CLEAR_BATCH)
}

/// Every log's committed length, for the cut at open.
fn committed_logs(db: &Database) -> Result<std::collections::HashMap<String, u64>, redb::Error> {
    let tx = db.begin_read()?;
    let t = tx.open_table(LOGS)?;
    let mut out = std::collections::HashMap::new();
    for item in t.iter()? {
        let (k, v) = item?;
        out.insert(k.value().to_string(), v.value().0);
    }
    Ok(out)
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

/// Syncs the data of `files`, side by side when there are several (each sandbox's log is a
/// file of its own; one waits for the slowest, not for the sum).
fn sync_files(files: &[std::fs::File]) -> std::io::Result<()> {
    const MAX_THREADS: usize = 8;
    if files.len() <= 1 {
        return files.iter().try_for_each(|f| f.sync_data());
    }
    let per = files.len().div_ceil(MAX_THREADS);
    std::thread::scope(|s| {
        let running: Vec<_> = files
            .chunks(per)
            .map(|c| s.spawn(move || c.iter().try_for_each(|f| f.sync_data())))
            .collect();
        running.into_iter().try_for_each(|t| {
            t.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("sync thread panicked")))
        })
    })
}

/// Longest a group's index commit stays volatile: the writer commits durably once this long
/// after the first volatile commit, or once it has been idle this long.
const DURABLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Most volatile commits in a row: redb frees the pages a commit replaced only at a durable
/// commit, so the state file grows with their number (in `entries_past_the_budget_cost_about_
/// their_size`: 16 KiB per entry with no limit, 716 bytes with 32, under 250 with 8).
const MAX_VOLATILE: u32 = 8;

/// Writes a group: the new output files, each sandbox's records at its log's indexed length,
/// one sync of the log files, then one transaction with the new lengths, step rows and blob
/// references. That transaction is durable only when `durable` or when the group starts a
/// log (so a log file always has its index row once an append to it answered); else it is
/// volatile, and [`recover`] rebuilds what a crash took of it from the synced records.
/// Returns whether the commit was volatile.
fn write_group(
    db: &Database,
    files: &BlobDir,
    logs: &LogDir,
    group: &[Job],
    durable: bool,
) -> Result<bool, JournalError> {
    // New output and records are on disk before the transaction that refers to them commits,
    // output first: a record recovered after a crash finds its output.
    let _files = files.lock();
    let mut tx = db.begin_write()?;
    let mut created = false;
    {
        let mut blob_refs = tx.open_table(BLOB_REFS)?;
        for a in group.iter().filter_map(|j| j.append.as_ref()) {
            for (d, bytes) in &a.blobs {
                let n = blob_refs.get(d.as_str())?.map(|g| g.value()).unwrap_or(0);
                if n == 0 {
                    // The append fails as a whole, saying which file could not be written.
                    files.write(d, bytes)?;
                }
                blob_refs.insert(d.as_str(), n + 1)?;
            }
        }
        let mut lens = tx.open_table(LOGS)?;
        let mut written = Vec::with_capacity(group.len());
        // Logs started ahead of their first entry: the file, grown, and its row.
        for id in group.iter().filter_map(|j| j.start.as_ref()) {
            if lens.get(id.as_str())?.is_none() {
                written.push(logs.start(id.as_str()).map_err(log_err("create"))?);
                lens.insert(id.as_str(), (0, 0))?;
                created = true;
            }
        }
        // Each sandbox's records in queue (= seq) order, and its last seq; for each append,
        // its sandbox's place in `per` and where its record starts in that batch.
        let mut per: Vec<(&str, Vec<u8>, u64)> = Vec::new();
        let mut placed: Vec<(usize, u64)> = Vec::with_capacity(group.len());
        for a in group.iter().filter_map(|j| j.append.as_ref()) {
            let id = a.sandbox.as_str();
            let i = match per.iter().position(|p| p.0 == id) {
                Some(i) => i,
                None => {
                    per.push((id, Vec::with_capacity(256), 0));
                    per.len() - 1
                }
            };
            placed.push((i, per[i].1.len() as u64));
            logs::frame(a.seq, &a.entry, &mut per[i].1);
            per[i].2 = a.seq;
        }
        let mut starts = Vec::with_capacity(per.len());
        for (id, records, last) in &per {
            let row = lens.get(*id)?.map(|g| g.value());
            // A log with a row (even of length 0: started ahead) has its file and directory
            // entry on disk already.
            created |= row.is_none();
            let (len, _) = row.unwrap_or((0, 0));
            written.push(logs.write_at(id, len, records).map_err(log_err("write"))?);
            lens.insert(*id, (len + records.len() as u64, *last))?;
            starts.push(len);
        }
        sync_files(&written).map_err(log_err("sync"))?;
        if created {
            logs.sync_dir().map_err(log_err("sync the directory"))?;
        }
        let mut steps = tx.open_table(STEPS)?;
        let appends = group.iter().filter_map(|j| j.append.as_ref());
        for (a, &(i, off)) in appends.zip(&placed) {
            if let Some((step, digest)) = &a.step {
                let at = starts[i] + off;
                steps.insert(
                    (a.sandbox.as_str(), *step),
                    step_value(a.seq, digest, Some(at)).as_slice(),
                )?;
            }
        }
    }
    let volatile = !(durable || created);
    if volatile {
        tx.set_durability(redb::Durability::None);
    }
    tx.commit()?;
    Ok(volatile)
}

/// Makes every volatile commit before it durable (an empty transaction committed durably).
fn commit_durably(db: &Database) -> Result<(), redb::Error> {
    db.begin_write()?.commit()?;
    Ok(())
}

fn writer(
    db: Arc<Database>,
    files: Arc<BlobDir>,
    logs: Arc<LogDir>,
    path: PathBuf,
    jobs: mpsc::Receiver<Job>,
    groups: Arc<std::sync::atomic::AtomicU64>,
) {
    // Since when the index has volatile commits, and how many.
    let mut volatile_since: Option<std::time::Instant> = None;
    let mut volatile = 0u32;
    let durably = |volatile_since: &mut Option<std::time::Instant>, volatile: &mut u32| {
        if volatile_since.is_some() {
            match commit_durably(&db) {
                Ok(()) => {
                    *volatile_since = None;
                    *volatile = 0;
                }
                Err(e) => tracing::warn!(error = %e, "trajectory index not committed durably"),
            }
        }
    };
    loop {
        let first = match jobs.recv_timeout(DURABLE_EVERY) {
            Ok(j) => j,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                durably(&mut volatile_since, &mut volatile);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match jobs.try_recv() {
                Ok(j) => group.push(j),
                Err(_) => break,
            }
        }
        let result = write_group(&db, &files, &logs, &group, false)
            .map_err(|e| AppendFailure::Commit(Arc::new(e)));
        groups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match &result {
            Ok(true) => {
                volatile_since.get_or_insert_with(std::time::Instant::now);
                volatile += 1;
            }
            Ok(false) => {
                volatile_since = None;
                volatile = 0;
            }
            Err(e) => {
                let kind = match e {
                    AppendFailure::Commit(cause) => cause.kind(),
                    AppendFailure::Stopped => "stopped",
                };
                tracing::warn!(path = %path.display(), error = %e, kind, entries = group.len(), "trajectory append failed")
            }
        }
        for job in group {
            let _ = job.done.send(result.clone().map(|_| ()));
        }
        // After the answers: the extra sync delays the next group at most.
        if volatile >= MAX_VOLATILE || volatile_since.is_some_and(|t| t.elapsed() >= DURABLE_EVERY)
        {
            durably(&mut volatile_since, &mut volatile);
        }
    }
    // Stopping: what the index holds becomes durable, so the next start has nothing to scan.
    durably(&mut volatile_since, &mut volatile);
}

/// Indexes the records a crash left past each log's indexed length (see [`LogDir::tail`]):
/// their lengths, step rows and output references, in one durable transaction. Every such
/// record was synced before its append answered (its group's index commit was volatile); a
/// record of a group that never answered may be among them, which is harmless: its step is
/// then answered from the log when retried. Returns how many records were indexed.
fn recover(db: &Database, logs: &LogDir) -> Result<usize, JournalError> {
    let tx = db.begin_write()?;
    let mut n = 0;
    {
        let mut lens = tx.open_table(LOGS)?;
        let mut steps = tx.open_table(STEPS)?;
        let mut blob_refs = tx.open_table(BLOB_REFS)?;
        let indexed: Vec<(String, (u64, u64))> = lens
            .iter()?
            .map(|item| item.map(|(k, v)| (k.value().to_string(), v.value())))
            .collect::<Result<_, _>>()?;
        for (id, (len, last)) in indexed {
            let tail = logs.tail(&id, len, last)?;
            if tail.records.is_empty() {
                continue;
            }
            for r in &tail.records {
                let Ok(e) = StoredEntry::decode(&r.payload) else {
                    tracing::warn!(sandbox = %id, seq = r.seq, "unreadable trajectory entry recovered");
                    continue;
                };
                if let Some(step) = e.step {
                    let digest = hex::decode(&e.request_sha256)
                        .ok()
                        .and_then(|d| Digest::try_from(d).ok())
                        .unwrap_or_else(|| super::request_digest(&e.call));
                    let row = step_value(r.seq, &digest, Some(r.at));
                    steps.insert((id.as_str(), step), row.as_slice())?;
                }
                for d in e.blob_refs() {
                    let c = blob_refs.get(d)?.map(|g| g.value()).unwrap_or(0);
                    blob_refs.insert(d, c + 1)?;
                }
            }
            n += tail.records.len();
            tracing::info!(
                sandbox = %id,
                entries = tail.records.len(),
                last_seq = tail.last_seq,
                "trajectory entries past the index recovered"
            );
            lens.insert(id.as_str(), (tail.end, tail.last_seq))?;
        }
    }
    tx.commit()?;
    Ok(n)
}

impl Journal {
    /// Starts the writer over `db` (the tables must exist), with the output blobs in
    /// `blob_dir`, from which files no entry refers to are removed first, and the log files
    /// in `log_dir`, each cut back to its committed length.
    pub(crate) fn start(
        db: Arc<Database>,
        path: PathBuf,
        blob_dir: PathBuf,
        log_dir: PathBuf,
    ) -> Result<Journal, StoreError> {
        // The tails first: output files their records refer to are kept by the sweep.
        let logs = LogDir::open_unchecked(log_dir)?;
        recover(&db, &logs).map_err(|e| e.into_store("recover log tails", &path))?;
        let lens = committed_logs(&db).map_err(|e| db_err(&path, "read log lengths", e))?;
        let logs = Arc::new(logs.cut(&lens)?);
        let keep = referenced(&db).map_err(|e| db_err(&path, "read blob references", e))?;
        let blobs = Arc::new(BlobDir::open(blob_dir, |d| keep.contains(d))?);
        let (tx, rx) = mpsc::channel();
        let (wdb, wfiles, wlogs, wpath) = (db.clone(), blobs.clone(), logs.clone(), path.clone());
        let groups = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let wgroups = groups.clone();
        let writer = std::thread::Builder::new()
            .name("trajectory-writer".into())
            .spawn(move || writer(wdb, wfiles, wlogs, wpath, rx, wgroups))
            .expect("spawn the trajectory writer thread");
        Ok(Journal {
            db,
            path,
            blobs,
            logs,
            groups,
            jobs: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// How many groups the writer committed (appends and barriers share them).
    pub fn groups(&self) -> u64 {
        self.groups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The output blob files.
    pub(crate) fn blob_dir(&self) -> &BlobDir {
        &self.blobs
    }

    /// The log files.
    pub(crate) fn log_dir(&self) -> &LogDir {
        &self.logs
    }

    /// Unlinks what a committed removal dropped (see [`clear_some`]).
    pub(crate) fn unlink(&self, gone: &Gone) {
        self.blobs.remove(&gone.blobs);
        for id in &gone.logs {
            self.logs.remove(id);
        }
    }

    fn gone(&self) -> StoreError {
        StoreError::Append {
            path: self.path.clone(),
            cause: AppendFailure::Stopped,
        }
    }

    /// Hands a job to the writer; the receiver answers once it is committed.
    fn send(&self, append: Option<Append>, start: Option<SandboxId>) -> Result<Commit, StoreError> {
        let (done, rx) = oneshot::channel();
        let jobs = self.jobs.lock().expect("journal lock");
        jobs.as_ref()
            .ok_or_else(|| self.gone())?
            .send(Job {
                append,
                start,
                done,
            })
            .map_err(|_| self.gone())?;
        Ok(rx)
    }

    /// Queues an append; the receiver answers once it is committed. Queue order is commit
    /// order, so a caller that queues under a lock keeps its entries in sequence.
    pub fn queue(&self, append: Append) -> Result<Commit, StoreError> {
        self.send(Some(append), None)
    }

    /// Makes `id`'s log ahead of its first entry (a new sandbox's, while it starts): the file,
    /// grown and synced, its directory entry and its index row, committed durably. The first
    /// append is then an ordinary one (one sync of the data) instead of paying for all of
    /// that. The receiver answers once done; a log that exists already is left as it is.
    pub fn start_log(&self, id: &SandboxId) -> Result<Commit, StoreError> {
        self.send(None, Some(id.clone()))
    }

    /// Waits until every append queued before this call is committed.
    pub async fn barrier(&self) -> Result<(), StoreError> {
        let rx = self.send(None, None)?;
        self.committed(rx).await
    }

    /// Waits for a queued append to be committed.
    pub async fn committed(&self, rx: Commit) -> Result<(), StoreError> {
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(cause)) => Err(StoreError::Append {
                path: self.path.clone(),
                cause,
            }),
            Err(_) => Err(self.gone()),
        }
    }

    /// The file of output blob `digest`, open for reading, if it is a file (older nodes kept
    /// blobs in the state file: [`Reader::blob`]).
    pub fn open_blob(&self, digest: &str) -> Result<Option<std::fs::File>, StoreError> {
        self.blobs.open_file(digest)
    }

    /// Bytes of the node's state on disk: the state file, the log files and the output blob
    /// files.
    pub fn state_bytes(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
            + self.logs.bytes()
            + self.blobs.bytes()
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
            logs: &self.logs,
        })
    }
}

/// Reads of one read transaction.
pub struct Reader<'a> {
    tx: redb::ReadTransaction,
    path: &'a Path,
    files: &'a BlobDir,
    logs: &'a LogDir,
}

impl Reader<'_> {
    fn err(&self, e: impl Into<redb::Error>) -> StoreError {
        db_err(self.path, "read trajectory", e)
    }

    /// The last sequence number used by `id` (0 when none), and its highest logged step.
    pub fn tail(&self, id: &SandboxId) -> Result<(u64, Option<u64>), StoreError> {
        let range = (id.as_str(), 0u64)..=(id.as_str(), u64::MAX);
        let entries = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let older = match entries
            .range(range.clone())
            .map_err(|e| self.err(e))?
            .next_back()
        {
            Some(item) => item.map_err(|e| self.err(e))?.0.value().1,
            None => 0,
        };
        let seq = older.max(self.log(id)?.map_or(0, |(_, last)| last));
        let steps = self.tx.open_table(STEPS).map_err(|e| self.err(e))?;
        let step = match steps.range(range).map_err(|e| self.err(e))?.next_back() {
            Some(item) => Some(item.map_err(|e| self.err(e))?.0.value().1),
            None => None,
        };
        Ok((seq, step))
    }

    /// Every log file: sandbox id, committed length and last seq (what the shipper follows).
    pub fn logs(&self) -> Result<Vec<(SandboxId, u64, u64)>, StoreError> {
        let t = self.tx.open_table(LOGS).map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for item in t.iter().map_err(|e| self.err(e))? {
            let (k, v) = item.map_err(|e| self.err(e))?;
            if let Ok(id) = k.value().parse::<SandboxId>() {
                let (len, last) = v.value();
                out.push((id, len, last));
            }
        }
        Ok(out)
    }

    /// The committed length and last seq of `id`'s log file, if it has one.
    fn log(&self, id: &SandboxId) -> Result<Option<(u64, u64)>, StoreError> {
        let t = self.tx.open_table(LOGS).map_err(|e| self.err(e))?;
        let v = t.get(id.as_str()).map_err(|e| self.err(e))?;
        Ok(v.map(|g| g.value()))
    }

    /// Calls `f` with the seq and stored bytes of `id`'s entries from `from_seq` on, older
    /// rows first, then the log file, until it returns false.
    fn each(
        &self,
        id: &SandboxId,
        from_seq: u64,
        mut f: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let t = self.tx.open_table(ENTRIES).map_err(|e| self.err(e))?;
        let range = (id.as_str(), from_seq)..=(id.as_str(), u64::MAX);
        for item in t.range(range).map_err(|e| self.err(e))? {
            let (k, v) = item.map_err(|e| self.err(e))?;
            if !f(k.value().1, v.value()) {
                return Ok(());
            }
        }
        if let Some((len, _)) = self.log(id)? {
            let mut records = self.logs.reader(id.as_str(), len)?;
            while let Some(r) = records.next_from(from_seq)? {
                if !f(r.seq, &r.payload) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Bytes `id`'s log holds against its budget (see [`StoredEntry::budget_bytes`]).
    pub fn stored_bytes(&self, id: &SandboxId) -> Result<u64, StoreError> {
        let mut total = 0;
        self.each(id, 0, |_, v| {
            total += match StoredEntry::decode(v) {
                Ok(e) => e.budget_bytes(v.len()),
                Err(_) => v.len() as u64,
            };
            true
        })?;
        Ok(total)
    }

    /// The entry logged for `step`: its seq, request digest and place in the log.
    pub fn step(&self, id: &SandboxId, step: u64) -> Result<Option<LoggedStep>, StoreError> {
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
        self.entries_loading(id, from_seq, limit, max_bytes, u64::MAX)
    }

    /// Like [`Reader::entries_within`], reading only the blobs shorter than `load_under`
    /// bytes: an export streams longer ones from their files ([`Journal::open_blob`]).
    pub fn entries_loading(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
        max_bytes: u64,
        load_under: u64,
    ) -> Result<(Vec<StoredEntry>, Blobs, bool), StoreError> {
        let mut out = Vec::new();
        let mut bytes = 0u64;
        self.each(id, from_seq, |seq, v| {
            if out.len() >= limit || bytes >= max_bytes {
                return false;
            }
            match StoredEntry::decode(v) {
                Ok(e) => {
                    bytes += e.budget_bytes(v.len());
                    out.push(e)
                }
                Err(e) => {
                    tracing::warn!(sandbox = %id, seq, error = %e, "unreadable trajectory entry skipped")
                }
            }
            true
        })?;
        let blobs = self.blobs_under(&out, load_under)?;
        let more = out.len() == limit || bytes >= max_bytes;
        Ok((out, blobs, more))
    }

    /// Like [`Reader::entries_within`], reading only the blobs of what the entries were fed
    /// (an exec's stdin, an upload's content): what revive feeds again. Outputs, which
    /// revive compares by digest only, are not read, however large.
    pub fn entries_with_inputs(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
        max_bytes: u64,
    ) -> Result<(Vec<StoredEntry>, Blobs, bool), StoreError> {
        let (entries, _, more) = self.entries_loading(id, from_seq, limit, max_bytes, 0)?;
        let wanted: Vec<&str> = entries.iter().filter_map(StoredEntry::input_ref).collect();
        let blobs = self.blobs_of(&wanted)?;
        Ok((entries, blobs, more))
    }

    /// The entry of a logged step and the blobs it refers to: read where its record starts
    /// when the step row says so (the cost does not grow with the log), else found by a scan.
    pub fn step_entry(
        &self,
        id: &SandboxId,
        step: &LoggedStep,
    ) -> Result<Option<(StoredEntry, Blobs)>, StoreError> {
        match self.entry_at(id, step)? {
            Some(found) => Ok(Some(found)),
            None => self.entry(id, step.seq),
        }
    }

    /// The entry of a logged step read where its step row says its record starts; `None`
    /// when the row does not say, or no readable record of that seq starts there.
    pub fn entry_at(
        &self,
        id: &SandboxId,
        step: &LoggedStep,
    ) -> Result<Option<(StoredEntry, Blobs)>, StoreError> {
        let (Some(at), Some((len, _))) = (step.at, self.log(id)?) else {
            return Ok(None);
        };
        let read = self.logs.read_at(id.as_str(), len, at, step.seq)?;
        let Some(e) = read.and_then(|r| StoredEntry::decode(&r.payload).ok()) else {
            return Ok(None);
        };
        let blobs = self.blobs(std::slice::from_ref(&e))?;
        Ok(Some((e, blobs)))
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
        self.blobs_under(entries, u64::MAX)
    }

    /// One blob, from its file or the legacy table.
    pub fn blob(&self, digest: &str) -> Result<Option<bytes::Bytes>, StoreError> {
        let mut b = self.blobs_of(&[digest])?;
        Ok(b.remove(digest))
    }

    /// The blobs `entries` refer to that are shorter than `max_len` bytes.
    fn blobs_under(&self, entries: &[StoredEntry], max_len: u64) -> Result<Blobs, StoreError> {
        let wanted: Vec<&str> = entries
            .iter()
            .flat_map(|e| e.blob_refs_under(max_len))
            .collect();
        self.blobs_of(&wanted)
    }

    fn blobs_of(&self, wanted: &[&str]) -> Result<Blobs, StoreError> {
        let mut out = Blobs::new();
        if wanted.is_empty() {
            return Ok(out);
        }
        let legacy = self.tx.open_table(BLOBS).map_err(|e| self.err(e))?;
        for &d in wanted {
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
mod tests;
