//! File descriptor helpers.

use crate::{Result, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A connected pair of `SOCK_STREAM` unix sockets, both close-on-exec.
pub fn socketpair() -> Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| SysError::errno("socketpair", e))
}

/// Closes every fd >= `from` except those in `keep`.
pub fn close_fds_from(from: RawFd, keep: &[RawFd]) {
    let mut lo = from as u32;
    let mut keep: Vec<u32> = keep
        .iter()
        .filter(|k| **k >= from)
        .map(|k| *k as u32)
        .collect();
    keep.sort_unstable();
    for k in keep {
        if k > lo {
            close_range(lo, k - 1);
        }
        lo = k + 1;
    }
    close_range(lo, u32::MAX);
}

fn close_range(lo: u32, hi: u32) {
    // SAFETY: close_range only closes descriptors; callers own the process's fd table at this
    // point (start-up of a single-threaded agent).
    let r = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0) };
    if r != 0 {
        for fd in lo..hi.min(65536) {
            // SAFETY: closing an fd we may not own is harmless here (start-up, single thread).
            unsafe { libc::close(fd as i32) };
        }
    }
}

/// Takes ownership of a raw fd inherited from the parent.
///
/// Returns an error if `fd` is not open.
pub fn inherited(fd: RawFd) -> Result<OwnedFd> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD)
        .map_err(|e| SysError::errno(format!("fd {fd} not inherited"), e))?;
    // SAFETY: the fd is open (checked above) and, by the spawn contract, nobody else in this
    // process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets or clears close-on-exec.
pub fn set_cloexec(fd: &impl AsRawFd, on: bool) -> Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let flags = if on {
        FdFlag::FD_CLOEXEC
    } else {
        FdFlag::empty()
    };
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(flags))
        .map_err(|e| SysError::errno("fcntl(F_SETFD)", e))?;
    Ok(())
}

/// Puts an fd in non-blocking mode.
pub fn set_nonblocking(fd: &impl AsRawFd) -> Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fl = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)
        .map_err(|e| SysError::errno("fcntl(F_GETFL)", e))?;
    let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(fl))
        .map_err(|e| SysError::errno("fcntl(F_SETFL)", e))?;
    Ok(())
}

/// Duplicates `fd` onto `target` (clearing close-on-exec on `target`).
pub fn dup_to(fd: &impl AsRawFd, target: RawFd) -> Result<()> {
    // SAFETY: dup2 on valid fds; `target` is a number the caller reserved.
    let r = unsafe { libc::dup2(fd.as_raw_fd(), target) };
    if r < 0 {
        return Err(SysError::last(format!("dup2 to {target}")));
    }
    Ok(())
}
