//! Sandbox changes as they happen, for `GET /v1/events` (the dashboard's live view).
//!
//! Every durable change of a sandbox goes through `Manager::persist`, and every delete
//! through `Manager::end`: both publish here, on a bounded broadcast channel. Nothing is
//! built while nobody listens. A listener that falls behind by more than the channel holds is
//! told how many changes it missed ([`Event::Lagged`]) and should read the list again; the
//! daemon never waits for a listener.

use std::sync::Arc;
use tokio::sync::broadcast;
use warren_types::{Caller, SandboxId, SandboxInfo};

use super::Telemetry;

/// Changes a listener may fall behind by before it is told it lagged.
const CAPACITY: usize = 1024;

/// One change of a sandbox.
#[derive(Debug, Clone)]
pub enum SandboxChange {
    /// Its new state (created, paused, resumed, extended, failed...).
    Changed(Arc<SandboxInfo>),
    /// It is gone.
    Deleted {
        id: SandboxId,
        why: String,
        tenant: Option<String>,
    },
}

impl SandboxChange {
    fn tenant(&self) -> Option<&str> {
        match self {
            SandboxChange::Changed(info) => info.tenant.as_deref(),
            SandboxChange::Deleted { tenant, .. } => tenant.as_deref(),
        }
    }
}

/// What a listener receives.
#[derive(Debug, Clone)]
pub enum Event {
    Sandbox(SandboxChange),
    /// The listener missed this many changes.
    Lagged(u64),
}

/// The channel; one per node.
#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<SandboxChange>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            tx: broadcast::channel(CAPACITY).0,
        }
    }
}

impl Events {
    /// True while someone listens (so publishers can skip building a change).
    pub(crate) fn wanted(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    pub(crate) fn publish(&self, change: SandboxChange) {
        // No receiver is not an error: nobody is watching.
        let _ = self.tx.send(change);
    }
}

/// A listener's end: the changes of the sandboxes its caller may see.
pub struct Subscription {
    rx: broadcast::Receiver<SandboxChange>,
    caller: Caller,
}

impl Subscription {
    /// The next change this caller may see; `None` once the manager is gone.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            match self.rx.recv().await {
                Ok(c) if self.caller.sees(c.tenant()) => return Some(Event::Sandbox(c)),
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Event::Lagged(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

impl Telemetry {
    /// Publishes a sandbox's new state (when someone listens).
    pub(crate) fn changed(&self, info: &SandboxInfo) {
        if self.events().wanted() {
            self.events()
                .publish(SandboxChange::Changed(Arc::new(info.clone())));
        }
    }

    /// Publishes that a sandbox is gone (when someone listens).
    pub(crate) fn deleted(&self, id: &SandboxId, why: &str, tenant: Option<String>) {
        if self.events().wanted() {
            self.events().publish(SandboxChange::Deleted {
                id: id.clone(),
                why: why.to_string(),
                tenant,
            });
        }
    }

    /// Changes of the sandboxes `caller` may see, from now on.
    pub fn subscribe(&self, caller: &Caller) -> Subscription {
        Subscription {
            rx: self.events().tx.subscribe(),
            caller: caller.clone(),
        }
    }
}
