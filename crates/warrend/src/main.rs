//! `warrend`: the Warren node daemon.
//!
//! Start-up order matters: the process becomes a child subreaper and starts its reaper thread
//! before any async runtime exists (forks and waits never happen on a tokio worker), then it
//! opens the image store, the container runtime and the state store, re-adopts the sandboxes
//! an earlier run left, and serves the API on a Unix socket (and optionally TCP).
//!
//! Stopping the daemon (SIGTERM/SIGINT) stops serving; it never stops sandboxes: they are
//! re-adopted by the next start. This binary owns process-wide setup only; everything about
//! sandboxes lives in `warren-node`.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};
use warren_image::ImageStore;
use warren_node::{Manager, Node, NodeConfig, Store};
use warren_runtime::container::{ContainerConfig, ContainerRuntime};
use warren_runtime::security::SecurityReport;
use warren_runtime::vm::{Accel, VmConfig, VmRuntime};
use warren_types::NodeId;

mod blobs;
mod cluster;

/// How long open streams and terminals may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Debug, Parser)]
#[command(
    name = "warrend",
    version,
    about = "Warren node daemon: sandboxes for RL agents behind an HTTP API"
)]
struct Args {
    /// Unix socket to serve the API on.
    #[arg(long, default_value = "/run/warren/warren.sock")]
    socket: PathBuf,
    /// Also serve the API on this TCP address: over TLS with --tls-cert/--tls-key, else
    /// plain HTTP on a loopback address only.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Group allowed to use the Unix socket (mode 0660); its members present a token when
    /// --auth is given. Without it only root may connect.
    #[arg(long)]
    socket_group: Option<String>,
    #[command(flatten)]
    edge: warren_edge::EdgeArgs,
    #[command(flatten)]
    log: warren_edge::logging::LogArgs,
    #[command(flatten)]
    e2b: warren_e2b::E2bArgs,
    /// Directory of the durable state (state.redb).
    #[arg(long, default_value = "/var/lib/warren")]
    state_dir: PathBuf,
    /// The image layer store.
    #[arg(
        long,
        env = "WARREN_IMAGE_STORE",
        default_value = "/var/lib/warren/images"
    )]
    image_store: PathBuf,
    /// This node's id (1-16 chars of [a-z0-9]); it prefixes every sandbox id and names the
    /// node's cgroups, so it must be unique on the host.
    #[arg(long, default_value = "n1")]
    node: NodeId,
    /// The warren-agent executable (default: next to this executable).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Most sandboxes this node holds at once.
    #[arg(long, default_value_t = 10_000)]
    max_sandboxes: usize,
    /// Trajectory budget of a sandbox whose request names none, in MiB (at most 32): output
    /// of later calls is logged as sha256 and size only.
    #[arg(long, default_value_t = warren_types::sandbox::DEFAULT_TRAJECTORY_MB,
          value_parser = clap::value_parser!(u64).range(1..=32))]
    trajectory_mb: u64,
    /// Where every sandbox's trajectory is shipped, in segments at most about a second
    /// behind its calls, and sealed when the sandbox is deleted: a directory, file://DIR or
    /// s3://BUCKET/PREFIX (as --blob-store). A trajectory the node no longer has is read
    /// from it.
    #[arg(long, env = "WARREN_TRAJECTORY_STORE", value_name = "URL")]
    trajectory_store: Option<String>,
    /// Once the node's state (state.redb and the output files of trajectory-blobs/) is this
    /// large, in MiB, no output is kept in any trajectory (digests and sizes only).
    #[arg(long, default_value_t = warren_node::config::DEFAULT_STATE_MAX_BYTES >> 20)]
    state_max_mb: u64,
    /// Lifetime of a sandbox created without a ttl: 30m, 12h, 7d (a plain number is
    /// seconds), or `none` (it lives until deleted, or --max-ttl). The default, a day, keeps
    /// the sandboxes of a trainer that died from living forever; it is capped by --max-ttl.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_TTL, value_parser = ttl_or_none)]
    default_ttl: OptionalSecs,
    /// Longest lifetime a create or an extension may give a sandbox: 1d, 30d. A sandbox
    /// created without a ttl (and no --default-ttl) gets this one.
    #[arg(long, value_name = "DURATION", value_parser = warren_types::units::parse_whole_secs)]
    max_ttl: Option<u64>,
    /// Timeout of a command whose exec request names none: 10m, 1h (a plain number is
    /// seconds). Default: none.
    #[arg(long, value_name = "DURATION", value_parser = warren_types::units::parse_secs)]
    default_exec_timeout: Option<f64>,
    /// Most sandboxes starting at once; more creates are refused with `busy` (429).
    #[arg(long, default_value_t = 64)]
    max_starting: u64,
    /// Most sandboxes held that are not starting; more creates are refused with `busy`.
    #[arg(long, default_value_t = 10_000)]
    max_running: u64,
    /// Refuse new sandboxes (`busy`) while the host has less memory available, in MiB.
    #[arg(long, default_value_t = 256)]
    min_free_memory_mb: u64,
    #[command(flatten)]
    cluster: cluster::ClusterArgs,
    /// Working directory of the microvm and vm substrates: sandboxes' disks and sockets,
    /// templates, base disks (default: STATE_DIR/vm). Daemons may share one.
    #[arg(long, env = "WARREN_VM_DIR")]
    vm_dir: Option<PathBuf>,
    /// Guest kernel and modules of the VM substrates (scripts/build-guest.sh).
    #[arg(long, default_value = "/var/cache/warren/guest/current")]
    guest_kernel: PathBuf,
    /// VM acceleration: auto (KVM when a guest really boots with it, else TCG), kvm or tcg.
    #[arg(long, env = "WARREN_VM_ACCEL", default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    vm_accel: String,
    /// Create VMs by restoring a per-machine-shape template snapshot instead of booting.
    #[arg(long, env = "WARREN_VM_TEMPLATES", default_value_t = true, action = clap::ArgAction::Set)]
    vm_templates: bool,
    #[command(flatten)]
    blobs: blobs::BlobArgs,
    /// Warm containers each function pool keeps while in use.
    #[arg(long, default_value_t = 2)]
    function_min_warm: usize,
    /// Most containers of one function pool.
    #[arg(long, default_value_t = 32)]
    function_max_warm: usize,
    /// Most calls waiting per function pool (more are refused with `busy`).
    #[arg(long, default_value_t = 512)]
    function_queue: usize,
    /// Longest a call waits for a warm container, in milliseconds, before `busy`.
    #[arg(long, default_value_t = 10_000)]
    function_queue_timeout_ms: u64,
    /// Cap on the memory limits of all warm function containers, in MiB. Default: half the
    /// host's memory (at most 64 GiB); never more than the host has.
    #[arg(long)]
    function_max_memory_mb: Option<u64>,
    /// A pool whose calls wait for their call environments grows only while the node's CPU
    /// pressure (PSI `some avg10`, percent) is at most this; 100 ignores the pressure.
    #[arg(long, default_value_t = 40.0, value_parser = pressure_percent)]
    function_max_cpu_pressure: f64,
    /// Do not put sandboxes into a Landlock domain (it is applied best effort by the
    /// kernel's ABI otherwise).
    #[arg(long)]
    no_landlock: bool,
    /// Sandbox agents kept started ahead of creates (each a parked process of a few MiB); a
    /// create takes one instead of waiting for an agent to start. 0 turns this off.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    agent_spares: u16,
    /// Leave the cgroup v2 mount's options as they are. By default the daemon sets
    /// `favordynmods` on it (kept after it stops, for the whole host): moving each new
    /// sandbox's agent into its cgroups then does not wait for an RCU grace period, at the
    /// cost of slightly slower forks and exits.
    #[arg(long)]
    keep_cgroup_options: bool,
    /// Where containers' writable layers live on disk: a directory of a btrfs with quotas
    /// on, or the mount point of the file-backed btrfs the daemon makes beside it
    /// (`DIR.img`). Default: `<image store>/mnt/writable`.
    #[arg(long)]
    writable_dir: Option<PathBuf>,
    /// Size of the file-backed writable-layer file system the daemon makes where DIR cannot
    /// hold quotas, in MiB (a sparse file; only made once).
    #[arg(long, default_value_t = warren_runtime::container::DEFAULT_WRITABLE_MB)]
    writable_size_mb: u64,
    /// The disk quotas of all sandboxes on disk may add up to this many times the
    /// writable-layer file system's size; a create beyond it is refused (busy). 1 backs every
    /// quota with space; more makes quotas limits rather than reservations.
    #[arg(long, default_value_t = warren_runtime::container::DEFAULT_DISK_OVERCOMMIT, value_parser = overcommit_ratio)]
    disk_overcommit: f64,
    /// Where a container's writable layer lives when its create request does not say:
    /// `disk` (with a quota) or `memory` (a tmpfs charged to its memory). `memory` also
    /// turns the writable-layer file system off.
    #[arg(long, default_value = "disk", value_parser = disk_medium)]
    disk_medium: warren_types::DiskMedium,
    /// First host uid of the range (2^30 uids) that owns sandboxes' user namespaces, one uid
    /// per sandbox (a hash of its id): the kernel charges the counts of `/proc/sys/user/*`
    /// (inotify instances and watches, ...) per owner, so each sandbox has its own instead
    /// of sharing host root's. 0 makes them as host root (shared counts).
    #[arg(long, default_value_t = 1 << 31)]
    sandbox_owner_uid_base: u32,
    /// A limit of each sandbox's own user namespace, `NAME=VALUE` with NAME a count of
    /// `/proc/sys/user/` (e.g. `max_inotify_watches=65536`); repeatable. The host's per-user
    /// limit applies to each sandbox on top.
    #[arg(long, value_parser = warren_runtime::container::UserLimit::parse)]
    sandbox_user_limit: Vec<warren_runtime::container::UserLimit>,
    /// Admit container sandboxes whose memory exceeds the host's (by default such a create is
    /// refused, as for VMs: `invalid_request`).
    #[arg(long)]
    memory_overcommit: bool,
    /// Host uid/gid of the first sandbox id range: each container sandbox gets 65,536 host ids
    /// of its own from the pool starting here (a multiple of 65536). Two daemons on one host
    /// need pools of their own; the pool must not overlap the owner uids
    /// (--sandbox-owner-uid-base).
    #[arg(long, default_value_t = 1 << 24)]
    id_pool_base: u32,
    /// Number of 65,536-id ranges in the pool (the most container sandboxes at once); 0 maps
    /// every sandbox to the one shared range at 100000.
    #[arg(long, default_value_t = 16_384)]
    id_ranges: u32,
    /// Print the AppArmor profile for this node's sandboxes (paths from the other options)
    /// and exit; load it with `apparmor_parser -r`.
    #[arg(long)]
    apparmor_profile: bool,
    /// Network configuration (TOML, or JSON by extension): named services, static host
    /// entries, the sandbox address pool, the upstream resolver. Without it, policies can
    /// still allow raw networks and domains (pool 10.200.0.0/16).
    #[arg(long)]
    network_config: Option<PathBuf>,
}

fn overcommit_ratio(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.01..=1000.0).contains(&r) => Ok(r),
        _ => Err(format!("{s:?} is not a ratio between 0.01 and 1000")),
    }
}

fn disk_medium(s: &str) -> Result<warren_types::DiskMedium, String> {
    match s {
        "disk" => Ok(warren_types::DiskMedium::Disk),
        "memory" => Ok(warren_types::DiskMedium::Memory),
        _ => Err(format!("{s:?}: the medium is `disk` or `memory`")),
    }
}

/// The warm function containers' memory cap: the operator's, else half the host's memory (at
/// most 64 GiB), and never more than the host has (`host_mb`, when known).
fn warm_memory_cap(asked: Option<u64>, host_mb: Option<u64>) -> u64 {
    const MOST: u64 = 64 * 1024;
    match (asked, host_mb) {
        (Some(a), Some(h)) if a > h => {
            tracing::warn!(
                asked = a,
                host_mb = h,
                "--function-max-memory-mb is more than the host has; using the host's memory"
            );
            h
        }
        (Some(a), _) => a,
        (None, Some(h)) => (h / 2).clamp(1, MOST),
        (None, None) => MOST,
    }
}

/// `--default-ttl` when not given: a day.
const DEFAULT_TTL: &str = "24h";

/// A duration in seconds or none; `builtin` when it is [`DEFAULT_TTL`] (not the operator's).
#[derive(Debug, Clone, Copy)]
struct OptionalSecs {
    secs: Option<u64>,
    builtin: bool,
}

/// `none` (or 0): no lifetime; else a duration.
fn ttl_or_none(s: &str) -> Result<OptionalSecs, String> {
    if s == "none" {
        return Ok(OptionalSecs {
            secs: None,
            builtin: false,
        });
    }
    let secs = warren_types::units::parse_whole_secs(s)?;
    Ok(OptionalSecs {
        secs: Some(secs).filter(|&n| n > 0),
        builtin: s == DEFAULT_TTL,
    })
}

/// `86400` as `1d`, `5400` as `90m`: the largest unit that divides it.
fn human_secs(s: u64) -> String {
    match s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

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
    raise_fd_limit();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("warrend")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(run(args))
}

/// Every sandbox costs the daemon a socket (its agent connection) plus a few fds per call in
/// flight: lift the soft fd limit to the hard one.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
            }
        }
        tracing::info!(limit = hard.max(soft), "open-file limit");
    }
}

fn default_agent() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    Ok(exe.with_file_name("warren-agent"))
}

/// Refuses a socket another daemon answers on; removes a stale one.
fn check_socket(path: &Path) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        bail!(
            "another daemon already answers on {}; pick another --socket",
            path.display()
        );
    }
    match std::fs::remove_file(path) {
        Ok(()) => info!(socket = %path.display(), "removed a stale socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing stale socket {}", path.display()))
        }
    }
    Ok(())
}

fn bind_socket(path: &Path, group: Option<&str>) -> Result<tokio::net::UnixListener> {
    let gid = match group {
        Some(name) => Some(
            nix::unistd::Group::from_name(name)
                .with_context(|| format!("looking up group {name}"))?
                .with_context(|| format!("--socket-group {name}: no such group (groupadd {name})"))?
                .gid,
        ),
        None => None,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("chmod {}", path.display()))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid))
            .with_context(|| format!("chgrp {} to {gid}", path.display()))?;
        info!(socket = %path.display(), group = group.unwrap_or_default(), "socket open to its group (mode 0660)");
    }
    Ok(listener)
}

/// Holds an exclusive lock on `/run/warren/node-<id>.lock` for the daemon's life.
fn lock_node(node: &NodeId) -> Result<nix::fcntl::Flock<std::fs::File>> {
    let dir = Path::new("/run/warren");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("node-{node}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        anyhow::anyhow!(
            "another daemon runs as node {node} on this host ({}: {e}); pick another --node",
            path.display()
        )
    })
}

/// SIGTERM and SIGINT, caught from the start of [`run`]: a stop asked for while the daemon
/// starts (its wait for the cluster registration included) goes through the same clean stop
/// as one asked for later, instead of the signal's default action killing it half-way.
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn install() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// The next stop signal's name.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

/// The microvm and vm runtimes, or none (with a warning saying why) on a host without QEMU
/// or a guest kernel: the node then serves containers only.
fn vm_runtimes(
    args: &Args,
    agent: &Path,
    images: &Arc<ImageStore>,
) -> Vec<Arc<dyn warren_runtime::Runtime>> {
    let root = args
        .vm_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("vm"));
    let mut cfg = VmConfig::new(args.node.clone(), agent.to_path_buf(), root);
    cfg.kernel_dir = args.guest_kernel.clone();
    cfg.templates = args.vm_templates;
    cfg.accel = match args.vm_accel.as_str() {
        "kvm" => Some(Accel::Kvm),
        "tcg" => Some(Accel::Tcg),
        _ => None,
    };
    if let Some(why) = cfg.unavailable() {
        warn!(reason = why, "VM substrates (microvm, vm) disabled");
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
    check_socket(&args.socket)?;
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
    let _node_lock = lock_node(&args.node)?;
    let state = args.state_dir.join("state.redb");
    let store = Store::open(&state)
        .with_context(|| format!("opening the state store {}", state.display()))?;
    let agent = match args.agent.clone() {
        Some(a) => a,
        None => default_agent()?,
    };
    let images = Arc::new(
        ImageStore::open(&args.image_store)
            .with_context(|| format!("opening the image store {}", args.image_store.display()))?,
    );
    let blob_source = blobs::attach(&args.blobs, &args.state_dir, &images)?;
    let mut container = ContainerConfig::new(args.node.clone(), agent.clone());
    container.landlock = !args.no_landlock;
    container.agent_spares = args.agent_spares.into();
    container.favor_cgroup_moves = !args.keep_cgroup_options;
    container.id_pool =
        (args.id_ranges > 0).then_some(warren_runtime::container::ids::IdPoolConfig {
            base: args.id_pool_base,
            slots: args.id_ranges,
        });
    container.writable = (args.disk_medium == warren_types::DiskMedium::Disk).then(|| {
        warren_runtime::container::WritableConfig {
            dir: args.writable_dir.clone().unwrap_or_default(),
            size_mb: args.writable_size_mb,
            overcommit: args.disk_overcommit,
        }
    });
    container.owner_uid_base =
        (args.sandbox_owner_uid_base != 0).then_some(args.sandbox_owner_uid_base);
    container.user_limits = args.sandbox_user_limit.clone();
    container.memory_overcommit = args.memory_overcommit;
    let security = SecurityReport::detect(container.seccomp, container.landlock);
    if security.apparmor.enforced {
        container.apparmor_profile = Some(warren_runtime::security::APPARMOR_PROFILE.into());
    }
    if security.apparmor.available && !security.apparmor.enforced {
        warn!(apparmor = %security.apparmor.note, "AppArmor profile not loaded");
    }
    info!(confinement = %security.describe(), "sandbox confinement");
    let runtime = ContainerRuntime::new(container, images.clone())
        .with_context(|| format!("starting the container runtime (agent {})", agent.display()))?;
    info!(host = %runtime.describe(), "container runtime ready");
    // Writable layers on disk by default where the node has them; else in memory.
    let disk_default = if runtime.writable().is_some() {
        warren_types::DiskMedium::Disk
    } else {
        warren_types::DiskMedium::Memory
    };
    let mut runtimes: Vec<Arc<dyn warren_runtime::Runtime>> = vec![Arc::new(runtime)];
    runtimes.extend(vm_runtimes(&args, &agent, &images));
    let mut cfg = NodeConfig::new(args.node.clone());
    cfg.max_sandboxes = args.max_sandboxes;
    cfg.defaults.trajectory_mb = args.trajectory_mb;
    cfg.defaults.disk_medium = disk_default;
    cfg.state_max_bytes = args.state_max_mb << 20;
    let default_ttl = match (args.default_ttl.secs, args.max_ttl) {
        // The built-in default never exceeds an operator's cap.
        (Some(d), Some(m)) if d > m && args.default_ttl.builtin => Some(m),
        (Some(d), Some(m)) if d > m => {
            bail!("--default-ttl ({d} s) is longer than --max-ttl ({m} s)")
        }
        (d, _) => d,
    };
    match default_ttl {
        Some(d) => info!(
            default_ttl_secs = d,
            "sandboxes created without a ttl are deleted {} after their creation (--default-ttl; `none` for no limit)",
            human_secs(d)
        ),
        None => info!("sandboxes created without a ttl live until deleted (--default-ttl none)"),
    }
    if args.default_exec_timeout.is_some_and(|t| t <= 0.0) {
        bail!("--default-exec-timeout must be more than 0");
    }
    cfg.default_ttl_secs = default_ttl;
    cfg.max_ttl_secs = args.max_ttl;
    cfg.default_exec_timeout_secs = args.default_exec_timeout;
    cfg.admission = warren_node::admission::AdmissionConfig {
        max_starting: args.max_starting,
        max_running: args.max_running,
        min_free_memory_mb: args.min_free_memory_mb,
    };
    cfg.functions.min_warm = args.function_min_warm;
    cfg.functions.max_warm = args.function_max_warm.max(1);
    cfg.functions.max_queue = args.function_queue;
    cfg.functions.queue_timeout = Duration::from_millis(args.function_queue_timeout_ms);
    cfg.functions.max_warm_memory_mb = warm_memory_cap(
        args.function_max_memory_mb,
        warren_node::admission::meminfo().map(|m| m.total_mb),
    );
    cfg.functions.max_cpu_pressure =
        (args.function_max_cpu_pressure < 100.0).then_some(args.function_max_cpu_pressure);
    cfg.security = security;
    let node = Node::new(Manager::new(cfg, runtimes, store), Some(images.clone()));
    let manager = node.sandboxes.clone();
    let net_cfg = match &args.network_config {
        Some(p) => warren_net::NetConfig::load(p)?,
        None => warren_net::NetConfig::default(),
    };
    let network = Arc::new(
        warren_net::Network::new(args.node.as_str(), net_cfg).context("network configuration")?,
    );
    // Removes links and the table an earlier run left; recovery re-attaches adopted sandboxes.
    match network.start().await {
        Ok(removed) => {
            for r in removed {
                warn!(removed = %r, "stale network object removed");
            }
        }
        Err(e) => warn!(error = %e, "sandbox networking unavailable: only policy none is accepted"),
    }
    node.network.set(network.clone());
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
        let store = warren_blob::trajectory::open_trajectory_store(url)
            .with_context(|| format!("trajectory store {url}"))?;
        node.trajectories
            .ship_trajectories(store, &manager)
            .context("starting the trajectory shipper")?;
        info!(store = %url, "shipping trajectories");
    }
    let _reaper = manager.spawn_reaper();
    let trimmer = spawn_heap_trimmer(manager.clone());

    // The dashboard's static files take no token; the API calls the page makes do.
    let native = warren_node::router(node.clone());
    let mut app = edge.protect(native.clone()).merge(warren_ui::router());
    if args.e2b.e2b {
        // E2B's API in front of everything: it authenticates API keys and envd tokens
        // itself and calls the v1 router in-process (docs/e2b.md).
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
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let listener = bind_socket(&args.socket, args.socket_group.as_deref())?;
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
        &node,
        &images,
        blob_source.is_some(),
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
    trimmer.abort();
    manager.shutdown();
    // Links and rules go with the daemon (sandboxes keep loopback); the next start restores them.
    network.shutdown().await;
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
    // Warm function containers are not sandboxes: they do not outlive the daemon.
    node.stop().await;
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}

/// A percentage from 0 to 100.
fn pressure_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a percentage from 0 to 100")),
    }
}

/// Once the node holds fewer sandboxes than at the last look (deletes, expiry), gives the
/// allocator's free memory back to the kernel: without it the daemon kept the peak of a large
/// run (240 MiB of anonymous memory after 9,000 sandboxes came and went, 26 MiB after a trim).
fn spawn_heap_trimmer(manager: warren_node::Manager) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held = manager.count();
        loop {
            tick.tick().await;
            let now = manager.count();
            if now < held {
                let _ = tokio::task::spawn_blocking(warren_sys::process::trim_heap).await;
            }
            held = now;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_memory_never_exceeds_the_host() {
        assert_eq!(warm_memory_cap(None, Some(24_000)), 12_000);
        assert_eq!(warm_memory_cap(None, Some(1 << 20)), 64 * 1024);
        assert_eq!(warm_memory_cap(Some(100_000), Some(24_000)), 24_000);
        assert_eq!(warm_memory_cap(Some(4_096), Some(24_000)), 4_096);
        assert_eq!(warm_memory_cap(None, None), 64 * 1024);
    }

    #[test]
    fn the_default_lifetime_is_a_day_and_can_be_none() {
        let d = ttl_or_none(DEFAULT_TTL).unwrap();
        assert_eq!((d.secs, d.builtin), (Some(86_400), true));
        let n = ttl_or_none("none").unwrap();
        assert_eq!((n.secs, n.builtin), (None, false));
        assert_eq!(ttl_or_none("0").unwrap().secs, None);
        assert_eq!(ttl_or_none("30m").unwrap().secs, Some(1_800));
        assert!(ttl_or_none("-1h").is_err());
        assert_eq!(human_secs(86_400), "1d");
        assert_eq!(human_secs(5_400), "90m");
        assert_eq!(human_secs(61), "61s");
    }
}
