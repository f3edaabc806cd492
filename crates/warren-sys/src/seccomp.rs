//! The seccomp allow-list applied to everything that runs in a sandbox.
//!
//! Default action: `EPERM`. Allowed: the syscalls ordinary programs use (shells, compilers,
//! interpreters, package managers, servers on loopback). Not allowed, by group:
//! - kernel keyring (`keyctl`, `add_key`, `request_key`): not namespaced;
//! - `bpf`, `perf_event_open`, `userfaultfd`: large kernel attack surface;
//! - modules, `kexec_*`, `reboot`, swap, `acct`, clock/time setting, `iopl`/`ioperm`;
//! - mounts and the new mount API, `pivot_root`, `setns`, `unshare` and namespace flags of
//!   `clone`: no nested sandbox games (`clone3` answers `ENOSYS` so libc falls back to
//!   `clone`, whose flags can be checked);
//! - `open_by_handle_at`, `name_to_handle_at`: file-handle escapes;
//! - `ptrace` of the agent is prevented by it being non-dumpable; ptrace itself is allowed
//!   (debuggers), as are `personality` and `quotactl`-free defaults.

use crate::{Result, SysError};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};
use std::collections::BTreeMap;

macro_rules! syscalls {
    ($($name:ident),* $(,)?) => { &[$(libc::$name),*] };
}

/// Syscalls allowed with any arguments.
const ALLOWED: &[libc::c_long] = syscalls![
    SYS_read,
    SYS_write,
    SYS_open,
    SYS_close,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_poll,
    SYS_lseek,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_brk,
    SYS_rt_sigaction,
    SYS_rt_sigprocmask,
    SYS_rt_sigreturn,
    SYS_ioctl,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_access,
    SYS_pipe,
    SYS_select,
    SYS_sched_yield,
    SYS_mremap,
    SYS_msync,
    SYS_mincore,
    SYS_madvise,
    SYS_shmget,
    SYS_shmat,
    SYS_shmctl,
    SYS_dup,
    SYS_dup2,
    SYS_pause,
    SYS_nanosleep,
    SYS_getitimer,
    SYS_alarm,
    SYS_setitimer,
    SYS_getpid,
    SYS_sendfile,
    SYS_socket,
    SYS_connect,
    SYS_accept,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_bind,
    SYS_listen,
    SYS_getsockname,
    SYS_getpeername,
    SYS_socketpair,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_exit,
    SYS_wait4,
    SYS_kill,
    SYS_uname,
    SYS_semget,
    SYS_semop,
    SYS_semctl,
    SYS_shmdt,
    SYS_msgget,
    SYS_msgsnd,
    SYS_msgrcv,
    SYS_msgctl,
    SYS_fcntl,
    SYS_flock,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_ftruncate,
    SYS_getdents,
    SYS_getcwd,
    SYS_chdir,
    SYS_fchdir,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_creat,
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_readlink,
    SYS_chmod,
    SYS_fchmod,
    SYS_chown,
    SYS_fchown,
    SYS_lchown,
    SYS_umask,
    SYS_gettimeofday,
    SYS_getrlimit,
    SYS_getrusage,
    SYS_sysinfo,
    SYS_times,
    SYS_ptrace,
    SYS_getuid,
    SYS_syslog,
    SYS_getgid,
    SYS_setuid,
    SYS_setgid,
    SYS_geteuid,
    SYS_getegid,
    SYS_setpgid,
    SYS_getppid,
    SYS_getpgrp,
    SYS_setsid,
    SYS_setreuid,
    SYS_setregid,
    SYS_getgroups,
    SYS_setgroups,
    SYS_setresuid,
    SYS_getresuid,
    SYS_setresgid,
    SYS_getresgid,
    SYS_getpgid,
    SYS_setfsuid,
    SYS_setfsgid,
    SYS_getsid,
    SYS_capget,
    SYS_capset,
    SYS_rt_sigpending,
    SYS_rt_sigtimedwait,
    SYS_rt_sigqueueinfo,
    SYS_rt_sigsuspend,
    SYS_sigaltstack,
    SYS_utime,
    SYS_mknod,
    SYS_personality,
    SYS_statfs,
    SYS_fstatfs,
    SYS_getpriority,
    SYS_setpriority,
    SYS_sched_setparam,
    SYS_sched_getparam,
    SYS_sched_setscheduler,
    SYS_sched_getscheduler,
    SYS_sched_get_priority_max,
    SYS_sched_get_priority_min,
    SYS_sched_rr_get_interval,
    SYS_mlock,
    SYS_munlock,
    SYS_mlockall,
    SYS_munlockall,
    SYS_prctl,
    SYS_arch_prctl,
    SYS_setrlimit,
    SYS_chroot,
    SYS_sync,
    SYS_gettid,
    SYS_readahead,
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
    SYS_tkill,
    SYS_time,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_io_setup,
    SYS_io_destroy,
    SYS_io_getevents,
    SYS_io_submit,
    SYS_io_cancel,
    SYS_epoll_create,
    SYS_getdents64,
    SYS_set_tid_address,
    SYS_restart_syscall,
    SYS_semtimedop,
    SYS_fadvise64,
    SYS_timer_create,
    SYS_timer_settime,
    SYS_timer_gettime,
    SYS_timer_getoverrun,
    SYS_timer_delete,
    SYS_clock_gettime,
    SYS_clock_getres,
    SYS_clock_nanosleep,
    SYS_exit_group,
    SYS_epoll_wait,
    SYS_epoll_ctl,
    SYS_tgkill,
    SYS_utimes,
    SYS_mbind,
    SYS_set_mempolicy,
    SYS_get_mempolicy,
    SYS_mq_open,
    SYS_mq_unlink,
    SYS_mq_timedsend,
    SYS_mq_timedreceive,
    SYS_mq_notify,
    SYS_mq_getsetattr,
    SYS_waitid,
    SYS_ioprio_set,
    SYS_ioprio_get,
    SYS_inotify_init,
    SYS_inotify_add_watch,
    SYS_inotify_rm_watch,
    SYS_openat,
    SYS_mkdirat,
    SYS_mknodat,
    SYS_fchownat,
    SYS_futimesat,
    SYS_newfstatat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_linkat,
    SYS_symlinkat,
    SYS_readlinkat,
    SYS_fchmodat,
    SYS_faccessat,
    SYS_pselect6,
    SYS_ppoll,
    SYS_set_robust_list,
    SYS_get_robust_list,
    SYS_splice,
    SYS_tee,
    SYS_sync_file_range,
    SYS_vmsplice,
    SYS_move_pages,
    SYS_utimensat,
    SYS_epoll_pwait,
    SYS_signalfd,
    SYS_timerfd_create,
    SYS_eventfd,
    SYS_fallocate,
    SYS_timerfd_settime,
    SYS_timerfd_gettime,
    SYS_accept4,
    SYS_signalfd4,
    SYS_eventfd2,
    SYS_epoll_create1,
    SYS_dup3,
    SYS_pipe2,
    SYS_inotify_init1,
    SYS_preadv,
    SYS_pwritev,
    SYS_rt_tgsigqueueinfo,
    SYS_recvmmsg,
    SYS_prlimit64,
    SYS_syncfs,
    SYS_sendmmsg,
    SYS_getcpu,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_kcmp,
    SYS_sched_setattr,
    SYS_sched_getattr,
    SYS_renameat2,
    SYS_seccomp,
    SYS_getrandom,
    SYS_memfd_create,
    SYS_execveat,
    SYS_membarrier,
    SYS_mlock2,
    SYS_copy_file_range,
    SYS_preadv2,
    SYS_pwritev2,
    SYS_pkey_mprotect,
    SYS_pkey_alloc,
    SYS_pkey_free,
    SYS_statx,
    SYS_rseq,
    SYS_pidfd_send_signal,
    SYS_io_uring_setup,
    SYS_io_uring_enter,
    SYS_io_uring_register,
    SYS_pidfd_open,
    SYS_close_range,
    SYS_openat2,
    SYS_pidfd_getfd,
    SYS_faccessat2,
    SYS_process_madvise,
    SYS_epoll_pwait2,
    SYS_futex_waitv,
    SYS_landlock_create_ruleset,
    SYS_landlock_add_rule,
    SYS_landlock_restrict_self,
    SYS_memfd_secret,
    SYS_set_mempolicy_home_node,
    SYS_fchmodat2,
];

/// Namespace-creating `clone` flags refused inside a sandbox.
const NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP) as u64;

fn bad(e: impl std::fmt::Display) -> SysError {
    SysError::new("seccomp filter", std::io::Error::other(e.to_string()))
}

/// Compiles the sandbox allow-list for this architecture.
pub fn sandbox_filter() -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in ALLOWED {
        rules.insert(*nr, vec![]);
    }
    // clone: allowed only without namespace flags.
    let cond = SeccompCondition::new(
        0,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(NS_FLAGS),
        0,
    )
    .map_err(bad)?;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![cond]).map_err(bad)?],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        std::env::consts::ARCH.try_into().map_err(bad)?,
    )
    .map_err(bad)?;
    // clone3 must fail with ENOSYS (not EPERM) so libc falls back to clone.
    filter.try_into().map_err(bad)
}

/// A small filter placed in front of the allow-list that answers `clone3` with `ENOSYS`.
pub fn clone3_enosys_filter() -> Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    rules.insert(libc::SYS_clone3, vec![]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        std::env::consts::ARCH.try_into().map_err(bad)?,
    )
    .map_err(bad)?;
    filter.try_into().map_err(bad)
}

/// Installs the sandbox filters on the calling thread (inherited by children). Requires
/// `no_new_privs` or CAP_SYS_ADMIN.
pub fn apply_sandbox_filter() -> Result<()> {
    SandboxFilters::compile()?.apply()
}

/// The sandbox filters compiled once, to be installed many times (each call environment of
/// a function container installs them on itself).
#[derive(Debug, Clone)]
pub struct SandboxFilters {
    main: BpfProgram,
    clone3: BpfProgram,
}

impl SandboxFilters {
    pub fn compile() -> Result<Self> {
        Ok(SandboxFilters {
            main: sandbox_filter()?,
            clone3: clone3_enosys_filter()?,
        })
    }

    /// Installs both filters on the calling thread (inherited by children).
    pub fn apply(&self) -> Result<()> {
        seccompiler::apply_filter(&self.main).map_err(bad)?;
        seccompiler::apply_filter(&self.clone3).map_err(bad)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn filters_compile() {
        assert!(super::sandbox_filter().unwrap().len() > 100);
        assert!(!super::clone3_enosys_filter().unwrap().is_empty());
    }
}
