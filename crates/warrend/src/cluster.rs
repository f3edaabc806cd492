//! Cluster membership of this node (`--etcd`, `--advertise`): the record it publishes and
//! the flags that turn it on. The registration itself is `warren_cluster::member`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use warren_cluster::etcd::parse_endpoints;
use warren_cluster::{Keys, MemberConfig, Membership, RejoinHook};
use warren_image::ImageStore;
use warren_node::Node;
use warren_types::{NodeRecord, WarmPool, NODE_RECORD_FORMAT};

#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Join a cluster: etcd endpoints, comma-separated. Needs `--listen` (gateways reach the
    /// node over TCP) and, unless `--listen` names a routable address, `--advertise`.
    #[arg(long, env = "WARREN_ETCD")]
    pub etcd: Option<String>,
    /// The URL gateways reach this node's API at (default: `http://` + `--listen`).
    #[arg(long)]
    pub advertise: Option<String>,
    /// The etcd key prefix of the cluster.
    #[arg(long, default_value = "/warren")]
    pub etcd_prefix: String,
}

/// Image refs with their layers, and the layers on disk; read again every few seconds and
/// whenever this node wrote or removed a tag.
struct ImageCache {
    at: Option<Instant>,
    /// The store's change count when read: a tag written or removed here is published at once.
    changes: u64,
    images: std::collections::BTreeMap<String, Vec<String>>,
    layers: Vec<String>,
}

const IMAGE_REFRESH: Duration = Duration::from_secs(3);

/// Starts registering this node; `None` without `--etcd`.
pub fn start(
    args: &ClusterArgs,
    listen: Option<std::net::SocketAddr>,
    node: &Node,
    images: &Arc<ImageStore>,
    blob_store: bool,
) -> Result<Option<Membership>> {
    let Some(etcd) = &args.etcd else {
        return Ok(None);
    };
    let endpoints = parse_endpoints(etcd);
    if endpoints.is_empty() {
        bail!("--etcd names no endpoint");
    }
    let address = match (&args.advertise, listen) {
        (Some(a), _) => a.trim_end_matches('/').to_string(),
        (None, Some(l)) if !l.ip().is_unspecified() => format!("http://{l}"),
        (None, Some(l)) => {
            bail!("--listen {l} is not an address gateways can reach: set --advertise")
        }
        (None, None) => bail!("--etcd needs --listen (gateways reach nodes over TCP)"),
    };
    address
        .parse::<axum::http::Uri>()
        .with_context(|| format!("--advertise {address:?} is not a URL"))?;
    let incarnation = ulid::Ulid::new().to_string().to_lowercase();
    let started_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let cache = Mutex::new(ImageCache {
        at: None,
        changes: 0,
        images: Default::default(),
        layers: Vec::new(),
    });
    let m = node.sandboxes.clone();
    let telemetry = node.telemetry.clone();
    let functions = node.functions.clone();
    let store = images.clone();
    let source = Arc::new(move || {
        let (images, layers) = {
            let mut c = cache.lock().expect("image cache lock");
            let changes = store.changes();
            if c.changes != changes || c.at.is_none_or(|t| t.elapsed() > IMAGE_REFRESH) {
                let (i, l) = read_images(&store);
                c.images = i;
                c.layers = l;
                c.at = Some(Instant::now());
                c.changes = changes;
            }
            (c.images.clone(), c.layers.clone())
        };
        let pools = functions
            .info()
            .pools
            .into_iter()
            .map(|p| WarmPool {
                image: p.image,
                memory_mb: p.memory_mb,
                idle: p.idle,
                busy: p.busy,
            })
            .collect();
        NodeRecord {
            format: NODE_RECORD_FORMAT,
            id: m.config().node.clone(),
            incarnation: incarnation.clone(),
            address: address.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at_ms,
            substrates: m.substrates().served(),
            capacity: telemetry.capacity(&m),
            load: telemetry.load(&m),
            pools,
            images,
            layers,
            blob_store,
        }
    });
    let mut cfg = MemberConfig::new(endpoints);
    cfg.keys = Keys::new(&args.etcd_prefix);
    // Once its lease may have expired, the node reads a sandbox's revive mark before it runs
    // anything in it: a gateway may have revived it elsewhere (see `Trajectories::fence`).
    let clock = cfg.lease_clock.clone();
    node.trajectories
        .set_registration_doubt(Arc::new(move || clock.in_doubt()));
    // Gateways may have revived this node's sandboxes on other nodes while it was away: those
    // originals go before the node is routed to again.
    let (trajectories, sandboxes) = (node.trajectories.clone(), node.sandboxes.clone());
    cfg.before_rejoin = Some(RejoinHook(Arc::new(move || {
        let (t, m) = (trajectories.clone(), sandboxes.clone());
        let rejoin: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(async move {
                let deleted = t.delete_revived(&m).await;
                if !deleted.is_empty() {
                    tracing::warn!(
                        sandboxes = deleted.len(),
                        "deleted sandboxes revived elsewhere while the node was out of the cluster"
                    );
                }
            });
        rejoin
    })));
    Ok(Some(Membership::start(cfg, source)))
}

fn read_images(
    store: &ImageStore,
) -> (std::collections::BTreeMap<String, Vec<String>>, Vec<String>) {
    let mut images = std::collections::BTreeMap::new();
    let mut layers: Vec<String> = Vec::new();
    for m in store.list() {
        for l in &m.layers {
            if !layers.contains(l)
                && store
                    .blob_path(l)
                    .map(|p: PathBuf| p.is_file())
                    .unwrap_or(false)
            {
                layers.push(l.clone());
            }
        }
        images.insert(format!("{}:{}", m.name, m.tag), m.layers);
    }
    layers.sort();
    (images, layers)
}
