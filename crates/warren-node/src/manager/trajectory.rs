//! Trajectory export: a sandbox's log, page by page, in the order it was written. Reading
//! never waits for the writer and never resumes a paused sandbox.

use warren_types::{SandboxId, TrajectoryCall, TrajectoryEntry};

use super::{Manager, Sandbox, Trajectories};
use crate::error::NodeError;
use crate::trajectory::{Blobs, StoredEntry};

/// Most entries read per page.
const PAGE: usize = 256;
/// A page stops once its entries and their output take this much: an export holds about one
/// page (plus one entry's output) at a time, however long the trajectory.
const PAGE_BYTES: u64 = 1 << 20;

/// The pages of one export.
pub struct TrajectoryPages {
    pub(super) manager: Manager,
    id: SandboxId,
    next_seq: u64,
    done: bool,
}

impl std::fmt::Debug for TrajectoryPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrajectoryPages")
            .field("sandbox", &self.id)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl TrajectoryPages {
    /// The next entries; `None` after the last page. Entries appended while the export runs
    /// are included when they come before its end.
    pub async fn next_page(&mut self) -> Option<Result<Vec<TrajectoryEntry>, NodeError>> {
        let (entries, blobs) = match self.next_stored(u64::MAX).await? {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok(entries.iter().map(|e| e.export(&blobs)).collect()))
    }

    /// The next entries as stored, with the blobs they refer to that are shorter than
    /// `load_under` bytes; `None` after the last page.
    pub(super) async fn next_stored(
        &mut self,
        load_under: u64,
    ) -> Option<Result<(Vec<StoredEntry>, Blobs), NodeError>> {
        if self.done {
            return None;
        }
        let (m, id, from) = (self.manager.clone(), self.id.clone(), self.next_seq);
        let read = tokio::task::spawn_blocking(move || {
            let (entries, blobs, more) = m
                .journal()
                .read()?
                .entries_loading(&id, from, PAGE, PAGE_BYTES, load_under)?;
            Ok::<_, NodeError>(((entries, blobs), more))
        })
        .await;
        let (page, more) = match read {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                self.done = true;
                return Some(Err(e));
            }
            Err(e) => {
                self.done = true;
                return Some(Err(NodeError::Api(warren_types::ApiError::internal(
                    format!("trajectory read task: {e}"),
                ))));
            }
        };
        match page.0.last() {
            Some(last) if more => self.next_seq = last.seq + 1,
            _ => self.done = true,
        }
        if page.0.is_empty() {
            return None;
        }
        Some(Ok(page))
    }
}

impl Trajectories {
    /// `GET /v1/sandboxes/{id}/trajectory`: the log of sandbox `id` of `sandboxes` from
    /// `from_seq` on.
    pub fn trajectory(
        &self,
        sandboxes: &Manager,
        id: &SandboxId,
        from_seq: u64,
    ) -> Result<TrajectoryPages, NodeError> {
        sandboxes.lookup(id)?;
        Ok(TrajectoryPages {
            manager: sandboxes.clone(),
            id: id.clone(),
            next_seq: from_seq.max(1),
            done: false,
        })
    }

    /// The whole log of sandbox `id` of `sandboxes` (tests and small logs).
    pub async fn entries(
        &self,
        sandboxes: &Manager,
        id: &SandboxId,
        from_seq: u64,
    ) -> Result<Vec<TrajectoryEntry>, NodeError> {
        let mut pages = self.trajectory(sandboxes, id, from_seq)?;
        let mut out = Vec::new();
        while let Some(p) = pages.next_page().await {
            out.extend(p?);
        }
        Ok(out)
    }
}

impl Manager {
    /// Logs a lifecycle change (pause, resume, network) that has happened: no step, nothing
    /// to replay. The change stands whatever the log says: a failed append is a warning.
    pub(crate) async fn log_lifecycle(&self, sb: &Sandbox, call: TrajectoryCall, started_ms: u64) {
        let entry = crate::trajectory::StoredEntry::new(call, None, started_ms);
        if let Err(e) = sb.log.append(self.journal(), entry, None, Vec::new()).await {
            tracing::warn!(sandbox = %sb.id, error = %e, "cannot log a lifecycle change");
        }
    }
}
