//! Namespaces and id maps.

use crate::{Result, SysError};
use nix::sched::CloneFlags;
use std::os::fd::OwnedFd;

pub use nix::sched::CloneFlags as Namespaces;

/// The namespaces of a container sandbox: user, mount, pid, net, uts, ipc, cgroup.
pub fn container_namespaces() -> CloneFlags {
    CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWCGROUP
}

/// `unshare(2)`.
pub fn unshare(flags: CloneFlags) -> Result<()> {
    nix::sched::unshare(flags).map_err(|e| SysError::errno(format!("unshare({flags:?})"), e))
}

/// `setns(2)` into the namespace `fd` names (of the kind `kind`).
pub fn setns(fd: &OwnedFd, kind: CloneFlags) -> Result<()> {
    nix::sched::setns(fd, kind).map_err(|e| SysError::errno(format!("setns({kind:?})"), e))
}

/// Sets the hostname of the current UTS namespace.
pub fn set_hostname(name: &str) -> Result<()> {
    nix::unistd::sethostname(name).map_err(|e| SysError::errno("sethostname", e))
}

/// One line of a uid/gid map: `inside outside count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// Writes the uid and gid maps of `pid`'s user namespace (and denies setgroups, which
/// unprivileged-style maps require).
pub fn write_id_maps(pid: u32, uids: IdRange, gids: IdRange) -> Result<()> {
    let w = |file: &str, data: String| {
        std::fs::write(format!("/proc/{pid}/{file}"), data)
            .map_err(|e| SysError::new(format!("write /proc/{pid}/{file}"), e))
    };
    w(
        "uid_map",
        format!("{} {} {}\n", uids.inside, uids.outside, uids.count),
    )?;
    w("setgroups", "allow\n".to_string())?;
    w(
        "gid_map",
        format!("{} {} {}\n", gids.inside, gids.outside, gids.count),
    )?;
    Ok(())
}

/// Opens `/proc/PID/ns/NAME`.
pub fn open_ns(pid: u32, name: &str) -> Result<OwnedFd> {
    let f = std::fs::File::open(format!("/proc/{pid}/ns/{name}"))
        .map_err(|e| SysError::new(format!("open ns {name} of {pid}"), e))?;
    Ok(f.into())
}
