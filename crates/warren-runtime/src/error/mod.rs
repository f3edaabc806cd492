//! Runtime errors, each mapped to a stable API code. A start that fails says why with a
//! [`StartCause`], whose [`StartCause::kind`] is a stable name for logs and metrics (the API
//! answers every one of them as `start_failed`).

mod causes;

pub use causes::{
    AdoptError, ConfigError, Operation, ProtocolError, QmpError, SnapshotError, Unsupported,
    VmHostMissing, VmmError,
};
use std::path::PathBuf;
use warren_types::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("image {0:?} not found")]
    ImageNotFound(String),
    #[error("image: {0}")]
    Image(#[from] warren_image::ImageError),
    #[error("sandbox failed to start: {0}")]
    StartFailed(#[from] StartCause),
    #[error("the sandbox's agent is gone")]
    AgentLost,
    #[error("{message}")]
    Agent { code: ErrorCode, message: String },
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("host: {0}")]
    Sys(#[from] warren_sys::SysError),
    #[error("host i/o on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot adopt: {0}")]
    Adopt(#[from] AdoptError),
    #[error("{0}")]
    Unsupported(#[from] Unsupported),
    #[error("virtual machine monitor: {0}")]
    Vmm(#[from] VmmError),
    /// A TCP port inside the sandbox cannot be reached; the message says why (nothing
    /// listens, a timeout).
    #[error("{message}")]
    PortUnreachable { port: u16, message: String },
    /// The node's writable-layer space cannot hold the sandbox now.
    #[error("{0}")]
    NoDisk(DiskRefusal),
    /// Every host id range of the node's pool is held by a sandbox.
    #[error("all {ranges} host id ranges of this node are in use")]
    NoIds { ranges: u32 },
}

impl RuntimeError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        RuntimeError::Io {
            what: what.into(),
            source,
        }
    }

    /// The API code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            RuntimeError::ImageNotFound(_) => ErrorCode::NotFound,
            RuntimeError::Image(e) => e.code(),
            RuntimeError::StartFailed(_) => ErrorCode::StartFailed,
            RuntimeError::AgentLost => ErrorCode::SandboxLost,
            RuntimeError::Agent { code, .. } => *code,
            RuntimeError::Unsupported(_) => ErrorCode::UnsupportedSubstrate,
            RuntimeError::PortUnreachable { .. } => ErrorCode::PortUnreachable,
            RuntimeError::NoDisk(_) | RuntimeError::NoIds { .. } => ErrorCode::Busy,
            RuntimeError::Protocol(_)
            | RuntimeError::Sys(_)
            | RuntimeError::Io { .. }
            | RuntimeError::Adopt(_)
            | RuntimeError::Vmm(_) => ErrorCode::Internal,
        }
    }
}

/// Why a sandbox (or a runtime) could not start. The messages keep what the host said
/// (a helper's answer, QEMU's log tail) in their fields.
#[derive(Debug, thiserror::Error)]
pub enum StartCause {
    /// The node's configuration cannot work (an agent binary that is not there, an id pool
    /// that overlaps the owner uids, ...): the daemon refuses to start.
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// No cgroup hierarchy the runtime can use is mounted.
    #[error("no cgroup hierarchy is mounted")]
    NoCgroups,
    /// The cgroup mount's options could not be set.
    #[error("cgroup favordynmods: {0}")]
    CgroupOptions(#[source] warren_sys::SysError),
    /// The sandbox's agent did not answer a start-up step in time.
    #[error("agent did not answer ({step}) in time{log}")]
    AgentTimeout {
        step: String,
        /// The VMM's log tail, when there is one.
        log: String,
    },
    /// The start-up conversation with the agent broke off.
    #[error("agent start-up ({step}): {source}{log}")]
    AgentIo {
        step: String,
        #[source]
        source: warren_proto::FrameError,
        log: String,
    },
    /// The agent could not be reached at all.
    #[error("agent socket {}: {source}", path.display())]
    AgentSocket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The agent refused the start; `message` is the agent's own (a mount, the command,
    /// ...): the protocol carries no more than that text.
    #[error("{message}")]
    AgentRefused { message: String },
    /// The agent that a call needs is gone (its process was replaced).
    #[error("the sandbox's agent is gone")]
    AgentGone,
    /// A host helper (a thread, a process of ours, a blocking task) failed.
    #[error("{what}: {detail}")]
    Helper { what: String, detail: String },
    /// A host tool the runtime runs (btrfs, losetup, cp) failed.
    #[error("{what} failed ({status}): {stderr}")]
    Tool {
        what: String,
        status: String,
        stderr: String,
    },
    /// A host tool the runtime needs is missing or cannot run.
    #[error("{what}: {source} (the node needs {package} for {purpose})")]
    ToolMissing {
        what: String,
        package: &'static str,
        purpose: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A file system the runtime mounted is not what it expected afterwards.
    #[error("{what}")]
    Mount { what: String },
    /// The VMM exited or could not be driven while the sandbox started.
    #[error("during {step}: {detail}")]
    Vmm { step: String, detail: String },
    /// A snapshot cannot be restored here (another machine shape, an unreadable record, a
    /// failed migration).
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    /// Another error during the start, kept whole.
    #[error("{0}")]
    Step(#[source] Box<RuntimeError>),
}

impl StartCause {
    /// A stable name of the cause (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            StartCause::Config(_) => "config",
            StartCause::NoCgroups | StartCause::CgroupOptions(_) => "cgroups",
            StartCause::AgentTimeout { .. } => "agent_timeout",
            StartCause::AgentIo { .. } | StartCause::AgentSocket { .. } => "agent_io",
            StartCause::AgentRefused { .. } => "agent_refused",
            StartCause::AgentGone => "agent_gone",
            StartCause::Helper { .. } => "helper",
            StartCause::Tool { .. } | StartCause::ToolMissing { .. } => "tool",
            StartCause::Mount { .. } => "mount",
            StartCause::Vmm { .. } => "vmm",
            StartCause::Snapshot(_) => "snapshot",
            StartCause::Step(_) => "step",
        }
    }

    /// A blocking task of the start that panicked or was cancelled.
    pub fn task(what: &str, e: tokio::task::JoinError) -> Self {
        StartCause::Helper {
            what: format!("{what} task"),
            detail: e.to_string(),
        }
    }
}

impl RuntimeError {
    /// `e` as a start failure: start failures, missing images and the node's own refusals
    /// (no disk, no ids) stay what they are; anything else becomes the cause of a
    /// `StartFailed`.
    pub fn into_start_failure(self) -> RuntimeError {
        match self {
            RuntimeError::StartFailed(_)
            | RuntimeError::ImageNotFound(_)
            | RuntimeError::NoDisk(_)
            | RuntimeError::NoIds { .. } => self,
            other => RuntimeError::StartFailed(StartCause::Step(Box::new(other))),
        }
    }
}

/// Why the writable-layer space cannot take one more sandbox.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiskRefusal {
    /// The sandbox asks for more than the whole space holds: it can never fit here.
    #[error(
        "disk_mb {} is more than this node's writable-layer space ({} MiB with --disk-overcommit {overcommit})",
        asked >> 20,
        capacity >> 20
    )]
    TooLarge {
        asked: u64,
        capacity: u64,
        overcommit: f64,
    },
    /// The quotas of the sandboxes held leave too little now.
    #[error(
        "this node's writable-layer space is committed: {} of {} MiB, {} MiB asked",
        committed >> 20,
        capacity >> 20,
        asked >> 20
    )]
    Committed {
        committed: u64,
        capacity: u64,
        asked: u64,
    },
}

impl DiskRefusal {
    /// True when the sandbox can never fit (asking again later does not help).
    pub fn never(&self) -> bool {
        matches!(self, DiskRefusal::TooLarge { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_failure_keeps_its_cause_and_answers_start_failed() {
        let e: RuntimeError = StartCause::AgentTimeout {
            step: "init".into(),
            log: String::new(),
        }
        .into();
        assert_eq!(e.code(), ErrorCode::StartFailed);
        assert_eq!(
            e.to_string(),
            "sandbox failed to start: agent did not answer (init) in time"
        );
        assert!(
            matches!(&e, RuntimeError::StartFailed(c) if c.kind() == "agent_timeout"),
            "{e:?}"
        );
    }

    #[test]
    fn other_errors_of_a_start_become_its_cause_and_refusals_stay() {
        let lost = RuntimeError::AgentLost.into_start_failure();
        match &lost {
            RuntimeError::StartFailed(StartCause::Step(inner)) => {
                assert!(matches!(**inner, RuntimeError::AgentLost))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(lost.code(), ErrorCode::StartFailed);
        let busy = RuntimeError::NoIds { ranges: 4 }.into_start_failure();
        assert_eq!(busy.code(), ErrorCode::Busy);
        let missing = RuntimeError::ImageNotFound("x".into()).into_start_failure();
        assert_eq!(missing.code(), ErrorCode::NotFound);
    }

    #[test]
    fn typed_causes_keep_their_messages_and_codes() {
        let e: RuntimeError = Unsupported::Operation {
            substrate: warren_types::Substrate::Function,
            op: Operation::Fork,
        }
        .into();
        assert_eq!(e.to_string(), "function sandboxes cannot fork");
        assert_eq!(e.code(), ErrorCode::UnsupportedSubstrate);
        let e: RuntimeError = Unsupported::ThisSubstrate {
            op: Operation::Pause,
        }
        .into();
        assert_eq!(e.to_string(), "this substrate cannot pause");
        let e: RuntimeError = AdoptError::RecordVersion { found: 2, reads: 1 }.into();
        assert_eq!(
            e.to_string(),
            "cannot adopt: record version 2 (this daemon reads 1)"
        );
        assert_eq!(e.code(), ErrorCode::Internal);
        let e: RuntimeError = ProtocolError::Expected {
            expected: "Ready",
            got: "Child".into(),
        }
        .into();
        assert_eq!(e.to_string(), "protocol: expected Ready, got Child");
        assert_eq!(e.code(), ErrorCode::Internal);
        let e: RuntimeError = VmmError::from(QmpError::NoAnswer { cmd: "stop".into() }).into();
        assert_eq!(
            e.to_string(),
            "virtual machine monitor: QMP stop: no answer in time"
        );
        assert_eq!(e.code(), ErrorCode::Internal);
        let e: RuntimeError = StartCause::Config(ConfigError::IdPoolShape {
            base: 7,
            slots: 2,
            range: 65_536,
        })
        .into();
        assert_eq!(e.code(), ErrorCode::StartFailed);
        assert!(matches!(&e, RuntimeError::StartFailed(c) if c.kind() == "config"));
        assert_eq!(
            e.to_string(),
            "sandbox failed to start: id pool base 7 with 2 ranges of 65536: the base must be \
             a multiple of 65536 and the pool end below 2^32"
        );
        let refused = StartCause::AgentRefused {
            message: "mount /x: denied".into(),
        };
        assert_eq!(refused.kind(), "agent_refused");
        assert_eq!(refused.to_string(), "mount /x: denied");
    }
}
