//! `warren-gateway`: the stateless cluster gateway. Serves the node API on `--listen` over
//! the nodes registered in the etcd at `--etcd`, behind the same edge as `warrend`: TLS
//! (`--tls-cert`, `--tls-key`; plain HTTP on loopback only), tokens (`--auth`, re-read on
//! SIGHUP). Toward `https://` nodes it trusts `--node-ca` and presents `--node-cert`. With
//! `--trajectory-store` it reads trajectories the nodes shipped when a node cannot answer.
//!
//! `warren-gateway bench overhead --node URL --gateway URL` measures the gateway's cost on
//! `exec true` against calling the node directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tracing::info;
use warren_cluster::{etcd::parse_endpoints, ClusterView, Keys};
use warren_gateway::{Gateway, GatewayConfig};

#[derive(Debug, Parser)]
#[command(
    name = "warren-gateway",
    version,
    about = "Warren cluster gateway: the node API over every node of a cluster"
)]
struct Args {
    /// etcd endpoints, comma-separated (`http://10.0.0.1:2379,http://10.0.0.2:2379`).
    #[arg(long, env = "WARREN_ETCD", default_value = "http://127.0.0.1:2379")]
    etcd: String,
    /// The etcd key prefix of this cluster.
    #[arg(long, default_value = "/warren")]
    etcd_prefix: String,
    /// Address to serve the API on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Nodes sampled per placement (power of k choices).
    #[arg(long, default_value_t = 2)]
    placement_k: usize,
    /// Most nodes asked for one create before answering `capacity_unavailable`.
    #[arg(long, default_value_t = 4)]
    max_attempts: usize,
    /// This gateway's name in `/v1/health`.
    #[arg(long, default_value = "gateway")]
    name: String,
    /// Threads serving requests [default: one per CPU]. A gateway sharing a small host with
    /// nodes answers a little faster on fewer; gateways scale out rather than up.
    #[arg(long, env = "WARREN_GATEWAY_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// CA (PEM) that signs the certificates of `https://` nodes [default: the system's roots].
    #[arg(long, value_name = "FILE")]
    node_ca: Option<PathBuf>,
    /// Certificate chain (PEM) presented to nodes that require client certificates.
    #[arg(long, value_name = "FILE", requires = "node_key")]
    node_cert: Option<PathBuf>,
    /// Private key (PEM) of --node-cert.
    #[arg(long, value_name = "FILE", requires = "node_cert")]
    node_key: Option<PathBuf>,
    /// The store nodes ship trajectories to (`warrend --trajectory-store`: a directory,
    /// file://DIR or s3://BUCKET/PREFIX): a trajectory export whose node is lost, does not
    /// answer or no longer has the sandbox is read from it.
    #[arg(long, env = "WARREN_TRAJECTORY_STORE", value_name = "URL")]
    trajectory_store: Option<String>,
    #[command(flatten)]
    edge: warren_edge::EdgeArgs,
    #[command(flatten)]
    log: warren_edge::logging::LogArgs,
    #[command(flatten)]
    e2b: warren_e2b::E2bArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measurements.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// p50 of `exec true` through a gateway and straight to the node, one JSON line.
    Overhead {
        /// The node (`http://host:port`).
        #[arg(long)]
        node: String,
        /// The gateway (`http://host:port`).
        #[arg(long)]
        gateway: String,
        /// A running sandbox of that node (default: one is created and deleted).
        #[arg(long)]
        sandbox: Option<String>,
        #[arg(short, long, default_value_t = 1000)]
        n: usize,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    warren_edge::logging::init(&args.log);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.threads {
        rt.worker_threads(usize::from(n));
    }
    let rt = rt
        .enable_all()
        .thread_name("warren-gateway")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        match args.command {
            Some(Command::Bench { what }) => bench(what).await,
            None => serve(args).await,
        }
    })
}

async fn serve(args: Args) -> Result<()> {
    let endpoints = parse_endpoints(&args.etcd);
    anyhow::ensure!(!endpoints.is_empty(), "--etcd names no endpoint");
    let edge = Arc::new(warren_edge::Edge::from_args(&args.edge)?);
    let node_tls = match (&args.node_ca, &args.node_cert, &args.node_key) {
        (None, None, None) => None,
        (ca, cert, key) => Some(
            warren_client::client_config(ca.as_deref(), cert.as_deref().zip(key.as_deref()))
                .context("TLS toward the nodes (--node-ca, --node-cert, --node-key)")?,
        ),
    };
    let trajectory_store = match &args.trajectory_store {
        Some(url) => Some(
            warren_blob::trajectory::open_trajectory_store(url)
                .with_context(|| format!("trajectory store {url}"))?,
        ),
        None => None,
    };
    let view = ClusterView::start(endpoints.clone(), Keys::new(&args.etcd_prefix));
    let gw = Gateway::new(
        GatewayConfig {
            k: args.placement_k.max(1),
            max_attempts: args.max_attempts.max(1),
            name: args.name.clone(),
            node_tls,
            trajectory_store,
            ..GatewayConfig::default()
        },
        view.clone(),
    );
    // Serve at once; the view fills as soon as etcd answers.
    if !view.wait_for(Duration::from_secs(2), |v| v.connected).await {
        tracing::warn!(etcd = ?endpoints, "etcd not reachable yet; serving and retrying");
    }
    let listener = edge.bind_tcp(args.listen).await?;
    let _reloader = edge.reload_on_sighup();
    info!(listen = %args.listen, etcd = ?endpoints, tokens = edge.authenticator().enabled(), "gateway serving");
    let mut app = edge.protect(gw.router()).merge(warren_ui::router());
    if args.e2b.e2b {
        // Creates and listings go through the gateway's API; per-sandbox E2B requests go to
        // the sandbox's node, which must run with --e2b too (docs/e2b.md).
        app = warren_e2b::E2b::gateway(
            gw.router(),
            edge.authenticator().clone(),
            Arc::new(gw.clone()),
            args.e2b.e2b_domain.clone(),
        )
        .wrap(app);
        info!(domain = ?args.e2b.e2b_domain, "serving E2B's API");
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = edge.serve_tcp(listener, app, async {
        let _ = stop_rx.await;
    });
    tokio::pin!(serving);
    tokio::select! {
        _ = &mut serving => {}
        _ = shutdown() => {
            info!("stopping");
            let _ = stop_tx.send(());
            // Event streams and long calls never end on their own: they get DRAIN to finish.
            if tokio::time::timeout(DRAIN, &mut serving).await.is_err() {
                tracing::warn!(secs = DRAIN.as_secs(), "open connections did not finish; closing them");
            }
        }
    }
    info!("gateway stopped");
    Ok(())
}

/// How long open requests (event streams, exec streams, terminals) may take to finish after a
/// shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

async fn bench(what: Bench) -> Result<()> {
    match what {
        Bench::Overhead {
            node,
            gateway,
            sandbox,
            n,
        } => {
            let (id, made) = match sandbox {
                Some(id) => (id, false),
                None => (create(&gateway).await?, true),
            };
            let r = warren_gateway::bench::exec_overhead(&node, &gateway, &id, n).await;
            if made {
                let _ = delete(&gateway, &id).await;
            }
            println!("{}", serde_json::to_string(&r?)?);
            Ok(())
        }
    }
}

async fn http(method: &str, url: &str, body: &str) -> Result<(u16, String)> {
    use http_body_util::BodyExt;
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let req = axum::http::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))?;
    let resp = c.request(req).await.with_context(|| url.to_string())?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

async fn create(gateway: &str) -> Result<String> {
    let (s, body) = http("POST", &format!("{gateway}/v1/sandboxes"), "{}").await?;
    anyhow::ensure!(s < 300, "create through {gateway}: {s} {body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["id"]
        .as_str()
        .context("create answered no id")?
        .to_string())
}

async fn delete(gateway: &str, id: &str) -> Result<()> {
    http("DELETE", &format!("{gateway}/v1/sandboxes/{id}"), "").await?;
    Ok(())
}
