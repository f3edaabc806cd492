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

/// Sends `signal` through a pidfd (never hits a recycled pid).
pub fn send_signal(pidfd: &OwnedFd, signal: i32) -> Result<()> {
    // SAFETY: plain integers; a null siginfo means "like kill(2)".
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(SysError::last("pidfd_send_signal"));
    }
    Ok(())
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

/// True if the process behind `pidfd` has exited (poll readable).
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}
