//! Create: validate, reserve (node limit, idempotency key), record `creating`, start through
//! the substrate's runtime (and write the sandbox's record in the trajectory store meanwhile,
//! when the node ships to one), record `running`. A failed start leaves no record behind on
//! the node (a record in the trajectory store stays: nobody was told its id).

use std::sync::Arc;
use tracing::{info, warn};
use warren_runtime::Runtime;
use warren_types::{ApiError, Caller, CreateSandboxRequest, SandboxId, SandboxInfo, SandboxState};

use super::{now_ms, KeyEntry, Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::Metrics;
use crate::store::{StoredKey, StoredSandbox, FORMAT};
use crate::trajectory::SandboxLog;

/// The answer to a create.
#[derive(Debug, Clone)]
pub struct Created {
    pub info: SandboxInfo,
    /// False when an earlier create with the same idempotency key is answered instead.
    pub created: bool,
}

impl Manager {
    /// `POST /v1/sandboxes` by `caller`: the sandbox belongs to the caller's tenant and
    /// counts against its quotas; idempotency keys are per tenant. The create runs on a task
    /// of its own, to its end even when the caller's future is dropped (a client that went
    /// away from a create or a revive): one cut off half-way would leave a sandbox stuck in
    /// `creating`.
    pub async fn create_as(
        &self,
        caller: &Caller,
        req: CreateSandboxRequest,
    ) -> Result<Created, NodeError> {
        let (m, caller) = (self.clone(), caller.clone());
        tokio::spawn(async move { create_to_the_end(&m, &caller, req).await })
            .await
            .map_err(|e| ApiError::internal(format!("create task: {e}")))?
    }

    /// Gives the manager the node's layer store, whose images' run configurations become
    /// the defaults of their sandboxes.
    pub fn set_image_store(&self, store: Arc<warren_image::ImageStore>) {
        let _ = self.inner.images.set(store);
    }

    /// A create repeated with the key of an earlier one: waits for that one's start and answers
    /// its outcome (the sandbox as it is now, or the same error).
    async fn repeat(&self, sb: Arc<Sandbox>) -> Result<Created, NodeError> {
        sb.wait_started().await.map_err(NodeError::Api)?;
        let info = sb.lock().info.clone();
        Ok(Created {
            info,
            created: false,
        })
    }

    /// Records, starts and records again a sandbox reserved by [`Manager::create`].
    async fn start(
        &self,
        sb: &Arc<Sandbox>,
        req: &CreateSandboxRequest,
        key: Option<&str>,
        runtime: Arc<dyn Runtime>,
        from: Option<&super::snapshots::FromSnapshot>,
    ) -> Result<Created, NodeError> {
        let (mut spec, stored) = {
            let st = sb.lock();
            let stored = StoredSandbox {
                format: FORMAT,
                info: st.info.clone(),
                hostname: sb.hostname.clone(),
                record: None,
            };
            (sb.spec(&st.info), stored)
        };
        let stored_key = key.map(|k| {
            (
                k,
                StoredKey {
                    format: FORMAT,
                    id: sb.id.clone(),
                    request: req.clone(),
                },
            )
        });
        let recording = std::time::Instant::now();
        if let Err(e) = self
            .inner
            .store
            .put_sandbox(&stored, stored_key.as_ref().map(|(k, v)| (*k, v)))
        {
            self.forget(&sb.id, key);
            Metrics::inc(&self.inner.parts.telemetry.metrics().create_errors);
            return Err(e.into());
        }

        let recorded = recording.elapsed();
        // A container's link is reserved before it starts, so that its agent writes the
        // resolv.conf naming the link's resolver while it sets up (no call after the start).
        let reserved =
            match self
                .inner
                .parts
                .network
                .reserve_link(&sb.id, runtime.as_ref(), &req.network)
            {
                Ok(r) => r,
                Err(e) => {
                    self.abandon_start(&sb.id, key).await;
                    return Err(e);
                }
            };
        spec.resolv_conf = reserved.as_ref().map(|l| warren_net::resolv_conf(Some(l)));
        // With a reserved link, the link itself is made while the container starts.
        let early = reserved
            .as_ref()
            .and_then(|_| self.inner.parts.network.early_link(&sb.id, &req.network));
        let early = early.map(|(hook, link)| {
            spec.on_netns = Some(hook);
            link
        });
        // Its trajectory log is made while it starts, so that its first call does not pay for
        // a new file. Awaited before anything can remove the sandbox's record and log.
        let log_started = self.journal().start_log(&sb.id).ok();
        let started = std::time::Instant::now();
        // Its record goes to the trajectory store (when the node ships to one) while it
        // starts: once the create answers, a revive can make it again on any node, even if
        // this one dies before its first step is shipped.
        let making = async {
            match from {
                Some(f) => f.restore(&runtime, &spec).await,
                None => runtime
                    .create(&spec)
                    .await
                    .map_err(|source| NodeError::CreateFailed { source }),
            }
        };
        let (made, shipped) =
            futures::join!(making, self.inner.parts.trajectories.record_in_store(sb));
        if let Some(rx) = log_started {
            if let Err(e) = self.journal().committed(rx).await {
                // Only slower: the first entry makes the log then.
                tracing::debug!(sandbox = %sb.id, error = %e, "trajectory log not started ahead");
            }
        }
        // Whatever the start's outcome, a link begun during it is finished before anything
        // else touches the sandbox's network.
        let networking = std::time::Instant::now();
        let early = match &early {
            Some(l) => l.settle().await,
            None => None,
        };
        let instance = match made {
            Ok(i) => i,
            Err(e) => {
                warn!(sandbox = %sb.id, error = %e, "sandbox failed to start");
                self.abandon_start(&sb.id, key).await;
                return Err(e);
            }
        };
        if let Err(e) = shipped {
            // Answered, it could not be revived if this node died: refused instead.
            warn!(sandbox = %sb.id, error = %e, "cannot record the sandbox in the trajectory store; destroying it");
            if let Err(de) = instance.destroy().await {
                warn!(sandbox = %sb.id, error = %de, "destroy after a failed trajectory record");
            }
            self.abandon_start(&sb.id, key).await;
            return Err(e);
        }

        // The working directory exists from the start (as `mkdir -p`, like an image's
        // WORKDIR), so a missing one is not the first command's failure; one that cannot be
        // made (a file is in the way) fails the create, saying why.
        // A function container's calls each get a fresh writable layer: nothing to make.
        let workdir = {
            let st = sb.lock();
            st.info
                .workdir
                .clone()
                .filter(|_| st.info.substrate != warren_types::Substrate::Function)
        };
        if let Some(w) = workdir {
            if let Err(e) = instance.agent().mkdir(&w, true, None).await {
                warn!(sandbox = %sb.id, error = %e, "cannot make the working directory; destroying it");
                if let Err(de) = instance.destroy().await {
                    warn!(sandbox = %sb.id, error = %de, "destroy after a failed workdir");
                }
                self.abandon_start(&sb.id, key).await;
                return Err(ApiError::invalid(format!(
                    "workdir {w}: cannot be made in the image: {e}"
                ))
                .into());
            }
        }

        let written = reserved.is_some();
        let networked = match early {
            Some(r) => r.map(|_| ()),
            None => self
                .inner
                .parts
                .network
                .apply(&sb.id, &instance, &req.network, written)
                .await
                .map(|_| ()),
        };
        if let Err(e) = networked {
            warn!(sandbox = %sb.id, error = %e, "cannot give the sandbox its network; destroying it");
            if let Err(de) = instance.destroy().await {
                warn!(sandbox = %sb.id, error = %de, "destroy after a failed network setup");
            }
            self.abandon_start(&sb.id, key).await;
            return Err(e);
        }

        // Its trajectory starts where the snapshotted sandbox's stood.
        if let Some(f) = from {
            self.log_lifecycle(sb, f.origin(), now_ms()).await;
        }
        let mut phases = instance.startup_phases();
        phases.push(("network", networking.elapsed()));
        phases.push(("record", recorded));
        let persisted = {
            let mut st = sb.lock();
            st.info.state = SandboxState::Running;
            st.info.last_activity_ms = now_ms();
            st.record = Some(instance.record());
            st.instance = Some(instance.clone());
            self.persist(sb, &st).map(|_| st.info.clone())
        };
        match persisted {
            Ok(info) => {
                self.watch_lost(sb.clone(), instance);
                Metrics::inc(&self.inner.parts.telemetry.metrics().creates);
                self.inner.parts.telemetry.metrics().observe_create(
                    info.substrate,
                    recording.elapsed(),
                    &phases,
                );
                info!(sandbox = %sb.id, ms = started.elapsed().as_millis() as u64, image = ?info.image, "sandbox created");
                Ok(Created {
                    info,
                    created: true,
                })
            }
            Err(e) => {
                // Without a durable record the sandbox could leak across a restart: undo it.
                warn!(sandbox = %sb.id, error = %e, "cannot record the new sandbox; destroying it");
                if let Err(de) = instance.destroy().await {
                    warn!(sandbox = %sb.id, error = %de, "destroy after a failed record");
                }
                self.abandon_start(&sb.id, key).await;
                Err(e)
            }
        }
    }

    /// Undoes a recorded start that failed: its network (link or reservation; nothing when it
    /// has none), its place in memory and its record.
    async fn abandon_start(&self, id: &SandboxId, key: Option<&str>) {
        self.inner.parts.network.detach(id).await;
        self.forget(id, key);
        if let Err(e) = self.inner.store.remove_sandbox(id, key) {
            warn!(sandbox = %id, error = %e, "cannot remove the record of a failed create");
        }
        Metrics::inc(&self.inner.parts.telemetry.metrics().create_errors);
    }

    /// Drops a sandbox (and its key) from memory only; its quota usage is given back. The key
    /// goes first, so whoever finds a key also finds its sandbox.
    pub(crate) fn forget(&self, id: &SandboxId, key: Option<&str>) {
        if let Some(k) = key {
            let mut keys = self.inner.registry.keys();
            if keys.get(k).is_some_and(|e| &e.id == id) {
                keys.remove(k);
            }
        }
        let removed = self.inner.registry.map_mut().remove(id);
        if let Some(sb) = removed {
            let st = sb.lock();
            self.inner
                .tenants
                .release(st.info.tenant.as_deref(), &st.info.limits);
        }
    }
}

/// Settles a start that did not get to (its task was dropped), so nobody waits forever.
struct SettleOnDrop(Arc<Sandbox>);

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        self.0.settle_start(Err(ApiError::internal(
            "the sandbox's creation was cut off",
        )));
    }
}

/// `req` with its image's configuration under it: the image's environment under the
/// request's (a request's variable wins), its working directory and user where the
/// request names none. Images without a configuration change nothing.
async fn with_image_defaults(
    store: Option<Arc<warren_image::ImageStore>>,
    mut req: CreateSandboxRequest,
) -> CreateSandboxRequest {
    let Some(store) = store else {
        return req;
    };
    let refs = req.image.refs();
    // Missing images are the runtime's to refuse (with its own error).
    let config = tokio::task::spawn_blocking(move || store.stack_config(&refs).ok().flatten())
        .await
        .ok()
        .flatten();
    let Some(c) = config else {
        return req;
    };
    let mut env: std::collections::BTreeMap<String, String> = c.env_pairs().into_iter().collect();
    env.extend(std::mem::take(&mut req.env));
    req.env = env;
    if req.workdir.is_none() {
        req.workdir = c.working_dir.clone();
    }
    if req.user.is_none() {
        req.user = c.user.clone();
    }
    req
}

/// The body of [`Manager::create_as`], on its own task.
async fn create_to_the_end(
    m: &Manager,
    caller: &Caller,
    req: CreateSandboxRequest,
) -> Result<Created, NodeError> {
    let cfg = &m.inner.cfg;
    // From a snapshot: its substrate, image and limits, checked like any request's.
    let (req, from) = match req.snapshot.as_deref() {
        Some(sid) => {
            let held = m.inner.parts.snapshots.get(caller, sid)?;
            let req = super::snapshots::fill(&held.info, req)?;
            (req, Some(super::snapshots::FromSnapshot { held }))
        }
        None => (req, None),
    };
    let limits = req.validate(&cfg.defaults, &cfg.bounds)?;
    if let Some(t) = req.ttl_secs.filter(|t| *t > cfg.ttl_cap()) {
        return Err(ApiError::invalid(format!(
            "ttl_secs {t} is over this node's maximum lifetime of {} s",
            cfg.ttl_cap()
        ))
        .into());
    }
    let runtime = m.inner.substrates.runtime_for(req.substrate)?;
    // What can never run here is refused before anything starts.
    runtime.admit(&limits)?;
    if !req.network.is_none() && !runtime.network_policies() {
        return Err(ApiError::invalid(format!(
            "{} sandboxes take no network policy yet: create it with network \"none\"",
            req.substrate.as_str()
        ))
        .into());
    }
    m.inner.parts.network.check(&req.network)?;
    // The image's env, working directory and user are the sandbox's defaults under the
    // request's own (a snapshot's request already carries its sandbox's).
    let req = match from {
        Some(_) => req,
        None => with_image_defaults(m.inner.images.get().cloned(), req).await,
    };
    let tenant = caller.tenant.clone();
    // The table key of the idempotency key (per tenant).
    let key = req
        .idempotency_key
        .as_deref()
        .map(|k| super::scoped_key(tenant.as_deref(), k));

    // Reserve the id (and the key) before starting, so concurrent creates with one key
    // start one sandbox and the node limit holds under load. The admission slot counts
    // the sandbox as starting until this call returns.
    let _slot;
    let reserved: Result<Arc<Sandbox>, Arc<Sandbox>> = {
        let mut keys = m.inner.registry.keys();
        let existing = key.as_ref().and_then(|k| keys.get(k).cloned());
        if let Some(existing) = existing {
            drop(keys);
            if existing.request != req {
                return Err(NodeError::IdempotencyConflict {
                    key: req.idempotency_key.clone().unwrap_or_default(),
                    id: existing.id,
                });
            }
            // A key is dropped before its sandbox leaves the map, so this finds it.
            Err(m.lookup(&existing.id)?)
        } else {
            m.inner.tenants.rate(caller, 1, std::time::Instant::now())?;
            let mut map = m.inner.registry.map_mut();
            _slot = m.inner.admission.admit(map.len()).map_err(NodeError::Api)?;
            if map.len() >= cfg.max_sandboxes {
                return Err(NodeError::TooManySandboxes {
                    max: cfg.max_sandboxes,
                });
            }
            // Counted here, inserted below, under the same lock: the quota holds exactly.
            m.inner
                .tenants
                .admit(caller, tenant.as_deref(), 1, &limits)?;
            let id = SandboxId::generate(&cfg.node);
            let now = now_ms();
            let info = SandboxInfo {
                id: id.to_string(),
                substrate: req.substrate,
                state: SandboxState::Creating,
                image: req.image.refs(),
                limits,
                labels: req.labels.clone(),
                env: req.env.clone(),
                workdir: req
                    .workdir
                    .as_deref()
                    .map(warren_types::validate::sandbox_path)
                    .transpose()?,
                user: req.user.clone(),
                network: req.network.clone(),
                created_at_ms: now,
                expires_at_ms: cfg.ttl_for(req.ttl_secs).map(|t| now + t * 1000),
                idle_timeout_secs: req.idle_timeout_secs,
                last_activity_ms: now,
                reason: None,
                idempotency_key: req.idempotency_key.clone(),
                tenant: tenant.clone(),
                pty: req.pty,
            };
            let hostname = req
                .hostname
                .clone()
                .unwrap_or_else(|| cfg.default_hostname.clone());
            let log = SandboxLog::empty(&id);
            let sb = Sandbox::new(id.clone(), info, runtime.clone(), hostname, None, log);
            map.insert(id.clone(), sb.clone());
            if let Some(key) = &key {
                keys.insert(
                    key.clone(),
                    KeyEntry {
                        id,
                        request: req.clone(),
                    },
                );
            }
            Ok(sb)
        }
    };
    let sb = match reserved {
        Ok(sb) => sb,
        Err(earlier) => return m.repeat(earlier).await,
    };

    // However the start ends (even cut off), repeated creates and early calls learn it.
    let settle = SettleOnDrop(sb.clone());
    let outcome = m
        .start(&sb, &req, key.as_deref(), runtime, from.as_ref())
        .await;
    sb.settle_start(outcome.as_ref().map(|_| ()).map_err(|e| e.to_api()));
    drop(settle);
    outcome
}
