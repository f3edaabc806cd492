//! The VM substrates (`microvm` and `vm`): one QEMU process per sandbox, driven over QMP.
//!
//! Who does what:
//! - the daemon (here) makes the sandbox's cgroups, its disk overlays and its directory
//!   (sockets, logs), starts QEMU inside those cgroups (so the VMM's own memory is charged to
//!   the sandbox), and talks to the guest's agent through a virtio-serial port whose host
//!   side is a unix socket of QEMU — the same protocol and [`AgentConn`] as containers;
//! - the guest (`warren-agent` as init, see the agent's `vm` module) loads its modules,
//!   mounts the image's EROFS layers from read-only disks under an overlay whose upper layer
//!   is the sandbox's own disk, and serves.
//!
//! Creation boots a VM only once per machine shape (image, substrate, memory, CPUs, disk):
//! that VM is snapshotted at "agent ready" into a template, and every sandbox after it is a
//! restore of the template with its own qcow2 overlay on the template's disk, its RAM a
//! copy-on-write mapping of the template's memory file (shared through the page cache).
//!
//! Files: `qemu.rs` (command line, spawn), `qmp.rs` (QMP client), `initramfs.rs`,
//! `disk.rs` (bases and overlays), `memory.rs` (RAM backends, PSS), `create.rs` (boot and
//! restore), `snapshot.rs` (snapshots and templates), `pause.rs`, `fork.rs`, `destroy.rs`,
//! `saved.rs` (snapshots kept by the API), `adopt.rs`, `record.rs`, `prune.rs` (old initramfs files and stale templates, at start).

mod adopt;
mod create;
mod destroy;
mod disk;
mod fork;
pub mod initramfs;
pub mod memory;
mod pause;
mod prune;
pub mod qemu;
pub mod qmp;
mod record;
mod saved;
mod snapshot;
mod tool;

use async_trait::async_trait;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use warren_image::ImageStore;
use warren_types::{NodeId, SandboxId, Substrate};

use crate::agent::AgentConn;
use crate::cgroup::{CgroupSet, Hierarchy};
use crate::{
    Instance, PauseStats, Runtime, RuntimeError, SandboxSpec, Unsupported, Usage, VmHostMissing,
};

pub use record::{MachineKey, Snapshot, SnapshotMeta, VmRecord, SNAPSHOT_FORMAT};

/// Memory the VMM needs on top of the guest's RAM (device model, TCG translation cache),
/// added to the sandbox's cgroup limit.
pub const VMM_OVERHEAD_MB: u64 = 192;

/// How guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization (`/dev/kvm` that really boots a guest).
    Kvm,
    /// QEMU's software emulation: works everywhere, 10-100× slower.
    Tcg,
}

impl Accel {
    pub fn as_str(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Configuration of the VM substrates.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub node: NodeId,
    /// The `warren-agent` executable (the guest's init).
    pub agent_bin: PathBuf,
    /// Guest kernel and modules (`scripts/build-guest.sh`).
    pub kernel_dir: PathBuf,
    /// Working directory: sandboxes, templates, base disks, initramfs.
    pub root: PathBuf,
    pub qemu: PathBuf,
    pub qemu_img: PathBuf,
    /// Forced acceleration; `None` probes KVM by booting a guest and falls back to TCG.
    pub accel: Option<Accel>,
    /// Create sandboxes by restoring a template snapshot (booting once per machine shape).
    pub templates: bool,
}

impl VmConfig {
    pub fn new(node: NodeId, agent_bin: PathBuf, root: PathBuf) -> Self {
        VmConfig {
            node,
            agent_bin,
            kernel_dir: PathBuf::from("/var/cache/warren/guest/current"),
            root,
            qemu: PathBuf::from("/usr/bin/qemu-system-x86_64"),
            qemu_img: PathBuf::from("/usr/bin/qemu-img"),
            accel: None,
            templates: true,
        }
    }

    /// Why this host cannot run VMs, if it cannot.
    pub fn unavailable(&self) -> Option<VmHostMissing> {
        if !self.qemu.is_file() {
            return Some(VmHostMissing::Qemu(self.qemu.clone()));
        }
        if !self.kernel_dir.join("vmlinuz").is_file() {
            return Some(VmHostMissing::Kernel(self.kernel_dir.clone()));
        }
        if !self.agent_bin.is_file() {
            return Some(VmHostMissing::Agent(self.agent_bin.clone()));
        }
        None
    }
}

/// One of the two VM runtimes (they share a configuration and directory layout).
pub struct VmRuntime {
    cfg: VmConfig,
    substrate: Substrate,
    images: Arc<ImageStore>,
    hierarchy: Hierarchy,
    /// Built on first use or by the start's pruning, and kept open for the daemon's life so
    /// another daemon's pruning leaves it alone.
    initramfs: tokio::sync::OnceCell<(PathBuf, std::fs::File)>,
    kernel: String,
    qemu_version: tokio::sync::OnceCell<String>,
    accel: tokio::sync::OnceCell<Accel>,
}

impl VmRuntime {
    pub fn new(
        cfg: VmConfig,
        substrate: Substrate,
        images: Arc<ImageStore>,
    ) -> Result<Self, RuntimeError> {
        if !matches!(substrate, Substrate::Microvm | Substrate::Vm) {
            return Err(Unsupported::NotVm(substrate).into());
        }
        if let Some(why) = cfg.unavailable() {
            return Err(Unsupported::VmHost(why).into());
        }
        let kernel = std::fs::read_to_string(cfg.kernel_dir.join("version"))
            .unwrap_or_else(|_| "unknown".into())
            .trim()
            .to_string();
        for d in ["templates", "base", "boot"] {
            let p = cfg.root.join(d);
            std::fs::create_dir_all(&p)
                .map_err(|e| RuntimeError::io(format!("create {}", p.display()), e))?;
        }
        fork::remove_stale(&cfg.root);
        let p = cfg.root.join("sandboxes").join(cfg.node.to_string());
        std::fs::create_dir_all(&p)
            .map_err(|e| RuntimeError::io(format!("create {}", p.display()), e))?;
        let hierarchy = Hierarchy::detect(&format!("warren-{}", cfg.node))?;
        let accel = tokio::sync::OnceCell::new();
        if let Some(a) = cfg.accel {
            let _ = accel.set(a);
        }
        Ok(VmRuntime {
            cfg,
            substrate,
            images,
            hierarchy,
            initramfs: tokio::sync::OnceCell::new(),
            kernel,
            qemu_version: tokio::sync::OnceCell::new(),
            accel,
        })
    }

    pub fn config(&self) -> &VmConfig {
        &self.cfg
    }

    /// What the host offers (for logs).
    pub fn describe(&self) -> String {
        format!(
            "{}; guest kernel {}; accel {}",
            self.qemu_version
                .get()
                .cloned()
                .unwrap_or_else(|| self.cfg.qemu.display().to_string()),
            self.kernel,
            self.accel
                .get()
                .map(|a| a.as_str())
                .unwrap_or("not probed yet")
        )
    }

    /// Sandboxes of this node (several daemons may share `root`: its bases and templates are
    /// caches for all, its sandboxes belong to one node each).
    fn sandboxes_dir(&self) -> PathBuf {
        self.cfg
            .root
            .join("sandboxes")
            .join(self.cfg.node.to_string())
    }

    fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.sandboxes_dir().join(id)
    }

    /// `qemu-system-x86_64 --version` (asked once).
    pub async fn qemu_version(&self) -> String {
        self.qemu_version
            .get_or_init(|| async {
                qemu::version(&self.cfg.qemu)
                    .await
                    .unwrap_or_else(|e| format!("unknown QEMU ({e})"))
            })
            .await
            .clone()
    }

    /// The guest's initramfs (built once per agent binary).
    pub async fn initramfs(&self) -> Result<PathBuf, RuntimeError> {
        self.initramfs
            .get_or_try_init(|| async {
                let (agent, kernel, boot) = (
                    self.cfg.agent_bin.clone(),
                    self.cfg.kernel_dir.clone(),
                    self.cfg.root.join("boot"),
                );
                let p = initramfs::build(&agent, &kernel, &boot).await?;
                let f = std::fs::File::open(&p)
                    .map_err(|e| RuntimeError::io(format!("open {}", p.display()), e))?;
                Ok::<_, RuntimeError>((p, f))
            })
            .await
            .map(|(p, _)| p.clone())
    }

    /// Removes initramfs files of other builds and templates whose inputs are gone (see
    /// `prune.rs`). Returns what was removed.
    async fn prune(&self) -> Vec<String> {
        let current = match self.initramfs().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot build the guest initramfs; nothing pruned");
                return Vec::new();
            }
        };
        let (root, kernel, qemu) = (
            self.cfg.root.clone(),
            self.kernel.clone(),
            self.qemu_version().await,
        );
        tokio::task::spawn_blocking(move || {
            let mut out: Vec<String> = prune::initramfs(&root.join("boot"), &current)
                .into_iter()
                .map(|p| format!("initramfs {}", p.display()))
                .collect();
            let cur = prune::Current {
                kernel: &kernel,
                qemu: &qemu,
            };
            out.extend(
                prune::templates(&root, &cur)
                    .into_iter()
                    .map(|(p, why)| format!("template {} ({why})", p.display())),
            );
            out
        })
        .await
        .unwrap_or_default()
    }

    /// The acceleration in use: KVM if a guest really boots with it, else TCG (probed once).
    pub async fn accel(&self) -> Accel {
        *self
            .accel
            .get_or_init(|| async { create::probe_accel(self).await })
            .await
    }

    async fn key(&self, spec: &SandboxSpec, layers: &[String]) -> Result<MachineKey, RuntimeError> {
        let initramfs = self.initramfs().await?;
        Ok(MachineKey {
            layout: record::MACHINE_LAYOUT,
            substrate: self.substrate.as_str().to_string(),
            layers: layers.to_vec(),
            memory_mb: spec.limits.memory_mb,
            cpus: vcpus(spec),
            disk_mb: spec.limits.disk_mb,
            accel: self.accel().await.as_str().to_string(),
            kernel: self.kernel.clone(),
            initramfs: initramfs
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            qemu: self.qemu_version().await,
            nic: spec.network,
        })
    }

    fn resolve(&self, spec: &SandboxSpec) -> Result<Vec<String>, RuntimeError> {
        self.images
            .resolve(&spec.image)
            .map_err(crate::leases::image_error)
    }

    /// Boots a sandbox without a template (the cold path; templates are made this way).
    pub async fn boot(&self, spec: &SandboxSpec) -> Result<Arc<Vm>, RuntimeError> {
        let layers = self.resolve(spec)?;
        Ok(Arc::new(
            create::boot(self, spec, &layers, None, false).await?,
        ))
    }

    /// Saves a running sandbox's memory, devices and writable disk into `dir` (which must
    /// not exist). The sandbox keeps running.
    pub async fn snapshot(&self, vm: &Vm, dir: &Path) -> Result<Snapshot, RuntimeError> {
        snapshot::save(self, vm, dir, true).await
    }

    /// Creates a sandbox from a snapshot (its own overlay on the snapshot's disk).
    pub async fn restore(
        &self,
        spec: &SandboxSpec,
        snap: &Snapshot,
    ) -> Result<Arc<Vm>, RuntimeError> {
        let layers = self.resolve(spec)?;
        Ok(Arc::new(
            create::restore(self, spec, &layers, snap, create::DiskFrom::Overlay).await?,
        ))
    }
}

/// vCPUs for a sandbox: its CPU limit rounded up.
/// The host's memory in MiB (`MemTotal`), 0 when unknown.
pub(crate) fn host_memory_mb() -> u64 {
    crate::procfs::MemInfo::read().map_or(0, |m| m.total_mb())
}

fn vcpus(spec: &SandboxSpec) -> u32 {
    (spec.limits.cpus.ceil() as u32).clamp(1, 64)
}

/// A live VM sandbox.
pub struct Vm {
    id: SandboxId,
    /// Holds the sandbox's lease on its layers (the VM's read-only disks).
    images: Arc<ImageStore>,
    agent: AgentConn,
    qmp: qmp::Qmp,
    cgroups: CgroupSet,
    record: VmRecord,
    key: MachineKey,
    /// Where its guest RAM lives (a template's VM writes it into a file).
    ram: memory::Ram,
    paused: AtomicBool,
    exited: tokio::sync::watch::Receiver<bool>,
    /// How QEMU ended, once it has.
    death: create::Death,
    /// How long each phase of its start took (empty for an adopted VM).
    phases: Vec<(&'static str, std::time::Duration)>,
}

impl Vm {
    /// Host pid of the VMM.
    pub fn qemu_pid(&self) -> u32 {
        self.record.qemu_pid
    }

    /// The sandbox's directory on the host.
    pub fn dir(&self) -> &Path {
        &self.record.dir
    }

    pub fn machine(&self) -> &MachineKey {
        &self.key
    }

    pub fn qmp(&self) -> &qmp::Qmp {
        &self.qmp
    }
}

#[async_trait]
impl Instance for Vm {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn record(&self) -> serde_json::Value {
        serde_json::json!({ "vm": self.record, "machine": self.key })
    }

    fn agent(&self) -> &AgentConn {
        &self.agent
    }

    async fn destroy(&self) -> Result<(), RuntimeError> {
        destroy::destroy(&self.cgroups, &self.record.dir).await?;
        crate::leases::release(&self.images, &self.id).await;
        Ok(())
    }

    async fn lost(&self) {
        let mut exited = self.exited.clone();
        tokio::select! {
            _ = self.agent.closed() => {}
            _ = exited.wait_for(|e| *e) => {}
        }
        // A dying QEMU closes the agent's socket first: give its exit watch a moment to say
        // how it ended (`lost_reason`).
        let _ =
            tokio::time::timeout(std::time::Duration::from_secs(3), exited.wait_for(|e| *e)).await;
    }

    fn startup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        self.phases.clone()
    }

    fn usage(&self) -> Usage {
        self.cgroups.usage()
    }

    fn oom_kills(&self) -> Option<u64> {
        self.cgroups.oom_kills()
    }

    /// Stops the vCPUs and pushes the VMM's memory out of RAM.
    async fn pause(&self) -> Result<PauseStats, RuntimeError> {
        pause::pause(self).await
    }

    async fn resume(&self) -> Result<(), RuntimeError> {
        pause::resume(self).await
    }

    fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    fn netns_pid(&self) -> Option<u32> {
        self.key.nic.then_some(self.record.qemu_pid)
    }

    fn guest_tap(&self) -> Option<&str> {
        self.key.nic.then_some(qemu::TAP_NAME)
    }

    /// Through the agent's connection: the guest's loopback is out of the host's reach
    /// (with or without a network interface).
    async fn connect_port(&self, port: u16) -> Result<crate::PortStream, RuntimeError> {
        let (from, sink) = self.agent().connect_port(port).await?;
        Ok(crate::ports::relayed(from, sink))
    }

    async fn configure_guest_link(
        &self,
        link: Option<crate::GuestLink>,
        resolv_conf: String,
    ) -> Result<(), RuntimeError> {
        let config = link.map(|l| warren_proto::GuestNet {
            mac: qemu::sandbox_mac(self.id.as_str()),
            address: l.address,
            prefix_len: l.prefix_len,
            gateway: l.gateway,
            mtu: 1500,
        });
        self.agent.guest_network(config, resolv_conf).await
    }

    fn lost_reason(&self) -> Option<String> {
        self.death.get().cloned()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[async_trait]
impl Runtime for VmRuntime {
    fn substrate(&self) -> Substrate {
        self.substrate
    }

    fn admit(&self, limits: &warren_types::Limits) -> Result<(), warren_types::ApiError> {
        let host_mb = host_memory_mb();
        if host_mb > 0 && limits.memory_mb + VMM_OVERHEAD_MB > host_mb {
            return Err(warren_types::ApiError::invalid(format!(
                "memory_mb {} cannot fit this host: it has {host_mb} MiB and a {} sandbox \
                 needs its memory plus {VMM_OVERHEAD_MB} MiB for the VMM (at most {} here)",
                limits.memory_mb,
                self.substrate.as_str(),
                host_mb.saturating_sub(VMM_OVERHEAD_MB)
            )));
        }
        Ok(())
    }

    /// A sandbox created with a policy gets a network interface (QEMU in a namespace of its
    /// own, bridged to the sandbox's link); one created with `none` has none at all.
    fn network_policies(&self) -> bool {
        true
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Instance>, RuntimeError> {
        // The layers are the VM's disks: leased before QEMU opens them, so no collection
        // deletes one while the sandbox lives.
        let layers = crate::leases::acquire(&self.images, &spec.id, &spec.image).await?;
        let vm = async {
            if !self.cfg.templates {
                return create::boot(self, spec, &layers, None, false).await;
            }
            let snap = snapshot::template(self, spec, &layers).await?;
            create::restore(self, spec, &layers, &snap, create::DiskFrom::Overlay).await
        }
        .await;
        match vm {
            Ok(vm) => Ok(Arc::new(vm)),
            Err(e) => {
                crate::leases::release(&self.images, &spec.id).await;
                Err(e)
            }
        }
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
        _record: Option<&serde_json::Value>,
    ) -> Result<(), RuntimeError> {
        let set = self.hierarchy.set_for(id.as_str());
        destroy::destroy(&set, &self.sandbox_dir(id.as_str())).await?;
        crate::leases::release(&self.images, id).await;
        Ok(())
    }

    async fn reconcile(&self, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError> {
        let mut removed = destroy::reconcile(self, known).await?;
        removed.extend(self.prune().await);
        Ok(removed)
    }

    /// Removes the node's (empty) parent cgroups and sandbox directory; live VMs keep both.
    fn shutdown(&self) {
        self.hierarchy.remove_parents_if_empty();
        let _ = std::fs::remove_dir(self.sandboxes_dir());
    }

    fn node_usage(&self) -> Option<Usage> {
        Some(self.hierarchy.total_usage())
    }

    async fn fork(
        &self,
        parent: &Arc<dyn Instance>,
        children: &[SandboxSpec],
    ) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
        let Some(p) = parent.as_any().downcast_ref::<Vm>() else {
            return Err(Unsupported::ForeignInstance {
                what: "a VM can only fork from a VM",
            }
            .into());
        };
        fork::fork(self, p, children).await
    }

    async fn save_snapshot(
        &self,
        instance: &Arc<dyn Instance>,
        dir: &Path,
        holder: &str,
    ) -> Result<crate::SavedSnapshot, RuntimeError> {
        let Some(vm) = instance.as_any().downcast_ref::<Vm>() else {
            return Err(Unsupported::ForeignInstance {
                what: "a VM runtime snapshots VMs only",
            }
            .into());
        };
        saved::save(self, vm, dir, holder).await
    }

    async fn restore_snapshot(
        &self,
        dir: &Path,
        record: &serde_json::Value,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        saved::restore(self, dir, record, spec).await
    }

    async fn remove_snapshot(&self, dir: &Path, holder: &str) {
        crate::leases::remove_snapshot(&self.images, dir, holder).await;
    }
}
