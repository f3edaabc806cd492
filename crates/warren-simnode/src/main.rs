//! `warren-simnode`: SIMULATED Warren nodes, for cluster benchmarks only.
//!
//! Each simulated node listens on its own loopback port, speaks the part of the node API a
//! gateway needs (health, create, get, list, delete, exec), and registers in etcd exactly like
//! `warrend` (through `warren_cluster::Membership`: lease, load summary, duplicate-id refusal).
//! Its sandboxes are records in memory with a modelled create latency and memory: nothing is
//! isolated and nothing runs. It is a benchmark tool, never a substrate: a node advertises
//! `<version>-simulated` and its health says `"simulated": true`.
//!
//! One process can hold many nodes (`--nodes N`); it prints `ready <id> <url>` per node once
//! each is registered, then serves until SIGTERM/SIGINT, when it leaves etcd.

mod api;
mod node;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use warren_cluster::{Keys, MemberConfig, Membership};
use warren_types::NodeId;

use node::{Model, SimNode};

#[derive(Debug, Parser)]
#[command(
    name = "warren-simnode",
    version,
    about = "SIMULATED Warren nodes for cluster benchmarks: the node API and etcd membership of \
             warrend, sandboxes kept in memory (nothing is isolated or run)"
)]
struct Args {
    /// The etcd members, comma-separated.
    #[arg(long, required = true)]
    etcd: String,
    /// The etcd key prefix of the cluster.
    #[arg(long, default_value = "/warren")]
    etcd_prefix: String,
    /// How many simulated nodes this process holds.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Node ids are this prefix plus a 3-digit number from `--first` (1-16 chars of [a-z0-9]
    /// in all).
    #[arg(long, default_value = "sim")]
    node_prefix: String,
    /// The number of the first node.
    #[arg(long, default_value_t = 0)]
    first: usize,
    /// The loopback address the nodes listen on (each on its own free port).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Modelled create latency, in milliseconds.
    #[arg(long, default_value_t = 10)]
    create_ms: u64,
    /// Modelled memory of each node, in MiB.
    #[arg(long, default_value_t = 1 << 20)]
    memory_mb: u64,
    /// Memory kept free: creates that would go below it are refused, in MiB.
    #[arg(long, default_value_t = 1024)]
    min_free_memory_mb: u64,
    /// Most sandboxes each node holds.
    #[arg(long, default_value_t = 10_000)]
    max_sandboxes: u64,
    /// Most creates each node runs at once (more are refused with `busy` and Retry-After).
    #[arg(long, default_value_t = 64)]
    max_starting: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    if !args.host.is_loopback() {
        bail!("simulated nodes listen on loopback only, not {}", args.host);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let endpoints = warren_cluster::etcd::parse_endpoints(&args.etcd);
    let model = Model {
        create_latency: Duration::from_millis(args.create_ms),
        memory_mb: args.memory_mb,
        min_free_memory_mb: args.min_free_memory_mb,
        max_sandboxes: args.max_sandboxes,
        max_starting: args.max_starting,
        retry_after_secs: 1,
    };
    let mut members = Vec::new();
    for i in args.first..args.first + args.nodes {
        let id: NodeId = format!("{}{i:03}", args.node_prefix)
            .parse()
            .map_err(|e| anyhow::anyhow!("node id {}{i:03}: {e}", args.node_prefix))?;
        let listener = tokio::net::TcpListener::bind(SocketAddr::new(args.host, 0))
            .await
            .context("binding a loopback port")?;
        let url = format!("http://{}", listener.local_addr()?);
        let node = Arc::new(SimNode::new(id.clone(), url.clone(), model.clone()));
        let app = api::router(node.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("simulated node stopped serving: {e}");
            }
        });
        let mut cfg = MemberConfig::new(endpoints.clone());
        cfg.keys = Keys::new(&args.etcd_prefix);
        let source = {
            let node = node.clone();
            Arc::new(move || node.record())
        };
        members.push((id, url, Membership::start(cfg, source)));
    }
    for (id, url, m) in &members {
        match m.wait_registered(Duration::from_secs(30)).await {
            Ok(true) => println!("ready {id} {url}"),
            Ok(false) => bail!("node {id}: etcd did not answer within 30 s"),
            Err(why) => bail!("node {id}: registration refused: {why}"),
        }
    }
    wait_for_signal().await;
    for (_, _, m) in members {
        m.leave(Duration::from_secs(2)).await;
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the process ends by SIGKILL, which is also what node-loss
        // measurements use.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
