//! `warren-bench fusion`: SandboxFusion's `POST /run_code` next to the function call it
//! becomes, measured in the same run.
//!
//! - `/run_code` of a one-line python program, sequential p50 (after warm-up);
//! - the same program as a plain `call` (the `CallRequest` the node makes of it: same pool,
//!   same warm interpreter), sequential p50: the protocol's own cost is the difference;
//! - the same program as a `call` with no warm interpreter (Python started in every call's
//!   cell, what every call cost before the pools' Python zygote), sequential p50: the baseline
//!   of the zygote;
//! - `/run_code` calls/s from 16 (`-c`) concurrent clients, next to the same `call` from as
//!   many clients (the protocol's share of the throughput), the same program started cold,
//!   and `call true` (what the pools serve when the program costs nothing), each after the
//!   pool grew to what the clients keep busy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{CallRequest, Client, ImageRef};

use super::measure::Setup;
use crate::commands::run_tasks;
use crate::stats::Latency;

/// Everything `bench fusion` measured.
#[derive(Debug, Clone, Serialize)]
pub struct FusionBench {
    pub run_code: Latency,
    pub call: Latency,
    /// The same program with Python started in the call's cell (no warm interpreter).
    pub cold: Latency,
    pub run_code_per_sec: f64,
    /// The same program as a plain `call` from as many clients.
    pub call_per_sec: f64,
    /// The same program started cold, from as many clients.
    pub cold_per_sec: f64,
    /// `call true` from as many clients.
    pub call_true_per_sec: f64,
    pub concurrency: usize,
    pub throughput_calls: usize,
    pub throughput_busy: usize,
}

const PROGRAM: &str = "print(6 * 7)";

fn body(image: &str) -> serde_json::Value {
    serde_json::json!({"code": PROGRAM, "language": "python", "image": image})
}

async fn run_ok(client: &Client, b: &serde_json::Value) -> anyhow::Result<()> {
    let v = client.run_code(b).await.context("run_code")?;
    anyhow::ensure!(v["status"] == "Success", "run_code answered {v}");
    Ok(())
}

async fn concurrent(
    s: &Setup,
    b: &serde_json::Value,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<(usize, usize)> {
    let next = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let workers = (0..concurrency.max(1)).map(|_| {
        let (client, b, next, busy, done, stop) = (
            s.client.clone(),
            b.clone(),
            next.clone(),
            busy.clone(),
            done.clone(),
            s.stop.clone(),
        );
        async move {
            while !stop.is_set() && next.fetch_add(1, Ordering::Relaxed) < total {
                match client.run_code(&b).await {
                    Ok(v) if v["status"] == "Success" => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(v) => anyhow::bail!("run_code answered {v}"),
                    Err(e) if e.status() == Some(429) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e).context("run_code"),
                }
            }
            Ok::<_, anyhow::Error>(())
        }
    });
    for w in run_tasks(workers).await {
        w??;
    }
    Ok((done.load(Ordering::Relaxed), busy.load(Ordering::Relaxed)))
}

/// Calls/s of `r` from `concurrency` clients, after as many calls again warmed its pool.
async fn calls_per_sec(
    s: &Setup,
    what: &str,
    r: &CallRequest,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    s.note(format!(
        "fusion: `call` of {what} from {concurrency} clients (warm-up, then {total})"
    ));
    super::call::concurrent(s, r, concurrency * 20, concurrency).await?;
    let t0 = Instant::now();
    let (done, _) = super::call::concurrent(s, r, total, concurrency).await?;
    Ok(done as f64 / t0.elapsed().as_secs_f64())
}

pub async fn fusion(s: &Setup, n: usize, concurrency: usize) -> anyhow::Result<FusionBench> {
    let b = body(&s.image);
    let req: warren_fusion::RunCodeRequest = serde_json::from_value(b.clone())?;
    let (_, mut call) = warren_fusion::Plan::new(&req).map_err(|e| anyhow::anyhow!("{e}"))?;
    call.image = ImageRef::Name(s.image.clone());
    let mut cold = call.clone();
    cold.interpreter = None;
    cold.preload.clear();
    s.note("fusion: warming the pools (50 of each)");
    for _ in 0..50 {
        s.stop.check()?;
        run_ok(&s.client, &b).await?;
        s.client.call(&call).await.context("call")?;
        s.client.call(&cold).await.context("call")?;
    }
    s.note(format!(
        "fusion: {n} `/run_code`, {n} `call` and {n} cold `call`, interleaved"
    ));
    let (mut rc, mut cl, mut co) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for _ in 0..n {
        s.stop.check()?;
        let t = Instant::now();
        run_ok(&s.client, &b).await?;
        rc.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let out = s.client.call(&call).await.context("call")?;
        anyhow::ensure!(out.success(), "call failed: {}", out.stderr);
        cl.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        let out = s.client.call(&cold).await.context("call")?;
        anyhow::ensure!(out.success(), "cold call failed: {}", out.stderr);
        co.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let warm_up = concurrency * 20;
    s.note(format!(
        "fusion: warming the pool for {concurrency} clients ({warm_up} calls)"
    ));
    concurrent(s, &b, warm_up, concurrency).await?;
    let total = (n * 2).max(concurrency * 10);
    s.note(format!(
        "fusion: {total} `/run_code` from {concurrency} clients"
    ));
    let t0 = Instant::now();
    let (throughput_calls, throughput_busy) = concurrent(s, &b, total, concurrency).await?;
    let secs = t0.elapsed().as_secs_f64();
    let call_per_sec = calls_per_sec(s, "the same program", &call, total, concurrency).await?;
    let cold_per_sec =
        calls_per_sec(s, "the same program, cold", &cold, total, concurrency).await?;
    let mut t_true = CallRequest::argv(["true".to_string()]);
    t_true.image = ImageRef::Name(s.image.clone());
    let call_true_per_sec = calls_per_sec(s, "`true`", &t_true, total, concurrency).await?;
    Ok(FusionBench {
        run_code: Latency::from_samples(rc),
        call: Latency::from_samples(cl),
        cold: Latency::from_samples(co),
        run_code_per_sec: throughput_calls as f64 / secs,
        call_per_sec,
        cold_per_sec,
        call_true_per_sec,
        concurrency,
        throughput_calls,
        throughput_busy,
    })
}

impl FusionBench {
    pub fn render(&self) -> String {
        use crate::table::{ms, Table};
        let mut t = Table::new([
            "BENCH", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms", "MAX ms",
        ]);
        for (name, l) in [
            ("run_code python (SandboxFusion)", &self.run_code),
            ("call, same program and pool", &self.call),
            ("call, same program, Python started cold", &self.cold),
        ] {
            t.row([
                name.to_string(),
                l.n.to_string(),
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.mean_ms),
                ms(l.min_ms),
                ms(l.max_ms),
            ]);
        }
        format!(
            "{}\nfrom {} clients: run_code {:.1}/s ({} calls, {} refused busy); \
             call of the same program {:.1}/s; started cold {:.1}/s; call true {:.1}/s\n",
            t.render(),
            self.concurrency,
            self.run_code_per_sec,
            self.throughput_calls,
            self.throughput_busy,
            self.call_per_sec,
            self.cold_per_sec,
            self.call_true_per_sec,
        )
    }

    pub fn checks(&self) -> Vec<super::Check> {
        use super::Check;
        let ratio = self.run_code.p50_ms / self.call.p50_ms.max(1e-9);
        vec![
            Check::at_most("run_code p50 / call p50", ratio, "x", 1.5),
            Check::at_least("run_code calls/s", self.run_code_per_sec, "/s", 400.0),
        ]
    }
}
