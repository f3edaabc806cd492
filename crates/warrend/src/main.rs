//! `warrend`: the Warren node daemon.
//!
//! Start-up order matters: the process becomes a child subreaper and starts its reaper thread
//! before any async runtime exists (forks and waits never happen on a tokio worker), then it
//! opens the image store, the container runtime and the state store, re-adopts the sandboxes
//! an earlier run left, and serves the API on a Unix socket (and optionally TCP).
//!
//! Stopping the daemon (SIGTERM/SIGINT) stops serving; it never stops sandboxes: they are
//! re-adopted by the next start. The image store's host mounts (layers, the writable-layer
//! file system, the shared sysfs) go with the last daemon of the store that stops with no
//! sandbox left on it (`ImageStore::release_mounts`), and stay otherwise. This binary owns
//! process-wide setup only; everything about sandboxes lives in `warren-node`. Its files:
//! `args.rs` (the flags), `config.rs` (what the flags make of the node, unit-tested), `host.rs`
//! (process-wide set-up and take-down), `blobs.rs` and `cluster.rs` (the optional parts) and
//! this one, the wiring: start the parts in order, serve, stop.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};
use warren_image::{ImageStore, StoreUser};
use warren_node::{Manager, Node};
use warren_runtime::container::ContainerRuntime;
use warren_runtime::security::SecurityReport;
use warren_runtime::vm::VmRuntime;

use args::Args;
use host::StopSignals;

mod args;
mod blobs;
mod cluster;
mod config;
mod host;

/// How long open streams and terminals may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

fn main() -> Result<()> {
    // One malloc arena per CPU: the daemon's threads mostly wait, and every extra arena kept
    // megabytes of fragments after a burst of sandboxes (docs/density.md).
    warren_sys::process::limit_malloc_arenas(
        std::thread::available_parallelism().map_or(2, |n| n.get()),
    );
    // Every thread of the daemon (they inherit it) answers at once when it wakes instead of
    // waiting out a busy sandbox's time slice; CPU shares stay those of the weights.
    let short_slice = warren_sys::process::set_time_slice(warren_sys::process::SHORT_TIME_SLICE_NS);
    let args = Args::parse();
    if args.apparmor_profile {
        print!(
            "{}",
            warren_runtime::security::apparmor_profile(&warren_runtime::security::NodePaths {
                state_dir: args.state_dir.clone(),
                socket: args.socket.clone(),
                image_store: args.image_store.clone(),
            })
        );
        return Ok(());
    }
    warren_edge::logging::init(&args.log);
    info!(
        short = short_slice,
        slice_us = warren_sys::process::SHORT_TIME_SLICE_NS / 1000,
        "time slice of the daemon's threads"
    );

    // Orphans of sandboxes are re-parented to us; the reaper thread collects every child's
    // status so none stays a zombie. Code that needs a status spawns through
    // `reaper::spawn_wait`; nothing calls `wait` itself.
    warren_runtime::reaper::start().context("starting the child reaper")?;
    host::raise_fd_limit();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("warrend")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run(args))
}

/// The microvm and vm runtimes, or none (with a warning saying why) on a host without QEMU
/// or a guest kernel: the node then serves containers only.
fn vm_runtimes(
    args: &Args,
    agent: &Path,
    images: &Arc<ImageStore>,
) -> Vec<Arc<dyn warren_runtime::Runtime>> {
    let cfg = config::vm(args, agent);
    if let Some(why) = cfg.unavailable() {
        warn!(reason = %why, "VM substrates (microvm, vm) disabled");
        return Vec::new();
    }
    let mut out: Vec<Arc<dyn warren_runtime::Runtime>> = Vec::new();
    for substrate in [
        warren_types::Substrate::Microvm,
        warren_types::Substrate::Vm,
    ] {
        match VmRuntime::new(cfg.clone(), substrate, images.clone()) {
            Ok(rt) => {
                info!(substrate = substrate.as_str(), host = %rt.describe(), templates = cfg.templates, "VM runtime ready");
                out.push(Arc::new(rt));
            }
            Err(e) => warn!(substrate = substrate.as_str(), error = %e, "VM substrate disabled"),
        }
    }
    out
}

async fn run(args: Args) -> Result<()> {
    let mut signals = StopSignals::install()?;
    host::check_socket(&args.socket)?;
    // Auth and TLS files are read before anything else starts, so a typo fails fast.
    let edge = Arc::new(warren_edge::Edge::from_args(&args.edge).context("--auth / --tls-*")?);
    if !edge.authenticator().enabled() && args.socket_group.is_some() {
        warn!("--socket-group without --auth: every member of the group is the administrator");
    }
    // Bound now so that a refused address (plain HTTP off loopback) or a taken port fails
    // before anything is recovered; connections wait in the backlog until serving starts.
    let tcp = match args.listen {
        Some(addr) => Some(edge.bind_tcp(addr).await?),
        None => None,
    };
    // Before anything touches host objects: one daemon per node id per host (they share the
    // node's cgroups, and recovery removes cgroups no known sandbox owns).
    let _node_lock = host::lock_node(&args.node)?;
    let parts = Parts::start(&args).await?;
    let app = app(&args, &edge, &parts.node)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let listener = host::bind_socket(&args.socket, args.socket_group.as_deref())?;
    info!(socket = %args.socket.display(), node = %args.node, tokens = edge.authenticator().enabled(), "serving");
    let _reloader = edge.reload_on_sighup();
    let mut servers = tokio::task::JoinSet::new();
    {
        let (edge, app, stop) = (edge.clone(), app.clone(), stopped(stop_rx.clone()));
        servers.spawn(async move { edge.serve_unix(listener, app, stop).await });
    }
    if let Some(tcp) = tcp {
        let (edge, stop) = (edge.clone(), stopped(stop_rx.clone()));
        servers.spawn(async move { edge.serve_tcp(tcp, app, stop).await });
    }
    // Join the cluster once the API answers. A live node holding this id refuses us; an
    // unreachable etcd does not (the node serves, and registers when etcd answers).
    let membership = cluster::start(
        &args.cluster,
        args.listen,
        &parts.node,
        &parts.images,
        parts.blobs.is_some(),
    )?;
    let mut asked = None;
    if let Some(m) = &membership {
        tokio::select! {
            r = m.wait_registered(Duration::from_secs(10)) => match r {
                Ok(true) => {}
                Ok(false) => {
                    warn!("etcd does not answer yet; serving and registering in the background")
                }
                Err(why) => bail!("cannot join the cluster: {why}"),
            },
            // A stale registration of this node id may hold the join for seconds.
            sig = signals.recv() => asked = Some(sig),
        }
    }

    match asked {
        Some(sig) => info!(
            signal = sig,
            "stopping while joining the cluster; sandboxes keep running"
        ),
        None => tokio::select! {
            sig = signals.recv() => info!(signal = sig, "stopping; sandboxes keep running"),
            res = servers.join_next() => {
                if let Some(r) = res {
                    r.context("server task")?;
                }
                warn!("a server stopped on its own; stopping");
            }
        },
    }
    // Leave the cluster first: gateways stop sending to this node at once.
    if let Some(m) = membership {
        m.leave(Duration::from_secs(1)).await;
    }
    parts.stop_serving().await;
    let _ = stop_tx.send(true);
    if tokio::time::timeout(DRAIN, async {
        while servers.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        warn!(
            secs = DRAIN.as_secs(),
            "open connections did not finish; closing them"
        );
    }
    parts.stop().await;
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

/// The node's started parts: what serving uses, and what a stop takes down.
struct Parts {
    node: Node,
    manager: Manager,
    images: Arc<ImageStore>,
    /// This daemon's use of the image store; the last user's stop takes the mounts down.
    store_user: StoreUser,
    /// The blob store layers are fetched from, when there is one.
    blobs: Option<Arc<warren_blob::CacheSource>>,
    network: Arc<warren_net::Network>,
    trimmer: tokio::task::JoinHandle<()>,
    _reaper: tokio::task::JoinHandle<()>,
}

impl Parts {
    /// Opens the stores, starts the runtimes, the network and the shipper, and re-adopts the
    /// sandboxes an earlier run left.
    async fn start(args: &Args) -> Result<Parts> {
        let state = args.state_dir.join("state.redb");
        let store = warren_node::Store::open(&state)
            .with_context(|| format!("opening the state store {}", state.display()))?;
        let agent = match args.agent.clone() {
            Some(a) => a,
            None => host::default_agent()?,
        };
        let images =
            Arc::new(ImageStore::open(&args.image_store).with_context(|| {
                format!("opening the image store {}", args.image_store.display())
            })?);
        // Before anything mounts in the store (the runtimes mount the writable-layer file
        // system and the shared sysfs at start): the last user of the store to stop takes them
        // down. It waits while a stopping daemon of the store unmounts.
        let store_user = {
            let images = images.clone();
            tokio::task::spawn_blocking(move || images.user())
                .await
                .context("the image store users task")?
                .with_context(|| format!("using the image store {}", args.image_store.display()))?
        };
        let blobs = blobs::attach(&args.blobs, &args.state_dir, &images)?;
        let mut container = config::container(args, &agent);
        let security = SecurityReport::detect(container.seccomp, container.landlock);
        if security.apparmor.enforced {
            container.apparmor_profile = Some(warren_runtime::security::APPARMOR_PROFILE.into());
        }
        if security.apparmor.available && !security.apparmor.enforced {
            warn!(apparmor = %security.apparmor.note, "AppArmor profile not loaded");
        }
        info!(confinement = %security.describe(), "sandbox confinement");
        let runtime = ContainerRuntime::new(container, images.clone()).with_context(|| {
            format!("starting the container runtime (agent {})", agent.display())
        })?;
        info!(host = %runtime.describe(), "container runtime ready");
        let host = config::Host {
            writable_on_disk: runtime.writable().is_some(),
            memory_mb: warren_node::admission::meminfo().map(|m| m.total_mb()),
            security,
        };
        let mut runtimes: Vec<Arc<dyn warren_runtime::Runtime>> = vec![Arc::new(runtime)];
        runtimes.extend(vm_runtimes(args, &agent, &images));
        let cfg = config::node(args, host)?;
        match cfg.default_ttl_secs {
            Some(d) => info!(
                default_ttl_secs = d,
                "sandboxes created without a ttl are deleted {} after their creation (--default-ttl; `none` for no limit)",
                config::human_secs(d)
            ),
            None => info!("sandboxes created without a ttl live until deleted (--default-ttl none)"),
        }
        let node = Node::new(Manager::new(cfg, runtimes, store), Some(images.clone()));
        let manager = node.sandboxes.clone();
        let network = start_network(args, &node).await?;
        let report = manager
            .recover()
            .await
            .context("recovering sandboxes from the state store")?;
        info!(
            adopted = report.adopted.len(),
            failed = report.failed.len(),
            orphans = report.orphans_removed.len(),
            "state recovered"
        );
        if let Some(url) = &args.trajectory_store {
            ship_trajectories(url, &node, &manager).await?;
        }
        Ok(Parts {
            _reaper: manager.spawn_reaper(),
            trimmer: host::spawn_heap_trimmer(manager.clone()),
            node,
            manager,
            images,
            store_user,
            blobs,
            network,
        })
    }

    /// What stops before open connections drain: the trimmer, the manager's background work,
    /// the sandboxes' links and rules (sandboxes keep loopback; the next start restores them).
    async fn stop_serving(&self) {
        self.trimmer.abort();
        self.manager.shutdown();
        self.network.shutdown().await;
    }

    /// What stops last: the warm function containers (they are not sandboxes and do not
    /// outlive the daemon), then the image store's mounts if this was their last user.
    async fn stop(self) {
        self.node.stop().await;
        host::release_store_mounts(&self.images, self.store_user, &self.manager).await;
    }
}

/// The sandboxes' network: removes the links and the table an earlier run left (recovery
/// re-attaches adopted sandboxes). A network that cannot start leaves only policy `none`.
async fn start_network(args: &Args, node: &Node) -> Result<Arc<warren_net::Network>> {
    let net_cfg = match &args.network_config {
        Some(p) => warren_net::NetConfig::load(p)?,
        None => warren_net::NetConfig::default(),
    };
    let network = Arc::new(
        warren_net::Network::new(args.node.as_str(), net_cfg).context("network configuration")?,
    );
    match network.start().await {
        Ok(removed) => {
            for r in removed {
                warn!(removed = %r, "stale network object removed");
            }
        }
        Err(e) => warn!(error = %e, "sandbox networking unavailable: only policy none is accepted"),
    }
    node.network.set(network.clone());
    Ok(network)
}

/// Ships every sandbox's trajectory to `url` and, before serving, deletes the sandboxes that
/// were revived on another node while this one was down (so they are not resumed beside their
/// copies).
async fn ship_trajectories(url: &str, node: &Node, manager: &Manager) -> Result<()> {
    let store = warren_blob::trajectory::open_trajectory_store(url)
        .with_context(|| format!("trajectory store {url}"))?;
    node.trajectories
        .ship_trajectories(store, manager)
        .context("starting the trajectory shipper")?;
    info!(store = %url, "shipping trajectories");
    let deleted = node.trajectories.delete_revived(manager).await;
    if !deleted.is_empty() {
        warn!(
            sandboxes = deleted.len(),
            "deleted sandboxes that were revived on another node"
        );
    }
    Ok(())
}

/// The router served: the API behind the edge, the dashboard's static files (they take no
/// token; the API calls the page makes do) and, with `--e2b`, E2B's API in front of
/// everything (it authenticates API keys and envd tokens itself and calls the v1 router
/// in-process, docs/e2b.md).
fn app(args: &Args, edge: &warren_edge::Edge, node: &Node) -> Result<axum::Router> {
    let native = warren_node::router(node.clone());
    let mut app = edge.protect(native.clone()).merge(warren_ui::router());
    if args.e2b.e2b {
        let secret = args.state_dir.join(warren_e2b::SECRET_FILE);
        let tokens = warren_e2b::Tokens::load_or_create(&secret)
            .with_context(|| format!("the E2B token secret {}", secret.display()))?;
        app = warren_e2b::E2b::node(
            native,
            edge.authenticator().clone(),
            tokens,
            args.e2b.e2b_domain.clone(),
        )
        .wrap(app);
        info!(domain = ?args.e2b.e2b_domain, "serving E2B's API");
    }
    Ok(app)
}
