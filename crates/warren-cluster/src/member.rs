//! The node side of membership: register `<root>/nodes/<id>` under a lease, keep the lease
//! alive (through any etcd outage, until etcd says the lease is gone), publish the load
//! summary, and register again by itself after a lost lease. The node serves its sandboxes all
//! along: nothing here is on its request path.
//!
//! A second live node with the same id is refused: the key is created in a transaction on
//! `create_revision == 0`; an existing key of another incarnation (taken at boot) is somebody
//! else's. At boot, a key left by this node's previous run (killed, so its lease has not
//! expired yet) is waited for up to two lease lifetimes before the id is called taken.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use warren_types::{NodeLoad, NodeRecord};

use crate::error::{ClusterError, IdHeld, JoinError, Result};
use crate::etcd::{bounded, connect};
use crate::keys::Keys;

/// Settings of a node's membership.
#[derive(Debug, Clone)]
pub struct MemberConfig {
    pub endpoints: Vec<String>,
    pub keys: Keys,
    /// Lease time to live, in seconds.
    pub ttl_secs: i64,
    /// How often the lease is renewed.
    pub keepalive: Duration,
    /// How often the record is looked at for changes.
    pub tick: Duration,
    /// Least time between two publications.
    pub min_publish: Duration,
    /// Relative change of a load figure that is worth publishing.
    pub change: f64,
    /// Run before the node registers again after it lost its registration (not before the
    /// first one): while it was away its sandboxes may have been revived elsewhere.
    pub before_rejoin: Option<RejoinHook>,
    /// Until when the node's registration certainly lives (see [`LeaseClock`]).
    pub lease_clock: LeaseClock,
}

/// Until when a node's registration certainly lives: the send time of the last keep-alive
/// (or grant) etcd answered with a live lease, plus the lease's time to live. Past it, the
/// lease may have expired in etcd: gateways may have called the node lost and revived its
/// sandboxes elsewhere, so the node must not run a step of one before it knows (it reads the
/// revive marks, see `warren-node`'s `Trajectories`). Never registered: not in doubt (the
/// node checked the marks at its start). Cheap to clone; every clone is the same clock.
#[derive(Debug, Clone, Default)]
pub struct LeaseClock(Arc<std::sync::Mutex<Option<Instant>>>);

impl LeaseClock {
    /// The registration lives at least until `until`.
    fn lives_until(&self, until: Instant) {
        let mut t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if t.is_none_or(|t| t < until) {
            *t = Some(until);
        }
    }

    /// True when the node was registered and its lease may have expired since.
    pub fn in_doubt(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| Instant::now() >= t)
    }
}

/// What a node does before it registers again after losing its registration; the node is
/// not registered (gateways send it nothing) until it finishes.
#[derive(Clone)]
pub struct RejoinHook(
    pub  Arc<
        dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync,
    >,
);

impl std::fmt::Debug for RejoinHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RejoinHook")
    }
}

impl MemberConfig {
    pub fn new(endpoints: Vec<String>) -> Self {
        MemberConfig {
            endpoints,
            keys: Keys::default(),
            ttl_secs: 3,
            keepalive: Duration::from_secs(1),
            tick: Duration::from_millis(250),
            min_publish: Duration::from_secs(1),
            change: 0.05,
            before_rejoin: None,
            lease_clock: LeaseClock::default(),
        }
    }
}

/// Where the membership stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberState {
    /// Not registered yet (or registering again).
    Connecting,
    /// Registered under this lease.
    Registered { lease: i64 },
    /// Another live node holds the id.
    Refused(IdHeld),
}

/// Produces the node's current record (called at most every `tick`).
pub type RecordSource = Arc<dyn Fn() -> NodeRecord + Send + Sync>;

/// A running membership. Dropping it stops renewing (the key then expires with its lease);
/// [`Membership::leave`] removes it at once.
pub struct Membership {
    state: watch::Receiver<MemberState>,
    task: tokio::task::JoinHandle<()>,
    leave: Option<tokio::sync::oneshot::Sender<tokio::sync::oneshot::Sender<()>>>,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Membership {
    /// Starts registering in the background.
    pub fn start(cfg: MemberConfig, source: RecordSource) -> Membership {
        let (tx, rx) = watch::channel(MemberState::Connecting);
        let (leave_tx, leave_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(run(cfg, source, tx, leave_rx));
        Membership {
            state: rx,
            task,
            leave: Some(leave_tx),
        }
    }

    /// The current state.
    pub fn state(&self) -> MemberState {
        self.state.borrow().clone()
    }

    /// A receiver of state changes.
    pub fn subscribe(&self) -> watch::Receiver<MemberState> {
        self.state.clone()
    }

    /// Waits until registered (`Ok(true)`), refused (`Err`), or `limit` passed (`Ok(false)`:
    /// etcd is unreachable; registration goes on in the background).
    pub async fn wait_registered(&self, limit: Duration) -> Result<bool, JoinError> {
        let mut rx = self.state.clone();
        let res = tokio::time::timeout(
            limit,
            rx.wait_for(|s| !matches!(s, MemberState::Connecting)),
        )
        .await;
        match res {
            Err(_) => Ok(false),
            Ok(Err(_)) => Err(JoinError::Stopped),
            Ok(Ok(s)) => match &*s {
                MemberState::Registered { .. } => Ok(true),
                MemberState::Refused(why) => Err(JoinError::Refused(why.clone())),
                MemberState::Connecting => Ok(false),
            },
        }
    }

    /// Revokes the lease (the key goes at once) and stops, within `limit`.
    pub async fn leave(mut self, limit: Duration) {
        if let Some(tx) = self.leave.take() {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            if tx.send(done_tx).is_ok() {
                let _ = tokio::time::timeout(limit, done_rx).await;
            }
        }
        self.task.abort();
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type LeaveRx = tokio::sync::oneshot::Receiver<tokio::sync::oneshot::Sender<()>>;

/// Longest pause between attempts to reach etcd, renew the lease or register: short, so a
/// node renews its lease well within the TTL a new leader gives every lease once etcd is back.
const RETRY_CAP: Duration = Duration::from_millis(500);

async fn run(
    cfg: MemberConfig,
    source: RecordSource,
    state: watch::Sender<MemberState>,
    mut leave: LeaveRx,
) {
    let boot = Instant::now();
    let mut registered_once = false;
    // Registering again after a lost registration (the hook runs first).
    let mut rejoin = false;
    let mut client: Option<Client> = None;
    let mut backoff = Duration::from_millis(100);
    // The lease of a registration whose key moved to a new lease (revoked once registered).
    let mut replaced: Option<i64> = None;
    loop {
        let c = match &client {
            Some(c) => c.clone(),
            None => match connect(&cfg.endpoints).await {
                Ok(c) => {
                    client = Some(c.clone());
                    c
                }
                Err(e) => {
                    warn!(error = %e, "cannot reach etcd; retrying");
                    if wait_or_leave(&mut leave, backoff).await {
                        return;
                    }
                    backoff = (backoff * 2).min(RETRY_CAP);
                    continue;
                }
            },
        };
        if rejoin {
            if let Some(hook) = &cfg.before_rejoin {
                (hook.0)().await;
            }
            rejoin = false;
        }
        let record = source();
        let asked = Instant::now();
        match register(&c, &cfg, &record).await {
            Ok(lease) => {
                cfg.lease_clock
                    .lives_until(asked + Duration::from_secs(cfg.ttl_secs as u64));
                backoff = Duration::from_millis(100);
                registered_once = true;
                info!(node = %record.id, lease, "registered in the cluster");
                state.send_replace(MemberState::Registered { lease });
                // A lease left behind when the key moved to this one: nothing lives under it.
                if let Some(old) = replaced.take().filter(|old| *old != lease) {
                    let mut c = c.clone();
                    let _ = bounded("lease revoke", c.lease_revoke(old)).await;
                }
                // Keep this lease until etcd says it is gone: an outage (etcd member gone,
                // leader election, quorum lost, the node cut off) is waited out on the same
                // lease, which lives on in etcd as long as no leader let it expire (a new
                // leader extends every lease). Registering again while it may live would
                // leave the old key to expire under gateways' eyes.
                let mut c = c;
                let mut outage: Option<Instant> = None;
                let mut warned = false;
                let mut retry = Duration::from_millis(100);
                loop {
                    let (end, answered) =
                        serve_lease(&c, &cfg, &source, source(), lease, &mut leave).await;
                    if answered {
                        if warned {
                            info!(
                                lease,
                                "etcd answers again; still registered under the same lease"
                            );
                        }
                        outage = None;
                        warned = false;
                        retry = Duration::from_millis(100);
                    }
                    match end {
                        LeaseEnd::Leave(done) => {
                            let mut c = c.clone();
                            let _ = bounded("lease revoke", c.lease_revoke(lease)).await;
                            info!("left the cluster");
                            let _ = done.send(());
                            return;
                        }
                        LeaseEnd::Expired(why) => {
                            warn!(reason = %why, lease, "cluster registration lost; registering again");
                            replaced = Some(lease);
                            break;
                        }
                        LeaseEnd::Broken(why) => {
                            let since = *outage.get_or_insert_with(Instant::now);
                            if !warned && since.elapsed() > Duration::from_secs(cfg.ttl_secs as u64)
                            {
                                warn!(reason = %why, lease,
                                    "etcd has not renewed the lease for a lease lifetime; \
                                     renewing it until etcd answers whether it still lives");
                                warned = true;
                            } else {
                                debug!(reason = %why, "lease keep-alive interrupted; retrying");
                            }
                            if wait_or_leave(&mut leave, retry).await {
                                return;
                            }
                            retry = (retry * 2).min(RETRY_CAP);
                            // A fresh connection: the old one may be wedged (closed by the
                            // server, or to a member that is gone).
                            if let Ok(fresh) = connect(&cfg.endpoints).await {
                                client = Some(fresh.clone());
                                c = fresh;
                            }
                        }
                    }
                }
                state.send_replace(MemberState::Connecting);
                rejoin = true;
            }
            Err(ClusterError::DuplicateNode {
                id,
                incarnation,
                address,
            }) => {
                // At boot the key may be our previous run's, waiting for its lease to end.
                let patience = Duration::from_secs(cfg.ttl_secs as u64 * 2 + 1);
                let why = IdHeld {
                    id,
                    incarnation,
                    address,
                };
                if registered_once || boot.elapsed() > patience {
                    if !matches!(&*state.borrow(), MemberState::Refused(_)) {
                        warn!(reason = %why, "cluster registration refused");
                    }
                    state.send_replace(MemberState::Refused(why));
                } else {
                    debug!(reason = %why, "waiting for a stale registration to expire");
                }
                if wait_or_leave(&mut leave, Duration::from_millis(500)).await {
                    return;
                }
            }
            Err(e) => {
                warn!(error = %e, "cluster registration failed; retrying");
                if matches!(e, ClusterError::Etcd(_)) {
                    client = None;
                }
                if wait_or_leave(&mut leave, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(RETRY_CAP);
            }
        }
    }
}

/// Sleeps `d`; true when asked to leave meanwhile (the leave is answered at once: there is no
/// lease to revoke).
async fn wait_or_leave(leave: &mut LeaveRx, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        r = leave => {
            if let Ok(done) = r {
                let _ = done.send(());
            }
            true
        }
    }
}

fn encode(record: &NodeRecord) -> Vec<u8> {
    serde_json::to_vec(record).expect("a node record serializes")
}

/// Creates the node's key under a new lease, or takes over a key of this very incarnation
/// (left from before an outage). Refuses a key of another incarnation.
async fn register(client: &Client, cfg: &MemberConfig, record: &NodeRecord) -> Result<i64> {
    let mut c = client.clone();
    let key = cfg.keys.node(&record.id);
    let lease = bounded("lease grant", c.lease_grant(cfg.ttl_secs, None))
        .await?
        .id();
    let put = || {
        TxnOp::put(
            key.clone(),
            encode(record),
            Some(PutOptions::new().with_lease(lease)),
        )
    };
    // The `known` key (no lease) outlives the registration: gateways started later still
    // answer `sandbox_lost` for this node's sandboxes.
    let known = || TxnOp::put(cfg.keys.known(&record.id), encode(record), None);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([put(), known()])
        .or_else([TxnOp::get(key.clone(), None)]);
    let resp = bounded("register", c.txn(txn)).await?;
    if resp.succeeded() {
        return Ok(lease);
    }
    let existing = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    });
    let Some(kv) = existing else {
        // Gone between the compare and the get: try again with a fresh lease.
        let _ = bounded("lease revoke", c.lease_revoke(lease)).await;
        return Err(ClusterError::BadRecord {
            key,
            message: "vanished while registering".into(),
        });
    };
    let theirs: Option<NodeRecord> = serde_json::from_slice(kv.value()).ok();
    let same = theirs
        .as_ref()
        .is_some_and(|t| t.incarnation == record.incarnation);
    if same {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([put(), known()]);
        if bounded("re-register", c.txn(txn)).await?.succeeded() {
            return Ok(lease);
        }
    }
    let _ = bounded("lease revoke", c.lease_revoke(lease)).await;
    let (incarnation, address) = theirs
        .map(|t| (t.incarnation, t.address))
        .unwrap_or_else(|| ("?".into(), "?".into()));
    Err(ClusterError::DuplicateNode {
        id: record.id.clone(),
        incarnation,
        address,
    })
}

/// What a node can tell about its lease from etcd's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseFate {
    /// etcd says the lease does not exist (it expired or was revoked): register again.
    Gone,
    /// etcd renewed it, or did not answer about it (unreachable, no leader, no quorum, a
    /// broken stream): the lease may live on, since only a leader expires leases and a new
    /// leader extends every lease. Keep renewing it.
    MayLive,
}

/// The fate of a lease whose keep-alive answered with `ttl` seconds left.
fn fate_of_ttl(ttl: i64) -> LeaseFate {
    if ttl > 0 {
        LeaseFate::MayLive
    } else {
        LeaseFate::Gone
    }
}

/// The fate of a lease whose keep-alive failed with `e`. etcd answers a keep-alive of a lease
/// it does not have with TTL 0 (the client makes that "lease not found" when it opens the
/// stream), and other lease calls with "requested lease not found"; any other failure says
/// nothing about the lease.
fn fate_of_error(e: &ClusterError) -> LeaseFate {
    let not_found = |m: &str| m.contains("lease not found");
    match e {
        ClusterError::Etcd(etcd_client::Error::LeaseKeepAliveError(m)) if not_found(m) => {
            LeaseFate::Gone
        }
        ClusterError::Etcd(etcd_client::Error::GRpcStatus(s)) if not_found(s.message()) => {
            LeaseFate::Gone
        }
        _ => LeaseFate::MayLive,
    }
}

/// How keeping the lease ends after a keep-alive failed with `e`.
fn failed(e: &ClusterError) -> LeaseEnd {
    match fate_of_error(e) {
        LeaseFate::Gone => LeaseEnd::Expired(format!("etcd says the lease is gone: {e}")),
        LeaseFate::MayLive => LeaseEnd::Broken(e.to_string()),
    }
}

enum LeaseEnd {
    Leave(tokio::sync::oneshot::Sender<()>),
    /// The lease is gone (or the key left it): register anew.
    Expired(String),
    /// etcd did not answer; the lease may still live: renew it again.
    Broken(String),
}

/// Keeps the lease alive and publishes the record while the lease holds; says how it ended
/// and whether etcd answered at all.
async fn serve_lease(
    client: &Client,
    cfg: &MemberConfig,
    source: &RecordSource,
    published: NodeRecord,
    lease: i64,
    leave: &mut LeaveRx,
) -> (LeaseEnd, bool) {
    let mut answered = false;
    let end = keep_lease(client, cfg, source, published, lease, leave, &mut answered).await;
    (end, answered)
}

async fn keep_lease(
    client: &Client,
    cfg: &MemberConfig,
    source: &RecordSource,
    mut published: NodeRecord,
    lease: i64,
    leave: &mut LeaveRx,
    answered: &mut bool,
) -> LeaseEnd {
    let mut c = client.clone();
    let key = cfg.keys.node(&published.id);
    let ttl = Duration::from_secs(cfg.ttl_secs as u64);
    // Opening the stream sends a first keep-alive and waits for its answer: a live lease
    // (renewed from now), or "not found".
    let opened = Instant::now();
    let (mut keeper, mut stream) =
        match bounded("lease keep-alive", c.lease_keep_alive(lease)).await {
            Ok(k) => k,
            Err(e) => return failed(&e),
        };
    *answered = true;
    cfg.lease_clock.lives_until(opened + ttl);
    let mut renew = tokio::time::interval(cfg.keepalive);
    let mut tick = tokio::time::interval(cfg.tick);
    let mut last_publish = Instant::now();
    let mut last_answer = Instant::now();
    // When each keep-alive not answered yet was sent (etcd answers them in order).
    let mut sent = std::collections::VecDeque::new();
    loop {
        tokio::select! {
            r = &mut *leave => {
                return match r {
                    Ok(done) => LeaseEnd::Leave(done),
                    // The handle was dropped: keep going until the task is aborted.
                    Err(_) => std::future::pending().await,
                };
            }
            _ = renew.tick() => {
                sent.push_back(Instant::now());
                if let Err(e) = keeper.keep_alive().await {
                    return LeaseEnd::Broken(format!("keep-alive: {e}"));
                }
                // No answer for a whole lease time: the stream may be stuck on a member
                // that is gone; open a new one (on the same lease, which may still live).
                if last_answer.elapsed() > ttl + cfg.keepalive {
                    return LeaseEnd::Broken("no keep-alive answer".into());
                }
            }
            m = stream.message() => match m {
                Ok(Some(r)) => {
                    last_answer = Instant::now();
                    *answered = true;
                    if fate_of_ttl(r.ttl()) == LeaseFate::Gone {
                        return LeaseEnd::Expired("etcd says the lease expired".into());
                    }
                    // Renewed after it was sent: the lease lives a TTL from then at least.
                    if let Some(at) = sent.pop_front() {
                        cfg.lease_clock.lives_until(at + ttl);
                    }
                }
                Ok(None) => return LeaseEnd::Broken("keep-alive stream ended".into()),
                Err(e) => return failed(&ClusterError::Etcd(e)),
            },
            _ = tick.tick() => {
                if last_publish.elapsed() < cfg.min_publish {
                    continue;
                }
                let now = source();
                if !worth_publishing(&published, &now, cfg.change) {
                    continue;
                }
                let txn = Txn::new()
                    .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
                    .and_then([TxnOp::put(key.clone(), encode(&now), Some(PutOptions::new().with_lease(lease)))]);
                match bounded("publish", c.txn(txn)).await {
                    Ok(r) if r.succeeded() => {
                        published = now;
                        last_publish = Instant::now();
                    }
                    Ok(_) => return LeaseEnd::Expired("the key is no longer under this lease".into()),
                    // etcd is slow or away: try again next tick; the keep-alive decides.
                    Err(e) => debug!(error = %e, "cannot publish the load summary"),
                }
            }
        }
    }
}

/// True when `now` differs from `published` in anything but load, or a load figure moved by
/// more than `change` (relative; counts by at least one).
pub fn worth_publishing(published: &NodeRecord, now: &NodeRecord, change: f64) -> bool {
    let strip = |r: &NodeRecord| NodeRecord {
        load: NodeLoad::default(),
        pools: r
            .pools
            .iter()
            .map(|p| warren_types::WarmPool {
                idle: 0,
                busy: 0,
                ..p.clone()
            })
            .collect(),
        ..r.clone()
    };
    if strip(published) != strip(now) {
        return true;
    }
    let moved = |a: f64, b: f64, floor: f64| (a - b).abs() > (a.abs() * change).max(floor);
    let (a, b) = (&published.load, &now.load);
    let counts = [
        (a.creating, b.creating),
        (a.running, b.running),
        (a.paused, b.paused),
        (a.stopped, b.stopped),
        (a.failed, b.failed),
    ];
    if counts.iter().any(|(x, y)| moved(*x as f64, *y as f64, 0.5)) {
        return true;
    }
    if moved(
        a.memory_reserved_mb as f64,
        b.memory_reserved_mb as f64,
        1.0,
    ) || moved(
        a.memory_available_mb as f64,
        b.memory_available_mb as f64,
        1.0,
    ) || moved(a.cpu_pressure, b.cpu_pressure, 5.0)
    {
        return true;
    }
    published.pools.iter().zip(&now.pools).any(|(p, q)| {
        moved(p.idle as f64, q.idle as f64, 0.5) || moved(p.busy as f64, q.busy as f64, 0.5)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::{NodeCapacity, Substrate, NODE_RECORD_FORMAT};

    fn record() -> NodeRecord {
        NodeRecord {
            format: NODE_RECORD_FORMAT,
            id: "n1".parse().unwrap(),
            incarnation: "a".into(),
            address: "http://127.0.0.1:1".into(),
            version: "0".into(),
            started_at_ms: 0,
            substrates: vec![Substrate::Container],
            capacity: NodeCapacity::default(),
            load: NodeLoad {
                running: 100,
                memory_available_mb: 10_000,
                cpu_pressure: 10.0,
                ..Default::default()
            },
            pools: vec![],
            images: Default::default(),
            layers: vec![],
            blob_store: false,
        }
    }

    #[test]
    fn only_etcd_saying_so_ends_a_lease() {
        // Renewed: keep it. TTL 0 (or -1): etcd has no such lease.
        assert_eq!(fate_of_ttl(3), LeaseFate::MayLive);
        assert_eq!(fate_of_ttl(0), LeaseFate::Gone);
        assert_eq!(fate_of_ttl(-1), LeaseFate::Gone);
        // The client's answer when it opens a keep-alive of a lease etcd does not have.
        let gone = ClusterError::Etcd(etcd_client::Error::LeaseKeepAliveError(
            "lease not found".into(),
        ));
        assert_eq!(fate_of_error(&gone), LeaseFate::Gone);
        assert!(matches!(failed(&gone), LeaseEnd::Expired(_)));
        let status = tonic::Status::not_found("etcdserver: requested lease not found");
        let gone = ClusterError::Etcd(etcd_client::Error::GRpcStatus(status));
        assert_eq!(fate_of_error(&gone), LeaseFate::Gone);
        // etcd away, without a leader or quorum, slow, or the connection cut: the lease may
        // live on (a new leader extends it), so the node keeps renewing it.
        let away = [
            ClusterError::Timeout {
                what: "lease keep-alive",
                ms: 2000,
            },
            ClusterError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::unavailable(
                "etcdserver: no leader",
            ))),
            ClusterError::Etcd(etcd_client::Error::GRpcStatus(tonic::Status::unknown(
                "h2 protocol error: error reading a body from connection",
            ))),
            ClusterError::Etcd(etcd_client::Error::LeaseKeepAliveError(
                "channel closed".into(),
            )),
        ];
        for e in &away {
            assert_eq!(fate_of_error(e), LeaseFate::MayLive, "{e}");
            assert!(matches!(failed(e), LeaseEnd::Broken(_)), "{e}");
        }
    }

    #[test]
    fn publishes_only_changes_over_five_percent() {
        let a = record();
        let mut b = a.clone();
        assert!(!worth_publishing(&a, &b, 0.05));
        b.load.running = 104;
        assert!(!worth_publishing(&a, &b, 0.05), "4% is not worth it");
        b.load.running = 106;
        assert!(worth_publishing(&a, &b, 0.05));
        let mut b = a.clone();
        b.load.creating = 1;
        assert!(worth_publishing(&a, &b, 0.05), "from zero, one counts");
        let mut b = a.clone();
        b.load.cpu_pressure = 13.0;
        assert!(
            !worth_publishing(&a, &b, 0.05),
            "pressure moves by 5 points"
        );
        let mut b = a.clone();
        b.layers.push("sha256:x".into());
        assert!(worth_publishing(&a, &b, 0.05), "structure always counts");
    }
}
