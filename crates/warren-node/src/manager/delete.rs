//! Delete: destroy the sandbox's instance (or what is left of it, paused or not), then drop
//! its record, its trajectory and its idempotency key. Used by `DELETE /v1/sandboxes/{id}`
//! and by the reaper.

use std::sync::Arc;
use tracing::{info, warn};
use warren_types::{SandboxId, SandboxState};

use super::{Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::Metrics;

impl Manager {
    /// `DELETE /v1/sandboxes/{id}`.
    pub async fn delete(&self, id: &SandboxId) -> Result<(), NodeError> {
        let sb = self.lookup(id)?;
        self.end(&sb, "deleted by a call").await?;
        Metrics::inc(&self.inner.parts.telemetry.metrics().deletes);
        Ok(())
    }

    /// Tears a sandbox down and removes it; `why` is logged and kept for later 404s.
    pub(crate) async fn end(&self, sb: &Arc<Sandbox>, why: &str) -> Result<(), NodeError> {
        // Not in the middle of a pause, resume or fork.
        let _lifecycle = sb.lifecycle.lock().await;
        let (instance, record, key, tenant) = {
            let mut st = sb.lock();
            if st.info.state == SandboxState::Creating {
                return Err(NodeError::NotRunning {
                    id: sb.id.clone(),
                    state: st.info.state,
                    reason: Some("still being created; retry".into()),
                });
            }
            if st.deleting {
                // Another delete is under way; it will finish the job.
                return Ok(());
            }
            st.deleting = true;
            (
                st.instance.take(),
                st.record.clone(),
                st.info
                    .idempotency_key
                    .as_deref()
                    .map(|k| super::scoped_key(st.info.tenant.as_deref(), k)),
                st.info.tenant.clone(),
            )
        };
        let destroyed = match &instance {
            Some(i) => i.destroy().await,
            None => sb.runtime.destroy_record(&sb.id, record.as_ref()).await,
        };
        // Calls that were in flight end now; their entries must land before the trajectory
        // is deleted, and none after.
        if let Err(e) = sb.log.close(self.journal()).await {
            warn!(sandbox = %sb.id, error = %e, "trajectory barrier failed");
        }
        if let Err(e) = destroyed {
            sb.log.reopen();
            warn!(sandbox = %sb.id, error = %e, "destroy failed; the sandbox stays as failed");
            let mut st = sb.lock();
            st.deleting = false;
            st.info.state = SandboxState::Failed;
            st.info.reason = Some(format!("delete failed: {e}"));
            st.instance = instance;
            if let Err(pe) = self.persist(sb, &st) {
                warn!(sandbox = %sb.id, error = %pe, "cannot record the failed delete");
            }
            return Err(NodeError::runtime(&sb.id, e));
        }
        self.inner.parts.network.detach(&sb.id).await;
        // Its log is closed: what is left of it goes to the trajectory store, then the seal.
        self.inner.parts.trajectories.seal_trajectory(sb).await;
        self.forget(&sb.id, key.as_deref());
        self.inner
            .parts
            .telemetry
            .deleted(&sb.id, why, tenant.clone());
        self.inner.registry.bury(&sb.id, why, tenant);
        self.inner.store.remove_sandbox(&sb.id, key.as_deref())?;
        info!(sandbox = %sb.id, why, "sandbox deleted");
        Ok(())
    }
}
