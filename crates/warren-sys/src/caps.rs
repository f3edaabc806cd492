//! Capabilities: keep a small default set, drop the rest from every set and the bounding set.

use crate::{Result, SysError};
use caps::{CapSet, Capability, CapsHashSet};

/// The capabilities root inside a sandbox keeps (the conventional container default). They
/// only ever apply inside the sandbox's own user namespace.
pub const DEFAULT_KEEP: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_MKNOD,
    Capability::CAP_NET_RAW,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

/// `keep` as a bit mask (bit n: capability n), for a process that sets its capabilities
/// with `capset` on its own (a call's Python forked by the zygote).
pub fn mask(keep: &[Capability]) -> u64 {
    keep.iter().fold(0, |m, c| m | 1u64 << c.index())
}

fn err(what: &str, e: caps::errors::CapsError) -> SysError {
    SysError::new(what, std::io::Error::other(e.to_string()))
}

/// Drops every capability not in `keep` from the bounding, inheritable, permitted and
/// effective sets and clears the ambient set.
pub fn restrict_to(keep: &[Capability]) -> Result<()> {
    let keep_set: CapsHashSet = keep.iter().copied().collect();
    for cap in caps::all() {
        if !keep_set.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap).map_err(|e| err("drop bounding cap", e))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| err("clear ambient caps", e))?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())
        .map_err(|e| err("set inheritable caps", e))?;
    caps::set(None, CapSet::Effective, &keep_set).map_err(|e| err("set effective caps", e))?;
    caps::set(None, CapSet::Permitted, &keep_set).map_err(|e| err("set permitted caps", e))?;
    Ok(())
}

/// Takes host uid/gid `uid`/`gid` (all of real, effective and saved; no supplementary
/// groups) while keeping every capability the process has, so that a user namespace it
/// makes next is *owned* by `uid`: the kernel charges the per-user counts of that namespace
/// (`/proc/sys/user/*`: inotify instances and watches, fanotify groups, namespaces) to
/// `uid` in the parent namespace, not to root. The capabilities stay effective, so the
/// namespace is made as a privileged process would make it.
pub fn become_owner(uid: u32, gid: u32) -> Result<()> {
    keep_caps(true)?;
    nix::unistd::setgroups(&[]).map_err(|e| SysError::errno("setgroups", e))?;
    nix::unistd::setresgid(gid.into(), gid.into(), gid.into())
        .map_err(|e| SysError::errno("setresgid", e))?;
    nix::unistd::setresuid(uid.into(), uid.into(), uid.into())
        .map_err(|e| SysError::errno("setresuid", e))?;
    // Leaving uid 0 cleared the effective set (the permitted set was kept).
    let permitted =
        caps::read(None, CapSet::Permitted).map_err(|e| err("read permitted caps", e))?;
    caps::set(None, CapSet::Effective, &permitted).map_err(|e| err("raise effective caps", e))?;
    keep_caps(false)
}

fn keep_caps(on: bool) -> Result<()> {
    // SAFETY: prctl(PR_SET_KEEPCAPS) takes plain integers and touches no memory of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, libc::c_ulong::from(on), 0, 0, 0) };
    if r < 0 {
        return Err(SysError::last("prctl(PR_SET_KEEPCAPS)"));
    }
    Ok(())
}
