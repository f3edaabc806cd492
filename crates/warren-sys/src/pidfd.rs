//! pidfds: race-free handles on processes that are not necessarily our children.

use crate::{Result, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens a pidfd for `pid`.
pub fn open(pid: u32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(SysError::last(format!("pidfd_open({pid})")));
    }
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Duplicates fd number `target_fd` of the process behind `pidfd` into this process.
/// Needs ptrace-attach rights over the target (root in the initial namespace has them).
pub fn get_fd(pidfd: &OwnedFd, target_fd: i32) -> Result<OwnedFd> {
    // SAFETY: pidfd_getfd returns a new fd (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target_fd, 0) };
    if fd < 0 {
        return Err(SysError::last(format!("pidfd_getfd(fd {target_fd})")));
    }
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
