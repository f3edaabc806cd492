//! Forking into new namespaces (`clone(2)` without a new stack).

use crate::process::Forked;
use crate::{Result, SysError};
use std::os::fd::RawFd;

/// Forks the calling process into new namespaces: with `CLONE_NEWPID` in `flags` the child
/// is PID 1 of a new pid namespace, with `CLONE_NEWNS` it has its own copy of the mounts.
///
/// # Safety
/// The calling process must be single-threaded (the agent serves on a current-thread
/// runtime): after a fork in a multi-threaded process the child may only make
/// async-signal-safe calls, since another thread may have held a lock at the moment of the
/// fork.
pub unsafe fn clone_single_threaded(flags: nix::sched::CloneFlags) -> Result<Forked> {
    let raw_flags = flags.bits() as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: a fork-like clone (no new stack, no CLONE_VM, no CLONE_SETTLS): the child gets
    // a copy-on-write copy of the caller's address space and continues from here, exactly
    // as with fork(2). The caller guarantees the process is single-threaded (this
    // function's contract), so the child inherits no lock held by another thread.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            raw_flags,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    match pid {
        p if p < 0 => Err(SysError::last(format!("clone({flags:?})"))),
        0 => Ok(Forked::Child),
        p => Ok(Forked::Parent { child: p as u32 }),
    }
}

/// [`clone_single_threaded`] after checking its precondition: fails in a process with more
/// than one thread.
pub fn clone_checked(flags: nix::sched::CloneFlags) -> Result<Forked> {
    crate::process::check_single_threaded("clone")?;
    // SAFETY: the process has one thread (checked just above), and only this thread could
    // start another before the clone.
    unsafe { clone_single_threaded(flags) }
}

/// In a freshly forked child: puts `keep` on `CONTROL`-style fd `at`, /dev/null-like `null`
/// on 0, 1 and 2, closes every other fd, and restores the default action of every signal
/// the parent handled (its handlers write to fds that are now closed).
pub fn reset_child(keep: RawFd, at: RawFd, null: RawFd) -> Result<()> {
    reset_child_keeping(&[(keep, at)], null)
}

/// [`reset_child`] for several descriptors: each `(fd, at)` of `keep` is put on `at` (the
/// `at`s are consecutive from the first, and no `fd` is one of the later `at`s).
pub fn reset_child_keeping(keep: &[(RawFd, RawFd)], null: RawFd) -> Result<()> {
    for fd in 0..3 {
        nix::unistd::dup2(null, fd).map_err(|e| SysError::errno("dup2", e))?;
    }
    let mut last = 2;
    for &(keep, at) in keep {
        if keep != at {
            nix::unistd::dup2(keep, at).map_err(|e| SysError::errno("dup2", e))?;
        } else {
            crate::fd::set_cloexec(&BorrowedRaw(at), false)?;
        }
        last = last.max(at);
    }
    crate::fd::close_fds_from(last + 1, &[]);
    for sig in [libc::SIGCHLD, libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: installs the default disposition; no handler code is involved.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    Ok(())
}

struct BorrowedRaw(RawFd);

impl std::os::fd::AsRawFd for BorrowedRaw {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}
