//! The function substrate: warm pools of function containers for short stateless calls.
//!
//! A call (`POST /v1/functions/call`) names an image stack, limits and optionally a warm
//! interpreter; those make its [`PoolKey`]. Each pool keeps between `min_warm` and
//! `max_warm` function containers (see `warren_runtime::Runtime::create_function`): the
//! container's agent runs every call in a fresh environment of its own (new pid, mount, ipc
//! and uts namespaces and a new writable layer over the same read-only image layers) and
//! prepares the next environment in the background, so a call only hands over its command
//! and nothing of one call is visible to the next.
//!
//! - `pool.rs`: one pool — lend/return, bounded queue with a deadline (then `busy` with
//!   `retry_after`), background starts, replacement of crashed containers, shrinking;
//! - `backend.rs`: what a pool needs from the substrate, behind a trait (faked in tests);
//! - `call.rs`: a [`CallRequest`] into an agent call and its output into a [`CallResult`].
//!
//! Warm containers are not sandboxes of the API: they are in no listing, and they are
//! destroyed when the daemon stops (a restarted daemon removes any that were left).

mod backend;
mod call;
mod pool;
pub(crate) use pool::start_failed;
#[cfg(test)]
mod tests;

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use warren_types::sandbox::LimitBounds;
use warren_types::{ApiError, CallRequest, CallResult, Limits, PoolsInfo};

pub use backend::{NoBackend, RuntimeBackend, Warm, WarmBackend};
pub use pool::{Lease, Pool};

/// Settings of the node's function pools.
#[derive(Debug, Clone)]
pub struct FunctionConfig {
    /// Containers a pool keeps warm while it is in use.
    pub min_warm: usize,
    /// Most containers of one pool.
    pub max_warm: usize,
    /// Most calls waiting per pool; more are refused with `busy` at once.
    pub max_queue: usize,
    /// Longest a call waits for a container before `busy`.
    pub queue_timeout: Duration,
    /// A pool unused this long shrinks to `min_warm`.
    pub idle_shrink: Duration,
    /// A pool unused this long is emptied and dropped.
    pub pool_ttl: Duration,
    /// Cap on the memory (limits) of all warm containers of the node.
    pub max_warm_memory_mb: u64,
    /// `retry_after` of a `busy` answer, in seconds.
    pub retry_after_secs: u64,
    /// How often pools are checked for shrinking.
    pub tick: Duration,
    /// A pool whose calls wait for cells does not grow while the node's CPU pressure (PSI
    /// `some avg10`, in percent) is above this: more containers cannot help a saturated CPU.
    /// `None` ignores the pressure.
    pub max_cpu_pressure: Option<f64>,
}

impl Default for FunctionConfig {
    fn default() -> Self {
        FunctionConfig {
            min_warm: 2,
            max_warm: 32,
            max_queue: 512,
            queue_timeout: Duration::from_secs(10),
            idle_shrink: Duration::from_secs(30),
            pool_ttl: Duration::from_secs(600),
            max_warm_memory_mb: 64 * 1024,
            retry_after_secs: 1,
            tick: Duration::from_secs(1),
            max_cpu_pressure: Some(40.0),
        }
    }
}

/// Upper bounds (seconds) of the call and wait histograms.
const CALL_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// What makes two calls share a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolKey {
    /// Image refs, lowest first.
    pub image: Vec<String>,
    pub limits: Limits,
    pub interpreter: Option<String>,
    pub preload: Vec<String>,
    /// The tenant the pool's containers serve: warm containers are never lent across
    /// tenants.
    pub tenant: Option<String>,
}

impl PoolKey {
    fn id(&self) -> String {
        format!(
            "{:?}|{:?}|{}|{}|{}|{}|{:?}|{:?}",
            self.tenant,
            self.image,
            self.limits.cpus,
            self.limits.memory_mb,
            self.limits.disk_mb,
            self.limits.pids,
            self.interpreter,
            self.preload
        )
    }
}

/// The function call API's owner: the node's warm pools and the limits calls are held to.
/// Cheap to clone.
#[derive(Clone)]
pub struct Functions {
    pools: Arc<FunctionPools>,
    defaults: Limits,
    bounds: LimitBounds,
    /// Calls in flight per tenant (`max_concurrent_calls`).
    tenants: Arc<crate::quota::Tenants>,
}

impl std::fmt::Debug for Functions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Functions")
            .field("live", &self.pools.live())
            .finish()
    }
}

impl Functions {
    /// Calls in `pools`, their limits defaulted and bounded as a sandbox's are.
    pub fn new(pools: Arc<FunctionPools>, defaults: Limits, bounds: LimitBounds) -> Functions {
        Functions {
            pools,
            defaults,
            bounds,
            tenants: Arc::default(),
        }
    }

    /// `POST /v1/functions/call`.
    pub async fn call(&self, req: CallRequest) -> Result<CallResult, ApiError> {
        self.pools.call(req, &self.defaults, &self.bounds).await
    }

    /// `POST /v1/functions/call` by `caller`: in a pool of the caller's tenant, counted
    /// against its `max_concurrent_calls` while it runs or waits.
    pub async fn call_as(
        &self,
        caller: &warren_types::Caller,
        req: CallRequest,
    ) -> Result<CallResult, crate::NodeError> {
        let _slot = self.tenants.call_slot(caller)?;
        self.pools
            .call_for(caller.tenant.clone(), req, &self.defaults, &self.bounds)
            .await
            .map_err(crate::NodeError::Api)
    }

    /// `GET /v1/functions/pools` for one tenant (`None`: every pool).
    pub fn info_for(&self, tenant: Option<&str>) -> PoolsInfo {
        self.pools.info_for(tenant)
    }

    /// `GET /v1/functions/pools`.
    pub fn info(&self) -> PoolsInfo {
        self.pools.info()
    }

    /// Adds the pools' figures to a scrape's registry.
    pub fn register_metrics(&self, reg: &mut Registry) {
        self.pools.register_metrics(reg)
    }

    /// Destroys every warm container.
    pub async fn shutdown(&self) {
        self.pools.shutdown().await
    }

    /// The pools themselves.
    pub fn pools(&self) -> &Arc<FunctionPools> {
        &self.pools
    }
}

/// Every warm pool of the node.
pub struct FunctionPools {
    shared: Arc<pool::Shared>,
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    ticker: Mutex<Option<tokio::task::JoinHandle<()>>>,
    call_seconds: Histogram,
    wait_seconds: Histogram,
}

impl FunctionPools {
    pub fn new(cfg: FunctionConfig, backend: Arc<dyn WarmBackend>) -> Arc<FunctionPools> {
        Arc::new(FunctionPools {
            shared: Arc::new(pool::Shared {
                cfg,
                backend,
                reserved_mb: Default::default(),
                live: Default::default(),
            }),
            pools: Mutex::new(HashMap::new()),
            ticker: Mutex::new(None),
            call_seconds: Histogram::new(CALL_BUCKETS),
            wait_seconds: Histogram::new(CALL_BUCKETS),
        })
    }

    pub fn config(&self) -> &FunctionConfig {
        &self.shared.cfg
    }

    /// The pool of `key`, made (and started towards its minimum) on first use.
    pub fn pool(self: &Arc<Self>, key: PoolKey) -> Arc<Pool> {
        let id = key.id();
        let (p, new) = {
            let mut pools = self.pools.lock().expect("pools lock");
            match pools.get(&id) {
                Some(p) => (p.clone(), false),
                None => {
                    let p = Pool::new(key, self.shared.clone());
                    pools.insert(id, p.clone());
                    (p, true)
                }
            }
        };
        if new {
            self.ensure_ticker();
            self.make_room(&p);
            p.refill();
        }
        p
    }

    /// Under the node's memory cap, frees idle containers of the least recently used other
    /// pools so that `p` can start one.
    fn make_room(&self, p: &Arc<Pool>) {
        let need = p.key.limits.memory_mb;
        let cap = self.shared.cfg.max_warm_memory_mb;
        loop {
            if self.shared.reserved_mb.load(Ordering::SeqCst) + need <= cap {
                return;
            }
            let mut others: Vec<Arc<Pool>> = self
                .pools
                .lock()
                .expect("pools lock")
                .values()
                .filter(|o| !Arc::ptr_eq(o, p))
                .cloned()
                .collect();
            others.sort_by_key(|o| o.last_used());
            if !others.iter().any(|o| o.evict_idle()) {
                return;
            }
        }
    }

    /// Takes a container of `key`'s pool.
    pub async fn acquire(
        self: &Arc<Self>,
        key: PoolKey,
    ) -> Result<(Arc<Pool>, Lease), warren_types::ApiError> {
        let p = self.pool(key);
        if p.stats().idle == 0 {
            self.make_room(&p);
        }
        let lease = p.acquire().await?;
        Ok((p, lease))
    }

    fn ensure_ticker(self: &Arc<Self>) {
        let mut t = self.ticker.lock().expect("ticker lock");
        if t.is_some() {
            return;
        }
        let weak = Arc::downgrade(self);
        let every = self.shared.cfg.tick;
        *t = Some(tokio::spawn(async move {
            let mut iv = tokio::time::interval(every);
            loop {
                iv.tick().await;
                let Some(me) = weak.upgrade() else { return };
                me.tick(Instant::now());
            }
        }));
    }

    /// Shrinks unused pools and drops empty ones; refills the others to their minimum.
    pub fn tick(&self, now: Instant) {
        let all: Vec<(String, Arc<Pool>)> = self
            .pools
            .lock()
            .expect("pools lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, p) in all {
            if p.shrink(now) {
                let mut pools = self.pools.lock().expect("pools lock");
                if pools.get(&id).is_some_and(|q| Arc::ptr_eq(q, &p)) && p.stats().busy == 0 {
                    pools.remove(&id);
                }
            } else if p
                .last_used()
                .is_some_and(|t| now.duration_since(t) < self.shared.cfg.idle_shrink)
            {
                p.refill();
            }
        }
    }

    pub fn info(&self) -> PoolsInfo {
        self.info_for(None)
    }

    /// The pools of `tenant` only (`None`: every pool).
    pub fn info_for(&self, tenant: Option<&str>) -> PoolsInfo {
        let mut pools: Vec<_> = self
            .pools
            .lock()
            .expect("pools lock")
            .values()
            .map(|p| p.stats())
            .filter(|p| tenant.is_none_or(|t| p.tenant.as_deref() == Some(t)))
            .collect();
        pools.sort_by(|a, b| a.image.cmp(&b.image).then(a.memory_mb.cmp(&b.memory_mb)));
        PoolsInfo {
            pools,
            warm_memory_mb: self.shared.reserved_mb.load(Ordering::SeqCst),
            max_warm_memory_mb: self.shared.cfg.max_warm_memory_mb,
        }
    }

    /// Adds the pools' figures to a scrape's registry.
    pub fn register_metrics(&self, reg: &mut Registry) {
        let info = self.info();
        let (mut idle, mut busy, mut queued, mut calls, mut rejected, mut replaced) =
            (0, 0, 0, 0, 0, 0);
        for p in &info.pools {
            idle += p.idle;
            busy += p.busy;
            queued += p.queued;
            calls += p.calls;
            rejected += p.rejected;
            replaced += p.replaced;
        }
        for (name, help, v) in [
            (
                "warren_function_pools",
                "Warm function pools",
                info.pools.len() as u64,
            ),
            (
                "warren_function_warm_idle",
                "Warm function containers waiting for a call",
                idle,
            ),
            (
                "warren_function_warm_busy",
                "Warm function containers running a call",
                busy,
            ),
            (
                "warren_function_queued",
                "Function calls waiting for a container",
                queued,
            ),
            (
                "warren_function_warm_memory_mb",
                "Memory reserved by warm function containers",
                info.warm_memory_mb,
            ),
        ] {
            reg.register(name, help, ConstGauge::new(v as i64));
        }
        for (name, help, v) in [
            (
                "warren_function_calls",
                "Function calls given a container",
                calls,
            ),
            (
                "warren_function_rejected",
                "Function calls refused with busy",
                rejected,
            ),
            (
                "warren_function_replaced",
                "Warm function containers replaced after a crash or failure",
                replaced,
            ),
        ] {
            reg.register(name, help, ConstCounter::new(v));
        }
        reg.register(
            "warren_function_call_seconds",
            "Wall time of successful function calls, waiting included",
            self.call_seconds.clone(),
        );
        reg.register(
            "warren_function_wait_seconds",
            "Time successful function calls waited for a warm container",
            self.wait_seconds.clone(),
        );
    }

    /// Destroys every warm container (daemon shutdown; calls still running finish first).
    pub async fn shutdown(&self) {
        if let Some(t) = self.ticker.lock().expect("ticker lock").take() {
            t.abort();
        }
        let all: Vec<Arc<Pool>> = self
            .pools
            .lock()
            .expect("pools lock")
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in all {
            p.close().await;
        }
        // Calls still running return their containers to closed pools, which destroy them;
        // containers still starting are destroyed when they are up.
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.shared.live.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Containers started and not yet destroyed.
    pub fn live(&self) -> u64 {
        self.shared.live.load(Ordering::SeqCst)
    }
}
