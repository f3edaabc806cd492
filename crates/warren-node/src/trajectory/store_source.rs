//! [`StoreLogSource`]: the logs shipped to a trajectory store (`warrend
//! --trajectory-store`, see `warren_blob::trajectory`), read back to revive a sandbox that
//! was deleted or whose node is gone.
//!
//! The sandbox is made like its shipped record (`sandbox.json`); its entries are the stored
//! entries the segment lines carry (`stored`), each seq once however often a segment was
//! sent, with the blobs they name (outputs, an exec's stdin, an upload's content) read from
//! beside the segments. A store written before records and stored entries were shipped
//! answers `invalid_state`: such a log can be read, not revived.

use std::sync::Arc;
use warren_blob::trajectory::{self as shipped, SandboxRecord, TrajectoryStoreError};
use warren_blob::{BlobError, BlobStore};
use warren_types::{ErrorCode, SandboxId};

use super::source::{LogPage, LogSource, LoggedSandbox};
use super::{Blobs, StoredEntry};
use crate::error::StoreError;

/// A trajectory store as a [`LogSource`].
#[derive(Clone)]
pub struct StoreLogSource {
    store: Arc<dyn BlobStore>,
}

impl std::fmt::Debug for StoreLogSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLogSource")
            .field("store", &self.store.describe())
            .finish()
    }
}

fn store_err(e: impl Into<TrajectoryStoreError>) -> StoreError {
    let e = e.into();
    StoreError::Shipped {
        code: e.code(),
        message: e.to_string(),
    }
}

fn not_revivable(id: &SandboxId, what: &str) -> StoreError {
    StoreError::Shipped {
        code: ErrorCode::InvalidState,
        message: format!(
            "sandbox {id} cannot be revived from the trajectory store: {what} (shipped by an \
             older node; its trajectory can still be read)"
        ),
    }
}

impl StoreLogSource {
    pub fn new(store: Arc<dyn BlobStore>) -> StoreLogSource {
        StoreLogSource { store }
    }

    /// The blob of what `entry` was fed, from the store (its outputs are not read: revive
    /// compares them by digest).
    async fn blobs_of(&self, entry: &StoredEntry, blobs: &mut Blobs) -> Result<(), StoreError> {
        if let Some(d) = entry.input_ref() {
            if blobs.contains_key(d) {
                return Ok(());
            }
            let bytes = self
                .store
                .get(&shipped::output_key(d))
                .await
                .map_err(store_err)?;
            blobs.insert(d.to_string(), bytes);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl LogSource for StoreLogSource {
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<LoggedSandbox>, StoreError> {
        let key = shipped::record_key(id);
        match self.store.get(&key).await {
            Ok(bytes) => {
                let r: SandboxRecord = serde_json::from_slice(&bytes).map_err(|e| {
                    store_err(TrajectoryStoreError::Corrupt {
                        key: key.clone(),
                        message: e.to_string(),
                    })
                })?;
                if r.format != shipped::RECORD_FORMAT {
                    return Err(store_err(TrajectoryStoreError::Corrupt {
                        key,
                        message: format!(
                            "format {} (this build reads {})",
                            r.format,
                            shipped::RECORD_FORMAT
                        ),
                    }));
                }
                Ok(Some(LoggedSandbox {
                    info: r.sandbox,
                    hostname: r.hostname,
                    forked_from: r.forked_from,
                }))
            }
            Err(BlobError::NotFound(_)) => {
                // A log without a record: shipped before records were.
                let (segs, sealed) = shipped::segments(self.store.as_ref(), id)
                    .await
                    .map_err(store_err)?;
                if segs.is_empty() && !sealed {
                    return Ok(None);
                }
                Err(not_revivable(
                    id,
                    "the store holds no record of the sandbox",
                ))
            }
            Err(e) => Err(store_err(e)),
        }
    }

    async fn page(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
    ) -> Result<LogPage, StoreError> {
        let (segs, _) = shipped::segments(self.store.as_ref(), id)
            .await
            .map_err(store_err)?;
        let mut page = LogPage::default();
        let mut next = from_seq.max(1);
        for (_, last, key) in segs {
            if last < next {
                continue;
            }
            let bytes = self.store.get(&key).await.map_err(store_err)?;
            let (_, lines) = shipped::decode_segment(&key, &bytes).map_err(store_err)?;
            for line in lines {
                if line.entry.seq < next {
                    continue;
                }
                if page.entries.len() >= limit {
                    page.more = true;
                    return Ok(page);
                }
                let Some(stored) = line.stored else {
                    return Err(not_revivable(
                        id,
                        &format!("entry {} holds no stored entry", line.entry.seq),
                    ));
                };
                let entry: StoredEntry = serde_json::from_value(stored).map_err(|e| {
                    store_err(TrajectoryStoreError::Corrupt {
                        key: key.clone(),
                        message: format!("entry {}: {e}", line.entry.seq),
                    })
                })?;
                if entry.seq != line.entry.seq {
                    return Err(store_err(TrajectoryStoreError::Corrupt {
                        key: key.clone(),
                        message: format!("entry {} stores seq {}", line.entry.seq, entry.seq),
                    }));
                }
                next = entry.seq + 1;
                self.blobs_of(&entry, &mut page.blobs).await?;
                page.entries.push(entry);
            }
        }
        Ok(page)
    }

    async fn fence(&self, old: &SandboxId, new: &SandboxId) -> Result<(), StoreError> {
        let mark = shipped::Revived {
            format: shipped::REVIVED_FORMAT,
            sandbox: old.to_string(),
            revived_as: new.to_string(),
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        };
        let bytes = serde_json::to_vec(&mark).expect("a revive mark serializes");
        self.store
            .put(&shipped::revived_key(old), bytes.into())
            .await
            .map_err(store_err)
    }
}
