//! The sandbox manager: the registry of the node's sandboxes and their lifecycle, from create
//! to delete. The node's other parts sit beside it (see [`crate::node`]); those it calls into
//! ([`Parts`]: network, telemetry, trajectories, snapshots) live in this folder too.
//!
//! It holds the registry (`registry`: id → sandbox, with its API record, its live
//! [`Instance`] while it runs, the runtime's re-adoption record and its trajectory log; the
//! idempotency keys; the tombstones), writes every state transition to the [`Store`],
//! enforces the node limits, and runs the reaper (TTL, idle timeout → pause) and one watcher
//! per sandbox that notices when its agent dies. Each verb lives in its own file: `create`,
//! `delete`, `pause` (pause, resume, and the transparent resume of every call), `fork`,
//! `lifetime`, `runner` (the step runner every call that changes a sandbox goes through:
//! once per step, logged), `recover`, `held` (steps that ran across a daemon restart), `reaper`, `ports` (connections to ports inside a
//! sandbox). The parts' files: `network`, `telemetry`
//! (with `events`, `scrape`, `stats`), `trajectory` (export), `shipping`, `revive`,
//! `snapshots`, `terminal`, `exec` and `files` (the [`Processes`] and [`Files`] parts).
//!
//! It never sees HTTP: callers hand it typed requests and get typed answers or a
//! [`NodeError`]. Locks are plain mutexes held only for map/record updates (and the store
//! write of a transition), never across an await.

mod capture;
mod create;
mod delete;
mod events;
mod exec;
mod export;
mod files;
mod fork;
mod held;
mod lifetime;
mod network;
mod pause;
mod ports;
mod reaper;
mod recover;
mod registry;
mod revive;
mod runner;
mod scrape;
mod shipping;
mod snapshots;
mod stats;
mod substrates;
mod telemetry;
mod terminal;
#[cfg(test)]
mod tests;
mod trajectory;

pub use events::{Event, SandboxChange, Subscription};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use warren_runtime::{Instance, Runtime, SandboxSpec};
use warren_types::{
    ApiError, Caller, CreateSandboxRequest, SandboxId, SandboxInfo, SandboxState, Substrate,
};

use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::store::{Store, StoredSandbox, FORMAT};
use crate::trajectory::{Journal, SandboxLog};

pub use create::Created;
pub use exec::{ExecEvents, Processes, PtyRequest, TerminalSession, DEFAULT_SHELL};
pub use files::{FileDownload, Files};
pub use network::SandboxNetwork;
pub use ports::{PortConnection, Ports};
pub use reaper::{AGENT_EXITED, IDLE_PAUSED, IDLE_TIMEOUT, TTL_EXPIRED};
pub use recover::RecoveryReport;
pub use shipping::Trajectories;
pub use snapshots::Snapshots;
pub use substrates::Substrates;
pub use telemetry::Telemetry;
pub use terminal::{TerminalLog, Terminals};
pub use trajectory::TrajectoryPages;

pub(crate) use crate::clock::now_ms;

/// `GET /v1/sandboxes` filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Every pair must be present on the sandbox.
    pub labels: BTreeMap<String, String>,
    pub state: Option<SandboxState>,
    pub substrate: Option<Substrate>,
    /// Only sandboxes of this tenant (a non-admin caller's own).
    pub tenant: Option<String>,
}

impl ListFilter {
    fn matches(&self, info: &SandboxInfo) -> bool {
        self.state.is_none_or(|s| s == info.state)
            && self.substrate.is_none_or(|s| s == info.substrate)
            && self
                .tenant
                .as_deref()
                .is_none_or(|t| info.tenant.as_deref() == Some(t))
            && self
                .labels
                .iter()
                .all(|(k, v)| info.labels.get(k) == Some(v))
    }
}

/// The manager's view of one sandbox.
pub(crate) struct Sandbox {
    id: SandboxId,
    runtime: Arc<dyn Runtime>,
    hostname: String,
    /// Calls in flight (exec, streams, terminals, transfers); the idle reaper waits for zero.
    active: AtomicU64,
    state: Mutex<Entry>,
    /// Held by pause, resume, fork and delete, one at a time.
    lifecycle: tokio::sync::Mutex<()>,
    log: Arc<SandboxLog>,
    /// How its creation ended: `None` while it is `creating`. Repeated creates with its
    /// idempotency key and calls that reach it early wait on this.
    started: tokio::sync::watch::Sender<Option<Result<(), ApiError>>>,
    /// The CPU time read by the last stats call, `(ms since the epoch, µs of CPU)`: the start
    /// of the next one's window.
    cpu_sample: Mutex<Option<(u64, u64)>>,
}

/// The mutable part of a sandbox.
struct Entry {
    info: SandboxInfo,
    instance: Option<Arc<dyn Instance>>,
    record: Option<serde_json::Value>,
    /// Set once a delete (call or reaper) has started; the lost-watcher then stays quiet.
    deleting: bool,
    /// Set while a pause is under way: calls wait for it and resume the sandbox after.
    pausing: bool,
}

impl Sandbox {
    /// Its instance and record while it is running or paused (fork and snapshot take it);
    /// otherwise why not.
    pub(crate) fn live_instance(&self) -> Result<(Arc<dyn Instance>, SandboxInfo), NodeError> {
        let st = self.lock();
        match (&st.instance, st.info.state) {
            (Some(i), SandboxState::Running | SandboxState::Paused) if !st.deleting => {
                Ok((i.clone(), st.info.clone()))
            }
            (_, state) => Err(NodeError::NotRunning {
                id: self.id.clone(),
                state: if st.deleting {
                    SandboxState::Stopped
                } else {
                    state
                },
                reason: st.info.reason.clone(),
            }),
        }
    }

    /// Its substrate (as the API names it: a function sandbox runs on the container runtime).
    fn substrate(&self) -> Substrate {
        self.lock().info.substrate
    }

    fn new(
        id: SandboxId,
        info: SandboxInfo,
        runtime: Arc<dyn Runtime>,
        hostname: String,
        record: Option<serde_json::Value>,
        log: Arc<SandboxLog>,
    ) -> Arc<Sandbox> {
        let started = (info.state != SandboxState::Creating).then_some(Ok(()));
        Arc::new(Sandbox {
            id,
            runtime,
            hostname,
            active: AtomicU64::new(0),
            state: Mutex::new(Entry {
                info,
                instance: None,
                record,
                deleting: false,
                pausing: false,
            }),
            lifecycle: tokio::sync::Mutex::new(()),
            log,
            started: tokio::sync::watch::Sender::new(started),
            cpu_sample: Mutex::new(None),
        })
    }

    /// Records how its creation ended and wakes everyone waiting for it.
    fn settle_start(&self, outcome: Result<(), ApiError>) {
        self.started.send_if_modified(|s| {
            if s.is_some() {
                return false;
            }
            *s = Some(outcome);
            true
        });
    }

    /// Waits until its creation has ended (at once when it has) and answers how.
    async fn wait_started(&self) -> Result<(), ApiError> {
        let mut rx = self.started.subscribe();
        let outcome = rx.wait_for(|s| s.is_some()).await.map(|s| s.clone());
        match outcome {
            Ok(s) => s.unwrap_or(Ok(())),
            // The sender lives as long as `self`: unreachable, but not worth a panic.
            Err(_) => Err(ApiError::internal("sandbox creation was abandoned")),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entry> {
        self.state.lock().expect("sandbox lock")
    }

    fn spec(&self, info: &SandboxInfo) -> SandboxSpec {
        SandboxSpec {
            id: self.id.clone(),
            image: info.image.clone(),
            limits: info.limits.clone(),
            hostname: self.hostname.clone(),
            labels: info.labels.clone(),
            devpts: info.pty,
            network: !info.network.is_none(),
            resolv_conf: None,
            on_netns: None,
        }
    }

    fn touch(&self) {
        self.lock().info.last_activity_ms = now_ms();
    }
}

/// Marks a sandbox busy for as long as it lives; dropping it records the activity.
pub struct ActivityGuard {
    sandbox: Arc<Sandbox>,
}

impl ActivityGuard {
    fn new(sandbox: Arc<Sandbox>) -> Self {
        sandbox.active.fetch_add(1, Ordering::SeqCst);
        sandbox.touch();
        ActivityGuard { sandbox }
    }

    /// The sandbox this guard keeps busy.
    pub fn sandbox_id(&self) -> &SandboxId {
        &self.sandbox.id
    }
}

impl Drop for ActivityGuard {
    fn drop(&mut self) {
        self.sandbox.touch();
        self.sandbox.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An idempotency key held in memory.
#[derive(Clone)]
struct KeyEntry {
    id: SandboxId,
    request: CreateSandboxRequest,
}

/// The manager's state: the registry and what the lifecycle needs. Everything else is a part
/// of its own (see [`Parts`] and [`crate::node`]).
pub(crate) struct Inner {
    cfg: NodeConfig,
    /// The runtimes, one per substrate served.
    substrates: Substrates,
    store: Store,
    /// The sandboxes, their idempotency keys, their tombstones.
    registry: registry::Registry,
    /// Quota usage per tenant.
    tenants: Arc<crate::quota::Tenants>,
    /// Caps on starting and held sandboxes, memory headroom.
    admission: crate::admission::Admission,
    /// The parts it calls into.
    parts: Parts,
    /// The node's layer store, read for the run configuration of images at create.
    images: std::sync::OnceLock<Arc<warren_image::ImageStore>>,
}

/// The parts of the node the manager calls into, each owning its own state (see
/// [`crate::node`]): it applies network policies, records telemetry, seals trajectories and
/// creates from snapshots through them. Their own calls that need a sandbox are handed the
/// manager.
#[derive(Clone, Debug)]
pub struct Parts {
    pub network: SandboxNetwork,
    pub telemetry: Telemetry,
    pub trajectories: Trajectories,
    pub snapshots: Snapshots,
}

/// The node's sandbox manager. Cheap to clone; every clone is the same manager.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("node", &self.inner.cfg.node)
            .field("store", &self.inner.store)
            .finish()
    }
}

impl Manager {
    /// A manager over `runtimes` (one per substrate served) with state in `store`. Call
    /// [`Manager::recover`] before serving, then [`Manager::spawn_reaper`].
    pub fn new(cfg: NodeConfig, runtimes: Vec<Arc<dyn Runtime>>, store: Store) -> Self {
        let admission = crate::admission::Admission::new(cfg.admission.clone());
        let snapshot_root = store
            .path()
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("snapshots");
        let snapshots = Snapshots::open(snapshot_root);
        Manager {
            inner: Arc::new(Inner {
                cfg,
                substrates: Substrates::new(runtimes),
                store,
                registry: registry::Registry::default(),
                tenants: Arc::default(),
                admission,
                parts: Parts {
                    network: SandboxNetwork::default(),
                    telemetry: Telemetry::default(),
                    trajectories: Trajectories::default(),
                    snapshots,
                },
                images: std::sync::OnceLock::new(),
            }),
        }
    }

    /// The runtimes this manager creates sandboxes with, one per substrate served.
    pub fn substrates(&self) -> &Substrates {
        &self.inner.substrates
    }

    /// Marks the daemon as stopping: the reaper and lost-agent watchers stand down, so
    /// connections closing during shutdown are not mistaken for dead sandboxes. Sandboxes are
    /// left running for the next start to re-adopt.
    pub fn shutdown(&self) {
        self.inner.substrates.shutdown();
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.cfg
    }

    /// The parts it calls into (network, telemetry, trajectories, snapshots).
    pub fn parts(&self) -> &Parts {
        &self.inner.parts
    }

    pub(crate) fn journal(&self) -> &Journal {
        self.inner.store.journal()
    }

    /// Finds a sandbox; a recently deleted one answers with why it went away.
    pub(crate) fn lookup(&self, id: &SandboxId) -> Result<Arc<Sandbox>, NodeError> {
        if let Some(sb) = self.inner.registry.map().get(id) {
            return Ok(sb.clone());
        }
        let why = self.inner.registry.why_gone(id, |_| true);
        Err(NodeError::SandboxNotFound {
            id: id.clone(),
            why,
        })
    }

    /// Whether `caller` may see and touch sandbox `id`. Another tenant's sandbox answers
    /// exactly like a missing one (same code, same message), so ids of other tenants cannot
    /// be probed.
    pub fn authorize(&self, caller: &Caller, id: &SandboxId) -> Result<(), NodeError> {
        if caller.is_admin() {
            return Ok(());
        }
        let owner = self
            .inner
            .registry
            .map()
            .get(id)
            .map(|sb| sb.lock().info.tenant.clone());
        let why = match owner {
            Some(owner) if caller.sees(owner.as_deref()) => return Ok(()),
            Some(_) => None,
            None => self.inner.registry.why_gone(id, |owner| caller.sees(owner)),
        };
        Err(NodeError::SandboxNotFound {
            id: id.clone(),
            why,
        })
    }

    /// Writes a sandbox's current record to the store.
    fn persist(&self, sb: &Sandbox, st: &Entry) -> Result<(), NodeError> {
        let stored = StoredSandbox {
            format: FORMAT,
            info: st.info.clone(),
            hostname: sb.hostname.clone(),
            record: st.record.clone(),
        };
        self.inner.store.put_sandbox(&stored, None)?;
        self.inner.parts.telemetry.changed(&st.info);
        Ok(())
    }

    /// `GET /v1/sandboxes/{id}`.
    pub fn get(&self, id: &SandboxId) -> Result<SandboxInfo, NodeError> {
        let sb = self.lookup(id)?;
        let mut st = sb.lock();
        st.info.last_activity_ms = now_ms();
        Ok(st.info.clone())
    }

    /// `GET /v1/sandboxes`: every sandbox matching `filter`, oldest first.
    pub fn list(&self, filter: &ListFilter) -> Vec<SandboxInfo> {
        let all: Vec<Arc<Sandbox>> = self.inner.registry.map().values().cloned().collect();
        let mut out: Vec<SandboxInfo> = all
            .iter()
            .filter_map(|sb| {
                let st = sb.lock();
                filter.matches(&st.info).then(|| st.info.clone())
            })
            .collect();
        // Ids embed a ULID, so id order is creation order.
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// How many sandboxes this node holds.
    pub fn count(&self) -> usize {
        self.inner.registry.map().len()
    }
}

/// The idempotency-key table's key: keys are per tenant (NUL is refused in keys).
fn scoped_key(tenant: Option<&str>, key: &str) -> String {
    match tenant {
        None => key.to_string(),
        Some(t) => format!("{t}\0{key}"),
    }
}
