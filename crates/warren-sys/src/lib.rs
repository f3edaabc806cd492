//! Host interfaces that need `unsafe` or raw syscalls, each behind a small safe function.
//!
//! This crate owns every `unsafe` block of Warren; each carries a `// SAFETY:` comment. It
//! knows nothing of sandboxes, HTTP or images: callers pass paths, fds and flags. It must
//! never spawn threads or hold locks across `fork`.

#![allow(unsafe_code)]

pub mod btrfs;
pub mod caps;
pub mod children;
pub mod clone;
pub mod fd;
pub mod guest;
pub mod landlock;
pub mod meminfo;
pub mod mount;
pub mod net;
pub mod nft;
pub mod ns;
pub mod pidfd;
pub mod process;
pub mod pty;
pub mod seccomp;

/// A failed system call, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SysError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

impl SysError {
    pub fn new(what: impl Into<String>, source: std::io::Error) -> Self {
        SysError {
            what: what.into(),
            source,
        }
    }
    pub fn last(what: impl Into<String>) -> Self {
        SysError::new(what, std::io::Error::last_os_error())
    }
    pub fn errno(what: impl Into<String>, e: nix::errno::Errno) -> Self {
        SysError::new(what, std::io::Error::from_raw_os_error(e as i32))
    }
    /// The raw errno, when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

pub type Result<T> = std::result::Result<T, SysError>;
