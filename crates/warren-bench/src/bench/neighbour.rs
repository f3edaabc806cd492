//! `warren-bench neighbour`: a latency-sensitive sandbox's `exec true` p50 while a neighbour
//! floods the CPU, with and without the best-effort CPU class on the noisy neighbour.
//!
//! Phases, each `n` round trips in the quiet sandbox after warm-up: next to a fork bomb and
//! next to a `yes` flood (one per core plus one), each noise once in an ordinary sandbox and
//! once in a `best_effort` one. Each phase is compared with a quiet p50 measured right before
//! it, so load from elsewhere on the host drifts less into the ratio. Target: every noisy p50
//! ≤ 2× its quiet p50.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{CpuClass, CreateSandboxRequest, ExecRequest, ImageRef};

use super::measure::{Setup, BENCH_LABEL};
use crate::stats::Latency;

/// One phase: what the neighbour ran and the quiet sandbox's latency meanwhile.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub noise: String,
    pub cpu_class: String,
    pub latency: Latency,
    /// The quiet p50 measured right before this phase (the host's other load drifts).
    pub quiet_p50_ms: f64,
    /// p50 of this phase over `quiet_p50_ms`.
    pub ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Neighbour {
    pub quiet: Latency,
    pub phases: Vec<Phase>,
}

/// The noises: shell programs run in the noisy sandbox until it is deleted.
fn noises() -> Vec<(&'static str, String)> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    vec![
        (
            "fork bomb",
            "b(){ b|b& }; b 2>/dev/null; sleep 3600".to_string(),
        ),
        (
            "yes flood",
            format!(
                "for i in $(seq {}); do yes > /dev/null & done; sleep 3600",
                cores + 1
            ),
        ),
    ]
}

fn request(s: &Setup, kind: &str, class: CpuClass) -> CreateSandboxRequest {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    CreateSandboxRequest {
        image: ImageRef::Name(s.image.clone()),
        cpus: Some(cores as f64),
        pids: Some(256),
        cpu_class: Some(class),
        labels: BTreeMap::from([
            (BENCH_LABEL.to_string(), s.run_id.clone()),
            (format!("{BENCH_LABEL}.kind"), kind.to_string()),
        ]),
        ..Default::default()
    }
}

async fn sample(s: &Setup, id: &str, n: usize) -> anyhow::Result<Latency> {
    for _ in 0..20 {
        s.stop.check()?;
        s.client.exec(id, &ExecRequest::argv(["true"])).await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        s.stop.check()?;
        let t = Instant::now();
        let r = s
            .client
            .exec(id, &ExecRequest::argv(["true"]))
            .await
            .context("exec true in the quiet sandbox")?;
        anyhow::ensure!(r.success(), "exec true failed: {r:?}");
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Latency::from_samples(v))
}

pub async fn neighbour(s: &Setup, n: usize) -> anyhow::Result<Neighbour> {
    let quiet_sb = s
        .client
        .create(&request(s, "neighbour-quiet", CpuClass::Normal))
        .await
        .context("create the quiet sandbox")?;
    let id = quiet_sb.id.clone();
    let result = async {
        s.note(format!("neighbour: quiet, {n} x exec true"));
        let quiet = sample(s, &id, n).await?;
        let mut phases = Vec::new();
        for (class, class_name) in [
            (CpuClass::Normal, "normal"),
            (CpuClass::BestEffort, "best_effort"),
        ] {
            for (noise, program) in noises() {
                s.stop.check()?;
                let before = sample(s, &id, n).await?;
                s.note(format!("neighbour: next to a {noise} ({class_name})"));
                let noisy = s
                    .client
                    .create(&request(s, "neighbour-noisy", class))
                    .await
                    .context("create the noisy sandbox")?;
                let mut req = ExecRequest::shell(program);
                req.timeout_secs = Some(3600.0);
                s.client
                    .spawn(&noisy.id, &req)
                    .await
                    .context("start the noise")?;
                tokio::time::sleep(Duration::from_secs(2)).await;
                let lat = sample(s, &id, n).await;
                s.client
                    .delete(&noisy.id)
                    .await
                    .with_context(|| format!("delete {}", noisy.id))?;
                let latency = lat?;
                phases.push(Phase {
                    noise: noise.to_string(),
                    cpu_class: class_name.to_string(),
                    ratio: latency.p50_ms / before.p50_ms.max(1e-9),
                    quiet_p50_ms: before.p50_ms,
                    latency,
                });
            }
        }
        Ok::<_, anyhow::Error>(Neighbour { quiet, phases })
    }
    .await;
    s.client
        .delete(&id)
        .await
        .with_context(|| format!("delete {id}"))?;
    result
}

impl Neighbour {
    pub fn render(&self) -> String {
        let mut t = crate::table::Table::new([
            "NEIGHBOUR RUNS",
            "ITS CLASS",
            "N",
            "P50 ms",
            "P99 ms",
            "QUIET P50 ms",
            "P50 / QUIET",
        ]);
        t.row([
            "nothing".to_string(),
            "-".into(),
            self.quiet.n.to_string(),
            crate::table::ms(self.quiet.p50_ms),
            crate::table::ms(self.quiet.p99_ms),
            "-".into(),
            "1.00".into(),
        ]);
        for p in &self.phases {
            t.row([
                p.noise.clone(),
                p.cpu_class.clone(),
                p.latency.n.to_string(),
                crate::table::ms(p.latency.p50_ms),
                crate::table::ms(p.latency.p99_ms),
                crate::table::ms(p.quiet_p50_ms),
                format!("{:.2}", p.ratio),
            ]);
        }
        t.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_has_a_column_name() {
        let l = Latency::from_samples(vec![1.0, 2.0, 3.0]);
        let n = Neighbour {
            quiet: l.clone(),
            phases: vec![Phase {
                noise: "yes flood".into(),
                cpu_class: "normal".into(),
                latency: l,
                quiet_p50_ms: 2.0,
                ratio: 1.0,
            }],
        };
        let text = n.render();
        let cells = |line: &str| line.split("  ").filter(|c| !c.trim().is_empty()).count();
        let mut lines = text.lines();
        let header = cells(lines.next().unwrap());
        for line in lines {
            assert_eq!(cells(line), header, "{text}");
        }
    }
}
