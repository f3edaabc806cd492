//! `warren-bench call`: the function substrate through the HTTP API, next to plain sandbox
//! exec measured in the same run.
//!
//! - `call true` latency (sequential, after warm-up);
//! - calls/s of `call true` from 16 (`-c`) concurrent clients, after the pool grew to what
//!   they keep busy;
//! - `python3 -c "print(1)"` through a pool with a warm interpreter vs. the same call
//!   without one (a cold interpreter start in the same kind of environment), and vs. a
//!   cold `python3` exec in a running sandbox;
//! - `exec true` in a running sandbox (the baseline).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{CallRequest, Client, ExecRequest, ImageRef};

use super::measure::Setup;
use crate::commands::run_tasks;
use crate::stats::Latency;

/// Everything `bench call` measured.
#[derive(Debug, Clone, Serialize)]
pub struct CallBench {
    pub call_true: Latency,
    pub calls_per_sec: f64,
    pub concurrency: usize,
    pub throughput_calls: usize,
    pub throughput_busy: usize,
    pub warm_python: Latency,
    /// Warm-interpreter calls with no gap between them (the pool grows until each call finds
    /// a ready interpreter).
    pub warm_python_back_to_back: Latency,
    pub cold_python_call: Latency,
    pub cold_python_exec: Latency,
    pub exec_true: Latency,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn req(s: &Setup, argv: &[&str]) -> CallRequest {
    let mut r = CallRequest::argv(argv.iter().map(|a| a.to_string()));
    r.image = ImageRef::Name(s.image.clone());
    r
}

async fn call_ok(client: &Client, r: &CallRequest) -> anyhow::Result<()> {
    let out = client.call(r).await.context("call")?;
    anyhow::ensure!(
        out.success(),
        "{:?} exited with {:?} (signal {:?}): {}",
        r.argv,
        out.exit_code,
        out.signal,
        out.stderr
    );
    Ok(())
}

/// `n` sequential calls, each `gap` after the previous one ended.
async fn sequential(
    s: &Setup,
    r: &CallRequest,
    n: usize,
    gap: Duration,
) -> anyhow::Result<Latency> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        s.stop.check()?;
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let t = Instant::now();
        call_ok(&s.client, r).await?;
        v.push(ms_since(t));
    }
    Ok(Latency::from_samples(v))
}

async fn exec_latency(s: &Setup, id: &str, argv: &[&str], n: usize) -> anyhow::Result<Latency> {
    let mut v = Vec::with_capacity(n);
    let r = ExecRequest::argv(argv.iter().map(|a| a.to_string()));
    for _ in 0..n {
        s.stop.check()?;
        let t = Instant::now();
        let out = s.client.exec(id, &r).await.context("exec")?;
        anyhow::ensure!(out.success(), "{argv:?} failed: {}", out.stderr);
        v.push(ms_since(t));
    }
    Ok(Latency::from_samples(v))
}

/// `total` calls of `r` from `concurrency` clients: (calls that succeeded, calls refused
/// `busy`).
pub(super) async fn concurrent(
    s: &Setup,
    r: &CallRequest,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<(usize, usize)> {
    let next = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let workers = (0..concurrency.max(1)).map(|_| {
        let (client, r, next, busy, done, stop) = (
            s.client.clone(),
            r.clone(),
            next.clone(),
            busy.clone(),
            done.clone(),
            s.stop.clone(),
        );
        async move {
            while !stop.is_set() && next.fetch_add(1, Ordering::Relaxed) < total {
                match client.call(&r).await {
                    Ok(out) if out.success() => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(out) => anyhow::bail!("{:?} exited with {:?}", r.argv, out.exit_code),
                    Err(e) if e.code() == Some(warren_client::ErrorCode::Busy) => {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e).context("call"),
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

pub async fn call(s: &Setup, n: usize, concurrency: usize) -> anyhow::Result<CallBench> {
    let t_true = req(s, &["true"]);
    s.note("call: warming the pool (100 calls)");
    for _ in 0..100 {
        s.stop.check()?;
        call_ok(&s.client, &t_true).await?;
    }
    s.note(format!("call: {n} sequential `call true`"));
    let call_true = sequential(s, &t_true, n, Duration::ZERO).await?;

    // The pool first grows to what `concurrency` clients keep busy (container starts are
    // not calls); then the calls are counted.
    let warm_up = concurrency * 20;
    s.note(format!(
        "call: warming the pool for {concurrency} clients ({warm_up} calls)"
    ));
    concurrent(s, &t_true, warm_up, concurrency).await?;
    let total = (n * 2).max(concurrency * 10);
    s.note(format!("call: {total} calls from {concurrency} clients"));
    let t0 = Instant::now();
    let (throughput_calls, throughput_busy) = concurrent(s, &t_true, total, concurrency).await?;
    let secs = t0.elapsed().as_secs_f64();
    let calls_per_sec = throughput_calls as f64 / secs;

    let py = ["python3", "-c", "print(1)"];
    let mut warm = req(s, &py);
    warm.interpreter = Some("python3".into());
    let pn = (n / 20).clamp(10, 30);
    s.note(format!(
        "call: {pn} python3 calls with and without a warm interpreter"
    ));
    for _ in 0..10 {
        call_ok(&s.client, &warm).await?;
    }
    // A warm pool: calls come when its environments are ready (each container starts the
    // next interpreter after a call, which takes a cold start's time), so calls are spaced.
    let gap = Duration::from_millis(1000);
    let warm_python = sequential(s, &warm, pn, gap).await?;
    let warm_python_back_to_back = sequential(s, &warm, pn * 4, Duration::ZERO).await?;
    let cold = req(s, &py);
    let cold_python_call = sequential(s, &cold, pn, gap).await?;

    s.note("call: exec baseline in a running sandbox");
    let sb = s
        .client
        .create(&warren_client::CreateSandboxRequest {
            image: ImageRef::Name(s.image.clone()),
            labels: [(super::measure::BENCH_LABEL.to_string(), s.run_id.clone())].into(),
            ..Default::default()
        })
        .await
        .context("create")?;
    let base = async {
        for _ in 0..50 {
            exec_latency(s, &sb.id, &["true"], 1).await?;
        }
        let exec_true = exec_latency(s, &sb.id, &["true"], n).await?;
        let cold_python_exec = exec_latency(s, &sb.id, &py, pn).await?;
        Ok::<_, anyhow::Error>((exec_true, cold_python_exec))
    }
    .await;
    s.client.delete(&sb.id).await.context("delete")?;
    let (exec_true, cold_python_exec) = base?;
    Ok(CallBench {
        call_true,
        calls_per_sec,
        concurrency,
        throughput_calls,
        throughput_busy,
        warm_python,
        warm_python_back_to_back,
        cold_python_call,
        cold_python_exec,
        exec_true,
    })
}

impl CallBench {
    pub fn render(&self) -> String {
        use crate::table::{ms, Table};
        let mut t = Table::new([
            "BENCH", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms", "MAX ms",
        ]);
        for (name, l) in [
            ("call true", &self.call_true),
            ("exec true (sandbox)", &self.exec_true),
            ("call python3 (warm interpreter)", &self.warm_python),
            (
                "call python3 (warm, back to back)",
                &self.warm_python_back_to_back,
            ),
            ("call python3 (cold)", &self.cold_python_call),
            ("exec python3 (sandbox, cold)", &self.cold_python_exec),
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
            "{}\ncall throughput: {} calls from {} clients = {:.1}/s ({} refused busy)\n",
            t.render(),
            self.throughput_calls,
            self.concurrency,
            self.calls_per_sec,
            self.throughput_busy
        )
    }

    pub fn checks(&self) -> Vec<super::Check> {
        use super::Check;
        let ratio = self.warm_python.p50_ms / self.cold_python_call.p50_ms.max(1e-9);
        vec![
            Check::at_most("call true p50", self.call_true.p50_ms, "ms", 3.0),
            Check::at_most("call true p99", self.call_true.p99_ms, "ms", 10.0),
            Check::at_least("calls/s", self.calls_per_sec, "/s", 500.0),
            Check::at_most("warm python p50 / cold python p50", ratio, "x", 0.3),
            Check::at_most(
                "warm python back to back p50",
                self.warm_python_back_to_back.p50_ms,
                "ms",
                5.0,
            ),
            Check::at_most(
                "warm python back to back p99",
                self.warm_python_back_to_back.p99_ms,
                "ms",
                30.0,
            ),
        ]
    }
}
