//! Durable node state in one `redb` file: what the manager must know after a restart to
//! re-adopt (or clean up) every sandbox it made.
//!
//! Two tables, both JSON values carrying a format version:
//! - `sandboxes`: sandbox id → [`StoredSandbox`] (the API record plus the runtime's own
//!   re-adoption record);
//! - `idempotency`: key → [`StoredKey`] (the sandbox it created and the request, so a
//!   different request reusing the key is refused).
//!
//! The same file holds the trajectory tables, written through [`Store::journal`]
//! (see [`crate::trajectory::journal`]); removing a sandbox removes its trajectory with it
//! (in batches for a long one), and the output blob files (beside the file, in [`BLOB_DIR`])
//! that no entry refers to any more right after each batch commits.
//!
//! The store is written on every state transition, never on every call (`last_activity_ms`
//! is only as fresh as the last transition; the idle clock restarts on recovery). It never
//! talks to a runtime and never decides anything: the manager does.

// redb's own error type is large; it is boxed before it leaves this module.
#![allow(clippy::result_large_err)]

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use warren_types::{CreateSandboxRequest, SandboxId, SandboxInfo};

use crate::error::JournalError;
pub use crate::error::StoreError;
use crate::trajectory::{journal, Journal};

const SANDBOXES: TableDefinition<&str, &[u8]> = TableDefinition::new("sandboxes");
const IDEMPOTENCY: TableDefinition<&str, &[u8]> = TableDefinition::new("idempotency");
/// Page cache of the state file: reads of any trajectory cost the daemon at most this.
const CACHE_BYTES: usize = 32 << 20;

/// Format version of the values this build writes.
pub const FORMAT: u32 = 1;

/// One sandbox as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredSandbox {
    pub format: u32,
    pub info: SandboxInfo,
    /// The hostname the sandbox was created with (needed to rebuild its spec).
    pub hostname: String,
    /// What [`warren_runtime::Instance::record`] returned; `None` while creating.
    pub record: Option<serde_json::Value>,
}

/// One idempotency key as persisted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredKey {
    pub format: u32,
    pub id: SandboxId,
    pub request: CreateSandboxRequest,
}

/// Everything read back at start-up.
#[derive(Debug, Default)]
pub struct Loaded {
    pub sandboxes: Vec<StoredSandbox>,
    pub keys: Vec<(String, StoredKey)>,
    /// Entries that could not be decoded (other format, corruption), with why. They are left
    /// in place for a person to look at.
    pub skipped: Vec<String>,
}

/// The directory of output blob files, beside the state file.
pub const BLOB_DIR: &str = "trajectory-blobs";

/// The directory of trajectory log files (one per sandbox), beside the state file.
pub const LOG_DIR: &str = "trajectory-logs";

/// Runs `f`, which waits for fsync: on a multi-threaded runtime the worker's other tasks
/// move to another thread meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// One write transaction on `db`: `f`, then the commit (which waits for fsync).
fn commit(
    db: &Database,
    path: &Path,
    what: &'static str,
    f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
) -> Result<(), StoreError> {
    let err = |e: redb::Error| StoreError::Db {
        what,
        path: path.to_path_buf(),
        source: Box::new(e),
    };
    let tx = db.begin_write().map_err(|e| err(e.into()))?;
    f(&tx).map_err(err)?;
    tx.commit().map_err(|e| err(e.into()))
}

/// The state file.
pub struct Store {
    db: Arc<Database>,
    path: PathBuf,
    journal: Journal,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating if needed) the state file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Dir {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        // redb caches pages in memory (1 GiB by default): bounded, so reading a large
        // trajectory costs the daemon no more than this.
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|e| StoreError::Db {
                what: "open",
                path: path.clone(),
                source: Box::new(e.into()),
            })?;
        let db = Arc::new(db);
        // Create every table so readers never meet a missing one (the journal's sweep of
        // its blob files reads one).
        commit(&db, &path, "create tables", |tx| {
            tx.open_table(SANDBOXES)?;
            tx.open_table(IDEMPOTENCY)?;
            journal::create_tables(tx)
        })?;
        let blob_dir = path.with_file_name(BLOB_DIR);
        Ok(Store {
            journal: Journal::start(
                db.clone(),
                path.clone(),
                blob_dir,
                path.with_file_name(LOG_DIR),
            )?,
            db,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The trajectory tables.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    fn db_err(&self, what: &'static str) -> impl Fn(redb::Error) -> StoreError + '_ {
        move |source| StoreError::Db {
            what,
            path: self.path.clone(),
            source: Box::new(source),
        }
    }

    fn write(
        &self,
        what: &'static str,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        blocking(|| self.write_now(what, f))
    }

    fn write_now(
        &self,
        what: &'static str,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        commit(&self.db, &self.path, what, f)
    }

    /// Writes (or replaces) a sandbox and, when given, its idempotency key, in one transaction.
    pub fn put_sandbox(
        &self,
        s: &StoredSandbox,
        key: Option<(&str, &StoredKey)>,
    ) -> Result<(), StoreError> {
        let value = serde_json::to_vec(s).map_err(|source| StoreError::Encode {
            what: "sandbox",
            source,
        })?;
        let key_value = match key {
            Some((k, v)) => Some((
                k,
                serde_json::to_vec(v).map_err(|source| StoreError::Encode {
                    what: "idempotency key",
                    source,
                })?,
            )),
            None => None,
        };
        self.write("write sandbox", |tx| {
            tx.open_table(SANDBOXES)?
                .insert(s.info.id.as_str(), value.as_slice())?;
            if let Some((k, v)) = &key_value {
                tx.open_table(IDEMPOTENCY)?.insert(*k, v.as_slice())?;
            }
            Ok(())
        })
    }

    /// Writes (or replaces) several sandboxes in one transaction.
    pub fn put_sandboxes(&self, all: &[StoredSandbox]) -> Result<(), StoreError> {
        let values = all
            .iter()
            .map(|s| {
                serde_json::to_vec(s)
                    .map(|v| (s.info.id.as_str(), v))
                    .map_err(|source| StoreError::Encode {
                        what: "sandbox",
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.write("write sandboxes", |tx| {
            let mut t = tx.open_table(SANDBOXES)?;
            for (id, v) in &values {
                t.insert(*id, v.as_slice())?;
            }
            Ok(())
        })
    }

    /// Removes several sandboxes (without idempotency keys) and their trajectories.
    pub fn remove_sandboxes(&self, ids: &[SandboxId]) -> Result<(), StoreError> {
        for id in ids {
            self.remove_sandbox(id, None)?;
        }
        Ok(())
    }

    /// Removes a sandbox, its trajectory and its idempotency key (if any). A long trajectory
    /// goes in transactions of [`journal::CLEAR_BATCH`] entries (see there), oldest first;
    /// the last one also removes the sandbox and its key, so a crash part way leaves the
    /// sandbox with the newer part of its log, to be removed again.
    pub fn remove_sandbox(&self, id: &SandboxId, key: Option<&str>) -> Result<(), StoreError> {
        loop {
            let mut last = false;
            self.removing("remove sandbox", |tx, gone| {
                last = journal::clear_some(tx, self.journal.log_dir(), id, gone)?;
                if last {
                    tx.open_table(SANDBOXES)?.remove(id.as_str())?;
                    if let Some(k) = key {
                        tx.open_table(IDEMPOTENCY)?.remove(k)?;
                    }
                }
                Ok(())
            })?;
            if last {
                return Ok(());
            }
        }
    }

    /// A write that drops trajectory entries: `f` adds the log files and the blobs no entry
    /// refers to any more, unlinked once the transaction committed (see
    /// [`crate::trajectory::blobs`] and [`crate::trajectory::logs`]).
    fn removing(
        &self,
        what: &'static str,
        f: impl FnOnce(&redb::WriteTransaction, &mut journal::Gone) -> Result<(), JournalError>,
    ) -> Result<(), StoreError> {
        let files = self.journal.blob_dir();
        blocking(|| {
            let _lock = files.lock();
            let mut gone = journal::Gone::default();
            let err = |e: JournalError| e.into_store(what, &self.path);
            let tx = self.db.begin_write().map_err(|e| err(e.into()))?;
            f(&tx, &mut gone).map_err(err)?;
            tx.commit().map_err(|e| err(e.into()))?;
            self.journal.unlink(&gone);
            Ok(())
        })
    }

    /// Reads everything back.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let err = self.db_err("read");
        let tx = self.db.begin_read().map_err(|e| err(e.into()))?;
        let mut out = Loaded::default();
        let t = tx.open_table(SANDBOXES).map_err(|e| err(e.into()))?;
        for item in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = item.map_err(|e| err(e.into()))?;
            match serde_json::from_slice::<StoredSandbox>(v.value()) {
                Ok(s) if s.format == FORMAT => out.sandboxes.push(s),
                Ok(s) => out.skipped.push(format!(
                    "sandbox {}: format {} (this build reads {FORMAT})",
                    k.value(),
                    s.format
                )),
                Err(e) => out.skipped.push(format!("sandbox {}: {e}", k.value())),
            }
        }
        let t = tx.open_table(IDEMPOTENCY).map_err(|e| err(e.into()))?;
        for item in t.iter().map_err(|e| err(e.into()))? {
            let (k, v) = item.map_err(|e| err(e.into()))?;
            match serde_json::from_slice::<StoredKey>(v.value()) {
                Ok(s) if s.format == FORMAT => out.keys.push((k.value().to_string(), s)),
                Ok(s) => out.skipped.push(format!(
                    "idempotency key {:?}: format {}",
                    k.value(),
                    s.format
                )),
                Err(e) => out
                    .skipped
                    .push(format!("idempotency key {:?}: {e}", k.value())),
            }
        }
        Ok(out)
    }
}

/// A running container sandbox of the default image, as tests record it.
#[cfg(test)]
pub(crate) fn test_info(id: &SandboxId) -> SandboxInfo {
    use warren_types::{Limits, NetworkPolicy, SandboxState, Substrate};
    SandboxInfo {
        id: id.to_string(),
        substrate: Substrate::Container,
        state: SandboxState::Running,
        image: vec!["default".into()],
        limits: Limits::default(),
        labels: Default::default(),
        env: Default::default(),
        workdir: None,
        user: None,
        network: NetworkPolicy::none(),
        created_at_ms: 1,
        expires_at_ms: None,
        idle_timeout_secs: None,
        last_activity_ms: 1,
        reason: None,
        idempotency_key: None,
        tenant: None,
        pty: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::NodeId;

    fn info(id: &SandboxId) -> SandboxInfo {
        SandboxInfo {
            idempotency_key: Some("k".into()),
            ..test_info(id)
        }
    }

    #[test]
    fn round_trip_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.redb");
        let node: NodeId = "n1".parse().unwrap();
        let id = SandboxId::generate(&node);
        let s = StoredSandbox {
            format: FORMAT,
            info: info(&id),
            hostname: "sandbox".into(),
            record: Some(serde_json::json!({"pid": 4})),
        };
        let k = StoredKey {
            format: FORMAT,
            id: id.clone(),
            request: CreateSandboxRequest::default(),
        };
        {
            let store = Store::open(&path).unwrap();
            store.put_sandbox(&s, Some(("k", &k))).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.sandboxes, vec![s]);
        assert_eq!(loaded.keys, vec![("k".to_string(), k)]);
        store.remove_sandbox(&id, Some("k")).unwrap();
        let loaded = store.load().unwrap();
        assert!(loaded.sandboxes.is_empty() && loaded.keys.is_empty());
    }

    /// Logs one exec whose stdout is `out` for `id`.
    async fn log_output(store: &Store, id: &SandboxId, out: &[u8]) {
        use crate::trajectory::{Room, SandboxLog, StoredEntry, StoredExec, StoredResult};
        let log = SandboxLog::empty(id);
        let mut e = StoredEntry::new(
            warren_types::TrajectoryCall::Exec(Default::default()),
            None,
            0,
        );
        let mut blobs = Vec::new();
        let exec = StoredExec::new(
            Default::default(),
            out,
            b"",
            &mut Room::unlimited(),
            &mut blobs,
        );
        e.result = Some(StoredResult::Exec(exec));
        log.append(store.journal(), e, None, blobs).await.unwrap();
    }

    #[tokio::test]
    async fn output_blobs_are_files_shared_by_content_and_swept_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.redb");
        let node: NodeId = "n1".parse().unwrap();
        let (a, b) = (SandboxId::generate(&node), SandboxId::generate(&node));
        let big = vec![b'x'; 1 << 20];
        let blob_dir = dir.path().join(BLOB_DIR);
        {
            let store = Store::open(&path).unwrap();
            let before = store.journal().state_bytes();
            log_output(&store, &a, &big).await;
            log_output(&store, &b, &big).await;
            let files = store.journal().blob_dir();
            assert_eq!(files.count(), 1, "equal outputs are one file");
            assert_eq!(files.bytes(), 1 << 20);
            // A 1 MiB output costs the node's disk about 1 MiB, not a power-of-two run of
            // pages of the state file.
            let grown = store.journal().state_bytes() - before;
            assert!(grown < (1 << 20) + (1 << 19), "grew {grown} bytes");
            store.remove_sandbox(&a, None).unwrap();
            assert_eq!(files.count(), 1, "still referred to by b");
            let (entries, blobs) = store.journal().read().unwrap().entries(&b, 1, 10).unwrap();
            assert_eq!(entries.len(), 1);
            assert_eq!(blobs.values().next().unwrap().len(), 1 << 20);
        }
        // A crash between writing a file and committing leaves a file nobody refers to.
        let orphan = "ab".repeat(32);
        std::fs::create_dir_all(blob_dir.join("ab")).unwrap();
        std::fs::write(blob_dir.join("ab").join(&orphan), b"orphan").unwrap();
        let store = Store::open(&path).unwrap();
        let files = store.journal().blob_dir();
        assert_eq!(files.count(), 1, "the orphan is swept at open");
        assert_eq!(files.bytes(), 1 << 20);
        store.remove_sandbox(&b, None).unwrap();
        assert_eq!(files.count(), 0);
        assert_eq!(files.bytes(), 0);
    }

    #[tokio::test]
    async fn removing_a_long_trajectory_does_not_grow_the_state_file() {
        use crate::trajectory::{SandboxLog, StoredEntry};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("state.redb")).unwrap();
        let node: NodeId = "n1".parse().unwrap();
        let id = SandboxId::generate(&node);
        let log = SandboxLog::empty(&id);
        for i in 0..3000u64 {
            let call = warren_types::TrajectoryCall::Exec(warren_types::ExecCall {
                argv: Some(vec!["echo".into(), format!("{i:0>400}")]),
                ..Default::default()
            });
            let e = StoredEntry::new(call, Some(i), 0);
            log.append(store.journal(), e, Some([1; 32]), Vec::new())
                .await
                .unwrap();
        }
        let full = store.journal().state_bytes();
        store.remove_sandbox(&id, None).unwrap();
        assert_eq!(
            store.journal().read().unwrap().tail(&id).unwrap(),
            (0, None)
        );
        let after = store.journal().state_bytes();
        assert!(
            after <= full + full / 4,
            "removing {full} bytes of trajectory grew the state to {after}"
        );
    }
}
