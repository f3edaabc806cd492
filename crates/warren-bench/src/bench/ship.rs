//! `warren-bench ship`: what the trajectory log costs a call, and how far the shipped log is
//! behind (not part of `all`).
//!
//! 1. Logging overhead: `exec true` from one client, then from 4 clients at once (each in
//!    its own sandbox). The overhead is the node's own measure of how long each call waited
//!    for its entry's commit (write, fsync, transaction), read from the
//!    `warren_trajectory_append_seconds` histogram over the runs: p50 (the upper bound of its
//!    bucket) and mean. Concurrent appends share one fsync, so 4 clients should wait about
//!    as long as one.
//! 2. Shipping lag (with `--trajectory-store URL`, the store the node ships to): steps at
//!    about 50 a second; the store is listed every 10 ms, and each step's lag is the time from
//!    its answer to the first listing that shows a segment holding it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use warren_blob::trajectory as shipped;
use warren_client::ExecRequest;
use warren_types::SandboxId;

use super::measure::Setup;
use super::replay::append_stats;
use crate::stats::Latency;

const CLIENTS: usize = 4;

/// What the ship bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct Ship {
    /// `exec true`, one client.
    pub exec_quiet: Latency,
    /// Commit wait per call, one client: p50 (bucket bound) and mean, in ms.
    pub append_quiet_p50_ms: Option<f64>,
    pub append_quiet_mean_ms: Option<f64>,
    /// `exec true`, 4 clients at once.
    pub exec_busy: Latency,
    pub append_busy_p50_ms: Option<f64>,
    pub append_busy_mean_ms: Option<f64>,
    /// Answer → readable in the store, per step (none without `--trajectory-store`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ship_lag: Option<Latency>,
}

async fn exec_true(s: &Setup, id: &str, n: usize) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        s.stop.check()?;
        let t = Instant::now();
        let r = s
            .client
            .exec(id, &ExecRequest::argv(["true"]))
            .await
            .context("exec true")?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(r.success(), "exec true: {r:?}");
    }
    Ok(out)
}

/// Steps at about 50 a second; the lag of each from its answer to the store.
async fn ship_lag(s: &Setup, url: &str, id: &str, n: usize) -> anyhow::Result<Latency> {
    let store = shipped::open_trajectory_store(url).with_context(|| format!("store {url}"))?;
    let sid: SandboxId = id.parse().context("sandbox id")?;
    let seen: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = {
        let (seen, done, store, sid) = (seen.clone(), done.clone(), store.clone(), sid.clone());
        tokio::spawn(async move {
            let mut read = HashSet::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let keys = store
                    .list(&shipped::sandbox_prefix(&sid))
                    .await
                    .unwrap_or_default();
                let now = Instant::now();
                for k in keys {
                    if shipped::parse_segment_key(&k).is_none() || !read.insert(k.clone()) {
                        continue;
                    }
                    let Ok(bytes) = store.get(&k).await else {
                        read.remove(&k);
                        continue;
                    };
                    if let Ok((_, lines)) = shipped::decode_segment(&k, &bytes) {
                        let mut seen = seen.lock().expect("lag lock");
                        for l in lines {
                            if let Some(step) = l.entry.step {
                                seen.entry(step).or_insert(now);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut answered = BTreeMap::new();
    for step in 1..=n as u64 {
        s.stop.check()?;
        let req = ExecRequest {
            step: Some(step),
            ..ExecRequest::argv(["true"])
        };
        s.client.exec(id, &req).await.context("exec a step")?;
        answered.insert(step, Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.lock().expect("lag lock").len() < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = poller.await;
    let seen = seen.lock().expect("lag lock").clone();
    let lags: Vec<f64> = answered
        .iter()
        .map(|(step, t)| match seen.get(step) {
            Some(v) => v.saturating_duration_since(*t).as_secs_f64() * 1000.0,
            // Not in the store within 30 s: counted as 30 s.
            None => 30_000.0,
        })
        .collect();
    Ok(Latency::from_samples(lags))
}

async fn run_in(s: &Setup, ids: &[String], n: usize, store: Option<&str>) -> anyhow::Result<Ship> {
    let c = &s.client;
    s.note("ship: exec true, one client");
    exec_true(s, &ids[0], 50).await?;
    let before = c.metrics().await?;
    let quiet = exec_true(s, &ids[0], n).await?;
    let after = c.metrics().await?;
    let (append_quiet_p50_ms, append_quiet_mean_ms) = append_stats(&before, &after);

    s.note(format!("ship: exec true, {CLIENTS} clients at once"));
    let before = c.metrics().await?;
    let runs = ids.iter().map(|id| exec_true(s, id, n)).collect::<Vec<_>>();
    let mut busy = Vec::new();
    for r in futures::future::join_all(runs).await {
        busy.extend(r?);
    }
    let after = c.metrics().await?;
    let (append_busy_p50_ms, append_busy_mean_ms) = append_stats(&before, &after);

    let ship_lag = match store {
        Some(url) => {
            s.note("ship: shipping lag, 50 steps a second");
            Some(ship_lag(s, url, &ids[1], n.min(300)).await?)
        }
        None => None,
    };
    Ok(Ship {
        exec_quiet: Latency::from_samples(quiet),
        append_quiet_p50_ms,
        append_quiet_mean_ms,
        exec_busy: Latency::from_samples(busy),
        append_busy_p50_ms,
        append_busy_mean_ms,
        ship_lag,
    })
}

/// Runs the ship bench in 4 new sandboxes, deleted afterwards.
pub async fn ship(s: &Setup, n: usize, store: Option<&str>) -> anyhow::Result<Ship> {
    let mut ids = Vec::new();
    for _ in 0..CLIENTS {
        match s.client.create(&s.request("ship")).await {
            Ok(sb) => ids.push(sb.id),
            Err(e) => {
                for id in &ids {
                    let _ = s.client.delete(id).await;
                }
                return Err(e).context("create");
            }
        }
    }
    let result = run_in(s, &ids, n, store).await;
    for id in &ids {
        s.client
            .delete(id)
            .await
            .with_context(|| format!("delete {id}"))?;
    }
    result
}

impl Ship {
    /// The human-readable lines.
    pub fn render(&self) -> String {
        let ms = crate::table::ms;
        let opt = |v: Option<f64>| v.map(ms).unwrap_or_else(|| "-".into());
        let mut out = format!(
            "logging: exec true p50 {} ms, commit wait p50 <= {} ms (mean {} ms), one client\n\
             logging: exec true p50 {} ms, commit wait p50 <= {} ms (mean {} ms), {CLIENTS} \
             clients at once\n",
            ms(self.exec_quiet.p50_ms),
            opt(self.append_quiet_p50_ms),
            opt(self.append_quiet_mean_ms),
            ms(self.exec_busy.p50_ms),
            opt(self.append_busy_p50_ms),
            opt(self.append_busy_mean_ms),
        );
        match &self.ship_lag {
            Some(l) => out.push_str(&format!(
                "shipping lag (answer to readable in the store): p50 {} ms, p99 {} ms, max {} ms \
                 over {} steps\n",
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.max_ms),
                l.n
            )),
            None => out.push_str("shipping lag: not measured (no --trajectory-store)\n"),
        }
        out
    }
}
