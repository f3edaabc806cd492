//! `warren-bench`: measures a node through its HTTP API and checks the numbers against
//! Warren's targets, optionally next to crun, podman and bwrap baselines.
//!
//! | bench | what | target |
//! |---|---|---|
//! | create | create → first `exec true` finished (delete not timed) | p50 ≤ 15 ms, p99 ≤ 50 ms |
//! | exec | `exec true` round trip in one running sandbox | p50 ≤ 2 ms |
//! | throughput | creations/s from 4 concurrent clients | ≥ 200/s |
//! | density | host memory per idle sandbox | ≤ 1 MiB |
//! | density | `/metrics` scrape with the sandboxes alive, p50; daemon CPU at a 5 s interval | ≤ 50 ms; ≤ 1% of a core |
//! | density | with `--ui URL`: dashboard overview first paint with the sandboxes alive, p50 | ≤ 1 s |
//! | baselines | create p50 / podman p50; crun (or runc) exec p50 / exec p50 | ≤ 0.1; ≥ 3 |
//! | replay | 1,000 logged steps replayed through the API; nothing runs again | ≤ 0.5 s per 1,000 |
//! | replay | trajectory commit wait per call (fsync included), p50 | ≤ 0.3 ms |
//! | revive | revive of a 100-call SWE-style episode / sum of its recorded call durations | ≤ 1.1× |
//! | net | create → first exec p50, allow-list policy − policy none (same run) | ≤ 5 ms |
//! | ports | `GET` of a file through `/ports/{port}` vs `exec cat` of it, p50 each (same run) | reported |
//! | call | `call true` through a warm function pool, p50 / p99 | ≤ 3 ms / ≤ 10 ms |
//! | call | `call true` from 16 clients | ≥ 500/s |
//! | call | warm-interpreter `python3 -c` p50 / cold p50 | ≤ 0.3 |
//! | fusion | SandboxFusion `/run_code` of one python line, p50 / `call` of the same program | ≤ 1.5× |
//! | fusion | `/run_code` from 16 clients | ≥ 400/s |
//! | msa | mini-swe-agent step on Warren p50 / its docker environment with podman p50 | ≤ 0.1 |
//! | neighbour | `exec true` p50 next to a fork bomb / `yes` flood over quiet p50 | ≤ 2× |
//! | pause | pause of a sandbox holding 512 MiB of anonymous memory, p50 (needs swap) | ≤ 0.25 s |
//! | tls | `exec true` p50 over TLS + token − plain HTTP, same port, kept-alive connection | ≤ 0.2 ms |
//! | crash | daemon `kill -9` once per round during 50 rollouts × 20 logged steps: steps run twice, lost | 0, 0 |
//! | vm | microVM template restore → first exec p50; vs cold boot; snapshot; memory | ≤ 0.5 s; ≥ 8×; ≤ 0.3 s |
//! | hostile | 10,000 `yes` floods capped at 1 MiB: state file growth; daemon RSS growth | ≤ budget + 5%; ≤ 50 MiB |
//! | hostile | 100,000 files in one directory paged through by `list` | all listed, sandbox running |
//! | e2b | E2B SDK `commands.run("true")` p50 − Warren SDK `exec` of the same program (`bash -l -c true`) p50 | ≤ +0.5 ms |
//! | e2b | E2B `create` → first `commands.run` p50 / Warren `create` → `exec` (same program) p50 | ≤ 1.3× |
//! | e2b | 100 concurrent `AsyncSandbox` rollouts (create, 20 commands, a file, kill) | 0 errors |
//! | cluster | a 3-member etcd, gateways and simulated nodes on loopback (see `cluster/mod.rs`) | |
//!
//! `vm`, `tls`, `e2b`, `crash` and `cluster` are not part of `all`: they start their own
//! daemons (see `vm.rs`, `tls.rs`, `e2b.rs`, `crash.rs`, `cluster/mod.rs`).
//!
//! `--report DIR` also writes the run as a directory: `report.json`, SVG plots and an
//! `index.html` with the tables and plots (see `report/mod.rs`).

mod baselines;
mod build;
mod call;
mod cluster;
mod crash;
mod curve;
mod disk;
mod e2b;
mod fusion;
mod hostile;
mod images;
mod images_gen;
mod measure;
mod msa;
mod neighbour;
mod net;
mod pause;
mod phases;
mod ports;
mod replay;
mod report;
mod revive;
mod scrape;
mod ship;
mod tls;
mod ui;
mod vm;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::Client;

use super::{delete_all, until_interrupted, Ctx, Stop, STOP_GRACE};
use crate::stats::Latency;
use crate::table::{ms, Table};
use baselines::Baseline;
use measure::{Density, Setup, Throughput, BENCH_LABEL};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    Create,
    Exec,
    Throughput,
    Density,
    Replay,
    /// Revive of a SWE-style episode (file writes, python3, git) vs its recorded durations
    Revive,
    /// The trajectory log: commit wait of `exec true` with one and 4 clients, and shipping
    /// lag with --trajectory-store (not part of `all`)
    Ship,
    /// Lazy vs eager vs tar-unpacked layers from a bandwidth-capped blob server (starts its
    /// own daemons; not part of `all`)
    Images,
    /// Function calls through warm pools (not part of `all`)
    Call,
    /// SandboxFusion's `/run_code` vs the function call it becomes (not part of `all`)
    Fusion,
    /// mini-swe-agent's per-step time on Warren vs its docker environment with podman, through
    /// the SDK's script and a Python with mini-swe-agent (`--python`; not part of `all`)
    Msa,
    /// Not part of `all`: it saturates the CPU on purpose.
    Neighbour,
    /// Pause and resume of a sandbox holding 512 MiB of anonymous memory (not part of `all`)
    Pause,
    Net,
    /// A GET through a sandbox's ports route vs an exec (not part of `all`)
    Ports,
    All,
    /// microVMs: cold boot vs template restore, snapshot, memory (own daemons; not in `all`)
    Vm,
    /// What a hostile sandbox costs the node: output floods against the trajectory budget,
    /// a huge directory paged through (not part of `all`)
    Hostile,
    /// A cluster on loopback: etcd, gateways, simulated nodes and one real node (own
    /// processes; not in `all`)
    Cluster,
    /// `exec true` over TLS + token vs plain HTTP on the same port (own daemon; not in `all`)
    Tls,
    /// E2B's SDK vs Warren's, same node and run: `commands.run("true")` vs `exec true`,
    /// create → first command, `-c` concurrent AsyncSandbox rollouts (default 100); own
    /// `warrend --e2b`, Python from WARREN_BENCH_PYTHON (not in `all`)
    E2b,
    /// The daemon killed with SIGKILL once per round (`-n`, default 10) during `-c` rollouts
    /// (default 50) of 20 logged steps: no step may run twice or be lost (own daemon; not in
    /// `all`)
    Crash,
    /// Dockerfile builds: a cold 6-step build vs `podman build` of the same file, the cached
    /// rebuild, N task images from one base on disk (`-n`, default 100; not in `all`)
    Build,
    /// Writable layers on disk: a 1 GiB write and a 20,000-file `git clone` inside a sandbox
    /// vs on the host file system (`--host-dir`), create → first exec on disk vs in memory
    /// (`-n` creates per medium, default 50; not in `all`)
    Disk,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Which benchmark to run
    #[arg(value_enum)]
    pub which: Which,
    /// Iterations; applies to every benchmark run
    /// [default: create 200, exec 1000, throughput 400, density 5000, replay 1000, revive 100,
    /// neighbour 200 per phase, pause 5, net 100, ports 500, e2b 500, vm 8, hostile 10000, tls
    /// 1000 per mode, ship 1000, msa 60 steps]
    #[arg(long, short = 'n')]
    pub n: Option<usize>,
    /// Concurrent clients [default: create 1, exec 1, throughput 4, density 16]; for vm: idle
    /// microVMs measured for memory [default: 8]; for e2b: rollouts at once [default: 100]
    #[arg(long, short = 'c')]
    pub concurrency: Option<usize>,
    /// density: memory per idle sandbox at each of these counts in one run (sandboxes stay
    /// alive from one point to the next) [default list: 1000,2000,5000,10000]; stops early
    /// when MemAvailable would not cover the next step
    #[arg(long, value_delimiter = ',', num_args = 0..=1,
          default_missing_value = "1000,2000,5000,10000")]
    pub curve: Option<Vec<usize>>,
    /// density: also time the dashboard's first paint (overview and table, headless Chromium)
    /// at this URL of the daemon's `/ui` (e.g. http://127.0.0.1:7070/ui) while the sandboxes
    /// are alive
    #[arg(long, value_name = "URL")]
    pub ui: Option<String>,
    /// Image of the benchmark sandboxes
    #[arg(long, default_value = "default")]
    pub image: String,
    /// Where the benchmark containers' writable layers live (`disk` or `memory`) [default: the
    /// node's]
    #[arg(long, value_name = "MEDIUM", value_parser = ["disk", "memory"])]
    pub disk_medium: Option<String>,
    /// Writable layer size of the benchmark sandboxes, in MiB [default: the node's]; a
    /// density run of thousands on disk needs small ones (or the node's --disk-overcommit)
    #[arg(long, value_name = "MIB")]
    pub disk_mb: Option<u64>,
    /// disk: the host directory of the baseline write and clone (put it on the file system
    /// the node's writable-layer file lives on)
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub host_dir: String,
    /// Print one JSON document instead of tables
    #[arg(long)]
    pub json: bool,
    /// Also write a report directory DIR (created if missing): report.json (what --json
    /// prints), one SVG per plot (latency CDFs with the baselines of the same run, the density
    /// curve, lazy vs eager image starts, cluster sandboxes per node) and a self-contained
    /// index.html with the tables and plots
    #[arg(long, value_name = "DIR")]
    pub report: Option<std::path::PathBuf>,
    /// Also run scripts/bench-baselines.sh and compare with crun, podman and bwrap
    #[arg(long)]
    pub baselines: bool,
    /// Iterations per baseline runtime
    #[arg(long, default_value_t = 50)]
    pub baseline_n: usize,
    #[command(flatten)]
    pub images: images::ImagesArgs,
    /// hostile: files made in the listed directory
    #[arg(long, default_value_t = 100_000)]
    pub files: usize,
    #[command(flatten)]
    pub cluster: cluster::ClusterArgs,
    /// ship: the store the node ships trajectories to (its --trajectory-store), read to
    /// measure how far the shipped log is behind
    #[arg(long, value_name = "URL")]
    pub trajectory_store: Option<String>,
    /// msa: the Python that runs mini-swe-agent (with the SDK and `mini-swe-agent`
    /// installed) [default: $WARREN_BENCH_PYTHON, else python3]
    #[arg(long, value_name = "PATH")]
    pub python: Option<String>,
}

/// One target and whether it was met.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    pub target: String,
    pub pass: bool,
}

impl Check {
    fn at_most(metric: &str, value: f64, unit: &'static str, limit: f64) -> Check {
        Check {
            metric: metric.into(),
            value,
            unit,
            target: format!("<= {limit}"),
            pass: value <= limit,
        }
    }

    fn at_least(metric: &str, value: f64, unit: &'static str, limit: f64) -> Check {
        Check {
            metric: metric.into(),
            value,
            unit,
            target: format!(">= {limit}"),
            pass: value >= limit,
        }
    }
}

/// Everything one `warren-bench` run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create: Option<Latency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<Latency>,
    /// The create samples' quantiles 0 %, 1 %, …, 100 % in ms (the CDF of `--report`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub create_quantiles_ms: Vec<f64>,
    /// The exec samples' quantiles, as `create_quantiles_ms`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exec_quantiles_ms: Vec<f64>,
    /// Where the exec round trip's time went (means from the node's histograms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_phases: Option<phases::Phases>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Throughput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub density: Option<Density>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub density_curve: Option<curve::Curve>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<replay::Replay>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revive: Option<revive::ReviveBench>,
    pub ship: Option<ship::Ship>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub build: Option<build::BuildBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<call::CallBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fusion: Option<fusion::FusionBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msa: Option<msa::MsaBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<neighbour::Neighbour>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pause: Option<pause::PauseBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<disk::DiskBench>,
    pub net: Option<net::NetBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<ports::PortsBench>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostile: Option<hostile::Hostile>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub baselines: Vec<Baseline>,
    pub checks: Vec<Check>,
}

impl Report {
    /// Compares the measurements with the targets.
    pub fn check(&mut self) {
        let mut checks = Vec::new();
        if let Some(c) = &self.create {
            checks.push(Check::at_most("create p50", c.p50_ms, "ms", 15.0));
            checks.push(Check::at_most("create p99", c.p99_ms, "ms", 50.0));
        }
        if let Some(e) = &self.exec {
            checks.push(Check::at_most("exec p50", e.p50_ms, "ms", 2.0));
        }
        if let Some(t) = &self.throughput {
            checks.push(Check::at_least("throughput", t.per_sec, "/s", 200.0));
        }
        if let Some(d) = &self.density {
            checks.push(Check::at_most(
                "memory per sandbox",
                d.mib_per_sandbox,
                "MiB",
                1.0,
            ));
            checks.push(Check::at_most(
                "left after delete",
                d.left_after_delete as f64,
                "",
                0.0,
            ));
            checks.push(Check::at_most(
                "/metrics scrape p50",
                d.scrape.latency.p50_ms,
                "ms",
                50.0,
            ));
            if let Some(p) = &d.dashboard {
                checks.push(Check::at_most(
                    "dashboard overview first paint p50",
                    p.overview_ms.p50_ms,
                    "ms",
                    1000.0,
                ));
            }
            if let Some(p) = d.scrape.core_percent_at_5s {
                checks.push(Check::at_most(
                    "metrics CPU at a 5 s scrape",
                    p,
                    "% core",
                    1.0,
                ));
            }
        }
        if let Some(c) = &self.density_curve {
            if let Some(f) = c.flatness() {
                checks.push(Check::at_most(
                    "curve: per sandbox at largest / smallest",
                    f,
                    "x",
                    1.15,
                ));
            }
            checks.push(Check::at_most(
                "curve: left after delete",
                c.left_after_delete as f64,
                "",
                0.0,
            ));
        }
        if let Some(b) = &self.build {
            if let Some(p) = b.podman_cold_secs {
                checks.push(Check::at_most(
                    "cold build / podman build",
                    b.cold_secs / p,
                    "x",
                    1.0,
                ));
            }
            checks.push(Check::at_most("cached rebuild", b.cached_secs, "s", 0.2));
            checks.push(Check::at_most(
                "task images on disk / (base + changes)",
                b.ratio(),
                "x",
                1.1,
            ));
        }
        if let Some(sh) = &self.ship {
            if let Some(v) = sh.append_quiet_p50_ms {
                checks.push(Check::at_most("commit wait p50, 1 client", v, "ms", 0.3));
            }
            if let Some(v) = sh.append_busy_p50_ms {
                checks.push(Check::at_most("commit wait p50, 4 clients", v, "ms", 0.6));
            }
            if let Some(l) = &sh.ship_lag {
                checks.push(Check::at_most("shipping lag p99", l.p99_ms, "ms", 1500.0));
            }
        }
        if let Some(r) = &self.replay {
            checks.push(Check::at_most(
                "replay per 1000 steps",
                r.replay_secs * 1000.0 / r.steps.max(1) as f64,
                "s",
                0.5,
            ));
            checks.push(Check::at_most(
                "commands run by replay",
                r.executed_during_replay as f64,
                "",
                0.0,
            ));
            checks.push(Check {
                metric: "side effects after replay".into(),
                value: r.side_effects as f64,
                unit: "",
                target: format!("= {}", r.steps),
                pass: r.side_effects == r.steps as u64,
            });
            if let Some(p50) = r.append_p50_ms {
                checks.push(Check::at_most("trajectory commit p50", p50, "ms", 0.3));
            }
        }
        if let Some(r) = &self.revive {
            checks.push(Check::at_most(
                "revive / recorded durations",
                r.ratio(),
                "x",
                1.1,
            ));
        }
        if let Some(n) = &self.net {
            checks.push(Check::at_most(
                "allow-list create p50 - none p50",
                n.extra_p50_ms,
                "ms",
                5.0,
            ));
        }
        if let Some(c) = &self.call {
            checks.extend(c.checks());
        }
        if let Some(f) = &self.fusion {
            checks.extend(f.checks());
        }
        if let Some(m) = &self.msa {
            checks.extend(m.checks());
        }
        if let Some(h) = &self.hostile {
            checks.extend(h.checks());
        }
        if let Some(d) = &self.disk {
            let (w, c) = d.ratios();
            checks.push(Check::at_least("1 GiB write inside / host", w, "×", 0.9));
            checks.push(Check::at_most("git clone inside / host", c, "×", 1.1));
        }
        if let Some(p) = &self.pause {
            checks.push(Check::at_most(
                "pause of 512 MiB p50",
                p.pause.p50_ms / 1000.0,
                "s",
                0.25,
            ));
        }
        if let Some(nb) = &self.neighbour {
            for p in &nb.phases {
                checks.push(Check::at_most(
                    &format!("exec p50 next to {} ({}) / quiet", p.noise, p.cpu_class),
                    p.ratio,
                    "x",
                    2.0,
                ));
            }
        }
        if let (Some(c), Some(p)) = (&self.create, baselines::podman_start(&self.baselines)) {
            let p50 = p.p50().unwrap_or(0.0);
            if p50 > 0.0 {
                let ratio = c.p50_ms / p50;
                checks.push(Check::at_most(
                    &format!("create p50 / {} p50", p.name),
                    ratio,
                    "x",
                    0.1,
                ));
            }
        }
        if let (Some(e), Some(b)) = (&self.exec, baselines::oci_exec(&self.baselines)) {
            if e.p50_ms > 0.0 {
                let speedup = b.p50().unwrap_or(0.0) / e.p50_ms;
                checks.push(Check::at_least(
                    &format!("{} p50 / exec p50", b.name),
                    speedup,
                    "x",
                    3.0,
                ));
            }
        }
        self.checks = checks;
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut lat = Table::new([
            "BENCH", "N", "P50 ms", "P99 ms", "MEAN ms", "MIN ms", "MAX ms",
        ]);
        for (name, l) in [("create", &self.create), ("exec", &self.exec)] {
            if let Some(l) = l {
                lat.row([
                    name.to_string(),
                    l.n.to_string(),
                    ms(l.p50_ms),
                    ms(l.p99_ms),
                    ms(l.mean_ms),
                    ms(l.min_ms),
                    ms(l.max_ms),
                ]);
            }
        }
        if !lat.is_empty() {
            out.push_str(&lat.render());
        }
        if let Some(p) = &self.exec_phases {
            out.push('\n');
            out.push_str(&p.render());
        }
        if let Some(t) = &self.throughput {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "throughput: {} of {} creates from {} clients in {:.2} s = {:.1}/s",
                t.created, t.n, t.concurrency, t.secs, t.per_sec
            ));
            if let Some(e) = &t.first_error {
                out.push_str(&format!(" ({} failed, first: {e})", t.failed));
            }
            out.push('\n');
        }
        if let Some(d) = &self.density {
            if !out.is_empty() && self.throughput.is_none() {
                out.push('\n');
            }
            out.push_str(&format!(
                "density: {} of {} idle sandboxes in {:.1} s; host memory used {} -> {} MiB = {:.3} MiB/sandbox; {} left after delete\n",
                d.created,
                d.requested,
                d.create_secs,
                d.used_before_kib / 1024,
                d.used_after_kib / 1024,
                d.mib_per_sandbox,
                d.left_after_delete
            ));
            out.push_str(&d.scrape.render());
            if let Some(p) = &d.dashboard {
                out.push_str(&p.render());
            }
            if d.mib_per_sandbox < 0.0 {
                out.push_str(
                    "density: host memory fell during the run (other activity); use a larger N\n",
                );
            }
            if let Some(e) = &d.stopped_by {
                out.push_str(&format!(
                    "density: creation stopped at the first refusal: {e}\n"
                ));
            }
        }
        if let Some(c) = &self.density_curve {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&c.render());
        }
        if let Some(r) = &self.replay {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&r.render());
        }
        if let Some(r) = &self.revive {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&r.render());
        }
        if let Some(sh) = &self.ship {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&sh.render());
        }
        if let Some(b) = &self.build {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&b.render());
        }
        if let Some(n) = &self.net {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&n.render());
        }
        if let Some(p) = &self.ports {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&p.render());
        }
        if let Some(c) = &self.call {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&c.render());
        }
        if let Some(f) = &self.fusion {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&f.render());
        }
        if let Some(m) = &self.msa {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&m.render());
        }
        if let Some(nb) = &self.neighbour {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&nb.render());
        }
        if let Some(p) = &self.pause {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&p.render());
        }
        if let Some(d) = &self.disk {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&d.render());
        }
        if let Some(h) = &self.hostile {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&h.render());
        }
        if !self.baselines.is_empty() {
            let mut t = Table::new(["BASELINE", "N", "P50 ms", "P99 ms", "NOTE"]);
            let opt = |v: Option<f64>| v.map(ms).unwrap_or_else(|| "-".into());
            for b in &self.baselines {
                t.row([
                    b.name.clone(),
                    b.n.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                    opt(b.p50_ms),
                    opt(b.p99_ms),
                    b.error.clone().unwrap_or_default(),
                ]);
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&t.render());
        }
        if !self.checks.is_empty() {
            let mut t = Table::new(["CHECK", "VALUE", "TARGET", "RESULT"]);
            for c in &self.checks {
                let unit = if c.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", c.unit)
                };
                t.row([
                    c.metric.clone(),
                    format!("{}{unit}", fmt_value(c.value, c.unit)),
                    format!("{}{unit}", c.target),
                    if c.pass {
                        "PASS".into()
                    } else {
                        "MISS".to_string()
                    },
                ]);
            }
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&t.render());
        }
        out
    }
}

/// A check value: counts (no unit) as integers, small ratios with three decimals.
fn fmt_value(v: f64, unit: &str) -> String {
    if unit.is_empty() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else if v != 0.0 && v.abs() < 0.1 {
        format!("{v:.3}")
    } else {
        ms(v)
    }
}

/// Deletes `ids`, failing with the first error when any delete fails.
pub(crate) async fn delete_all_reporting(
    client: &Client,
    ids: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<()> {
    let total = ids.len();
    let failed = delete_all(client, ids, concurrency).await;
    if let Some((id, e)) = failed.first() {
        anyhow::bail!(
            "{} of {total} deletes failed; first: {id}: {e}",
            failed.len()
        );
    }
    Ok(())
}

async fn measure(args: &Args, setup: &Setup, report: &mut Report) -> anyhow::Result<()> {
    let all = args.which == Which::All;
    let n = |default: usize| args.n.unwrap_or(default).max(1);
    let c = |default: usize| args.concurrency.unwrap_or(default).max(1);
    let stop = &setup.stop;
    if all || args.which == Which::Create {
        let (l, q) = measure::create_latency(setup, n(200), c(1)).await?;
        (report.create, report.create_quantiles_ms) = (Some(l), q);
    }
    if all || args.which == Which::Exec {
        stop.check()?;
        let ((l, q), p) = measure::exec_latency(setup, n(1000), c(1)).await?;
        (report.exec, report.exec_quantiles_ms, report.exec_phases) = (Some(l), q, p);
    }
    if all || args.which == Which::Throughput {
        stop.check()?;
        report.throughput = Some(measure::throughput(setup, n(400), c(4)).await?);
    }
    if all || args.which == Which::Density {
        stop.check()?;
        match &args.curve {
            Some(points) if args.which == Which::Density => {
                report.density_curve = Some(curve::curve(setup, points, c(16)).await?);
            }
            _ => {
                report.density =
                    Some(measure::density(setup, n(5000), c(16), args.ui.as_deref()).await?)
            }
        }
    }
    if all || args.which == Which::Replay {
        stop.check()?;
        report.replay = Some(replay::replay(setup, n(1000)).await?);
    }
    if all || args.which == Which::Revive {
        stop.check()?;
        report.revive = Some(revive::revive(setup, n(100)).await?);
    }
    if args.which == Which::Build {
        stop.check()?;
        let store = build::store_dir(None);
        report.build = Some(build::build_bench(setup, &store, n(100)).await?);
    }
    if args.which == Which::Ship {
        stop.check()?;
        report.ship = Some(ship::ship(setup, n(1000), args.trajectory_store.as_deref()).await?);
    }
    // Not part of `all`: it needs a node whose network is available.
    if args.which == Which::Net {
        stop.check()?;
        report.net = Some(net::net(setup, n(100)).await?);
    }
    if args.which == Which::Ports {
        stop.check()?;
        report.ports = Some(ports::ports(setup, n(500)).await?);
    }
    if args.which == Which::Call {
        report.call = Some(call::call(setup, n(1000), c(16)).await?);
    }
    if args.which == Which::Fusion {
        report.fusion = Some(fusion::fusion(setup, n(500), c(16)).await?);
    }
    if args.which == Which::Msa {
        let py = args.python.as_deref();
        report.msa = Some(msa::msa(setup.url.as_deref(), py, n(60)).await?);
    }
    if args.which == Which::Neighbour {
        stop.check()?;
        report.neighbour = Some(neighbour::neighbour(setup, n(200)).await?);
    }
    if args.which == Which::Disk {
        stop.check()?;
        report.disk = Some(disk::disk(setup, n(50), &args.host_dir).await?);
    }
    if args.which == Which::Pause {
        stop.check()?;
        report.pause = Some(pause::pause(setup, n(5)).await?);
    }
    if args.which == Which::Hostile {
        stop.check()?;
        report.hostile = Some(hostile::hostile(setup, n(10_000), args.files.max(1)).await?);
    }
    if args.baselines {
        stop.check()?;
        report.baselines = baselines::run(args.baseline_n).await?;
    }
    Ok(())
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    if args.baselines {
        baselines::check()?;
    }
    if let Some(dir) = &args.report {
        report::usable(dir)?;
    }
    if args.which == Which::Vm {
        let vms = args.concurrency.unwrap_or(8);
        let n = args.n.unwrap_or(8).max(2);
        return vm::run(&args.image, n, vms, args.json, args.report.as_deref()).await;
    }
    if args.which == Which::Tls {
        return tls::run(args.n.unwrap_or(1000), args.json, args.report.as_deref()).await;
    }
    if args.which == Which::E2b {
        let (n, c) = (
            args.n.unwrap_or(500).max(1),
            args.concurrency.unwrap_or(100).max(1),
        );
        return e2b::run(n, c, args.json, args.report.as_deref()).await;
    }
    if args.which == Which::Crash {
        let (rounds, rollouts) = (args.n.unwrap_or(10), args.concurrency.unwrap_or(50));
        return crash::run(rounds, rollouts, args.json, args.report.as_deref()).await;
    }
    if args.which == Which::Images {
        return images::run(&args.images, args.json, args.report.as_deref()).await;
    }
    if args.which == Which::Cluster {
        return cluster::run(&args.cluster, args.json, args.report.as_deref()).await;
    }
    let concurrency = args.concurrency.unwrap_or(16).max(16);
    let client = ctx.client_with(concurrency + 16)?;
    client
        .health()
        .await
        .context("the daemon does not answer")?;
    let setup = Setup {
        client: client.clone(),
        url: ctx.url.clone(),
        image: args.image.clone(),
        disk_medium: args.disk_medium.as_deref().map(|m| match m {
            "memory" => warren_types::DiskMedium::Memory,
            _ => warren_types::DiskMedium::Disk,
        }),
        disk_mb: args.disk_mb,
        run_id: crate::table::now_ms().to_string(),
        progress: true,
        stop: Stop::default(),
    };
    let mut report = Report::default();
    let (outcome, interrupted) =
        until_interrupted(measure(&args, &setup, &mut report), &setup.stop, STOP_GRACE).await;
    if interrupted || !matches!(outcome, Some(Ok(()))) {
        // Whatever an interrupted or failed run left behind carries this run's label.
        let n = super::sweep_label(&client, BENCH_LABEL, &setup.run_id).await;
        if n > 0 {
            eprintln!("bench: deleted {n} sandboxes left by this run");
        }
    }
    if interrupted {
        return Ok(130);
    }
    if let Some(Err(e)) = outcome {
        return Err(e);
    }
    report.check();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    report::write_if(args.report.as_deref(), || report::node_page(&report))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_and_rendering() {
        let lat = |p50, p99| Latency {
            n: 10,
            p50_ms: p50,
            p99_ms: p99,
            mean_ms: p50,
            min_ms: p50,
            max_ms: p99,
        };
        let mut r = Report {
            create: Some(lat(12.0, 60.0)),
            exec: Some(lat(1.5, 3.0)),
            baselines: baselines::parse(
                r#"{"name":"podman_run","p50_ms":300,"p99_ms":400,"n":5}
{"name":"crun_exec","p50_ms":6,"p99_ms":9,"n":5}
{"name":"bwrap","error":"bwrap is not installed"}"#,
            ),
            ..Default::default()
        };
        r.check();
        let got: Vec<(&str, bool)> = r
            .checks
            .iter()
            .map(|c| (c.metric.as_str(), c.pass))
            .collect();
        assert_eq!(
            got,
            [
                ("create p50", true),
                ("create p99", false),
                ("exec p50", true),
                ("create p50 / podman_run p50", true),
                ("crun_exec p50 / exec p50", true),
            ]
        );
        let text = r.render();
        assert!(
            text.contains("create p99                   60.0 ms  <= 50 ms  MISS"),
            "{text}"
        );
        assert!(
            text.contains("create p50 / podman_run p50  0.040 x  <= 0.1 x  PASS"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["checks"][1]["pass"], false);
        assert!(json.get("density").is_none());
        assert!(
            text.contains("bwrap       -  -       -       bwrap is not installed"),
            "{text}"
        );
    }
}
