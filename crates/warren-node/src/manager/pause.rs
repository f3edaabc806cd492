//! Pause and resume, and [`Manager::ready`]: how every call reaches a live sandbox, resuming
//! it first when it is paused (or being paused), so a paused sandbox looks like a running one
//! to everything but `GET` and the metrics.
//!
//! Pause, resume, fork and delete of one sandbox take its `lifecycle` lock in turn. A pause
//! marks the sandbox `pausing` first; calls arriving then wait for the lock and resume it.
//! Calls already in flight when a sandbox is paused by a call freeze with it and go on after
//! the resume. The idle pause of the reaper only starts when no call is in flight.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use warren_runtime::Instance;
use warren_types::{PauseStats, SandboxId, SandboxInfo, SandboxState, TrajectoryCall};

use super::{now_ms, ActivityGuard, Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::{Change, Metrics};

/// Clears `pausing` however the pause ends (error, or the caller going away).
struct Pausing<'a>(&'a Sandbox);

impl Drop for Pausing<'_> {
    fn drop(&mut self) {
        self.0.lock().pausing = false;
    }
}

/// Who asked for a pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PauseBy {
    Call,
    /// The reaper: only when no call is in flight.
    Idle,
}

impl Manager {
    /// `POST /v1/sandboxes/{id}/pause`: freezes the sandbox and pushes its memory out of RAM
    /// as far as the host allows. Pausing a paused sandbox pauses it again (the runtime makes
    /// that a no-op) and answers what it reports.
    pub async fn pause(&self, id: &SandboxId) -> Result<PauseStats, NodeError> {
        let sb = self.lookup(id)?;
        match self.pause_sb(&sb, PauseBy::Call).await? {
            Some(s) => Ok(s),
            None => Err(NodeError::NotRunning {
                id: id.clone(),
                state: SandboxState::Running,
                reason: Some("busy".into()),
            }),
        }
    }

    /// Pauses `sb`; `None` when `by` is [`PauseBy::Idle`] and a call is in flight.
    pub(crate) async fn pause_sb(
        &self,
        sb: &Arc<Sandbox>,
        by: PauseBy,
    ) -> Result<Option<PauseStats>, NodeError> {
        let _lifecycle = sb.lifecycle.lock().await;
        let (instance, was) = {
            let mut st = sb.lock();
            let live = st.instance.clone().filter(|_| !st.deleting);
            match (live, st.info.state) {
                (Some(i), s @ (SandboxState::Running | SandboxState::Paused)) => {
                    if by == PauseBy::Idle
                        && (s == SandboxState::Paused || sb.active.load(Ordering::SeqCst) > 0)
                    {
                        return Ok(None);
                    }
                    st.pausing = true;
                    (i, s)
                }
                (_, state) => {
                    return Err(NodeError::NotRunning {
                        id: sb.id.clone(),
                        state: if st.deleting {
                            SandboxState::Stopped
                        } else {
                            state
                        },
                        reason: st.info.reason.clone(),
                    })
                }
            }
        };
        let pausing = Pausing(sb);
        let started = std::time::Instant::now();
        let started_ms = now_ms();
        let s = instance
            .pause()
            .await
            .map_err(|e| NodeError::runtime(&sb.id, e))?;
        {
            let mut st = sb.lock();
            st.info.state = SandboxState::Paused;
            if let Err(e) = self.persist(sb, &st) {
                warn!(sandbox = %sb.id, error = %e, "cannot record the pause");
            }
        }
        drop(pausing);
        if was == SandboxState::Running {
            Metrics::inc(&self.inner.parts.telemetry.metrics().pauses);
            self.inner.parts.telemetry.metrics().observe_change(
                Change::Pause,
                sb.substrate(),
                started.elapsed(),
            );
            let by = match by {
                PauseBy::Call => "call",
                PauseBy::Idle => "idle",
            };
            self.log_lifecycle(sb, TrajectoryCall::Pause { by: by.into() }, started_ms)
                .await;
            info!(sandbox = %sb.id, ?by, before = s.memory_before_bytes, after = s.memory_after_bytes,
                  ms = s.duration_ms, note = s.note.as_deref().unwrap_or(""), "sandbox paused");
        }
        Ok(Some(s))
    }

    /// `POST /v1/sandboxes/{id}/resume`: thaws a paused sandbox (a running one is left as it
    /// is).
    pub async fn resume(&self, id: &SandboxId) -> Result<SandboxInfo, NodeError> {
        let sb = self.lookup(id)?;
        self.resume_sb(&sb).await?;
        let info = sb.lock().info.clone();
        Ok(info)
    }

    async fn resume_sb(&self, sb: &Arc<Sandbox>) -> Result<(), NodeError> {
        let _lifecycle = sb.lifecycle.lock().await;
        let instance = {
            let st = sb.lock();
            match (&st.instance, st.info.state) {
                (Some(_), SandboxState::Running) if !st.deleting => return Ok(()),
                (Some(i), SandboxState::Paused) if !st.deleting => i.clone(),
                (_, state) => {
                    return Err(NodeError::NotRunning {
                        id: sb.id.clone(),
                        state: if st.deleting {
                            SandboxState::Stopped
                        } else {
                            state
                        },
                        reason: st.info.reason.clone(),
                    })
                }
            }
        };
        let started = std::time::Instant::now();
        let started_ms = now_ms();
        instance
            .resume()
            .await
            .map_err(|e| NodeError::runtime(&sb.id, e))?;
        {
            let mut st = sb.lock();
            st.info.state = SandboxState::Running;
            st.info.last_activity_ms = now_ms();
            if let Err(e) = self.persist(sb, &st) {
                warn!(sandbox = %sb.id, error = %e, "cannot record the resume");
            }
        }
        Metrics::inc(&self.inner.parts.telemetry.metrics().resumes);
        self.inner.parts.telemetry.metrics().observe_change(
            Change::Resume,
            sb.substrate(),
            started.elapsed(),
        );
        self.log_lifecycle(sb, TrajectoryCall::Resume {}, started_ms)
            .await;
        info!(sandbox = %sb.id, us = started.elapsed().as_micros() as u64, "sandbox resumed");
        Ok(())
    }

    /// A live sandbox's instance, resumed first when paused, marking the sandbox busy for the
    /// guard's life.
    pub(crate) async fn ready(
        &self,
        id: &SandboxId,
    ) -> Result<(Arc<dyn Instance>, SandboxInfo, ActivityGuard), NodeError> {
        let sb = self.lookup(id)?;
        self.ready_within(&sb, None).await
    }

    /// [`Manager::ready`] for a call with its own timeout: a sandbox still being created is
    /// waited for at most `limit` (without one, until its creation ends).
    pub(crate) async fn ready_within(
        &self,
        sb: &Arc<Sandbox>,
        limit: Option<Duration>,
    ) -> Result<(Arc<dyn Instance>, SandboxInfo, ActivityGuard), NodeError> {
        // A node cut off from its cluster runs nothing in a sandbox revived elsewhere.
        self.inner.parts.trajectories.fence(self, sb).await?;
        // Busy first: from here on the reaper does not start an idle pause.
        let guard = ActivityGuard::new(sb.clone());
        loop {
            let creating = {
                let st = sb.lock();
                match (&st.instance, st.info.state) {
                    (Some(i), SandboxState::Running) if !st.deleting && !st.pausing => {
                        return Ok((i.clone(), st.info.clone(), guard));
                    }
                    (Some(_), SandboxState::Running | SandboxState::Paused) if !st.deleting => {
                        false
                    }
                    (_, SandboxState::Creating) if !st.deleting => true,
                    (_, state) => {
                        return Err(NodeError::NotRunning {
                            id: sb.id.clone(),
                            state: if st.deleting {
                                SandboxState::Stopped
                            } else {
                                state
                            },
                            reason: st.info.reason.clone(),
                        });
                    }
                }
            };
            if creating {
                sb.wait_created(limit).await?;
                continue;
            }
            // Paused, or a pause is under way: wait for it, then thaw.
            self.resume_sb(sb).await?;
        }
    }
}

impl Sandbox {
    /// Waits (at most `limit`) for a sandbox in `creating` to finish starting; a start that
    /// failed answers its error.
    async fn wait_created(&self, limit: Option<Duration>) -> Result<(), NodeError> {
        let started = match limit {
            None => self.wait_started().await,
            Some(limit) => match tokio::time::timeout(limit, self.wait_started()).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(NodeError::NotRunning {
                        id: self.id.clone(),
                        state: SandboxState::Creating,
                        reason: Some(format!(
                            "still being created after the call's timeout ({:.1} s)",
                            limit.as_secs_f64()
                        )),
                    })
                }
            },
        };
        started.map_err(NodeError::Api)
    }
}
