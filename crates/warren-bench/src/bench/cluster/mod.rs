//! `warren bench cluster`: a cluster on loopback — a real 3-member etcd, real gateways, and
//! SIMULATED nodes (`warren-simnode`: the node API and etcd membership of `warrend`, sandboxes
//! kept in memory with a modelled create latency and memory; a benchmark tool, never a
//! substrate) — plus one real `warrend` for the gateway's overhead on `exec true`.
//!
//! | phase | what | target |
//! |---|---|---|
//! | throughput | creations/s through 2 gateways over 16 simulated nodes | ≥ 1,000/s |
//! | leader | etcd leader `kill -9`'d during a create burst: creates lost, p99, nodes marked lost | 0, ≤ 2 s, 0 |
//! | loss | a simulated node `kill -9`'d: noticed by every gateway; calls to it fail in | ≤ 4 s; ≤ 100 ms |
//! | scale | 380,000 sandboxes over 120 simulated nodes: max/mean per node; a label list of 1,000 | ≤ 1.10; ≤ 1 s |
//! | overhead | `exec true` p50 through a gateway − direct, real node (root, default image) | ≤ 0.3 ms |
//!
//! Everything it starts is killed when it ends, on error or interrupt too; the etcd data
//! directory is temporary.

pub(super) mod page;
mod procs;
mod scenarios;

use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;

use super::Check;
use crate::table::{ms, Table};
use procs::{Etcd, Gateway, SimNodes};
pub(crate) use scenarios::{Burst, LeaderLoss, NodeLoss, Overhead, Scale};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Throughput,
    Leader,
    Loss,
    Scale,
    Overhead,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// Phases of `bench cluster` [default: all]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub cluster_phases: Vec<Phase>,
    /// Simulated nodes of the throughput, leader and loss phases
    #[arg(long, default_value_t = 16)]
    pub cluster_sim_nodes: usize,
    /// Creates of the throughput phase
    #[arg(long, default_value_t = 20_000)]
    pub cluster_creates: usize,
    /// Creates of the leader phase
    #[arg(long, default_value_t = 10_000)]
    pub cluster_leader_creates: usize,
    /// Simulated nodes of the scale phase
    #[arg(long, default_value_t = 120)]
    pub cluster_scale_nodes: usize,
    /// Live sandboxes of the scale phase
    #[arg(long, default_value_t = 380_000)]
    pub cluster_scale_sandboxes: usize,
    /// Modelled create latency of a simulated node, in milliseconds
    #[arg(long, default_value_t = 10)]
    pub cluster_create_ms: u64,
    /// Requests in flight at once
    #[arg(long, default_value_t = 256)]
    pub cluster_in_flight: usize,
    /// `exec true` round trips of the overhead phase, per path
    #[arg(long, default_value_t = 1000)]
    pub cluster_execs: usize,
}

#[derive(Debug, Default, Serialize)]
pub struct ClusterReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub throughput: Option<Burst>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderLoss>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<NodeLoss>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// Phases that could not run, and why.
    pub skipped: Vec<String>,
    pub checks: Vec<Check>,
}

impl ClusterReport {
    fn check(&mut self) {
        let mut c = Vec::new();
        if let Some(t) = &self.throughput {
            c.push(Check::at_least(
                "creations/s, 2 gateways, simulated nodes",
                t.per_sec,
                "/s",
                1000.0,
            ));
            c.push(Check::at_most("creates failed", t.failed as f64, "", 0.0));
        }
        if let Some(l) = &self.leader {
            c.push(Check::at_most(
                "creates lost, etcd leader killed",
                l.burst.failed as f64,
                "",
                0.0,
            ));
            c.push(Check::at_most(
                "create p99, etcd leader killed",
                l.burst.latency.p99_ms,
                "ms",
                2000.0,
            ));
            c.push(Check::at_most(
                "nodes marked lost, etcd leader killed",
                l.nodes_marked_lost as f64,
                "",
                0.0,
            ));
            c.push(Check {
                metric: "sandboxes listed after the burst".into(),
                value: l.listed as f64,
                unit: "",
                target: format!("= {}", l.burst.created),
                pass: l.listed == l.burst.created,
            });
        }
        if let Some(l) = &self.loss {
            let worst = l.noticed_ms.iter().copied().fold(0.0, f64::max);
            c.push(Check::at_most(
                "node loss noticed by every gateway",
                worst,
                "ms",
                4000.0,
            ));
            c.push(Check::at_most(
                "calls to the dead node fail in (max)",
                l.call_fail.max_ms,
                "ms",
                100.0,
            ));
            let only_503 = l.call_statuses.keys().all(|s| *s == 503);
            c.push(Check {
                metric: "calls to the dead node answer 503".into(),
                value: l.call_statuses.get(&503).copied().unwrap_or(0) as f64,
                unit: "",
                target: format!("= {}", l.call_fail.n),
                pass: only_503 && l.call_fail.n > 0,
            });
            c.push(Check {
                metric: "status once the node is lost".into(),
                value: l.status_after_lost.unwrap_or(0) as f64,
                unit: "",
                target: "= 410".into(),
                pass: l.status_after_lost == Some(410),
            });
        }
        if let Some(s) = &self.scale {
            c.push(Check::at_most(
                "max/mean sandboxes per node",
                s.imbalance,
                "x",
                1.10,
            ));
            c.push(Check::at_most(
                "label list of 1,000 sandboxes (max)",
                s.list_1000.max_ms,
                "ms",
                1000.0,
            ));
            c.push(Check {
                metric: "sandboxes the label list found".into(),
                value: s.list_found as f64,
                unit: "",
                target: "= 1000".into(),
                pass: s.list_found == 1000,
            });
        }
        if let Some(o) = &self.overhead {
            c.push(Check::at_most(
                "gateway overhead on exec true, p50",
                o.overhead_p50_ms,
                "ms",
                0.3,
            ));
        }
        self.checks = c;
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let mut t = Table::new(["PHASE", "N", "OK", "PER S", "P50 ms", "P99 ms", "MAX ms"]);
        let mut burst_row = |name: &str, b: &Burst| {
            t.row([
                name.to_string(),
                b.requested.to_string(),
                b.created.to_string(),
                format!("{:.0}", b.per_sec),
                ms(b.latency.p50_ms),
                ms(b.latency.p99_ms),
                ms(b.latency.max_ms),
            ]);
        };
        if let Some(b) = &self.throughput {
            burst_row("throughput (creates)", b);
        }
        if let Some(l) = &self.leader {
            burst_row(&format!("leader killed ({})", l.killed), &l.burst);
        }
        if let Some(s) = &self.scale {
            burst_row(&format!("scale ({} nodes)", s.nodes), &s.create);
        }
        if !t.is_empty() {
            out.push_str(&t.render());
        }
        if let Some(s) = &self.scale {
            out.push_str(&format!(
                "scale: per node min {} / mean {:.1} / max {} = max/mean {:.3}; label list of {} in p50 {} ms, max {} ms\n",
                s.per_node_min,
                s.per_node_mean,
                s.per_node_max,
                s.imbalance,
                s.list_found,
                ms(s.list_1000.p50_ms),
                ms(s.list_1000.max_ms)
            ));
        }
        if let Some(l) = &self.leader {
            out.push_str(&format!(
                "leader: {} created, {} lost, {} listed afterwards, {} nodes marked lost\n",
                l.burst.created, l.burst.failed, l.listed, l.nodes_marked_lost
            ));
        }
        if let Some(l) = &self.loss {
            let noticed: Vec<String> = l.noticed_ms.iter().map(|m| format!("{m:.0} ms")).collect();
            out.push_str(&format!(
                "loss: node {} noticed lost by the gateways after {}; {} calls to it failed in p50 {} ms, max {} ms ({:?}); once lost: {:?}\n",
                l.node,
                noticed.join(", "),
                l.call_fail.n,
                ms(l.call_fail.p50_ms),
                ms(l.call_fail.max_ms),
                l.call_statuses,
                l.status_after_lost
            ));
        }
        if let Some(o) = &self.overhead {
            out.push_str(&format!(
                "overhead: exec true p50 direct {} ms, through a gateway {} ms: +{} ms (n = {} each)\n",
                ms(o.direct.p50_ms),
                ms(o.via_gateway.p50_ms),
                ms(o.overhead_p50_ms),
                o.direct.n
            ));
        }
        for s in &self.skipped {
            out.push_str(&format!("skipped: {s}\n"));
        }
        let mut checks = Table::new(["CHECK", "VALUE", "TARGET", "OK"]);
        for c in &self.checks {
            checks.row([
                c.metric.clone(),
                format!("{:.3}{}", c.value, c.unit),
                c.target.clone(),
                if c.pass { "yes" } else { "NO" }.to_string(),
            ]);
        }
        out.push('\n');
        out.push_str(&checks.render());
        out
    }
}

pub async fn run(a: &ClusterArgs, json: bool, report_dir: Option<&std::path::Path>) -> Result<i32> {
    let phases: Vec<Phase> = if a.cluster_phases.is_empty() {
        vec![
            Phase::Throughput,
            Phase::Leader,
            Phase::Loss,
            Phase::Scale,
            Phase::Overhead,
        ]
    } else {
        a.cluster_phases.clone()
    };
    let want = |p: Phase| phases.contains(&p);
    let run_id = format!("cb{}", crate::table::now_ms() % 1_000_000_000);
    let logs = tempfile::Builder::new()
        .prefix("warren-bench-cluster-")
        .tempdir()
        .context("a log directory")?;
    let mut report = ClusterReport::default();

    if want(Phase::Throughput) || want(Phase::Leader) || want(Phase::Loss) || want(Phase::Overhead)
    {
        let mut etcd = Etcd::start().await?;
        let ep = etcd.endpoints();
        let sims = SimNodes::start(&ep, "s", 0, a.cluster_sim_nodes, a.cluster_create_ms).await?;
        let gws = vec![
            Gateway::start(&ep, logs.path(), "gw1").await?,
            Gateway::start(&ep, logs.path(), "gw2").await?,
        ];
        for g in &gws {
            g.wait_ready(sims.nodes.len(), Duration::from_secs(15))
                .await?;
        }
        if want(Phase::Throughput) {
            eprintln!(
                "bench cluster: throughput: {} creates over {} simulated nodes",
                a.cluster_creates, a.cluster_sim_nodes
            );
            let cs = scenarios::clients(&gws, a.cluster_in_flight)?;
            let labels = |_| [("bench".to_string(), format!("{run_id}t"))].into();
            report.throughput = Some(
                scenarios::burst(
                    &cs,
                    a.cluster_creates,
                    a.cluster_in_flight,
                    &format!("{run_id}t"),
                    labels,
                    None,
                )
                .await,
            );
        }
        if want(Phase::Overhead) {
            eprintln!(
                "bench cluster: overhead: a real warrend, exec true direct and through a gateway"
            );
            // It needs root: a real node makes namespaces and cgroups.
            if nix_is_root() {
                let dir = logs.path().join("node");
                report.overhead =
                    Some(scenarios::overhead(&ep, &gws[0], a.cluster_execs, &dir).await?);
            } else {
                report
                    .skipped
                    .push("overhead: needs root (it starts a real warrend)".into());
            }
        }
        if want(Phase::Loss) {
            eprintln!("bench cluster: loss: kill -9 of a simulated node");
            report.loss = Some(scenarios::node_loss(&ep, &gws, sims.nodes.len(), &run_id).await?);
        }
        if want(Phase::Leader) {
            eprintln!(
                "bench cluster: leader: kill -9 of the etcd leader during {} creates",
                a.cluster_leader_creates
            );
            report.leader = Some(
                scenarios::leader_loss(
                    &mut etcd,
                    &gws,
                    a.cluster_leader_creates,
                    a.cluster_in_flight,
                    &format!("{run_id}l"),
                )
                .await?,
            );
        }
        drop(gws);
        drop(sims);
        drop(etcd);
    }
    if want(Phase::Scale) {
        eprintln!(
            "bench cluster: scale: {} sandboxes over {} simulated nodes",
            a.cluster_scale_sandboxes, a.cluster_scale_nodes
        );
        let etcd = Etcd::start().await?;
        let ep = etcd.endpoints();
        // Several processes, so one process's runtime is not the bottleneck.
        let procs = a.cluster_scale_nodes.div_ceil(30).max(1);
        let mut sims = Vec::new();
        for p in 0..procs {
            let first = p * 30;
            let count = 30.min(a.cluster_scale_nodes - first);
            sims.push(SimNodes::start(&ep, "s", first, count, a.cluster_create_ms).await?);
        }
        let gws = vec![
            Gateway::start(&ep, logs.path(), "gw3").await?,
            Gateway::start(&ep, logs.path(), "gw4").await?,
        ];
        for g in &gws {
            g.wait_ready(a.cluster_scale_nodes, Duration::from_secs(30))
                .await?;
        }
        report.scale = Some(
            scenarios::scale(
                &gws,
                a.cluster_scale_nodes,
                a.cluster_scale_sandboxes,
                a.cluster_in_flight,
                &format!("{run_id}s"),
            )
            .await?,
        );
    }
    report.check();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    super::report::write_if(report_dir, || page::cluster_page(&report, report.render()))?;
    Ok(if report.checks.iter().all(|c| c.pass) {
        0
    } else {
        1
    })
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}
