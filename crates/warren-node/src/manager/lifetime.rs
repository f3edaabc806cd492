//! A sandbox's lifetime: `POST /v1/sandboxes/{id}/extend` moves its expiry (the TTL the
//! reaper enforces) to a new point from now, within the node's maximum lifetime.

use tracing::{info, warn};
use warren_types::{ApiError, SandboxId, SandboxInfo, SandboxState};

use super::{now_ms, Manager};
use crate::error::NodeError;

impl Manager {
    /// `POST /v1/sandboxes/{id}/extend`: the sandbox now expires `ttl_secs` from now.
    pub async fn extend(&self, id: &SandboxId, ttl_secs: u64) -> Result<SandboxInfo, NodeError> {
        let cap = self.inner.cfg.ttl_cap();
        if ttl_secs == 0 || ttl_secs > cap {
            return Err(ApiError::invalid(format!(
                "ttl_secs must be between 1 and {cap} (this node's maximum lifetime)"
            ))
            .into());
        }
        let sb = self.lookup(id)?;
        let mut st = sb.lock();
        match st.info.state {
            SandboxState::Creating | SandboxState::Running | SandboxState::Paused
                if !st.deleting => {}
            state => {
                return Err(NodeError::NotRunning {
                    id: id.clone(),
                    state: if st.deleting {
                        SandboxState::Stopped
                    } else {
                        state
                    },
                    reason: st.info.reason.clone(),
                })
            }
        }
        let now = now_ms();
        st.info.expires_at_ms = Some(now + ttl_secs * 1000);
        st.info.last_activity_ms = now;
        if let Err(e) = self.persist(&sb, &st) {
            warn!(sandbox = %id, error = %e, "cannot record the new expiry");
            return Err(e);
        }
        info!(sandbox = %id, ttl_secs, "sandbox lifetime extended");
        Ok(st.info.clone())
    }
}
