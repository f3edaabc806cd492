//! Pool logic against a fake backend (no containers): sizes, queueing, `busy`, crashes,
//! shrinking, the node memory cap and shutdown.

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use warren_proto::InvokeSpec;
use warren_runtime::{ExitInfo, InvokeOutput, RuntimeError};
use warren_types::sandbox::LimitBounds;
use warren_types::{CallRequest, ErrorCode, Limits};

use super::*;

struct FakeWarm {
    lost: watch::Sender<bool>,
    destroyed: AtomicBool,
    calls: AtomicUsize,
    delay: Duration,
    cell_wait_us: u64,
}

#[async_trait]
impl Warm for FakeWarm {
    async fn call(&self, spec: InvokeSpec, input: Bytes) -> Result<InvokeOutput, RuntimeError> {
        if *self.lost.borrow() {
            return Err(RuntimeError::AgentLost);
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        Ok(InvokeOutput {
            stdout: format!("{} {}", spec.exec.argv.join(" "), input.len()).into_bytes(),
            exit: ExitInfo {
                exit_code: Some(0),
                ..Default::default()
            },
            cell_wait_us: self.cell_wait_us,
            ..Default::default()
        })
    }
    async fn lost(&self) {
        let mut rx = self.lost.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }
    fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
    async fn destroy(&self) {
        self.destroyed.store(true, Ordering::SeqCst);
        let _ = self.lost.send(true);
    }
}

#[derive(Default)]
struct Fake {
    made: Mutex<Vec<Arc<FakeWarm>>>,
    fail: AtomicBool,
    call_delay: Mutex<Duration>,
    cell_wait_us: Mutex<u64>,
}

impl Fake {
    fn made(&self) -> Vec<Arc<FakeWarm>> {
        self.made.lock().unwrap().clone()
    }
    fn alive(&self) -> usize {
        self.made()
            .iter()
            .filter(|w| !w.destroyed.load(Ordering::SeqCst))
            .count()
    }
}

#[async_trait]
impl WarmBackend for Fake {
    async fn start(&self, _key: &PoolKey) -> Result<Arc<dyn Warm>, RuntimeError> {
        tokio::time::sleep(Duration::from_millis(5)).await;
        if self.fail.load(Ordering::SeqCst) {
            return Err(RuntimeError::ImageNotFound("nope".into()));
        }
        let w = Arc::new(FakeWarm {
            lost: watch::channel(false).0,
            destroyed: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            delay: *self.call_delay.lock().unwrap(),
            cell_wait_us: *self.cell_wait_us.lock().unwrap(),
        });
        self.made.lock().unwrap().push(w.clone());
        Ok(w)
    }
}

fn cfg() -> FunctionConfig {
    FunctionConfig {
        min_warm: 2,
        max_warm: 4,
        max_queue: 3,
        queue_timeout: Duration::from_millis(300),
        idle_shrink: Duration::from_secs(30),
        pool_ttl: Duration::from_secs(600),
        max_warm_memory_mb: 10_000,
        retry_after_secs: 2,
        tick: Duration::from_secs(3600),
        max_cpu_pressure: None,
    }
}

fn req(mem: u64) -> CallRequest {
    let mut r = CallRequest::argv(["echo", "hi"]);
    r.memory_mb = Some(mem);
    r.stdin = Some("abc".into());
    r
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

fn pools(fake: &Arc<Fake>, c: FunctionConfig) -> Arc<FunctionPools> {
    FunctionPools::new(c, fake.clone())
}

async fn call(
    p: &Arc<FunctionPools>,
    r: CallRequest,
) -> Result<warren_types::CallResult, warren_types::ApiError> {
    p.call(r, &Limits::default(), &LimitBounds::default()).await
}

#[tokio::test]
async fn first_call_fills_the_pool_to_its_minimum() {
    let fake = Arc::new(Fake::default());
    let p = pools(&fake, cfg());
    let r = call(&p, req(100)).await.unwrap();
    assert_eq!(r.stdout, "echo hi 3");
    settle().await;
    let info = p.info();
    assert_eq!(info.pools.len(), 1);
    assert_eq!((info.pools[0].idle, info.pools[0].busy), (2, 0));
    assert_eq!(info.warm_memory_mb, 200);
    // Consecutive calls reuse the warm containers, oldest-idle first.
    for _ in 0..4 {
        call(&p, req(100)).await.unwrap();
    }
    assert_eq!(fake.made().len(), 2);
    let per: Vec<usize> = fake
        .made()
        .iter()
        .map(|w| w.calls.load(Ordering::SeqCst))
        .collect();
    assert_eq!(per.iter().sum::<usize>(), 5);
    assert!(per.iter().all(|c| *c >= 2), "{per:?}");
    // Different limits make another pool.
    call(&p, req(200)).await.unwrap();
    assert_eq!(p.info().pools.len(), 2);
}

/// Calls that wait for their container's call environment grow the pool by one container per
/// `GROW_INTERVAL` at most, up to `max_warm`.
#[tokio::test]
async fn calls_waiting_for_cells_grow_the_pool_damped() {
    let fake = Arc::new(Fake::default());
    *fake.cell_wait_us.lock().unwrap() = 5_000;
    let p = pools(&fake, cfg());
    call(&p, req(100)).await.unwrap();
    settle().await;
    assert_eq!(fake.made().len(), 3, "the first lagging call adds one");
    call(&p, req(100)).await.unwrap();
    call(&p, req(100)).await.unwrap();
    settle().await;
    assert_eq!(fake.made().len(), 3, "growth is damped");
    for _ in 0..3 {
        tokio::time::sleep(pool::GROW_INTERVAL).await;
        call(&p, req(100)).await.unwrap();
        settle().await;
    }
    assert_eq!(
        fake.made().len(),
        cfg().max_warm,
        "growth stops at max_warm"
    );
    assert_eq!(fake.alive(), cfg().max_warm);
}

#[tokio::test]
async fn saturation_queues_then_answers_busy_with_retry_after() {
    let fake = Arc::new(Fake::default());
    *fake.call_delay.lock().unwrap() = Duration::from_millis(200);
    let p = pools(&fake, cfg());
    let mut tasks = Vec::new();
    for _ in 0..7 {
        let p = p.clone();
        tasks.push(tokio::spawn(async move { call(&p, req(100)).await }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let results: Vec<_> = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let busy: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    // 4 containers at most, 3 waiting at most: 7 callers all get an answer; every refusal
    // is `busy` with a retry hint, and nothing waits forever.
    assert!(ok >= 4, "{results:?}");
    assert!(
        busy.iter()
            .all(|e| e.code == ErrorCode::Busy && e.retry_after == Some(2)),
        "{busy:?}"
    );
    assert!(fake.made().len() <= 4);
    // An 8th caller beyond the queue is refused at once.
    *fake.call_delay.lock().unwrap() = Duration::from_millis(500);
    let mut c = cfg();
    c.max_warm = 1;
    c.min_warm = 1;
    c.max_queue = 1;
    let fake2 = Arc::new(Fake::default());
    *fake2.call_delay.lock().unwrap() = Duration::from_millis(400);
    let p2 = pools(&fake2, c);
    let a = tokio::spawn({
        let p2 = p2.clone();
        async move { call(&p2, req(100)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let b = tokio::spawn({
        let p2 = p2.clone();
        async move { call(&p2, req(100)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t = Instant::now();
    let e = call(&p2, req(100)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Busy);
    assert!(
        t.elapsed() < Duration::from_millis(100),
        "refused without waiting"
    );
    assert!(a.await.unwrap().is_ok());
    // The queued one waited past its 300 ms deadline behind a 400 ms call.
    assert_eq!(b.await.unwrap().unwrap_err().code, ErrorCode::Busy);
    assert!(p2.info().pools[0].rejected >= 2);
}

#[tokio::test]
async fn a_crashed_container_is_replaced() {
    let fake = Arc::new(Fake::default());
    let p = pools(&fake, cfg());
    call(&p, req(100)).await.unwrap();
    settle().await;
    let victim = fake.made()[0].clone();
    let _ = victim.lost.send(true);
    settle().await;
    let s = &p.info().pools[0];
    assert_eq!(s.replaced, 1);
    assert_eq!(s.idle, 2, "refilled to the minimum");
    assert!(victim.destroyed.load(Ordering::SeqCst));
    assert_eq!(fake.alive(), 2);
    // A container lost during the call: the call is tried again on another one.
    for w in fake.made() {
        let _ = w.lost.send(true);
    }
    let r = call(&p, req(100)).await;
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn a_failing_image_answers_the_waiting_callers() {
    let fake = Arc::new(Fake::default());
    fake.fail.store(true, Ordering::SeqCst);
    let p = pools(&fake, cfg());
    let t = Instant::now();
    let e = call(&p, req(100)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e:?}");
    assert!(t.elapsed() < Duration::from_millis(250));
    assert_eq!(p.info().warm_memory_mb, 0);
}

#[tokio::test]
async fn unused_pools_shrink_then_go() {
    let fake = Arc::new(Fake::default());
    let mut c = cfg();
    c.min_warm = 1;
    c.max_queue = 8;
    let p = pools(&fake, c.clone());
    // Four at once grow the pool to four.
    *fake.call_delay.lock().unwrap() = Duration::from_millis(50);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { call(&p, req(100)).await })
        })
        .collect();
    for t in calls {
        t.await.unwrap().unwrap();
    }
    settle().await;
    assert_eq!(p.info().pools[0].idle, 4);
    p.tick(Instant::now() + c.idle_shrink + Duration::from_secs(1));
    settle().await;
    assert_eq!(p.info().pools[0].idle, 1);
    p.tick(Instant::now() + c.pool_ttl + Duration::from_secs(1));
    settle().await;
    assert!(p.info().pools.is_empty());
    assert_eq!(fake.alive(), 0);
    assert_eq!(p.info().warm_memory_mb, 0);
}

#[tokio::test]
async fn the_node_memory_cap_bounds_warm_containers() {
    let fake = Arc::new(Fake::default());
    let mut c = cfg();
    c.max_warm_memory_mb = 300;
    let p = pools(&fake, c);
    call(&p, req(100)).await.unwrap();
    settle().await;
    assert_eq!(p.info().warm_memory_mb, 200);
    // Another pool: the first pool's idle containers make room.
    call(&p, req(150)).await.unwrap();
    settle().await;
    let info = p.info();
    assert!(info.warm_memory_mb <= 300, "{info:?}");
    assert_eq!(
        fake.alive() as u64,
        info.pools.iter().map(|p| p.idle + p.busy).sum::<u64>()
    );
}

#[tokio::test]
async fn shutdown_destroys_every_warm_container() {
    let fake = Arc::new(Fake::default());
    *fake.call_delay.lock().unwrap() = Duration::from_millis(100);
    let p = pools(&fake, cfg());
    call(&p, req(100)).await.unwrap();
    let running = tokio::spawn({
        let p = p.clone();
        async move { call(&p, req(100)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    p.shutdown().await;
    assert!(running.await.unwrap().is_ok(), "a running call finishes");
    assert_eq!(p.live(), 0);
    assert_eq!(fake.alive(), 0);
}
