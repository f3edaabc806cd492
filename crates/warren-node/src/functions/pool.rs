//! One warm pool: idle containers, calls waiting for one, background starts and retirement.
//!
//! Invariants (under the pool's lock): `idle.len() + busy + starting` containers exist or
//! are being made, each holding its memory reservation in [`Shared::reserved_mb`];
//! a container is in `idle` only while no call uses it; a waiter is handed a container
//! directly (it never sits idle while someone waits).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use warren_types::{ApiError, ErrorCode, PoolStats};

use super::backend::{Warm, WarmBackend};
use super::{FunctionConfig, PoolKey};

/// Shortest time between two growths of a pool whose calls wait for cells.
pub const GROW_INTERVAL: Duration = Duration::from_millis(250);

/// A container of a pool.
pub struct Member {
    pub warm: Arc<dyn Warm>,
    retired: AtomicBool,
}

type Handoff = oneshot::Sender<Result<Arc<Member>, ApiError>>;

#[derive(Default)]
struct State {
    idle: VecDeque<Arc<Member>>,
    busy: usize,
    starting: usize,
    waiters: VecDeque<Handoff>,
    last_used: Option<Instant>,
    /// When [`Pool::cells_lagging`] last grew the pool.
    last_grown: Option<Instant>,
    calls: u64,
    rejected: u64,
    replaced: u64,
}

impl State {
    fn total(&self) -> usize {
        self.idle.len() + self.busy + self.starting
    }
}

/// What every pool of a node shares.
pub struct Shared {
    pub cfg: FunctionConfig,
    pub backend: Arc<dyn WarmBackend>,
    /// Memory reserved by every warm container of the node (their limits).
    pub reserved_mb: AtomicU64,
    /// Containers started and not yet destroyed (or being started).
    pub live: AtomicU64,
}

impl Shared {
    /// Reserves `mb` under the node cap.
    fn reserve(&self, mb: u64) -> bool {
        self.reserved_mb
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                (r + mb <= self.cfg.max_warm_memory_mb).then_some(r + mb)
            })
            .is_ok()
    }
    fn unreserve(&self, mb: u64) {
        let _ = self
            .reserved_mb
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| {
                Some(r.saturating_sub(mb))
            });
    }
}

pub struct Pool {
    pub key: PoolKey,
    shared: Arc<Shared>,
    state: Mutex<State>,
    /// Set at shutdown: containers coming back are destroyed.
    closed: AtomicBool,
}

/// A container lent to one call; give it back with [`Pool::release`].
pub struct Lease {
    pub member: Arc<Member>,
    pub queued: Duration,
}

impl Pool {
    pub fn new(key: PoolKey, shared: Arc<Shared>) -> Arc<Pool> {
        Arc::new(Pool {
            key,
            shared,
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("pool lock")
    }

    fn mem(&self) -> u64 {
        self.key.limits.memory_mb
    }

    fn busy_error(&self, why: &str) -> ApiError {
        let mut e = ApiError::new(
            ErrorCode::Busy,
            format!("every warm container of this function pool is busy ({why})"),
        );
        e.retry_after = Some(self.shared.cfg.retry_after_secs);
        e
    }

    /// Takes a warm container, starting one or waiting in the bounded queue if needed.
    pub async fn acquire(self: &Arc<Self>) -> Result<Lease, ApiError> {
        let t0 = Instant::now();
        let rx = {
            let mut st = self.lock();
            st.last_used = Some(t0);
            while let Some(m) = st.idle.pop_front() {
                if m.warm.is_lost() {
                    drop(st);
                    self.retire(m, true);
                    st = self.lock();
                    continue;
                }
                st.busy += 1;
                st.calls += 1;
                return Ok(Lease {
                    member: m,
                    queued: Duration::ZERO,
                });
            }
            if st.waiters.len() >= self.shared.cfg.max_queue {
                st.rejected += 1;
                return Err(self.busy_error("and the queue is full"));
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.push_back(tx);
            // One more container for this waiter, if the pool and the node allow it.
            let want = st.waiters.len() > st.starting;
            drop(st);
            if want {
                self.start_one();
            }
            rx
        };
        match tokio::time::timeout(self.shared.cfg.queue_timeout, rx).await {
            Ok(Ok(Ok(m))) => Ok(Lease {
                member: m,
                queued: t0.elapsed(),
            }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(ApiError::internal("function pool closed")),
            Err(_) => {
                self.lock().rejected += 1;
                Err(self.busy_error("waited for the queue deadline"))
            }
        }
    }

    /// Gives a container back after a call; a container whose call failed badly is replaced.
    pub fn release(self: &Arc<Self>, lease: Lease, healthy: bool) {
        {
            let mut st = self.lock();
            st.busy -= 1;
        }
        if healthy && !lease.member.warm.is_lost() {
            self.hand_over(lease.member);
        } else {
            self.retire(lease.member, true);
        }
    }

    /// Gives `m` to the first live waiter, else puts it at the back of `idle`.
    fn hand_over(self: &Arc<Self>, m: Arc<Member>) {
        if self.closed.load(Ordering::SeqCst) {
            return self.retire(m, false);
        }
        let mut st = self.lock();
        let mut m = m;
        while let Some(tx) = st.waiters.pop_front() {
            st.busy += 1;
            st.calls += 1;
            match tx.send(Ok(m)) {
                Ok(()) => return,
                Err(back) => {
                    // That caller gave up (queue deadline); try the next one.
                    st.busy -= 1;
                    st.calls -= 1;
                    match back {
                        Ok(b) => m = b,
                        Err(_) => return,
                    }
                }
            }
        }
        st.idle.push_back(m);
    }

    /// Retires a container: destroys it in the background and frees its reservation;
    /// `replace` starts another one when the pool is below its minimum or calls wait.
    pub fn retire(self: &Arc<Self>, m: Arc<Member>, replace: bool) {
        if m.retired.swap(true, Ordering::SeqCst) {
            return;
        }
        {
            let mut st = self.lock();
            st.idle.retain(|x| !Arc::ptr_eq(x, &m));
            if replace {
                st.replaced += 1;
            }
        }
        self.shared.unreserve(self.mem());
        let shared = self.shared.clone();
        tokio::spawn(async move {
            m.warm.destroy().await;
            shared.live.fetch_sub(1, Ordering::SeqCst);
        });
        if replace && !self.closed.load(Ordering::SeqCst) {
            self.refill();
        }
    }

    /// Starts containers until the pool holds its minimum and every waiter has one coming.
    pub fn refill(self: &Arc<Self>) {
        loop {
            let need = {
                let st = self.lock();
                st.total() < self.shared.cfg.min_warm || st.waiters.len() > st.starting
            };
            if !need || !self.start_one() {
                return;
            }
        }
    }

    /// Starts one container in the background; false when the pool or node cap forbids it.
    fn start_one(self: &Arc<Self>) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        {
            let mut st = self.lock();
            if st.total() >= self.shared.cfg.max_warm {
                return false;
            }
            if !self.shared.reserve(self.mem()) {
                return false;
            }
            st.starting += 1;
            self.shared.live.fetch_add(1, Ordering::SeqCst);
        }
        let me = self.clone();
        tokio::spawn(async move {
            let r = me.shared.backend.start(&me.key).await;
            match r {
                Ok(warm) => {
                    let m = Arc::new(Member {
                        warm,
                        retired: AtomicBool::new(false),
                    });
                    me.lock().starting -= 1;
                    // Watch for a crash of the container while it lives.
                    let (watch_pool, watch_m) = (me.clone(), m.clone());
                    tokio::spawn(async move {
                        watch_m.warm.lost().await;
                        if !watch_m.retired.load(Ordering::SeqCst) {
                            tracing::warn!("a warm function container died; replacing it");
                            watch_pool.retire(watch_m, true);
                        }
                    });
                    me.hand_over(m);
                }
                Err(e) => {
                    me.shared.unreserve(me.mem());
                    me.shared.live.fetch_sub(1, Ordering::SeqCst);
                    tracing::warn!(error = %e, image = ?me.key.image, "cannot start a warm function container");
                    let mut st = me.lock();
                    st.starting -= 1;
                    // With nothing else coming, the callers get the reason now.
                    if st.total() == 0 {
                        let api = start_failed(&e);
                        for tx in st.waiters.drain(..) {
                            let _ = tx.send(Err(api.clone()));
                        }
                    }
                }
            }
        });
        true
    }

    /// A call waited for its container's next call environment (cell): each container
    /// prepares one cell at a time (a warm interpreter takes a cold start to prepare), so
    /// calls come faster than this pool's containers can take them. Grow by one container,
    /// unless one is already starting or the pool and node caps forbid it; idle ones shrink
    /// away again when the calls stop.
    ///
    /// Damped: at most one container per [`GROW_INTERVAL`], so the CPU that starting
    /// containers takes (which makes cells slower still) cannot feed the growth; and not at
    /// all while the node's CPU is saturated (`max_cpu_pressure`), when cells are slow for
    /// want of CPU, not of containers.
    pub fn cells_lagging(self: &Arc<Self>) {
        let now = Instant::now();
        let go = {
            let mut st = self.lock();
            let due = st
                .last_grown
                .is_none_or(|t| now.duration_since(t) >= GROW_INTERVAL);
            let go = due && st.starting == 0 && st.waiters.is_empty();
            if go {
                st.last_grown = Some(now);
            }
            go
        };
        if !go {
            return;
        }
        // Read only once a growth is due (at most once per `GROW_INTERVAL`), not per call.
        let saturated = self
            .shared
            .cfg
            .max_cpu_pressure
            .is_some_and(|max| crate::pressure::cpu_some_avg10().is_some_and(|p| p > max));
        if !saturated && self.start_one() {
            tracing::debug!(image = ?self.key.image, "calls wait for cells: one more warm container");
        }
    }

    /// Shrinks an unused pool: idle containers above the minimum go after `idle_shrink`,
    /// all of them after `pool_ttl`. True when the pool is empty and unused (to be dropped).
    pub fn shrink(self: &Arc<Self>, now: Instant) -> bool {
        let cfg = &self.shared.cfg;
        let (victims, empty) = {
            let mut st = self.lock();
            let unused = st
                .last_used
                .map_or(Duration::MAX, |t| now.duration_since(t));
            let keep = if unused >= cfg.pool_ttl {
                0
            } else if unused >= cfg.idle_shrink {
                cfg.min_warm
            } else {
                usize::MAX
            };
            let mut v = Vec::new();
            while st.idle.len() > keep {
                // The longest-idle containers are at the front.
                if let Some(m) = st.idle.pop_front() {
                    v.push(m);
                }
            }
            let empty = keep == 0 && st.total() == 0 && st.waiters.is_empty();
            (v, empty)
        };
        for m in victims {
            self.retire(m, false);
        }
        empty
    }

    /// Gives up one idle container (for another pool under the node's memory cap).
    pub fn evict_idle(self: &Arc<Self>) -> bool {
        let m = self.lock().idle.pop_front();
        match m {
            Some(m) => {
                self.retire(m, false);
                true
            }
            None => false,
        }
    }

    pub fn last_used(&self) -> Option<Instant> {
        self.lock().last_used
    }

    /// Destroys every idle container and refuses the waiters (daemon shutdown).
    pub async fn close(self: &Arc<Self>) {
        self.closed.store(true, Ordering::SeqCst);
        let (idle, waiters) = {
            let mut st = self.lock();
            (
                st.idle.drain(..).collect::<Vec<_>>(),
                st.waiters.drain(..).collect::<Vec<_>>(),
            )
        };
        for tx in waiters {
            let mut e = ApiError::new(ErrorCode::Busy, "the node is shutting down");
            e.retry_after = Some(self.shared.cfg.retry_after_secs);
            let _ = tx.send(Err(e));
        }
        for m in idle {
            if !m.retired.swap(true, Ordering::SeqCst) {
                self.shared.unreserve(self.mem());
                m.warm.destroy().await;
                self.shared.live.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    pub fn stats(&self) -> PoolStats {
        let st = self.lock();
        PoolStats {
            image: self.key.image.clone(),
            tenant: self.key.tenant.clone(),
            cpus: self.key.limits.cpus,
            memory_mb: self.key.limits.memory_mb,
            disk_mb: self.key.limits.disk_mb,
            pids: self.key.limits.pids,
            interpreter: self.key.interpreter.clone(),
            preload: self.key.preload.clone(),
            idle: st.idle.len() as u64,
            busy: st.busy as u64,
            starting: st.starting as u64,
            queued: st.waiters.len() as u64,
            calls: st.calls,
            rejected: st.rejected,
            replaced: st.replaced,
        }
    }
}

/// What callers are told when their pool's container could not start.
pub(crate) fn start_failed(e: &warren_runtime::RuntimeError) -> ApiError {
    ApiError::new(e.code(), format!("cannot start a function container: {e}"))
}
