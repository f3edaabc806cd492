//! The sandboxes' trajectories once written, a part of its own beside the manager
//! ([`Trajectories`]). Here: shipping them off the node (the shipper's thread, see
//! [`crate::ship`]), sealing a deleted sandbox's log (the manager calls it at delete),
//! reading a trajectory back from the store when the sandbox is not on this node, and where
//! revive reads the logs of sandboxes this node no longer holds. Export is in
//! `trajectory`, revive in `revive`.

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tracing::warn;
use warren_blob::trajectory::{ForkOrigin, TrajectoryPages as ShippedPages, TrajectoryStoreError};
use warren_blob::BlobStore;
use warren_types::{ApiError, Caller, ErrorCode, SandboxId};

use super::{Inner, Manager, Sandbox};
use crate::error::NodeError;
use crate::ship::{Live, ShipError, Shipper};
use crate::trajectory::{Journal, LogSource, StoreLogSource};

/// Longest a delete waits for the sandbox's log to be shipped and sealed; past it the
/// sandbox goes anyway (and the store may miss the end of its log).
pub const SEAL_WAIT: Duration = Duration::from_secs(5);

/// Longest a create or fork waits for its records to be written in the trajectory store.
pub const RECORD_WITHIN: Duration = Duration::from_secs(30);

/// `sb` as the shipper records it.
fn live(sb: &Sandbox) -> Live {
    Live {
        info: sb.lock().info.clone(),
        hostname: Some(sb.hostname.clone()),
        forked_from: None,
    }
}

/// `work` (writing `what` in the trajectory store) within [`RECORD_WITHIN`]; a failure is
/// the call's `start_failed`.
async fn recorded(
    what: &str,
    work: impl Future<Output = Result<(), ShipError>>,
) -> Result<(), NodeError> {
    let why = match tokio::time::timeout(RECORD_WITHIN, work).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {} s", RECORD_WITHIN.as_secs()),
    };
    Err(NodeError::Api(ApiError::new(
        ErrorCode::StartFailed,
        format!(
            "cannot record {what} in the trajectory store, so it could not be revived if \
             this node died ({why}); nothing was left behind: retry"
        ),
    )))
}

/// The sandboxes' trajectories once written: export, shipping, revive. Owns the trajectory
/// shipper (once a trajectory store is set) and the log source revive reads sandboxes this
/// node no longer holds from; calls that need a sandbox are handed the manager. Cheap to
/// clone; every clone is the same.
#[derive(Clone, Default)]
pub struct Trajectories {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    shipper: OnceLock<Arc<Shipper>>,
    /// Where revive reads logs of sandboxes this node no longer holds (none: only its own).
    log_source: OnceLock<Arc<dyn LogSource>>,
    /// True while the node's cluster registration may have expired (see
    /// [`Trajectories::set_registration_doubt`]).
    doubt: OnceLock<Doubt>,
}

/// Whether the node's cluster registration may have expired.
pub type Doubt = Arc<dyn Fn() -> bool + Send + Sync>;

impl std::fmt::Debug for Trajectories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trajectories")
            .field("ships", &self.ships_trajectories())
            .finish()
    }
}

impl Trajectories {
    /// Writes `sb`'s record (`sandbox.json`) in the trajectory store, when the node ships
    /// to one, within [`RECORD_WITHIN`]; a failure is the create's `start_failed`.
    pub(crate) async fn record_in_store(&self, sb: &Sandbox) -> Result<(), NodeError> {
        let Some(shipper) = self.shipper() else {
            return Ok(());
        };
        recorded("the sandbox", shipper.record(&sb.id, &live(sb))).await
    }

    /// Makes a fork's children revivable from the trajectory store before the fork answers,
    /// when the node ships to one, within [`RECORD_WITHIN`]: the parent's log is shipped up
    /// to the fork (its last entry then is `parent_seq`), then each child's record is
    /// written naming the parent, so a revive replays the parent up to the fork even when
    /// the child's own first entry was never shipped. A failure is the fork's
    /// `start_failed`.
    pub(crate) async fn record_fork_in_store(
        &self,
        journal: &Journal,
        parent: &Sandbox,
        parent_seq: u64,
        children: &[Arc<Sandbox>],
    ) -> Result<(), NodeError> {
        let Some(shipper) = self.shipper() else {
            return Ok(());
        };
        let origin = ForkOrigin {
            parent: parent.id.to_string(),
            parent_seq,
        };
        let work = async {
            if parent_seq > 0 {
                shipper.ship(journal, &parent.id, &live(parent)).await?;
            }
            let records = children.iter().map(|c| {
                let child = Live {
                    forked_from: Some(origin.clone()),
                    ..live(c)
                };
                async move { shipper.record(&c.id, &child).await }
            });
            futures::future::try_join_all(records).await.map(|_| ())
        };
        recorded("the fork's children", work).await
    }

    /// Ships the trajectory of every sandbox of `sandboxes` to `store` from now on, on a
    /// thread of its own (see [`crate::ship`]), and reads logs back from it to revive
    /// sandboxes this node does not hold (a [`StoreLogSource`], unless another source was
    /// set). Once only; later calls are ignored.
    pub fn ship_trajectories(
        &self,
        store: Arc<dyn BlobStore>,
        sandboxes: &Manager,
    ) -> std::io::Result<()> {
        let metrics = sandboxes.parts().telemetry.metrics().shipping.clone();
        let shipper = Shipper::with_metrics(store.clone(), metrics);
        if self.state.shipper.set(shipper.clone()).is_err() {
            return Ok(());
        }
        self.set_log_source(Arc::new(StoreLogSource::new(store)));
        let weak = Arc::downgrade(&sandboxes.inner);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("trajectory-shipper".into())
            .spawn(move || rt.block_on(ship_loop(weak, shipper)))?;
        Ok(())
    }

    pub(crate) fn shipper(&self) -> Option<&Arc<Shipper>> {
        self.state.shipper.get()
    }

    /// Sets where revive reads the logs of sandboxes this node does not hold (once).
    pub fn set_log_source(&self, source: Arc<dyn LogSource>) {
        let _ = self.state.log_source.set(source);
    }

    /// Where revive reads the logs of sandboxes this node does not hold, if anywhere.
    pub(crate) fn log_source(&self) -> Option<Arc<dyn LogSource>> {
        self.state.log_source.get().cloned()
    }

    /// Deletes this node's sandboxes that a node revived from the trajectory store (their
    /// revive mark is there, see `warren_blob::trajectory::Revived`): the revived copy goes
    /// on, the original must not run another step beside it. Answers each deleted sandbox
    /// with the one it was revived as. The daemon calls it after recovery, before it serves,
    /// and before it registers in the cluster again after losing its registration. A mark
    /// that cannot be read is logged and the sandbox kept.
    pub async fn delete_revived(&self, sandboxes: &Manager) -> Vec<(SandboxId, String)> {
        use futures::StreamExt;
        let Some(shipper) = self.shipper() else {
            return Vec::new();
        };
        let store = shipper.store().clone();
        let ids: Vec<SandboxId> = sandboxes.inner.registry.map().keys().cloned().collect();
        let marks: Vec<_> = futures::stream::iter(ids)
            .map(|id| {
                let store = store.clone();
                async move {
                    let mark = warren_blob::trajectory::revived(store.as_ref(), &id).await;
                    (id, mark)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        let mut deleted = Vec::new();
        for (id, mark) in marks {
            let mark = match mark {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    warn!(sandbox = %id, error = %e, "cannot read whether the sandbox was revived elsewhere; keeping it");
                    continue;
                }
            };
            warn!(
                sandbox = %id, revived_as = %mark.revived_as,
                "the sandbox was revived on another node while this one was away: deleting the original"
            );
            let Ok(sb) = sandboxes.lookup(&id) else {
                continue;
            };
            match sandboxes.end(&sb, "revived on another node").await {
                Ok(()) => deleted.push((id, mark.revived_as)),
                Err(e) => {
                    warn!(sandbox = %id, error = %e, "cannot delete a revived sandbox's original")
                }
            }
        }
        deleted
    }

    /// Tells the node when its cluster registration may have expired (`doubt` answers true):
    /// gateways may then have called it lost and revived its sandboxes elsewhere. Once
    /// only; a node outside a cluster has none.
    pub fn set_registration_doubt(&self, doubt: Doubt) {
        let _ = self.state.doubt.set(doubt);
    }

    /// Fences `sb` while the node's registration is in doubt (a cluster node cut off from
    /// etcd, still reached by clients): before a call runs in it, its revive mark is read
    /// from the trajectory store. A sandbox revived elsewhere is deleted (in a task of its
    /// own, as at a rejoin) and the call answers `not_found` naming the copy; a mark that
    /// cannot be read answers `node_unreachable` (retry: nothing ran). Without doubt, or
    /// without a store to revive from, nothing is read.
    pub(crate) async fn fence(
        &self,
        sandboxes: &Manager,
        sb: &Arc<Sandbox>,
    ) -> Result<(), NodeError> {
        let (Some(doubt), Some(shipper)) = (self.state.doubt.get(), self.shipper()) else {
            return Ok(());
        };
        if !doubt() {
            return Ok(());
        }
        let mark = warren_blob::trajectory::revived(shipper.store().as_ref(), &sb.id).await;
        let mark = match mark {
            Ok(None) => return Ok(()),
            Ok(Some(m)) => m,
            Err(e) => {
                return Err(NodeError::Api(ApiError::new(
                    ErrorCode::NodeUnreachable,
                    format!(
                        "this node lost its cluster registration and cannot read whether sandbox \
                         {} was revived elsewhere ({e}); nothing ran: retry",
                        sb.id
                    ),
                )))
            }
        };
        warn!(
            sandbox = %sb.id, revived_as = %mark.revived_as,
            "the sandbox was revived on another node while this node was out of the cluster: deleting the original"
        );
        let (m, gone) = (sandboxes.clone(), sb.clone());
        tokio::spawn(async move {
            if let Err(e) = m.end(&gone, "revived on another node").await {
                warn!(sandbox = %gone.id, error = %e, "cannot delete a revived sandbox's original");
            }
        });
        Err(NodeError::SandboxNotFound {
            id: sb.id.clone(),
            why: Some(format!(
                "revived on another node as {} while this node was out of the cluster",
                mark.revived_as
            )),
        })
    }

    /// True when trajectories are shipped to a store (and read from it once a sandbox is
    /// not on the node).
    pub fn ships_trajectories(&self) -> bool {
        self.shipper().is_some()
    }

    /// Ships what is left of a deleted sandbox's log and seals it, waiting at most
    /// [`SEAL_WAIT`]. Its log is closed: nothing more is appended.
    pub(crate) async fn seal_trajectory(&self, sb: &Sandbox) {
        let Some(s) = self.shipper() else { return };
        let id = &sb.id;
        match tokio::time::timeout(SEAL_WAIT, s.seal(id, live(sb))).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(sandbox = %id, error = %e, "trajectory not sealed in the store"),
            Err(_) => warn!(sandbox = %id, "trajectory not sealed in the store in time"),
        }
    }

    /// The trajectory of a sandbox that is not on this node, from the store it was shipped
    /// to, as `caller` may see it.
    pub async fn shipped_trajectory(
        &self,
        id: &SandboxId,
        from_seq: u64,
        caller: &Caller,
    ) -> Result<ShippedPages, NodeError> {
        let Some(s) = self.shipper() else {
            return Err(NodeError::SandboxNotFound {
                id: id.clone(),
                why: None,
            });
        };
        ShippedPages::open(s.store().clone(), id, from_seq, caller)
            .await
            .map_err(|e| match e {
                TrajectoryStoreError::NotFound(_) => NodeError::SandboxNotFound {
                    id: id.clone(),
                    why: None,
                },
                e => NodeError::Api(ApiError::new(e.code(), e.to_string())),
            })
    }
}

/// Passes until the manager is gone.
async fn ship_loop(manager: Weak<Inner>, shipper: Arc<Shipper>) {
    loop {
        shipper.idle().await;
        let Some(inner) = manager.upgrade() else {
            return;
        };
        let m = Manager { inner };
        let live_of = |id: &SandboxId| {
            let sb = m.inner.registry.map().get(id).cloned()?;
            let deleting = sb.lock().deleting;
            (!deleting).then(|| live(&sb))
        };
        shipper.pass(m.journal(), live_of).await;
    }
}
