//! File descriptor helpers.

use crate::{Result, SysError};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A connected pair of `SOCK_SEQPACKET` unix sockets (messages keep their bounds), both
/// close-on-exec.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd)> {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| SysError::errno("socketpair", e))
}

/// A connected pair of unix stream sockets, close-on-exec.
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

/// Creates the new regular file `name` in directory `dir` (`O_CREAT | O_EXCL | O_NOFOLLOW`,
/// write-only, close-on-exec) with `mode`: the file is made in that directory even when the
/// directory was renamed or its path swapped for a symlink since it was opened.
pub fn create_at(dir: &impl AsRawFd, name: &std::ffi::OsStr, mode: u32) -> Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_WRONLY
        | OFlag::O_CREAT
        | OFlag::O_EXCL
        | OFlag::O_NOFOLLOW
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        name,
        flags,
        nix::sys::stat::Mode::from_bits_truncate(mode),
    )
    .map_err(|e| SysError::errno(format!("create {}", name.to_string_lossy()), e))?;
    // SAFETY: openat just returned this fd; nothing else owns it.
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

/// How many bytes are waiting to be read from the pipe or socket `fd` (`FIONREAD`).
pub fn readable_bytes(fd: &impl AsRawFd) -> Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at `n`, alive for
    // the call; an fd that is not a pipe or socket is an error (ENOTTY/EINVAL), not UB.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r < 0 {
        return Err(SysError::last("ioctl(FIONREAD)"));
    }
    Ok(usize::try_from(n).unwrap_or(0))
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

/// Most descriptors [`send_fds`] sends (and [`recv_fds`] takes) in one message.
pub const MAX_PASSED_FDS: usize = 64;

/// Sends `fds` over the unix stream socket `sock` with one byte of data (`SCM_RIGHTS`). The
/// receiver takes them with [`recv_fds`] before it reads anything else the sender wrote after.
pub fn send_fds(sock: &impl AsRawFd, fds: &[RawFd]) -> Result<()> {
    send_fds_with(sock, b"F", fds)
}

/// Sends `data` (not empty) with `fds` in one message over the unix socket `sock`; on a
/// `SOCK_SEQPACKET` socket the receiver gets both in one `recvmsg`.
pub fn send_fds_with(sock: &impl AsRawFd, data: &[u8], fds: &[RawFd]) -> Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    if fds.len() > MAX_PASSED_FDS {
        return Err(SysError::new(
            "send descriptors",
            std::io::Error::other(format!(
                "{} descriptors, at most {MAX_PASSED_FDS}",
                fds.len()
            )),
        ));
    }
    let iov = [std::io::IoSlice::new(data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(_) => {
                return Err(SysError::new(
                    "send descriptors",
                    std::io::Error::other("short send"),
                ))
            }
            Err(nix::errno::Errno::EINTR) => continue,
            // A non-blocking socket whose buffer is full: wait until it can be written.
            Err(nix::errno::Errno::EAGAIN) => {
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                // SAFETY: `sock` is borrowed for the duration of this call and outlives the
                // poll below.
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(sock.as_raw_fd()) };
                let mut p = [PollFd::new(fd, PollFlags::POLLOUT)];
                let _ = poll(&mut p, PollTimeout::from(1000u16));
            }
            Err(e) => return Err(SysError::errno("send descriptors", e)),
        }
    }
}

/// A close-on-exec copy of `fd` on the lowest free descriptor at or above `min`.
pub fn dup_above(fd: &impl AsRawFd, min: RawFd) -> Result<OwnedFd> {
    let n = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(min))
        .map_err(|e| SysError::errno("dup", e))?;
    // SAFETY: F_DUPFD_CLOEXEC just made this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// [`send_fds_with`] that never waits: a socket whose buffer is full is an error (`EAGAIN`).
pub fn send_fds_now(sock: &impl AsRawFd, data: &[u8], fds: &[RawFd]) -> Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let iov = [std::io::IoSlice::new(data)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsg, flags, None) {
            Ok(n) if n == data.len() => return Ok(()),
            Ok(_) => {
                return Err(SysError::new(
                    "send descriptors",
                    std::io::Error::other("short send"),
                ))
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(SysError::errno("send descriptors", e)),
        }
    }
}

/// Receives the descriptors one [`send_fds`] sent over `sock` (a blocking unix stream
/// socket), close-on-exec. Fails when the next byte carries none.
pub fn recv_fds(sock: &impl AsRawFd) -> Result<Vec<OwnedFd>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; MAX_PASSED_FDS]);
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(|e| SysError::errno("receive descriptors", e))?,
        }
    };
    let mut out = Vec::new();
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    for c in msg
        .cmsgs()
        .map_err(|e| SysError::errno("receive descriptors", e))?
    {
        if let ControlMessageOwned::ScmRights(fds) = c {
            // SAFETY: the kernel installed these descriptors in our table for us just now;
            // nothing else owns them.
            out.extend(fds.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }));
        }
    }
    if msg.bytes != 1 || truncated {
        return Err(SysError::new(
            "receive descriptors",
            std::io::Error::other("no descriptors where they were expected"),
        ));
    }
    Ok(out)
}
