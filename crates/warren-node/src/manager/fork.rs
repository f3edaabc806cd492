//! Fork: n new sandboxes from a running or paused one, through the substrate's
//! [`warren_runtime::Runtime::fork`] (a copy of the writable layer, the same image stack; no
//! process state). Children get new ids, the parent's settings and labels (merged with the
//! request's), the rest of the parent's lifetime, and their own trajectory, which starts with
//! a `forked_from` entry naming the parent and its last entry at the time of the fork. The
//! parent logs a `fork` entry naming the children. A failed fork leaves no child behind.
//!
//! With a trajectory store, the fork answers only once every child can be revived from it
//! (as a create, see `Trajectories::record_fork_in_store`): the parent's log is shipped up to
//! the fork and each child's record, naming the parent, is written while the runtime forks.
//!
//! A fork naming a step (`?step=`) is claimed through the step runner like an exec: the same
//! step again answers the children the first run made (those not deleted since), a step below
//! the last one is a `step_conflict`, and the parent's entry carries the step. A fork that
//! fails logs nothing and frees its step, so it can be asked again.

use futures::future::join_all;
use std::sync::Arc;
use tracing::{info, warn};
use warren_types::{Caller, ForkRequest, SandboxId, SandboxInfo, SandboxState, TrajectoryCall};

use super::runner::{Answered, Begun};
use super::{now_ms, ActivityGuard, Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::{Change, Metrics};
use crate::store::{StoredSandbox, FORMAT};
use crate::trajectory::{request_digest, Forked, SandboxLog, StoredEntry};

/// A child's record, from the parent's.
fn child_info(id: &SandboxId, parent: &SandboxInfo, req: &ForkRequest, now: u64) -> SandboxInfo {
    let mut labels = parent.labels.clone();
    labels.extend(req.labels.clone());
    SandboxInfo {
        id: id.to_string(),
        state: SandboxState::Creating,
        labels,
        created_at_ms: now,
        // The same lifetime as the parent was given, counted from now.
        expires_at_ms: parent
            .expires_at_ms
            .map(|e| now + e.saturating_sub(parent.created_at_ms)),
        last_activity_ms: now,
        reason: None,
        idempotency_key: None,
        ..parent.clone()
    }
}

fn stored(sb: &Sandbox) -> StoredSandbox {
    let st = sb.lock();
    StoredSandbox {
        format: FORMAT,
        info: st.info.clone(),
        hostname: sb.hostname.clone(),
        record: st.record.clone(),
    }
}

impl Manager {
    /// `POST /v1/sandboxes/{id}/fork` by `caller`: the children, running; the children belong to the parent's tenant and count against its
    /// quotas (checked when the caller is that tenant).
    pub async fn fork_as(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: ForkRequest,
    ) -> Result<Vec<SandboxInfo>, NodeError> {
        Ok(self.fork_step(caller, id, req, None).await?.answer)
    }

    /// A fork by `caller` as `step` (at most once for it) when one is named.
    pub(crate) async fn fork_step(
        &self,
        caller: &Caller,
        id: &SandboxId,
        req: ForkRequest,
        step: Option<u64>,
    ) -> Result<Answered<Vec<SandboxInfo>>, NodeError> {
        req.validate()?;
        self.authorize(caller, id)?;
        let call = |children: Vec<String>| TrajectoryCall::Fork {
            children,
            n: Some(req.n),
            labels: req.labels.clone(),
        };
        let digest = request_digest(&call(Vec::new()));
        let run = match self.begin::<Forked>(id, step, Some(digest)).await? {
            Begun::Replay(known) => {
                // The children its first run made, as they are now (deleted ones left out).
                let ids = known.answer(&digest)?;
                return Ok(Answered {
                    answer: ids
                        .iter()
                        .filter_map(|c| c.parse::<SandboxId>().ok())
                        .filter_map(|c| self.get(&c).ok())
                        .collect(),
                    replayed: true,
                });
            }
            Begun::Run(r) => r,
        };
        let parent = self.lookup(id)?;
        let _busy = ActivityGuard::new(parent.clone());
        // No pause, resume or delete of the parent meanwhile.
        let _lifecycle = parent.lifecycle.lock().await;
        let (instance, pinfo) = parent.live_instance()?;
        let parent_seq = parent.log.last_seq();
        self.inner
            .tenants
            .rate(caller, req.n, std::time::Instant::now())?;

        let cfg = &self.inner.cfg;
        let children: Vec<Arc<Sandbox>> = {
            let mut map = self.inner.registry.map_mut();
            if map.len() + req.n as usize > cfg.max_sandboxes {
                return Err(NodeError::TooManySandboxes {
                    max: cfg.max_sandboxes,
                });
            }
            self.inner.tenants.admit(
                caller,
                pinfo.tenant.as_deref(),
                u64::from(req.n),
                &pinfo.limits,
            )?;
            let now = now_ms();
            (0..req.n)
                .map(|_| {
                    let cid = SandboxId::generate(&cfg.node);
                    let info = child_info(&cid, &pinfo, &req, now);
                    let sb = Sandbox::new(
                        cid.clone(),
                        info,
                        parent.runtime.clone(),
                        parent.hostname.clone(),
                        None,
                        SandboxLog::empty(&cid),
                    );
                    map.insert(cid, sb.clone());
                    sb
                })
                .collect()
        };
        let ids: Vec<SandboxId> = children.iter().map(|c| c.id.clone()).collect();
        let forget = |m: &Manager| {
            for c in &ids {
                m.forget(c, None);
            }
            if let Err(e) = m.inner.store.remove_sandboxes(&ids) {
                warn!(parent = %id, error = %e, "cannot remove the records of a failed fork");
            }
        };
        let records: Vec<StoredSandbox> = children.iter().map(|c| stored(c)).collect();
        if let Err(e) = self.inner.store.put_sandboxes(&records) {
            forget(self);
            return Err(e.into());
        }

        let specs: Vec<_> = children.iter().map(|c| c.spec(&c.lock().info)).collect();
        let started = std::time::Instant::now();
        let recording = self.inner.parts.trajectories.record_fork_in_store(
            self.journal(),
            &parent,
            parent_seq,
            &children,
        );
        let (forked, recorded) = futures::join!(parent.runtime.fork(&instance, &specs), recording);
        let instances = match forked {
            Ok(v) if v.len() == specs.len() => v,
            Ok(v) => {
                for i in v {
                    let _ = i.destroy().await;
                }
                forget(self);
                return Err(NodeError::Api(warren_types::ApiError::internal(
                    "the runtime forked a different number of sandboxes than asked",
                )));
            }
            Err(warren_runtime::RuntimeError::Unsupported(why)) => {
                // The sandbox's substrate cannot fork: the request does not fit this sandbox
                // (a client's error, 409), not a feature the node lacks.
                forget(self);
                return Err(NodeError::Api(warren_types::ApiError::new(
                    warren_types::ErrorCode::InvalidState,
                    format!("{why}: fork function, container and microvm sandboxes"),
                )));
            }
            Err(e) => {
                warn!(parent = %id, error = %e, "fork failed");
                forget(self);
                return Err(NodeError::runtime(id, e));
            }
        };
        if let Err(e) = recorded {
            // Answered, the children could not be revived if this node died: refused.
            warn!(parent = %id, error = %e, "cannot record the fork's children in the trajectory store; destroying them");
            for i in &instances {
                let _ = i.destroy().await;
            }
            forget(self);
            return Err(e);
        }
        // Children keep the parent's policy, each with its own link and resolver.
        for (c, i) in children.iter().zip(&instances) {
            let policy = c.lock().info.network.clone();
            if let Err(e) = self
                .inner
                .parts
                .network
                .apply(&c.id, i, &policy, false)
                .await
            {
                warn!(parent = %id, error = %e, "cannot give a fork child its network; destroying the children");
                for (c, i) in children.iter().zip(&instances) {
                    let _ = i.destroy().await;
                    self.inner.parts.network.detach(&c.id).await;
                }
                forget(self);
                return Err(e);
            }
        }
        for (c, i) in children.iter().zip(&instances) {
            let mut st = c.lock();
            st.info.state = SandboxState::Running;
            st.info.last_activity_ms = now_ms();
            st.record = Some(i.record());
            st.instance = Some(i.clone());
        }
        let records: Vec<StoredSandbox> = children.iter().map(|c| stored(c)).collect();
        if let Err(e) = self.inner.store.put_sandboxes(&records) {
            warn!(parent = %id, error = %e, "cannot record the forked sandboxes; destroying them");
            for i in &instances {
                let _ = i.destroy().await;
            }
            forget(self);
            return Err(e.into());
        }
        for (c, i) in children.iter().zip(instances) {
            self.watch_lost(c.clone(), i);
        }

        // The trajectories: one group commit for all of them.
        let now = now_ms();
        let origin = TrajectoryCall::ForkedFrom {
            parent: id.to_string(),
            parent_seq,
        };
        let names: Vec<String> = ids.iter().map(|c| c.to_string()).collect();
        let journal = self.journal();
        let appends = children.iter().map(|c| {
            c.log.append(
                journal,
                StoredEntry::new(origin.clone(), None, now),
                None,
                Vec::new(),
            )
        });
        let (origins, logged) = futures::join!(
            join_all(appends),
            run.finish(call(names.clone()), Ok(names))
        );
        for r in origins {
            r?;
        }
        logged?;
        Metrics::inc_by(
            &self.inner.parts.telemetry.metrics().forks,
            ids.len() as u64,
        );
        if let Some(c) = children.first() {
            self.inner.parts.telemetry.metrics().observe_change(
                Change::Fork,
                c.substrate(),
                started.elapsed(),
            );
        }
        info!(parent = %id, n = ids.len(), ms = started.elapsed().as_millis() as u64, "sandbox forked");
        Ok(Answered {
            answer: children.iter().map(|c| c.lock().info.clone()).collect(),
            replayed: false,
        })
    }
}
