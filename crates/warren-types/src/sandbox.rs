//! Sandbox create requests, limits, states and the sandbox record returned by the API.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::error::ApiError;
use crate::network::NetworkPolicy;
use crate::validate;

/// The isolation substrate. One parameter picks it; every other call is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Substrate {
    /// Pre-warmed pool for short stateless calls.
    Function,
    /// Namespaces + cgroups + overlay on read-only EROFS layers.
    #[default]
    Container,
    /// QEMU microvm with the guest agent.
    Microvm,
    /// Full QEMU VM with the guest agent.
    Vm,
}

impl Substrate {
    pub fn as_str(self) -> &'static str {
        match self {
            Substrate::Function => "function",
            Substrate::Container => "container",
            Substrate::Microvm => "microvm",
            Substrate::Vm => "vm",
        }
    }
}

/// An image: a single name (`"default"`, `"debian-py:3"`) or an ordered stack of layer refs,
/// lowest first (`["debian-py:3", "task-1234:1", "harness:7"]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ImageRef {
    Name(String),
    Stack(Vec<String>),
}

impl Default for ImageRef {
    fn default() -> Self {
        ImageRef::Name("default".to_string())
    }
}

impl ImageRef {
    /// The refs, lowest layer first.
    pub fn refs(&self) -> Vec<String> {
        match self {
            ImageRef::Name(n) => vec![n.clone()],
            ImageRef::Stack(v) => v.clone(),
        }
    }
}

/// Resource limits of one sandbox. Every field has a node default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// CPU cores (fractional allowed), enforced as a CFS quota.
    pub cpus: f64,
    /// Memory limit in MiB (processes, and the writable layer where it lives in memory).
    pub memory_mb: u64,
    /// Size limit of the writable layer in MiB.
    pub disk_mb: u64,
    /// Where a container's writable layer lives. Records written before it existed had their
    /// layers in memory.
    #[serde(default = "DiskMedium::legacy")]
    pub disk_medium: DiskMedium,
    /// Maximum number of processes/threads.
    pub pids: u64,
    /// CPU class: `best_effort` sandboxes yield the CPU to every `normal` one.
    #[serde(default)]
    pub cpu_class: CpuClass,
    /// Trajectory budget in MiB: once the sandbox's log holds this much, captured output of
    /// later calls is kept as its sha256 and size only (the entry says so).
    #[serde(default = "default_trajectory_mb")]
    pub trajectory_mb: u64,
}

/// The node default of [`Limits::trajectory_mb`].
pub const DEFAULT_TRAJECTORY_MB: u64 = 32;

fn default_trajectory_mb() -> u64 {
    DEFAULT_TRAJECTORY_MB
}

impl Substrate {
    /// True when the writable layer lives in memory (a tmpfs charged to the memory limit)
    /// with `medium` asked for, so it can never hold more than `memory_mb`: a function
    /// container's call environments always, a container with the memory medium.
    pub fn layer_in_memory(self, medium: DiskMedium) -> bool {
        match self {
            Substrate::Function => true,
            Substrate::Container => medium == DiskMedium::Memory,
            _ => false,
        }
    }
}

/// Where a container sandbox's writable layer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DiskMedium {
    /// Node-local disk, held to `disk_mb` by a quota of its own; independent of `memory_mb`.
    #[default]
    Disk,
    /// A tmpfs charged to the sandbox's memory (`disk_mb` at most `memory_mb`).
    Memory,
}

impl DiskMedium {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskMedium::Disk => "disk",
            DiskMedium::Memory => "memory",
        }
    }

    /// What a record without the field meant.
    pub fn legacy() -> DiskMedium {
        DiskMedium::Memory
    }
}

impl std::fmt::Display for DiskMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a sandbox competes for CPU with its neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CpuClass {
    /// Ordinary share of the CPU.
    #[default]
    Normal,
    /// Lowest cgroup CPU weight and `SCHED_IDLE` for its processes: it runs on what latency-
    /// sensitive neighbours leave, so a busy one cannot starve them.
    BestEffort,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpus: 1.0,
            memory_mb: 512,
            disk_mb: 512,
            disk_medium: DiskMedium::Disk,
            pids: 512,
            cpu_class: CpuClass::Normal,
            trajectory_mb: DEFAULT_TRAJECTORY_MB,
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    #[serde(default)]
    pub substrate: Substrate,
    #[serde(default)]
    pub image: ImageRef,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub disk_mb: Option<u64>,
    /// Containers: `disk` (node-local disk with a quota; the node's default where it has one)
    /// or `memory` (a tmpfs charged to `memory_mb`). Not sent when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_medium: Option<DiskMedium>,
    #[serde(default)]
    pub pids: Option<u64>,
    /// `normal` (default) or `best_effort`.
    #[serde(default)]
    pub cpu_class: Option<CpuClass>,
    /// Trajectory budget in MiB (node default 32): output of calls beyond it is logged as
    /// sha256 and size only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trajectory_mb: Option<u64>,
    /// Environment for every command (merged under each exec's own env).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Default working directory of commands (absolute, inside the sandbox).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Default user of commands: a name from the image's /etc/passwd or `uid[:gid]`.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub network: NetworkPolicy,
    /// Hard lifetime in seconds; the sandbox is deleted when it expires.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// Seconds without any call after which the sandbox is stopped.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// A repeated create with the same key returns the first sandbox instead of a new one.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    /// Mount the sandbox's own `/dev/pts` at start, for programs inside that open terminals
    /// themselves (`script`, `expect`, `os.openpty`). Without it `/dev/pts` is mounted by the
    /// first terminal call: each mount is a kernel superblock, which costs memory in every
    /// memory cgroup of the host (docs/density.md). Containers only; VMs always have one.
    /// Not sent when false, so a request reads on nodes that predate it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
    /// Start from this snapshot (`POST /v1/sandboxes/{id}/snapshot`) instead of the image:
    /// the substrate, image and limits are the snapshot's (limits given here must equal
    /// them), env, workdir, user and labels default to the snapshot's, and the network to its
    /// policy unless another one than `none` is given. Not sent when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
}

/// Bounds a node applies to requests; the node's config may lower them.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitBounds {
    pub max_cpus: f64,
    pub max_memory_mb: u64,
    pub max_disk_mb: u64,
    pub max_pids: u64,
    pub max_ttl_secs: u64,
    pub max_trajectory_mb: u64,
}

impl Default for LimitBounds {
    fn default() -> Self {
        LimitBounds {
            max_cpus: 64.0,
            max_memory_mb: 256 * 1024,
            max_disk_mb: 1024 * 1024,
            max_pids: 65536,
            max_ttl_secs: 30 * 24 * 3600,
            max_trajectory_mb: 1024,
        }
    }
}

impl CreateSandboxRequest {
    /// Checks every field and resolves limits against `defaults` and `bounds`.
    pub fn validate(&self, defaults: &Limits, bounds: &LimitBounds) -> Result<Limits, ApiError> {
        let refs = self.image.refs();
        if refs.is_empty() || refs.len() > 32 {
            return Err(ApiError::invalid("image must name 1 to 32 layers"));
        }
        for r in &refs {
            validate::image_ref(r)?;
        }
        let cpus = self.cpus.unwrap_or(defaults.cpus);
        if !cpus.is_finite() || cpus < 0.01 || cpus > bounds.max_cpus {
            return Err(ApiError::invalid(format!(
                "cpus must be between 0.01 and {}, got {cpus}",
                bounds.max_cpus
            )));
        }
        let memory_mb = self.memory_mb.unwrap_or(defaults.memory_mb);
        if !(16..=bounds.max_memory_mb).contains(&memory_mb) {
            return Err(ApiError::invalid(format!(
                "memory_mb must be between 16 and {}, got {memory_mb}",
                bounds.max_memory_mb
            )));
        }
        let disk_medium = match self.substrate {
            Substrate::Container => self.disk_medium.unwrap_or(defaults.disk_medium),
            Substrate::Function => DiskMedium::Memory,
            _ => DiskMedium::Disk,
        };
        if self.disk_medium.is_some_and(|m| m != disk_medium) {
            return Err(ApiError::invalid(format!(
                "disk_medium applies to containers only: a {} sandbox's writable layer is on {}",
                self.substrate.as_str(),
                disk_medium.as_str()
            )));
        }
        let in_memory = self.substrate.layer_in_memory(disk_medium);
        // A writable layer in memory cannot hold more than the memory limit: the default
        // shrinks to it, an explicit larger one is refused (it could only end in the OOM
        // killer instead of ENOSPC).
        let disk_mb = match self.disk_mb {
            Some(d) => d,
            None if in_memory => defaults.disk_mb.min(memory_mb),
            None => defaults.disk_mb,
        };
        if !(1..=bounds.max_disk_mb).contains(&disk_mb) {
            return Err(ApiError::invalid(format!(
                "disk_mb must be between 1 and {}, got {disk_mb}",
                bounds.max_disk_mb
            )));
        }
        if in_memory && disk_mb > memory_mb {
            return Err(ApiError::invalid(format!(
                "disk_mb ({disk_mb}) must be at most memory_mb ({memory_mb}): the writable \
                 layer of a {} sandbox with disk_medium memory lives in memory",
                self.substrate.as_str()
            )));
        }
        let trajectory_mb = self.trajectory_mb.unwrap_or(defaults.trajectory_mb);
        if !(1..=bounds.max_trajectory_mb).contains(&trajectory_mb) {
            return Err(ApiError::invalid(format!(
                "trajectory_mb must be between 1 and {}, got {trajectory_mb}",
                bounds.max_trajectory_mb
            )));
        }
        let pids = self.pids.unwrap_or(defaults.pids);
        if !(8..=bounds.max_pids).contains(&pids) {
            return Err(ApiError::invalid(format!(
                "pids must be between 8 and {}, got {pids}",
                bounds.max_pids
            )));
        }
        for (k, v) in &self.env {
            validate::env_pair(k, v)?;
        }
        // The sandbox's environment goes to every command: leave room for their own.
        validate::command_size(
            std::iter::empty(),
            &self.env,
            validate::MAX_SANDBOX_ENV_BYTES,
        )?;
        if let Some(w) = &self.workdir {
            validate::sandbox_path(w)?;
        }
        if let Some(u) = &self.user {
            validate::user(u)?;
        }
        self.network.validate()?;
        if let Some(h) = &self.hostname {
            validate::hostname(h)?;
        }
        for t in [self.ttl_secs, self.idle_timeout_secs]
            .into_iter()
            .flatten()
        {
            if t == 0 || t > bounds.max_ttl_secs {
                return Err(ApiError::invalid(format!(
                    "ttl_secs and idle_timeout_secs must be between 1 and {}",
                    bounds.max_ttl_secs
                )));
            }
        }
        validate::labels(&self.labels)?;
        if let Some(key) = &self.idempotency_key {
            if key.is_empty() || key.len() > 256 || key.contains('\0') {
                return Err(ApiError::invalid(
                    "idempotency_key must be 1-256 bytes without NUL",
                ));
            }
        }
        Ok(Limits {
            cpus,
            memory_mb,
            disk_mb,
            disk_medium,
            pids,
            cpu_class: self.cpu_class.unwrap_or(defaults.cpu_class),
            trajectory_mb,
        })
    }
}

/// Lifecycle states. Every transition is recorded by the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Running,
    Paused,
    Stopped,
    Failed,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopped => "stopped",
            SandboxState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            "stopped" => SandboxState::Stopped,
            "failed" => SandboxState::Failed,
            _ => return None,
        })
    }

    /// True once the sandbox can never run again.
    pub fn is_final(self) -> bool {
        matches!(self, SandboxState::Stopped | SandboxState::Failed)
    }
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    pub substrate: Substrate,
    pub state: SandboxState,
    /// The image refs as requested, lowest first.
    pub image: Vec<String>,
    pub limits: Limits,
    pub labels: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub network: NetworkPolicy,
    /// Unix time in milliseconds.
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub idle_timeout_secs: Option<u64>,
    pub last_activity_ms: u64,
    /// Why the sandbox stopped or failed, when it did.
    pub reason: Option<String>,
    pub idempotency_key: Option<String>,
    /// The tenant that owns the sandbox (absent when the node runs without `--auth`, or for
    /// sandboxes of the node's own administrator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The sandbox's own `/dev/pts` was mounted at start (see [`CreateSandboxRequest::pty`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
}

/// `POST /v1/sandboxes/{id}/pause`: what pausing achieved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PauseStats {
    /// Resident memory of the sandbox before and after the pause, in bytes.
    pub memory_before_bytes: u64,
    pub memory_after_bytes: u64,
    pub duration_ms: f64,
    /// Why memory could not all be pushed out of RAM, when it could not.
    pub note: Option<String>,
}

/// Most children one fork call makes.
pub const MAX_FORK: u32 = 64;

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many children, 1 to [`MAX_FORK`].
    pub n: u32,
    /// Labels of the children, merged over the parent's.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl ForkRequest {
    pub fn validate(&self) -> Result<(), ApiError> {
        if !(1..=MAX_FORK).contains(&self.n) {
            return Err(ApiError::invalid(format!(
                "n must be between 1 and {MAX_FORK}, got {}",
                self.n
            )));
        }
        validate::labels(&self.labels)
    }
}

/// The answer to a fork: the new sandboxes, running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkResult {
    pub sandboxes: Vec<SandboxInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(json: &str) -> Result<Limits, String> {
        let req: CreateSandboxRequest = serde_json::from_str(json).map_err(|e| e.to_string())?;
        req.validate(&Limits::default(), &LimitBounds::default())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn disk_medium_sets_whether_disk_is_bounded_by_memory() {
        // On disk (the default) the layer is independent of the memory.
        let l = v(r#"{"memory_mb":128,"disk_mb":4096}"#).unwrap();
        assert_eq!((l.disk_mb, l.disk_medium), (4096, DiskMedium::Disk));
        // In memory it is not, and its default shrinks to the memory.
        let e = v(r#"{"memory_mb":128,"disk_mb":4096,"disk_medium":"memory"}"#).unwrap_err();
        assert!(e.contains("at most memory_mb"), "{e}");
        let l = v(r#"{"memory_mb":128,"disk_medium":"memory"}"#).unwrap();
        assert_eq!((l.disk_mb, l.disk_medium), (128, DiskMedium::Memory));
        // A function's calls are always in memory; a VM's disk is a disk.
        let l = v(r#"{"substrate":"function","memory_mb":128}"#).unwrap();
        assert_eq!(l.disk_medium, DiskMedium::Memory);
        assert!(v(r#"{"substrate":"microvm","memory_mb":256,"disk_medium":"memory"}"#).is_err());
        assert!(v(r#"{"disk_medium":"floppy"}"#).is_err());
        // Records from before the field had their layers in memory.
        let old: Limits =
            serde_json::from_str(r#"{"cpus":1.0,"memory_mb":512,"disk_mb":512,"pids":512}"#)
                .unwrap();
        assert_eq!(old.disk_medium, DiskMedium::Memory);
    }

    #[test]
    fn pty_is_sent_only_when_asked_for() {
        // Nodes that predate `pty` refuse unknown fields: a plain request must not carry it.
        let plain = serde_json::to_value(CreateSandboxRequest::default()).unwrap();
        assert!(plain.get("pty").is_none(), "{plain}");
        let asked = CreateSandboxRequest {
            pty: true,
            ..Default::default()
        };
        let v = serde_json::to_value(&asked).unwrap();
        assert_eq!(v["pty"], serde_json::json!(true));
        let back: CreateSandboxRequest = serde_json::from_value(v).unwrap();
        assert!(back.pty);
    }

    #[test]
    fn defaults_apply() {
        let l = v("{}").unwrap();
        assert_eq!(l, Limits::default());
        let l = v(r#"{"image":["a:1","b"],"cpus":0.5,"memory_mb":64}"#).unwrap();
        assert_eq!(l.cpus, 0.5);
        assert_eq!(l.memory_mb, 64);
        // On disk (the default) the writable layer keeps its size; in memory it follows a
        // smaller memory limit; a VM's disk does not.
        assert_eq!(l.disk_mb, 512);
        let l = v(r#"{"memory_mb":64,"disk_medium":"memory"}"#).unwrap();
        assert_eq!(l.disk_mb, 64);
        let l = v(r#"{"substrate":"microvm","memory_mb":256,"disk_mb":2048}"#).unwrap();
        assert_eq!(l.disk_mb, 2048);
        assert_eq!(l.trajectory_mb, DEFAULT_TRAJECTORY_MB);
        assert_eq!(v(r#"{"trajectory_mb":100}"#).unwrap().trajectory_mb, 100);
    }

    #[test]
    fn bad_requests_are_refused() {
        for bad in [
            r#"{"memory_mb":-1}"#,
            r#"{"cpus":-2}"#,
            r#"{"cpus":0}"#,
            r#"{"memory_mb":1}"#,
            r#"{"bogus":1}"#,
            r#"{"image":[]}"#,
            r#"{"image":"../x"}"#,
            r#"{"workdir":"relative"}"#,
            r#"{"env":{"A=B":"c"}}"#,
            r#"{"ttl_secs":0}"#,
            r#"{"substrate":"lambda"}"#,
            r#"{"labels":{"":"x"}}"#,
            r#"{"memory_mb":64,"disk_mb":1024,"disk_medium":"memory"}"#,
            r#"{"trajectory_mb":0}"#,
            r#"{"trajectory_mb":100000}"#,
        ] {
            assert!(v(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn fork_requests_are_bounded() {
        let ok: ForkRequest = serde_json::from_str(r#"{"n":3,"labels":{"a":"b"}}"#).unwrap();
        ok.validate().unwrap();
        for bad in [r#"{"n":0}"#, r#"{"n":65}"#, r#"{"n":1,"labels":{"":"x"}}"#] {
            let r: ForkRequest = serde_json::from_str(bad).unwrap();
            assert!(r.validate().is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<ForkRequest>(r#"{"n":1,"x":1}"#).is_err());
    }

    #[test]
    fn substrates_parse() {
        for s in ["function", "container", "microvm", "vm"] {
            let req: CreateSandboxRequest =
                serde_json::from_str(&format!(r#"{{"substrate":"{s}"}}"#)).unwrap();
            assert_eq!(req.substrate.as_str(), s);
        }
    }
}
