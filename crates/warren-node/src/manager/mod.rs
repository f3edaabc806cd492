//! The sandbox manager: owns every sandbox of this node, from create to delete (images and
//! function pools have their own owners beside it, see [`crate::node`]).
//!
//! It holds the map id → sandbox (its API record, its live [`Instance`] while it runs, the
//! runtime's re-adoption record, its trajectory log), writes every state transition to the
//! [`Store`], enforces the node limits, and runs the reaper (TTL, idle timeout → pause) and one
//! watcher per sandbox that notices when its agent dies. Each verb lives in its own file:
//! `create`, `delete`, `exec`, `files`, `pause` (pause, resume, and the transparent resume of
//! every call), `fork`, `runner` (the step runner every call that changes a sandbox goes
//! through: once per step, logged), `network`, `trajectory` (export), `shipping` (the
//! trajectory shipper's thread, and reading back from its store), `recover`, `reaper`.
//!
//! It never sees HTTP: callers hand it typed requests and get typed answers or a
//! [`NodeError`]. Locks are plain mutexes held only for map/record updates (and the store
//! write of a transition), never across an await.

mod create;
mod delete;
mod events;
mod exec;
mod files;
mod fork;
mod lifetime;
mod network;
mod pause;
mod reaper;
mod recover;
mod revive;
mod runner;
mod scrape;
mod shipping;
mod snapshots;
mod stats;
mod terminal;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_create;
#[cfg(test)]
mod tests_lifetime;
#[cfg(test)]
mod tests_pause;
#[cfg(test)]
mod tests_revive;
#[cfg(test)]
mod tests_revive_store;
#[cfg(test)]
mod tests_steps;
#[cfg(test)]
mod tests_tenants;
mod trajectory;

pub use events::{Event, SandboxChange, Subscription};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use warren_runtime::{Instance, Runtime, SandboxSpec};
use warren_types::{
    ApiError, Caller, CreateSandboxRequest, SandboxId, SandboxInfo, SandboxState, Substrate,
};

use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::metrics::Metrics;
use crate::store::{Store, StoredSandbox, FORMAT};
use crate::trajectory::{Journal, SandboxLog};

pub use create::Created;
pub use exec::{ExecEvents, PtyRequest, TerminalSession, DEFAULT_SHELL};
pub use files::FileDownload;
pub use reaper::{AGENT_EXITED, IDLE_PAUSED, IDLE_TIMEOUT, TTL_EXPIRED};
pub use recover::RecoveryReport;
pub use terminal::TerminalLog;
pub use trajectory::TrajectoryPages;

/// How many recently deleted sandboxes keep their reason for a friendlier 404.
const TOMBSTONES: usize = 4096;

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

pub(crate) struct Inner {
    cfg: NodeConfig,
    runtimes: Vec<Arc<dyn Runtime>>,
    store: Store,
    sandboxes: RwLock<HashMap<SandboxId, Arc<Sandbox>>>,
    keys: Mutex<HashMap<String, KeyEntry>>,
    /// (id, why it went, its tenant) of recently deleted sandboxes.
    tombstones: Mutex<VecDeque<(SandboxId, String, Option<String>)>>,
    /// Quota usage per tenant.
    tenants: Arc<crate::quota::Tenants>,
    metrics: Metrics,
    /// The sandboxes' CPU time read by the last scrape, `(ms since the epoch, µs of CPU)`:
    /// the start of the next scrape's idle-share window.
    scraped_cpu: Mutex<Option<(u64, u64)>>,
    /// Sandbox changes for `GET /v1/events`.
    events: events::Events,
    /// Set by [`Manager::shutdown`]: the daemon is going away, sandboxes are not.
    stopping: AtomicBool,
    /// Links, rules and resolvers of sandboxes whose network policy is not `none`.
    network: std::sync::OnceLock<Arc<warren_net::Network>>,
    /// Caps on starting and held sandboxes, memory headroom.
    admission: crate::admission::Admission,
    /// Where revive reads logs of sandboxes this node no longer holds (none: only its own).
    log_source: std::sync::OnceLock<Arc<dyn crate::trajectory::LogSource>>,
    /// The last terminal session number given out.
    terminals: AtomicU64,
    /// Ships trajectories off the node, when a trajectory store is set.
    shipper: std::sync::OnceLock<Arc<crate::ship::Shipper>>,
    /// Snapshots kept by the node, and directories of saves a crash cut off (removed by
    /// [`Manager::recover`]).
    snapshots: snapshots::Snapshots,
    snapshot_leftovers: Mutex<Vec<std::path::PathBuf>>,
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
        let (snapshots, snapshot_leftovers) = snapshots::Snapshots::open(snapshot_root);
        Manager {
            inner: Arc::new(Inner {
                cfg,
                runtimes,
                store,
                sandboxes: RwLock::new(HashMap::new()),
                keys: Mutex::new(HashMap::new()),
                tombstones: Mutex::new(VecDeque::new()),
                tenants: Arc::default(),
                metrics: Metrics::default(),
                scraped_cpu: Mutex::new(None),
                events: events::Events::default(),
                stopping: AtomicBool::new(false),
                network: std::sync::OnceLock::new(),
                admission,
                log_source: std::sync::OnceLock::new(),
                // Numbers stay unique across restarts of the daemon.
                terminals: AtomicU64::new(now_ms() * 1000),
                shipper: std::sync::OnceLock::new(),
                snapshots,
                snapshot_leftovers: Mutex::new(snapshot_leftovers),
            }),
        }
    }

    /// The runtimes this manager creates sandboxes with, one per substrate served.
    pub fn runtimes(&self) -> &[Arc<dyn Runtime>] {
        &self.inner.runtimes
    }

    /// Marks the daemon as stopping: the reaper and lost-agent watchers stand down, so
    /// connections closing during shutdown are not mistaken for dead sandboxes. Sandboxes are
    /// left running for the next start to re-adopt.
    pub fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        for r in &self.inner.runtimes {
            r.shutdown();
        }
    }

    fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::SeqCst)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.cfg
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The substrates this node serves.
    /// `function` is served wherever containers are (see `runtime_for`).
    pub fn substrates(&self) -> Vec<Substrate> {
        let mut out: Vec<Substrate> = self.inner.runtimes.iter().map(|r| r.substrate()).collect();
        if out.contains(&Substrate::Container) && !out.contains(&Substrate::Function) {
            out.push(Substrate::Function);
        }
        out
    }

    pub(crate) fn journal(&self) -> &Journal {
        self.inner.store.journal()
    }

    fn runtime_for(&self, s: Substrate) -> Result<Arc<dyn Runtime>, NodeError> {
        // A `function` sandbox made through the sandbox API is a container started by the
        // same runtime as the warm pools (its files and processes persist between its
        // commands); one-shot calls that each start fresh go through `/v1/functions/call`.
        let s = if s == Substrate::Function
            && !self.inner.runtimes.iter().any(|r| r.substrate() == s)
        {
            Substrate::Container
        } else {
            s
        };
        self.inner
            .runtimes
            .iter()
            .find(|r| r.substrate() == s)
            .cloned()
            .ok_or_else(|| NodeError::UnsupportedSubstrate {
                requested: s,
                served: self
                    .substrates()
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.inner.sandboxes.read().expect("sandbox map lock")
    }

    fn map_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<SandboxId, Arc<Sandbox>>> {
        self.inner.sandboxes.write().expect("sandbox map lock")
    }

    /// Finds a sandbox; a recently deleted one answers with why it went away.
    pub(crate) fn lookup(&self, id: &SandboxId) -> Result<Arc<Sandbox>, NodeError> {
        if let Some(sb) = self.map().get(id) {
            return Ok(sb.clone());
        }
        let why = self
            .inner
            .tombstones
            .lock()
            .expect("tombstones lock")
            .iter()
            .rev()
            .find(|(t, _, _)| t == id)
            .map(|(_, w, _)| w.clone());
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
        let owner = self.map().get(id).map(|sb| sb.lock().info.tenant.clone());
        let why = match owner {
            Some(owner) if caller.sees(owner.as_deref()) => return Ok(()),
            Some(_) => None,
            None => self
                .inner
                .tombstones
                .lock()
                .expect("tombstones lock")
                .iter()
                .rev()
                .find(|(t, _, owner)| t == id && caller.sees(owner.as_deref()))
                .map(|(_, w, _)| w.clone()),
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
        if self.inner.events.wanted() {
            self.inner
                .events
                .publish(SandboxChange::Changed(Arc::new(st.info.clone())));
        }
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
        let all: Vec<Arc<Sandbox>> = self.map().values().cloned().collect();
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
        self.map().len()
    }

    /// Sandboxes per state (every state listed, zeros included).
    pub fn count_by_state(&self) -> Vec<(SandboxState, u64)> {
        let all: Vec<Arc<Sandbox>> = self.map().values().cloned().collect();
        let mut counts = [
            (SandboxState::Creating, 0u64),
            (SandboxState::Running, 0),
            (SandboxState::Paused, 0),
            (SandboxState::Stopped, 0),
            (SandboxState::Failed, 0),
        ];
        for sb in all {
            let s = sb.lock().info.state;
            if let Some(c) = counts.iter_mut().find(|(st, _)| *st == s) {
                c.1 += 1;
            }
        }
        counts.to_vec()
    }

    /// The load summary a cluster gateway places by: sandboxes by state, memory reserved by
    /// the limits of starting and running ones, host memory, CPU pressure.
    pub fn load(&self) -> warren_types::NodeLoad {
        let all: Vec<Arc<Sandbox>> = self.map().values().cloned().collect();
        let mem = self.inner.admission.memory();
        let mut load = warren_types::NodeLoad {
            memory_available_mb: mem.available_mb,
            cpu_pressure: crate::pressure::cpu_some_avg10().unwrap_or(0.0),
            ..Default::default()
        };
        for sb in all {
            let st = sb.lock();
            *load
                .by_substrate
                .entry(st.info.substrate.as_str().to_string())
                .or_default() += 1;
            match st.info.state {
                SandboxState::Creating => load.creating += 1,
                SandboxState::Running => load.running += 1,
                SandboxState::Paused => load.paused += 1,
                SandboxState::Stopped => load.stopped += 1,
                SandboxState::Failed => load.failed += 1,
            }
            if matches!(
                st.info.state,
                SandboxState::Creating | SandboxState::Running
            ) {
                load.memory_reserved_mb += st.info.limits.memory_mb;
            }
        }
        load
    }

    /// What this node admits at most.
    pub fn capacity(&self) -> warren_types::NodeCapacity {
        let cfg = &self.inner.cfg;
        warren_types::NodeCapacity {
            max_sandboxes: cfg.max_sandboxes as u64,
            max_running: cfg.admission.max_running,
            max_starting: cfg.admission.max_starting,
            memory_total_mb: self.inner.admission.memory().total_mb,
            min_free_memory_mb: cfg.admission.min_free_memory_mb,
            max_sandbox_memory_mb: cfg.bounds.max_memory_mb,
        }
    }

    /// The state file's size and its limit, in bytes.
    pub fn state_usage(&self) -> (u64, u64) {
        (self.journal().state_bytes(), self.config().state_max_bytes)
    }

    fn remember_deleted(&self, id: &SandboxId, why: &str, tenant: Option<String>) {
        if self.inner.events.wanted() {
            self.inner.events.publish(SandboxChange::Deleted {
                id: id.clone(),
                why: why.to_string(),
                tenant: tenant.clone(),
            });
        }
        let mut t = self.inner.tombstones.lock().expect("tombstones lock");
        if t.len() >= TOMBSTONES {
            t.pop_front();
        }
        t.push_back((id.clone(), why.to_string(), tenant));
    }

    /// (sandboxes, memory MiB, CPUs, function calls) counted against `tenant`'s quotas.
    pub fn tenant_usage(&self, tenant: &str) -> (u64, u64, f64, u64) {
        self.inner.tenants.usage(tenant)
    }

    /// The idempotency-key table's key: keys are per tenant (NUL is refused in keys).
    pub(crate) fn scoped_key(tenant: Option<&str>, key: &str) -> String {
        match tenant {
            None => key.to_string(),
            Some(t) => format!("{t}\0{key}"),
        }
    }
}
