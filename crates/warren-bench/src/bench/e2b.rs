//! `warren bench e2b`: E2B's own SDK against Warren's, same node, same run.
//!
//! It starts its own `warrend --e2b` (root; `WARREN_BIN_DIR` or next to this executable) on a
//! private state directory and a free loopback port, and runs the client side in Python
//! (`e2b_driver.py`, embedded): E2B's `e2b` package and Warren's `warren` package in one
//! process and one event loop, alternating sample by sample. The interpreter is
//! `WARREN_BENCH_PYTHON` (default `python3`); it needs both packages
//! (`pip install -e 'sdk/python[test]'`, which pins `e2b`).
//!
//! | number | target |
//! |---|---|
//! | `commands.run("true")` p50 − Warren's `exec` p50 of the same program, one sandbox | ≤ +0.5 ms |
//! | `AsyncSandbox.create` → first `commands.run` p50 / Warren's `create` → `exec` p50 | ≤ 1.3× |
//! | 100 `AsyncSandbox` rollouts at once (create, 20 commands, a file, kill) | 0 errors |
//!
//! E2B's SDK runs `commands.run(cmd)` as `/bin/bash -l -c cmd` (a login shell, which in a
//! Debian image also runs `id` and `mesg`), so "the same program" is Warren's
//! `exec /bin/bash -l -c true`: the checks measure what the protocol costs. Warren's plain
//! `exec true` and `exec /bin/bash -c true` are measured in the same run, so the report splits
//! `run("true")` − `exec true` into E2B's protocol, the login profile (in Debian, `/etc/profile`
//! runs `id -u` and root's `~/.profile` runs `mesg n`: two more programs; the default image's
//! profile runs neither without a terminal, and a second sandbox with Debian's stock profile
//! restored measures the difference in the same run) and starting bash.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};
use warren_client::Client;

use super::daemon::Daemon;
use super::Check;
use crate::stats::Latency;
use crate::table::{ms, Table};

const DRIVER: &str = include_str!("e2b_driver.py");

/// Rounds of the CPU-per-call arms (they alternate in order from round to round), each of
/// `-n` / [`CPU_ROUNDS`] * 2 calls per arm: short rounds side by side, so that the load of a
/// shared machine moves every arm alike.
const CPU_ROUNDS: usize = 10;

/// What the driver prints.
#[derive(Debug, Deserialize)]
struct Raw {
    run: RawRun,
    cpu: CpuPerCall,
    create: RawCreate,
    rollouts: Rollouts,
}

#[derive(Debug, Deserialize)]
struct RawRun {
    e2b: Vec<f64>,
    native_true: Vec<f64>,
    native_plain_bash: Vec<f64>,
    native_bash: Vec<f64>,
    e2b_stock: Vec<f64>,
    native_bash_stock: Vec<f64>,
}

#[derive(Debug, Deserialize)]
struct RawCreate {
    e2b: Vec<f64>,
    native: Vec<f64>,
    native_bash: Vec<f64>,
}

/// CPU time per call, in ms, of one arm over one round (see `e2b_driver.py`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct CpuSample {
    /// `warrend`'s `utime + stime`, every thread.
    pub daemon: f64,
    /// The Python client's `process_time` (the SDK of the arm, its event loop).
    pub client: f64,
    /// The sandbox cgroup's `cpu_usec` (the agent and `bash -l -c true`).
    pub sandbox: f64,
}

/// CPU per call of the same program (`/bin/bash -l -c true`) three ways, one sample per round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CpuPerCall {
    /// E2B's `commands.run("true")` (envd `Start` → the node's streamed exec).
    pub e2b: Vec<CpuSample>,
    /// Warren's `exec_stream` (`/exec/stream`, NDJSON).
    pub exec_stream: Vec<CpuSample>,
    /// Warren's `exec` (`/exec`, one JSON answer).
    pub exec: Vec<CpuSample>,
}

impl CpuPerCall {
    fn render(&self) -> String {
        let mut t = Table::new([
            "CPU PER CALL (ms, mean of rounds ± its std. error)",
            "DAEMON",
            "CLIENT",
            "SANDBOX",
        ]);
        let col = |v: &[CpuSample], f: fn(&CpuSample) -> f64| {
            let (mean, se) = mean_se(v.iter().map(f));
            format!("{mean:.3} ± {se:.3}")
        };
        for (name, v) in [
            ("E2B commands.run(\"true\")", &self.e2b),
            ("Warren exec_stream bash -l -c true", &self.exec_stream),
            ("Warren exec bash -l -c true", &self.exec),
        ] {
            t.row([
                name.to_string(),
                col(v, |s| s.daemon),
                col(v, |s| s.client),
                col(v, |s| s.sandbox),
            ]);
        }
        t.render()
    }
}

/// The mean of `xs` and its standard error.
fn mean_se(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let xs: Vec<f64> = xs.collect();
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The concurrent rollouts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollouts {
    pub n: usize,
    pub commands: usize,
    pub secs: f64,
    pub errors: usize,
    pub first_errors: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct E2bBench {
    /// `commands.run("true")` through E2B's SDK.
    pub run_e2b: Latency,
    /// `exec true` through Warren's SDK, same sandbox.
    pub exec_true: Latency,
    /// `exec /bin/bash -c true` (bash without the login profile), same sandbox.
    pub exec_plain_bash: Latency,
    /// `exec /bin/bash -l -c true` (what E2B's `run("true")` runs), same sandbox.
    pub exec_bash: Latency,
    /// `commands.run("true")` in a sandbox with Debian's stock login profile (which runs `id`
    /// and `mesg`; the default image's runs no program without a terminal).
    pub run_e2b_stock: Latency,
    /// `exec /bin/bash -l -c true` with Debian's stock login profile.
    pub exec_bash_stock: Latency,
    /// `AsyncSandbox.create` → first `commands.run("true")`.
    pub create_e2b: Latency,
    /// Warren's `create` → `exec true`.
    pub create_native: Latency,
    /// Warren's `create` → `exec /bin/bash -l -c true`.
    pub create_native_bash: Latency,
    /// CPU per call of `run("true")`, streamed and one-shot exec of the same program.
    pub cpu: CpuPerCall,
    pub rollouts: Rollouts,
}

impl E2bBench {
    /// The targets, against Warren running the same program (E2B's `run("true")` is a login
    /// bash): what the E2B protocol costs. The differences to plain `exec true` are reported
    /// beside them ([`E2bBench::render`]).
    pub fn checks(&self) -> Vec<Check> {
        vec![
            Check::at_most(
                "commands.run(\"true\") p50 - exec bash -l -c true p50",
                self.run_e2b.p50_ms - self.exec_bash.p50_ms,
                "ms",
                0.5,
            ),
            Check::at_most(
                "E2B create -> run p50 / create -> exec bash -l -c true p50",
                self.create_e2b.p50_ms / self.create_native_bash.p50_ms.max(1e-9),
                "x",
                1.3,
            ),
            Check::at_most(
                &format!("errors in {} AsyncSandbox rollouts", self.rollouts.n),
                self.rollouts.errors as f64,
                "",
                0.0,
            ),
        ]
    }

    pub fn render(&self) -> String {
        let mut t = Table::new(["CALL", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms"]);
        for (name, l) in [
            ("E2B commands.run(\"true\")", &self.run_e2b),
            ("Warren exec true", &self.exec_true),
            ("Warren exec bash -c true", &self.exec_plain_bash),
            ("Warren exec bash -l -c true", &self.exec_bash),
            ("E2B run(\"true\"), Debian's profile", &self.run_e2b_stock),
            ("Warren bash -l -c true, Debian's", &self.exec_bash_stock),
            ("E2B create -> run(\"true\")", &self.create_e2b),
            ("Warren create -> exec true", &self.create_native),
            (
                "Warren create -> exec bash -l -c true",
                &self.create_native_bash,
            ),
        ] {
            t.row([
                name.to_string(),
                l.n.to_string(),
                ms(l.p50_ms),
                ms(l.p99_ms),
                ms(l.mean_ms),
                ms(l.min_ms),
            ]);
        }
        let r = &self.rollouts;
        let ratio = |a: &Latency, b: &Latency| a.p50_ms / b.p50_ms.max(1e-9);
        let mut out = format!(
            "E2B's SDK (e2b, Python) vs Warren's Python SDK, one node, alternating\n{}\n\
             run(\"true\") p50 - exec bash -l -c true p50 (same program): {:+.2} ms; \
             - exec true p50: {:+.2} ms (E2B's SDK runs every command in a login bash)\n\
             where run(\"true\") - exec true goes, p50: E2B's protocol {:+.2} ms, the login \
             profile (bash -l - bash) {:+.2} ms, starting bash (bash - true) {:+.2} ms\n\
             the image's login profile vs Debian's stock one (id, mesg), p50: run(\"true\") \
             {:.2} vs {:.2} ms, bash -l - bash {:+.2} vs {:+.2} ms\n\
             create -> first command p50, E2B / Warren: {:.2}x same program, {:.2}x vs exec true\n\
             {} AsyncSandbox rollouts at once ({} commands, a file each): {:.1} s, {} errors\n",
            t.render(),
            self.run_e2b.p50_ms - self.exec_bash.p50_ms,
            self.run_e2b.p50_ms - self.exec_true.p50_ms,
            self.run_e2b.p50_ms - self.exec_bash.p50_ms,
            self.exec_bash.p50_ms - self.exec_plain_bash.p50_ms,
            self.exec_plain_bash.p50_ms - self.exec_true.p50_ms,
            self.run_e2b.p50_ms,
            self.run_e2b_stock.p50_ms,
            self.exec_bash.p50_ms - self.exec_plain_bash.p50_ms,
            self.exec_bash_stock.p50_ms - self.exec_plain_bash.p50_ms,
            ratio(&self.create_e2b, &self.create_native_bash),
            ratio(&self.create_e2b, &self.create_native),
            r.n,
            r.commands,
            r.secs,
            r.errors
        );
        for e in &r.first_errors {
            out.push_str(&format!("  error: {e}\n"));
        }
        if !self.cpu.e2b.is_empty() {
            out.push_str(&self.cpu.render());
        }
        out
    }
}

/// A private `warrend --e2b` on a loopback port.
struct Node {
    daemon: Daemon,
    port: u16,
}

impl Node {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn start(dir: &Path, sandboxes: usize) -> Result<Node> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let daemon = Daemon::new(dir, &format!("be2b{}", std::process::id() % 100_000))?;
        let mut node = Node { daemon, port };
        let probe = Client::builder().url(node.url()).build()?;
        let flags = |cmd: &mut std::process::Command| {
            cmd.args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--e2b", "--e2b-domain", "e2b.bench"])
                .args(["--max-sandboxes", &(sandboxes + 16).to_string()]);
        };
        node.daemon
            .start(flags, &probe, Duration::from_secs(30))
            .await?;
        Ok(node)
    }

    /// Deletes whatever the run left (a failed driver), then stops the daemon.
    async fn stop(&mut self) {
        if let Ok(c) = self.daemon.client(warren_client::DEFAULT_MAX_CONNECTIONS) {
            if let Ok(list) = c.list(&Default::default(), None).await {
                let ids = list.into_iter().map(|s| s.id).collect();
                let _ = super::delete_all_reporting(&c, ids, 16).await;
            }
        }
        self.daemon.stop();
    }
}

fn python() -> String {
    std::env::var("WARREN_BENCH_PYTHON").unwrap_or_else(|_| "python3".into())
}

async fn drive(
    url: &str,
    dir: &std::path::Path,
    daemon_pid: u32,
    n: usize,
    rollouts: usize,
) -> Result<Raw> {
    let py = python();
    let probe = tokio::process::Command::new(&py)
        .args(["-c", "import e2b, warren"])
        .output()
        .await
        .with_context(|| format!("running {py} (set WARREN_BENCH_PYTHON)"))?;
    if !probe.status.success() {
        bail!(
            "{py} cannot import e2b and warren (pip install -e 'sdk/python[test]', or set \
             WARREN_BENCH_PYTHON to a venv's python): {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
    }
    let script = dir.join("e2b_driver.py");
    std::fs::write(&script, DRIVER)?;
    let n_create = (n / 10).max(5);
    let out = tokio::process::Command::new(&py)
        .arg(&script)
        .arg(url)
        .args([
            n.to_string(),
            n_create.to_string(),
            rollouts.to_string(),
            "20".to_string(),
            daemon_pid.to_string(),
            // CPU per call: twice as many calls per arm as the latency arms take.
            (2 * n).div_ceil(CPU_ROUNDS).to_string(),
            CPU_ROUNDS.to_string(),
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running the E2B driver")?;
    if !out.status.success() {
        bail!(
            "the E2B driver failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the E2B driver's output does not parse: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

pub async fn measure(n: usize, rollouts: usize) -> Result<E2bBench> {
    let dir = std::env::temp_dir().join(format!("warren-bench-e2b-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let mut node = Node::start(&dir, rollouts).await?;
    let pid = node.daemon.pid().context("the daemon is not running")?;
    let raw = drive(&node.url(), &dir, pid, n, rollouts).await;
    node.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    let raw = raw?;
    Ok(E2bBench {
        run_e2b: Latency::from_samples(raw.run.e2b),
        exec_true: Latency::from_samples(raw.run.native_true),
        exec_plain_bash: Latency::from_samples(raw.run.native_plain_bash),
        exec_bash: Latency::from_samples(raw.run.native_bash),
        run_e2b_stock: Latency::from_samples(raw.run.e2b_stock),
        exec_bash_stock: Latency::from_samples(raw.run.native_bash_stock),
        create_e2b: Latency::from_samples(raw.create.e2b),
        create_native: Latency::from_samples(raw.create.native),
        create_native_bash: Latency::from_samples(raw.create.native_bash),
        cpu: raw.cpu,
        rollouts: raw.rollouts,
    })
}

pub async fn run(
    n: usize,
    rollouts: usize,
    json: bool,
    report_dir: Option<&std::path::Path>,
) -> Result<i32> {
    let b = measure(n, rollouts).await?;
    super::answer("e2b", &b, b.render(), &b.checks(), 3, json, report_dir)
}
