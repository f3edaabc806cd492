//! Background work: the reaper (every `reap_interval`: TTL → delete; idle timeout → pause,
//! or delete where the substrate cannot pause) and one watcher per live sandbox that notices
//! when its agent dies on its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use tracing::{info, warn};
use warren_runtime::Instance;
use warren_types::{SandboxId, SandboxState};

use super::pause::PauseBy;
use super::{now_ms, Manager, Sandbox};
use crate::metrics::Metrics;

/// Reason recorded for a sandbox whose agent exited without being asked to.
pub const AGENT_EXITED: &str = "sandbox agent exited";
pub const TTL_EXPIRED: &str = "ttl expired";
pub const IDLE_TIMEOUT: &str = "idle timeout";
/// What the reaper reports for a sandbox it paused after its idle timeout.
pub const IDLE_PAUSED: &str = "idle timeout: paused";

impl Manager {
    /// Starts the reaper task. It stops when the manager's last handle is dropped.
    pub fn spawn_reaper(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.cfg.reap_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Manager { inner }.reap(now_ms()).await;
            }
        })
    }

    /// Deletes every running or paused sandbox whose TTL passed, and pauses every running one
    /// that was idle too long, at `now` (ms since the epoch). Where the substrate cannot pause,
    /// an idle sandbox is deleted. Returns what was done and why ([`TTL_EXPIRED`],
    /// [`IDLE_PAUSED`], [`IDLE_TIMEOUT`]).
    pub async fn reap(&self, now: u64) -> Vec<(SandboxId, &'static str)> {
        if self.inner.substrates.stopping() {
            return Vec::new();
        }
        let all: Vec<Arc<Sandbox>> = self.inner.registry.map().values().cloned().collect();
        let mut due = Vec::new();
        for sb in all {
            let st = sb.lock();
            let live = matches!(st.info.state, SandboxState::Running | SandboxState::Paused);
            if !live || st.deleting {
                continue;
            }
            if st.info.expires_at_ms.is_some_and(|e| e <= now) {
                due.push((sb.clone(), TTL_EXPIRED));
            } else if let Some(idle) = st.info.idle_timeout_secs {
                let busy = sb.active.load(Ordering::SeqCst) > 0;
                if st.info.state == SandboxState::Running
                    && !busy
                    && !st.pausing
                    && st.info.last_activity_ms.saturating_add(idle * 1000) <= now
                {
                    due.push((sb.clone(), IDLE_TIMEOUT));
                }
            }
        }
        let mut done = Vec::new();
        for (sb, why) in due {
            if why == IDLE_TIMEOUT {
                match self.pause_sb(&sb, PauseBy::Idle).await {
                    Ok(Some(_)) => {
                        Metrics::inc(&self.inner.parts.telemetry.metrics().paused_idle);
                        done.push((sb.id.clone(), IDLE_PAUSED));
                        continue;
                    }
                    // A call came in meanwhile.
                    Ok(None) => continue,
                    Err(e) if e.code() == warren_types::ErrorCode::UnsupportedSubstrate => {
                        // Cannot pause: delete, as before pausing existed.
                    }
                    Err(e) => {
                        warn!(sandbox = %sb.id, error = %e, "idle pause failed; trying again after another idle period");
                        sb.touch();
                        continue;
                    }
                }
            }
            match self.end(&sb, why).await {
                Ok(()) => {
                    let c = if why == TTL_EXPIRED {
                        &self.inner.parts.telemetry.metrics().reaped_ttl
                    } else {
                        &self.inner.parts.telemetry.metrics().reaped_idle
                    };
                    Metrics::inc(c);
                    done.push((sb.id.clone(), why));
                }
                Err(e) => {
                    warn!(sandbox = %sb.id, why, error = %e, "reaper could not delete the sandbox")
                }
            }
        }
        done
    }

    /// Watches `instance` until its agent goes away, then marks the sandbox failed.
    pub(crate) fn watch_lost(&self, sb: Arc<Sandbox>, instance: Arc<dyn Instance>) {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            instance.lost().await;
            let Some(inner) = weak.upgrade() else { return };
            Manager { inner }.on_lost(&sb, &instance).await;
        });
    }

    async fn on_lost(&self, sb: &Arc<Sandbox>, instance: &Arc<dyn Instance>) {
        {
            let mut st = sb.lock();
            let same = st
                .instance
                .as_ref()
                .is_some_and(|i| Arc::ptr_eq(i, instance));
            if st.deleting || !same || self.inner.substrates.stopping() {
                return;
            }
            st.instance = None;
            st.info.state = SandboxState::Failed;
            st.info.reason = Some(
                instance
                    .lost_reason()
                    .unwrap_or_else(|| AGENT_EXITED.into()),
            );
            if let Err(e) = self.persist(sb, &st) {
                warn!(sandbox = %sb.id, error = %e, "cannot record the lost sandbox");
            }
        }
        Metrics::inc(&self.inner.parts.telemetry.metrics().lost);
        warn!(sandbox = %sb.id, reason = ?instance.lost_reason(), "the sandbox's agent exited; sandbox marked failed");
        self.inner.parts.network.detach(&sb.id).await;
        match instance.destroy().await {
            Ok(()) => info!(sandbox = %sb.id, "lost sandbox cleaned up"),
            Err(e) => warn!(sandbox = %sb.id, error = %e, "cleanup of the lost sandbox failed"),
        }
    }
}
