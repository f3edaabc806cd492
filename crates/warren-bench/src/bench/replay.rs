//! `warren-bench replay`: the trajectory log through the HTTP API.
//!
//! 1. Records `n` steps, each appending a line to a counter file in the sandbox.
//! 2. Replays the same `n` steps from one client, one after the other, and times the whole.
//!    Every answer must say `replayed`, the node's exec counter must not move, and the
//!    counter file must still hold exactly `n` lines: nothing ran again.
//! 3. Logging overhead: `exec true` p50 without a step and with a (new) step, and the node's
//!    own measure of how long calls wait for their entry's commit (fsync included), read from
//!    the `warren_trajectory_append_seconds` histogram over the `exec true` runs.

use std::time::Instant;

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ImageRef};

use super::measure::{Setup, BENCH_LABEL};
use super::scrape::value as counter;
use crate::stats::Latency;

/// File in the sandbox that every recorded step appends one line to.
const COUNTER: &str = "/tmp/warren-bench-replay.count";

/// What the replay bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct Replay {
    pub steps: usize,
    /// Recording the steps (each ran and was logged).
    pub record_secs: f64,
    /// Replaying all of them, one after the other.
    pub replay_secs: f64,
    /// Commands the node ran while the steps were replayed (must be 0).
    pub executed_during_replay: u64,
    /// Lines in the counter file after the replay (must equal `steps`).
    pub side_effects: u64,
    /// `exec true` without a step.
    pub exec: Latency,
    /// `exec true` with a new step each time.
    pub exec_step: Latency,
    /// Median wait for the trajectory commit per call (upper bound of its histogram bucket).
    pub append_p50_ms: Option<f64>,
    pub append_mean_ms: Option<f64>,
}

/// The append histogram: (upper bound in seconds, cumulative count) per bucket, sum, count.
fn append_histogram(text: &str) -> (Vec<(f64, f64)>, f64, f64) {
    let name = "warren_trajectory_append_seconds";
    let mut buckets = Vec::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix(&format!("{name}_bucket{{le=\"")) else {
            continue;
        };
        let Some((le, n)) = rest.split_once("\"} ") else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        buckets.push((le, n.trim().parse().unwrap_or(0.0)));
    }
    let sum = counter(text, &format!("{name}_sum")).unwrap_or(0.0);
    let count = counter(text, &format!("{name}_count")).unwrap_or(0.0);
    (buckets, sum, count)
}

/// Median and mean (ms) of the appends between two `/metrics` snapshots.
pub(super) fn append_stats(before: &str, after: &str) -> (Option<f64>, Option<f64>) {
    let (b0, s0, c0) = append_histogram(before);
    let (b1, s1, c1) = append_histogram(after);
    let n = c1 - c0;
    if n <= 0.0 || b0.len() != b1.len() {
        return (None, None);
    }
    let p50 = b1
        .iter()
        .zip(&b0)
        .find(|((_, a), (_, b))| a - b >= n / 2.0)
        .map(|((le, _), _)| le * 1000.0)
        .filter(|v| v.is_finite());
    (p50, Some((s1 - s0) / n * 1000.0))
}

fn step_req(cmd: String, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

async fn exec_samples(
    client: &Client,
    id: &str,
    n: usize,
    mut req: impl FnMut(usize) -> ExecRequest,
) -> anyhow::Result<Latency> {
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let r = client.exec(id, &req(i)).await.context("exec true")?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(r.success() && !r.replayed, "exec true: {r:?}");
    }
    Ok(Latency::from_samples(samples))
}

fn note(s: &Setup, msg: impl std::fmt::Display) {
    if s.progress {
        eprintln!("bench: {msg}");
    }
}

async fn run_in(s: &Setup, id: &str, n: usize) -> anyhow::Result<Replay> {
    let c = &s.client;
    note(s, format!("replay: recording {n} steps"));
    let t = Instant::now();
    for i in 0..n {
        s.stop.check()?;
        let r = c
            .exec(id, &step_req(format!("echo {i} >> {COUNTER}"), i as u64))
            .await
            .with_context(|| format!("recording step {i}"))?;
        anyhow::ensure!(r.success() && !r.replayed, "step {i}: {r:?}");
    }
    let record_secs = t.elapsed().as_secs_f64();

    note(s, format!("replay: replaying {n} steps"));
    let execs_before = counter(&c.metrics().await?, "warren_exec_total").unwrap_or(0.0);
    let t = Instant::now();
    for i in 0..n {
        let r = c
            .exec(id, &step_req(format!("echo {i} >> {COUNTER}"), i as u64))
            .await
            .with_context(|| format!("replaying step {i}"))?;
        anyhow::ensure!(r.replayed, "step {i} ran again");
    }
    let replay_secs = t.elapsed().as_secs_f64();
    let execs_after = counter(&c.metrics().await?, "warren_exec_total").unwrap_or(0.0);
    let count = c
        .exec(id, &ExecRequest::shell(format!("wc -l < {COUNTER}")))
        .await
        .context("counting side effects")?;
    let side_effects = count.stdout.trim().parse().unwrap_or(0);

    note(s, "replay: exec true without and with a step");
    let samples = n.max(200);
    exec_samples(c, id, 50, |_| ExecRequest::argv(["true"])).await?;
    let before = c.metrics().await?;
    let exec = exec_samples(c, id, samples, |_| ExecRequest::argv(["true"])).await?;
    let after = c.metrics().await?;
    let (append_p50_ms, append_mean_ms) = append_stats(&before, &after);
    let base = n as u64 + 1_000_000;
    let exec_step = exec_samples(c, id, samples, |i| ExecRequest {
        step: Some(base + i as u64),
        ..ExecRequest::argv(["true"])
    })
    .await?;
    Ok(Replay {
        steps: n,
        record_secs,
        replay_secs,
        executed_during_replay: (execs_after - execs_before).max(0.0) as u64,
        side_effects,
        exec,
        exec_step,
        append_p50_ms,
        append_mean_ms,
    })
}

/// Runs the replay bench in one new sandbox, deleted afterwards.
pub async fn replay(s: &Setup, n: usize) -> anyhow::Result<Replay> {
    let req = CreateSandboxRequest {
        image: ImageRef::Name(s.image.clone()),
        labels: BTreeMap::from([
            (BENCH_LABEL.to_string(), s.run_id.clone()),
            (format!("{BENCH_LABEL}.kind"), "replay".to_string()),
        ]),
        ..Default::default()
    };
    let sb = s.client.create(&req).await.context("create")?;
    let result = run_in(s, &sb.id, n).await;
    s.client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id))?;
    result
}

impl Replay {
    /// The human-readable lines.
    pub fn render(&self) -> String {
        let ms = crate::table::ms;
        let opt = |v: Option<f64>| v.map(ms).unwrap_or_else(|| "-".into());
        format!(
            "replay: recorded {} steps in {:.2} s; replayed them in {:.3} s ({:.3} ms/step), \
             {} commands ran meanwhile, {} side effects\n\
             logging: exec true p50 {} ms without a step, {} ms with one; \
             trajectory commit wait p50 <= {} ms, mean {} ms\n",
            self.steps,
            self.record_secs,
            self.replay_secs,
            self.replay_secs * 1000.0 / self.steps.max(1) as f64,
            self.executed_during_replay,
            self.side_effects,
            ms(self.exec.p50_ms),
            ms(self.exec_step.p50_ms),
            opt(self.append_p50_ms),
            opt(self.append_mean_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_stats_from_two_snapshots() {
        let snap = |b: [u64; 3], sum: f64| {
            format!(
                "warren_exec_total 5\n\
                 warren_trajectory_append_seconds_bucket{{le=\"0.0002\"}} {}\n\
                 warren_trajectory_append_seconds_bucket{{le=\"0.0005\"}} {}\n\
                 warren_trajectory_append_seconds_bucket{{le=\"+Inf\"}} {}\n\
                 warren_trajectory_append_seconds_sum {sum}\n\
                 warren_trajectory_append_seconds_count {}\n",
                b[0], b[1], b[2], b[2]
            )
        };
        let before = snap([1, 1, 1], 0.001);
        let after = snap([2, 8, 11], 0.005);
        let (p50, mean) = append_stats(&before, &after);
        assert_eq!(p50, Some(0.5));
        assert!((mean.unwrap() - 0.4).abs() < 1e-9);
        assert_eq!(counter(&after, "warren_exec_total"), Some(5.0));
        assert_eq!(append_stats(&before, &before), (None, None));
    }
}
