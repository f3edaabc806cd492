//! Runtime errors, each mapped to a stable API code.

use warren_types::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("image {0:?} not found")]
    ImageNotFound(String),
    #[error("image: {0}")]
    Image(#[from] warren_image::ImageError),
    #[error("sandbox failed to start: {0}")]
    StartFailed(String),
    #[error("the sandbox's agent is gone")]
    AgentLost,
    #[error("{message}")]
    Agent { code: ErrorCode, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("host: {0}")]
    Sys(#[from] warren_sys::SysError),
    #[error("host i/o on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot adopt: {0}")]
    Adopt(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("virtual machine monitor: {0}")]
    Vmm(String),
    /// A TCP port inside the sandbox cannot be reached; the message says why (nothing
    /// listens, a timeout).
    #[error("{message}")]
    PortUnreachable { port: u16, message: String },
    /// The node's writable-layer space cannot hold the sandbox now.
    #[error("{0}")]
    NoDisk(String),
    /// Every host id range of the node's pool is held by a sandbox.
    #[error("{0}")]
    NoIds(String),
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
            RuntimeError::NoDisk(_) | RuntimeError::NoIds(_) => ErrorCode::Busy,
            RuntimeError::Protocol(_)
            | RuntimeError::Sys(_)
            | RuntimeError::Io { .. }
            | RuntimeError::Adopt(_)
            | RuntimeError::Vmm(_) => ErrorCode::Internal,
        }
    }
}
