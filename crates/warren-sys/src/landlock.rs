//! Landlock for a sandbox: one domain that the agent (PID 1) enters before it serves, so the
//! agent, its file API and every command it starts share it.
//!
//! What the domain enforces, best effort by the kernel's ABI:
//! - filesystem (ABI 1+): every access right of the ABI is handled; the whole tree is granted
//!   except **creating device nodes** (`MakeChar`, `MakeBlock`: nowhere) and **device ioctls**
//!   (`IoctlDev`, ABI 5+: only beneath `/dev`, which holds the sandbox's own minimal set);
//! - scopes (ABI 6+): **signals** and **abstract unix sockets** cannot cross the domain, so no
//!   process of the sandbox can signal or connect to a process outside it (the host, another
//!   sandbox), even where namespaces would be shared.
//!
//! Why the tree is granted as a whole: Landlock rules are inherited by everything beneath a
//! granted directory and cannot be subtracted, so write access to a directory created later
//! (`mkdir /app`) needs the grant on `/`, which also covers `/proc` and `/sys`. Those stay
//! read-only by their mounts and the user namespace. Per-command domains would see new
//! directories, but would also stop commands of different calls from inspecting or tracing
//! each other (`lsof`, `ss -p`, `gdb -p`), which tasks legitimately do.

use crate::{Result, SysError};
use landlock::{
    Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::os::fd::OwnedFd;
use std::path::Path;

/// The newest ABI this code was written and tested for.
pub const TARGET_ABI: ABI = ABI::V7;

/// What [`restrict_sandbox`] enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enforced {
    /// The kernel's Landlock ABI (0: none).
    pub abi: u32,
    /// Device-node creation is refused (ABI 1+).
    pub fs: bool,
    /// Device ioctls are limited to `/dev` (ABI 5+).
    pub ioctl_dev: bool,
    /// Signals and abstract unix sockets are scoped to the sandbox (ABI 6+).
    pub scopes: bool,
}

impl Enforced {
    /// What the kernel's ABI allows, as a one-line summary for logs and health.
    pub fn for_abi(abi: u32) -> Self {
        Enforced {
            abi,
            fs: abi >= 1,
            ioctl_dev: abi >= 5,
            scopes: abi >= 6,
        }
    }

    pub fn describe(&self) -> String {
        if self.abi == 0 {
            return "landlock: not supported by this kernel; nothing enforced".into();
        }
        let mut parts = vec!["no device nodes"];
        if self.ioctl_dev {
            parts.push("device ioctls only beneath /dev");
        }
        if self.scopes {
            parts.push("signals and abstract unix sockets scoped to the sandbox");
        }
        format!("landlock ABI {}: {}", self.abi, parts.join(", "))
    }
}

/// The kernel's Landlock ABI version, 0 when Landlock is missing or disabled.
pub fn kernel_abi() -> u32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only returns
    // the ABI version (or an error); no memory is passed.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

fn bad(what: &str) -> impl FnOnce(landlock::RulesetError) -> SysError + '_ {
    move |e| {
        SysError::new(
            format!("landlock {what}"),
            std::io::Error::other(e.to_string()),
        )
    }
}

fn path(p: &Path) -> Result<PathFd> {
    PathFd::new(p).map_err(|e| {
        SysError::new(
            format!("landlock: open {}", p.display()),
            std::io::Error::other(e.to_string()),
        )
    })
}

/// Rights granted on the whole tree: everything of `abi` but device nodes and device ioctls.
pub fn tree_rights(abi: ABI) -> BitFlags<AccessFs> {
    AccessFs::from_all(abi) & !(AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev)
}

/// Puts the calling thread (and everything it starts later) into the sandbox's Landlock
/// domain; `root` is the sandbox's root and `dev` its `/dev`. Requires `no_new_privs`. Best
/// effort: on an older kernel, whatever its ABI supports is enforced.
pub fn restrict_sandbox(root: &Path, dev: &Path) -> Result<Enforced> {
    let abi = kernel_abi();
    if abi == 0 {
        return Ok(Enforced::for_abi(0));
    }
    let status = sandbox_rules(root, dev)?
        .restrict_self()
        .map_err(bad("restrict_self"))?;
    match status.ruleset {
        RulesetStatus::NotEnforced => Ok(Enforced::for_abi(0)),
        _ => Ok(Enforced::for_abi(abi.min(TARGET_ABI as u32))),
    }
}

/// The ruleset [`restrict_sandbox`] enforces, as a descriptor another process enforces on
/// itself (`landlock_restrict_self`, after `no_new_privs`): a call's Python forked by the
/// zygote. `None` when the kernel has no Landlock.
pub fn sandbox_ruleset(root: &Path, dev: &Path) -> Result<Option<OwnedFd>> {
    if kernel_abi() == 0 {
        return Ok(None);
    }
    Ok(sandbox_rules(root, dev)?.into())
}

/// Enforces a ruleset made by [`sandbox_ruleset`] on the calling thread (and everything it
/// starts later). Requires `no_new_privs`.
pub fn enforce(ruleset: &OwnedFd) -> Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: landlock_restrict_self(fd, 0) takes a descriptor we own and no memory.
    let r = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) };
    if r != 0 {
        return Err(SysError::new(
            "landlock restrict_self",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn sandbox_rules(root: &Path, dev: &Path) -> Result<RulesetCreated> {
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .map_err(bad("handle"))?
        .scope(Scope::Signal | Scope::AbstractUnixSocket)
        .map_err(bad("scope"))?
        .create()
        .map_err(bad("create"))?
        .no_new_privs(true)
        .add_rule(PathBeneath::new(path(root)?, tree_rights(TARGET_ABI)))
        .map_err(bad("rule /"))?
        .add_rule(PathBeneath::new(path(dev)?, AccessFs::IoctlDev))
        .map_err(bad("rule /dev"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_rights_exclude_devices() {
        let r = tree_rights(TARGET_ABI);
        assert!(!r.contains(AccessFs::MakeChar));
        assert!(!r.contains(AccessFs::MakeBlock));
        assert!(!r.contains(AccessFs::IoctlDev));
        assert!(r.contains(AccessFs::WriteFile | AccessFs::Execute | AccessFs::Truncate));
    }

    #[test]
    fn describe_by_abi() {
        assert!(Enforced::for_abi(0).describe().contains("not supported"));
        assert!(!Enforced::for_abi(4).describe().contains("scoped"));
        assert!(Enforced::for_abi(7).describe().contains("scoped"));
    }

    /// In a child process (the domain is irreversible): creating a fifo works, a character
    /// device is refused with EACCES, and signalling the parent (outside the domain) fails.
    #[test]
    fn domain_refuses_devices_and_outside_signals() {
        if kernel_abi() < 6 {
            println!("SKIP: landlock ABI {} < 6 on this kernel", kernel_abi());
            return;
        }
        let dir = std::env::temp_dir().join(format!("warren-ll-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let parent = std::process::id() as i32;
        // SAFETY: fork in a test; the child only makes syscalls and exits with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = (|| {
                // SAFETY: prctl with constant arguments.
                if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                    return 10;
                }
                if restrict_sandbox(Path::new("/"), Path::new("/dev")).is_err() {
                    return 11;
                }
                let fifo = std::ffi::CString::new(dir.join("f").to_str().unwrap()).unwrap();
                // SAFETY: a valid C string.
                if unsafe { libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o600, 0) } != 0 {
                    return 12;
                }
                let chr = std::ffi::CString::new(dir.join("c").to_str().unwrap()).unwrap();
                // SAFETY: a valid C string.
                let r = unsafe {
                    libc::mknod(chr.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3))
                };
                if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EACCES) {
                    return 13;
                }
                // SAFETY: signal 0 only checks permission.
                let r = unsafe { libc::kill(parent, 0) };
                if r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EPERM) {
                    return 14;
                }
                0
            })();
            // SAFETY: leave the forked test child without running destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let _ = std::fs::remove_dir_all(&dir);
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child failed at step");
    }
}
