//! The container substrate: namespaces + cgroups + overlayfs over idmapped EROFS layers.
//!
//! Who does what:
//! - the daemon (here) makes the cgroups, spawns `warren-agent` with the control socket on
//!   fd 3, writes its uid/gid maps once it has unshared, and makes sure the image's layers are
//!   mounted read-only and idmapped (once per host, shared by every sandbox);
//! - the agent builds everything else *inside* the sandbox's own mount namespace (tmpfs
//!   writable layer with the disk limit, overlay, /proc, /dev, /sys, masks, pivot_root), so
//!   no per-sandbox mount ever appears in the host's mount table and nothing needs unmounting
//!   when the sandbox's last process dies.
//!
//! Files: `create.rs` (start-up handshake), `spares.rs` (agents started ahead of creates),
//! `destroy.rs` (kill by cgroup, cleanup), `adopt.rs` (re-attach after a daemon restart),
//! `record.rs` (what is persisted), `writable.rs` (writable layers on disk: one file system,
//! a subvolume with a quota per sandbox), `ids.rs` (a host uid/gid range per sandbox).

mod adopt;
mod create;
mod destroy;
mod fork;
pub mod ids;
mod pause;
mod ports;
mod record;
mod snapshot;
mod spares;
pub mod writable;

use async_trait::async_trait;
use std::path::PathBuf;
use std::sync::Arc;
use warren_image::ImageStore;
use warren_types::{NodeId, SandboxId, Substrate};

use crate::agent::AgentConn;
use crate::cgroup::{CgroupSet, Hierarchy};
use crate::{Instance, Runtime, RuntimeError, SandboxSpec, StartCause, Unsupported, Usage};

pub use record::ContainerRecord;
pub use warren_proto::UserLimit;
pub use writable::{WritableConfig, WritableSpace, WritableStore, DEFAULT_DISK_OVERCOMMIT};

/// Configuration of the container substrate.
#[derive(Debug, Clone)]
pub struct ContainerConfig {
    pub node: NodeId,
    /// The `warren-agent` executable.
    pub agent_bin: PathBuf,
    /// Host uid/gid that root inside every sandbox maps to when the node has no id pool
    /// (`id_pool: None`); 65536 ids from there are used.
    pub id_base: u32,
    /// Ranges of 65,536 host ids, one per sandbox (see [`ids`]); `None` maps every sandbox to
    /// `id_base`.
    pub id_pool: Option<ids::IdPoolConfig>,
    /// Paths hidden inside the sandbox.
    pub masked_paths: Vec<String>,
    /// Paths made read-only inside the sandbox.
    pub readonly_paths: Vec<String>,
    pub seccomp: bool,
    /// Put every sandbox into a Landlock domain (see `warren_sys::landlock`).
    pub landlock: bool,
    /// AppArmor profile for every command, when the host has AppArmor and it is loaded.
    pub apparmor_profile: Option<String>,
    /// Agents kept started and parked for the next creates (see `spares.rs`); 0 starts each
    /// sandbox's agent during its create.
    pub agent_spares: usize,
    /// Set the cgroup v2 option `favordynmods` (see [`crate::cgroup::favor_moves`]) so that
    /// moving an agent into its groups does not wait for an RCU grace period.
    pub favor_cgroup_moves: bool,
    /// Writable layers on disk (see [`writable`]); `None` keeps every writable layer in
    /// memory. Its `dir` defaults to `<image store>/mnt/writable` when empty.
    pub writable: Option<WritableConfig>,
    /// First host uid of the range sandboxes' user namespaces are made by (see
    /// [`owner_uid`]); `None` makes them as host root, whose per-user counts every sandbox
    /// and the host then share.
    pub owner_uid_base: Option<u32>,
    /// Limits of each sandbox's own user namespace (`/proc/sys/user/*`).
    pub user_limits: Vec<warren_proto::UserLimit>,
    /// Admit sandboxes whose memory exceeds the host's (deliberate overcommit).
    pub memory_overcommit: bool,
}

/// Size of the owner uid range: sandboxes' owners are spread over it by a hash of their id,
/// so two live sandboxes share one (and so their counts) only by a rare collision.
pub const OWNER_UIDS: u32 = 1 << 30;

/// The host uid that makes (owns) sandbox `id`'s user namespace: `base` plus a hash of the
/// id (FNV-1a) within [`OWNER_UIDS`]. A uid no process of the host runs as: it only names
/// whose per-user counts (`/proc/sys/user/*`) the sandbox's kernel objects are charged to.
pub fn owner_uid(base: u32, id: &str) -> u32 {
    let mut h: u32 = 0x811c9dc5;
    for b in id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    base.saturating_add(h % OWNER_UIDS)
}

impl ContainerConfig {
    pub fn new(node: NodeId, agent_bin: PathBuf) -> Self {
        ContainerConfig {
            node,
            agent_bin,
            id_base: 100_000,
            id_pool: Some(ids::IdPoolConfig::default()),
            masked_paths: [
                "/proc/kcore",
                "/proc/kallsyms",
                "/proc/kpagecgroup",
                "/proc/kpagecount",
                "/proc/kpageflags",
                "/proc/keys",
                "/proc/timer_list",
                "/proc/sched_debug",
                "/proc/sysrq-trigger",
                "/proc/latency_stats",
                "/proc/acpi",
                "/proc/scsi",
                "/sys/firmware",
                "/sys/kernel/debug",
                "/sys/fs/cgroup",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            readonly_paths: ["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            seccomp: true,
            landlock: true,
            apparmor_profile: None,
            agent_spares: 2,
            favor_cgroup_moves: true,
            writable: Some(WritableConfig {
                dir: PathBuf::new(),
                size_mb: DEFAULT_WRITABLE_MB,
                overcommit: writable::DEFAULT_DISK_OVERCOMMIT,
            }),
            owner_uid_base: Some(1 << 31),
            user_limits: Vec::new(),
            memory_overcommit: false,
        }
    }
}

/// Size of the file-backed writable-layer file system a node makes by default (sparse: it
/// takes what its sandboxes write).
pub const DEFAULT_WRITABLE_MB: u64 = 64 * 1024;

/// The container runtime.
pub struct ContainerRuntime {
    cfg: ContainerConfig,
    images: Arc<ImageStore>,
    hierarchy: Hierarchy,
    /// A user namespace with the sandboxes' id maps, used to idmap image layers *before* a
    /// sandbox's agent copies the host's mount table (a layer mounted later would be missing
    /// from that copy).
    idmap: std::os::fd::OwnedFd,
    /// The node's shared read-only sysfs (see [`shared_sysfs`]); `None` where it could not be
    /// made, and each sandbox mounts its own.
    sysfs: Option<PathBuf>,
    /// Agents started ahead for the next creates.
    spares: Arc<spares::Spares>,
    /// Writable layers on disk; `None` where the node keeps them in memory only.
    writable: Option<Arc<WritableStore>>,
    /// The host id ranges of the sandboxes; `None`: every sandbox maps to `id_base`.
    ids: Option<Arc<ids::IdPool>>,
}

impl ContainerRuntime {
    pub fn new(cfg: ContainerConfig, images: Arc<ImageStore>) -> Result<Self, RuntimeError> {
        if !cfg.agent_bin.is_file() {
            return Err(StartCause::Config(crate::ConfigError::AgentMissing(
                cfg.agent_bin.clone(),
            ))
            .into());
        }
        match crate::program::linkage(&cfg.agent_bin) {
            Ok(crate::program::Linkage::Static) => {
                tracing::info!(agent = %cfg.agent_bin.display(), "sandbox agent: a static program")
            }
            Ok(crate::program::Linkage::Dynamic) => tracing::warn!(
                agent = %cfg.agent_bin.display(),
                "sandbox agent is dynamically linked: every sandbox start pays the loader and \
                 the C library's start-up (about 1 ms of CPU on a VM); scripts/up.sh builds it \
                 static"
            ),
            // Not an ELF program this reader knows (a wrapper script, another architecture's
            // layout): it is started as given, and fails at its start if it cannot run.
            Err(e) => tracing::warn!(
                agent = %cfg.agent_bin.display(),
                error = %e,
                "cannot tell how the sandbox agent is linked"
            ),
        }
        let hierarchy = Hierarchy::detect(&format!("warren-{}", cfg.node))?;
        if cfg.favor_cgroup_moves {
            use crate::cgroup::FavorMoves;
            match crate::cgroup::favor_moves() {
                Ok(FavorMoves::Set(mp)) => tracing::info!(
                    mount = %mp.display(),
                    "cgroup: set favordynmods (moving an agent into its groups no longer waits \
                     for an RCU grace period)"
                ),
                Ok(FavorMoves::AlreadySet(_)) => {}
                Ok(FavorMoves::NoV2) => tracing::info!(
                    "cgroup: no v2 hierarchy to set favordynmods on; each create's moves into \
                     its groups wait for RCU grace periods"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "cgroup: cannot set favordynmods; each create's moves into its groups wait \
                     for RCU grace periods (0.1 to 15 ms)"
                ),
            }
        }
        let idmap = idmap_userns(&cfg)?;
        let sysfs = match shared_sysfs(&images.root().join("mnt").join("sysfs")) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "no shared sysfs: every sandbox mounts its own (one more superblock each)");
                None
            }
        };
        // Before any agent starts: their mount namespaces are copies of the host's.
        let writable = match &cfg.writable {
            Some(w) => {
                let mut w = w.clone();
                if w.dir.as_os_str().is_empty() {
                    w.dir = images.root().join("mnt").join("writable");
                }
                match WritableStore::open(&w) {
                    Ok(s) => {
                        tracing::info!(how = s.describe(), "writable layers on disk");
                        Some(Arc::new(s))
                    }
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "writable layers on disk are not available: every container's \
                             writable layer lives in memory (disk_medium memory, disk_mb at \
                             most memory_mb)"
                        );
                        None
                    }
                }
            }
            None => None,
        };
        let ids = match cfg.id_pool {
            Some(p) => {
                ids::disjoint_from_owners(&p, cfg.owner_uid_base)?;
                Some(Arc::new(ids::IdPool::new(p)?))
            }
            None => None,
        };
        let spares = spares::Spares::new(cfg.clone(), cfg.agent_spares);
        Ok(ContainerRuntime {
            cfg,
            images,
            hierarchy,
            idmap,
            sysfs,
            spares,
            writable,
            ids,
        })
    }

    /// Pids of the agents parked for the next creates.
    pub fn parked_agents(&self) -> Vec<u32> {
        self.spares.pids()
    }

    /// What the host offers (for logs and /v1/health).
    pub fn describe(&self) -> String {
        self.hierarchy.describe()
    }

    /// The node's writable-layer file system, where it has one.
    pub fn writable(&self) -> Option<&Arc<WritableStore>> {
        self.writable.as_ref()
    }
}

/// `/dev/null`, read and write: what an agent helper gets on 0-2.
fn dev_null() -> Result<std::fs::File, RuntimeError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RuntimeError::io("open /dev/null", e))
}

/// Starts `warren-agent MODE` with `ctl` as its control socket and /dev/null on 0-2: nothing of
/// the daemon's terminal or logs leaks in; start-up failures come back over the socket.
fn spawn_agent(
    cfg: &ContainerConfig,
    mode: &str,
    ctl: &std::os::fd::OwnedFd,
) -> Result<u32, RuntimeError> {
    use std::os::fd::AsRawFd;
    let agent = cfg.agent_bin.display().to_string();
    let devnull = dev_null()?;
    let null = devnull.as_raw_fd();
    // argv[0] is the bare name: `/proc/1/cmdline` inside the sandbox shows it, and nothing
    // inside names a host path.
    let pid = warren_sys::process::spawn_with_fds(
        &agent,
        &["warren-agent".to_string(), mode.to_string()],
        &[],
        &[
            (null, 0),
            (null, 1),
            (null, 2),
            (ctl.as_raw_fd(), warren_proto::CONTROL_FD),
        ],
        warren_sys::process::HugePages::Allowed,
    )?;
    Ok(pid)
}

/// Makes a user namespace mapped like every sandbox's (root → `id_base`) with the agent's
/// `hold-userns` mode, and keeps a handle on it.
fn idmap_userns(cfg: &ContainerConfig) -> Result<std::os::fd::OwnedFd, RuntimeError> {
    use std::io::Read;
    let (ours, theirs) = warren_sys::fd::socketpair()?;
    let pid = spawn_agent(cfg, "hold-userns", &theirs)?;
    drop(theirs);
    let mut s = std::os::unix::net::UnixStream::from(ours);
    let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let mut buf = [0u8; 256];
    let n = s
        .read(&mut buf)
        .map_err(|e| RuntimeError::io("user namespace helper", e))?;
    if n == 0 || buf[0] != b'u' {
        return Err(StartCause::Helper {
            what: "cannot create a user namespace".into(),
            detail: String::from_utf8_lossy(&buf[..n])
                .trim_start_matches('!')
                .to_string(),
        }
        .into());
    }
    let range = warren_sys::ns::IdRange {
        inside: 0,
        outside: cfg.id_base,
        count: 65536,
    };
    warren_sys::ns::write_id_maps(pid, range, range)?;
    let fd = warren_sys::ns::open_ns(pid, "user")?;
    // Hanging up lets the helper exit; the fd keeps the namespace alive.
    drop(s);
    Ok(fd)
}

/// Mounts (once per image store, kept like the shared layer mounts beside it) a read-only
/// sysfs of a network namespace of its own (only `lo` in it) at `at`, which every sandbox binds at
/// `/sys` instead of mounting a sysfs of its own: each superblock costs a shrinker in every
/// memory cgroup of the host (docs/density.md). sysfs shows the host's devices whatever the
/// namespace; only `/sys/class/net` differs, and this one lists just that namespace's `lo`.
///
/// The namespace work runs on a short-lived thread of its own (namespaces are per thread),
/// never on an async worker: `unshare(CLONE_NEWNET)` there, the mount, and the thread ends;
/// the mount keeps the namespace alive.
fn shared_sysfs(at: &std::path::Path) -> Result<PathBuf, RuntimeError> {
    use warren_sys::mount::{holds_fs, SYSFS_MAGIC};
    let is_sysfs = |p: &std::path::Path| holds_fs(p, SYSFS_MAGIC);
    if is_sysfs(at) {
        return Ok(at.to_path_buf());
    }
    std::fs::create_dir_all(at)
        .map_err(|e| RuntimeError::io("create the shared sysfs directory", e))?;
    // sysfs holds only a passive reference on its namespace: the namespace is pinned by a
    // bind mount of its handle beside it (as `ip netns add` does), so its `lo` stays listed.
    let pin = at.with_extension("netns");
    std::fs::write(&pin, b"")
        .map_err(|e| RuntimeError::io("create the shared sysfs netns pin", e))?;
    let target = at.to_path_buf();
    std::thread::Builder::new()
        .name("shared-sysfs".into())
        .spawn(move || -> Result<(), warren_sys::SysError> {
            warren_sys::ns::unshare(warren_sys::ns::Namespaces::CLONE_NEWNET)?;
            warren_sys::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &pin,
                None,
                warren_sys::mount::Flags::MS_BIND,
                None,
            )?;
            let f = warren_sys::mount::Flags::MS_RDONLY
                | warren_sys::mount::Flags::MS_NOSUID
                | warren_sys::mount::Flags::MS_NODEV
                | warren_sys::mount::Flags::MS_NOEXEC;
            warren_sys::mount::mount(Some("sysfs"), &target, Some("sysfs"), f, None)
        })
        .map_err(|e| RuntimeError::io("start the shared sysfs thread", e))?
        .join()
        .map_err(|_| StartCause::Helper {
            what: "the shared sysfs thread".into(),
            detail: "panicked".into(),
        })??;
    if !is_sysfs(at) {
        return Err(StartCause::Mount {
            what: format!("{} is not a sysfs after mounting one", at.display()),
        }
        .into());
    }
    Ok(at.to_path_buf())
}

/// Mounts a running container sandbox's own devpts (its first terminal; see
/// [`warren_proto::ContainerInit::devpts`]) with the agent's `devpts` mode, a short-lived
/// single-threaded helper that enters the sandbox's user and mount namespaces from outside
/// its pid namespace.
async fn mount_devpts(agent_bin: &std::path::Path, agent_pid: u32) -> Result<(), RuntimeError> {
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncReadExt;
    let user = warren_sys::ns::open_ns(agent_pid, "user")?;
    let mnt = warren_sys::ns::open_ns(agent_pid, "mnt")?;
    let (ours, theirs) = warren_sys::fd::socketpair()?;
    let devnull = dev_null()?;
    let null = devnull.as_raw_fd();
    let agent = agent_bin.display().to_string();
    let (_pid, exited) = crate::reaper::spawn_wait(
        &agent,
        &["warren-agent".to_string(), "devpts".to_string()],
        &[],
        &[
            (null, 0),
            (null, 1),
            (null, 2),
            (theirs.as_raw_fd(), warren_proto::CONTROL_FD),
            (user.as_raw_fd(), warren_proto::CONTROL_FD + 1),
            (mnt.as_raw_fd(), warren_proto::CONTROL_FD + 2),
        ],
    )?;
    drop((theirs, user, mnt));
    let s = std::os::unix::net::UnixStream::from(ours);
    s.set_nonblocking(true)
        .map_err(|e| RuntimeError::io("devpts helper socket", e))?;
    let mut s = tokio::net::UnixStream::from_std(s)
        .map_err(|e| RuntimeError::io("devpts helper socket", e))?;
    let mut reply = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        s.read_to_end(&mut reply),
    )
    .await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), exited).await;
    match read {
        Ok(Ok(_)) if reply.first() == Some(&b'o') => Ok(()),
        Ok(Ok(_)) => Err(StartCause::Mount {
            what: format!(
                "cannot mount the sandbox's devpts: {}",
                String::from_utf8_lossy(&reply).trim_start_matches('!')
            ),
        }
        .into()),
        Ok(Err(e)) => Err(RuntimeError::io("devpts helper", e)),
        Err(_) => Err(StartCause::Helper {
            what: "the devpts helper".into(),
            detail: "no answer in time".into(),
        }
        .into()),
    }
}

/// A live container sandbox.
pub struct Container {
    id: SandboxId,
    agent: AgentConn,
    cgroups: CgroupSet,
    record: ContainerRecord,
    paused: std::sync::atomic::AtomicBool,
    images: Arc<ImageStore>,
    /// Keeps the layers from eviction from the node's layer cache while the sandbox lives.
    _pins: warren_image::LayerPins,
    /// How long each phase of its start took (empty for an adopted sandbox).
    phases: Vec<(&'static str, std::time::Duration)>,
    /// Its devpts is mounted (at start, or by the first terminal); the lock keeps two first
    /// terminals from mounting two.
    devpts: tokio::sync::Mutex<bool>,
    agent_bin: PathBuf,
    /// The store holding its writable layer, where that is on disk.
    writable: Option<Arc<WritableStore>>,
    /// The pool its host id range (`record.id_base`) goes back to.
    ids: Option<Arc<ids::IdPool>>,
}

impl Container {
    /// The host directory holding the sandbox's writable layer on disk (see [`writable`] for
    /// its layout: the overlay's upper directory is `upper` in it); `None` for a writable
    /// layer in memory, which only the agent's handle reaches.
    pub fn writable_dir(&self) -> Option<&std::path::Path> {
        self.record.writable_dir.as_deref()
    }

    /// The host uid/gid of the sandbox's root (65,536 ids from there are its own).
    pub fn host_root_id(&self) -> u32 {
        self.record.id_base.unwrap_or(100_000)
    }
}

#[async_trait]
impl Instance for Container {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn record(&self) -> serde_json::Value {
        serde_json::to_value(&self.record).expect("record serializes")
    }

    fn agent(&self) -> &AgentConn {
        &self.agent
    }

    async fn destroy(&self) -> Result<(), RuntimeError> {
        destroy::kill_and_remove(&self.cgroups).await?;
        if let Some(w) = &self.writable {
            destroy::remove_writable(w, &self.id).await;
        }
        // Only now, with its processes dead and its layer gone, may another sandbox get it.
        if let (Some(p), Some(base)) = (&self.ids, self.record.id_base) {
            p.free(base);
        }
        crate::leases::release(&self.images, &self.id).await;
        Ok(())
    }

    async fn lost(&self) {
        self.agent.closed().await
    }

    fn usage(&self) -> Usage {
        let mut u = self.cgroups.usage();
        if let Some(w) = &self.writable {
            u.disk_bytes = w.used(self.id.as_str());
        }
        u
    }

    fn oom_kills(&self) -> Option<u64> {
        self.cgroups.oom_kills()
    }

    fn startup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        self.phases.clone()
    }

    async fn pause(&self) -> Result<crate::PauseStats, RuntimeError> {
        pause::pause(self).await
    }

    async fn resume(&self) -> Result<(), RuntimeError> {
        pause::resume(self).await
    }

    fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn netns_pid(&self) -> Option<u32> {
        Some(self.record.agent_pid)
    }

    async fn connect_port(&self, port: u16) -> Result<crate::PortStream, RuntimeError> {
        ports::connect(self, port).await
    }

    async fn prepare_terminal(&self) -> Result<(), RuntimeError> {
        let mut ready = self.devpts.lock().await;
        if !*ready {
            // A recycled pid is never taken for the agent.
            if crate::procfs::start_time(self.record.agent_pid)
                != Some(self.record.agent_start_time)
            {
                return Err(StartCause::AgentGone.into());
            }
            mount_devpts(&self.agent_bin, self.record.agent_pid).await?;
            *ready = true;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl ContainerRuntime {
    /// The same rule as for VMs: a sandbox whose memory (plus its agent's) exceeds the
    /// host's is refused, unless the node overcommits on purpose
    /// ([`ContainerConfig::memory_overcommit`]).
    fn admit_memory(&self, limits: &warren_types::Limits) -> Result<(), warren_types::ApiError> {
        if self.cfg.memory_overcommit {
            return Ok(());
        }
        let host_mb = crate::vm::host_memory_mb();
        let need = limits.memory_mb.saturating_add(create::AGENT_MEMORY_MB);
        if host_mb > 0 && need > host_mb {
            return Err(warren_types::ApiError::invalid(format!(
                "memory_mb {} cannot fit this host: it has {host_mb} MiB and a container \
                 needs its memory plus {} MiB for its agent (at most {} here; the node \
                 admits more only with --memory-overcommit)",
                limits.memory_mb,
                create::AGENT_MEMORY_MB,
                host_mb.saturating_sub(create::AGENT_MEMORY_MB)
            )));
        }
        Ok(())
    }
}

#[async_trait]
impl Runtime for ContainerRuntime {
    fn substrate(&self) -> Substrate {
        Substrate::Container
    }

    fn admit(&self, limits: &warren_types::Limits) -> Result<(), warren_types::ApiError> {
        self.admit_memory(limits)?;
        if limits.disk_medium != warren_types::DiskMedium::Disk {
            return Ok(());
        }
        let Some(w) = &self.writable else {
            return Err(warren_types::ApiError::invalid(
                "this node keeps writable layers in memory only (its log says why): ask for \
                 disk_medium memory",
            ));
        };
        w.fits(limits.disk_mb << 20).map_err(|why| {
            if why.never() {
                warren_types::ApiError::invalid(why.to_string())
            } else {
                let mut e =
                    warren_types::ApiError::new(warren_types::ErrorCode::Busy, why.to_string());
                e.retry_after = Some(5);
                e
            }
        })
    }

    fn writable_space(&self) -> Option<WritableSpace> {
        self.writable.as_ref().map(|w| w.space())
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Instance>, RuntimeError> {
        Ok(Arc::new(create::create(self, spec, None).await?))
    }

    async fn create_function(
        &self,
        spec: &SandboxSpec,
        function: &warren_proto::FunctionInit,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        Ok(Arc::new(
            create::create(self, spec, Some(function.clone())).await?,
        ))
    }

    async fn adopt(
        &self,
        spec: &SandboxSpec,
        record: &serde_json::Value,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        Ok(Arc::new(adopt::adopt(self, spec, record).await?))
    }

    async fn destroy_record(
        &self,
        id: &SandboxId,
        record: Option<&serde_json::Value>,
    ) -> Result<(), RuntimeError> {
        let set = self.hierarchy.set_for(id.as_str());
        destroy::kill_and_remove(&set).await?;
        if let Some(w) = &self.writable {
            destroy::remove_writable(w, id).await;
        }
        // A record whose sandbox was not adopted never took its range: nothing to free.
        let _ = record;
        crate::leases::release(&self.images, id).await;
        Ok(())
    }

    async fn reconcile(&self, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError> {
        let known_ids = known;
        let mut removed = destroy::reconcile(&self.hierarchy, known).await?;
        // Leases of this node's sandboxes that no longer exist.
        let images = self.images.clone();
        let prefix = format!("{}-", self.cfg.node);
        let known: Vec<String> = known.iter().map(|k| k.to_string()).collect();
        let released = tokio::task::spawn_blocking(move || {
            let k: Vec<&str> = known.iter().map(String::as_str).collect();
            images.release_stale(&prefix, &k)
        })
        .await
        .map_err(|e| RuntimeError::io("release leases", std::io::Error::other(e.to_string())))??;
        removed.extend(released.0.into_iter().map(|h| format!("layer lease {h}")));
        if let Some(w) = self.writable.clone() {
            let prefix = format!("{}-", self.cfg.node);
            let known: Vec<String> = known_ids.iter().map(|k| k.to_string()).collect();
            let gone = tokio::task::spawn_blocking(move || {
                let k: Vec<&str> = known.iter().map(String::as_str).collect();
                w.reconcile(&prefix, &k)
            })
            .await
            .unwrap_or_default();
            removed.extend(gone);
        }
        Ok(removed)
    }

    /// Removes the node's (empty) parent cgroups; groups of live sandboxes stay.
    fn shutdown(&self) {
        self.spares.close();
        self.hierarchy.remove_parents_if_empty();
    }

    fn node_usage(&self) -> Option<Usage> {
        Some(self.hierarchy.total_usage())
    }

    async fn fork(
        &self,
        parent: &Arc<dyn Instance>,
        children: &[SandboxSpec],
    ) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
        let Some(p) = parent.as_any().downcast_ref::<Container>() else {
            return Err(Unsupported::ForeignInstance {
                what: "a container can only fork from a container",
            }
            .into());
        };
        fork::fork(self, p, children).await
    }

    async fn save_snapshot(
        &self,
        instance: &Arc<dyn Instance>,
        dir: &std::path::Path,
        holder: &str,
    ) -> Result<crate::SavedSnapshot, RuntimeError> {
        let Some(c) = instance.as_any().downcast_ref::<Container>() else {
            return Err(Unsupported::ForeignInstance {
                what: "a container runtime snapshots containers only",
            }
            .into());
        };
        snapshot::save(self, c, dir, holder).await
    }

    async fn capture_layer(
        &self,
        instance: &Arc<dyn Instance>,
        exclude: &[String],
        source: &str,
    ) -> Result<(String, warren_image::Lease), RuntimeError> {
        let Some(c) = instance.as_any().downcast_ref::<Container>() else {
            return Err(Unsupported::ForeignInstance {
                what: "a container runtime captures containers only",
            }
            .into());
        };
        let was_paused = c.is_paused();
        if !was_paused {
            c.cgroups.freeze(true).await?;
        }
        let packed = fork::pack(self, c, exclude, source).await;
        if !was_paused {
            c.cgroups.freeze(false).await?;
        }
        packed
    }

    async fn restore_snapshot(
        &self,
        _dir: &std::path::Path,
        record: &serde_json::Value,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        snapshot::restore(self, record, spec).await
    }

    async fn remove_snapshot(&self, dir: &std::path::Path, holder: &str) {
        crate::leases::remove_snapshot(&self.images, dir, holder).await;
    }
}
