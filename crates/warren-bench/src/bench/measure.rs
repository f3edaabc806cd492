//! The four measurements, all through the HTTP API: create latency, exec latency, create
//! throughput and memory density. Each deletes what it created.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ImageRef};

use super::delete_all_reporting;
use super::phases::Phases;
use crate::commands::{run_tasks, Stop};
use crate::stats::Latency;

/// Label carried by every benchmark sandbox; its value is the run id.
pub const BENCH_LABEL: &str = "warren.bench";

/// What every measurement needs.
#[derive(Debug, Clone)]
pub struct Setup {
    pub client: Client,
    /// The daemon's URL as given (`None`: the client's default).
    pub url: Option<String>,
    pub image: String,
    /// The sandboxes' writable-layer medium and size (`None`: the node's defaults).
    pub disk_medium: Option<warren_types::DiskMedium>,
    pub disk_mb: Option<u64>,
    pub run_id: String,
    /// Print progress to stderr.
    pub progress: bool,
    /// Set on Ctrl-C: start no new call.
    pub stop: Stop,
}

impl Setup {
    pub(super) fn request(&self, kind: &str) -> CreateSandboxRequest {
        CreateSandboxRequest {
            image: ImageRef::Name(self.image.clone()),
            disk_medium: self.disk_medium,
            disk_mb: self.disk_mb,
            labels: BTreeMap::from([
                (BENCH_LABEL.to_string(), self.run_id.clone()),
                (format!("{BENCH_LABEL}.kind"), kind.to_string()),
            ]),
            ..Default::default()
        }
    }

    pub fn note(&self, msg: impl std::fmt::Display) {
        if self.progress {
            eprintln!("bench: {msg}");
        }
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

async fn exec_true(client: &Client, id: &str) -> anyhow::Result<()> {
    let r = client
        .exec(id, &ExecRequest::argv(["true"]))
        .await
        .context("exec true")?;
    anyhow::ensure!(
        r.success(),
        "`true` exited with {:?} (signal {:?})",
        r.exit_code,
        r.signal
    );
    Ok(())
}

/// One create-to-first-exec sample; the sandbox is deleted after the clock stops.
async fn create_sample(s: &Setup) -> anyhow::Result<f64> {
    let t = Instant::now();
    let sb = s
        .client
        .create(&s.request("create"))
        .await
        .context("create")?;
    let ran = exec_true(&s.client, &sb.id).await;
    let elapsed = ms_since(t);
    let deleted = s
        .client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id));
    ran?;
    deleted?;
    Ok(elapsed)
}

/// A latency summary and the quantiles its CDF is drawn from (see [`quantiles`]).
pub type Sampled = (Latency, Vec<f64>);

fn sampled(samples: Vec<f64>) -> Sampled {
    let q = quantiles(&samples);
    (Latency::from_samples(samples), q)
}

/// Create → first `exec true` finished, `n` times with `concurrency` workers.
pub async fn create_latency(s: &Setup, n: usize, concurrency: usize) -> anyhow::Result<Sampled> {
    s.note(format!(
        "create: {n} samples, {concurrency} at a time (after 3 warm-up)"
    ));
    for _ in 0..3 {
        s.stop.check()?;
        create_sample(s).await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let workers = (0..concurrency.max(1)).map(|_| {
        let (s, next, samples) = (s.clone(), next.clone(), samples.clone());
        async move {
            while !s.stop.is_set() && next.fetch_add(1, Ordering::Relaxed) < n {
                let v = create_sample(&s).await?;
                samples.lock().expect("samples lock").push(v);
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    for w in run_tasks(workers).await {
        w??;
    }
    let samples = std::mem::take(&mut *samples.lock().expect("samples lock"));
    Ok(sampled(samples))
}

/// Round trips of `exec true` in one running sandbox, and where their time went (see
/// [`Phases`]: the node's metrics are scraped right around the measured calls).
pub async fn exec_latency(
    s: &Setup,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(Sampled, Option<Phases>)> {
    s.note(format!(
        "exec: {n} round trips, {concurrency} at a time (after 50 warm-up)"
    ));
    let sb = s
        .client
        .create(&s.request("exec"))
        .await
        .context("create")?;
    let id = sb.id.clone();
    let result = async {
        for _ in 0..50 {
            s.stop.check()?;
            exec_true(&s.client, &id).await?;
        }
        let before = s.client.metrics().await.ok();
        let next = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(Mutex::new(Vec::with_capacity(n)));
        let workers = (0..concurrency.max(1)).map(|_| {
            let (client, id, next, samples, stop) = (
                s.client.clone(),
                id.clone(),
                next.clone(),
                samples.clone(),
                s.stop.clone(),
            );
            async move {
                while !stop.is_set() && next.fetch_add(1, Ordering::Relaxed) < n {
                    let t = Instant::now();
                    exec_true(&client, &id).await?;
                    samples.lock().expect("samples lock").push(ms_since(t));
                }
                Ok::<_, anyhow::Error>(())
            }
        });
        for w in run_tasks(workers).await {
            w??;
        }
        let after = s.client.metrics().await.ok();
        let samples = std::mem::take(&mut *samples.lock().expect("samples lock"));
        let (latency, q) = sampled(samples);
        let phases = match (before, after) {
            // One at a time: the node's means are those of the client's calls.
            (Some(b), Some(a)) if concurrency <= 1 => Phases::between(&b, &a, latency.mean_ms),
            _ => None,
        };
        Ok::<_, anyhow::Error>(((latency, q), phases))
    }
    .await;
    s.client
        .delete(&id)
        .await
        .with_context(|| format!("delete {id}"))?;
    result
}

/// Sustained creation rate.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub n: usize,
    pub concurrency: usize,
    pub created: usize,
    pub failed: usize,
    pub secs: f64,
    pub per_sec: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// Creates from `concurrency` clients at once, collecting the ids for deletion.
pub(super) async fn create_many(
    s: &Setup,
    kind: &'static str,
    n: usize,
    concurrency: usize,
    stop_on_error: bool,
) -> anyhow::Result<(Vec<String>, usize, Option<String>, f64)> {
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let failures = Arc::new(Mutex::new((0usize, None::<String>)));
    let t = Instant::now();
    let workers = (0..concurrency.max(1)).map(|_| {
        let (s, next, stop, ids, failures) = (
            s.clone(),
            next.clone(),
            stop.clone(),
            ids.clone(),
            failures.clone(),
        );
        async move {
            while !stop.load(Ordering::Relaxed)
                && !s.stop.is_set()
                && next.fetch_add(1, Ordering::Relaxed) < n
            {
                match s.client.create(&s.request(kind)).await {
                    Ok(sb) => {
                        let mut ids = ids.lock().expect("ids lock");
                        ids.push(sb.id);
                        let done = ids.len();
                        if done % 500 == 0 {
                            s.note(format!("{kind}: created {done}/{n}"));
                        }
                    }
                    Err(e) => {
                        let mut f = failures.lock().expect("failures lock");
                        f.0 += 1;
                        f.1.get_or_insert_with(|| e.to_string());
                        if stop_on_error {
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
    });
    for w in run_tasks(workers).await {
        w?;
    }
    let secs = t.elapsed().as_secs_f64();
    let ids = std::mem::take(&mut *ids.lock().expect("ids lock"));
    let (failed, first_error) = std::mem::take(&mut *failures.lock().expect("failures lock"));
    Ok((ids, failed, first_error, secs))
}

/// Creations per second with `concurrency` clients for `n` creates; deleted afterwards.
pub async fn throughput(s: &Setup, n: usize, concurrency: usize) -> anyhow::Result<Throughput> {
    s.note(format!(
        "throughput: {n} creates from {concurrency} clients"
    ));
    let (ids, failed, first_error, secs) =
        create_many(s, "throughput", n, concurrency, false).await?;
    let created = ids.len();
    delete_all_reporting(&s.client, ids, 32).await?;
    Ok(Throughput {
        n,
        concurrency,
        created,
        failed,
        secs,
        per_sec: if secs > 0.0 {
            created as f64 / secs
        } else {
            0.0
        },
        first_error,
    })
}

/// Host memory per idle sandbox.
#[derive(Debug, Clone, Serialize)]
pub struct Density {
    pub requested: usize,
    pub created: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    pub create_secs: f64,
    pub used_before_kib: u64,
    pub used_after_kib: u64,
    /// Negative when host memory fell during the run (other activity on the host): then the
    /// measurement says nothing, and a larger N helps.
    pub mib_per_sandbox: f64,
    /// Sandboxes of this run still listed after deleting them all.
    pub left_after_delete: usize,
    /// `/metrics` scrapes while the sandboxes were alive.
    pub scrape: super::scrape::Scrape,
    /// The dashboard's draw times while the sandboxes were alive (with `--ui`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<super::ui::Paint>,
}

fn host_used_kib() -> anyhow::Result<u64> {
    Ok(warren_runtime::procfs::MemInfo::read()?.used_kib())
}

/// Creates `n` idle sandboxes (stopping at the first refusal), measures host memory, then
/// deletes them and checks none is left. Only meaningful when the daemon runs on this host.
pub async fn density(
    s: &Setup,
    n: usize,
    concurrency: usize,
    ui: Option<&str>,
) -> anyhow::Result<Density> {
    s.note(format!(
        "density: {n} idle sandboxes, {concurrency} creates at a time"
    ));
    let before = host_used_kib()?;
    let (ids, _failed, stopped_by, create_secs) =
        create_many(s, "density", n, concurrency, true).await?;
    let created = ids.len();
    // Let page cache and slab settle after the burst before reading.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let after = host_used_kib()?;
    s.note(format!("density: {created} created; scraping /metrics"));
    let scrape = super::scrape::measure(&s.client, created).await?;
    let dashboard = match ui {
        Some(url) => {
            s.note(format!("density: {created} created; loading the dashboard"));
            let url = url.to_string();
            Some(tokio::task::spawn_blocking(move || super::ui::measure(&url, created)).await??)
        }
        None => None,
    };
    s.note(format!("density: {created} created; deleting"));
    delete_all_reporting(&s.client, ids, concurrency.clamp(1, 64)).await?;
    let labels = BTreeMap::from([(BENCH_LABEL.to_string(), s.run_id.clone())]);
    let left = s
        .client
        .list(&labels, None)
        .await
        .context("listing after delete")?
        .len();
    let mib_per_sandbox = if created > 0 {
        (after as f64 - before as f64) / 1024.0 / created as f64
    } else {
        0.0
    };
    Ok(Density {
        requested: n,
        created,
        stopped_by,
        create_secs,
        used_before_kib: before,
        used_after_kib: after,
        mib_per_sandbox,
        left_after_delete: left,
        scrape,
        dashboard,
    })
}

/// Quantiles kept of a latency's samples for its CDF: 0 %, 1 %, …, 100 % (nearest rank).
pub const QUANTILES: usize = 101;

/// The [`QUANTILES`] quantiles of millisecond samples (any order), rounded to microseconds;
/// empty when there is no sample.
pub fn quantiles(samples: &[f64]) -> Vec<f64> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return Vec::new();
    }
    (0..QUANTILES)
        .map(|i| {
            let p = i as f64 * 100.0 / (QUANTILES - 1) as f64;
            (crate::stats::percentile(&sorted, p) * 1000.0).round() / 1000.0
        })
        .collect()
}
