//! The measurements of `warren bench cluster`, each over processes of `procs.rs`. Every
//! request loop is bounded by a count, and every wait by a deadline.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use futures::StreamExt;
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest};
use warren_types::NodeState;

use super::procs::{Etcd, Gateway, RealNode, SimNodes};
use crate::stats::Latency;

/// Memory limit of every benchmark sandbox, in MiB (simulated nodes model 1 TiB each).
const SANDBOX_MB: u64 = 256;

/// Creates through several clients at once: what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Burst {
    pub requested: usize,
    pub created: usize,
    pub failed: usize,
    pub secs: f64,
    pub per_sec: f64,
    pub latency: Latency,
    pub first_error: Option<String>,
}

/// `n` creates with labels `labels(i)` and idempotency keys `<run>-<i>` from `concurrency`
/// tasks over `clients` in turn; `at(i)` is called as create `i` starts (for fault injection).
pub async fn burst(
    clients: &[Client],
    n: usize,
    concurrency: usize,
    run: &str,
    labels: impl Fn(usize) -> BTreeMap<String, String>,
    progress: Option<&str>,
) -> Burst {
    let started = Instant::now();
    let done = AtomicUsize::new(0);
    let first_error: Mutex<Option<String>> = Mutex::new(None);
    let labels = &labels;
    let done_ref = &done;
    let first_ref = &first_error;
    let results: Vec<Option<f64>> = futures::stream::iter(0..n)
        .map(|i| async move {
            let c = &clients[i % clients.len()];
            let req = CreateSandboxRequest {
                memory_mb: Some(SANDBOX_MB),
                labels: labels(i),
                idempotency_key: Some(format!("{run}-{i}")),
                ..Default::default()
            };
            let t = Instant::now();
            let r = c.create(&req).await;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let k = done_ref.fetch_add(1, Ordering::Relaxed) + 1;
            if let Some(what) = progress {
                if k.is_multiple_of(10_000) {
                    eprintln!("bench cluster: {what}: {k} of {n}");
                }
            }
            match r {
                Ok(_) => Some(ms),
                Err(e) => {
                    first_ref.lock().unwrap().get_or_insert(e.to_string());
                    None
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let secs = started.elapsed().as_secs_f64();
    let ok: Vec<f64> = results.iter().flatten().copied().collect();
    Burst {
        requested: n,
        created: ok.len(),
        failed: n - ok.len(),
        secs,
        per_sec: ok.len() as f64 / secs.max(1e-9),
        latency: Latency::from_samples(ok),
        first_error: first_error.into_inner().unwrap(),
    }
}

/// Clients over both gateways, each preferring a different one first.
pub fn clients(gateways: &[Gateway], per_client: usize) -> Result<Vec<Client>> {
    let urls: Vec<&str> = gateways.iter().map(|g| g.url.as_str()).collect();
    (0..urls.len())
        .map(|i| {
            let mut order = urls.clone();
            order.rotate_left(i);
            Client::builder()
                .url(order.join(","))
                .max_connections(per_client)
                .build()
                .context("a client of the gateways")
        })
        .collect()
}

/// Sandboxes per node as a gateway's view says.
pub async fn per_node(gw: &Gateway) -> Result<BTreeMap<String, u64>> {
    let info = gw.client.cluster().await.context("GET /v1/cluster")?;
    Ok(info
        .nodes
        .iter()
        .map(|n| (n.id.to_string(), n.record.load.sandboxes()))
        .collect())
}

/// Waits until the published loads add up to `total` (nodes publish at most once a second).
pub async fn settled(gw: &Gateway, total: u64, limit: Duration) -> Result<BTreeMap<String, u64>> {
    let deadline = Instant::now() + limit;
    loop {
        let counts = per_node(gw).await?;
        if counts.values().sum::<u64>() == total || Instant::now() > deadline {
            return Ok(counts);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Scale {
    pub nodes: usize,
    pub create: Burst,
    pub per_node_max: u64,
    pub per_node_min: u64,
    pub per_node_mean: f64,
    /// max / mean sandboxes per node.
    pub imbalance: f64,
    /// Listing one label value that 1,000 sandboxes carry, through a gateway.
    pub list_1000: Latency,
    pub list_found: usize,
    /// Sandboxes on each node once the burst settled.
    pub per_node: BTreeMap<String, u64>,
}

pub async fn scale(
    gateways: &[Gateway],
    nodes: usize,
    sandboxes: usize,
    concurrency: usize,
    run: &str,
) -> Result<Scale> {
    let cs = clients(gateways, concurrency)?;
    let create = burst(
        &cs,
        sandboxes,
        concurrency,
        run,
        |i| {
            BTreeMap::from([
                ("bench".to_string(), run.to_string()),
                ("batch".to_string(), (i / 1000).to_string()),
            ])
        },
        Some("scale"),
    )
    .await;
    let counts = settled(&gateways[0], create.created as u64, Duration::from_secs(10)).await?;
    let values: Vec<u64> = counts.values().copied().collect();
    let max = values.iter().copied().max().unwrap_or(0);
    let min = values.iter().copied().min().unwrap_or(0);
    let mean = values.iter().sum::<u64>() as f64 / values.len().max(1) as f64;
    // One label value names 1,000 sandboxes (the last batch may be short: use the first).
    let mut samples = Vec::new();
    let mut found = 0;
    let labels = BTreeMap::from([("batch".to_string(), "0".to_string())]);
    for i in 0..10 {
        let gw = &gateways[i % gateways.len()];
        let t = Instant::now();
        let list = gw
            .client
            .list(&labels, None)
            .await
            .context("listing a label")?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        found = list.len();
    }
    Ok(Scale {
        nodes,
        create,
        per_node_max: max,
        per_node_min: min,
        per_node_mean: mean,
        imbalance: max as f64 / mean.max(1e-9),
        list_1000: Latency::from_samples(samples),
        list_found: found,
        per_node: counts,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaderLoss {
    pub killed: String,
    pub burst: Burst,
    /// Sandboxes of the burst the gateways list afterwards (must equal `burst.created`).
    pub listed: usize,
    /// Nodes any gateway showed `lost` during the burst (and for two lease lives after).
    pub nodes_marked_lost: usize,
}

pub async fn leader_loss(
    etcd: &mut Etcd,
    gateways: &[Gateway],
    n: usize,
    concurrency: usize,
    run: &str,
) -> Result<LeaderLoss> {
    let cs = clients(gateways, concurrency)?;
    let leader = etcd.leader().await?;
    // Nodes lost before the burst (an earlier phase's) do not count.
    let before: std::collections::BTreeSet<String> = gateways[0]
        .client
        .cluster()
        .await
        .context("GET /v1/cluster")?
        .nodes
        .iter()
        .filter(|n| n.state != NodeState::Ready)
        .map(|n| n.id.to_string())
        .collect();
    let lost_seen = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Watch both gateways' views while the burst runs.
    let watchers: Vec<_> = gateways
        .iter()
        .map(|g| {
            let c = g.client.clone();
            let seen = lost_seen.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(info) = c.cluster().await {
                        for n in info.nodes.iter().filter(|n| n.state == NodeState::Lost) {
                            seen.lock().unwrap().insert(n.id.to_string());
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect();
    let killer = {
        let delay = Duration::from_millis(500);
        async move {
            tokio::time::sleep(delay).await;
            etcd.kill(leader).await
        }
    };
    let labels = |_| BTreeMap::from([("bench".to_string(), run.to_string())]);
    let (burst, killed) = tokio::join!(burst(&cs, n, concurrency, run, labels, None), killer);
    let killed = killed?;
    // Leases of the old leader's term are extended by the election: wait two lease lives
    // for a wrongly declared loss to show.
    tokio::time::sleep(Duration::from_secs(7)).await;
    stop.store(true, Ordering::Relaxed);
    for w in watchers {
        let _ = w.await;
    }
    let listed = gateways[0]
        .client
        .list(
            &BTreeMap::from([("bench".to_string(), run.to_string())]),
            None,
        )
        .await
        .context("listing the burst's sandboxes")?
        .len();
    let nodes_marked_lost = lost_seen.lock().unwrap().difference(&before).count();
    Ok(LeaderLoss {
        killed,
        burst,
        listed,
        nodes_marked_lost,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeLoss {
    pub node: String,
    /// Per gateway: milliseconds from `kill -9` until its view showed the node lost.
    pub noticed_ms: Vec<f64>,
    /// Calls to a sandbox of the dead node before its lease expired.
    pub call_fail: Latency,
    /// Their status codes (expected: 503).
    pub call_statuses: BTreeMap<u16, usize>,
    /// The status once the node is lost (expected: 410).
    pub status_after_lost: Option<u16>,
}

pub async fn node_loss(
    etcd: &str,
    gateways: &[Gateway],
    total_nodes: usize,
    run: &str,
) -> Result<NodeLoss> {
    let mut victim = SimNodes::start(etcd, "vic", 0, 1, 1).await?;
    let vid = victim.nodes[0].0.clone();
    for g in gateways {
        g.wait_ready(total_nodes + 1, Duration::from_secs(15))
            .await?;
    }
    // Creates until a few sandboxes are on the victim (placement spreads them).
    let cs = clients(gateways, 64)?;
    let mut on_victim = Vec::new();
    for round in 0..20 {
        let b = futures::stream::iter(0..200)
            .map(|i| {
                let c = cs[i % cs.len()].clone();
                async move {
                    c.create(&CreateSandboxRequest {
                        memory_mb: Some(SANDBOX_MB),
                        labels: BTreeMap::from([("bench".to_string(), format!("{run}-loss"))]),
                        ..Default::default()
                    })
                    .await
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await;
        on_victim.extend(
            b.into_iter()
                .flatten()
                .filter(|s| s.id.starts_with(&format!("{vid}-")))
                .map(|s| s.id),
        );
        if on_victim.len() >= 3 || round == 19 {
            break;
        }
    }
    let Some(target) = on_victim.first().cloned() else {
        bail!("no sandbox was placed on the victim node {vid}");
    };
    let probe = Client::builder()
        .url(gateways[0].url.clone())
        .max_retries(0)
        .build()?;
    victim.kill().await?;
    let killed_at = Instant::now();
    let noticed: Vec<_> = gateways
        .iter()
        .map(|g| {
            let c = g.client.clone();
            let vid = vid.clone();
            tokio::spawn(async move {
                while killed_at.elapsed() < Duration::from_secs(30) {
                    if let Ok(info) = c.cluster().await {
                        let lost = info
                            .nodes
                            .iter()
                            .any(|n| n.id.as_str() == vid && n.state == NodeState::Lost);
                        if lost {
                            return Some(killed_at.elapsed().as_secs_f64() * 1e3);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                None
            })
        })
        .collect();
    // Calls to the dead node's sandbox while its lease still runs (at most 30 of them).
    let mut samples = Vec::new();
    let mut statuses = BTreeMap::new();
    for _ in 0..30 {
        if killed_at.elapsed() > Duration::from_millis(2500) {
            break;
        }
        let t = Instant::now();
        let r = probe.get(&target).await;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        let s = r.err().and_then(|e| e.status()).unwrap_or(200);
        *statuses.entry(s).or_insert(0) += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut noticed_ms = Vec::new();
    for n in noticed {
        noticed_ms.push(n.await.ok().flatten().unwrap_or(f64::INFINITY));
    }
    let status_after_lost = probe.get(&target).await.err().and_then(|e| e.status());
    Ok(NodeLoss {
        node: vid,
        noticed_ms,
        call_fail: Latency::from_samples(samples),
        call_statuses: statuses,
        status_after_lost,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct Overhead {
    pub direct: Latency,
    pub via_gateway: Latency,
    /// p50 through the gateway minus p50 direct, same sandbox, interleaved.
    pub overhead_p50_ms: f64,
}

/// `exec true` in one sandbox of a real node, directly and through a gateway, in interleaved
/// rounds of 50 so that drift in the host's load falls on both.
pub async fn overhead(
    etcd: &str,
    gateway: &Gateway,
    n: usize,
    dir: &std::path::Path,
) -> Result<Overhead> {
    let id = format!("bx{}", std::process::id() % 100_000);
    let mut node = RealNode::start(etcd, &id, dir).await?;
    let result = async {
        gateway.wait_ready(1, Duration::from_secs(15)).await.ok();
        let direct = Client::builder().url(node.url.clone()).build()?;
        let sb = direct
            .create(&CreateSandboxRequest::default())
            .await
            .context("creating a sandbox on the real node")?;
        let measured = exec_rounds(&direct, &gateway.client, &sb.id, n).await;
        let deleted = direct.delete(&sb.id).await;
        let (d, g) = measured?;
        deleted.context("deleting the benchmark sandbox")?;
        let (direct, via_gateway) = (Latency::from_samples(d), Latency::from_samples(g));
        anyhow::Ok(Overhead {
            overhead_p50_ms: via_gateway.p50_ms - direct.p50_ms,
            direct,
            via_gateway,
        })
    }
    .await;
    node.stop().await;
    result
}

/// Interleaved rounds of 50 `exec true` directly and through the gateway, after a warm-up.
async fn exec_rounds(
    direct: &Client,
    gateway: &Client,
    id: &str,
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let req = ExecRequest::shell("true");
    for _ in 0..5 {
        direct.exec(id, &req).await?;
        gateway.exec(id, &req).await?;
    }
    let (mut d, mut g) = (Vec::new(), Vec::new());
    for _ in 0..n.div_ceil(50) {
        for (c, out) in [(direct, &mut d), (gateway, &mut g)] {
            for _ in 0..50 {
                let t = Instant::now();
                c.exec(id, &req).await?;
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok((d, g))
}
