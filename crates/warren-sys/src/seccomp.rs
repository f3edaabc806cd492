//! The seccomp policy applied to everything that runs in a sandbox (the agent itself and every
//! process it starts). `docs/seccomp.md` explains each group and the decisions.
//!
//! Three filters, evaluated together by the kernel (the most restrictive answer wins):
//! 1. the **allow-list** ([`sandbox_filter`]): the syscalls ordinary programs use, grouped
//!    below; anything else answers `EPERM`. `clone` is allowed only without namespace flags;
//! 2. **argument refinements** ([`refine_filter`]): `EPERM` for filesystem-level and terminal
//!    ioctls (extent swapping, reflink/dedupe, `TIOCSTI`, ...) and for `personality` values
//!    other than the harmless ones;
//! 3. **answered as missing** ([`enosys_filter`]): `clone3` (so libc falls back to `clone`,
//!    whose flags a filter can check) and `io_uring` (programs fall back to ordinary I/O).
//!
//! Not allowed at all (absent from the groups): the kernel keyring, `bpf`, `perf_event_open`,
//! `userfaultfd`, `kexec_*`, module calls, `reboot`, swap, `acct`, clock setting, `iopl`/
//! `ioperm`, `syslog`, every mount call (old and new API), `pivot_root`, `setns`, `unshare`,
//! `open_by_handle_at`/`name_to_handle_at`, `quotactl`, `fanotify_init`.

use crate::{Result, SysError};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => { &[$(libc::$name),*] };
}

/// Reading, writing and polling file descriptors.
const IO: &[libc::c_long] = syscalls![
    SYS_read,
    SYS_write,
    SYS_readv,
    SYS_writev,
    SYS_pread64,
    SYS_pwrite64,
    SYS_preadv,
    SYS_pwritev,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_lseek,
    SYS_close,
    SYS_close_range,
    SYS_dup,
    SYS_dup2,
    SYS_dup3,
    SYS_pipe,
    SYS_pipe2,
    SYS_fcntl,
    SYS_ioctl,
    SYS_poll,
    SYS_ppoll,
    SYS_select,
    SYS_pselect6,
    SYS_epoll_create,
    SYS_epoll_create1,
    SYS_epoll_ctl,
    SYS_epoll_wait,
    SYS_epoll_pwait,
    SYS_epoll_pwait2,
    SYS_eventfd,
    SYS_eventfd2,
    SYS_signalfd,
    SYS_signalfd4,
    SYS_timerfd_create,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_inotify_init,
    SYS_inotify_init1,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    SYS_sendfile,
    SYS_splice,
    SYS_tee,
    SYS_vmsplice,
    SYS_copy_file_range,
    SYS_readahead,
    SYS_fadvise64,
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_submit,
    SYS_io_cancel,
];

/// Paths, metadata, directories, links, xattrs, syncing.
const FILES: &[libc::c_long] = syscalls![
    SYS_open,
    SYS_openat,
    SYS_openat2,
    SYS_creat,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_newfstatat,
    SYS_statx,
    SYS_statfs,
    SYS_fstatfs,
    SYS_access,
    SYS_faccessat,
    SYS_faccessat2,
    SYS_getdents,
    SYS_getdents64,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_rename,
    SYS_renameat,
    SYS_renameat2,
    SYS_mkdir,
    SYS_mkdirat,
    SYS_rmdir,
    SYS_link,
    SYS_linkat,
    SYS_unlink,
    SYS_unlinkat,
    SYS_symlink,
    SYS_symlinkat,
    SYS_readlink,
    SYS_readlinkat,
    SYS_chmod,
    SYS_fchmod,
    SYS_fchmodat,
    SYS_fchmodat2,
    SYS_chown,
    SYS_fchown,
    SYS_lchown,
    SYS_fchownat,
    SYS_umask,
    SYS_truncate,
    SYS_ftruncate,
    SYS_fallocate,
    SYS_utime,
    SYS_utimes,
    SYS_utimensat,
    SYS_futimesat,
    SYS_mknod,
    SYS_mknodat,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_sync,
    SYS_syncfs,
    SYS_sync_file_range,
    SYS_setxattr,
    SYS_lsetxattr,
    SYS_fsetxattr,
    SYS_getxattr,
    SYS_lgetxattr,
    SYS_fgetxattr,
    SYS_listxattr,
    SYS_llistxattr,
    SYS_flistxattr,
    SYS_removexattr,
    SYS_lremovexattr,
    SYS_fremovexattr,
    SYS_chroot,
    SYS_memfd_create,
];

/// Memory mappings and NUMA policy.
const MEMORY: &[libc::c_long] = syscalls![
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_mremap,
    SYS_brk,
    SYS_msync,
    SYS_mincore,
    SYS_madvise,
    SYS_process_madvise,
    SYS_mlock,
    SYS_mlock2,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_mbind,
    SYS_set_mempolicy,
    SYS_get_mempolicy,
    SYS_set_mempolicy_home_node,
    SYS_move_pages,
    SYS_membarrier,
    SYS_pkey_mprotect,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_memfd_secret,
];

/// Processes, threads, ids, limits. `ptrace` and `process_vm_*` are allowed for debuggers
/// inside the sandbox: the agent is non-dumpable and its memory belongs to the host's user
/// namespace, so nothing in the sandbox can trace or read it.
const PROCESSES: &[libc::c_long] = syscalls![
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_execveat,
    SYS_exit,
    SYS_exit_group,
    SYS_wait4,
    SYS_waitid,
    SYS_set_tid_address,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_futex,
    SYS_futex_waitv,
    SYS_rseq,
    SYS_arch_prctl,
    SYS_prctl,
    SYS_getpid,
    SYS_gettid,
    SYS_getppid,
    SYS_getpgrp,
    SYS_getpgid,
    SYS_setpgid,
    SYS_getsid,
    SYS_setsid,
    SYS_getuid,
    SYS_geteuid,
    SYS_getgid,
    SYS_getegid,
    SYS_setuid,
    SYS_setgid,
    SYS_setreuid,
    SYS_setregid,
    SYS_setresuid,
    SYS_getresuid,
    SYS_setresgid,
    SYS_getresgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_getgroups,
    SYS_setgroups,
    SYS_capget,
    SYS_capset,
    SYS_getrlimit,
    SYS_setrlimit,
    SYS_prlimit64,
    SYS_getrusage,
    SYS_times,
    SYS_uname,
    SYS_sysinfo,
    SYS_getrandom,
    SYS_getcpu,
    SYS_kcmp,
    SYS_ptrace,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_pidfd_open,
    SYS_pidfd_getfd,
    SYS_restart_syscall,
];

/// Signals and timers.
const SIGNALS: &[libc::c_long] = syscalls![
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_rt_sigpending,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_tgsigqueueinfo,
    SYS_rt_sigsuspend,
    SYS_sigaltstack,
    SYS_kill,
    SYS_tkill,
    SYS_tgkill,
    SYS_pidfd_send_signal,
    SYS_pause,
    SYS_alarm,
    SYS_getitimer,
    SYS_setitimer,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
];

/// Reading clocks and sleeping (setting clocks is not allowed).
const TIME: &[libc::c_long] = syscalls![
    SYS_time,
    SYS_gettimeofday,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_nanosleep,
];

/// Scheduling. Raising a priority or a realtime policy needs capabilities of the host's user
/// namespace, which nothing in a sandbox has.
const SCHEDULING: &[libc::c_long] = syscalls![
    SYS_sched_yield,
    SYS_sched_setparam,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_sched_setattr,
    SYS_sched_getattr,
    SYS_getpriority,
    SYS_setpriority,
    SYS_ioprio_set,
    SYS_ioprio_get,
];

/// System V and POSIX IPC (namespaced by the sandbox's IPC namespace).
const IPC: &[libc::c_long] = syscalls![
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_shmdt,
    SYS_semget,
    SYS_semop,
    SYS_semctl,
    SYS_semtimedop,
    SYS_msgget,
    SYS_msgsnd,
    SYS_msgrcv,
    SYS_msgctl,
    SYS_mq_open,
    SYS_mq_unlink,
    SYS_mq_timedsend,
    SYS_mq_timedreceive,
    SYS_mq_notify,
    SYS_mq_getsetattr,
];

/// Sockets (reach is decided by the sandbox's network namespace and policy).
const NETWORK: &[libc::c_long] = syscalls![
    SYS_socket,
    SYS_socketpair,
    SYS_connect,
    SYS_accept,
    SYS_accept4,
    SYS_bind,
    SYS_listen,
    SYS_shutdown,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_sendmmsg,
    SYS_recvmmsg,
    SYS_getsockname,
    SYS_getpeername,
    SYS_setsockopt,
    SYS_getsockopt,
];

/// Self-confinement: programs may sandbox themselves further.
const SELF_CONFINEMENT: &[libc::c_long] = syscalls![
    SYS_seccomp,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
];

/// Every group of the allow-list, with its name (for docs and tests).
pub const GROUPS: &[(&str, &[libc::c_long])] = &[
    ("io", IO),
    ("files", FILES),
    ("memory", MEMORY),
    ("processes", PROCESSES),
    ("signals", SIGNALS),
    ("time", TIME),
    ("scheduling", SCHEDULING),
    ("ipc", IPC),
    ("network", NETWORK),
    ("self-confinement", SELF_CONFINEMENT),
];

/// Syscalls that must never be allowed; a test checks none is in a group.
pub const DENIED: &[libc::c_long] = syscalls![
    SYS_keyctl,
    SYS_add_key,
    SYS_request_key,
    SYS_bpf,
    SYS_perf_event_open,
    SYS_userfaultfd,
    SYS_kexec_load,
    SYS_kexec_file_load,
    SYS_init_module,
    SYS_finit_module,
    SYS_delete_module,
    SYS_reboot,
    SYS_swapon,
    SYS_swapoff,
    SYS_acct,
    SYS_settimeofday,
    SYS_clock_settime,
    SYS_adjtimex,
    SYS_clock_adjtime,
    SYS_iopl,
    SYS_ioperm,
    SYS_syslog,
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_fsopen,
    SYS_fsconfig,
    SYS_fsmount,
    SYS_fspick,
    SYS_move_mount,
    SYS_open_tree,
    SYS_mount_setattr,
    SYS_setns,
    SYS_unshare,
    SYS_open_by_handle_at,
    SYS_name_to_handle_at,
    SYS_quotactl,
    SYS_fanotify_init,
    SYS_lookup_dcookie,
    SYS_vhangup,
    SYS_uselib,
    SYS_ustat,
    SYS_sysfs,
];

/// Namespace-creating `clone` flags refused inside a sandbox.
const NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWTIME) as u64;

/// ioctl requests refused, by `(type << 8) | number` (direction and size bits are ignored,
/// so no variant of a request slips through):
pub const DENIED_IOCTLS: &[(&str, u32)] = &[
    // Filesystem-level operations that rewrite extents or share blocks between files.
    ("FICLONE", 0x9409),
    ("FICLONERANGE", 0x940d),
    ("FIDEDUPERANGE", 0x9436),
    ("EXT4_IOC_MOVE_EXT", 0x660f),
    ("EXT4_IOC_SWAP_BOOT", 0x6611),
    ("XFS_IOC_SWAPEXT", 0x586d),
    ("XFS_IOC_EXCHANGE_RANGE", 0x5881),
    // Terminals: faking input, the console, line disciplines.
    ("TIOCSTI", 0x5412),
    ("TIOCLINUX", 0x541c),
    ("TIOCCONS", 0x541d),
    ("TIOCSETD", 0x5423),
];

/// `personality` values allowed: query, Linux (64/32-bit, with and without `UNAME26`), and
/// `ADDR_NO_RANDOMIZE` (debuggers turn address randomisation off for their own children).
pub const ALLOWED_PERSONALITIES: &[u32] = &[
    0x0000_0000,
    0x0000_0008,
    0x0002_0000,
    0x0002_0008,
    0x0004_0000,
    0x0004_0008,
    0xffff_ffff,
];

fn bad(e: impl std::fmt::Display) -> SysError {
    SysError::new("seccomp filter", std::io::Error::other(e.to_string()))
}

fn arch() -> Result<seccompiler::TargetArch> {
    std::env::consts::ARCH.try_into().map_err(bad)
}

/// Compiles `rules` into a program: `mismatch` for syscalls without a matching rule,
/// `matched` for those with one.
fn program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
) -> Result<BpfProgram> {
    SeccompFilter::new(rules, mismatch, matched, arch()?)
        .map_err(bad)?
        .try_into()
        .map_err(bad)
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, val: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, len, op, val).map_err(bad)
}

/// The allow-list for this architecture (default `EPERM`).
pub fn sandbox_filter() -> Result<BpfProgram> {
    allow_list(&[], 0)
}

/// The allow-list plus the syscalls in `extra`, with `clone` also allowed to make the
/// namespaces in `ns_allowed`.
fn allow_list(extra: &[libc::c_long], ns_allowed: u64) -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, group) in GROUPS {
        for nr in *group {
            rules.insert(*nr, vec![]);
        }
    }
    for nr in extra {
        rules.insert(*nr, vec![]);
    }
    // personality: allowed here, its values are refined by `refine_filter`.
    rules.insert(libc::SYS_personality, vec![]);
    // clone: allowed only without (other) namespace flags.
    let no_ns = cond(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(NS_FLAGS & !ns_allowed),
        0,
    )?;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![no_ns]).map_err(bad)?],
    );
    program(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
    )
}

/// What a function container's agent does for each call environment (cell) that the sandbox
/// filter refuses: build its mounts and name its host, and (the Python zygote's forks, see the
/// agent's `zygote`) enter a cell's namespaces...
pub const CELL_BUILDING: &[libc::c_long] = syscalls![
    SYS_mount,
    SYS_umount2,
    SYS_pivot_root,
    SYS_sethostname,
    SYS_setns
];

/// ...in these new namespaces, made by `clone`.
pub const CELL_NAMESPACES: u64 =
    (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) as u64;

/// The filter that takes [`CELL_BUILDING`] and the [`CELL_NAMESPACES`] of `clone` back
/// (default allow): stacked on the builder filters of [`CellFilters`], the sum is exactly the
/// sandbox policy.
fn cell_finish_filter() -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in CELL_BUILDING {
        rules.insert(*nr, vec![]);
    }
    let mut clone = Vec::new();
    for bit in 0..64 {
        let flag = 1u64 << bit;
        if CELL_NAMESPACES & flag != 0 {
            let c = cond(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?;
            clone.push(SeccompRule::new(vec![c]).map_err(bad)?);
        }
    }
    rules.insert(libc::SYS_clone, clone);
    program(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

/// Argument refinements (default allow): denied ioctl requests and `personality` values
/// answer `EPERM`. Comparisons use the low 32 bits, as the kernel does for both arguments.
pub fn refine_filter() -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut ioctl = Vec::new();
    for (_, req) in DENIED_IOCTLS {
        let c = cond(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xffff),
            *req as u64,
        )?;
        ioctl.push(SeccompRule::new(vec![c]).map_err(bad)?);
    }
    rules.insert(libc::SYS_ioctl, ioctl);
    let not_allowed = ALLOWED_PERSONALITIES
        .iter()
        .map(|p| cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, *p as u64))
        .collect::<Result<Vec<_>>>()?;
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(not_allowed).map_err(bad)?],
    );
    program(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
    )
}

/// Syscalls answered `ENOSYS`, as if the kernel lacked them: `clone3` (libc falls back to
/// `clone`) and `io_uring` (its large, fast-moving kernel surface has been the source of many
/// privilege escalations; programs fall back to ordinary I/O).
pub const ENOSYS: &[libc::c_long] = syscalls![
    SYS_clone3,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
];

/// The filter answering [`ENOSYS`] (default allow).
pub fn enosys_filter() -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in ENOSYS {
        rules.insert(*nr, vec![]);
    }
    program(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )
}

/// Installs the sandbox filters on the calling thread (inherited by children). Requires
/// `no_new_privs` or CAP_SYS_ADMIN. Of two `ERRNO` answers the kernel keeps the one of the
/// filter installed last, so the `ENOSYS` filter goes last.
pub fn apply_sandbox_filter() -> Result<()> {
    install(&sandbox_filter()?)
}

/// Installs `allow_list`, then the argument refinements, then the `ENOSYS` filter (last, so
/// that its answer wins over the allow-list's `EPERM`).
fn install(allow_list: &BpfProgram) -> Result<()> {
    seccompiler::apply_filter(allow_list).map_err(bad)?;
    seccompiler::apply_filter(&refine_filter()?).map_err(bad)?;
    seccompiler::apply_filter(&enosys_filter()?).map_err(bad)?;
    Ok(())
}

/// The sandbox policy split in two for function containers, whose agent makes a fresh call
/// environment (cell) for every call. Installing the whole sandbox filter in every cell made
/// the kernel check and JIT-compile a program of several hundred instructions per call, so:
///
/// - the agent installs the *builder* filters on itself once: the whole policy except
///   [`CELL_BUILDING`] and the [`CELL_NAMESPACES`] of `clone`, which it needs to make cells.
///   Every cell inherits them;
/// - each cell, once its root is built, installs the small *finish* filter, which refuses
///   exactly those again.
///
/// Seccomp runs every filter of a thread and keeps the strictest answer (of two `ERRNO`
/// answers, the newest filter's), so a cell is held to exactly the sandbox policy.
#[derive(Debug, Clone)]
pub struct CellFilters {
    finish: BpfProgram,
}

impl CellFilters {
    /// Installs the builder filters on the calling thread and returns the finish filter for
    /// the cells. Requires `no_new_privs` or CAP_SYS_ADMIN.
    pub fn install_builder() -> Result<CellFilters> {
        let finish = cell_finish_filter()?;
        install(&allow_list(CELL_BUILDING, CELL_NAMESPACES)?)?;
        Ok(CellFilters { finish })
    }

    /// Installs the finish filter on the calling thread (a cell, before it runs anything).
    pub fn finish(&self) -> Result<()> {
        seccompiler::apply_filter(&self.finish).map_err(bad)
    }

    /// The finish filter as the kernel takes it (`struct sock_filter`s in this machine's byte
    /// order), for a process that installs it with `prctl(PR_SET_SECCOMP)` on its own (a
    /// call's Python forked by the zygote).
    pub fn finish_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.finish.len() * 8);
        for f in &self.finish {
            out.extend_from_slice(&f.code.to_ne_bytes());
            out.push(f.jt);
            out.push(f.jf);
            out.extend_from_slice(&f.k.to_ne_bytes());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        assert!(sandbox_filter().unwrap().len() > 100);
        assert!(!refine_filter().unwrap().is_empty());
        assert!(!enosys_filter().unwrap().is_empty());
        let finish = cell_finish_filter().unwrap();
        assert!(
            finish.len() < 100,
            "finish filter has {} instructions",
            finish.len()
        );
    }

    #[test]
    fn denied_syscalls_are_in_no_group() {
        for (name, group) in GROUPS {
            for nr in *group {
                assert!(
                    !DENIED.contains(nr),
                    "syscall {nr} is denied but in group {name}"
                );
                assert!(
                    !ENOSYS.contains(nr),
                    "syscall {nr} answers ENOSYS but in group {name}"
                );
            }
        }
        for nr in ENOSYS {
            assert!(!DENIED.contains(nr));
        }
    }

    #[test]
    fn groups_do_not_overlap() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, group) in GROUPS {
            for nr in *group {
                assert!(
                    seen.insert(*nr),
                    "syscall {nr} appears twice (again in {name})"
                );
            }
        }
    }

    /// Runs `f` in a forked child and asserts it exited 0 (else: the failed check's number).
    fn in_child(f: impl FnOnce() -> i32) {
        // SAFETY: fork in a test; the child only makes syscalls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = f();
            // SAFETY: leave the forked test child without running destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "the child failed at check {}",
            libc::WEXITSTATUS(status)
        );
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// `clone` with `flags` (plus SIGCHLD) from a raw syscall: the errno when refused, 0 when
    /// a child was made (it leaves at once and is reaped).
    fn try_clone(flags: u64) -> i32 {
        // SAFETY: a fork-like clone (no CLONE_VM, no new stack); the child only calls _exit.
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone,
                flags | libc::SIGCHLD as u64,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        match r {
            -1 => errno(),
            // SAFETY: the new child leaves without touching anything.
            0 => unsafe { libc::_exit(0) },
            pid => {
                let mut st = 0;
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(pid as i32, &mut st, 0) };
                0
            }
        }
    }

    /// The checks every sandboxed process passes: refusals with the right errno, ordinary
    /// calls allowed. 0 or the number of the failed check.
    fn sandbox_policy_holds() -> i32 {
        // SAFETY: raw syscalls with scalar or null arguments; each is refused before the
        // kernel reads anything.
        unsafe {
            if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                return 20;
            }
            if libc::syscall(libc::SYS_bpf, 0, 0, 0) != -1 || errno() != libc::EPERM {
                return 21;
            }
            if libc::syscall(libc::SYS_userfaultfd, 0) != -1 || errno() != libc::EPERM {
                return 22;
            }
            if libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0) != -1 || errno() != libc::EPERM
            {
                return 23;
            }
            if libc::syscall(libc::SYS_io_uring_setup, 1, 0) != -1 || errno() != libc::ENOSYS {
                return 24;
            }
            if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                return 25;
            }
            // FICLONE with its high bits flipped is still refused.
            if libc::ioctl(0, 0x4004_9409) != -1 || errno() != libc::EPERM {
                return 26;
            }
            if libc::syscall(libc::SYS_ioctl, 0, 0xdead_0000_4004_9409u64) != -1
                || errno() != libc::EPERM
            {
                return 27;
            }
            if libc::ioctl(0, libc::TIOCSTI, c"x".as_ptr()) != -1 || errno() != libc::EPERM {
                return 28;
            }
            // READ_IMPLIES_EXEC is refused; the query is allowed.
            if libc::personality(0x0040_0000) != -1 || errno() != libc::EPERM {
                return 29;
            }
            if libc::personality(0xffff_ffff) == -1 {
                return 30;
            }
            if libc::getpid() <= 0 {
                return 31;
            }
            if libc::mount(
                std::ptr::null(),
                c"/nonexistent-warren".as_ptr(),
                std::ptr::null(),
                0,
                std::ptr::null(),
            ) != -1
                || errno() != libc::EPERM
            {
                return 32;
            }
            if libc::umount2(c"/nonexistent-warren".as_ptr(), 0) != -1 || errno() != libc::EPERM {
                return 33;
            }
            if libc::syscall(libc::SYS_pivot_root, c"/x".as_ptr(), c"/y".as_ptr()) != -1
                || errno() != libc::EPERM
            {
                return 34;
            }
            if libc::sethostname(c"x".as_ptr(), 1) != -1 || errno() != libc::EPERM {
                return 35;
            }
            if libc::unshare(libc::CLONE_NEWNS) != -1 || errno() != libc::EPERM {
                return 36;
            }
        }
        for (i, flag) in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNET,
        ]
        .into_iter()
        .enumerate()
        {
            if try_clone(flag as u64) != libc::EPERM {
                return 40 + i as i32;
            }
        }
        // A plain fork is fine.
        if try_clone(0) != 0 {
            return 50;
        }
        0
    }

    /// In a forked child: the filters refuse what they should, with the right errno, and
    /// allow ordinary calls.
    #[test]
    fn filters_answer_as_documented() {
        in_child(|| {
            // SAFETY: prctl with constant arguments.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return 10;
            }
            if apply_sandbox_filter().is_err() {
                return 11;
            }
            sandbox_policy_holds()
        });
    }

    /// The builder filters let a cell be made (and nothing else more than the sandbox
    /// policy); with the finish filter on top, the policy is exactly the sandbox's.
    #[test]
    fn split_cell_filters_add_up_to_the_sandbox_policy() {
        in_child(|| {
            // SAFETY: prctl with constant arguments.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return 10;
            }
            let Ok(cells) = CellFilters::install_builder() else {
                return 11;
            };
            // The builder lets mount through to the kernel (which may refuse it for its own
            // reasons, never EPERM from the filter for a missing path)...
            // SAFETY: mount of a path that does not exist; nothing is mounted.
            let r = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/nonexistent-warren".as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            // SAFETY: geteuid has no arguments.
            let root = unsafe { libc::geteuid() } == 0;
            if r != -1 || (root && errno() != libc::ENOENT) {
                return 12;
            }
            // ...but still refuses a user namespace, unshare and clone3.
            if try_clone(libc::CLONE_NEWUSER as u64) != libc::EPERM {
                return 13;
            }
            // SAFETY: unshare with a constant flag; refused by the filter.
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } != -1 || errno() != libc::EPERM {
                return 14;
            }
            // SAFETY: clone3 with a null argument; answered by the filter.
            if unsafe { libc::syscall(libc::SYS_clone3, 0, 0) } != -1 || errno() != libc::ENOSYS {
                return 15;
            }
            if cells.finish().is_err() {
                return 16;
            }
            sandbox_policy_holds()
        });
    }
}
