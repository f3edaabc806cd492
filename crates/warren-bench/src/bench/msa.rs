//! `warren-bench msa`: per-step overhead of mini-swe-agent's Warren environment against its own
//! docker environment run with podman, same steps, same machine, same run (not part of `all`).
//!
//! The steps go through mini-swe-agent's `execute` (what its agent loop calls per step), so
//! the bench is the SDK's Python script `sdk/python/bench/msa_overhead.py`, carried in this
//! binary and run with a Python that has the SDK and `mini-swe-agent` (`--python`, else
//! `$WARREN_BENCH_PYTHON`, else `python3`; the test venv `target/venv` has both), alternating
//! the two environments step by step. podman runs with runc and explicit ulimits (see the
//! script); its image is the default image's rootfs imported once.

use std::process::Stdio;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::stats::Latency;

const SCRIPT: &str = include_str!("../../../../sdk/python/bench/msa_overhead.py");

/// What the script measured.
#[derive(Debug, Clone, Serialize)]
pub struct MsaBench {
    pub warren: Latency,
    pub podman: Latency,
}

#[derive(Deserialize)]
struct Out {
    ms: Times,
}

#[derive(Deserialize)]
struct Times {
    warren: Vec<f64>,
    podman: Vec<f64>,
}

/// The Python to run the script with.
fn python(flag: Option<&str>) -> String {
    flag.map(str::to_string)
        .or_else(|| std::env::var("WARREN_BENCH_PYTHON").ok())
        .unwrap_or_else(|| "python3".into())
}

pub async fn msa(url: Option<&str>, py: Option<&str>, steps: usize) -> anyhow::Result<MsaBench> {
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("msa_overhead.py");
    std::fs::write(&script, SCRIPT)?;
    let py = python(py);
    eprintln!("bench: msa: {steps} mini-swe-agent steps per environment ({py})");
    let mut cmd = tokio::process::Command::new(&py);
    cmd.arg(&script)
        .args(["--json", "--steps", &steps.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(u) = url {
        cmd.env("WARREN_URL", u);
    }
    let out = cmd.output().await.with_context(|| {
        format!("running {py} (give --python: a Python with the SDK and mini-swe-agent)")
    })?;
    anyhow::ensure!(
        out.status.success(),
        "{} {} failed ({}): {}",
        py,
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let o: Out =
        serde_json::from_str(&last).with_context(|| format!("the script printed {last:?}"))?;
    Ok(MsaBench {
        warren: Latency::from_samples(o.ms.warren),
        podman: Latency::from_samples(o.ms.podman),
    })
}

impl MsaBench {
    pub fn render(&self) -> String {
        use crate::table::{ms, Table};
        let mut t = Table::new([
            "BENCH", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms", "MAX ms",
        ]);
        for (name, l) in [
            ("mini-swe-agent step, Warren environment", &self.warren),
            ("mini-swe-agent step, docker env. (podman)", &self.podman),
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
        t.render()
    }

    pub fn checks(&self) -> Vec<super::Check> {
        vec![super::Check::at_most(
            "msa step p50 / podman step p50",
            self.warren.p50_ms / self.podman.p50_ms.max(1e-9),
            "x",
            0.1,
        )]
    }
}
