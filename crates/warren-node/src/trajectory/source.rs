//! Where a sandbox's log is read from to revive it: [`LogSource`].
//!
//! A node reads the logs of its own sandboxes from its [`super::Journal`] (the manager's
//! local source, while the sandbox exists here). A source that keeps logs elsewhere (a store
//! the logs are shipped to, read after the sandbox or its node is gone) implements the same
//! trait and is handed to the node's shipping part (`Trajectories::set_log_source`); revive asks it for
//! sandboxes the node no longer holds.

use warren_blob::trajectory::ForkOrigin;
use warren_types::{SandboxId, SandboxInfo};

use super::{Blobs, StoredEntry};
use crate::error::StoreError;

/// One page of a log: entries in `seq` order and the blobs of what they were fed.
#[derive(Debug, Default)]
pub struct LogPage {
    pub entries: Vec<StoredEntry>,
    /// The blobs of the entries' inputs (an exec's stdin, an upload's content): what revive
    /// feeds again. Outputs are not read (revive compares them by digest), so a page's
    /// memory does not grow with what a sandbox printed.
    pub blobs: Blobs,
    /// True when more entries may follow the last one.
    pub more: bool,
}

/// A sandbox as its log's source knows it: what a new sandbox is made like.
#[derive(Debug, Clone)]
pub struct LoggedSandbox {
    /// Its record as last known (image stack, limits, labels, env, network policy, tenant).
    pub info: SandboxInfo,
    /// Its hostname, when known.
    pub hostname: Option<String>,
    /// A fork's child: its parent and the parent's last entry at the fork, when the source
    /// knows it beside the log (the log's first entry, `forked_from`, says the same, but
    /// may be missing from a store its node died before shipping it to).
    pub forked_from: Option<ForkOrigin>,
}

/// Reads the entries of a sandbox's log.
#[async_trait::async_trait]
pub trait LogSource: Send + Sync + 'static {
    /// The sandbox the log belongs to; `None` when this source does not hold it.
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<LoggedSandbox>, StoreError>;

    /// Up to `limit` entries from `from_seq` on (with the blobs of their inputs).
    async fn page(
        &self,
        id: &SandboxId,
        from_seq: u64,
        limit: usize,
    ) -> Result<LogPage, StoreError>;

    /// Records that `old` was revived as `new` where the original's node reads it when it
    /// comes back (a source of logs of sandboxes held elsewhere); nothing by default (the
    /// node's own log: its original lives here, and is the caller's to delete).
    async fn fence(&self, _old: &SandboxId, _new: &SandboxId) -> Result<(), StoreError> {
        Ok(())
    }
}
