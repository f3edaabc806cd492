//! The sandbox registry: which sandboxes the node holds, the idempotency keys of their
//! creates, and why recently deleted ones went (for a friendlier 404).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use warren_types::SandboxId;

use super::{KeyEntry, Sandbox};

/// How many recently deleted sandboxes keep their reason for a friendlier 404.
const TOMBSTONES: usize = 4096;

/// The map id → sandbox, the idempotency keys, the tombstones. Locks are held only for map
/// and record updates, never across an await.
#[derive(Default)]
pub(crate) struct Registry {
    sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    keys: Mutex<HashMap<String, KeyEntry>>,
    /// (id, why it went, its tenant) of recently deleted sandboxes.
    tombstones: Mutex<VecDeque<(SandboxId, String, Option<String>)>>,
}

impl Registry {
    pub(super) fn map(&self) -> RwLockReadGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.sandboxes.read().expect("sandbox map lock")
    }

    pub(super) fn map_mut(&self) -> RwLockWriteGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.sandboxes.write().expect("sandbox map lock")
    }

    /// The idempotency keys (scoped per tenant, see `scoped_key`).
    pub(super) fn keys(&self) -> MutexGuard<'_, HashMap<String, KeyEntry>> {
        self.keys.lock().expect("keys lock")
    }

    /// Why sandbox `id` went away, when it went recently and its tenant passes `sees`.
    pub(super) fn why_gone(
        &self,
        id: &SandboxId,
        sees: impl Fn(Option<&str>) -> bool,
    ) -> Option<String> {
        self.tombstones
            .lock()
            .expect("tombstones lock")
            .iter()
            .rev()
            .find(|(t, _, owner)| t == id && sees(owner.as_deref()))
            .map(|(_, w, _)| w.clone())
    }

    /// Remembers why sandbox `id` (of `tenant`) went, dropping the oldest past
    /// [`TOMBSTONES`].
    pub(super) fn bury(&self, id: &SandboxId, why: &str, tenant: Option<String>) {
        let mut t = self.tombstones.lock().expect("tombstones lock");
        if t.len() >= TOMBSTONES {
            t.pop_front();
        }
        t.push_back((id.clone(), why.to_string(), tenant));
    }
}
