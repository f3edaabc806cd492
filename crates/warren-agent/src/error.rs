//! The agent's errors. Those that reach the daemon (as an `Event::Error` or a failed start)
//! carry a stable [`ErrorCode`] from [`AgentError::code`] and their message.

use warren_proto::FrameError;
use warren_types::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A system call failed (the message says what was being done).
    #[error(transparent)]
    Sys(#[from] warren_sys::SysError),
    /// A file or socket operation failed while doing `what`.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A frame could not be read or written while doing `what`.
    #[error("{what}: {source}")]
    Frame {
        what: &'static str,
        #[source]
        source: FrameError,
    },
    /// The other end of a control connection said something out of turn.
    #[error("{0}")]
    Protocol(String),
    /// The caller asked for something that cannot be: a user the sandbox does not have, a
    /// malformed uid or gid, a profile name with a NUL.
    #[error("{0}")]
    Invalid(String),
    /// A file a call brings could not be written (its path is the caller's).
    #[error("{path}: {source}")]
    WriteFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The sandbox cannot be built from what it was given (disks, layers, filters).
    #[error("{0}")]
    Setup(String),
    /// A call environment failed to start; `status` is how it ended, if it did.
    #[error("call environment: {source} (exit {status})")]
    CellStart {
        #[source]
        source: Box<AgentError>,
        status: String,
    },
    /// A call environment did not say it was ready in time.
    #[error("call environment did not start in time")]
    CellTimeout,
}

impl AgentError {
    /// The stable code the daemon (and so the client) sees.
    pub fn code(&self) -> ErrorCode {
        match self {
            AgentError::Invalid(_) | AgentError::WriteFile { .. } => ErrorCode::InvalidRequest,
            AgentError::Sys(_)
            | AgentError::Io { .. }
            | AgentError::Frame { .. }
            | AgentError::Protocol(_)
            | AgentError::Setup(_)
            | AgentError::CellStart { .. }
            | AgentError::CellTimeout => ErrorCode::Internal,
        }
    }

    /// Wraps an i/o error with what was being done: `.map_err(AgentError::io("mkdir"))`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AgentError {
        let what = what.into();
        move |source| AgentError::Io { what, source }
    }

    /// Wraps a frame error with what was being done.
    pub fn frame(what: &'static str) -> impl FnOnce(FrameError) -> AgentError {
        move |source| AgentError::Frame { what, source }
    }
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_codes_and_messages() {
        let e = AgentError::Invalid("no user \"x\" in the sandbox's /etc/passwd".into());
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert_eq!(e.to_string(), "no user \"x\" in the sandbox's /etc/passwd");

        let e = AgentError::WriteFile {
            path: "/in/a".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert!(e.to_string().starts_with("/in/a: "), "{e}");

        let sys = warren_sys::SysError::new("mount /x", std::io::Error::from_raw_os_error(1));
        let e = AgentError::from(sys);
        assert_eq!(e.code(), ErrorCode::Internal);
        assert!(e.to_string().starts_with("mount /x: "), "{e}");

        let e = AgentError::io("mkdir /a")(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(e.to_string().starts_with("mkdir /a: "), "{e}");
        assert_eq!(e.code(), ErrorCode::Internal);

        let e = AgentError::frame("waiting for id maps")(FrameError::Closed);
        assert_eq!(
            e.to_string(),
            "waiting for id maps: peer closed the connection"
        );

        let e = AgentError::CellStart {
            source: Box::new(AgentError::Setup("seccomp filters missing".into())),
            status: "Ok(Ok(Code(1)))".into(),
        };
        assert_eq!(
            e.to_string(),
            "call environment: seccomp filters missing (exit Ok(Ok(Code(1))))"
        );
        assert_eq!(e.code(), ErrorCode::Internal);
        assert_eq!(AgentError::CellTimeout.code(), ErrorCode::Internal);
    }
}
