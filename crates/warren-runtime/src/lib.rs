//! Substrates behind one trait.
//!
//! A [`Runtime`] creates, re-adopts and destroys sandboxes of one substrate (container,
//! microvm, vm, function). Every sandbox it makes is an [`Instance`] whose in-sandbox agent is
//! reached through an [`AgentConn`] — the same protocol for every substrate, so exec, files
//! and terminals are written once, above this crate. Runtimes never depend on each other and
//! never see HTTP.

pub mod agent;
pub mod cgroup;
pub mod container;
pub mod error;
mod leases;
mod pageout;
pub mod ports;
pub mod procfs;
pub mod program;
pub mod reaper;
pub mod security;
pub mod vm;

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use warren_types::{Limits, SandboxId, Substrate};

pub use agent::{
    AgentConn, CollectedFile, ExecOutput, ExecStream, ExitInfo, FileReader, FileWriter,
    InvokeOutput, PtySession, StdinSink, StreamItem,
};
pub use error::{
    AdoptError, ConfigError, DiskRefusal, Operation, ProtocolError, QmpError, RuntimeError,
    SnapshotError, StartCause, Unsupported, VmHostMissing, VmmError,
};
pub use ports::PortStream;

/// Everything a runtime needs to build a sandbox (already validated by the API edge).
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: SandboxId,
    /// Image refs, lowest layer first.
    pub image: Vec<String>,
    pub limits: Limits,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    /// Mount the sandbox's own devpts at start (programs inside open terminals themselves);
    /// otherwise it comes with the first terminal call ([`Instance::prepare_terminal`]).
    pub devpts: bool,
    /// The sandbox starts with a network link (a policy other than `none`): it mounts a sysfs
    /// of its own network namespace, so `/sys/class/net` lists its link; the others share the
    /// node's one sysfs (docs/density.md).
    pub network: bool,
    /// `/etc/resolv.conf` written as a container starts (its link's resolver, reserved before
    /// the start); `None`: the default one (no network). VMs ignore it.
    pub resolv_conf: Option<String>,
    /// Called once with a pid in the sandbox's network namespace as soon as the namespace
    /// exists, while the sandbox goes on starting, so that its link can be made meanwhile.
    /// Container sandboxes call it; a runtime that never does leaves the link to after the
    /// start.
    pub on_netns: Option<NetnsHook>,
}

/// See [`SandboxSpec::on_netns`]. The pid may exit right after the call (a container's first
/// agent stage does once it has forked): a hook that needs the namespace opens it during the
/// call (`/proc/<pid>/ns/net`).
#[derive(Clone)]
pub struct NetnsHook(Arc<dyn Fn(u32) + Send + Sync>);

impl NetnsHook {
    pub fn new(f: impl Fn(u32) + Send + Sync + 'static) -> NetnsHook {
        NetnsHook(Arc::new(f))
    }

    /// Hands over `pid`, a process in the sandbox's network namespace.
    pub fn call(&self, pid: u32) {
        (self.0)(pid)
    }
}

impl std::fmt::Debug for NetnsHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NetnsHook")
    }
}

/// One substrate.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    fn substrate(&self) -> Substrate;

    /// Refuses, before anything starts, limits this substrate can never run on this host
    /// (e.g. a VM with more memory than the machine; `invalid_request`) or cannot hold now
    /// (the node's writable-layer space is committed; `busy`). The message says what fits.
    fn admit(&self, limits: &Limits) -> Result<(), warren_types::ApiError> {
        let _ = limits;
        Ok(())
    }

    /// The node's writable-layer space on disk, where this runtime keeps writable layers
    /// there (containers).
    fn writable_space(&self) -> Option<container::WritableSpace> {
        None
    }

    /// True when network policies other than `none` apply to this substrate's sandboxes.
    fn network_policies(&self) -> bool {
        true
    }

    /// Creates and starts a sandbox. On error nothing of it is left on the host.
    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Instance>, RuntimeError>;

    /// Creates a function container: a sandbox whose agent serves only stateless calls
    /// ([`AgentConn::invoke`]), each in a fresh environment over the same image layers.
    async fn create_function(
        &self,
        spec: &SandboxSpec,
        function: &warren_proto::FunctionInit,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        let _ = (spec, function);
        Err(lacks(self.substrate(), Operation::Function))
    }

    /// Re-attaches to a sandbox made by an earlier daemon process, from what
    /// [`Instance::record`] returned then.
    async fn adopt(
        &self,
        spec: &SandboxSpec,
        record: &serde_json::Value,
    ) -> Result<Arc<dyn Instance>, RuntimeError>;

    /// Tears down whatever is left of a sandbox that cannot be adopted. Idempotent.
    async fn destroy_record(
        &self,
        id: &SandboxId,
        record: Option<&serde_json::Value>,
    ) -> Result<(), RuntimeError>;

    /// Removes host objects (cgroups, processes, ...) that belong to this runtime but to no
    /// sandbox in `known`. Returns a description of what was removed.
    async fn reconcile(&self, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError>;

    /// Called when the daemon stops: release node-wide host objects that no live sandbox
    /// needs (sandboxes themselves keep running).
    fn shutdown(&self) {}

    /// Resource use of every sandbox of this runtime together (the node's parent cgroups),
    /// where the runtime keeps them in cgroups. Runtimes of one node may share the parent:
    /// the figure is then the same from each of them.
    fn node_usage(&self) -> Option<Usage> {
        None
    }

    /// Creates `children.len()` new sandboxes from `parent`: the same image stack and a copy
    /// of its writable layer (containers copy no process state; VMs copy their memory and
    /// devices too). `parent` may be running or
    /// paused; it is left as it was. On error no child is left behind.
    async fn fork(
        &self,
        parent: &Arc<dyn Instance>,
        children: &[SandboxSpec],
    ) -> Result<Vec<Arc<dyn Instance>>, RuntimeError> {
        let _ = (parent, children);
        Err(lacks(self.substrate(), Operation::Fork))
    }

    /// Saves `instance` (running or paused; left as it was) as a snapshot in `dir`, which
    /// must not exist: the runtime makes it and owns what is in it until
    /// [`Runtime::remove_snapshot`]. The image layers the snapshot needs are leased to
    /// `holder`, so no collection removes them while it exists. On error nothing is left.
    async fn save_snapshot(
        &self,
        instance: &Arc<dyn Instance>,
        dir: &std::path::Path,
        holder: &str,
    ) -> Result<SavedSnapshot, RuntimeError> {
        let _ = (instance, dir, holder);
        Err(lacks(self.substrate(), Operation::Snapshot))
    }

    /// Packs what `instance`'s commands changed (its writable layer: new and changed files,
    /// deletions as whiteouts, opaque directories, owners as the sandbox sees them) into a
    /// layer of the image store, leaving out `exclude` (paths relative to its root). Returns
    /// the layer's digest and the temporary lease that holds it. The sandbox is left as it
    /// was. Used by image builds.
    async fn capture_layer(
        &self,
        instance: &Arc<dyn Instance>,
        exclude: &[String],
        source: &str,
    ) -> Result<(String, warren_image::Lease), RuntimeError> {
        let _ = (instance, exclude, source);
        Err(lacks(self.substrate(), Operation::Capture))
    }

    /// Creates a sandbox from a snapshot [`Runtime::save_snapshot`] made (`record` is its
    /// [`SavedSnapshot::record`]); the snapshot stays as it is. A spec the snapshot cannot
    /// take (another machine shape) is [`RuntimeError::Unsupported`], saying why.
    async fn restore_snapshot(
        &self,
        dir: &std::path::Path,
        record: &serde_json::Value,
        spec: &SandboxSpec,
    ) -> Result<Arc<dyn Instance>, RuntimeError> {
        let _ = (dir, record, spec);
        Err(lacks(self.substrate(), Operation::Restore))
    }

    /// Removes a snapshot: its directory and `holder`'s lease on its layers (layers nothing
    /// else holds are collected). Sandboxes made from it are not affected.
    async fn remove_snapshot(&self, dir: &std::path::Path, holder: &str) {
        let _ = holder;
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A sandbox saved as a snapshot by [`Runtime::save_snapshot`].
#[derive(Debug, Clone)]
pub struct SavedSnapshot {
    /// What [`Runtime::restore_snapshot`] needs beside the directory (kept by the caller).
    pub record: serde_json::Value,
    /// Bytes the snapshot keeps on disk (its directory and the layers only it holds).
    pub size_bytes: u64,
    /// It holds processes and memory, not only files.
    pub processes: bool,
}

/// What a pause achieved (the API's type: the runtime measures what the API reports).
pub use warren_types::PauseStats;

/// A live sandbox.
#[async_trait]
pub trait Instance: Send + Sync + 'static {
    fn id(&self) -> &SandboxId;

    /// What must be persisted to re-adopt this sandbox after a daemon restart.
    fn record(&self) -> serde_json::Value;

    /// The in-sandbox agent.
    fn agent(&self) -> &AgentConn;

    /// Kills everything in the sandbox and releases its host resources. Idempotent.
    async fn destroy(&self) -> Result<(), RuntimeError>;

    /// Resolves when the sandbox dies on its own (its agent exited or was killed).
    async fn lost(&self);

    /// Current resource use (best effort).
    fn usage(&self) -> Usage {
        Usage::default()
    }

    /// The OOM kills so far (the `oom_kills` of [`Instance::usage`]), read alone: it is read
    /// around every command.
    fn oom_kills(&self) -> Option<u64> {
        self.usage().oom_kills
    }

    /// How long the phases of this sandbox's start took (`image`, `cgroups`, `agent`), for
    /// runtimes that measure them; empty otherwise.
    fn startup_phases(&self) -> Vec<(&'static str, std::time::Duration)> {
        Vec::new()
    }

    /// Freezes every process of the sandbox and pushes its memory out of RAM as far as the
    /// host allows. Idempotent.
    async fn pause(&self) -> Result<PauseStats, RuntimeError> {
        Err(Unsupported::ThisSubstrate {
            op: Operation::Pause,
        }
        .into())
    }

    /// Thaws a paused sandbox. Idempotent.
    async fn resume(&self) -> Result<(), RuntimeError> {
        Err(Unsupported::ThisSubstrate {
            op: Operation::Resume,
        }
        .into())
    }

    /// True while frozen.
    fn is_paused(&self) -> bool {
        false
    }

    /// Makes the sandbox ready for a terminal (a container mounts its devpts the first time).
    async fn prepare_terminal(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// A host pid inside the sandbox's network namespace (where its link goes), for
    /// sandboxes that have one (containers; VMs created with a network policy: their VMM's).
    fn netns_pid(&self) -> Option<u32> {
        None
    }

    /// A connection to TCP port `port` of the sandbox's loopback (`127.0.0.1` as the
    /// sandbox sees it). Nothing listening there is [`RuntimeError::PortUnreachable`].
    async fn connect_port(&self, port: u16) -> Result<PortStream, RuntimeError> {
        let _ = port;
        Err(Unsupported::Ports.into())
    }

    /// A VM sandbox with a network interface: the VMM's tap inside [`Instance::netns_pid`]'s
    /// namespace, which the link is bridged to (the guest holds the sandbox's address).
    fn guest_tap(&self) -> Option<&str> {
        None
    }

    /// Gives the guest's interface the link's address (`None` takes it away) and writes its
    /// `/etc/resolv.conf`. Only sandboxes with a [`Instance::guest_tap`] need it: a
    /// container's link is configured from the host.
    async fn configure_guest_link(
        &self,
        link: Option<GuestLink>,
        resolv_conf: String,
    ) -> Result<(), RuntimeError> {
        let _ = (link, resolv_conf);
        Ok(())
    }

    /// Why the sandbox died on its own, when the runtime knows more than "its agent went
    /// away" (a VM: how its VMM ended and the VMM's last log lines).
    fn lost_reason(&self) -> Option<String> {
        None
    }

    /// For runtimes that need their own type back (fork).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The addresses of a sandbox's link, as its guest must take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestLink {
    pub address: std::net::Ipv4Addr,
    pub gateway: std::net::Ipv4Addr,
    pub prefix_len: u8,
}

/// Resource use of one sandbox.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Usage {
    pub memory_bytes: Option<u64>,
    pub cpu_usec: Option<u64>,
    pub pids: Option<u64>,
    /// Processes the OOM killer has killed in the sandbox so far.
    pub oom_kills: Option<u64>,
    /// Highest memory use the kernel saw (v1 `max_usage_in_bytes`, v2 `memory.peak`).
    pub memory_peak_bytes: Option<u64>,
    /// Memory held by tmpfs and shared memory (`shmem` of `memory.stat`): where the writable
    /// layer lives in memory, what its files take.
    pub shmem_bytes: Option<u64>,
    /// Bytes the writable layer holds where it lives on disk (its quota's count).
    pub disk_bytes: Option<u64>,
}

/// The refusal of a runtime whose substrate does not have `op`.
fn lacks(substrate: Substrate, op: Operation) -> RuntimeError {
    Unsupported::Operation { substrate, op }.into()
}
